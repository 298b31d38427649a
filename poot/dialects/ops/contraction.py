"""Batched matmul with a stated accumulation type."""

from __future__ import annotations

import numpy as np

from poot.dialects.opdef import Attr, OpDef, register
from poot.dialects.types import DType, TensorType


@register
class Matmul(OpDef):
    """``result[..., m, n] = sum_k lhs[..., m, k] * rhs[..., k, n]``.

    Operands have equal rank >= 2, equal batch dims and equal dtype. ``acc`` is the
    accumulation type: f32 for float operands, i32 for i8 operands; lowerings accumulate in at
    least that type. The result dtype is any float for float operands, i32 for i8.
    """

    name = "matmul"
    operands = ("lhs", "rhs")
    attrs = {"acc": Attr("type")}
    summary = "batched matmul [..., M, K] x [..., K, N] with accumulation type"

    @classmethod
    def check(cls, operands, attrs, result):
        cls.check_attrs(attrs)
        a = cls.tensor(operands[0], "lhs")
        b = cls.tensor(operands[1], "rhs")
        if a.rank < 2 or a.rank != b.rank:
            cls.fail(f"rank mismatch: lhs {a} and rhs {b} need equal rank >= 2")
        if a.shape[:-2] != b.shape[:-2]:
            cls.fail(f"batch dims {list(a.shape[:-2])} and {list(b.shape[:-2])} differ")
        if a.shape[-1] != b.shape[-2]:
            cls.fail(f"contraction dims differ: lhs K={a.shape[-1]}, rhs K={b.shape[-2]}")
        if a.dtype != b.dtype:
            cls.fail(f"operand dtypes differ: {a.dtype} and {b.dtype}")
        acc = attrs["acc"]
        if a.dtype.is_float and acc is not DType.F32:
            cls.fail(f"float operands need acc = f32, got {acc}")
        if a.dtype.is_int and (a.dtype is not DType.I8 or acc is not DType.I32):
            cls.fail(f"integer matmul takes i8 operands with acc = i32, got {a.dtype}/{acc}")
        if a.dtype.is_bool:
            cls.fail("does not admit dtype i1")
        shape = a.shape[:-1] + (b.shape[-1],)
        default = TensorType(shape, DType.F32 if a.dtype.is_float else DType.I32)
        if result is None:
            return default
        r = cls.tensor(result, "result")
        ok_dtype = r.dtype.is_float if a.dtype.is_float else r.dtype is DType.I32
        if r.shape != shape or not ok_dtype:
            cls.fail(f"result type {r} does not match {default.with_shape(shape)}")
        return r

    @classmethod
    def evaluate(cls, args, attrs, result):
        a, b = args
        acc = np.float32 if attrs["acc"] is DType.F32 else np.int64
        out = np.matmul(a.astype(acc), b.astype(acc))
        return out.astype(result.dtype.numpy)


@register
class IndexedMatmul(OpDef):
    """``result[t, o] = sum_k x[t, k] * w[clamp(idx[t]), o, k]``: each row of ``x`` against
    the ``[O, K]`` slab of ``w`` its index selects (a mixture-of-experts layer's selected
    experts, stored ``[E, O, K]`` as linear layers store ``[out, in]``).

    Operands: ``x`` float ``[T, K]``; ``w`` float ``[E, O, K]`` (dense, or a dequantized /
    widened weight that lowerings read in place); ``idx`` integer ``[T]``, clamped to
    ``[0, E-1]`` as ``poot.gather`` clamps, so no lowering reads outside ``w``. ``acc`` is
    f32. Result f32 ``[T, O]``. Only the selected slabs are read: the cost scales with T,
    not with E (the dense equivalent, every expert on every row, costs E slabs a row).
    """

    name = "indexed_matmul"
    operands = ("x", "w", "idx")
    attrs = {"acc": Attr("type")}
    summary = "rows of x times the [O, K] slab of w [E, O, K] each row's index selects"

    @classmethod
    def check(cls, operands, attrs, result):
        cls.check_attrs(attrs)
        x = cls.tensor(operands[0], "x")
        w = cls.tensor(operands[1], "w")
        i = cls.tensor(operands[2], "idx")
        if x.rank != 2 or w.rank != 3 or i.rank != 1:
            cls.fail(f"needs x [T, K], w [E, O, K] and idx [T], got {x}, {w}, {i}")
        if not (x.dtype.is_float and w.dtype.is_float):
            cls.fail(f"x and w must be float, got {x.dtype} and {w.dtype}")
        if not i.dtype.is_int or i.dtype.is_bool:
            cls.fail(f"idx must have an integer dtype, got {i.dtype}")
        if w.shape[2] != x.shape[1]:
            cls.fail(f"contraction dims differ: x K={x.shape[1]}, w K={w.shape[2]}")
        if i.shape[0] != x.shape[0]:
            cls.fail(f"idx has {i.shape[0]} rows, x has {x.shape[0]}")
        if w.shape[0] < 1:
            cls.fail("w has no slabs (E = 0)")
        if attrs["acc"] is not DType.F32:
            cls.fail(f"needs acc = f32, got {attrs['acc']}")
        return cls.same_result(TensorType((x.shape[0], w.shape[1]), DType.F32), result)

    @classmethod
    def evaluate(cls, args, attrs, result):
        x, w, idx = args
        sel = np.clip(idx.astype(np.int64), 0, w.shape[0] - 1)
        ws = w[sel].astype(np.float32)                                   # [T, O, K]
        return np.matmul(ws, x.astype(np.float32)[:, :, None])[:, :, 0].astype(np.float32)
