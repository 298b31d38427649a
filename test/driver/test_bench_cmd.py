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


def test_profile_of_a_batch_step_gives_each_matmuls_share_of_bandwidth():
    """``--profile`` with ``--batch``: the decode step of the batch's bucket is profiled (the
    device's per-dispatch rows), each row gains ``bandwidth_fraction`` (its weight bytes per
    second over the roofline bandwidth) and the matmul rows are summed under ``matmuls``."""
    from types import SimpleNamespace

    from poot.cli.bench_cmd import ROOFLINE_BPS, profile

    asked = {}
    rows = [{"callee": "mm", "kind": "matmul", "copies": 16, "us": 10.0,
             "weight_bytes": 8 << 20, "GBps": (8 << 20) / 10e-6 / 1e9},
            {"callee": "attn", "kind": "attention", "copies": 16, "us": 5.0,
             "weight_bytes": 0, "GBps": None}]

    def profile_kernel(kernel, bindings, top):
        asked["kernel"], asked["top"] = kernel, top
        return {"total_ms": 0.24, "by_kind": {}, "top": [dict(r) for r in rows]}

    def decode_entry(batch):
        asked["batch"] = batch
        return SimpleNamespace(kernel=f"step{batch}")

    session = SimpleNamespace(device=SimpleNamespace(profile_kernel=profile_kernel),
                              _bindings=lambda entry: [])
    handle = SimpleNamespace(runner=SimpleNamespace(session=session, decode_entry=decode_entry),
                             backend="cuda")
    p = profile(handle, 64)
    assert asked["batch"] == 64 and asked["kernel"] == "step64" and p["batch"] == 64
    mm, attn = p["top"]
    assert abs(mm["bandwidth_fraction"] - (8 << 20) / 10e-6 / ROOFLINE_BPS) < 1e-3
    assert attn["bandwidth_fraction"] is None
    assert p["matmuls"]["ms"] == 0.16 and p["matmuls"]["weight_bytes"] == 16 * (8 << 20)
    assert [r["callee"] for r in p["matmuls"]["rows"]] == ["mm"]


def test_profile_needs_a_device_that_times_dispatches():
    """On a device without per-dispatch timing (the CPU), a clear typed error."""
    from types import SimpleNamespace

    import pytest

    from poot.cli.bench_cmd import BenchError, profile

    handle = SimpleNamespace(runner=SimpleNamespace(session=SimpleNamespace(
        device=SimpleNamespace())), backend="cpu")
    with pytest.raises(BenchError, match="--profile needs a device"):
        profile(handle, 8)
