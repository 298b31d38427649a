"""poot.graph.ops compositions, evaluated by the CPU oracle, against independent numpy formulas.

Every reference here is written from the published formula (HF transformers / ggml), not by
calling the code under test; packed weights are made and decoded with the ``gguf`` package.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from gguf import GGMLQuantizationType as GQ
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize

from poot.dialects.quant import Quant
from poot.dialects.types import DType, PackedType, TensorType
from poot.graph import Builder, BuilderError, TraceLimits, ops
from poot.oracle import evaluate

RTOL, ATOL = 1e-5, 1e-6
RNG = np.random.default_rng(1234)


def builder() -> Builder:
    return Builder(TraceLimits(max_values=20000, max_ops=20000, max_literal_bytes=1 << 20,
                               max_owned_bytes=1 << 28))


_NP2DT = {np.dtype(np.float32): DType.F32, np.dtype(np.float16): DType.F16,
          np.dtype(ml_dtypes.bfloat16): DType.BF16, np.dtype(np.int32): DType.I32,
          np.dtype(np.int64): DType.I64, np.dtype(np.bool_): DType.I1}


def run(fn, inputs: dict, params: dict | None = None, packed: dict | None = None):
    """Build ``fn(b, **handles)`` over inputs (dense arrays) and params (dense arrays, or
    ``(fmt, shape, bytes)`` for packed), evaluate with the oracle, return the output(s)."""
    b = builder()
    handles, pvals = {}, {}
    for name, arr in inputs.items():
        handles[name] = b.input(name, TensorType(arr.shape, _NP2DT[arr.dtype]))
    for name, arr in (params or {}).items():
        handles[name] = b.param(name, TensorType(arr.shape, _NP2DT[arr.dtype]))
        pvals[name] = arr
    for name, (fmt, shape, raw) in (packed or {}).items():
        handles[name] = b.param(name, PackedType(fmt, shape))
        pvals[name] = raw.reshape(-1)
    out = fn(b, **handles)
    outs = out if isinstance(out, tuple) else (out,)
    g = b.finish({f"o{i}": t for i, t in enumerate(outs)})
    res = evaluate(g, inputs, pvals)
    vals = tuple(res[f"o{i}"] for i in range(len(outs)))
    return vals if isinstance(out, tuple) else vals[0]


def close(got, want, rtol=RTOL, atol=ATOL):
    got = np.asarray(got)
    assert got.dtype == np.float32, got.dtype
    np.testing.assert_allclose(got, np.asarray(want, np.float64), rtol=rtol, atol=atol)


def randn(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# linear / embedding
# ---------------------------------------------------------------------------------------------
def test_linear_dense_bias_3d():
    x, w, bias = randn(2, 3, 16), randn(8, 16), randn(8)
    got = run(lambda b, x, w, bias: ops.linear(b, x, w, bias), {"x": x}, {"w": w, "bias": bias})
    assert got.shape == (2, 3, 8)
    close(got, x.astype(np.float64) @ w.T.astype(np.float64) + bias)


def test_linear_1d_and_half_weights():
    x = randn(16)
    for dt in (np.float16, ml_dtypes.bfloat16):
        w = randn(5, 16).astype(dt)
        got = run(lambda b, x, w: ops.linear(b, x, w), {"x": x}, {"w": w})
        close(got, x.astype(np.float64) @ w.astype(np.float64).T)


@pytest.mark.parametrize("fmt,gtype", [(Quant.Q8_0.value, GQ.Q8_0), (Quant.Q4_1.value, GQ.Q4_1)])
def test_linear_packed(fmt, gtype):
    x, w = randn(2, 3, 64), randn(12, 64)
    raw = gguf_quantize(w, gtype)
    wd = gguf_dequantize(raw, gtype).astype(np.float64)
    got = run(lambda b, x, w: ops.linear(b, x, w), {"x": x}, packed={"w": (fmt, (12, 64), raw)})
    close(got, x.astype(np.float64) @ wd.T, rtol=1e-5, atol=1e-5)


def test_embedding_dense_and_packed():
    table = randn(10, 32)
    ids = np.array([[3, 0, 9], [1, 1, 4]], np.int32)
    got = run(lambda b, ids, t: ops.embedding(b, t, ids), {"ids": ids}, {"t": table})
    close(got, table[ids])
    tb = table.astype(ml_dtypes.bfloat16)
    got = run(lambda b, ids, t: ops.embedding(b, t, ids), {"ids": ids}, {"t": tb})
    close(got, tb.astype(np.float32)[ids])
    raw = gguf_quantize(table, GQ.Q8_0)
    got = run(lambda b, ids, t: ops.embedding(b, t, ids), {"ids": ids},
              packed={"t": (Quant.Q8_0.value, (10, 32), raw)})
    close(got, gguf_dequantize(raw, GQ.Q8_0)[ids])


# ---------------------------------------------------------------------------------------------
# norms, softmax, activations
# ---------------------------------------------------------------------------------------------
def test_rmsnorm():
    x, w = randn(2, 3, 16, scale=3.0), randn(16)
    x64 = x.astype(np.float64)
    ref = x64 / np.sqrt(np.mean(x64 * x64, -1, keepdims=True) + 1e-6)
    close(run(lambda b, x, w: ops.rmsnorm(b, x, w, 1e-6), {"x": x}, {"w": w}), ref * w)
    close(run(lambda b, x, w: ops.rmsnorm(b, x, w, 1e-6, unit_offset=True), {"x": x},
              {"w": w}), ref * (1.0 + w))
    close(run(lambda b, x: ops.rmsnorm(b, x, None, 1e-6), {"x": x}), ref)


def test_layernorm():
    x, w, bias = randn(4, 24, scale=2.0) + 1.5, randn(24), randn(24)
    x64 = x.astype(np.float64)
    mu = x64.mean(-1, keepdims=True)
    var = ((x64 - mu) ** 2).mean(-1, keepdims=True)
    ref = (x64 - mu) / np.sqrt(var + 1e-5)
    close(run(lambda b, x, w, c: ops.layernorm(b, x, w, c, 1e-5), {"x": x},
              {"w": w, "c": bias}), ref * w + bias)
    close(run(lambda b, x: ops.layernorm(b, x, None, None, 1e-5), {"x": x}), ref)


def test_softmax_axes_and_large_values():
    x = randn(3, 5, 7, scale=4.0)
    x[0, 0, :] += 1000.0  # max-subtraction keeps this finite
    for axis in (-1, 0, 1):
        x64 = x.astype(np.float64)
        e = np.exp(x64 - x64.max(axis, keepdims=True))
        got = run(lambda b, x: ops.softmax(b, x, axis), {"x": x})
        close(got, e / e.sum(axis, keepdims=True))


def test_masked_softmax_fully_masked_row_is_zero():
    x = randn(3, 6)
    vis = np.array([[1, 0, 1, 1, 0, 0], [0] * 6, [1] * 6], bool)
    got = run(lambda b, x, m: ops.masked_softmax(b, x, m), {"x": x, "m": vis})
    ref = np.zeros((3, 6))
    for r in range(3):
        if vis[r].any():
            e = np.exp(x[r][vis[r]].astype(np.float64) - x[r][vis[r]].max())
            ref[r][vis[r]] = e / e.sum()
    close(got, ref)
    assert not np.isnan(got).any()


def test_activations():
    x = np.concatenate([np.linspace(-12, 12, 97, dtype=np.float32), randn(31, scale=3.0)])
    x64 = x.astype(np.float64)
    sig = 1.0 / (1.0 + np.exp(-x64))
    erf = np.array([math.erf(v / math.sqrt(2.0)) for v in x64])
    refs = {
        "relu": np.maximum(x64, 0.0),
        "sigmoid": sig,
        "silu": x64 * sig,
        "gelu_tanh": 0.5 * x64 * (1.0 + np.tanh(math.sqrt(2.0 / math.pi)
                                                 * (x64 + 0.044715 * x64 ** 3))),
        "gelu_erf": 0.5 * x64 * (1.0 + erf),
    }
    for name, ref in refs.items():
        close(run(lambda b, x: getattr(ops, name)(b, x), {"x": x}), ref, atol=2e-6)
        close(run(lambda b, x: ops.activation(b, x, name), {"x": x}), ref, atol=2e-6)
    close(run(lambda b, x: ops.activation(b, x, "gelu_pytorch_tanh"), {"x": x}),
          refs["gelu_tanh"], atol=2e-6)
    close(run(lambda b, x: ops.activation(b, x, "gelu"), {"x": x}), refs["gelu_erf"], atol=2e-6)


def test_glu_and_mlps():
    gate, up = randn(2, 3, 8, scale=2.0), randn(2, 3, 8)
    g64 = gate.astype(np.float64)
    silu = g64 / (1.0 + np.exp(-g64))
    close(run(lambda b, g, u: ops.swiglu(b, g, u), {"g": gate, "u": up}), silu * up)
    gt = 0.5 * g64 * (1 + np.tanh(math.sqrt(2 / math.pi) * (g64 + 0.044715 * g64 ** 3)))
    ge = 0.5 * g64 * (1 + np.vectorize(math.erf)(g64 / math.sqrt(2)))
    close(run(lambda b, g, u: ops.geglu(b, g, u), {"g": gate, "u": up}), gt * up)
    close(run(lambda b, g, u: ops.geglu(b, g, u, "none"), {"g": gate, "u": up}), ge * up)

    x, wg, wu, wd = randn(2, 3, 16), randn(24, 16, scale=0.3), randn(24, 16, scale=0.3), \
        randn(16, 24, scale=0.3)
    x64 = x.astype(np.float64)
    hg = x64 @ wg.T
    h = hg / (1 + np.exp(-hg)) * (x64 @ wu.T)
    got = run(lambda b, x, wg, wu, wd: ops.mlp_glu(b, x, wg, wu, wd), {"x": x},
              {"wg": wg, "wu": wu, "wd": wd})
    close(got, h @ wd.T, atol=1e-5)
    bu, bd = randn(24), randn(16)
    hu = x64 @ wu.T + bu
    hu = 0.5 * hu * (1 + np.tanh(math.sqrt(2 / math.pi) * (hu + 0.044715 * hu ** 3)))
    got = run(lambda b, x, wu, wd, bu, bd: ops.mlp(b, x, wu, wd, "gelu_tanh", bu, bd), {"x": x},
              {"wu": wu, "wd": wd, "bu": bu, "bd": bd})
    close(got, hu @ wd.T + bd, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# RoPE
# ---------------------------------------------------------------------------------------------
def hf_default_inv_freq(dim, base):
    return 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float64) / dim))


def hf_llama3_inv_freq(dim, base, factor, low, high, orig):
    """Element-by-element transcription of HF ``_compute_llama3_parameters``."""
    out = []
    for f in hf_default_inv_freq(dim, base):
        wavelen = 2 * math.pi / f
        if wavelen < orig / high:
            out.append(f)
        elif wavelen > orig / low:
            out.append(f / factor)
        else:
            smooth = (orig / wavelen - low) / (high - low)
            out.append((1 - smooth) * f / factor + smooth * f)
    return np.array(out)


def hf_yarn_inv_freq(dim, base, factor, orig, beta_fast=32, beta_slow=1):
    """Transcription of HF ``_compute_yarn_parameters`` (truncate=True)."""
    def cdim(rot):
        return (dim * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(base))
    low, high = max(math.floor(cdim(beta_fast)), 0), min(math.ceil(cdim(beta_slow)), dim - 1)
    pos_freqs = base ** (np.arange(0, dim, 2) / dim)
    out = []
    for i in range(dim // 2):
        ramp = min(max((i - low) / (high - low if high != low else 0.001), 0.0), 1.0)
        extra = 1 - ramp
        out.append(1 / (factor * pos_freqs[i]) * (1 - extra) + 1 / pos_freqs[i] * extra)
    return np.array(out), 0.1 * math.log(factor) + 1.0


def test_rope_inv_freq_scalings():
    close(ops.rope_inv_freq(64, 10000.0), hf_default_inv_freq(64, 10000.0), atol=0)
    close(ops.rope_inv_freq(64, 10000.0, rotary_dim=32), hf_default_inv_freq(32, 10000.0),
          atol=0)
    lin = ops.RopeScaling("linear", factor=4.0)
    close(ops.rope_inv_freq(64, 10000.0, lin), hf_default_inv_freq(64, 10000.0) / 4.0, atol=0)
    l3 = ops.RopeScaling("llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                         original_max_position=8192)
    want = hf_llama3_inv_freq(128, 500000.0, 8.0, 1.0, 4.0, 8192)
    got = ops.rope_inv_freq(128, 500000.0, l3)
    close(got, want, atol=0)
    # all three llama3 bands are exercised
    base = hf_default_inv_freq(128, 500000.0)
    assert (got == base.astype(np.float32)).any() and np.isclose(got, base / 8).any()
    assert (~np.isclose(got, base) & ~np.isclose(got, base / 8)).any()
    assert ops.RopeScaling.from_hf({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0,
                                    "original_max_position_embeddings": 8192}) == l3
    assert ops.RopeScaling.from_hf(None).kind == "none"
    yarn = ops.RopeScaling.from_hf({"rope_type": "yarn", "factor": 4.0,
                                    "original_max_position_embeddings": 4096})
    want, att = hf_yarn_inv_freq(64, 10000.0, 4.0, 4096)
    close(ops.rope_inv_freq(64, 10000.0, yarn), want, atol=0)
    assert ops.rope_attention_scaling(yarn) == pytest.approx(att)
    assert ops.rope_attention_scaling(l3) == 1.0


def test_rope_matches_transformers():
    """Cross-check against the installed HF transformers (skipped when it is absent)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.llama.modeling_llama import (LlamaRotaryEmbedding,
                                                          apply_rotary_pos_emb)

    cases = [
        ({"rope_type": "default", "rope_theta": 10000.0}, 64, 2048),
        ({"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}, 64, 4096),
        ({"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}, 128, 131072),
        ({"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
          "original_max_position_embeddings": 4096}, 64, 16384),
    ]
    for params, hd, maxpos in cases:
        cfg = transformers.LlamaConfig(hidden_size=2 * hd, num_attention_heads=2,
                                       max_position_embeddings=maxpos, rope_parameters=params)
        init = ROPE_INIT_FUNCTIONS.get(params["rope_type"])
        if init is None:  # "default" lives elsewhere across versions
            want = 1.0 / params["rope_theta"] ** (torch.arange(0, hd, 2).float() / hd)
            att = 1.0
        else:
            want, att = init(cfg, "cpu")
        sc = ops.RopeScaling.from_hf(params, maxpos)
        close(ops.rope_inv_freq(hd, params["rope_theta"], sc), want.numpy(), rtol=2.5e-7, atol=0)
        assert ops.rope_attention_scaling(sc) == pytest.approx(att)

        if params["rope_type"] == "llama3":
            rot = LlamaRotaryEmbedding(cfg)
            x = randn(2, 3, 2, hd)
            pos = np.array([[0, 1, 9000], [17, 18, 100000]], np.int64)
            cos, sin = rot(torch.from_numpy(x), torch.from_numpy(pos))
            xt = torch.from_numpy(x).transpose(1, 2)  # HF [B, H, T, D]
            want, _ = apply_rotary_pos_emb(xt, xt, cos, sin)
            inv = ops.rope_inv_freq(hd, params["rope_theta"], sc)
            got = run(lambda b, x, p: ops.apply_rope(b, x, *ops.rope_cos_sin(b, p, inv), "half"),
                      {"x": x, "p": pos})
            close(got, want.transpose(1, 2).numpy(), rtol=1e-5, atol=1e-5)


def rope_ref(x, pos, inv, layout):
    """x [B,T,H,D] float64, pos [B,T]: rotate pairs with angles pos * inv (numpy)."""
    r = 2 * inv.size
    ang = pos[..., None].astype(np.float32) * inv.astype(np.float32)  # f32, as HF
    cos = np.cos(ang.astype(np.float64))[:, :, None, :]
    sin = np.sin(ang.astype(np.float64))[:, :, None, :]
    out = x.astype(np.float64).copy()
    if layout == "half":
        a, c = x[..., :r // 2], x[..., r // 2:r]
        out[..., :r // 2] = a * cos - c * sin
        out[..., r // 2:r] = c * cos + a * sin
    else:
        a, c = x[..., 0:r:2], x[..., 1:r:2]
        out[..., 0:r:2] = a * cos - c * sin
        out[..., 1:r:2] = c * cos + a * sin
    return out


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("rotary_dim", [16, 8])
def test_apply_rope(layout, rotary_dim):
    x = randn(2, 3, 4, 16)
    pos = np.array([[0, 1, 2], [7, 8, 300]], np.int32)
    inv = ops.rope_inv_freq(16, 10000.0, rotary_dim=rotary_dim)

    def f(b, x, pos):
        cos, sin = ops.rope_cos_sin(b, pos, inv)
        assert cos.shape == (2, 3, rotary_dim // 2)
        return ops.apply_rope(b, x, cos, sin, layout)

    got = run(f, {"x": x, "pos": pos})
    close(got, rope_ref(x, pos, inv, layout), atol=2e-6)
    if rotary_dim < 16:
        np.testing.assert_array_equal(got[..., rotary_dim:], x[..., rotary_dim:])


def test_rope_cos_sin_values_and_scaling():
    pos = np.array([[0, 5], [1000, 4095]], np.int64)
    inv = ops.rope_inv_freq(32, 10000.0)
    cos, sin = run(lambda b, p: ops.rope_cos_sin(b, p, inv, attention_scaling=1.25), {"p": pos})
    ang = (pos[..., None].astype(np.float32) * inv).astype(np.float64)
    close(cos, 1.25 * np.cos(ang), atol=2e-6)
    close(sin, 1.25 * np.sin(ang), atol=2e-6)


def hf_permute(w, n_heads):
    """HF ``convert_llama_weights_to_hf.permute``: Meta (interleaved) rows -> HF (half)."""
    dim1, dim2 = w.shape
    return w.reshape(n_heads, dim1 // n_heads // 2, 2, dim2).transpose(0, 2, 1, 3) \
        .reshape(dim1, dim2)


def test_rope_interleaved_on_permuted_weights_equals_half():
    """Interleaved RoPE on Meta-layout q/k weights gives the same attention as half-split RoPE
    on the HF-permuted weights, and the rotated q channels are the permuted ones."""
    n_heads, hd, dm = 2, 8, 12
    x = randn(2, 3, dm)
    wq, wk, wv = randn(n_heads * hd, dm), randn(n_heads * hd, dm), randn(n_heads * hd, dm)
    pos = np.array([[0, 1, 2], [5, 6, 7]], np.int32)
    inv = ops.rope_inv_freq(hd, 10000.0)

    def f(layout):
        def g(b, x, pos, wq, wk, wv):
            cos, sin = ops.rope_cos_sin(b, pos, inv)
            q = ops.apply_rope(b, b.reshape(ops.linear(b, x, wq), [2, 3, n_heads, hd]), cos, sin,
                               layout)
            k = ops.apply_rope(b, b.reshape(ops.linear(b, x, wk), [2, 3, n_heads, hd]), cos, sin,
                               layout)
            v = b.reshape(ops.linear(b, x, wv), [2, 3, n_heads, hd])
            return q, ops.attention(b, q, k, v, q_pos=pos)
        return g

    q_i, o_i = run(f("interleaved"), {"x": x, "pos": pos}, {"wq": wq, "wk": wk, "wv": wv})
    q_h, o_h = run(f("half"), {"x": x, "pos": pos},
                   {"wq": hf_permute(wq, n_heads), "wk": hf_permute(wk, n_heads), "wv": wv})
    perm = hf_permute(np.arange(n_heads * hd).reshape(-1, 1), n_heads).reshape(n_heads, hd)
    perm = perm % hd
    for h in range(n_heads):
        np.testing.assert_allclose(q_h[:, :, h], q_i[:, :, h][..., perm[h]], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(o_h, o_i, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# attention
# ---------------------------------------------------------------------------------------------
def attention_ref(q, k, v, q_pos, k_pos=None, causal=True, window=None, softcap=None, scale=None,
                  mask=None):
    """Loop-per-(batch, head, query) reference: HF eager attention with repeat_kv."""
    bsz, t, hq, d = q.shape
    s, hkv, dv = k.shape[1], k.shape[2], v.shape[3]
    if k_pos is None:
        k_pos = np.broadcast_to(np.arange(s), (bsz, s))
    scale = d ** -0.5 if scale is None else scale
    out = np.zeros((bsz, t, hq, dv))
    rep = hq // hkv
    for bi in range(bsz):
        for h in range(hq):
            kh, vh = k[bi, :, h // rep].astype(np.float64), v[bi, :, h // rep].astype(np.float64)
            for ti in range(t):
                sc = kh @ q[bi, ti, h].astype(np.float64) * scale
                if softcap is not None:
                    sc = softcap * np.tanh(sc / softcap)
                vis = np.ones(s, bool)
                if causal:
                    vis &= k_pos[bi] <= q_pos[bi, ti]
                if window is not None:
                    vis &= q_pos[bi, ti] - k_pos[bi] < window
                if mask is not None:
                    vis &= mask[bi, ti]
                if not vis.any():
                    continue
                e = np.exp(sc[vis] - sc[vis].max())
                out[bi, ti, h] = (e / e.sum()) @ vh[vis]
    return out


def attn(q, k, v, q_pos, k_pos=None, mask=None, **kw):
    inputs = {"q": q, "k": k, "v": v, "qp": q_pos}
    if k_pos is not None:
        inputs["kp"] = k_pos
    if mask is not None:
        inputs["m"] = mask

    def f(b, q, k, v, qp, kp=None, m=None):
        return ops.attention(b, q, k, v, q_pos=qp, k_pos=kp, mask=m, **kw)
    return run(f, inputs)


def test_attention_gqa_prefill_causal():
    q, k, v = randn(2, 5, 4, 8), randn(2, 5, 2, 8), randn(2, 5, 2, 8)
    qp = np.tile(np.arange(5, dtype=np.int32), (2, 1))
    close(attn(q, k, v, qp), attention_ref(q, k, v, qp), atol=2e-6)


def test_attention_gqa_mask_fully_masked_rows_zero():
    q, k, v = randn(2, 4, 6, 8), randn(2, 4, 3, 8), randn(2, 4, 3, 5)  # Dv != D
    qp = np.tile(np.arange(4, dtype=np.int32), (2, 1))
    mask = RNG.random((2, 4, 4)) < 0.6
    mask[1, 2, :] = False  # a query that sees nothing
    got = attn(q, k, v, qp, mask=mask)
    close(got, attention_ref(q, k, v, qp, mask=mask), atol=2e-6)
    assert got.shape == (2, 4, 6, 5)
    assert not np.isnan(got).any() and (got[1, 2] == 0).all()
    # non-causal with a mask only (encoder style)
    close(attn(q, k, v, qp, mask=mask, causal=False),
          attention_ref(q, k, v, qp, mask=mask, causal=False), atol=2e-6)
    close(attn(q, k, v, qp, causal=False), attention_ref(q, k, v, qp, causal=False), atol=2e-6)


def test_attention_sliding_window_softcap_scale():
    q, k, v = randn(2, 7, 4, 8, scale=3.0), randn(2, 7, 1, 8, scale=3.0), randn(2, 7, 1, 8)
    qp = np.tile(np.arange(7, dtype=np.int32), (2, 1))
    kw = dict(window=3, softcap=5.0, scale=0.25)
    got = attn(q, k, v, qp, sliding_window=3, softcap=5.0, scale=0.25)
    close(got, attention_ref(q, k, v, qp, **kw), atol=2e-6)
    # the window alone (non-causal) still masks by distance q_pos - k_pos < W
    got = attn(q, k, v, qp, sliding_window=2, causal=False)
    close(got, attention_ref(q, k, v, qp, window=2, causal=False), atol=2e-6)


def test_attention_decode_against_fixed_capacity_cache():
    """T=1 decode: a cache of capacity 8 whose slots beyond each sequence's position hold
    garbage; batch rows at different positions."""
    cap = 8
    q = randn(2, 1, 4, 16)
    k, v = randn(2, cap, 2, 16), randn(2, cap, 2, 16)
    qp = np.array([[3], [6]], np.int64)
    k[0, 4:] = 1e4  # unwritten slots: must not matter (finite: 0 * v is still 0)
    v[0, 4:] = -3e4
    k[1, 7:], v[1, 7:] = -1e4, 5e4
    got = attn(q, k, v, qp)
    close(got, attention_ref(q, k, v, qp), atol=2e-6)
    got = attn(q, k, v, qp, sliding_window=2, softcap=30.0)
    close(got, attention_ref(q, k, v, qp, window=2, softcap=30.0), atol=2e-6)


def test_attention_chunked_prefill_with_k_pos_and_half_inputs():
    cap = 8
    q = randn(2, 3, 4, 8).astype(ml_dtypes.bfloat16)
    k, v = randn(2, cap, 2, 8).astype(ml_dtypes.bfloat16), randn(2, cap, 2, 8)
    qp = np.array([[2, 3, 4], [5, 6, 7]], np.int32)
    kp = np.tile(np.arange(cap, dtype=np.int32), (2, 1))[:, ::-1].copy()  # reversed slot order
    got = attn(q, k, v.astype(np.float16), qp, k_pos=kp)
    close(got, attention_ref(q.astype(np.float32), k.astype(np.float32),
                             v.astype(np.float16).astype(np.float32), qp, k_pos=kp), atol=2e-6)


def test_attention_matches_transformers_gemma2_eager():
    """GQA + softcap + sliding window + chunk against a cache, against HF's own eager attention
    (Gemma 2) and HF's own mask functions (skipped when transformers is absent)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from types import SimpleNamespace

    from transformers.masking_utils import (and_masks, causal_mask_function,
                                            sliding_window_overlay)
    from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward

    bsz, t, hq, hkv, d, cap, w, cap_s = 2, 4, 6, 2, 16, 10, 3, 20.0
    q, k, v = randn(bsz, t, hq, d, scale=2.0), randn(bsz, cap, hkv, d, scale=2.0), \
        randn(bsz, cap, hkv, d)
    qp = np.array([[3, 4, 5, 6], [6, 7, 8, 9]], np.int32)
    allowed_fn = and_masks(causal_mask_function, sliding_window_overlay(w))
    kv_idx = torch.arange(cap)
    ti_ = torch.tensor
    allowed = np.array([[allowed_fn(ti_(bi), ti_(0), ti_(int(qp[bi, ti])), kv_idx).numpy()
                         for ti in range(t)] for bi in range(bsz)])
    assert allowed.shape == (bsz, t, cap) and 0 < allowed.sum() < allowed.size
    add = torch.from_numpy(np.where(allowed, 0.0, np.finfo(np.float32).min)
                           .astype(np.float32))[:, None]
    module = SimpleNamespace(num_key_value_groups=hq // hkv, training=False, head_dim=d)
    tq, tk, tv = (torch.from_numpy(a).transpose(1, 2) for a in (q, k, v))
    want, _ = eager_attention_forward(module, tq, tk, tv, add, scaling=0.2, softcap=cap_s)
    got = attn(q, k, v, qp, sliding_window=w, softcap=cap_s, scale=0.2)
    close(got, want.numpy(), atol=2e-6)


# ---------------------------------------------------------------------------------------------
# MoE
# ---------------------------------------------------------------------------------------------
def topk_ref(logits, k):
    """Indices of the k largest per row, ties -> lowest index (stable sort on -logits)."""
    return np.argsort(-logits.astype(np.float64), axis=-1, kind="stable")[:, :k]


def test_topk_mask_ties_lowest_index():
    logits = np.array([[1, 3, 3, 0],
                       [2, 2, 2, 2],
                       [0, -np.inf, 5, -np.inf],
                       [-np.inf, -np.inf, -np.inf, -np.inf],
                       [0.5, 0.25, 0.5, 0.5]], np.float32)
    for k in (1, 2, 3, 4):
        got = run(lambda b, x: ops.topk_mask(b, x, k), {"x": logits})
        want = np.zeros_like(got)
        np.put_along_axis(want, topk_ref(logits, k), True, axis=1)
        np.testing.assert_array_equal(got, want, err_msg=f"k={k}")
        assert (got.sum(1) == k).all()


@pytest.mark.parametrize("normalize", [False, True])
def test_topk_routing_softmax(normalize):
    logits = randn(6, 8, scale=2.0)
    logits[0, 5] = logits[0, 2]  # a tie
    k = 3
    got = run(lambda b, x: ops.topk_routing(b, x, k, normalize), {"x": logits})
    l64 = logits.astype(np.float64)
    p = np.exp(l64 - l64.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    want = np.zeros_like(p)
    idx = topk_ref(logits, k)
    np.put_along_axis(want, idx, np.take_along_axis(p, idx, 1), axis=1)
    if normalize:
        want /= want.sum(1, keepdims=True)
    close(got, want)
    assert ((got != 0).sum(1) == k).all()


def test_softmax_after_topk_equals_renormalized_softmax():
    logits = randn(5, 8, scale=3.0)
    k = 2
    after = run(lambda b, x: ops.topk_routing(b, x, k, False, softmax_after_topk=True),
                {"x": logits})
    renorm = run(lambda b, x: ops.topk_routing(b, x, k, True), {"x": logits})
    idx = topk_ref(logits, k)
    sel = np.take_along_axis(logits.astype(np.float64), idx, 1)  # Mixtral: softmax(topk logits)
    e = np.exp(sel - sel.max(1, keepdims=True))
    want = np.zeros((5, 8))
    np.put_along_axis(want, idx, e / e.sum(1, keepdims=True), axis=1)
    close(after, want)
    close(renorm, want)


def test_topk_routing_sigmoid():
    logits = randn(4, 6)
    got = run(lambda b, x: ops.topk_routing(b, x, 2, True, scoring="sigmoid"), {"x": logits})
    s = 1 / (1 + np.exp(-logits.astype(np.float64)))
    idx = topk_ref(logits, 2)
    want = np.zeros_like(s)
    np.put_along_axis(want, idx, np.take_along_axis(s, idx, 1), axis=1)
    close(got, want / want.sum(1, keepdims=True))


def deepseek_routing_ref(logits, bias, k, groups, topk_groups, normalize, scale, scoring,
                         group_score):
    """HF's DeepseekV3TopkRouter / Glm4MoeTopkRouter (``top2_sum``) and DeepSeek-V2's
    group_limited_greedy (``max``), per row in float64: choose by score + bias within the
    best groups; weigh by the unbiased score."""
    l64 = logits.astype(np.float64)
    if scoring == "sigmoid":
        p = 1 / (1 + np.exp(-l64))
    else:
        p = np.exp(l64 - l64.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
    out = np.zeros_like(p)
    n, e = p.shape
    for r in range(n):
        key = p[r] + (bias if bias is not None else 0.0)
        g = key.reshape(groups, e // groups)
        gs = np.sort(g, axis=1)[:, ::-1][:, :2].sum(1) if group_score == "top2_sum" \
            else g.max(1)
        keep = np.argsort(-gs, kind="stable")[:topk_groups]
        masked = np.full(e, -np.inf)
        for gi in keep:
            masked[gi * (e // groups):(gi + 1) * (e // groups)] = key[gi * (e // groups):
                                                                     (gi + 1) * (e // groups)]
        sel = np.argsort(-masked, kind="stable")[:k]
        w = p[r, sel]
        if normalize:
            w = w / (w.sum() + 1e-20)
        out[r, sel] = w * scale
    return out


@pytest.mark.parametrize("scoring,groups,topk_groups,group_score,normalize,scale", [
    ("sigmoid", 4, 2, "top2_sum", True, 2.5),     # DeepSeek-V3 / GLM-4.5
    ("sigmoid", 1, 1, "top2_sum", False, 1.0),    # bias only
    ("softmax", 4, 1, "max", False, 16.0),        # DeepSeek-V2 group_limited_greedy
    ("sigmoid", 8, 3, "top2_sum", True, 1.0),     # groups of two experts
])
def test_topk_routing_deepseek_selection(scoring, groups, topk_groups, group_score, normalize,
                                          scale):
    """Group-limited top-k on bias-corrected scores (the bias picks, never weighs), then
    renormalization and routed scaling, against a per-row float64 port of HF's routers."""
    rng = np.random.default_rng(7)
    logits = randn(6, 16, scale=2.0)
    bias = (rng.standard_normal(16) * 0.5).astype(np.float32)
    k = 4
    got = run(lambda b, x, c: ops.topk_routing(
        b, x, k, normalize, scoring=scoring, bias=c, groups=groups, topk_groups=topk_groups,
        group_score=group_score, scale=scale), {"x": logits, "c": bias})
    want = deepseek_routing_ref(logits, bias, k, groups, topk_groups, normalize, scale,
                                scoring, group_score)
    close(got, want)
    assert ((got != 0).sum(1) == k).all()
    # the bias changes the choice for this draw (else the test would not see it used)
    plain = deepseek_routing_ref(logits, None, k, groups, topk_groups, normalize, scale,
                                 scoring, group_score)
    assert ((want != 0) != (plain != 0)).any()


def moe_ref(x, router, wg, wu, wd, k, normalize):
    """Per-token loop over the selected experts only (HF Qwen2-MoE / Mixtral block)."""
    x64 = x.astype(np.float64)
    logits = x64 @ router.T
    out = np.zeros_like(x64)
    for n in range(x.shape[0]):
        p = np.exp(logits[n] - logits[n].max())
        p /= p.sum()
        sel = np.argsort(-logits[n], kind="stable")[:k]
        w = p[sel] / (p[sel].sum() if normalize else 1.0)
        for e, we in zip(sel, w):
            g = wg[e] @ x64[n]
            h = g / (1 + np.exp(-g)) * (wu[e] @ x64[n])
            out[n] += we * (wd[e] @ h)
    return out


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
@pytest.mark.parametrize("normalize", [False, True])
def test_moe_dense_and_sparse(normalize, sparse):
    """Both spellings of the MoE block (every expert weighted / the selected experts through
    ``poot.indexed_matmul``) equal a per-token loop over the selected experts."""
    n, d, f, e, k = 5, 16, 12, 4, 2
    x, router = randn(n, d), randn(e, d)
    wg, wu, wd = randn(e, f, d, scale=0.3), randn(e, f, d, scale=0.3), randn(e, d, f, scale=0.3)
    got = run(lambda b, x, r, g, u, dn: ops.moe(b, x, r, g, u, dn, k, normalize,
                                                sparse=sparse), {"x": x},
              {"r": router, "g": wg, "u": wu, "dn": wd})
    close(got, moe_ref(x, router, wg, wu, wd, k, normalize), atol=1e-5)


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
def test_moe_packed_experts(sparse):
    n, d, f, e, k = 3, 32, 64, 4, 2
    x, router = randn(n, d), randn(e, d)
    wg, wu, wd = randn(e, f, d, scale=0.3), randn(e, f, d, scale=0.3), randn(e, d, f, scale=0.3)
    raw = {nm: gguf_quantize(w, GQ.Q8_0) for nm, w in (("g", wg), ("u", wu), ("dn", wd))}
    deq = {nm: gguf_dequantize(r, GQ.Q8_0) for nm, r in raw.items()}
    fmt = Quant.Q8_0.value
    got = run(lambda b, x, r, g, u, dn: ops.moe(b, x, r, g, u, dn, k, True, sparse=sparse),
              {"x": x}, {"r": router},
              packed={"g": (fmt, wg.shape, raw["g"]), "u": (fmt, wu.shape, raw["u"]),
                      "dn": (fmt, wd.shape, raw["dn"])})
    close(got, moe_ref(x, router, deq["g"], deq["u"], deq["dn"], k, True), atol=1e-5)


def test_moe_spelling_follows_the_shape():
    """Unspecified, the sparse spelling is taken where it reads fewer experts (N * k < E):
    a decode row, not a prefill chunk."""
    def count(n):
        b = builder()
        x = b.input("x", TensorType((n, 16), DType.F32))
        ps = [b.param(nm, TensorType(sh, DType.F32)) for nm, sh in
              (("r", (8, 16)), ("g", (8, 12, 16)), ("u", (8, 12, 16)), ("dn", (8, 16, 12)))]
        ops.moe(b, x, *ps, 2, True)
        return str(b.module).count("poot.indexed_matmul")
    assert count(1) == 3 and count(3) == 3
    assert count(4) == 0 and count(32) == 0


def test_indexed_matmul_reads_the_selected_slab():
    """``poot.indexed_matmul`` against a float64 loop; out-of-range indices clamp."""
    x, w = randn(5, 8), randn(3, 4, 8)
    idx = np.array([2, 0, 7, -1, 1], np.int32)
    got = run(lambda b, x, i, w: b.indexed_matmul(x, w, i), {"x": x, "i": idx}, {"w": w})
    want = np.stack([w[min(max(int(i), 0), 2)].astype(np.float64) @ x[t].astype(np.float64)
                     for t, i in enumerate(idx)])
    close(got, want)


# ---------------------------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------------------------
def _t(b, name, shape, dtype=DType.F32):
    return b.input(name, TensorType(shape, dtype))


@pytest.mark.parametrize("build,match", [
    (lambda b: ops.attention(b, _t(b, "q", (1, 2, 3, 8)), _t(b, "k", (1, 2, 2, 8)),
                             _t(b, "v", (1, 2, 2, 8)), q_pos=_t(b, "p", (1, 2), DType.I32)),
     r"ops\.attention: query heads Hq=3 are not a multiple of kv heads Hkv=2"),
    (lambda b: ops.attention(b, _t(b, "q", (1, 2, 2, 8)), _t(b, "k", (1, 2, 2, 4)),
                             _t(b, "v", (1, 2, 2, 8)), q_pos=_t(b, "p", (1, 2), DType.I32)),
     r"ops\.attention: q head dim 8 differs from k head dim 4"),
    (lambda b: ops.attention(b, _t(b, "q", (1, 2, 2, 8)), _t(b, "k", (1, 2, 2, 8)),
                             _t(b, "v", (1, 2, 2, 8)), q_pos=_t(b, "p", (1, 3), DType.I32)),
     r"ops\.attention: q_pos must be an integer tensor of shape \[1, 2\]"),
    (lambda b: ops.linear(b, _t(b, "x", (2, 7)), _t(b, "w", (4, 8))),
     r"ops\.linear: x .* has K=7 but w .* has K=8"),
    (lambda b: ops.apply_rope(b, _t(b, "x", (1, 2, 1, 4)), _t(b, "c", (1, 2, 4)),
                              _t(b, "s", (1, 2, 4))),
     r"ops\.apply_rope: rotary dim 8 .* exceeds head dim 4"),
    (lambda b: ops.apply_rope(b, _t(b, "x", (1, 2, 1, 4)), _t(b, "c", (1, 2, 2)),
                              _t(b, "s", (1, 2, 2)), "sideways"),
     r"ops\.apply_rope: layout must be"),
    (lambda b: ops.topk_routing(b, _t(b, "l", (3, 4)), 5, True),
     r"ops\.topk_mask: k=5 must be in \[1, E=4\]"),
    (lambda b: ops.topk_routing(b, _t(b, "l", (3, 8)), 3, True, groups=4, topk_groups=1),
     r"ops\.topk_routing: topk_groups=1 of 4 groups leave fewer than k=3"),
    (lambda b: ops.topk_routing(b, _t(b, "l", (3, 8)), 2, True, groups=3),
     r"ops\.topk_routing: groups=3 must divide the 8 experts"),
    (lambda b: ops.topk_routing(b, _t(b, "l", (3, 8)), 2, True, bias=_t(b, "c", (4,))),
     r"ops\.topk_routing: bias must be \[8\]"),
    (lambda b: ops.mlp_glu(b, _t(b, "x", (2, 8)), _t(b, "g", (6, 8)), _t(b, "u", (6, 8)),
                           _t(b, "d", (6, 8))),
     r"ops\.mlp_glu: w_down must be \[D, F\]"),
    (lambda b: ops.activation(b, _t(b, "x", (2,)), "swoosh"), r"unknown activation 'swoosh'"),
    (lambda b: ops.rmsnorm(b, _t(b, "x", (2, 8)), _t(b, "w", (4,)), 1e-6),
     r"ops\.rmsnorm: w must be \[8\]"),
    (lambda b: ops.embedding(b, _t(b, "t", (4, 8)), _t(b, "i", (3,))),
     r"ops\.embedding: ids must be an integer tensor"),
    (lambda b: ops.moe(b, _t(b, "x", (2, 8)), _t(b, "r", (4, 8)), _t(b, "g", (4, 6, 8)),
                       _t(b, "u", (4, 6, 8)), _t(b, "d", (4, 6, 8)), 2, True),
     r"ops\.moe: experts_down must be \[4, 8, 6\]"),
])
def test_bad_shapes_raise_builder_error(build, match):
    with pytest.raises(BuilderError, match=match):
        build(builder())


def test_rope_scaling_rejects_unknown_kind():
    with pytest.raises(BuilderError, match="unknown kind"):
        ops.RopeScaling("ntk")
    with pytest.raises(BuilderError, match="not supported"):
        ops.RopeScaling.from_hf({"rope_type": "dynamic", "factor": 2.0})


def test_compositions_emit_only_primitives_and_round_trip():
    """A graph using every composition holds only registered poot ops (and func.return),
    verifies, and round-trips through MLIR text with the same oracle results."""
    from mlir import ir

    from poot.dialects import REGISTRY, make_context
    from poot.dialects.verify import verify_module

    b = builder()
    x = _t(b, "x", (2, 3, 32))
    pos = _t(b, "pos", (2, 3), DType.I32)
    w = b.param("w", TensorType((32,), DType.F32))
    wq = b.param("wq", PackedType(Quant.Q4_1.value, (64, 32)))
    wk = b.param("wk", TensorType((32, 32), DType.BF16))
    h = ops.rmsnorm(b, x, w, 1e-6)
    q = b.reshape(ops.linear(b, h, wq), [2, 3, 4, 16])
    kk = b.reshape(ops.linear(b, h, wk), [2, 3, 2, 16])
    cos, sin = ops.rope_cos_sin(b, pos, ops.rope_inv_freq(16, 1e4, ops.RopeScaling("llama3", 8.0)))
    q = ops.apply_rope(b, q, cos, sin, "interleaved")
    kk = ops.apply_rope(b, kk, cos, sin)
    a = b.reshape(ops.attention(b, q, kk, kk, q_pos=pos, sliding_window=2, softcap=10.0),
                  [6, 64])
    r = b.param("r", TensorType((4, 64), DType.F32))
    eg = b.param("eg", TensorType((4, 8, 64), DType.F32))
    ed = b.param("ed", TensorType((4, 64, 8), DType.F32))
    y = ops.moe(b, a, r, eg, eg, ed, 2, True, act="gelu_tanh")
    y = ops.layernorm(b, y, None, None, 1e-5)
    g = b.finish({"y": y})
    names = {op.operation.name for op in g.func.regions[0].blocks[0].operations}
    assert names - {"func.return"} <= {f"poot.{n}" for n in REGISTRY}, names
    assert verify_module(g.module) == []
    inputs = {"x": randn(2, 3, 32), "pos": np.array([[0, 1, 2], [4, 5, 6]], np.int32)}
    params = {"w": randn(32), "wq": gguf_quantize(randn(64, 32), GQ.Q4_1).reshape(-1),
              "wk": randn(32, 32).astype(ml_dtypes.bfloat16), "r": randn(4, 64),
              "eg": randn(4, 8, 64, scale=0.2), "ed": randn(4, 64, 8, scale=0.2)}
    first = evaluate(g, inputs, params)["y"]
    parsed = ir.Module.parse(g.text(), make_context())
    assert verify_module(parsed) == []
    np.testing.assert_array_equal(evaluate(parsed, inputs, params)["y"], first)
    assert np.isfinite(first).all()
