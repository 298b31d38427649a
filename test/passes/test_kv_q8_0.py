"""The q8_0 KV cache (poot.dialects.kv_quant): the paged-attention op's oracle over q8_0
pools against a straight numpy dequantize-then-attend, its CPU lowering against the oracle,
the traced quantize-on-write against ggml's Q8_0 reference, and traced steps (a Llama and a
multi-head latent attention model with 32-multiple head dims) rewritten to read the pools in
place."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from poot import oracle
from poot.backends.cpu.codegen import compile_cpu
from poot.dialects.kv_quant import Q8_0, dequantize_q8_0, quantize_q8_0
from poot.dialects.types import DType, TensorType
from poot.graph.builder import Builder, TraceLimits
from poot.passes.flash_attention import flash_attention

F32 = DType.F32
LIMITS = TraceLimits(max_values=100_000, max_ops=100_000, max_literal_bytes=1 << 22,
                     max_owned_bytes=1 << 30)
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "tiny"


def _softmax_attend(q, k, v, visible, scale):
    """Plain numpy attention of q [B, H, R, D] over k, v [B, H, S, D] with the visible keys
    ``visible`` [B, S] (f64 throughout)."""
    x = np.einsum("bhrd,bhsd->bhrs", q.astype(np.float64), k.astype(np.float64)) * scale
    x = np.where(visible[:, None, None, :], x, -np.inf)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    p = e / e.sum(axis=-1, keepdims=True)
    return np.einsum("bhrs,bhsd->bhrd", p, v.astype(np.float64))


def _pools(rng, nb, bs, h, d, storage):
    """A random pool [NB, bs, H, D] in ``storage``: (arrays for the op, f32 logical values)."""
    x = rng.standard_normal((nb, bs, h, d)).astype(np.float32)
    if storage is Q8_0:
        q, s = quantize_q8_0(x)
        return [q, s], dequantize_q8_0(q, s)
    return [x.astype(storage.numpy)], x.astype(storage.numpy).astype(np.float32)


def _paged_graph(q_t, k_arrs, v_arrs, bt_t, m_t):
    b = Builder(LIMITS)
    q = b.input("q", q_t)
    kp = b.input("kp", TensorType(k_arrs[0].shape, DType.from_numpy(k_arrs[0].dtype)))
    vp = b.input("vp", TensorType(v_arrs[0].shape, DType.from_numpy(v_arrs[0].dtype)))
    bt = b.input("bt", bt_t)
    m = b.input("m", m_t)
    scales = [b.input(f"s{i}", TensorType(a.shape, DType.F16))
              for i, a in enumerate(k_arrs[1:] + v_arrs[1:])]
    out = b.op("paged_attention", [q, kp, vp, bt, m, *scales], {"scale": 0.3, "softcap": 0.0})
    return b.finish(out)


def _case(rng, k_st, v_st, mask_dtype=DType.I1):
    """Three sequences of 9, 3 and 0 visible keys over a permuted block table; the scales of
    every position no sequence sees are inf (what a reused block may hold)."""
    bsz, h, rows, d, nb, bs, w = 3, 2, 3, 64, 9, 4, 3
    lengths = [9, 3, 0]
    table = np.array([[4, 1, 7], [2, 0, 0], [8, 8, 8]], np.int32)
    k_arrs, k = _pools(rng, nb, bs, h, d, k_st)
    v_arrs, v = _pools(rng, nb, bs, h, d, v_st)
    seen = np.zeros((nb, bs), bool)
    for s, n in enumerate(lengths):
        for j in range(n):
            seen[table[s, j // bs], j % bs] = True
    for arrs in (k_arrs, v_arrs):
        arrs[-1][~seen] = np.inf          # a q8_0 pool's scales, or a float pool's values
    vis = np.arange(w * bs)[None, :] < np.array(lengths)[:, None]
    mshape = (bsz, 1, 1, w * bs)
    mask = vis.reshape(mshape)
    if mask_dtype is F32:
        mask = np.where(mask, 0.0, -np.inf).astype(np.float32)
    qv = rng.standard_normal((bsz, h, rows, d)).astype(np.float32)
    g = _paged_graph(TensorType(qv.shape, F32), k_arrs, v_arrs,
                     TensorType(table.shape, DType.I32), TensorType(mshape, mask_dtype))
    ins = {"q": qv, "kp": k_arrs[0], "vp": v_arrs[0], "bt": table, "m": mask}
    ins.update({f"s{i}": a for i, a in enumerate(k_arrs[1:] + v_arrs[1:])})
    return g, ins, (k, v, table, vis, lengths)


STORAGES = [(Q8_0, Q8_0), (Q8_0, DType.F16), (DType.F16, Q8_0)]
IDS = ["q8_0-q8_0", "q8_0-f16", "f16-q8_0"]


@pytest.mark.parametrize("k_st, v_st", STORAGES, ids=IDS)
def test_oracle_is_numpy_dequantize_then_attend(k_st, v_st):
    """The op's oracle over q8_0 pools equals dequantizing the whole pools with numpy
    (f32(q) * f32(d)), gathering each sequence's blocks and attending (f64 softmax)."""
    g, ins, (k, v, table, vis, lengths) = _case(np.random.default_rng(5), k_st, v_st)
    got = next(iter(oracle.evaluate(g, ins).values()))
    for s, n in enumerate(lengths[:2]):
        kk = k[table[s]].reshape(-1, *k.shape[2:]).transpose(1, 0, 2)[None, :, :n]
        vv = v[table[s]].reshape(-1, *v.shape[2:]).transpose(1, 0, 2)[None, :, :n]
        want = _softmax_attend(ins["q"][s:s + 1], kk, vv, vis[s:s + 1, :n], 0.3)
        np.testing.assert_allclose(got[s:s + 1], want, rtol=1e-5, atol=1e-5)
    assert not got[2].any()                 # no visible key: zeros


