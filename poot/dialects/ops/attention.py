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

from poot.dialects.kv_quant import FP8, Q8_0, dequantize_fp8, dequantize_q8_0, encode_fp8
from poot.dialects.opdef import Attr, OpDef, register
from poot.dialects.types import DType, TensorType

#: The score a masked entry takes in the boolean-mask form (``poot.graph.ops.MASKED_SCORE``).
MASKED_SCORE = np.float32(-1e30)
#: The attributes of both attention ops: how raw scores are scaled and soft-capped.
SCORE_ATTRS = {"scale": Attr("f64", doc="score scale"),
               "softcap": Attr("f64", doc="tanh soft cap; 0 = none")}


def _check_mask_and_score_attrs(cls, m: TensorType, scores: tuple[int, ...], attrs) -> None:
    """Both attention ops: the mask ``m`` broadcasts to the ``scores`` shape and is i1 or
    f32; ``scale`` is finite, ``softcap`` finite and >= 0 (``cls.fail`` otherwise)."""
    if m.rank != len(scores) or any(a not in (1, b) for a, b in zip(m.shape, scores)):
        cls.fail(f"mask {m} does not broadcast to the scores {list(scores)}")
    if m.dtype not in (DType.I1, DType.F32):
        cls.fail(f"mask must be i1 (visible) or f32 (additive bias), got {m.dtype}")
    if not np.isfinite(attrs["scale"]):
        cls.fail(f"scale must be finite, got {attrs['scale']}")
    if not (attrs["softcap"] >= 0 and np.isfinite(attrs["softcap"])):
        cls.fail(f"softcap must be >= 0 (0 = none), got {attrs['softcap']}")


def _prod(xs) -> int:
    n = 1
    for x in xs:
        n *= int(x)
    return n


def _probabilities(x: np.ndarray, mask: np.ndarray, attrs, neg_inf_bias_masks: bool = False
                   ) -> np.ndarray:
    """The attention weights of scores ``x`` f32 ``[..., S]`` (:class:`Attention`'s rule):
    scaled, soft-capped, then the ``i1`` visible mask (masked scores -1e30, masked weights 0,
    denominator ``max(sum, 1)``) or the f32 additive bias (plain softmax); with
    ``neg_inf_bias_masks`` a ``-inf`` bias gives ``-inf`` whatever the score (the paged op's
    refinement). Max and sum are reduced in f64 and rounded to f32, as ``poot.reduce``."""
    f32 = np.float32
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
        return e / np.maximum(den, f32(1))
    bias = mask.astype(f32)
    y = x + bias
    if neg_inf_bias_masks:
        y = np.where(bias == -np.inf, f32(-np.inf), y).astype(f32)
    e = np.exp(y - y.max(axis=-1, keepdims=True))
    return e / np.sum(e.astype(np.float64), axis=-1, keepdims=True).astype(f32)


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
    attrs = SCORE_ATTRS
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
        _check_mask_and_score_attrs(cls, m, full, attrs)
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
            p = _probabilities(x, mask, attrs)
        out = np.matmul(p.astype(f32).reshape(batch + (m, s)), v.astype(f32))
        return out.reshape(result.shape).astype(np.float32)


def _visible_products(p: np.ndarray, v: np.ndarray) -> np.ndarray:
    """``sum_s p[..., r, s] v[..., s, e]`` where a zero weight contributes nothing even when
    its value is not finite (``p [..., R, S]``, ``v [..., S, E]``, f32)."""
    if np.isfinite(v).all():
        return np.matmul(p, v)
    safe = np.where(np.isfinite(v), v, np.float32(0))
    out = np.matmul(p, safe)
    # a positive weight on a non-finite value keeps IEEE semantics (inf/NaN propagate)
    bad = ~np.isfinite(v)
    hit = np.matmul((p > 0).astype(np.float32), bad.astype(np.float32)) > 0
    if hit.any():
        full = np.einsum("...rs,...se->...rse", p, v).sum(axis=-2)
        out = np.where(hit, full, out)
    return out.astype(np.float32)


