"""The wgpu backend's kernels (the Vulkan code generator's SPIR-V, compiled for the adapter's
features, translated by naga) against the CPU oracle: every dispatch region of the tiny
fixtures' steps on its own, then whole paged steps of every tiny family."""

from __future__ import annotations

import numpy as np
import pytest
from model_steps import fixture_path, step_feed
from regions import split_regions
from test_vulkan_kernels import run_artifact

from poot import oracle
from poot.dialects.types import DType
from poot.models import StepSpec, load_model

#: f32 compute and accumulation on both sides
ATOL = RTOL = 1e-4


@pytest.mark.parametrize("name,step,T", [("llama", "decode", 1), ("llama", "prefill", 12),
                                         ("llama_gguf_q4_1", "decode", 1),
                                         ("qwen3_moe", "decode", 1)])
def test_every_region_matches_oracle(wg_device, wg_target, name, step, T):
    """Each dispatch region of the step, compiled alone for the adapter, matches the oracle on
    the values the whole step feeds it, and the regions cover the anchor kinds (gather,
    matmul, scatter, attention)."""
    from poot.backends.vulkan.codegen import codegen_vulkan, compile_vulkan

    model, weights = load_model(fixture_path(name))
    kw = dict(kv_capacity=16, kv_slots=1, kv_dtype=DType.F32)
    spec = StepSpec.decode(**kw) if step == "decode" else StepSpec.prefill(T, **kw)
    g = model.trace(spec, weights.types)
    rng = np.random.default_rng(1)
    toks = [5] if step == "decode" else [3, 17, 200, 9, 44, 1, 8, 2, 150, 60, 7, 31][:T]
    pos = [7] if step == "decode" else list(range(T))
    inputs = step_feed(g, [toks], [pos], [0])
    for n, t in g.inputs:
        if n.startswith("kv."):
            inputs[n] = (0.5 * rng.standard_normal(t.shape)).astype(t.dtype.numpy)
    program = compile_vulkan(g, wg_target)
    kinds = set()
    for r in split_regions(program.graph, inputs, weights):
        got = run_artifact(wg_device, codegen_vulkan(r.graph, wg_target), r.inputs)
        for k, want in r.want.items():
            np.testing.assert_allclose(np.asarray(got[k], np.float32),
                                       np.asarray(want, np.float32), rtol=RTOL, atol=ATOL,
                                       err_msg=f"{r.name} ({r.kind}) {k}")
        kinds.add(r.kind)
    assert {"gather", "matmul", "scatter", "attention"} <= kinds, kinds


#: one paged step of every tiny generating family (the KV pools in f32: wgpu's SPIR-V has no
#: 16-bit storage)
PAGED = [("llama", "decode"), ("llama_gguf_q4_1", "prefill"), ("llama_llama3rope_tied", "decode"),
         ("mistral_swa4", "prefill"), ("gemma", "decode"), ("gemma2", "prefill"),
         ("phi3", "decode"), ("qwen2", "prefill"), ("qwen3", "decode"), ("mixtral", "decode"),
         ("qwen3_moe", "prefill")]


@pytest.mark.parametrize("name,step", PAGED)
def test_paged_step_matches_oracle(wg_device, wg_target, name, step):
    """A whole paged step (two sequences in 4-position blocks scattered over a 20-block pool)
    compiled for the adapter: logits within 1e-4 of the oracle, the KV writes in place."""
    from poot.backends.vulkan.codegen import compile_vulkan

    model, weights = load_model(fixture_path(name))
    B, bs, NB, C = 2, 4, 20, 32
    T = 1 if step == "decode" else 5
    kw = dict(batch=B, kv_capacity=C, block_size=bs, num_blocks=NB, kv_dtype=DType.F32)
    spec = StepSpec.decode(**kw) if step == "decode" else StepSpec.prefill(T, **kw)
    g = model.trace(spec, weights.types)
    prog = compile_vulkan(g, wg_target)
    pools = {n for n, _ in g.inputs if n.startswith("kv.")}
    assert prog.executable.in_place == {n: n for n in pools}
    rng = np.random.default_rng(len(name) + T)
    table = np.stack([rng.permutation(NB)[:C // bs] for _ in range(B)]).astype(np.int32)
    pos = np.array([[13 - T + 1 + t for t in range(T)], [6 - T + 1 + t for t in range(T)]],
                   np.int32)
    slot = (np.take_along_axis(table, pos // bs, 1) * bs + pos % bs).reshape(-1)
    ins = {"tokens": rng.integers(1, 200, (B, T)).astype(np.int32), "positions": pos,
           "block_table": table, "slot_mapping": slot.astype(np.int32)}
    for n, t in g.inputs:
        if n.startswith("kv."):
            ins[n] = (0.5 * rng.standard_normal(t.shape)).astype(np.float32)
    want = oracle.evaluate(g, ins, weights)
    got = run_artifact(wg_device, prog.executable, ins,
                       {k: weights[k] for k, _ in prog.executable.params})
    out = "logits" if "logits" in want else "hidden"
    np.testing.assert_allclose(got[out], want[out], rtol=RTOL, atol=ATOL)
    for n in pools:
        np.testing.assert_allclose(got[n], want[n], rtol=RTOL, atol=ATOL, err_msg=n)


def test_half_precision_is_stored_as_f32(wg_target):
    """wgpu's SPIR-V has no 16-bit storage: an f16 KV pool and bf16 weights are stored as f32
    (planning.storage_type) -- every input, weight and output of the step -- instead of being
    refused. Generation on bf16 weights is checked in test_wgpu_generate.py."""
    from poot.backends.vulkan.codegen import compile_vulkan
    from poot.dialects.types import TensorType

    model, weights = load_model(fixture_path("llama"))
    types = {n: t.with_dtype(DType.BF16) if isinstance(t, TensorType) else t
             for n, t in weights.types.items()}
    g = model.trace(StepSpec.decode(kv_capacity=16, kv_slots=1, kv_dtype=DType.F16), types)
    prog = compile_vulkan(g, wg_target)
    dtypes = {b.type.dtype for b in prog.storage if isinstance(b.type, TensorType)}
    assert DType.F16 not in dtypes and DType.BF16 not in dtypes
    assert {b.name for b in prog.storage if b.type.dtype == DType.F32} >= \
        {n for n, _ in g.inputs if n.startswith("kv.")} | set(g.params)
