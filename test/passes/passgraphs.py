"""Graphs for the pass tests, spelled with Builder primitives only (no compositions), so that
the tests do not depend on how poot.graph.ops spells them."""

from __future__ import annotations

import numpy as np

from poot.dialects.quant import BY_NAME
from poot.dialects.types import DType, PackedType, TensorType
from poot.graph.builder import Builder, TraceLimits

LIMITS = TraceLimits(max_values=20000, max_ops=20000, max_literal_bytes=1 << 20,
                     max_owned_bytes=1 << 28)
F32 = DType.F32


def builder() -> Builder:
    return Builder(LIMITS)


def rmsnorm(b, x, w, eps=1e-6):
    """x * rsqrt(mean(x^2) + eps) * w over the last axis."""
    n = x.shape[-1]
    ms = b.reduce("sum", x * x, -1, keepdims=True) / float(n)
    return x * b.unary("rsqrt", ms + eps) * w


def softmax(b, x):
    """exp(x - max) / sum(exp(x - max)) over the last axis."""
    m = b.reduce("max", x, -1, keepdims=True)
    e = b.unary("exp", x - m)
    return e / b.reduce("sum", e, -1, keepdims=True)


def linear(b, x, w):
    """x[..., K] @ w[N, K]^T (dense or dequantized packed w)."""
    if isinstance(w.type, PackedType):
        w = b.dequantize(w)
    lead = x.shape[:-1]
    x2 = b.reshape(x, [-1, x.shape[-1]])
    y = b.matmul(x2, b.transpose(w, [1, 0]))
    return b.reshape(y, list(lead) + [w.shape[0]])


def silu(b, x):
    return x / (b.unary("exp", -x) + 1.0)


def q8_0_bytes(shape, rng) -> np.ndarray:
    """Random q8_0 blocks with a small finite f16 scale."""
    n = int(np.prod(shape)) // 32
    blocks = np.zeros((n, 34), np.uint8)
    blocks[:, 0:2] = np.frombuffer(np.full(n, 0.02, np.float16).tobytes(),
                                   np.uint8).reshape(n, 2)
    blocks[:, 2:] = rng.integers(0, 256, size=(n, 32), dtype=np.uint8)
    return blocks.reshape(-1)


def transformer_block(T=4, D=32, H=2, F=64, S=8, layers=1):
    """One decoder layer of a small llama-like model plus the embedding lookup, a KV-cache
    write (scatter) and the LM head. Returns (graph, inputs, params)."""
    rng = np.random.default_rng(0)
    hd = D // H
    V = 16
    b = builder()
    ids = b.input("ids", TensorType((T,), DType.I32))
    pos = b.input("pos", TensorType((T, 1), DType.I32))
    cache = b.input("k_cache", TensorType((S, D), F32))
    params = {}

    def param(name, shape, packed=False):
        if layers == 1 and name[:2] == "0.":
            name = name[2:]
        if packed:
            t = PackedType(BY_NAME["q8_0"], shape)
            params[name] = q8_0_bytes(shape, rng)
        else:
            t = TensorType(shape, F32)
            params[name] = (rng.standard_normal(shape) * 0.2).astype(np.float32)
        return b.param(name, t)

    emb = param("emb", (V, D))
    x = b.gather(emb, ids)                                        # [T, D]
    new_cache = cache
    for layer in range(layers):
        h = rmsnorm(b, x, param(f"{layer}.attn_norm", (D,)))
        q = linear(b, h, param(f"{layer}.wq", (D, D), packed=True))
        k = linear(b, h, param(f"{layer}.wk", (D, D)))
        v = linear(b, h, param(f"{layer}.wv", (D, D)))
        new_cache = b.scatter(new_cache, pos, k)                           # KV write
        qh = b.transpose(b.reshape(q, [T, H, hd]), [1, 0, 2])          # [H, T, hd]
        kh = b.transpose(b.reshape(k, [T, H, hd]), [1, 2, 0])          # [H, hd, T]
        vh = b.transpose(b.reshape(v, [T, H, hd]), [1, 0, 2])
        scores = b.matmul(qh, kh) * (1.0 / np.sqrt(hd))                # [H, T, T]
        causal = b.compare("le", b.iota((T, T), 1), b.iota((T, T), 0))
        mask = b.select(causal, b.full((T, T), 0.0), b.full((T, T), -1e30))
        p = softmax(b, scores + mask)
        o = b.reshape(b.transpose(b.matmul(p, vh), [1, 0, 2]), [T, D])
        x = x + linear(b, o, param(f"{layer}.wo", (D, D)))
        h = rmsnorm(b, x, param(f"{layer}.ffn_norm", (D,)))
        gate = linear(b, h, param(f"{layer}.w_gate", (F, D), packed=True))
        up = linear(b, h, param(f"{layer}.w_up", (F, D)))
        x = x + linear(b, silu(b, gate) * up, param(f"{layer}.w_down", (D, F)))
    logits = linear(b, rmsnorm(b, x, param("out_norm", (D,))), param("lm_head", (V, D)))
    g = b.finish({"logits": logits, "k_cache": new_cache})
    inputs = {"ids": rng.integers(0, V, size=(T,)).astype(np.int32),
              "pos": np.arange(T, dtype=np.int32).reshape(T, 1) + 2,
              "k_cache": rng.standard_normal((S, D)).astype(np.float32)}
    return g, inputs, params
