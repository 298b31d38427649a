"""Lowering of gather (``linalg.generic`` reading the table with ``tensor.extract`` at a clamped
index) and scatter (``scf.for`` over update rows; each in-range row is written by
``tensor.insert_slice`` under ``scf.if``, so later rows win and out-of-range rows are dropped).
"""

from __future__ import annotations

from poot.dialects.lowering.emit import Emitter, affine_map, tt
from poot.dialects.lowering.rules import OpInfo, rule
from poot.dialects.types import TensorType


def _to_index(em: Emitter, v: str, t: str) -> str:
    return em.op(f"arith.index_cast {v} : {t} to index")


def _to_i64(em: Emitter, v: str, t: str) -> str:
    """An index of any integer dtype as i64 (bounds of any table size fit)."""
    return v if t == "i64" else em.op(f"arith.extsi {v} : {t} to i64")


@rule("gather")
def lower_gather(em: Emitter, op: OpInfo) -> str:
    table, idx = op.args
    tt_, it = op.types
    ax, r = op.attrs["axis"], op.result
    k = it.rank
    idx_map = affine_map(r.rank, [f"d{ax + j}" for j in range(k)])
    ity = "i64"

    def body(a, _o):
        i = _to_i64(em, a[0], it.dtype.value)
        lo, hi = em.const(0, ity), em.const(tt_.shape[ax] - 1, ity)
        c = em.op(f"arith.maxsi {i}, {lo} : {ity}")
        c = em.op(f"arith.minsi {c}, {hi} : {ity}")
        coords = []
        for d in range(tt_.rank):
            if d < ax:
                coords.append(em.op(f"linalg.index {d} : index"))
            elif d == ax:
                coords.append(_to_index(em, c, ity))
            else:
                coords.append(em.op(f"linalg.index {d - 1 + k} : index"))
        v = em.op(f"tensor.extract {table}[{', '.join(coords)}] : {tt(tt_)}")
        return em.from_storage(v, tt_.dtype)

    return em.generic(r, [(idx, it, idx_map)], body)


@rule("scatter")
def lower_scatter(em: Emitter, op: OpInfo) -> str:
    dest, idx, upd = op.args
    dt, it, ut = op.types
    nrows, r = it.shape
    ity = "i64"
    tail = dt.shape[r:]
    row_t = TensorType(tail, dt.dtype)
    c0, c1 = em.const(0, "index"), em.const(1, "index")
    cn = em.const(nrows, "index")
    iv, acc = em.fresh("n"), em.fresh("d")
    res = em.fresh("sc")
    em.line(f"{res} = scf.for {iv} = {c0} to {cn} step {c1} iter_args({acc} = {dest}) -> "
            f"({tt(dt)}) {{")
    em.depth += 1
    coords, ok = [], None
    for j in range(r):
        cj = em.const(j, "index")
        v = _to_i64(em, em.op(f"tensor.extract {idx}[{iv}, {cj}] : {tt(it)}"), it.dtype.value)
        lo = em.op(f"arith.cmpi sge, {v}, {em.const(0, ity)} : {ity}")
        hi = em.op(f"arith.cmpi slt, {v}, {em.const(dt.shape[j], ity)} : {ity}")
        inb = em.op(f"arith.andi {lo}, {hi} : i1")
        ok = inb if ok is None else em.op(f"arith.andi {ok}, {inb} : i1")
        coords.append(_to_index(em, v, ity))
    zeros = ["0"] * len(tail)
    one = ["1"] * len(tail)
    row = em.op(f"tensor.extract_slice {upd}[{', '.join([iv] + zeros)}] "
                f"[{', '.join(['1'] + [str(s) for s in tail])}] [{', '.join(['1'] + one)}] : "
                f"{tt(ut)} to {tt(row_t)}")
    upd_acc = em.fresh("w")
    em.line(f"{upd_acc} = scf.if {ok} -> ({tt(dt)}) {{")
    em.depth += 1
    ins = em.op(f"tensor.insert_slice {row} into {acc}[{', '.join(coords + zeros)}] "
                f"[{', '.join(['1'] * r + [str(s) for s in tail])}] "
                f"[{', '.join(['1'] * dt.rank)}] : {tt(row_t)} into {tt(dt)}")
    em.line(f"scf.yield {ins} : {tt(dt)}")
    em.depth -= 1
    em.line("} else {")
    em.depth += 1
    em.line(f"scf.yield {acc} : {tt(dt)}")
    em.depth -= 1
    em.line("}")
    em.line(f"scf.yield {upd_acc} : {tt(dt)}")
    em.depth -= 1
    em.line("}")
    return res
