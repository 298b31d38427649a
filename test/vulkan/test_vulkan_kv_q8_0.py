"""A q8_0 KV cache on a real Vulkan device (lavapipe in CI) vs the CPU oracle: the paged
attention op over q8_0 pools (K, V or both), and whole steps of a Llama with 32-wide heads
(quantize-on-write, i8 and f16 scatters, attention reading the pools in place)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from poot import oracle
from poot.compiler import CompileOptions, compile
from poot.dialects.kv_quant import Q8_0
from poot.dialects.types import DType

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "passes"))
from test_kv_q8_0 import _case, _step_inputs  # noqa: E402
from test_vulkan_kernels import run_artifact  # noqa: E402


def test_target_reads_q8_0_with_or_without_16_bit_storage(vk_target):
    """Every SPIR-V target reads q8_0: without 16-bit storage the kernels move the f16
    scales as 32-bit words (wgpu's case)."""
    from poot.backends.vulkan.target import vulkan_target

    assert "q8_0" in vk_target.caps.kv_formats
    bare = vulkan_target({"features": ["subgroupBasic"]})
    assert DType.F16 not in bare.caps.storage_dtypes and "q8_0" in bare.caps.kv_formats


#: device features a target may lack: 16-bit storage and arithmetic, 8-bit ones
NO_NARROW = {"shaderFloat16", "storageBuffer16BitAccess", "shaderInt16", "shaderInt8",
             "storageBuffer8BitAccess"}


@pytest.mark.parametrize("k_st, v_st", [(Q8_0, Q8_0), (Q8_0, DType.F16), (DType.F16, Q8_0)],
                         ids=["q8_0-q8_0", "q8_0-f16", "f16-q8_0"])
@pytest.mark.parametrize("mask_dtype", [DType.I1, DType.F32])
def test_paged_attention_over_q8_0_matches_oracle(vk_device, vk_target, k_st, v_st,
                                                  mask_dtype):
    """Three sequences (9, 3 and no visible keys) over permuted blocks whose unseen
    positions hold inf scales: equal to the oracle, nothing leaks from stale positions."""
    if "q8_0" not in vk_target.caps.kv_formats:
        pytest.skip("this Vulkan device stores no f16 (the q8_0 scales)")
    g, ins, _ = _case(np.random.default_rng(9), k_st, v_st, mask_dtype)
    want = next(iter(oracle.evaluate(g, ins).values()))
    got = next(iter(run_artifact(vk_device, compile(g, vk_target, CompileOptions())
                                 .executable, ins).values()))
    np.testing.assert_allclose(got[:2], want[:2], rtol=1e-5, atol=1e-5)
    if mask_dtype is DType.I1:
        assert not got[2].any()


@pytest.mark.parametrize("narrow", [True, False], ids=["native", "no-8-16-bit"])
@pytest.mark.parametrize("step", ["prefill", "decode"])
def test_llama_step_with_q8_0_kv_matches_oracle(vk_device, vk_target, tmp_path, step, narrow):
    """Also for the device less its 8- and 16-bit features (wgpu's SPIR-V): the KV write
    stores both planes a 32-bit word a thread and attention decodes the scales from words."""
    from poot.backends.vulkan.target import vulkan_target
    from poot.models import StepSpec
    from poot.models.random_init import load_random_model

    if not narrow:
        caps = vk_device.capabilities()
        vk_target = vulkan_target({**caps, "features": [f for f in caps["features"]
                                                        if f not in NO_NARROW]})
    cfg = json.loads((HERE.parent / "fixtures" / "tiny" / "llama" / "config.json").read_text())
    cfg["head_dim"] = 32
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    model, weights = load_random_model(tmp_path / "config.json", dtype="f32")
    kw = dict(kv_capacity=64, block_size=16, num_blocks=6, kv_dtype=Q8_0)
    spec = StepSpec.decode(**kw) if step == "decode" else StepSpec.prefill(8, **kw)
    g = model.trace(spec, weights.types)
    ins = _step_inputs(g, spec, np.random.default_rng(3))
    ref = oracle.evaluate(g, ins, weights)
    prog = compile(g, vk_target, CompileOptions())
    assert prog.dispatches.get("paged_attention") == model.dims().n_layers
    got = run_artifact(vk_device, prog.executable, ins,
                       {n: np.asarray(weights[n]) for n in prog.graph.params})
    np.testing.assert_allclose(got["logits"], ref["logits"], rtol=1e-4, atol=1e-4)
