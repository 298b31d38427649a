"""Strategy ``rowreduce``: a region of last-axis reductions over elementwise-computed rows,
followed by elementwise consumers (RMSNorm ``x * rsqrt(mean(x^2) + eps) * w``, softmax
``exp(x - max) / sum``, LayerNorm's mean and variance), becomes ONE kernel.

Matches: every op is a ``poot.reduce`` or of the elementwise class
(:data:`~poot.backends.gpu.strategies.pointwise.ELEMENTWISE_CLASS`); every reduce has the same
operand shape ``[*rows, K]``, reduces the last axis only, with ``sum``/``max``/``min`` on f32,
f16, bf16 (f32 accumulation, the result rounded once, as the linalg lowering does) or i32, or
``max``/``min`` (any/all) on i1, folded as i32 0/1; every
result of the region is either *row-shaped* (``[*rows', K]`` with ``prod(rows') = prod(rows)``)
or *row-scalar* (``prod(rows)`` elements); and a reduction result is only ever read at its own
row (checked while emitting: the consumer's coordinates must be the row's own coordinate
names). Anything else is refused (``None``).

Mapping (per row of ``K`` elements): ``TR`` threads of one block, a power of two times the
subgroup size, at least ~4 elements each, at most 1024 (``RB`` rows per block of ``TR`` =
one subgroup each when rows are short). For each reduction in program order: each thread folds
the row's elements ``lane, lane + TR, ...`` (evaluated by the scalar emitter, earlier
reductions of the row supplied by its hook: softmax's sum reads its max), the subgroup
combines with a ``gpu.shuffle xor`` butterfly, and, when a row spans several subgroups, lane 0
of each writes its partial to workgroup memory (one buffer per reduction, so no barrier is
needed between reductions), a barrier, then every thread combines the partials in the same
order (so every thread holds the identical total). Without a known subgroup size (a Vulkan
device that did not report one) the combine is a workgroup-memory tree instead. Finally the
same threads write every row-shaped result at ``lane, lane + TR, ...`` and lane 0 the
row-scalar ones. Reference: the classic CUDA block reduction (Harris, "Optimizing Parallel
Reduction in CUDA") with warp shuffles (NVIDIA, "Faster Parallel Reductions on Kepler").
"""

from __future__ import annotations

from mlir import ir

from poot.backends.gpu.kernels import Launch
from poot.backends.gpu.strategies import Synthesized, register
from poot.backends.gpu.strategies._scalar import (
    KernelEmitter,
    ScalarEmitter,
    ScalarUnsupported,
    buffer_type,
    gpu_kernel,
    gpu_module,
    poot_type,
)
from poot.backends.gpu.strategies.pointwise import ELEMENTWISE_CLASS, body_ops, results
from poot.dialects.lowering.emit import HALF, compute_type
from poot.dialects.lowering.reduce import _combine, _identity
from poot.dialects.opdef import lookup, read_attrs
from poot.dialects.types import DType, TensorType

#: most threads one row gets
MAX_ROW_THREADS = 1024
#: threads of a block holding several short rows
MULTI_ROW_BLOCK = 256
#: fewest elements per thread before a row gets more threads
MIN_PER_THREAD = 4


def _prod(s) -> int:
    n = 1
    for d in s:
        n *= d
    return n


def row_threads(k: int, sg: int | None) -> int:
    """Threads per row: the subgroup size (1 without one) doubled while each thread keeps at
    least :data:`MIN_PER_THREAD` elements, at most :data:`MAX_ROW_THREADS`."""
    t = sg or 1
    while t * 2 <= MAX_ROW_THREADS and t * 2 * MIN_PER_THREAD <= k:
        t *= 2
    return t


