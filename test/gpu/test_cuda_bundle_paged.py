"""bench/cuda_bundle.py's paged decode bundles (``--paged llama:q8_0``): the device check's
input for a whole CUDA decode step over q8_0 pools (quantize-on-write in the KV scatter, the
flash-decoding kernel reading the pools), built here without a GPU; and the device check's
comparison, which lets a q8_0 value round one step the other way."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
pytest.importorskip("mlir.ir", reason="the MLIR wheels are not installed here: this module "
                    "compiles kernels")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import cuda_bundle  # noqa: E402


def test_q8_0_paged_bundle_holds_the_steps_the_device_replays(tmp_path):
    from poot.backends.cuda.artifact import CudaArtifact

    r = cuda_bundle.build_paged("llama", "q8_0", str(tmp_path), steps=3)
    assert r["strategies"]["flash_decode"] == r["dispatch_kinds"]["paged_attention"] == 2
    art = CudaArtifact.load(r["bundle"])
    carried = {o["name"] for o in art.plan["outputs"] if o.get("aliases")}
    assert {"kv.0.k", "kv.0.k_scale", "kv.1.v", "kv.1.v_scale"} <= carried
    with np.load(Path(r["bundle"]) / "fixtures.npz") as fx:
        assert fx["final.kv.0.k"].dtype == np.int8 and fx["final.kv.0.k"].any()
        assert fx["final.kv.0.k_scale"].dtype == np.uint16       # f16 words, as on the device
        for k in range(3):
            logits = fx[f"s{k}.out.logits"]
            assert np.isfinite(logits).all() and np.abs(logits).max() > 0
            # sequence b writes position 3 b + k into its own block
            assert list(fx[f"s{k}.in.positions"][:, 0]) == [k, 3 + k]
        assert len(set(fx["s0.in.slot_mapping"] // 16)) == 2


def test_device_check_lets_q8_0_values_differ_by_one_step_only():
    from poot.backends.cuda.devcheck import compare

    want = np.array([5, -7, 127], np.int8)
    assert compare(np.array([6, -7, 126], np.int8), want) == (1.0, True)
    assert not compare(np.array([7, -7, 127], np.int8), want)[1]
    assert not compare(np.array([6, 0], np.int32), np.array([5, 0], np.int32))[1]
    assert not compare(np.array([1, 0], np.uint8), np.array([0, 0], np.uint8))[1]


def test_fp8_paged_bundle_carries_e4m3_pools(tmp_path):
    """``--paged llama:fp8``: the step's pools are e4m3fn bytes (i8) with f32 scales a head
    vector, written by the scatter (cvt to e4m3 in the PTX) and read by the
    flash-decoding kernels; the oracle's final pools decode (ml_dtypes) to finite values."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    from poot.backends.cuda.artifact import CudaArtifact

    r = cuda_bundle.build_paged("llama", "fp8", str(tmp_path), steps=3)
    assert r["strategies"]["flash_decode"] == r["dispatch_kinds"]["paged_attention"] == 2
    art = CudaArtifact.load(r["bundle"])
    assert "cvt.rn.satfinite.e4m3x2.f32" in art.ptx and "cvt.rn.f16x2.e4m3x2" in art.ptx
    with np.load(Path(r["bundle"]) / "fixtures.npz") as fx:
        k, s = fx["final.kv.0.k"], fx["final.kv.0.k_scale"]
        assert k.dtype == np.int8 and s.dtype == np.float32 and s.shape[-1] == 1
        assert k.any() and np.isfinite(k.view(ml_dtypes.float8_e4m3fn).astype(np.float32)).all()


def test_greedy_bundle_feeds_the_oracle_greedy_tokens(tmp_path):
    """``--greedy llama:fp8``: the prompt a token a step, then each step's token is the
    argmax of the oracle's logits at the step before (what the device check compares its
    own greedy tokens with)."""
    r = cuda_bundle.build_greedy("llama", "fp8", str(tmp_path), steps=14)
    p = r["greedy_from_step"]
    with np.load(Path(r["bundle"]) / "fixtures.npz") as fx:
        for k in range(p, 14):
            want = fx[f"s{k - 1}.out.logits"].reshape(2, -1).argmax(-1)
            assert list(fx[f"s{k}.in.tokens"][:, 0]) == list(want)