@register
class PagedAttention(OpDef):
    """Attention over a paged KV cache: :class:`Attention` whose keys and values are read
    through a block table from block pools, never gathered into a tensor.

    Operands (``B`` sequences, ``H`` KV heads, ``W`` table entries, ``bs`` positions a block):

    * ``q``: ``[B, H, rows..., D]`` float (GQA: the query heads of KV head h are rows);
    * ``k_pool``: ``[NB, bs, H, D]``, ``v_pool``: ``[NB, bs, H, Dv]``: the KV cache's storage,
      each float (f32, f16, bf16) or ``i8``, the values plane of ``q8_0``
      (:mod:`poot.dialects.kv_quant`); two float pools share one dtype, a q8_0 pool goes
      with any;
    * ``block_table``: integer ``[B, W]``; key ``j`` of sequence ``b`` is
      ``pool[block_table[b, j // bs], j % bs, h]`` (table entries clamped into ``[0, NB)``),
      so the key axis has ``S = W * bs`` entries and key j is position j;
    * ``mask``: rank of ``q``, broadcastable to ``[B, H, rows..., S]``, ``i1`` (visible) or
      ``f32`` (additive bias) exactly as :class:`Attention`;
    * ``scales`` (variadic): one f16 ``[NB, bs, H, D / 32]`` per ``i8`` pool, k's first: the
      q8_0 scales, so a q8_0 pool's stored value ``(n, o, h, c)`` reads as
      ``f32(pool[n, o, h, c]) * f32(scale[n, o, h, c // 32])`` (GGUF's Q8_0 numerics; values
      and scales are two planes indexed alike, :mod:`poot.dialects.kv_quant`). The lowerings
      dequantize each block where they load it, never the whole pool. An ``i8`` pool whose
      scales are f32 ``[NB, bs, H, 1]`` is fp8 instead: e4m3fn bit patterns read as
      ``e4m3fn(pool[n, o, h, c]) * scale[n, o, h, 0]`` (one scale per head vector).

    Attributes and numerics: as :class:`Attention` on ``k[b, h, j] = k_pool[table[b, j // bs],
    j % bs, h]`` (likewise v; a q8_0 pool dequantized as above) computed in f32, with one
    refinement: a masked key (``i1``
    false, or a ``-inf`` bias) contributes nothing even when its stored key or value is not
    finite (its score is the mask's, never ``NaN``, and ``0 * inf`` is not added). A block
    freed by one sequence and reused by another may hold anything past the new sequence's
    positions; masked keys never leak into the output. The composition the flash-attention
    rewrite replaces (gather through the table, then attention) gives the same result
    whenever masked keys hold finite values.
    Result: f32 ``[B, H, rows..., Dv]``.

    Why an op: as for :class:`Attention` (no materialized scores), and in addition no
    ``[B, S, H, D]`` copy of each sequence's keys is made: the lowerings read the pools in
    place through the table (vLLM's PagedAttention, Kwon et al. 2023, "Efficient Memory
    Management for Large Language Model Serving with PagedAttention").
    """

    name = "paged_attention"
    operands = ("q", "k_pool", "v_pool", "block_table", "mask", "*scales")
    attrs = SCORE_ATTRS
    summary = "attention reading K/V through a block table from paged pools (pass-introduced)"

    @classmethod
    def check(cls, operands, attrs, result):
        cls.check_attrs(attrs)
        if len(operands) < 5:
            cls.fail(f"expects operands (q, k_pool, v_pool, block_table, mask, scales...), "
                     f"got {len(operands)}")
        q, kp, vp, bt, m = (cls.tensor(t, n) for t, n in zip(operands[:5], cls.operands))
        if kp.rank != 4 or vp.rank != 4:
            cls.fail(f"pools must be [NB, bs, H, D], got k_pool {kp}, v_pool {vp}")
        nb, bs, h, d = kp.shape
        if vp.shape[:3] != (nb, bs, h):
            cls.fail(f"v_pool {vp} must share k_pool's [NB, bs, H] = {[nb, bs, h]}")
        if kp.dtype.is_float and vp.dtype.is_float and vp.dtype != kp.dtype:
            cls.fail(f"pools need one float dtype, got {kp.dtype}, {vp.dtype}")
        cls.scale_types(operands)
        if bt.rank != 2 or not bt.dtype.is_int:
            cls.fail(f"block_table must be an integer [B, W], got {bt}")
        bsz, w = bt.shape
        if q.rank < 4 or q.shape[:2] != (bsz, h) or q.shape[-1] != d:
            cls.fail(f"q must be [B, H, rows..., D] = [{bsz}, {h}, ..., {d}], got {q}")
        if not q.dtype.is_float:
            cls.fail(f"q must be float, got {q.dtype}")
        full = q.shape[:-1] + (w * bs,)
        _check_mask_and_score_attrs(cls, m, full, attrs)
        return cls.same_result(TensorType(q.shape[:-1] + (vp.shape[-1],), DType.F32), result)

    @classmethod
    def scale_types(cls, operands) -> list[TensorType | None]:
        """The scales type of k_pool and v_pool (None: a float pool), checked against the
        pools (``cls.fail`` on a pool neither float nor i8, or a missing, extra or misshapen
        scale)."""
        pools, scales = operands[1:3], [cls.tensor(t, "scale") for t in operands[5:]]
        out = []
        for name, p in zip(("k_pool", "v_pool"), pools):
            if p.dtype.is_float:
                out.append(None)
                continue
            if p.dtype is not DType.I8:
                cls.fail(f"{name} must be float or i8 (q8_0 or fp8 values), got {p.dtype}")
            if not scales:
                cls.fail(f"{name} is i8 (q8_0 or fp8) but has no scales operand")
            st = scales.pop(0)
            try:
                want = (FP8 if st.dtype is DType.F32 else Q8_0).planes(p.shape)[1]
            except ValueError as e:
                cls.fail(f"{name}: {e}")
            if st != want:
                cls.fail(f"{name}'s scales must be {want}, got {st}")
            out.append(st)
        if scales:
            cls.fail(f"{len(scales)} scales operand(s) with no i8 pool")
        return out

    @staticmethod
    def gather_keys(pool: np.ndarray, table: np.ndarray) -> np.ndarray:
        """``[B, H, W * bs, D]`` f32: the keys (or values) of each sequence in position
        order, read through ``table`` (clamped) from ``pool [NB, bs, H, D]``."""
        nb, bs, h, d = pool.shape
        bsz, w = table.shape
        g = np.take(pool, np.clip(table, 0, nb - 1), axis=0)       # [B, W, bs, H, D]
        return np.ascontiguousarray(
            g.reshape(bsz, w * bs, h, d).transpose(0, 2, 1, 3)).astype(np.float32)

    @classmethod
    def evaluate(cls, args, attrs, result):
        q, kp, vp, table, mask, *scales = args
        kv = []
        for pool in (kp, vp):
            x = cls.gather_keys(pool, table)
            if pool.dtype == np.int8:
                st = scales.pop(0)          # f32: fp8's per-head scales; f16: q8_0's
                deq = dequantize_fp8 if st.dtype == np.float32 else dequantize_q8_0
                x = deq(x.astype(np.int8), cls.gather_keys(st, table))
            kv.append(x)
        k, v = kv
        bsz, h = k.shape[:2]
        rows = q.shape[2:-1]
        m, s = _prod(rows), k.shape[-2]
        f32 = np.float32
        qf = q.astype(f32).reshape(bsz, h, m, q.shape[-1])
        with np.errstate(all="ignore"):
            x = np.matmul(qf, np.swapaxes(k, -1, -2)).reshape((bsz, h) + rows + (s,))
            p = _probabilities(x, mask, attrs, neg_inf_bias_masks=True)
            out = _visible_products(p.astype(f32).reshape(bsz, h, m, s), v)
        return out.reshape(result.shape).astype(np.float32)


