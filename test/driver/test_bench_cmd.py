"""``poot bench``'s single-request timing repeats one prompt: its timed runs prefill the whole
prompt (the prefix cache is off for them) unless ``--prefix-cache`` asks for the cache (CLI
cases run in a fresh interpreter, :func:`test_cli_errors.poot`)."""

from __future__ import annotations

import json

from test_cli_errors import GGUF, poot

#: a prompt of several full KV blocks (what the prefix cache keeps), a small context and chunk
ARGS = ("bench", "--model", GGUF, "--prompt-tokens", "40", "--max-tokens", "3", "--runs", "2",
        "--replay", "0", "--kv-capacity", "64", "--prefill-chunk", "16", "-q")


def _bench(*extra):
    rc, out, err = poot(*ARGS, *extra)
    assert rc == 0, err
    return json.loads(out)


def test_bench_runs_prefill_the_whole_prompt():
    """The warm-up and every timed run send the same prompt; with the prefix cache on, 32 of
    its 40 tokens came from the cache in each timed run and ``ttft_s`` measured 8 tokens of
    prefill."""
    b = _bench()
    assert [r["cached_tokens"] for r in b["runs"]] == [0, 0]
    assert [r["prompt_tokens"] for r in b["runs"]] == [40, 40]
    assert b["prefix_cache"] is False
    assert b["prefill_tokens_per_s"] > 0


def test_bench_prefix_cache_on_request():
    """``--prefix-cache``: the timed runs find the warm-up's full blocks in the cache."""
    b = _bench("--prefix-cache")
    assert b["prefix_cache"] is True
    assert all(r["cached_tokens"] > 0 for r in b["runs"]), b["runs"]
