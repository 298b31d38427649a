"""bench/gpu_run/attn_bench.py's KV storage cases (q8_0 vs f16 / bf16 pools), on a small
shape: ``build --kv`` writes the CUDA artifacts and the oracle's outputs here, and the inputs
its ``run`` side makes on the GPU machine from the same seed (numpy only: uint16 words for the
16-bit pools and scales, int8 values) give those outputs through the same strategy's kernels
on Vulkan (lavapipe here), so a device run's check compares like with like."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
pytest.importorskip("mlir.ir", reason="the MLIR wheels are not installed here: this module "
                    "compiles kernels")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "gpu_run"))
import attn_bench  # noqa: E402
from test_gpu_attention import _run, _vk_target, rope_attention_region  # noqa: E402

SMALL = {"small": (2, 2, 2, 128, 64)}      # B, Hkv, G, S, D: 4 blocks of 32 a sequence
POSITIONS = (40, 127)


@pytest.fixture
def small_kv(monkeypatch):
    monkeypatch.setattr(attn_bench, "KV", SMALL)
    monkeypatch.setattr(attn_bench, "KV_CASES",
                        {f"small_{f}": ("small", f) for f in attn_bench.KV_FORMATS})
    monkeypatch.setattr(attn_bench, "KV_POSITIONS", POSITIONS)


def test_kv_build_and_the_machines_inputs_agree_on_vulkan(vk_device, small_kv, tmp_path):
    from poot.backends.cuda.artifact import CudaArtifact
    from poot.backends.vulkan.codegen import codegen_vulkan

    manifest = attn_bench.build_kv(str(tmp_path))
    assert sorted(manifest) == [f"small_{f}" for f in ("bf16_auto", "bf16_w1", "f16_auto",
                                                        "f16_w1", "q8_0_auto", "q8_0_bytes",
                                                        "q8_0_bytes16", "q8_0_k2", "q8_0_w1")]
    B, Hkv, G, S, D = SMALL["small"]
    target = _vk_target(vk_device, 4)
    for key, m in manifest.items():
        art = CudaArtifact.load(str(tmp_path / key))
        assert "shfl.sync" in art.ptx
        fmt = attn_bench.KV_CASES[m["case"]][1]
        assert ("ld.global.s8" in art.ptx) == (fmt == "q8_0")       # V (and K in bytes)
        g = rope_attention_region(B=B, T=1, Hkv=Hkv, G=G, S=S, D=D, Dv=D, mask="i1",
                                  paged=(B * S // attn_bench.PAGED_BS + 1, attn_bench.PAGED_BS,
                                         fmt))
        v = m["variant"]
        with attn_bench.Q8_VARIANTS[v]() if v in attn_bench.Q8_VARIANTS else \
                attn_bench.plan_variant(v):
            vk = codegen_vulkan(g, target)
        want = attn_bench.expected(str(tmp_path), m["case"])
        assert sorted(want) == sorted(map(str, POSITIONS))
        for pos in attn_bench.case_positions(m["case"]):
            x = attn_bench.case_inputs(m["case"], pos)      # what the machine uploads
            assert {a.dtype for n, a in x.items() if n in ("a2", "a3")} == \
                {np.dtype(np.int8 if fmt == "q8_0" else np.uint16)}
            got = _run(vk_device, vk, x)["r0"]
            assert np.abs(want[str(pos)]).max() > 0.1
            np.testing.assert_allclose(got, want[str(pos)], rtol=1e-4, atol=1e-4,
                                       err_msg=f"{key} position {pos}")


def test_kv_summary_reports_the_speedups(small_kv):
    rows = {f"small_{f}": {"ok": True, "us_per_layer": {"40": t, "127": 2 * t}}
            for f, t in (("f16_auto", 30.0), ("bf16_auto", 33.0), ("q8_0_auto", 20.0),
                         ("q8_0_k2", 22.0), ("q8_0_bytes", 30.0))}
    got = attn_bench.kv_summary(rows)["small"]
    assert got["ok"] and got["positions"]["127"]["us_per_layer"]["q8_0"] == 40.0
    assert got["positions"]["40"]["q8_0_vs_f16"] == 1.5
    assert got["positions"]["127"]["q8_0_vs_bf16"] == 1.65
    assert got["positions"]["40"]["q8_0_k2_vs_bf16"] == 1.5
    assert got["positions"]["127"]["q8_0_bytes_us"] == 60.0
    rows["small_q8_0_k2"]["ok"] = False
    assert not attn_bench.kv_summary(rows)["small"]["ok"]