class _KvPlanes(OpDef):
    """Shared check of the KV quantization ops: operand 0 a ``[..., D]`` plane of
    :attr:`plane_dtype`, operand 1 its scales plane as :attr:`fmt` lays it out
    (:meth:`~poot.dialects.kv_quant.KvQuant.planes`); the result ``[..., D]`` of
    :attr:`result_dtype`."""

    fmt = Q8_0
    plane_dtype = DType.I8
    result_dtype = DType.F32

    @classmethod
    def check(cls, operands, attrs, result):
        cls.check_attrs(attrs)
        a, b = cls.operands
        if len(operands) != 2:
            cls.fail(f"expects 2 operands ({a}, {b}), got {len(operands)}")
        v, s = (cls.tensor(t, n) for t, n in zip(operands, cls.operands))
        if v.dtype is not cls.plane_dtype or v.rank < 1:
            cls.fail(f"{a} must be {cls.plane_dtype.value} [..., D], got {v}")
        try:
            want = cls.fmt.planes(v.shape)[1]
        except ValueError as e:
            cls.fail(str(e))
        if s != want:
            cls.fail(f"{b} must be {want}, got {s}")
        return cls.same_result(TensorType(v.shape, cls.result_dtype), result)


@register
class DequantizeQ8_0(_KvPlanes):
    """``out[..., c] = f32(values[..., c]) * f32(scales[..., c // 32])``: q8_0 KV values
    (:mod:`poot.dialects.kv_quant`) read as f32.

    Operands: ``values`` i8 ``[..., D]`` (D a multiple of 32), ``scales`` f16 ``[..., D / 32]``
    (the same leading dims). Result: f32 ``[..., D]``.

    Why an op: the tracer reads a q8_0 KV pool through it after gathering the sequence's
    blocks (:func:`poot.models.blocks.cached_kv`), and the flash-attention rewrite folds it
    into ``poot.paged_attention``, which dequantizes each block where it loads it. A
    composition (cast, reshape, broadcast multiply) would spell the same numbers but not the
    pairing of a values plane with its scales plane that the rewrite must find.
    """

    name = "dequantize_q8_0"
    operands = ("values", "scales")
    summary = "q8_0 KV values (i8) times their per-32 f16 scales, as f32"

    @classmethod
    def evaluate(cls, args, attrs, result):
        return dequantize_q8_0(args[0], args[1])


