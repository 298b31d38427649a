"""Shape ops: broadcast, reshape, transpose, slice, concat.

All but concat and broadcast are views of their operand (a lowering may alias storage);
concat and broadcast may also be folded into their consumers' indexing.
"""

from __future__ import annotations

import numpy as np

from poot.dialects.opdef import Attr, OpDef, register
from poot.dialects.types import TensorType


@register
class Broadcast(OpDef):
    """``result[...] = x[...]`` where operand dim ``i`` maps to result dim ``dims[i]`` and has
    size 1 (stretched) or the result's size; other result dims are new (XLA broadcast_in_dim)."""

    name = "broadcast"
    operands = ("x",)
    attrs = {"dims": Attr("i64s")}
    summary = "broadcast_in_dim: operand dim i -> result dim dims[i]"

    @classmethod
    def check(cls, operands, attrs, result):
        cls.check_attrs(attrs)
        x = cls.tensor(operands[0], "operand")
        r = cls.need_result(result)
        dims = attrs["dims"]
        if len(dims) != x.rank:
            cls.fail(f"rank mismatch: 'dims' has {len(dims)} entries for an operand of rank "
                     f"{x.rank}")
        if list(dims) != sorted(set(dims)):
            cls.fail(f"dims {list(dims)} must be strictly increasing")
        for i, d in enumerate(dims):
            cls.axis(d, r.rank, "dims entry")
            if x.shape[i] not in (1, r.shape[d]):
                cls.fail(f"operand dim {i} of size {x.shape[i]} cannot broadcast to result "
                         f"dim {d} of size {r.shape[d]}")
        if r.dtype != x.dtype:
            cls.fail(f"result dtype {r.dtype} differs from operand dtype {x.dtype}")
        return r

    @classmethod
    def evaluate(cls, args, attrs, result):
        shape = [1] * result.rank
        for i, d in enumerate(attrs["dims"]):
            shape[d] = args[0].shape[i]
        return np.broadcast_to(args[0].reshape(shape), result.shape)


@register
class Reshape(OpDef):
    name = "reshape"
    operands = ("x",)
    summary = "row-major reshape to the result type's shape"

    @classmethod
    def check(cls, operands, attrs, result):
        cls.check_attrs(attrs)
        x = cls.tensor(operands[0], "operand")
        r = cls.need_result(result)
        if r.numel != x.numel or r.dtype != x.dtype:
            cls.fail(f"cannot reshape {x} to {r}")
        return r

    @classmethod
    def evaluate(cls, args, attrs, result):
        return args[0].reshape(result.shape)


@register
class Transpose(OpDef):
    name = "transpose"
    operands = ("x",)
    attrs = {"perm": Attr("i64s")}
    summary = "result dim i = operand dim perm[i]"

    @classmethod
    def check(cls, operands, attrs, result):
        cls.check_attrs(attrs)
        x = cls.tensor(operands[0], "operand")
        perm = attrs["perm"]
        if sorted(perm) != list(range(x.rank)):
            cls.fail(f"perm {list(perm)} is not a permutation of rank {x.rank}")
        return cls.same_result(x.with_shape(x.shape[p] for p in perm), result)

    @classmethod
    def evaluate(cls, args, attrs, result):
        return np.transpose(args[0], attrs["perm"])


@register
class Slice(OpDef):
    """Static strided slice: dim i takes ``start[i]:limit[i]:stride[i]``."""

    name = "slice"
    operands = ("x",)
    attrs = {"start": Attr("i64s"), "limit": Attr("i64s"), "stride": Attr("i64s")}
    summary = "static strided slice"

    @classmethod
    def check(cls, operands, attrs, result):
        cls.check_attrs(attrs)
        x = cls.tensor(operands[0], "operand")
        st, li, sd = attrs["start"], attrs["limit"], attrs["stride"]
        if not len(st) == len(li) == len(sd) == x.rank:
            cls.fail(f"rank mismatch: start/limit/stride have {len(st)}/{len(li)}/{len(sd)} "
                     f"entries for an operand of rank {x.rank}")
        shape = []
        for i, (a, b, s) in enumerate(zip(st, li, sd)):
            if s < 1 or not 0 <= a <= b <= x.shape[i]:
                cls.fail(f"dim {i}: slice {a}:{b}:{s} is invalid for size {x.shape[i]}")
            shape.append((b - a + s - 1) // s)
        return cls.same_result(x.with_shape(shape), result)

    @classmethod
    def evaluate(cls, args, attrs, result):
        idx = tuple(slice(a, b, s) for a, b, s in
                    zip(attrs["start"], attrs["limit"], attrs["stride"]))
        return args[0][idx]


@register
class Concat(OpDef):
    """Two tensors joined along ``axis``. Binary because IRDL binds one type to all operands
    of a variadic slot (MLIR 22), so operands of different sizes could not verify; the
    builder chains concatenations of more than two."""

    name = "concat"
    operands = ("lhs", "rhs")
    attrs = {"axis": Attr("i64")}
    summary = "concatenation of two tensors along an axis"

    @classmethod
    def check(cls, operands, attrs, result):
        cls.check_attrs(attrs)
        if len(operands) != 2:
            cls.fail(f"expects 2 operands, got {len(operands)}")
        a, b = (cls.tensor(t, f"operand #{i}") for i, t in enumerate(operands))
        ax = cls.axis(attrs["axis"], a.rank)
        others = lambda t: [d for j, d in enumerate(t.shape) if j != ax]  # noqa: E731
        if b.dtype != a.dtype or b.rank != a.rank or others(b) != others(a):
            cls.fail(f"operand #1 type {b} is not concatenable with {a} on axis {ax}")
        shape = list(a.shape)
        shape[ax] += b.shape[ax]
        return cls.same_result(TensorType(shape, a.dtype), result)

    @classmethod
    def evaluate(cls, args, attrs, result):
        return np.concatenate(args, axis=attrs["axis"])
