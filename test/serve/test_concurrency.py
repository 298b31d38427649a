"""32 concurrent streaming clients: every stream is complete and well-formed (strict SSE,
each chunk a valid ``ChatCompletionChunk``), each equals its single-request output, and the
engine ran them batched (the server's metrics say so)."""

from __future__ import annotations

import asyncio
import re
import time

import httpx
from openai.types.chat import ChatCompletionChunk

from server_util import TINY_BATCH
from sse import parse_sse

N = 32


def _metric(text: str, name: str) -> float:
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    assert m, name
    return float(m.group(1))


def _body(i: int, stream: bool) -> dict:
    return {"model": "tiny", "temperature": 0, "max_tokens": 8 + i % 17, "ignore_eos": True,
            "stream": stream, "messages": [{"role": "user", "content": f"prompt {i}: " +
                                            "abcdefgh"[: i % 8] * (1 + i % 3)}]}


def test_32_concurrent_streams_equal_alone_and_batched(server, tiny, gate):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        alone = []
        for i in range(N):
            r = c.post("/v1/chat/completions", json=_body(i, False))
            assert r.status_code == 200, r.text
            alone.append(r.json()["choices"][0])
        before = c.get("/metrics").text

    async def one(client, i):
        async with client.stream("POST", "/v1/chat/completions", json=_body(i, True)) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            return await r.aread()

    async def all_at_once():
        async with httpx.AsyncClient(base_url=server.url, timeout=60,
                                     limits=httpx.Limits(max_connections=N)) as client:
            tasks = [asyncio.ensure_future(one(client, i)) for i in range(N)]
            # the engine waits until all 32 are queued (no timing decides the batches)
            end = time.monotonic() + 60
            while tiny.engine.stats().waiting < N and time.monotonic() < end:
                await asyncio.sleep(0.01)
            assert tiny.engine.stats().waiting == N
            gate.open()
            return await asyncio.gather(*tasks)

    gate.close()
    raws = asyncio.run(all_at_once())
    for i, raw in enumerate(raws):
        chunks = [ChatCompletionChunk.model_validate(e) for e in parse_sse(raw.decode())]
        assert chunks[0].choices[0].delta.role == "assistant"
        assert len({ch.id for ch in chunks}) == 1
        finishes = [ch.choices[0].finish_reason for ch in chunks]
        assert finishes[-1] == alone[i]["finish_reason"] == "length"
        assert finishes.count(None) == len(finishes) - 1
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks)
        assert text == alone[i]["message"]["content"], i

    with httpx.Client(base_url=server.url) as c:
        after = c.get("/metrics").text
    # batched: the engine ran batches of TINY_BATCH and fewer decode steps than tokens
    assert _metric(after, "poot_decode_batch_max") == TINY_BATCH
    steps = _metric(after, "poot_decode_steps_total") - _metric(before,
                                                                "poot_decode_steps_total")
    tokens = _metric(after, "poot_engine_generated_tokens_total") - \
        _metric(before, "poot_engine_generated_tokens_total")
    ragged = _metric(after, "poot_ragged_steps_total") - _metric(before,
                                                                 "poot_ragged_steps_total")
    assert tokens == sum(8 + i % 17 for i in range(N))
    # the prompts were prefilled by ragged steps, which sample each prompt's first token
    assert ragged >= 1
    assert tokens / (steps + ragged) > 4
    assert _metric(after, "poot_kv_blocks_used") == 0
    assert _metric(after, "poot_num_requests_running") == 0
    assert 'poot_requests_total{route="/v1/chat/completions",status="200"}' in after
