"""Lowering of gather (``linalg.generic`` reading the table with ``tensor.extract`` at a clamped
index) and scatter (``scf.for`` over update rows, in order, so later rows win; each row is
written with ``tensor.insert_slice`` at clamped coordinates, as itself when in range and as the
row already there when not, so out-of-range rows change nothing).
"""

from __future__ import annotations

from poot.dialects.lowering.emit import Emitter, affine_map, tt
from poot.dialects.lowering.packed import decode_at
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
    deq = op.producer(0)
    if deq is not None and (deq.name != "dequantize" or deq.producer(0) is not None):
        deq = None  # only a dequantize of a weight is decoded at the gathered rows

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
        if deq is not None:  # decode just the gathered elements from the packed bytes
            return decode_at(em, deq, coords)
        v = em.op(f"tensor.extract {table}[{', '.join(coords)}] : {tt(tt_)}")
        return em.from_storage(v, tt_.dtype)

    return em.generic(r, [(idx, it, idx_map)], body)


@rule("scatter")
def lower_scatter(em: Emitter, op: OpInfo) -> str:
    """Row n goes to ``dest[idx[n, 0], ..., idx[n, r-1]]`` when every coordinate is in range.

    Branch-free, so that bufferization can decide buffer ownership statically (an ``scf.if``
    yielding either a fresh buffer or the read-only argument needs runtime ownership flags,
    whose i1 memrefs MLIR 22 cannot lower to LLVM): the coordinates are clamped into range,
    the row currently there is read, ``select(in_range, update, current)`` is written back."""
    dest, idx, upd = op.args
    dt, it, ut = op.types
    nrows, r = it.shape
    if nrows == 0 or 0 in dt.shape:
        return dest
    ity = "i64"
    tail = dt.shape[r:]
    row_t = TensorType(tail, dt.dtype)
    sizes = ", ".join(["1"] * r + [str(s) for s in tail])
    ones = ", ".join(["1"] * dt.rank)
    zeros = ["0"] * len(tail)
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
        lo, hi = em.const(0, ity), em.const(dt.shape[j] - 1, ity)
        inb = em.op(f"arith.andi {em.op(f'arith.cmpi sge, {v}, {lo} : {ity}')}, "
                    f"{em.op(f'arith.cmpi sle, {v}, {hi} : {ity}')} : i1")
        ok = inb if ok is None else em.op(f"arith.andi {ok}, {inb} : i1")
        clamped = em.op(f"arith.minsi {em.op(f'arith.maxsi {v}, {lo} : {ity}')}, {hi} : {ity}")
        coords.append(_to_index(em, clamped, ity))
    at = ", ".join(coords + zeros)
    new = em.op(f"tensor.extract_slice {upd}[{', '.join([iv] + zeros)}] "
                f"[{', '.join(['1'] + [str(s) for s in tail])}] [{', '.join(['1'] * ut.rank)}] : "
                f"{tt(ut)} to {tt(row_t)}")
    cur = em.op(f"tensor.extract_slice {acc}[{at}] [{sizes}] [{ones}] : {tt(dt)} to {tt(row_t)}")
    t = dt.dtype.value
    row = em.pointwise(row_t, [(new, row_t), (cur, row_t)],
                       lambda a: em.op(f"arith.select {ok}, {a[0]}, {a[1]} : {t}"))
    ins = em.op(f"tensor.insert_slice {row} into {acc}[{at}] [{sizes}] [{ones}] : "
                f"{tt(row_t)} into {tt(dt)}")
    em.line(f"scf.yield {ins} : {tt(dt)}")
    em.depth -= 1
    em.line("}")
    return res