@pytest.mark.parametrize("mask_dtype", [DType.I1, F32])
@pytest.mark.parametrize("k_st, v_st", STORAGES, ids=IDS)
def test_cpu_kernel_matches_oracle(k_st, v_st, mask_dtype):
    """The CPU lowering, which dequantizes each block where it loads it, equals the oracle;
    stale positions (inf scales) contribute nothing."""
    g, ins, _ = _case(np.random.default_rng(9), k_st, v_st, mask_dtype)
    want = next(iter(oracle.evaluate(g, ins).values()))
    got = next(iter(compile_cpu(g).run(ins, {}).values()))
    np.testing.assert_allclose(got[:2], want[:2], rtol=1e-5, atol=1e-5)
    if mask_dtype is DType.I1:
        assert not got[2].any()


def test_traced_quantize_is_ggml_q8_0():
    """The quantize-on-write the tracer emits (:func:`poot.models.blocks.quantize_q8_0`) gives
    ggml's Q8_0 blocks (``d = amax / 127`` as f16, ``q = round(x / d)`` half away from zero),
    on the oracle and the CPU, including an all-zero group and exact halves; and the round
    trip is within half a step plus the f16 rounding of d (127 * d * 2^-11)."""
    from poot.models.blocks import quantize_q8_0 as traced

    rng = np.random.default_rng(2)
    x = rng.standard_normal((5, 2, 64)).astype(np.float32) * 3
    x[0, 0, :32] = 0.0                                   # a zero group: d = 0, q = 0
    x[1, 0, :32] = np.arange(32) - 15.5                  # amax 15.5: x / d hits halves
    x[1, 0, 0] = 127.0
    b = Builder(LIMITS)
    q, d = traced(b, b.input("x", TensorType(x.shape, F32)))
    g = b.finish({"q": q, "d": d})
    want_q, want_d = _ggml_q8_0(x)
    for run in (oracle.evaluate(g, {"x": x}), compile_cpu(g).run({"x": x}, {})):
        np.testing.assert_array_equal(run["q"], want_q)
        np.testing.assert_array_equal(run["d"], want_d)
    back = dequantize_q8_0(want_q, want_d)
    step = np.repeat(want_d.astype(np.float32), 32, axis=-1)
    assert (np.abs(back - x) <= (0.5 + 127 * 2.0 ** -11) * step * (1 + 1e-3) + 1e-7).all()


def _ggml_q8_0(x):
    """``quantize_row_q8_0_ref`` of ggml, transcribed (roundf: half away from zero)."""
    g = x.reshape(*x.shape[:-1], -1, 32).astype(np.float32)
    amax = np.abs(g).max(axis=-1, keepdims=True)
    d = amax / np.float32(127.0)
    idv = np.where(d != 0, np.float32(1.0) / np.where(d != 0, d, 1), 0).astype(np.float32)
    v = (g * idv).astype(np.float32)
    q = (np.sign(v) * np.floor(np.abs(v) + np.float32(0.5))).astype(np.int8)
    return q.reshape(x.shape), d[..., 0].astype(np.float16)


def _config(tmp_path, fixture, **changes) -> Path:
    cfg = json.loads((FIXTURES / fixture / "config.json").read_text())
    cfg.update(changes)
    path = tmp_path / f"{fixture}.json"
    path.write_text(json.dumps(cfg))
    return path


