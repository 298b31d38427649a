"""``poot.attention``: the fused scaled-dot-product attention the flash-attention rewrite
(:mod:`poot.passes.flash_attention`) introduces. Tracers never emit it: they spell attention
from primitives (:func:`poot.graph.ops.attention`); this op is the one definition of the fused
form, shared by the oracle (:meth:`Attention.evaluate`) and the linalg lowering
(:mod:`poot.dialects.lowering.attention`, an online-softmax loop over key blocks).

Why an op and not a composition: the point of the fused form is that the ``[M, S]`` score
matrix is never materialized, which a composition of primitives cannot express (its softmax
reduces over a materialized score tensor). It is never traced, only produced by a pass.
"""

from __future__ import annotations

import numpy as np

from poot.dialects.opdef import Attr, OpDef, register
from poot.dialects.types import DType, TensorType

#: The score a masked entry takes in the boolean-mask form (``poot.graph.ops.MASKED_SCORE``).
MASKED_SCORE = np.float32(-1e30)


def _prod(xs) -> int:
    n = 1
    for x in xs:
        n *= int(x)
    return n


@register
class Attention(OpDef):
    """``out[b.., r.., :] = sum_s p[b.., r.., s] * v[b.., s, :]`` with ``p`` a softmax over the
    ``S`` keys of the scores ``x[b.., r.., s] = softcap(scale * q[b.., r.., :] . k[b.., s, :])``.

    Operands (``nb = rank(k) - 2`` batch dims, shared by q, k, v, e.g. ``[B, Hkv]``):

    * ``q``: ``[batch..., rows..., D]``, one or more row dims (GQA: ``[B, Hkv, G, T, D]`` or
      ``[B, Hkv, G*T, D]``); ``k``: ``[batch..., S, D]``; ``v``: ``[batch..., S, Dv]``; one
      float dtype, computed in f32.
    * ``mask``: rank of ``q``, broadcastable (each dim 1 or the full size) to
      ``[batch..., rows..., S]``. Its dtype picks the masking rule:

      - ``i1`` (*visible*): ``x`` is replaced by -1e30 where not visible, ``e = exp(x - max)``
        is zeroed where not visible and ``p = e / max(sum(e), 1)``: masked keys get weight
        exactly 0 and a row with no visible key yields zeros (``poot.graph.ops.masked_softmax``).
      - ``f32`` (*additive bias*): ``p = softmax(x + mask)`` (plain softmax, max-subtracted).
        A splat zero bias of shape ``[1, ..., 1]`` is "no mask".

    Attributes: ``scale`` (f64), ``softcap`` (f64; 0 = none, else
    ``x = softcap * tanh(x / softcap)`` after scaling, before masking).
    Result: f32 ``[batch..., rows..., Dv]``.

    Numerics (the oracle below): the same f32 operations in the same order as the composition
    the rewrite replaces (``(q.k) * f32(scale)``, ``tanh(x * f32(1/c)) * f32(c)``, max and sum
    reduced in f64 and rounded to f32, as ``poot.reduce``), so the rewritten graph matches the
    original to rounding of the matmul summation order.
    """

    name = "attention"
    operands = ("q", "k", "v", "mask")
    attrs = {"scale": Attr("f64", doc="score scale"),
             "softcap": Attr("f64", doc="tanh soft cap; 0 = none")}
    summary = "fused attention softmax(softcap(scale q.k^T) (+|masked) mask) v (pass-introduced)"

    @classmethod
    def check(cls, operands, attrs, result):
        cls.check_attrs(attrs)
        if len(operands) != 4:
            cls.fail(f"expects 4 operands (q, k, v, mask), got {len(operands)}")
        q, k, v, m = (cls.tensor(t, n) for t, n in zip(operands, cls.operands))
        if k.rank < 2:
            cls.fail(f"k must be [batch..., S, D], got {k}")
        nb = k.rank - 2
        if q.rank < k.rank or v.rank != k.rank:
            cls.fail(f"rank mismatch: q {q} needs rank >= {k.rank} (batch, rows, D) and v {v} "
                     f"rank {k.rank}")
        batch = k.shape[:nb]
        if q.shape[:nb] != batch or v.shape[:nb] != batch:
            cls.fail(f"batch dims differ: q {q}, k {k}, v {v} (batch = first {nb} dims)")
        s, d = k.shape[-2], k.shape[-1]
        if q.shape[-1] != d:
            cls.fail(f"head dims differ: q D={q.shape[-1]}, k D={d}")
        if v.shape[-2] != s:
            cls.fail(f"v has {v.shape[-2]} keys, k has {s}")
        for t in (q, k, v):
            if not t.dtype.is_float or t.dtype != q.dtype:
                cls.fail(f"q, k, v need one float dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
        full = q.shape[:-1] + (s,)
        if m.rank != q.rank or any(a not in (1, b) for a, b in zip(m.shape, full)):
            cls.fail(f"mask {m} does not broadcast to the scores {list(full)}")
        if m.dtype not in (DType.I1, DType.F32):
            cls.fail(f"mask must be i1 (visible) or f32 (additive bias), got {m.dtype}")
        if not np.isfinite(attrs["scale"]):
            cls.fail(f"scale must be finite, got {attrs['scale']}")
        if not (attrs["softcap"] >= 0 and np.isfinite(attrs["softcap"])):
            cls.fail(f"softcap must be >= 0 (0 = none), got {attrs['softcap']}")
        out = TensorType(q.shape[:-1] + (v.shape[-1],), DType.F32)
        return cls.same_result(out, result)

    @classmethod
    def evaluate(cls, args, attrs, result):
        q, k, v, mask = args
        nb = k.ndim - 2
        batch, rows = k.shape[:nb], q.shape[nb:-1]
        m, s, d = _prod(rows), k.shape[-2], k.shape[-1]
        f32 = np.float32
        qf = q.astype(f32).reshape(batch + (m, d))
        x = np.matmul(qf, np.swapaxes(k.astype(f32), -1, -2)).reshape(batch + rows + (s,))
        with np.errstate(all="ignore"):
            if attrs["scale"] != 1.0:
                x = x * f32(attrs["scale"])
            c = attrs["softcap"]
            if c:
                x = np.tanh(x * f32(1.0 / c)) * f32(c)
            mask = np.broadcast_to(mask, x.shape)
            if mask.dtype == np.bool_:
                xm = np.where(mask, x, MASKED_SCORE).astype(f32)
                e = np.exp(xm - xm.max(axis=-1, keepdims=True))
                e = np.where(mask, e, f32(0)).astype(f32)
                den = np.sum(e.astype(np.float64), axis=-1, keepdims=True).astype(f32)
                p = e / np.maximum(den, f32(1))
            else:
                y = x + mask.astype(f32)
                e = np.exp(y - y.max(axis=-1, keepdims=True))
                p = e / np.sum(e.astype(np.float64), axis=-1, keepdims=True).astype(f32)
        out = np.matmul(p.astype(f32).reshape(batch + (m, s)), v.astype(f32))
        return out.reshape(result.shape).astype(np.float32)
