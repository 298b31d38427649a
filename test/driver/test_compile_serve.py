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