def _step_inputs(g, spec, rng):
    caches = {}
    for n, t in g.inputs:
        if n.startswith("kv."):
            caches[n] = (rng.integers(-127, 128, t.shape).astype(np.int8)
                         if t.dtype is DType.I8 else
                         (rng.random(t.shape) * 0.02).astype(t.dtype.numpy))
    t_ = spec.tokens
    pos = (np.arange(t_)[None] + (0 if t_ > 1 else 9)).astype(np.int32)
    table = rng.permutation(spec.n_blocks)[:spec.table_width][None].astype(np.int32)
    slots = table[0, pos[0] // spec.bs] * spec.bs + pos[0] % spec.bs
    return {"tokens": rng.integers(0, 64, (1, t_)).astype(np.int32), "positions": pos,
            "block_table": table, "slot_mapping": slots.astype(np.int32), **caches}


@pytest.mark.parametrize("fixture, changes", [
    ("llama", {"head_dim": 32}),
    ("deepseek_v3", {"kv_lora_rank": 32, "qk_rope_head_dim": 32}),
], ids=["llama", "mla"])
@pytest.mark.parametrize("step", ["prefill", "decode"])
def test_traced_steps_read_q8_0_pools_in_place(tmp_path, fixture, changes, step):
    """A step over q8_0 pools declares each pool as i8 values and f16 scales, writes this
    step's rows quantized, and after the flash-attention rewrite every layer's attention is
    one ``poot.paged_attention`` over the pools with no dequantize left; the oracle agrees
    before and after, and the CPU agrees with it (logits and the written pools)."""
    from poot.models import StepSpec
    from poot.models.random_init import load_random_model

    model, weights = load_random_model(_config(tmp_path, fixture, **changes), dtype="f32")
    kw = dict(kv_capacity=16, block_size=4, num_blocks=6, kv_dtype=Q8_0)
    spec = StepSpec.prefill(8, **kw) if step == "prefill" else StepSpec.decode(**kw)
    g = model.trace(spec, weights.types)
    names = dict(g.inputs)
    pool = "kv.0.k" if fixture == "llama" else "kv.0.latent"
    assert names[pool].dtype is DType.I8 and names[pool + "_scale"].dtype is DType.F16
    ins = _step_inputs(g, spec, np.random.default_rng(11))
    ref = oracle.evaluate(g, ins, weights)
    assert flash_attention(g.module) == model.dims().n_layers
    text = str(g.module)
    assert text.count('"poot.paged_attention"') == model.dims().n_layers
    assert "poot.dequantize_q8_0" not in text
    got = oracle.evaluate(g, ins, weights)
    np.testing.assert_allclose(got["logits"], ref["logits"], rtol=1e-6, atol=1e-6)
    cpu = compile_cpu(g).run(ins, weights)
    np.testing.assert_allclose(cpu["logits"], got["logits"], rtol=1e-4, atol=1e-4)
    for k, v in got.items():
        if k.startswith("kv.") and v.dtype == np.int8:
            # a row whose value sits on a rounding edge may differ by one step
            assert np.abs(cpu[k].astype(np.int32) - v.astype(np.int32)).max() <= 1


def test_planning_refuses_q8_0_pools_without_the_kernel():
    """A target whose capabilities do not list q8_0 among its KV formats (the GPU backends)
    refuses a ``poot.paged_attention`` over q8_0 pools, naming the op and what is missing;
    the host CPU target takes it."""
    from poot.compiler.planning import Refusal, check_module
    from poot.compiler.target import Capabilities, Target, host_cpu

    g, _, _ = _case(np.random.default_rng(1), Q8_0, DType.F16)
    check_module(g.module.operation, host_cpu())
    with pytest.raises(Refusal) as e:
        check_module(g.module.operation, Target("vulkan", Capabilities(subgroup_size=32)))
    assert e.value.op == "poot.paged_attention" and "q8_0" in e.value.capability


def test_poot_opt_gpu_target_plans_q8_0_pools():
    """``poot-opt --gpu-kernels`` plans for the KV formats the GPU targets list (q8_0, as a
    Vulkan device with f16 storage): a q8_0 paged attention is planned, and without q8_0
    among the capabilities' KV formats it is refused as compile() refuses it."""
    from dataclasses import replace

    from poot.backends.vulkan.target import vulkan_target
    from poot.compiler.planning import Refusal
    from poot.opt import gpu_caps, gpu_kernels_text
    from poot.passes.fuse_dispatch import fuse_dispatch

    caps = gpu_caps(32, 48 * 1024, 132, "")
    assert "q8_0" in caps.kv_formats and caps.kv_formats == vulkan_target().caps.kv_formats
    g, _, _ = _case(np.random.default_rng(1), Q8_0, Q8_0)
    fuse_dispatch(g.module)
    assert "xi8>" in gpu_kernels_text(g.module, caps)
    with pytest.raises(Refusal) as e:
        gpu_kernels_text(g.module, replace(caps, kv_formats=frozenset()))
    assert "q8_0" in e.value.capability
