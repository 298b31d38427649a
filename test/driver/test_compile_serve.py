"""``poot compile --serve``: the cache it fills holds everything ``poot serve`` warms (every
decode bucket with the full sampler and the full one with log-probs and guided decoding's
mask), so serving from a carried cache compiles nothing; without ``--serve`` the warm-up has
to compile (what a machine without MLIR cannot do)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "test" / "fixtures" / "tiny" / "llama_gguf_q4_1"


def _programs(cache: Path) -> set[str]:
    return {p.name for p in (cache / "programs").glob("*")}


def _serve_options() -> dict:
    return dict(path=str(TINY), backend="cpu", kv_capacity=64, prefill_chunk=None,
                max_batch=2, kv_blocks=None, kv_memory=None, kv_dtype=None, use_cache=True,
                random_weights=None, compile_options=None, pipeline_parallel=1,
                max_decode_stall=1.5)


@pytest.mark.parametrize("serve", [True, False])
def test_serve_warm_up_finds_everything_compile_serve_made(tmp_path, monkeypatch, capsys,
                                                           serve):
    pytest.importorskip("mlir.ir", reason="compiling needs the MLIR wheels")
    from poot.cli import main
    from poot.serve.loading import load_and_warm

    cache = tmp_path / "cache"
    argv = ["compile", "--backend", "cpu", "--model", str(TINY), "--kv-capacity", "64",
            "--max-batch", "2", "--cache-dir", str(cache), "--quiet"]
    assert main(argv + (["--serve"] if serve else [])) == 0
    capsys.readouterr()
    before = _programs(cache)
    monkeypatch.setenv("POOT_CACHE_DIR", str(cache))
    handle = load_and_warm(_serve_options())
    try:
        handle.finish_compiling()          # the samplers left to the compile workers too
        new = _programs(cache) - before
    finally:
        close = getattr(handle, "close", None)
        if close:
            close()
    if serve:
        assert not new, f"serve's warm-up compiled {len(new)} programs"
    else:            # the guided samplers were not in the cache: the warm-up made them
        assert len(new) >= 2


def test_serve_leaves_the_larger_ragged_steps_to_the_compile_workers(tmp_path, monkeypatch):
    """A cold ``poot serve`` load warms the ragged steps of one chunk and of the mixed
    buckets itself and gives its compile worker the larger ones the scheduler may run (the
    tiny model at context 64, max batch 2: 64 and 128 rows). Once the workers are done, a
    burst of two 60-token prompts (the first prefills alone, nothing decoding: an idle
    step of its 60 tokens on the 64-row bucket) finds its steps in the cache: nothing is
    compiled in the engine's thread while the requests wait, and each gets its tokens
    alone."""
    pytest.importorskip("mlir.ir", reason="compiling needs the MLIR wheels")
    from poot.engine.runner import ragged_token_buckets
    from poot.sampling_params import SamplingParams
    from poot.serve.loading import load_and_warm

    monkeypatch.setenv("POOT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("POOT_COMPILE_WORKERS", "1")
    handle = load_and_warm(_serve_options())
    try:
        handle.finish_compiling()                 # the workers' steps are in the cache
        runner = handle.runner
        assert ragged_token_buckets(32, 2, max_model_len=64, stall_bounded=True) == \
            (4, 32, 64, 128)
        assert not {"ragged[T=64]", "ragged[T=128]"} & set(runner.compile_s)
        for t in (64, 128):
            assert runner.find_step(runner.model, runner.weights.types,
                                    runner.step_spec("ragged", t)) is not None, t
        misses = handle.compile_cache.misses
        eng = handle.engine
        sp = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
        prompts = [[(7 * i + 3 * j) % 200 + 5 for j in range(60)] for i in range(2)]
        ids = [eng.add_request(p, sp) for p in prompts]
        final = {}
        while eng.has_unfinished():
            for out in eng.step():
                if out.finished:
                    final[out.request_id] = out.output_ids
        assert "ragged[T=64]" in runner.compile_s            # loaded from the cache
        assert handle.compile_cache.misses == misses, "the burst compiled a step"
        for rid, p in zip(ids, prompts):
            assert final[rid] == list(eng.generate(p, sp))[-1].output_ids
    finally:
        close = getattr(handle, "close", None)
        if close:
            close()
