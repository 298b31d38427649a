"""Compile workers (poot.api.compile_ahead): a cold load compiles its steps in worker processes
beside the loading one, through the shared compile cache, and generates what a serial load
generates."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "models"))

from model_steps import fixture_path, reference  # noqa: E402

from poot.api import Driver, ModelHandle  # noqa: E402
from poot.sampling_params import SamplingParams  # noqa: E402
from poot.settings import InvalidSetting  # noqa: E402
from poot.api.compile_ahead import default_workers  # noqa: E402
from poot.api.compile_worker import run_worker  # noqa: E402
from poot.compiler.cache import CompileCache, step_key  # noqa: E402
from poot.graph.sampling import FULL  # noqa: E402


def _greedy(n=8):
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


def _agree(got, want, margins, tol=1e-3):
    n = next((i + 1 for i, m in enumerate(margins) if m < tol), len(want))
    assert list(got[:n]) == [int(x) for x in want[:n]]


def test_worker_skips_a_step_another_process_is_compiling(tmp_path):
    """A worker never waits: a step whose cache lock is held is left to its holder; the
    others are compiled into the cache."""
    from poot.compiler.options import CompileOptions
    from poot.api import target_for

    h = ModelHandle.load(fixture_path("llama"), kv_capacity=16, prefill_chunk=4,
                         cache_dir=tmp_path, warm_up=False)
    target, options = target_for("cpu"), CompileOptions()
    steps = [s[1:] for s in h.runner.warm_up_steps()]     # prefill, decode, greedy sampler
    locked, rest = steps[0], steps[2:]
    cache = CompileCache(tmp_path)
    keys = [step_key(*s, target, options) for s in [locked, *rest]]
    with cache._locked(f"step-{keys[0]}"):
        done = run_worker({"cache_dir": str(tmp_path), "target": target, "options": options,
                           "steps": [locked, *rest]})
    assert done == [False] + [True] * len(rest)
    assert not cache.index_path(keys[0]).exists()
    assert all(cache.index_path(k).is_file() for k in keys[1:])


def test_cold_load_with_a_worker_generates_the_reference(tmp_path, monkeypatch):
    """One worker: the first token waits only for prefill, decode and the greedy sampler;
    the warm full sampler comes from the worker; greedy ids match the HF reference, a seeded
    sampled request repeats, and a second load finds every step in the cache."""
    monkeypatch.setenv("POOT_COMPILE_WORKERS", "1")
    path = fixture_path("llama")
    h = ModelHandle.load(path, kv_capacity=48, prefill_chunk=5, cache_dir=tmp_path,
                         warm_samplers=(FULL,))
    assert len(h._ahead.procs) == 1
    assert any(getattr(k, "family", None) == "sampler" and k.config.spec == FULL
               for k, _, _ in h._ahead.steps)        # the worker was given the full sampler
    ref = reference("llama")
    r = Driver(h).complete(list(ref["prompt_ids"]), _greedy())
    _agree(r.token_ids, ref["greedy_ids"], ref["greedy_margins"])
    h.finish_compiling()
    assert h._ahead.close(True) == [0]
    assert any(name.startswith("sampler[B=1:sample") for name in h.runner.compile_s)
    params = SamplingParams(temperature=0.8, top_p=0.9, top_k=20, seed=7, max_tokens=6,
                            ignore_eos=True)
    a = Driver(h).complete(list(ref["prompt_ids"]), params).token_ids
    h2 = ModelHandle.load(path, kv_capacity=48, prefill_chunk=5, cache_dir=tmp_path,
                          warm_samplers=(FULL,))
    assert h2.compile_cache.misses == 0 and not h2._ahead.procs
    assert Driver(h2).complete(list(ref["prompt_ids"]), params).token_ids == a


def test_compile_workers_setting(monkeypatch):
    monkeypatch.setenv("POOT_COMPILE_WORKERS", "0")
    assert default_workers() == 0
    monkeypatch.setenv("POOT_COMPILE_WORKERS", "3")
    assert default_workers() == 3
    monkeypatch.setenv("POOT_COMPILE_WORKERS", "two")
    with pytest.raises(InvalidSetting, match="POOT_COMPILE_WORKERS"):
        default_workers()
