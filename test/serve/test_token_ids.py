"""vLLM's ``return_token_ids`` (prompt and generated ids beside the text, streamed or not)
and a server of random weights (``poot serve --random-weights``, vLLM's ``--load-format
dummy``: no tokenizer, token-id prompts), which is what ``bench/serve_load.py
--token-prompts`` drives. Generated ids are checked against the engine's own output for the
same request alone."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from sse import parse_sse
from server_util import running

TINY_CONFIG = Path(__file__).resolve().parents[1] / "fixtures" / "tiny" / "llama" / \
    "config.json"


def _ids(outputs) -> list[int]:
    """The generated ids of one request's outputs (engine.generate)."""
    return [i for ev in outputs for i in ev.token_ids]


def _post(srv, route, body):
    return httpx.post(srv.url + route, json=body, timeout=120)


def test_completions_return_token_ids(server, tiny):
    body = {"model": "tiny", "prompt": "hello there", "max_tokens": 8, "temperature": 0,
            "return_token_ids": True}
    r = _post(server, "/v1/completions", body).json()
    prompt_ids = _post(server, "/tokenize", {"prompt": "hello there"}).json()["tokens"]
    ch = r["choices"][0]
    assert ch["prompt_token_ids"] == prompt_ids
    from poot.sampling_params import SamplingParams

    alone = _ids(tiny.engine.generate(prompt_ids, SamplingParams(temperature=0, max_tokens=8)))
    assert ch["token_ids"] == alone
    assert ch["text"] == tiny.tokenizer.decode(ch["token_ids"], skip_special_tokens=True) \
        or ch["finish_reason"] == "stop"
    events = parse_sse(_post(server, "/v1/completions", {**body, "stream": True}).text)
    streamed = [i for e in events for c in e["choices"] for i in c.get("token_ids", [])]
    assert streamed == ch["token_ids"]
    firsts = [c for e in events for c in e["choices"] if "prompt_token_ids" in c]
    assert len(firsts) == 1 and firsts[0]["prompt_token_ids"] == prompt_ids
    plain = _post(server, "/v1/completions", {**body, "return_token_ids": False}).json()
    assert "token_ids" not in plain["choices"][0] and plain["choices"][0]["text"] == ch["text"]


def test_chat_return_token_ids(server):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 6, "temperature": 0, "return_token_ids": True}
    r = _post(server, "/v1/chat/completions", body).json()
    tok = _post(server, "/tokenize", {"messages": body["messages"]}).json()["tokens"]
    assert r["prompt_token_ids"] == tok
    ids = r["choices"][0]["token_ids"]
    assert 1 <= len(ids) <= 6
    events = parse_sse(_post(server, "/v1/chat/completions", {**body, "stream": True}).text)
    assert events[0]["prompt_token_ids"] == tok
    assert [i for e in events for c in e["choices"] for i in c.get("token_ids", [])] == ids


def test_random_weights_server_streams_a_chunk_per_token(cache_dir):
    """``--random-weights``: the config's shapes with random weights, no tokenizer; token-id
    completions with ``ignore_eos`` stream one chunk with ids per generated token, the ids
    the engine gives the same prompt alone."""
    import argparse

    from poot.cli import serve_cmd
    from poot.serve.loading import load_and_warm
    from poot.sampling_params import SamplingParams
    from poot.serve import ServeConfig

    p = argparse.ArgumentParser()
    serve_cmd.register(p.add_subparsers())
    args = p.parse_args(["serve", "--model", str(TINY_CONFIG), "--random-weights", "f32",
                         "--max-batch", "4", "--kv-capacity", "64", "--no-warm-up"])
    opts = serve_cmd.load_options(args)
    assert opts["random_weights"] == "f32"
    handle = load_and_warm({**opts, "cache_dir": cache_dir}, warm_up=False)
    assert handle.tokenizer is None
    prompt = [3, 17, 42, 9, 100]
    alone = _ids(handle.engine.generate(prompt, SamplingParams(temperature=0, max_tokens=10,
                                                               ignore_eos=True)))
    with running(handle, ServeConfig(served_model_name="rw")) as srv:
        body = {"model": "rw", "prompt": prompt, "max_tokens": 10, "temperature": 0,
                "ignore_eos": True, "return_token_ids": True, "stream": True,
                "stream_options": {"include_usage": True}}
        events = parse_sse(_post(srv, "/v1/completions", body).text)
        chunks = [c for e in events for c in e["choices"] if c.get("token_ids")]
        assert [i for c in chunks for i in c["token_ids"]] == alone
        assert len(chunks) == 10 and events[-1]["usage"]["completion_tokens"] == 10
        r = _post(srv, "/v1/chat/completions", {"model": "rw", "messages": [
            {"role": "user", "content": "hi"}]})
        assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
        assert json.loads(_post(srv, "/v1/completions", {"model": "rw", "prompt": "text"})
                          .text)["error"]["param"] == "prompt"


def test_random_weights_needs_a_model(capsys):
    from poot.cli import main

    assert main(["serve", "--random-weights", "bf16"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("poot: error: ") and "--random-weights" in err[-1], err
