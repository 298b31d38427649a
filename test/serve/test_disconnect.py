"""A client that disconnects mid-stream (or while waiting for a whole response) aborts its
request: the engine frees its KV blocks at its next step, and the next requests get
exactly what they get on an idle server.

The engine is paused between steps by a gate (no timing involved): it stops right after
the step that produced the stream's first token, the client reads that token and goes
away, the server notices and aborts, and only then does the engine run again."""

from __future__ import annotations

import time

import httpx
import pytest

from sse import parse_sse

BODY = {"model": "tiny", "temperature": 0, "max_tokens": 100, "ignore_eos": True,
        "messages": [{"role": "user", "content": "tell me a long story"}]}


def _wait(cond, what: str, limit: float = 30.0) -> None:
    end = time.monotonic() + limit
    while not cond():
        if time.monotonic() > end:
            pytest.fail(f"gave up waiting for {what}")
        time.sleep(0.01)


def _greedy(url: str) -> str:
    r = httpx.post(url + "/v1/chat/completions", json={**BODY, "max_tokens": 20}, timeout=60)
    assert r.status_code == 200
    return r.json()["choices"][0]["message"]["content"]


def test_stream_disconnect_frees_blocks_within_one_step(server, tiny, gate):
    eng, aeng = tiny.engine, server.state.aengine
    want = _greedy(server.url)
    aborts = aeng.aborts
    gate.close_after_token = True
    with httpx.Client(timeout=60) as c:
        with c.stream("POST", server.url + "/v1/chat/completions",
                      json={**BODY, "stream": True}) as r:
            lines = r.iter_lines()
            got = []
            for line in lines:
                if line.startswith("data: ") and '"content":"' in line and \
                        '"role"' not in line:
                    got.append(line)
                    break
            assert got, "no content chunk before the disconnect"
            # the engine is paused after the first token; the request holds blocks
            assert not gate.open_.is_set()
            assert eng.stats().running == 1 and eng.stats().kv_blocks_used > 0
        # the response is closed here: the client is gone
    _wait(lambda: aeng.aborts > aborts, "the server to abort the request")
    steps = eng.stats().decode_steps
    gate.open()
    _wait(lambda: eng.stats().kv_blocks_used == 0 and eng.stats().running == 0,
          "the blocks to be freed")
    assert eng.stats().decode_steps - steps <= 1
    metrics = httpx.get(server.url + "/metrics").text
    assert "poot_aborted_sequences_total 0.0" not in metrics
    # the next requests are unaffected
    assert _greedy(server.url) == want
    r = httpx.post(server.url + "/v1/chat/completions", json={**BODY, "max_tokens": 20,
                                                             "stream": True}, timeout=60)
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in parse_sse(r.text))
    assert text == want


def test_nonstream_disconnect_aborts(server, tiny, gate):
    """A client waiting for a whole response that goes away: the server notices while the
    request waits (it polls the connection) and aborts it."""
    eng, aeng = tiny.engine, server.state.aengine
    aborts = aeng.aborts
    gate.close_after_token = True
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/chat/completions", json=BODY, timeout=1.0)
    _wait(lambda: aeng.aborts > aborts, "the server to abort the request")
    gate.open()
    _wait(lambda: eng.stats().kv_blocks_used == 0 and eng.stats().running == 0,
          "the blocks to be freed")
    assert aeng.inflight == 0
