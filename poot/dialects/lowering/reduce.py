"""Lowering of ``poot.reduce`` to a ``linalg.generic`` with reduction iterators.

Sums of f16/bf16 accumulate in f32 and round once at the end; f32 sums accumulate in f32 (the
oracle sums in f64: tests state a relative tolerance). Float max/min propagate NaN; i1 max/min
are or/and.
"""

from __future__ import annotations

from poot.dialects.lowering.emit import HALF, Emitter, affine_map, compute_type, storage, tt
from poot.dialects.lowering.rules import OpInfo, rule
from poot.dialects.types import DType

_INT_LIMITS = {"i8": (-(1 << 7), (1 << 7) - 1), "i32": (-(1 << 31), (1 << 31) - 1),
               "i64": (-(1 << 63), (1 << 63) - 1)}


def _identity(em: Emitter, fn: str, t: str) -> str:
    if fn == "sum":
        return em.const(0.0 if t.startswith("f") else 0, t)
    if t == "i1":
        return em.const(fn == "min", "i1")
    if t.startswith("f"):
        return em.const(float("-inf") if fn == "max" else float("inf"), t)
    lo, hi = _INT_LIMITS[t]
    return em.const(lo if fn == "max" else hi, t)


def _combine(em: Emitter, fn: str, t: str, acc: str, x: str) -> str:
    if t == "i1":
        return em.op(f"arith.{'ori' if fn == 'max' else 'andi'} {acc}, {x} : i1")
    if t.startswith("f"):
        name = {"sum": "addf", "max": "maximumf", "min": "minimumf"}[fn]
    else:
        name = {"sum": "addi", "max": "maxsi", "min": "minsi"}[fn]
    return em.op(f"arith.{name} {acc}, {x} : {t}")


@rule("reduce")
def lower_reduce(em: Emitter, op: OpInfo) -> str:
    x, out = op.types[0], op.result
    fn, axes = op.attrs["fn"], set(op.attrs["axes"])
    d = x.dtype
    acc_t = compute_type(d)
    acc_type = out.with_dtype(DType(acc_t))
    # Accumulator initialised with the identity of fn.
    ident = em.to_storage(_identity(em, fn, acc_t), d)
    st = storage(d) if d.is_bool else acc_t
    init = em.op(f"linalg.fill ins({ident} : {st}) outs({em.empty(acc_type)} : "
                 f"{tt(acc_type)}) -> {tt(acc_type)}", "acc")
    n = x.rank
    in_map = affine_map(n, [f"d{i}" for i in range(n)])
    out_map = affine_map(n, [f"d{i}" for i in range(n) if i not in axes])
    iters = ["reduction" if i in axes else "parallel" for i in range(n)]
    r = em.generic(acc_type, [(op.args[0], x, in_map)],
                   lambda a, o: _combine(em, fn, acc_t, o, em.ext(a[0], d)),
                   iterators=iters, out_map=out_map, init=init, loop_rank=n, reads_out=True)
    if d not in HALF:
        return r
    return em.pointwise(out, [(r, acc_type)], lambda a: em.trunc(a[0], d))
