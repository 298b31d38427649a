"""Elementwise ops: unary/binary/ternary by a function attribute, compare, select, cast.

Operands of one elementwise op have identical shapes (broadcasting is explicit, through
``poot.broadcast``), which keeps every lowering a plain parallel loop nest.
"""

from __future__ import annotations

import math

import numpy as np

from poot.dialects.opdef import Attr, OpDef, float_compute, register
from poot.dialects.types import DType, TensorType

_erf = np.vectorize(math.erf, otypes=[np.float64])

# fn -> (numpy semantics on f32/int arrays, dtype classes admitted)
UNARY = {
    "neg": (np.negative, "num"),
    "abs": (np.abs, "num"),
    "exp": (np.exp, "float"),
    "log": (np.log, "float"),
    "sqrt": (np.sqrt, "float"),
    "rsqrt": (lambda x: np.float32(1) / np.sqrt(x), "float"),
    "tanh": (np.tanh, "float"),
    "erf": (lambda x: _erf(x.astype(np.float64)).astype(np.float32), "float"),
    "sin": (np.sin, "float"),
    "cos": (np.cos, "float"),
    "floor": (np.floor, "float"),
    "not": (np.logical_not, "bool"),
}


def _int_div(a, b):
    if a.dtype.kind == "f":
        return a / b
    # C semantics: truncate toward zero (floor division, then step toward zero when inexact);
    # division by zero yields 0 here, a lowering may differ (undefined).
    safe = np.where(b == 0, 1, b)
    q = a // safe
    q = q + (((a % safe) != 0) & ((a < 0) != (safe < 0))).astype(a.dtype)
    return np.where(b == 0, 0, q).astype(a.dtype)


BINARY = {
    "add": (np.add, "num"),
    "sub": (np.subtract, "num"),
    "mul": (np.multiply, "num"),
    "div": (_int_div, "num"),
    "max": (np.maximum, "num"),
    "min": (np.minimum, "num"),
    "pow": (np.power, "float"),
    "and": (np.logical_and, "bool"),
    "or": (np.logical_or, "bool"),
}

TERNARY = {
    "fma": (lambda a, b, c: a * b + c, "float"),
    "clamp": (lambda x, lo, hi: np.minimum(np.maximum(x, lo), hi), "num"),
}

COMPARE = {
    "eq": np.equal, "ne": np.not_equal, "lt": np.less,
    "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
}


def _admits(cls_name: str, dtype: DType) -> bool:
    return {"float": dtype.is_float, "num": not dtype.is_bool, "bool": dtype.is_bool}[cls_name]


class _Elementwise(OpDef):
    table: dict = {}

    @classmethod
    def check(cls, operands, attrs, result):
        cls.check_attrs(attrs)
        if len(operands) != len(cls.operands):
            cls.fail(f"expects {len(cls.operands)} operands, got {len(operands)}")
        ts = [cls.tensor(t, f"operand #{i}") for i, t in enumerate(operands)]
        for i, t in enumerate(ts[1:], 1):
            if t != ts[0]:
                cls.fail(f"operand #{i} type {t} differs from operand #0 type {ts[0]}")
        _, admitted = cls.table[attrs["fn"]]
        if not _admits(admitted, ts[0].dtype):
            cls.fail(f"fn \"{attrs['fn']}\" does not admit dtype {ts[0].dtype}")
        return cls.same_result(ts[0], result)

    @classmethod
    def evaluate(cls, args, attrs, result):
        fn, _ = cls.table[attrs["fn"]]
        with np.errstate(all="ignore"):
            out = fn(*[float_compute(a) for a in args])
        return np.asarray(out).astype(result.dtype.numpy)


@register
class Unary(_Elementwise):
    name = "unary"
    operands = ("x",)
    attrs = {"fn": Attr("enum", tuple(UNARY))}
    table = UNARY
    summary = "elementwise unary function"


@register
class Binary(_Elementwise):
    name = "binary"
    operands = ("lhs", "rhs")
    attrs = {"fn": Attr("enum", tuple(BINARY))}
    table = BINARY
    summary = "elementwise binary function (same shapes; integer div truncates)"


@register
class Ternary(_Elementwise):
    name = "ternary"
    operands = ("a", "b", "c")
    attrs = {"fn": Attr("enum", tuple(TERNARY))}
    table = TERNARY
    summary = "elementwise ternary function: fma(a,b,c)=a*b+c, clamp(x,lo,hi)"


@register
class Compare(OpDef):
    name = "compare"
    operands = ("lhs", "rhs")
    attrs = {"pred": Attr("enum", tuple(COMPARE))}
    summary = "elementwise comparison to i1"

    @classmethod
    def check(cls, operands, attrs, result):
        cls.check_attrs(attrs)
        a, b = (cls.tensor(t, f"operand #{i}") for i, t in enumerate(operands))
        if a != b:
            cls.fail(f"operand #1 type {b} differs from operand #0 type {a}")
        return cls.same_result(a.with_dtype(DType.I1), result)

    @classmethod
    def evaluate(cls, args, attrs, result):
        return COMPARE[attrs["pred"]](*[float_compute(a) for a in args])


@register
class Select(OpDef):
    name = "select"
    operands = ("cond", "on_true", "on_false")
    summary = "elementwise cond ? on_true : on_false"

    @classmethod
    def check(cls, operands, attrs, result):
        cls.check_attrs(attrs)
        if len(operands) != 3:
            cls.fail(f"expects 3 operands, got {len(operands)}")
        c, a, b = (cls.tensor(t, f"operand #{i}") for i, t in enumerate(operands))
        if c.dtype is not DType.I1:
            cls.fail(f"condition must have dtype i1, got {c.dtype}")
        if a != b:
            cls.fail(f"operand #2 type {b} differs from operand #1 type {a}")
        if c.shape != a.shape:
            cls.fail(f"condition shape {list(c.shape)} differs from value shape {list(a.shape)}")
        return cls.same_result(a, result)

    @classmethod
    def evaluate(cls, args, attrs, result):
        return np.where(args[0], args[1], args[2]).astype(result.dtype.numpy)


@register
class Cast(OpDef):
    """Convert dtype. float->float rounds to nearest even; float->int truncates toward zero
    (undefined when out of range or NaN); x->i1 is ``x != 0``; i1->x is 0 or 1."""

    name = "cast"
    operands = ("x",)
    summary = "dtype conversion"

    @classmethod
    def check(cls, operands, attrs, result):
        cls.check_attrs(attrs)
        x = cls.tensor(operands[0], "operand")
        r = cls.need_result(result)
        if r.shape != x.shape:
            cls.fail(f"result shape {list(r.shape)} differs from operand shape {list(x.shape)}")
        return r

    @classmethod
    def evaluate(cls, args, attrs, result):
        x = args[0]
        is_float = x.dtype.kind == "f" or x.dtype.name == "bfloat16"
        if result.dtype.is_bool:
            return x.astype(np.float32) != 0
        # Out-of-range or NaN float->int and overflowing narrowings are undefined (as LLVM's
        # fptosi/trunc): the oracle returns numpy's value without warning about it.
        with np.errstate(over="ignore", invalid="ignore"):
            if result.dtype.is_int and is_float:
                x = np.trunc(x.astype(np.float32))
            return x.astype(result.dtype.numpy)
