"""SPIR-V kernels of the tiny Llama steps on a real Vulkan device vs the CPU oracle: every
dispatch region of a step on its own (the values the step feeds it; regions as the GPU plan
folds them), then whole steps."""

from __future__ import annotations

import numpy as np
import pytest
from model_steps import empty_caches, fixture_path, reference, step_feed
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
    inputs = step_feed(g, [tokens], [positions], [0])
    for n, t in g.inputs:
        if n.startswith("kv."):
            inputs[n] = (0.5 * rng.standard_normal(t.shape)).astype(t.dtype.numpy)
    return inputs


def _words(x: np.ndarray, like: np.ndarray) -> np.ndarray:
    """``x`` as ``like``'s dtype when the device held it as 16-bit words (f16/bf16)."""
    like = np.asarray(like)
    return x.view(like.dtype) if x.dtype == np.uint16 and like.dtype.itemsize == 2 else x


def run_artifact(dev, art, inputs, params=None):
    """Load, bind fresh buffers, record once, replay once; outputs by name (f16/bf16 ones as
    float16 / bfloat16 arrays)."""
    import ml_dtypes

    half = {"f16": np.float16, "bf16": ml_dtypes.bfloat16}
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
    out = {}
    for a, b in zip(k.args, bufs):
        if a.role == "output":
            x = dev.download(b)
            dt = half.get(getattr(a.type, "dtype", ""))
            out[a.name] = x.view(dt) if dt is not None and x.dtype == np.uint16 else x
    return out


@pytest.mark.parametrize("name,step,T", [("llama", "decode", 1), ("llama", "prefill", 6),
                                         ("llama", "prefill", 12),
                                         ("llama_gguf_q4_1", "decode", 1)])
