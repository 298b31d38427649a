"""Lowering of the elementwise family (unary, binary, ternary, compare, select, cast) to
``linalg.generic`` with arith/math bodies.

Numerics follow :mod:`poot.dialects.ops.elementwise`: f16/bf16 operands are widened to f32,
computed, and rounded back; ``erf`` is computed in f64 (as the oracle does); integer ``div``
truncates toward zero with the oracle's answers for a zero divisor (``a / 0 = 0``) and for
``INT_MIN / -1`` (``INT_MIN``, wrapping), and never executes a trapping division. Float max/min propagate NaN (``maximumf``/``minimumf``,
as ``np.maximum``).
"""

from __future__ import annotations

from poot.dialects.lowering.emit import HALF, Emitter, compute_type
from poot.dialects.lowering.rules import OpInfo, rule
from poot.dialects.types import DType

# ---- scalar bodies: (emitter, compute type, scalars) -> scalar --------------------------------


def _int_div(em: Emitter, t: str, a: str, b: str) -> str:
    zero, one, m1 = em.const(0, t), em.const(1, t), em.const(-1, t)
    is0 = em.op(f"arith.cmpi eq, {b}, {zero} : {t}")
    ism1 = em.op(f"arith.cmpi eq, {b}, {m1} : {t}")
    unsafe = em.op(f"arith.ori {is0}, {ism1} : i1")
    safe = em.op(f"arith.select {unsafe}, {one}, {b} : {t}")
    q = em.op(f"arith.divsi {a}, {safe} : {t}")
    neg = em.op(f"arith.subi {zero}, {a} : {t}")
    q = em.op(f"arith.select {ism1}, {neg}, {q} : {t}")
    return em.op(f"arith.select {is0}, {zero}, {q} : {t}")


def _unary(em: Emitter, fn: str, t: str, x: str) -> str:
    if t == "i1":  # not
        return em.op(f"arith.xori {x}, {em.const(True, 'i1')} : i1")
    if not t.startswith("f"):
        if fn == "neg":
            return em.op(f"arith.subi {em.const(0, t)}, {x} : {t}")
        return em.op(f"math.absi {x} : {t}")
    simple = {"neg": "arith.negf", "abs": "math.absf", "exp": "math.exp", "log": "math.log",
              "sqrt": "math.sqrt", "tanh": "math.tanh", "sin": "math.sin", "cos": "math.cos",
              "floor": "math.floor"}
    if fn in simple:
        return em.op(f"{simple[fn]} {x} : {t}")
    if fn == "rsqrt":  # the oracle's 1 / sqrt(x), two roundings
        s = em.op(f"math.sqrt {x} : {t}")
        return em.op(f"arith.divf {em.const(1.0, t)}, {s} : {t}")
    if fn == "erf":  # the oracle computes erf in f64
        w = em.op(f"arith.extf {x} : {t} to f64")
        e = em.op(f"math.erf {w} : f64")
        return em.op(f"arith.truncf {e} : f64 to {t}")
    raise AssertionError(fn)


_BIN_FLOAT = {"add": "arith.addf", "sub": "arith.subf", "mul": "arith.mulf", "div": "arith.divf",
              "max": "arith.maximumf", "min": "arith.minimumf", "pow": "math.powf"}
_BIN_INT = {"add": "arith.addi", "sub": "arith.subi", "mul": "arith.muli", "max": "arith.maxsi",
            "min": "arith.minsi", "and": "arith.andi", "or": "arith.ori"}


def _binary(em: Emitter, fn: str, t: str, a: str, b: str) -> str:
    if t.startswith("f"):
        return em.op(f"{_BIN_FLOAT[fn]} {a}, {b} : {t}")
    if fn == "div":
        return _int_div(em, t, a, b)
    return em.op(f"{_BIN_INT[fn]} {a}, {b} : {t}")


def _ternary(em: Emitter, fn: str, t: str, a: str, b: str, c: str) -> str:
    if fn == "fma":  # the oracle's a * b + c: two roundings, no contraction
        return _binary(em, "add", t, _binary(em, "mul", t, a, b), c)
    return _binary(em, "min", t, _binary(em, "max", t, a, b), c)  # clamp(x, lo, hi)


