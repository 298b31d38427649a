"""A real server on 127.0.0.1 talked to with the official ``openai`` client (sync and async,
streaming and not, chat and completions): greedy output equals ``poot generate`` and the
engine run alone; usage, finish reasons, ``n``, token-id prompts, models and tokenizer routes."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json

import openai
import pytest

from server_util import TINY_CONTEXT

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]
GREEDY = dict(temperature=0, max_tokens=24, extra_body={"ignore_eos": True})


def client(srv, **kw):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, **kw)


def aclient(srv):
    return openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)


def engine_alone(handle, prompt, max_tokens=24, **kw):
    """(token ids, text) the engine gives the request alone (greedy, EOS ignored)."""
    from poot.sampling_params import SamplingParams

    ids = handle.encode(prompt)
    outs = list(handle.engine.generate(ids, SamplingParams(temperature=0, max_tokens=max_tokens,
                                                           ignore_eos=True, **kw)))
    return outs[-1].output_ids, outs[-1].output_text


def poot_generate(*argv) -> dict:
    """``poot generate ... --json`` run in this process; its JSON result."""
    from poot.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["generate", *argv, "--json", "--quiet"]) == 0
    return json.loads(out.getvalue())


def test_chat_greedy_equals_poot_generate_and_engine(server, tiny, tiny_path):
    """The server's greedy chat reply is the text ``poot generate --chat`` prints and the
    tokens the engine gives the request alone."""
    c = client(server)
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    r = c.chat.completions.create(model="tiny", messages=msgs, **GREEDY)
    cli = poot_generate("--model", str(tiny_path), "--chat", "--prompt", msgs[0]["content"],
                        "--max-tokens", "24", "--ignore-eos", "--kv-capacity",
                        str(TINY_CONTEXT))
    ids, text = engine_alone(tiny, msgs)
    assert r.choices[0].message.content == cli["text"] == text
    assert cli["token_ids"] == ids
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens == len(tiny.encode(msgs))
    assert r.usage.completion_tokens == 24
    assert r.usage.total_tokens == r.usage.prompt_tokens + 24
    assert r.object == "chat.completion" and r.model == "tiny" and r.id.startswith("chatcmpl-")
    assert r.choices[0].message.role == "assistant"


def test_chat_stream_sync_equals_nonstream(server):
    c = client(server)
    full = c.chat.completions.create(model="tiny", messages=MESSAGES, **GREEDY)
    chunks = list(c.chat.completions.create(model="tiny", messages=MESSAGES, stream=True,
                                            stream_options={"include_usage": True}, **GREEDY))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == full.choices[0].message.content
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices]
    assert finishes[-1] == "length" and finishes.count("length") == 1
    assert all(ch.usage is None for ch in chunks[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 24
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens
    assert len({ch.id for ch in chunks}) == 1


def test_completions_async_stream_and_not(server, tiny):
    """Completions through AsyncOpenAI: streamed text equals the whole response, both equal
    the engine alone."""

    async def run():
        c = aclient(server)
        full = await c.completions.create(model="tiny", prompt="Once upon a time", **GREEDY)
        stream = await c.completions.create(model="tiny", prompt="Once upon a time",
                                            stream=True, **GREEDY)
        parts = [ch async for ch in stream]
        await c.close()
        return full, parts

    full, parts = asyncio.run(run())
    _, text = engine_alone(tiny, "Once upon a time")
    assert full.choices[0].text == text
    assert "".join(p.choices[0].text for p in parts) == text
    assert parts[-1].choices[0].finish_reason == "length"
    assert full.object == "text_completion" and full.id.startswith("cmpl-")


def test_chat_async_nonstream(server):
    async def run():
        c = aclient(server)
        rs = await asyncio.gather(*[c.chat.completions.create(model="tiny", messages=MESSAGES,
                                                              **GREEDY) for _ in range(3)])
        await c.close()
        return rs

    rs = asyncio.run(run())
    assert len({r.choices[0].message.content for r in rs}) == 1


def test_completions_token_ids_and_prompt_lists(server, tiny):
    """A prompt of token ids, and a list of prompts (one choice set each, in order)."""
    c = client(server)
    ids = tiny.encode("hello")
    a = c.completions.create(model="tiny", prompt=ids, **GREEDY)
    b = c.completions.create(model="tiny", prompt="hello", **GREEDY)
    assert a.choices[0].text == b.choices[0].text
    many = c.completions.create(model="tiny", prompt=["hello", "Once upon a time"], **GREEDY)
    assert [ch.index for ch in many.choices] == [0, 1]
    assert many.choices[0].text == b.choices[0].text
    assert many.choices[1].text == engine_alone(tiny, "Once upon a time")[1]
    assert many.usage.prompt_tokens == len(ids) + len(tiny.encode("Once upon a time"))


def test_n_seeded_samples(server):
    """``n`` choices: seeded samples are reproducible, differ from each other, and choice j
    is the request with seed + j."""
    c = client(server)
    kw = dict(model="tiny", messages=MESSAGES, max_tokens=12, temperature=1.0,
              extra_body={"ignore_eos": True})
    r = c.chat.completions.create(n=3, seed=7, **kw)
    again = c.chat.completions.create(n=3, seed=7, **kw)
    texts = [ch.message.content for ch in r.choices]
    assert [ch.index for ch in r.choices] == [0, 1, 2]
    assert texts == [ch.message.content for ch in again.choices]
    assert len(set(texts)) == 3
    one = c.chat.completions.create(n=1, seed=8, **kw)
    assert one.choices[0].message.content == texts[1]
    assert r.usage.completion_tokens == 36


def test_stop_strings_and_max_completion_tokens(server):
    c = client(server)
    full = c.chat.completions.create(model="tiny", messages=MESSAGES, **GREEDY).choices[0]
    text = full.message.content
    stop = next(text[i:i + 2] for i in range(4, len(text) - 2)
                if "\ufffd" not in text[i:i + 2])
    cut = c.chat.completions.create(model="tiny", messages=MESSAGES, stop=[stop, "zzzz"],
                                    **GREEDY).choices[0]
    assert cut.message.content == text[:text.index(stop)]
    assert cut.finish_reason == "stop"
    short = c.chat.completions.create(model="tiny", messages=MESSAGES, temperature=0,
                                      max_completion_tokens=3,
                                      extra_body={"ignore_eos": True})
    assert short.usage.completion_tokens == 3 and short.choices[0].finish_reason == "length"


def test_default_max_tokens_fills_the_context(server, tiny):
    """Chat without max_tokens generates up to the context's end (OpenAI/vLLM)."""
    c = client(server)
    r = c.chat.completions.create(model="tiny", messages=MESSAGES, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert r.usage.prompt_tokens + r.usage.completion_tokens == TINY_CONTEXT
    assert r.choices[0].finish_reason == "length"


def test_models_tokenize_detokenize(server, tiny):
    import httpx

    c = client(server)
    models = c.models.list()
    assert [m.id for m in models.data] == ["tiny"]
    assert c.models.retrieve("tiny").id == "tiny"
    with pytest.raises(openai.NotFoundError):
        c.models.retrieve("gpt-4")
    t = httpx.post(server.url + "/tokenize", json={"model": "tiny", "prompt": "hello"}).json()
    assert t["tokens"] == tiny.encode("hello") and t["count"] == len(t["tokens"])
    assert t["max_model_len"] == TINY_CONTEXT
    chat = httpx.post(server.url + "/tokenize", json={"messages": MESSAGES}).json()
    assert chat["tokens"] == tiny.encode(MESSAGES)
    d = httpx.post(server.url + "/detokenize", json={"tokens": t["tokens"]}).json()
    assert d == {"prompt": "hello"}
    h = httpx.get(server.url + "/health")
    assert h.status_code == 200 and h.json() == {"status": "ready"}
