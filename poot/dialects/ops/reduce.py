"""Reductions over a set of axes; the reduced axes are removed from the result shape."""

from __future__ import annotations

import numpy as np

from poot.dialects.opdef import Attr, OpDef, register

_FNS = {"sum": np.sum, "max": np.max, "min": np.min}


@register
class Reduce(OpDef):
    """``sum``/``max``/``min`` over ``axes`` (sorted, unique). Float sums accumulate in at
    least f32 (the oracle uses f64) and round to the result dtype."""

    name = "reduce"
    operands = ("x",)
    attrs = {"fn": Attr("enum", tuple(_FNS)), "axes": Attr("i64s")}
    summary = "sum/max/min over axes, dropping them"

    @classmethod
    def check(cls, operands, attrs, result):
        cls.check_attrs(attrs)
        x = cls.tensor(operands[0], "operand")
        axes = attrs["axes"]
        if not axes:
            cls.fail("attribute 'axes' must not be empty")
        if list(axes) != sorted(set(axes)):
            cls.fail(f"axes {list(axes)} must be sorted and unique")
        for a in axes:
            cls.axis(a, x.rank)
        if x.dtype.is_bool and attrs["fn"] == "sum":
            cls.fail("sum does not admit dtype i1")
        shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
        return cls.same_result(x.with_shape(shape), result)

    @classmethod
    def evaluate(cls, args, attrs, result):
        x = args[0]
        if x.dtype.kind == "f" or x.dtype.name == "bfloat16":
            x = x.astype(np.float64)
        return np.asarray(_FNS[attrs["fn"]](x, axis=tuple(attrs["axes"]))).astype(
            result.dtype.numpy)
