"""Lowering of the shape ops: broadcast (``linalg.generic`` whose input map drops new dims and
pins stretched size-1 dims to 0), reshape (``tensor.collapse_shape`` to 1-D then
``tensor.expand_shape``: views, no copy after bufferization), transpose (``linalg.transpose``),
slice (``tensor.extract_slice``) and concat (``tensor.insert_slice`` chain into
``tensor.empty``)."""

from __future__ import annotations

from poot.dialects.lowering.emit import Emitter, affine_map, tt
from poot.dialects.lowering.rules import OpInfo, rule
from poot.dialects.types import TensorType


def _ilist(xs) -> str:
    return "[" + ", ".join(str(int(x)) for x in xs) + "]"


@rule("broadcast")
def lower_broadcast(em: Emitter, op: OpInfo) -> str:
    x, r = op.types[0], op.result
    exprs = ["0" if x.shape[i] == 1 and r.shape[d] != 1 else f"d{d}"
             for i, d in enumerate(op.attrs["dims"])]
    return em.generic(r, [(op.args[0], x, affine_map(r.rank, exprs))], lambda a, _o: a[0])


def reshape_value(em: Emitter, v: str, src: TensorType, dst: TensorType) -> str:
    """Row-major reshape of ``v`` from ``src`` to ``dst`` as collapse/expand (views)."""
    if src.shape == dst.shape:
        return v
    flat = TensorType((src.numel,), src.dtype)
    if src.rank == 0:
        cur, cur_t = v, src
    elif src.rank == 1:
        cur, cur_t = v, flat
    else:
        assoc = _ilist(range(src.rank))
        cur = em.op(f"tensor.collapse_shape {v} [{assoc}] : {tt(src)} into {tt(flat)}")
        cur_t = flat
    if dst.rank == 0:
        return em.op(f"tensor.collapse_shape {cur} [] : {tt(cur_t)} into {tt(dst)}")
    if cur_t.rank == 0:
        return em.op(f"tensor.expand_shape {cur} [] output_shape {_ilist(dst.shape)} : "
                     f"{tt(cur_t)} into {tt(dst)}")
    if dst.rank == 1:
        return cur
    assoc = _ilist(range(dst.rank))
    return em.op(f"tensor.expand_shape {cur} [{assoc}] output_shape {_ilist(dst.shape)} : "
                 f"{tt(cur_t)} into {tt(dst)}")


@rule("reshape")
def lower_reshape(em: Emitter, op: OpInfo) -> str:
    return reshape_value(em, op.args[0], op.types[0], op.result)


@rule("transpose")
def lower_transpose(em: Emitter, op: OpInfo) -> str:
    perm = list(op.attrs["perm"])
    if perm == sorted(perm):  # identity (rank 0 included: linalg.transpose rejects rank 0)
        return op.args[0]
    init = em.empty(op.result)
    return em.op(f"linalg.transpose ins({op.args[0]} : {tt(op.types[0])}) "
                 f"outs({init} : {tt(op.result)}) permutation = {_ilist(op.attrs['perm'])}")


@rule("slice")
def lower_slice(em: Emitter, op: OpInfo) -> str:
    x, r = op.types[0], op.result
    if x.rank == 0:
        return op.args[0]
    return em.op(f"tensor.extract_slice {op.args[0]}{_ilist(op.attrs['start'])}"
                 f"{_ilist(r.shape)}{_ilist(op.attrs['stride'])} : {tt(x)} to {tt(r)}")


@rule("concat")
def lower_concat(em: Emitter, op: OpInfo) -> str:
    kernels = op.strategy.kernels if op.strategy is not None else None
    own = getattr(kernels, "concat", None)          # a backend's form (CPU: concat_generic)
    if own is not None and (res := own(em, op)) is not None:
        return res
    axis, r = op.attrs["axis"], op.result
    cur = em.empty(r)
    offset = 0
    for v, t in zip(op.args, op.types):
        if t.shape[axis] == 0:
            continue
        offs = [offset if i == axis else 0 for i in range(r.rank)]
        cur = em.op(f"tensor.insert_slice {v} into {cur}{_ilist(offs)}{_ilist(t.shape)}"
                    f"{_ilist([1] * r.rank)} : {tt(t)} into {tt(r)}")
        offset += t.shape[axis]
    return cur


def concat_generic(em: Emitter, op: OpInfo) -> str | None:
    """``poot.concat`` of pieces one wide on the axis (a stack, or RoPE's interleave of its
    rotated halves on a new last axis) as one all-parallel ``linalg.generic``: each piece
    read without its unit dim (a projected-permutation map, so elementwise producers fuse
    into it) and ``linalg.index`` of the axis selecting the piece. The insert-slice chain of
    :func:`lower_concat` writes such pieces as strided copies that nothing fuses and that run
    on one thread (SmolLM2's RoPE at batch 32: ~2 % of a CPU decode step). Every element is
    the piece's value, as there. None (emitting nothing) for other concats or rank < 2."""
    axis, r = op.attrs["axis"], op.result
    if r.rank < 2 or len(op.args) < 2 or any(t.shape[axis] != 1 for t in op.types):
        return None
    rank = r.rank
    # the unit axis folded into a neighbour: [[0], .., [axis, axis + 1], ..] (or [axis - 1, axis])
    pair = (axis, axis + 1) if axis + 1 < rank else (axis - 1, axis)
    groups, i = [], 0
    while i < rank:
        if i == pair[0]:
            groups.append([pair[0], pair[1]])
            i += 2
        else:
            groups.append([i])
            i += 1
    assoc = "[" + ", ".join("[" + ", ".join(map(str, g)) + "]" for g in groups) + "]"
    ins = []
    for v, t in zip(op.args, op.types):
        flat = TensorType(tuple(d for k, d in enumerate(t.shape) if k != axis), t.dtype)
        x = em.op(f"tensor.collapse_shape {v} {assoc} : {tt(t)} into {tt(flat)}")
        ins.append((x, flat, affine_map(rank, [f"d{k}" for k in range(rank) if k != axis])))

    def body(args, _out):
        idx = em.op(f"linalg.index {axis} : index")
        sel = args[-1]
        ty = "i1" if r.dtype.value == "i1" else r.dtype.value
        for k in range(len(args) - 2, -1, -1):
            hit = em.op(f"arith.cmpi eq, {idx}, {em.const(k, 'index')} : index")
            sel = em.op(f"arith.select {hit}, {args[k]}, {sel} : {ty}")
        return sel

    return em.generic(r, ins, body)
