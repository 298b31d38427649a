"""Data-dependent indexing: gather (embedding lookups, KV reads) and scatter (KV writes)."""

from __future__ import annotations

import numpy as np

from poot.dialects.opdef import Attr, OpDef, register
from poot.dialects.types import TensorType


@register
class Gather(OpDef):
    """``result[p..., i..., s...] = table[p..., clamp(idx[i...]), s...]`` along ``axis``.

    Result shape: ``table.shape[:axis] + idx.shape + table.shape[axis+1:]``. Indices are
    clamped to ``[0, table.shape[axis]-1]``, so no lowering ever reads out of bounds.
    """

    name = "gather"
    operands = ("table", "indices")
    attrs = {"axis": Attr("i64")}
    summary = "take slices of a table by integer indices (clamped)"

    @classmethod
    def check(cls, operands, attrs, result):
        cls.check_attrs(attrs)
        t = cls.tensor(operands[0], "table")
        i = cls.tensor(operands[1], "indices")
        if not i.dtype.is_int:
            cls.fail(f"indices must have an integer dtype, got {i.dtype}")
        ax = cls.axis(attrs["axis"], t.rank)
        shape = t.shape[:ax] + i.shape + t.shape[ax + 1:]
        return cls.same_result(TensorType(shape, t.dtype), result)

    @classmethod
    def evaluate(cls, args, attrs, result):
        t, i = args
        ax = attrs["axis"]
        return np.take(t, np.clip(i, 0, t.shape[ax] - 1), axis=ax)


@register
class Scatter(OpDef):
    """Write rows of ``updates`` into a copy of ``dest`` (ONNX ScatterND, "none" reduction).

    ``indices`` is ``[N, r]`` integer; row ``n`` addresses ``dest[idx[n, 0], ..., idx[n, r-1]]``,
    a slice of shape ``dest.shape[r:]`` that receives ``updates[n]`` (``updates`` is
    ``[N] + dest.shape[r:]``). Rows with any coordinate out of range are dropped; when rows
    repeat an address the later row wins.
    """

    name = "scatter"
    operands = ("dest", "indices", "updates")
    summary = "write update slices at integer coordinates (KV cache writes)"

    @classmethod
    def check(cls, operands, attrs, result):
        cls.check_attrs(attrs)
        d = cls.tensor(operands[0], "dest")
        i = cls.tensor(operands[1], "indices")
        u = cls.tensor(operands[2], "updates")
        if not i.dtype.is_int:
            cls.fail(f"indices must have an integer dtype, got {i.dtype}")
        if i.rank != 2 or not 1 <= i.shape[1] <= d.rank:
            cls.fail(f"rank mismatch: indices must be [N, r] with 1 <= r <= {d.rank}, got "
                     f"{list(i.shape)}")
        want = (i.shape[0],) + d.shape[i.shape[1]:]
        if u.shape != want or u.dtype != d.dtype:
            cls.fail(f"updates must be {TensorType(want, d.dtype)}, got {u}")
        return cls.same_result(d, result)

    @classmethod
    def evaluate(cls, args, attrs, result):
        d, idx, u = args
        out = np.array(d, copy=True)
        r = idx.shape[1]
        for n in range(idx.shape[0]):
            coord = tuple(int(c) for c in idx[n])
            if all(0 <= c < s for c, s in zip(coord, d.shape[:r])):
                out[coord] = u[n]
        return out