def test_every_region_matches_oracle(vk_device, vk_target, models, name, step, T):
    """Each dispatch region of the step, compiled to SPIR-V alone, matches the oracle on the
    values the whole step feeds it; together the regions cover every kernel kind. Up to
    ``MAX_M`` tokens the norms are folded into the GEMVs (no reduction region is left); a
    longer prefill keeps them."""
    from poot.backends.gpu.strategies.matmul_match import MAX_M
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
            np.testing.assert_allclose(np.asarray(got[k], np.float32),
                                       np.asarray(want, np.float32), rtol=RTOL, atol=ATOL,
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
    """Whole steps through the executor Session (record once, replay): a prefill then three
    decode steps with the KV caches (one f32 block a sequence; f16/bf16 pools:
    test_paged_step_matches_oracle) carried on the device, written in place."""
    from poot.backends.vulkan.codegen import compile_vulkan
    from poot.dialects.types import DType
    from poot.runtime import Session

    model, weights = models[name]
    ids = [int(i) for i in reference(name)["prompt_ids"]]
    n = 6
    kw = dict(kv_capacity=16, kv_slots=1, kv_dtype=DType.F32)
    pre = model.trace(StepSpec.prefill(n, **kw), weights.types)
    dec = model.trace(StepSpec.decode(**kw), weights.types)
    eng = Session(vk_device)
    eng.load_weights(weights.arrays, weights.types)
    e_pre = eng.add_entry(compile_vulkan(pre, vk_target))
    e_dec = eng.add_entry(compile_vulkan(dec, vk_target))
    caches = empty_caches(pre)
    inputs = step_feed(pre, [ids[:n]], [list(range(n))], [0])
    got = eng.step(e_pre, inputs)
    want = oracle.evaluate(pre, {**inputs, **caches}, weights)
    np.testing.assert_allclose(got["logits"], want["logits"], rtol=RTOL, atol=ATOL)
    caches = {k: v for k, v in want.items() if k.startswith("kv.")}
    for p in range(n, n + 3):
        inputs = step_feed(dec, [[ids[p]]], [[p]], [0])
        got = eng.step(e_dec, inputs)
        want = oracle.evaluate(dec, {**inputs, **caches}, weights)
        np.testing.assert_allclose(got["logits"], want["logits"], rtol=RTOL, atol=ATOL,
                                   err_msg=f"decode at {p}")
        caches = {k: v for k, v in want.items() if k.startswith("kv.")}
        for k, v in caches.items():
            np.testing.assert_allclose(_words(eng.read_state(k), v).astype(np.float32),
                                       np.asarray(v, np.float32), rtol=RTOL, atol=ATOL,
                                       err_msg=k)
    # the KV caches are written over their own buffers (one buffer each, no copy): record
    # once, then replay
    assert e_dec.in_place == {n for n, _ in dec.inputs if n.startswith("kv.")}
    assert len(e_dec.recordings) == 1 and e_dec.steps == 3
    assert all(r.submits >= 1 for r in e_dec.recordings.values())


#: every tiny fixture's paged step: (fixture, step kind, KV pool dtype)
PAGED_STEPS = [("llama", "decode", "f16"), ("llama", "prefill", "bf16"),
               ("llama_gguf_q4_1", "decode", None), ("llama_llama3rope_tied", "prefill", "f32"),
               ("mistral_swa4", "decode", "bf16"), ("mistral_swa4", "prefill", "f16"),
               ("gemma", "prefill", "f16"), ("gemma2", "decode", "f32"),
               ("gemma3", "prefill", "f16"),
               ("phi3", "decode", "bf16"), ("qwen2", "prefill", "f16"),
               ("qwen3", "decode", "f16"), ("mixtral", "prefill", "bf16"),
               ("qwen3_moe", "decode", "f16"), ("glm4_moe", "prefill", "f16"),
               ("glm4_moe", "decode", "f32")]      # 2 rows x top-2 of 8: sparse experts


@pytest.mark.parametrize("name,step,kv", PAGED_STEPS + [("llama", "generic", "f16")])
def test_paged_step_matches_oracle(vk_device, vk_target, monkeypatch, name, step, kv):
    """A whole paged step (two sequences in 4-position blocks scattered over a 20-block pool;
    ``StepSpec`` with ``block_size``/``num_blocks``; the fixture's default KV dtype where
    None) compiled for the device: the K/V writes land in the pools' slots, over the input
    pools' own buffers (in the pools' dtype; bound apart, as here, the outputs are copies),
    attention reads through the block table, and the logits equal
    the oracle's on a clean cache even though every pool row no query sees holds inf/NaN
    (a reused block): 1e-4 with f32 pools, 1e-3 with f16/bf16 ones (a K/V row may round to
    a neighbouring half-precision value); the written pool rows equal the oracle's to 1e-4
    (f32) or one rounding of their dtype, the stale rows kept as they were.
    ``generic``: a decode step with every strategy off (``POOT_GPU_STRATEGIES=generic``):
    the generic mapping of the paged attention (its CPU lowering's loops, whose index maps
    fold into rounding divisions the SPIR-V lowering expands) gives the same."""
    from poot.backends.vulkan.codegen import compile_vulkan
    from poot.dialects.types import DType

    if step == "generic":
        monkeypatch.setenv("POOT_GPU_STRATEGIES", "generic")
        step = "decode"
    model, weights = load_model(fixture_path(name))
    B, bs, NB, C = 2, 4, 20, 32
    T = 1 if step == "decode" else 5
    kw = dict(batch=B, kv_capacity=C, block_size=bs, num_blocks=NB,
              kv_dtype=DType(kv) if kv else None)
    spec = StepSpec.decode(**kw) if step == "decode" else StepSpec.prefill(T, **kw)
    g = model.trace(spec, weights.types)
    prog = compile_vulkan(g, vk_target)
    kinds = {d["kind"] for d in prog.executable.dispatches}
    assert kinds & {"attention", "paged_attention"} and "scatter" in kinds, kinds
    assert '"poot.paged_attention"' in str(prog.graph.module)
    pools = {n for n, _ in g.inputs if n.startswith("kv.")}
    assert prog.executable.in_place == {n: n for n in pools}     # written over the inputs
    rng = np.random.default_rng(len(name) + T)
    table = np.stack([rng.permutation(NB)[:C // bs] for _ in range(B)]).astype(np.int32)
    pos = np.array([[13 - T + 1 + t for t in range(T)], [6 - T + 1 + t for t in range(T)]],
                   np.int32)
    slot = (np.take_along_axis(table, pos // bs, 1) * bs + pos % bs).reshape(-1)
    ins = {"tokens": rng.integers(1, 200, (B, T)).astype(np.int32), "positions": pos,
           "block_table": table, "slot_mapping": slot.astype(np.int32)}
    seen = np.zeros((NB, bs), bool)                      # rows some query of the step sees
    for b in range(B):
        for j in range(int(pos[b].max()) + 1):
            seen[table[b, j // bs], j % bs] = True
    clean, poisoned = dict(ins), dict(ins)
    for n, t in g.inputs:
        if n.startswith("kv."):
            x = (0.5 * rng.standard_normal(t.shape)).astype(np.float32)
            clean[n] = x.astype(t.dtype.numpy)
            x[~seen] = np.where(np.arange(t.shape[-1]) % 2, np.inf, np.nan)
            poisoned[n] = x.astype(t.dtype.numpy)
    want = oracle.evaluate(g, clean, weights)
    got = run_artifact(vk_device, prog.executable, poisoned,
                       {k: weights[k] for k, _ in prog.executable.params})
    half = next(t.dtype for n, t in g.inputs if n.startswith("kv.")) is not DType.F32
    tol = 1e-3 if half else RTOL
    np.testing.assert_allclose(got["logits"], want["logits"], rtol=tol, atol=tol)
    for n, w in want.items():
        if n.startswith("kv."):
            w = np.asarray(w).astype(np.float32)
            w[~seen] = poisoned[n].astype(np.float32)[~seen]     # untouched: still stale
            o = _words(got[n], poisoned[n])
            ulp = {np.dtype(np.float32): RTOL, np.dtype(np.float16): 1e-3}.get(
                np.dtype(poisoned[n].dtype), 8e-3)
            np.testing.assert_allclose(o.astype(np.float32), w, rtol=ulp, atol=ulp, err_msg=n)