# ---- rules ----------------------------------------------------------------------------------


def _elementwise(em: Emitter, op: OpInfo, scalar) -> str:
    d = op.types[0].dtype
    t = compute_type(d)

    def body(args):
        return em.trunc(scalar(em, op.attrs["fn"], t, *[em.ext(a, d) for a in args]), d)

    return em.pointwise(op.result, list(zip(op.args, op.types)), body)


@rule("unary")
def lower_unary(em: Emitter, op: OpInfo) -> str:
    return _elementwise(em, op, _unary)


@rule("binary")
def lower_binary(em: Emitter, op: OpInfo) -> str:
    return _elementwise(em, op, _binary)


@rule("ternary")
def lower_ternary(em: Emitter, op: OpInfo) -> str:
    return _elementwise(em, op, _ternary)


_CMP_FLOAT = {"eq": "oeq", "ne": "une", "lt": "olt", "le": "ole", "gt": "ogt", "ge": "oge"}
_CMP_INT = {"eq": "eq", "ne": "ne", "lt": "slt", "le": "sle", "gt": "sgt", "ge": "sge"}
_CMP_BOOL = {"eq": "eq", "ne": "ne", "lt": "ult", "le": "ule", "gt": "ugt", "ge": "uge"}


@rule("compare")
def lower_compare(em: Emitter, op: OpInfo) -> str:
    d = op.types[0].dtype
    t = compute_type(d)
    pred = op.attrs["pred"]

    def body(args):
        a, b = (em.ext(x, d) for x in args)
        if d.is_float:
            return em.op(f"arith.cmpf {_CMP_FLOAT[pred]}, {a}, {b} : {t}")
        table = _CMP_BOOL if d.is_bool else _CMP_INT
        return em.op(f"arith.cmpi {table[pred]}, {a}, {b} : {t}")

    return em.pointwise(op.result, list(zip(op.args, op.types)), body)


@rule("select")
def lower_select(em: Emitter, op: OpInfo) -> str:
    t = op.result.dtype.value
    return em.pointwise(op.result, list(zip(op.args, op.types)),
                        lambda a: em.op(f"arith.select {a[0]}, {a[1]}, {a[2]} : {t}"))


def convert_scalar(em: Emitter, x: str, src: DType, dst: DType) -> str:
    """One scalar of ``src`` converted to ``dst`` by :class:`~poot.dialects.ops.elementwise.Cast`
    semantics: float rounding to nearest even, float->int truncation toward zero, ``x != 0``
    to i1, i1 as 0/1."""
    s, d = src.value, dst.value
    if src is dst:
        return x
    if dst.is_bool:
        if src.is_float:
            return em.op(f"arith.cmpf une, {x}, {em.const(0.0, s)} : {s}")
        return em.op(f"arith.cmpi ne, {x}, {em.const(0, s)} : {s}")
    if src.is_float and dst.is_float:
        w = em.op(f"arith.extf {x} : {s} to f32") if src in HALF else x
        if dst is DType.F32:
            return w
        return em.op(f"arith.truncf {w} : f32 to {d}")
    if src.is_float:  # -> int: fptosi truncates toward zero
        w = em.op(f"arith.extf {x} : {s} to f32") if src in HALF else x
        return em.op(f"arith.fptosi {w} : f32 to {d}")
    if dst.is_float:
        conv = "arith.uitofp" if src.is_bool else "arith.sitofp"
        if dst in HALF:  # exact for |x| < 2^24, then one rounding
            w = em.op(f"{conv} {x} : {s} to f32")
            return em.op(f"arith.truncf {w} : f32 to {d}")
        return em.op(f"{conv} {x} : {s} to {d}")
    if src.is_bool:
        return em.op(f"arith.extui {x} : i1 to {d}")
    if src.itemsize < dst.itemsize:
        return em.op(f"arith.extsi {x} : {s} to {d}")
    return em.op(f"arith.trunci {x} : {s} to {d}")


@rule("cast")
def lower_cast(em: Emitter, op: OpInfo) -> str:
    src, dst = op.types[0].dtype, op.result.dtype
    return em.pointwise(op.result, [(op.args[0], op.types[0])],
                        lambda a: convert_scalar(em, a[0], src, dst))
