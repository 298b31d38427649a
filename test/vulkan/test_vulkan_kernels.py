"""SPIR-V kernels of the tiny Llama steps on a real Vulkan device vs the CPU oracle: every
dispatch region of a step on its own (the values the step feeds it; regions as the GPU plan
folds them), then whole steps."""

from __future__ import annotations

import numpy as np
import pytest
from model_steps import empty_caches, fixture_path, reference
from regions import split_regions

from poot import oracle
from poot.models import StepSpec, load_model

#: state tolerance vs the oracle (f32 compute, f32 accumulation)
ATOL = RTOL = 1e-4
KINDS = {"elementwise", "gather", "reduction", "matmul", "rope", "scatter", "attention"}


@pytest.fixture(scope="module")
def models():
    return {n: load_model(fixture_path(n)) for n in ("llama", "llama_gguf_q4_1")}


def _step_inputs(g, tokens, positions, rng):
    inputs = {"tokens": np.asarray([tokens], np.int32),
              "positions": np.asarray([positions], np.int32), "slots": np.asarray([0], np.int32)}
    for n, t in g.inputs:
        if n.startswith("kv."):
            inputs[n] = (0.5 * rng.standard_normal(t.shape)).astype(np.float32)
    return inputs


def run_artifact(dev, art, inputs, params=None):
    """Load, bind fresh buffers, record once, replay once; outputs by name."""
    k = dev.load(art)
    bufs = []
    for a in k.args:
        b = dev.alloc(a.type)
        if a.role == "input":
            dev.upload(b, inputs[a.name])
        elif a.role == "param":
            dev.upload(b, params[a.name])
        bufs.append(b)
    rec = dev.record(k, bufs)
    dev.replay(rec)
    dev.synchronize()
    return {a.name: dev.download(b) for a, b in zip(k.args, bufs) if a.role == "output"}


@pytest.mark.parametrize("name,step,T", [("llama", "decode", 1), ("llama", "prefill", 6),
                                         ("llama", "prefill", 12),
                                         ("llama_gguf_q4_1", "decode", 1)])
def test_every_region_matches_oracle(vk_device, vk_target, models, name, step, T):
    """Each dispatch region of the step, compiled to SPIR-V alone, matches the oracle on the
    values the whole step feeds it; together the regions cover every kernel kind. Up to
    ``MAX_M`` tokens the norms are folded into the GEMVs (no reduction region is left); a
    longer prefill keeps them."""
    from poot.backends.gpu.strategies.matmul import MAX_M
    from poot.backends.vulkan.codegen import codegen_vulkan, compile_vulkan

    model, weights = models[name]
    spec = StepSpec.decode(kv_capacity=16, kv_slots=1) if step == "decode" else \
        StepSpec.prefill(T, kv_capacity=16, kv_slots=1)
    g = model.trace(spec, weights.types)
    rng = np.random.default_rng(1)
    toks = [5] if step == "decode" else [3, 17, 200, 9, 44, 1, 8, 2, 150, 60, 7, 31][:T]
    pos = [7] if step == "decode" else list(range(T))
    program = compile_vulkan(g, vk_target)
    kinds = set()
    for r in split_regions(program.graph, _step_inputs(g, toks, pos, rng), weights):
        got = run_artifact(vk_device, codegen_vulkan(r.graph, vk_target), r.inputs)
        for k, want in r.want.items():
            np.testing.assert_allclose(got[k], want, rtol=RTOL, atol=ATOL,
                                       err_msg=f"{r.name} ({r.kind}) {k}")
        kinds.add(r.kind)
    # cheap producers (RoPE tables, RoPE, the mask, KV-write indices) are folded into their
    # consumers (scatter, attention), and the norms into the GEMVs while a step has at most
    # MAX_M rows: the anchors remain
    anchors = {"gather", "matmul", "scatter", "attention"}
    assert KINDS >= kinds >= anchors | ({"reduction"} if T > MAX_M else set()), kinds
    if T <= MAX_M:
        assert "reduction" not in kinds, kinds


@pytest.mark.parametrize("name", ["llama", "llama_gguf_q4_1"])
def test_prefill_then_decode_steps_match_oracle(vk_device, vk_target, models, name):
    """Whole steps through the executor Engine (record once per state parity, replay):
    a prefill then three decode steps with the KV caches carried on the device."""
    from poot.backends.vulkan.codegen import compile_vulkan
    from poot.executor import Engine

    model, weights = models[name]
    ids = [int(i) for i in reference(name)["prompt_ids"]]
    n = 6
    pre = model.trace(StepSpec.prefill(n, kv_capacity=16, kv_slots=1), weights.types)
    dec = model.trace(StepSpec.decode(kv_capacity=16, kv_slots=1), weights.types)
    eng = Engine(vk_device)
    eng.load_weights(weights.arrays, weights.types)
    e_pre = eng.add_entry(compile_vulkan(pre, vk_target))
    e_dec = eng.add_entry(compile_vulkan(dec, vk_target))
    caches = empty_caches(pre)
    inputs = {"tokens": np.asarray([ids[:n]], np.int32),
              "positions": np.asarray([list(range(n))], np.int32),
              "slots": np.asarray([0], np.int32)}
    got = eng.step(e_pre, inputs)
    want = oracle.evaluate(pre, {**inputs, **caches}, weights)
    np.testing.assert_allclose(got["logits"], want["logits"], rtol=RTOL, atol=ATOL)
    caches = {k: v for k, v in want.items() if k.startswith("kv.")}
    for p in range(n, n + 3):
        inputs = {"tokens": np.asarray([[ids[p]]], np.int32),
                  "positions": np.asarray([[p]], np.int32), "slots": np.asarray([0], np.int32)}
        got = eng.step(e_dec, inputs)
        want = oracle.evaluate(dec, {**inputs, **caches}, weights)
        np.testing.assert_allclose(got["logits"], want["logits"], rtol=RTOL, atol=ATOL,
                                   err_msg=f"decode at {p}")
        caches = {k: v for k, v in want.items() if k.startswith("kv.")}
        for k, v in caches.items():
            np.testing.assert_allclose(eng.read_state(k), v, rtol=RTOL, atol=ATOL, err_msg=k)
    # record once per state parity, then replay
    assert len(e_dec.recordings) == 2 and e_dec.steps == 3
    assert all(r.submits >= 1 for r in e_dec.recordings.values())
