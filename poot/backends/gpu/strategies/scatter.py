"""Strategy ``scatter``: a region whose result is a ``poot.scatter`` into one of its arguments
(a KV-cache write) becomes a copy of the destination (dropped by the plan when the result is
the argument's own buffer, i.e. state updated in place) and ONE kernel that writes only the
addressed slices.

Semantics (:class:`poot.dialects.ops.indexing.Scatter`, ONNX ScatterND with no reduction):
row ``n`` of ``indices [N, r]`` addresses the slice ``dest[idx[n, 0], ..., idx[n, r-1]]``
(shape ``dest.shape[r:]``) that receives ``updates[n]``; rows with a coordinate out of range are
dropped; when rows repeat an address the later row wins.

Mapping: one thread per (row ``n``, element ``e`` of a slice): grid y is the row, grid x the
slice's elements. Thread (n, e) stores ``updates[n, e]`` when row ``n`` is in range and no
later row ``m > n`` addresses the same slice (it compares the later rows' coordinates first:
integer work on a few cached indices), so a repeated address ends with the later row's value
and no two threads ever write the same element. Rows are independent otherwise: a batch of
B decode rows, or a prefill chunk, writes its K/V in one wave instead of one thread walking
every row in turn (which made a batch-32 decode step's K/V write of the Llama-3.2-1B shape,
RoPE included, 19 us a layer on an H200). ``indices`` and ``updates`` may be any
elementwise-class expression of the arguments (:mod:`~poot.backends.gpu.strategies.emit`).
"""

from __future__ import annotations

from mlir import ir

from poot.backends.gpu.kernels import Launch, block_size
from poot.backends.gpu.strategies.emit import (
    KernelEmitter,
    ScalarEmitter,
    ScalarUnsupported,
    Synthesized,
    buffer_type,
    one_kernel_module,
    poot_type,
)
from poot.dialects.types import TensorType


def _returned_scatter(fn: ir.Operation):
    """(scatter op, index of its destination argument) when ``fn`` returns exactly one value,
    a ``poot.scatter`` (through reshapes) into one of ``fn``'s arguments; else None."""
    block = fn.regions[0].blocks[0]
    ret = list(block.operations)[-1].operation
    if len(ret.operands) != 1:
        return None
    v = ret.operands[0]
    while not isinstance(v.owner, ir.Block) and v.owner.operation.name == "poot.reshape":
        v = v.owner.operation.operands[0]
    if isinstance(v.owner, ir.Block) or v.owner.operation.name != "poot.scatter":
        return None
    op = v.owner.operation
    dest = op.operands[0]
    if not isinstance(dest.owner, ir.Block):
        return None
    args = list(block.arguments)
    return op, next(i for i, a in enumerate(args) if a == dest)


def scatter(fn: ir.Operation, caps):
    """The copy + one-kernel form of a scatter region, or None (see the module doc)."""
    found = _returned_scatter(fn)
    if found is None:
        return None
    op, d_arg = found
    dest, indices, updates = op.operands
    dt, it = poot_type(dest), poot_type(indices)
    if not isinstance(dt, TensorType) or it.rank != 2:
        return None
    n_rows, r = it.shape
    slice_shape = dt.shape[r:]
    elems = 1
    for s in slice_shape:
        elems *= s
    flat = TensorType((dt.numel,), dt.dtype)
    em = KernelEmitter()
    se = ScalarEmitter(fn, em)
    t = block_size(elems, caps)
    ity = it.dtype.value
    em.line("%tid = gpu.thread_id x")
    em.line("%bid = gpu.block_id x")
    em.line("%n = gpu.block_id y")
    try:
        lin = se.iadd(se.imul("%bid", t), "%tid")
        guard = se.op(f"arith.cmpi ult, {se.ix(lin)}, {se.ix(elems)} : index")
        em.line(f"scf.if {guard} {{")
        em.depth += 1
        with se.scope():
            e_idx = se.delinearize(lin, slice_shape) if slice_shape else []
            ok, cs, coords = None, [], []
            for j in range(r):
                c = se.value(indices, ["%n", j])
                lo = se.op(f"arith.cmpi sge, {c}, {em.const(0, ity)} : {ity}")
                hi = se.op(f"arith.cmpi slt, {c}, {em.const(dt.shape[j], ity)} : {ity}")
                both = se.op(f"arith.andi {lo}, {hi} : i1")
                ok = both if ok is None else se.op(f"arith.andi {ok}, {both} : i1")
                cs.append(c)
                coords.append(se.op(f"arith.index_cast {c} : {ity} to index"))
            # a later row at the same address wins: this row then writes nothing
            false = em.const(0, "i1")
            later = se.op(f"arith.addi %n, {se.ix(1)} : index")
            em.line(f"%later_dup = scf.for %m = {later} to {se.ix(n_rows)} step {se.ix(1)} "
                    f"iter_args(%dup = {false}) -> (i1) {{")
            em.depth += 1
            with se.scope():
                same = None
                for j in range(r):
                    eq = se.op(f"arith.cmpi eq, {se.value(indices, ['%m', j])}, {cs[j]} : "
                               f"{ity}")
                    same = eq if same is None else se.op(f"arith.andi {same}, {eq} : i1")
                em.line(f"%dup_next = arith.ori %dup, {same} : i1")
                em.line("scf.yield %dup_next : i1")
            em.depth -= 1
            em.line("}")
            keep = se.op(f"arith.xori %later_dup, {em.const(1, 'i1')} : i1")
            em.line(f"scf.if {se.op(f'arith.andi {ok}, {keep} : i1')} {{")
            em.depth += 1
            with se.scope():
                x = se.value(updates, ["%n"] + list(e_idx))
                at = se.linearize(coords + list(e_idx), dt.shape)
                se.store(x, "%out0", flat, [at])
            em.depth -= 1
            em.line("}")
        em.depth -= 1
        em.line("}")
    except ScalarUnsupported:
        return None
    text, slots = one_kernel_module("scatter", se, [("%out0", buffer_type(flat))])
    copy = Launch("copy", [("arg", d_arg), ("out", 0)], nbytes=dt.nbytes)
    kern = Launch("kernel", slots, "scatter", "k", ((elems + t - 1) // t, n_rows, 1),
                  (t, 1, 1), strategy="scatter")
    return Synthesized(text, [copy, kern], consts=list(se.consts))


__all__ = ["scatter"]