def synthesize_rowreduce(fn: ir.Operation, caps, name: str = "rowreduce"):
    """The one-kernel form of a row-reduction region, or None (see the module doc)."""
    ops = body_ops(fn)
    reduces = [o for o in ops if o.name == "poot.reduce"]
    if not reduces or any(o.name != "poot.reduce" and o.name not in ELEMENTWISE_CLASS
                          for o in ops):
        return None
    x0 = poot_type(reduces[0].operands[0])
    if not isinstance(x0, TensorType) or x0.rank < 1:
        return None
    shape = x0.shape
    k, rows_shape = shape[-1], shape[:-1]
    n_rows = _prod(rows_shape)
    if any(poot_type(r.operands[0]).shape != shape or reduce_kind(r) is None
           for r in reduces):
        return None
    outs = results(fn)
    types = [poot_type(v) for v in outs]
    row_outs, scalar_outs = [], []
    for j, t in enumerate(types):
        if not isinstance(t, TensorType):
            return None
        if t.rank and t.shape[-1] == k and _prod(t.shape[:-1]) == n_rows:
            row_outs.append(j)
        elif t.numel == n_rows:
            scalar_outs.append(j)
        else:
            return None
    if n_rows == 0 or k == 0:
        return None

    sg = caps.subgroup_size
    tr = row_threads(k, sg)
    rb = 1
    if sg and tr == sg:
        rb = max(1, min(MULTI_ROW_BLOCK // sg, n_rows))
    em = KernelEmitter()
    se = ScalarEmitter(fn, em)
    out_names = [f"%out{j}" for j in range(len(outs))]
    workgroup: list[tuple[str, str]] = []
    provided: dict = {}
    pending = {r.results[0] for r in reduces}
    rowc: list = []

    def provide(v, idx):
        if v in provided:
            if tuple(idx) != tuple(rowc):
                raise ScalarUnsupported("a reduction result read at another row")
            return provided[v]
        if v in pending:
            raise ScalarUnsupported("a reduction result read before it is computed")
        return None

    se.provide = provide
    em.line("%tid = gpu.thread_id x")
    em.line("%bid = gpu.block_id x")
    try:
        lane = se.irem("%tid", tr) if rb > 1 else "%tid"
        row = se.iadd(se.imul("%bid", rb), se.idiv("%tid", tr) if rb > 1 else 0)
        guarded = rb > 1 and n_rows % rb != 0
        if guarded:
            ok = se.op(f"arith.cmpi ult, {se.ix(row)}, {se.ix(n_rows)} : index")
            em.line(f"scf.if {ok} {{")
            em.depth += 1
        with se.scope():
            rowc[:] = se.delinearize(row, rows_shape)
            for p, r in enumerate(reduces):
                provided[r.results[0]] = row_total(se, r, rowc, lane, tr, sg, p, workgroup)
                pending.discard(r.results[0])
            if row_outs:
                _row_outputs(se, em, outs, types, out_names, row_outs,
                             {j: se.delinearize(row, types[j].shape[:-1]) for j in row_outs},
                             lane, k, tr)
            if scalar_outs:
                first = se.op(f"arith.cmpi eq, {se.ix(lane)}, {se.ix(0)} : index")
                em.line(f"scf.if {first} {{")
                em.depth += 1
                with se.scope():
                    for j in scalar_outs:
                        idx = se.delinearize(row, types[j].shape)
                        se.store(se.value(outs[j], idx), out_names[j], types[j], idx)
                em.depth -= 1
                em.line("}")
        if guarded:
            em.depth -= 1
            em.line("}")
    except ScalarUnsupported:
        return None
    params = se.buffer_params() + [(o, buffer_type(t)) for o, t in zip(out_names, types)]
    text = gpu_module(name, [gpu_kernel("k", params, em.text(), workgroup)])
    slots = [("arg", i) for i in range(len(se.args))] + \
        [("const", i) for i in range(len(se.consts))] + [("out", j) for j in range(len(outs))]
    grid = (n_rows + rb - 1) // rb
    launch = Launch("kernel", slots, name, "k", (grid, 1, 1), (rb * tr, 1, 1), strategy=name)
    return Synthesized(text, [launch], consts=list(se.consts))


def _row_outputs(se: ScalarEmitter, em: KernelEmitter, outs, types, out_names, row_outs,
                 orows: dict, lane, k: int, tr: int) -> None:
    """Store the row outputs ``row_outs`` (elementwise over the row's ``k`` columns, each
    thread columns ``lane::tr``): ``V`` (at most :data:`ROW_CHAINS`) columns an iteration, all
    their values computed before any is stored. Why: an output written in place over an
    input it reads (a sampler's token-history row) cannot have its loads moved past its
    stores by the compiler, so one column at a time each iteration waits on its own load
    (a 128k-column history update by 1024 threads took most of a 40 us argmax kernel).
    Assumes, as the block's threads already do (they run these columns concurrently), that
    an output written in place reads its input at its own column only: an in-place output
    that read other columns of its input (a shifted row) would race either way; the plan
    does not check that today."""
    rounds = -(-k // tr)
    V = next(v for v in (ROW_CHAINS, 4, 2, 1) if v <= max(1, rounds // 2))
    iters = -(-rounds // V)
    ragged = iters * V * tr != k
    c = em.fresh("it")
    em.line(f"scf.for {c} = {se.ix(0)} to {se.ix(iters)} step {se.ix(1)} {{")
    em.depth += 1
    with se.scope():
        vals = []
        for v in range(V):
            col = se.iadd(se.iadd(se.imul(c, V * tr), v * tr), lane)
            inside = None
            if ragged:
                inside = se.op(f"arith.cmpi ult, {se.ix(col)}, {se.ix(k)} : index")
                col = se.op(f"arith.minui {se.ix(col)}, {se.ix(k - 1)} : index")
            with se.scope():
                got = [(j, orows[j] + [col], se.value(outs[j], orows[j] + [col]))
                       for j in row_outs]
            vals.append((inside, got))
        for inside, got in vals:
            if inside is not None:
                em.line(f"scf.if {inside} {{")
                em.depth += 1
            for j, idx, val in got:
                se.store(val, out_names[j], types[j], idx)
            if inside is not None:
                em.depth -= 1
                em.line("}")
    em.depth -= 1
    em.line("}")


def reduce_kind(r: ir.Operation) -> str | None:
    """``fn`` (``sum``/``max``/``min``) of a ``poot.reduce`` over its operand's last axis only,
    on a dtype the row kernels accumulate (f32/f16/bf16 in f32, i32; ``max``/``min`` of i1 as
    i32 0/1); None for any other."""
    a = read_attrs(lookup(r.name), r)
    x = poot_type(r.operands[0])
    boolean = x.dtype is DType.I1 and a["fn"] in ("max", "min")        # any / all
    if not isinstance(x, TensorType) or x.rank < 1 or list(a["axes"]) != [x.rank - 1] or \
            not (x.dtype.is_float or x.dtype is DType.I32 or boolean):
        return None
    return a["fn"]


def row_total(se: ScalarEmitter, r: ir.Operation, rowc, lane, tr: int, sg: int | None,
              p: int, workgroup: list) -> str:
    """Element ``rowc`` of ``poot.reduce`` ``r`` (:func:`reduce_kind` not None), held by
    every one of the ``tr`` threads that share the row (``lane`` = 0..tr-1; ``tr`` a multiple
    of ``sg``, or 1 without a subgroup size): each folds operand elements ``lane::tr`` of the
    row (evaluated by ``se``), then :func:`_block_combine` (``p`` numbers the reduction's
    workgroup buffer, appended to ``workgroup`` when the row spans several subgroups); a
    f16/bf16 result is accumulated in f32 and rounded once, as the linalg lowering does."""
    kind = reduce_kind(r)
    d = poot_type(r.operands[0]).dtype
    # booleans reduce as i32 0/1 (max = any, min = all): shuffles move words
    t = "i32" if d is DType.I1 else compute_type(d)
    k = poot_type(r.operands[0]).shape[-1]
    acc = _row_loop(se, r.operands[0], rowc, lane, k, tr, kind, t, widen=d is DType.I1)
    total = _block_combine(se, acc, kind, t, lane, tr, sg, p, workgroup)
    if d is DType.I1:
        return se.op(f"arith.trunci {total} : i32 to i1")
    return se.round_to(total, d) if d in HALF else total


#: independent accumulators per thread in a row loop (loads in flight): a loop whose every
#: iteration waits on its own load runs at memory latency, not bandwidth (an argmax over a
#: 128k vocabulary by 1024 threads took 38 us with one accumulator)
ROW_CHAINS = 8


def _row_loop(se: ScalarEmitter, x: ir.Value, rowc, lane, k: int, tr: int, kind: str,
              t: str, widen: bool = False) -> str:
    """This thread's fold of ``x[*rowc, lane::tr]`` (compute type ``t``; ``widen``: i1
    elements folded as i32 0/1), in ``V`` (at most :data:`ROW_CHAINS`) independent chains of
    consecutive lane rounds folded together at the end: the loads of one iteration do not
    wait on each other. (For max/min the result is the same in any order; a sum is
    reassociated, as any parallel reduction is.)"""
    em = se.em
    acc, c = em.fresh("acc"), em.fresh("col")
    init = em.const(int(kind == "min"), t) if widen else _identity(em, kind, t)
    rounds = -(-k // tr)
    V = next(v for v in (ROW_CHAINS, 4, 2, 1) if v <= max(1, rounds // 2))
    iters = -(-rounds // V)
    ragged = iters * V * tr != k
    # every lane runs the same whole number of iterations (a lane past the row's end would
    # otherwise run a zero-trip loop, whose result lavapipe's SPIR-V path got wrong); a column
    # past the end is clamped in range and folds the identity instead
    a = [em.fresh("a") for _ in range(V)]
    ts = ", ".join([t] * V)
    em.line(f"{acc}:{V} = scf.for {c} = {se.ix(0)} to {se.ix(iters)} step {se.ix(1)} "
            f"iter_args({', '.join(f'{ai} = {init}' for ai in a)}) -> ({ts}) {{")
    em.depth += 1
    out = []
    for j in range(V):
        with se.scope():
            col = se.iadd(se.iadd(se.imul(c, V * tr), j * tr), lane)
            if ragged:
                inside = se.op(f"arith.cmpi ult, {se.ix(col)}, {se.ix(k)} : index")
                col = se.op(f"arith.minui {se.ix(col)}, {se.ix(k - 1)} : index")
            v = se.value(x, list(rowc) + [col])
            if widen:
                v = em.op(f"arith.extui {v} : i1 to i32")
            if ragged:
                v = em.op(f"arith.select {inside}, {v}, {init} : {t}")
            out.append(_combine(em, kind, t, a[j], v))
    em.line(f"scf.yield {', '.join(out)} : {ts}")
    em.depth -= 1
    em.line("}")
    parts = [f"{acc}#{j}" for j in range(V)]
    while len(parts) > 1:
        parts = [_combine(em, kind, t, parts[i], parts[i + 1]) if i + 1 < len(parts)
                 else parts[i] for i in range(0, len(parts), 2)]
    return parts[0]


def _block_combine(se: ScalarEmitter, acc: str, kind: str, t: str, lane, tr: int,
                   sg: int | None, p: int, workgroup: list) -> str:
    """The row's total in every one of its ``tr`` threads (see the module doc)."""
    em = se.em
    width = min(sg or 1, tr)
    if sg:
        off = width // 2
        while off:
            s = em.fresh("sh")
            em.line(f"{s}, {em.fresh('ok')} = gpu.shuffle xor {acc}, "
                    f"{em.const(off, 'i32')}, {em.const(sg, 'i32')} : {t}")
            acc = _combine(em, kind, t, acc, s)
            off //= 2
    if tr <= width:
        return acc
    nparts = tr // width
    smem, mtype = f"%smem{p}", f"memref<{nparts}x{t}, #gpu.address_space<workgroup>>"
    workgroup.append((smem, mtype))
    if sg:
        # lane 0 of each subgroup publishes; everyone folds the partials in the same order
        lead = se.op(f"arith.cmpi eq, {se.ix(se.irem(lane, width))}, {se.ix(0)} : index")
        part = se.ix(se.idiv(lane, width))     # emitted (and memoized) outside the scf.if
        em.line(f"scf.if {lead} {{")
        em.line(f"  memref.store {acc}, {smem}[{part}] : {mtype}")
        em.line("}")
        em.line("gpu.barrier")
        total = None
        for i in range(nparts):
            x = em.op(f"memref.load {smem}[{se.ix(i)}] : {mtype}")
            total = x if total is None else _combine(em, kind, t, total, x)
        return total
    # no subgroup operations: a tree over workgroup memory
    em.line(f"memref.store {acc}, {smem}[{se.ix(lane)}] : {mtype}")
    s = tr // 2
    while s:
        em.line("gpu.barrier")
        act = em.op(f"arith.cmpi ult, {se.ix(lane)}, {se.ix(s)} : index")
        other = se.ix(se.iadd(lane, s))
        em.line(f"scf.if {act} {{")
        em.depth += 1
        a = em.op(f"memref.load {smem}[{se.ix(lane)}] : {mtype}")
        b = em.op(f"memref.load {smem}[{other}] : {mtype}")
        em.line(f"memref.store {_combine(em, kind, t, a, b)}, {smem}[{se.ix(lane)}] : {mtype}")
        em.depth -= 1
        em.line("}")
        s //= 2
    em.line("gpu.barrier")
    return em.op(f"memref.load {smem}[{se.ix(0)}] : {mtype}")


@register("rowreduce")
def rowreduce(fn: ir.Operation, caps):
    return synthesize_rowreduce(fn, caps)


__all__ = ["reduce_kind", "row_threads", "row_total", "synthesize_rowreduce"]