@register
class QuantizeFp8(_KvPlanes):
    """``out[..., c] = e4m3fn(sat(x[..., c] / s[..., 0]))`` as its bit pattern (0 where
    ``s == 0``): a head vector's fp8 KV values (:mod:`poot.dialects.kv_quant`), rounded to
    nearest even and saturated to +-448.

    Operands: ``x`` f32 ``[..., D]``, ``s`` f32 ``[..., 1]`` (the same leading dims; the
    tracer's ``amax / 448``). Result: i8 ``[..., D]``.

    Why an op: no poot dtype is e4m3, and the rounding is one instruction where the device
    has it (PTX ``cvt.rn.satfinite.e4m3x2.f32``, sm_89+), a dozen integer ops otherwise.
    """

    name = "quantize_fp8"
    operands = ("x", "s")
    summary = "f32 values over their per-head scale as e4m3fn bit patterns (i8)"

    fmt, plane_dtype, result_dtype = FP8, DType.F32, DType.I8

    @classmethod
    def evaluate(cls, args, attrs, result):
        return encode_fp8(args[0], args[1])


@register
class DequantizeFp8(_KvPlanes):
    """``out[..., c] = e4m3fn(values[..., c]) * scales[..., 0]``: fp8 KV values
    (:mod:`poot.dialects.kv_quant`, e4m3fn bit patterns in i8) read as f32.

    Operands: ``values`` i8 ``[..., D]``, ``scales`` f32 ``[..., 1]``. Result: f32
    ``[..., D]``. Why an op: as :class:`DequantizeQ8_0` (the flash-attention rewrite folds it
    into ``poot.paged_attention``, which decodes each value where it loads it).
    """

    name = "dequantize_fp8"
    operands = ("values", "scales")
    summary = "fp8 KV values (e4m3fn bits in i8) times their per-head f32 scale, as f32"

    fmt = FP8

    @classmethod
    def evaluate(cls, args, attrs, result):
        return dequantize_fp8(np.asarray(args[0]).astype(np.int8), args[1])
