"""Strategy ``rowreduce``: a region of last-axis reductions over elementwise-computed rows,
followed by elementwise consumers (RMSNorm ``x * rsqrt(mean(x^2) + eps) * w``, softmax
``exp(x - max) / sum``, LayerNorm's mean and variance), becomes ONE kernel.

Matches: every op is a ``poot.reduce`` or computed per element
(:func:`~poot.backends.gpu.strategies.pointwise.per_element`); every reduce has the same
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

Long rows (:func:`split_count`): one block per row leaves the target's other cores idle when
there are few rows, and a long row is then a latency-bound stream through one core (the greedy
sampler's argmax over a 128256-wide vocabulary, one row: 28.6 us on an H200 in one block;
49152 wide: 10 us). When rows are at least :data:`SPLIT_MIN_K` long (below that the split's
two or three launches of ~2.5 us each, and the horizontal fusion with a sibling reduction a
split dispatch gives up, cost about what the one block saves) and ``S = min(MAX_SPLIT,
cores // rows, K // SPLIT_MIN_SLICE)`` is at least 2, each row is cut into ``S`` slices of
``W`` columns (a multiple of :data:`SLICE_ALIGN`; the last may be short) and the region
becomes several launches. Reductions are grouped by *level* (0 when a reduction's operand
reads no other reduction, else one past the levels it reads: an argmax's ``max`` and a
non-finite ``any`` share level 0, its ``min`` over ``select(x == max, iota, K)`` is level 1).
Launch ``l`` (grid ``rows * S``, block ``(row, slice)``) first folds, in every thread, the
``S`` partials of every reduction of a lower level from scratch in slice order (so every
block of every launch holds the same bits, identical to the one-kernel total for max/min/
any/all; a sum is reassociated), then folds its slice of each level-``l`` reduction with the
same loop and block combine as above, and thread 0 writes the partials to scratch
(``[rows * S]`` of the accumulation type: f32, or i32 for i32 and booleans). The last launch
folds every total the same way and writes the outputs: row-shaped ones over the slices (grid
``rows * S``), row-scalar ones by thread 0 of the row's first block (a grid of one block a
row when there are no row-shaped outputs). A region whose split form cannot be emitted falls
back to the one kernel. ``POOT_GPU_ROWSPLIT=0`` turns the split off (to compare). A split
dispatch is several launches, so horizontal fusion does not take it.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlir import ir

from poot.backends.gpu.kernels import Launch
from poot.backends.gpu.strategies.emit import (
    KernelEmitter,
    ScalarEmitter,
    ScalarUnsupported,
    Synthesized,
    buffer_type,
    gpu_kernel,
    gpu_module,
    one_kernel_module,
    poot_type,
    small_reduction,
)
from poot.backends.gpu.strategies.pointwise import body_ops, per_element, results
from poot.dialects.lowering.emit import HALF, compute_type
from poot.dialects.lowering.reduce import _combine, _identity
from poot.dialects.opdef import lookup, read_attrs
from poot.dialects.types import DType, TensorType
from poot import settings

#: most threads one row gets
MAX_ROW_THREADS = 1024
#: threads of a block holding several short rows
MULTI_ROW_BLOCK = 256
#: fewest elements per thread before a row gets more threads
MIN_PER_THREAD = 4
#: shortest row split across blocks (see the module doc: ``Long rows``)
SPLIT_MIN_K = 65536
#: fewest columns of one slice
SPLIT_MIN_SLICE = 4096
#: most slices (blocks) per row
MAX_SPLIT = 32
#: a slice's width is a multiple of this many columns (256-byte aligned f32 slices)
SLICE_ALIGN = 64
#: set to ``0`` to keep every region in one kernel (to compare)
SPLIT_ENV = "POOT_GPU_ROWSPLIT"


def _prod(s) -> int:
    n = 1
    for d in s:
        n *= d
    return n


def _row_provider(provided: dict, pending, rowc: list):
    """The scalar emitter's hook for a row kernel: a reduction's value from ``provided`` (its
    total, read at the row ``rowc`` only: the coordinates are checked when emitted); a
    ``pending`` one (not computed yet) refuses; anything else is computed as usual."""
    def provide(v, idx):
        if v in provided:
            if tuple(idx) != tuple(rowc):
                raise ScalarUnsupported("a reduction result read at another row")
            return provided[v]
        if v in pending:
            raise ScalarUnsupported("a reduction result read before it is computed")
        return None
    return provide


def row_threads(k: int, sg: int | None) -> int:
    """Threads per row: the subgroup size (1 without one) doubled while each thread keeps at
    least :data:`MIN_PER_THREAD` elements, at most :data:`MAX_ROW_THREADS`."""
    t = sg or 1
    while t * 2 <= MAX_ROW_THREADS and t * 2 * MIN_PER_THREAD <= k:
        t *= 2
    return t


@dataclass
class _Region:
    """A matched region: its reductions (program order) over rows of ``k`` elements
    (``rows_shape``, ``n_rows`` of them); its results ``outs`` of poot types ``types``, the
    indices of the row-shaped ones (``row_outs``) and of the row-scalar ones
    (``scalar_outs``)."""

    reduces: list
    k: int
    rows_shape: tuple
    n_rows: int
    outs: list
    types: list
    row_outs: list[int]
    scalar_outs: list[int]


def _match(fn: ir.Operation) -> _Region | None:
    """The region ``fn`` as :class:`_Region`, or None (see the module doc's Matches)."""
    ops = body_ops(fn)
    # (a reduction computed per element, as the MoE top-k sum feeding a norm, is no row's)
    reduces = [o for o in ops if o.name == "poot.reduce" and not per_element_reduction(o)]
    if not reduces or any(o not in reduces and not per_element(o) for o in ops):
        return None
    x0 = poot_type(reduces[0].operands[0])
    if not isinstance(x0, TensorType) or x0.rank < 1:
        return None
    shape = x0.shape
    k, rows_shape = shape[-1], tuple(shape[:-1])
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
    return _Region(reduces, k, rows_shape, n_rows, outs, types, row_outs, scalar_outs)


def synthesize_rowreduce(fn: ir.Operation, caps, name: str = "rowreduce"):
    """The kernels of a row-reduction region, or None (see the module doc): the split
    launches when :func:`split_count` says so, else ONE kernel."""
    m = _match(fn)
    if m is None:
        return None
    s = split_count(m.n_rows, m.k, caps.cores)
    if s > 1:
        got = _synthesize_split(fn, m, caps, name, s)
        if got is not None:
            return got
    return _synthesize_one(fn, m, caps, name)


def _synthesize_one(fn: ir.Operation, m: _Region, caps, name: str):
    """The one-kernel form of region ``m`` (a block of ``TR`` threads per row, or ``RB``
    rows per block), or None."""
    reduces, k, rows_shape, n_rows = m.reduces, m.k, m.rows_shape, m.n_rows
    outs, types, row_outs, scalar_outs = m.outs, m.types, m.row_outs, m.scalar_outs
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
    se.provide = _row_provider(provided, pending, rowc)
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
                _scalar_outputs(se, em, m, out_names, row, first)
        if guarded:
            em.depth -= 1
            em.line("}")
    except ScalarUnsupported:
        return None
    text, slots = one_kernel_module(name, se, [(o, buffer_type(t))
                                               for o, t in zip(out_names, types)], workgroup)
    grid = (n_rows + rb - 1) // rb
    launch = Launch("kernel", slots, name, "k", (grid, 1, 1), (rb * tr, 1, 1), strategy=name)
    return Synthesized(text, [launch], consts=list(se.consts))


def _scalar_outputs(se: ScalarEmitter, em: KernelEmitter, m: _Region, out_names, row,
                    first: str) -> None:
    """Store the row-scalar outputs of row ``row`` from the one thread where ``first``
    (an i1) holds."""
    em.line(f"scf.if {first} {{")
    em.depth += 1
    with se.scope():
        for j in m.scalar_outs:
            idx = se.delinearize(row, m.types[j].shape)
            se.store(se.value(m.outs[j], idx), out_names[j], m.types[j], idx)
    em.depth -= 1
    em.line("}")


def _row_outputs(se: ScalarEmitter, em: KernelEmitter, outs, types, out_names, row_outs,
                 orows: dict, lane, k: int, tr: int, base=None, span: int = 0) -> None:
    """Store the row outputs ``row_outs`` (elementwise over the row's ``k`` columns, each
    thread columns ``lane::tr``; with ``base``, only the slice of ``span`` columns from
    column ``base``, see :func:`_slice_end`): ``V`` (at most :data:`ROW_CHAINS`) columns an
    iteration, all their values computed before any is stored. Why: an output written in
    place over an input it reads (a sampler's token-history row) cannot have its loads moved
    past its stores by the compiler, so one column at a time each iteration waits on its load
    (a 128k-column history update by 1024 threads took most of a 40 us argmax kernel).
    Assumes, as the block's threads already do (they run these columns concurrently), that
    an output written in place reads its input at its own column only: an in-place output
    that read other columns of its input (a shifted row) would race either way; the plan
    does not check that today."""
    V, iters, ragged, end = _row_rounds(se, k, tr, base, span)
    c = em.fresh("it")
    em.line(f"scf.for {c} = {se.ix(0)} to {se.ix(iters)} step {se.ix(1)} {{")
    em.depth += 1
    with se.scope():
        vals = []
        for v in range(V):
            rel = se.iadd(se.iadd(se.imul(c, V * tr), v * tr), lane)
            col, inside = _column(se, rel, k, ragged, base, end)
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


def per_element_reduction(r: ir.Operation) -> bool:
    """Whether ``poot.reduce`` ``r`` is no row reduction (:func:`reduce_kind` None) but small
    enough for the scalar emitter to compute per element (:func:`~.emit.small_reduction`:
    a MoE layer's sum over its top-k rows). Strategies with a row-reduction hook leave such a
    reduction to the emitter instead of refusing the region."""
    return r.name == "poot.reduce" and reduce_kind(r) is None and small_reduction(r)


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
    t = _acc_type(r)            # booleans reduce as i32 0/1 (max = any, min = all)
    k = poot_type(r.operands[0]).shape[-1]
    acc = _row_loop(se, r.operands[0], rowc, lane, k, tr, kind, t, widen=d is DType.I1)
    return _finish(se, _block_combine(se, acc, kind, t, lane, tr, sg, p, workgroup), d)


def _acc_type(r: ir.Operation) -> str:
    """The type reduction ``r`` accumulates in: f32 for floats (f16/bf16 too), i32 for i32
    and for booleans (0/1: shuffles and partial buffers move words)."""
    d = poot_type(r.operands[0]).dtype
    return "i32" if d is DType.I1 else compute_type(d)


def _finish(se: ScalarEmitter, total: str, d: DType) -> str:
    """A reduction's accumulated ``total`` (:func:`_acc_type`) as its result element of
    dtype ``d`` in compute type: i1 from 0/1, f16/bf16 rounded once."""
    if d is DType.I1:
        return se.op(f"arith.trunci {total} : i32 to i1")
    return se.round_to(total, d) if d in HALF else total


#: independent accumulators per thread in a row loop (loads in flight): a loop whose every
#: iteration waits on its own load runs at memory latency, not bandwidth (an argmax over a
#: 128k vocabulary by 1024 threads took 38 us with one accumulator)
ROW_CHAINS = 8


def _row_loop(se: ScalarEmitter, x: ir.Value, rowc, lane, k: int, tr: int, kind: str,
              t: str, widen: bool = False, base=None, span: int = 0) -> str:
    """This thread's fold of ``x[*rowc, lane::tr]`` (compute type ``t``; ``widen``: i1
    elements folded as i32 0/1; with ``base``, of the slice of ``span`` columns from column
    ``base`` only, see :func:`_slice_end`), in ``V`` (at most :data:`ROW_CHAINS`) independent
    chains of consecutive lane rounds folded together at the end: the loads of one iteration do not
    wait on each other. (For max/min the result is the same in any order; a sum is
    reassociated, as any parallel reduction is.)"""
    em = se.em
    acc, c = em.fresh("acc"), em.fresh("col")
    init = em.const(int(kind == "min"), t) if widen else _identity(em, kind, t)
    V, iters, ragged, end = _row_rounds(se, k, tr, base, span)
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
            rel = se.iadd(se.iadd(se.imul(c, V * tr), j * tr), lane)
            col, inside = _column(se, rel, k, ragged, base, end)
            v = se.value(x, list(rowc) + [col])
            if widen:
                v = em.op(f"arith.extui {v} : i1 to i32")
            if inside is not None:
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


def _row_rounds(se: ScalarEmitter, k: int, tr: int, base, span):
    """``(V, iters, ragged, end)`` of a walk by ``tr`` threads over a row of ``k`` columns
    (or, with ``base``, its slice of ``span`` columns): ``V`` (at most :data:`ROW_CHAINS`)
    lane rounds an iteration, ``iters`` iterations, whether the last round runs past the
    row's end, and the slice's end (:func:`_slice_end`; None for a whole row)."""
    n = k if base is None else span
    rounds = -(-n // tr)
    V = next(v for v in (ROW_CHAINS, 4, 2, 1) if v <= max(1, rounds // 2))
    iters = -(-rounds // V)
    end = None if base is None else _slice_end(se, base, span, k)
    return V, iters, iters * V * tr != k, end


def _slice_end(se: ScalarEmitter, base, span: int, k: int) -> str:
    """``min(base + span, k)``: the end of the row slice from column ``base`` (an index SSA
    name), emitted before the loop over it."""
    return se.op(f"arith.minui {se.ix(se.iadd(base, span))}, {se.ix(k)} : index")


def _column(se: ScalarEmitter, rel, k: int, ragged: bool, base=None, end=None):
    """``(column, inside)`` of loop position ``rel``: the column (``base + rel`` in a slice),
    clamped into the row when it may fall past the row's (or the slice's) end, and the i1
    ``inside`` saying it did not (None when it cannot). A slice's every position is checked:
    its last round may run into the next slice."""
    if base is None:
        col = rel
        if not ragged:
            return col, None
        inside = se.op(f"arith.cmpi ult, {se.ix(col)}, {se.ix(k)} : index")
    else:
        # clamped into its own slice: the next slice's columns may be written in place by
        # another block of the same launch (a sampler's token-history row)
        col = se.iadd(base, rel)
        inside = se.op(f"arith.cmpi ult, {se.ix(col)}, {end} : index")
        last = se.op(f"arith.subi {end}, {se.ix(1)} : index")
        return se.op(f"arith.minui {se.ix(col)}, {last} : index"), inside
    col = se.op(f"arith.minui {se.ix(col)}, {se.ix(k - 1)} : index")
    return col, inside


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


# ---- long rows: each row split across blocks ------------------------------------------------

def split_count(n_rows: int, k: int, cores: int) -> int:
    """Slices per row (1: the one-kernel form): ``min(MAX_SPLIT, cores // n_rows,
    k // SPLIT_MIN_SLICE)`` when rows are at least :data:`SPLIT_MIN_K` long and that is at
    least 2 (so only when fewer rows than half the target's cores); 1 when
    ``POOT_GPU_ROWSPLIT=0``."""
    if not settings.get_flag(SPLIT_ENV) or k < SPLIT_MIN_K or n_rows < 1:
        return 1
    s = min(MAX_SPLIT, max(1, cores) // n_rows, k // SPLIT_MIN_SLICE)
    return s if s >= 2 else 1


def _levels(reduces: list) -> list[int]:
    """Launch of each reduction (program order) in the split form: 0 when its operand
    reads no other reduction's result, else one after the latest launch of those it reads
    (walking the operand's producers back to the arguments). Reductions that do not read
    each other (an argmax's max and a non-finite ``any``) share a launch."""
    ids = {r.results[0]: q for q, r in enumerate(reduces)}
    memo: dict = {}

    def reads(v) -> frozenset:
        if v in memo:
            return memo[v]
        if v in ids:
            got = frozenset([ids[v]])
        elif isinstance(v.owner, ir.Block):
            got = frozenset()
        else:
            op = v.owner.operation if hasattr(v.owner, "operation") else v.owner
            got = frozenset().union(*(reads(o) for o in op.operands))
        memo[v] = got
        return got

    levels: list[int] = []
    for r in reduces:
        levels.append(1 + max((levels[q] for q in reads(r.operands[0])), default=-1))
    return levels


class _SplitKernel:
    """One kernel of the split form being emitted: blocks ``row * parts + part`` (``parts``
    blocks per row), every thread holding the totals of the reductions ``known`` (folded
    from their partials, :func:`_fold_partials`); any other reduction result read raises
    :class:`ScalarUnsupported`. ``shared``: the emitter whose constant buffers it shares."""

    def __init__(self, fn, m: _Region, known: list[int], parts: int, S: int,
                 shared: ScalarEmitter | None):
        self.em = em = KernelEmitter()
        self.se = se = ScalarEmitter(fn, em)
        if shared is not None:
            se.share_consts(shared)
        em.line("%tid = gpu.thread_id x")
        em.line("%bid = gpu.block_id x")
        self.row, self.part = se.idiv("%bid", parts), se.irem("%bid", parts)
        self.rowc = se.delinearize(self.row, m.rows_shape)
        self.workgroup: list[tuple[str, str]] = []
        provided = {m.reduces[q].results[0]: _fold_partials(se, m, q, self.row, S)
                    for q in known}
        # every reduction not yet provided is pending (it is read by a later launch)
        se.provide = _row_provider(provided, {r.results[0] for r in m.reduces}, self.rowc)


def _scratch_type(m: _Region, q: int, S: int) -> str:
    """Partials of reduction ``q``: ``[n_rows * S]`` of its accumulation type, row-major
    (row, slice)."""
    return f"memref<{m.n_rows * S}x{_acc_type(m.reduces[q])}>"


def _fold_partials(se: ScalarEmitter, m: _Region, q: int, row, S: int) -> str:
    """The total of reduction ``q`` at ``row``: its ``S`` partials (scratch ``%scr{q}``)
    folded in slice order by every thread, so every block of every launch holds the same
    bits; finished as :func:`row_total` finishes it."""
    r, em = m.reduces[q], se.em
    t, mt = _acc_type(r), _scratch_type(m, q, S)
    total = None
    for i in range(S):
        x = em.op(f"memref.load %scr{q}[{se.ix(se.iadd(se.imul(row, S), i))}] : {mt}")
        total = x if total is None else _combine(em, reduce_kind(r), t, total, x)
    return _finish(se, total, poot_type(r.operands[0]).dtype)


def _synthesize_split(fn: ir.Operation, m: _Region, caps, name: str, S: int):
    """The split form of region ``m`` (``S`` slices a row, see the module doc): one launch
    per :func:`_levels` level writing its reductions' per-slice partials to scratch, then
    the output launch; a :class:`Synthesized` of several launches, or None."""
    sg = caps.subgroup_size
    w = -(-(-(-m.k // S)) // SLICE_ALIGN) * SLICE_ALIGN      # columns a slice, aligned
    S = -(-m.k // w)
    if S < 2:
        return None
    tr = row_threads(w, sg)
    levels = _levels(m.reduces)
    # partials are f32 or i32: 4 bytes each
    scratch = [(_scratch_type(m, q, S), m.n_rows * S * 4) for q in range(len(m.reduces))]
    scr_params = [(f"%scr{q}", t) for q, (t, _) in enumerate(scratch)]
    scr_slots = [("scratch", q) for q in range(len(scratch))]
    kernels, launches, shared = [], [], None
    out_names = [f"%out{j}" for j in range(len(m.outs))]
    try:
        for lev in range(max(levels) + 1):
            kn = _SplitKernel(fn, m, [q for q in range(len(levels)) if levels[q] < lev],
                              S, S, shared)
            shared = shared or kn.se
            _split_partials(kn, m, [q for q in range(len(levels)) if levels[q] == lev],
                            S, w, tr, sg)
            kernels.append(gpu_kernel(f"p{lev}", kn.se.buffer_params() + scr_params,
                                      kn.em.text(), kn.workgroup))
            slots = kn.se.buffer_slots() + scr_slots
            launches.append(Launch("kernel", slots, name, f"p{lev}", (m.n_rows * S, 1, 1),
                                   (tr, 1, 1), strategy=name))
        parts = S if m.row_outs else 1
        tro = tr if m.row_outs else (sg or 1)
        kn = _SplitKernel(fn, m, list(range(len(levels))), parts, S, shared)
        _split_outputs(kn, m, out_names, parts, w, tro)
    except ScalarUnsupported:
        return None
    params = kn.se.buffer_params() + scr_params + \
        [(o, buffer_type(t)) for o, t in zip(out_names, m.types)]
    kernels.append(gpu_kernel("out", params, kn.em.text()))
    slots = kn.se.buffer_slots() + scr_slots + [("out", j) for j in range(len(m.outs))]
    launches.append(Launch("kernel", slots, name, "out", (m.n_rows * parts, 1, 1),
                           (tro, 1, 1), strategy=name))
    return Synthesized(gpu_module(name, kernels), launches, scratch, list(shared.consts))


def _split_partials(kn: _SplitKernel, m: _Region, qs: list[int], S: int, w: int, tr: int,
                    sg: int | None) -> None:
    """Block ``(row, part)`` folds columns ``[part * w, min((part + 1) * w, k))`` of each
    reduction in ``qs`` (:func:`_row_loop` over the slice, :func:`_block_combine`), then
    thread 0 writes the partials to ``%scr{q}[row * S + part]``. Every thread reaches every
    barrier and shuffle: only the final stores are guarded."""
    se, em = kn.se, kn.em
    base = se.imul(kn.part, w)
    got = []
    for q in qs:
        r = m.reduces[q]
        kind, t = reduce_kind(r), _acc_type(r)
        widen = poot_type(r.operands[0]).dtype is DType.I1
        acc = _row_loop(se, r.operands[0], kn.rowc, "%tid", m.k, tr, kind, t, widen,
                        base=base, span=w)
        got.append((q, _block_combine(se, acc, kind, t, "%tid", tr, sg, q, kn.workgroup)))
    slot = se.ix(se.iadd(se.imul(kn.row, S), kn.part))
    first = se.op(f"arith.cmpi eq, %tid, {se.ix(0)} : index")
    em.line(f"scf.if {first} {{")
    for q, p in got:
        em.line(f"  memref.store {p}, %scr{q}[{slot}] : {_scratch_type(m, q, S)}")
    em.line("}")


def _split_outputs(kn: _SplitKernel, m: _Region, out_names, parts: int, w: int,
                   tr: int) -> None:
    """The output launch's body: block ``(row, part)`` writes the row-shaped outputs over
    its slice of columns (``parts`` = S; :func:`_row_outputs`), thread 0 of the row's first
    block the row-scalar ones."""
    se, em = kn.se, kn.em
    if m.row_outs:
        orows = {j: se.delinearize(kn.row, m.types[j].shape[:-1]) for j in m.row_outs}
        _row_outputs(se, em, m.outs, m.types, out_names, m.row_outs, orows, "%tid", m.k, tr,
                     base=se.imul(kn.part, w), span=w)
    if m.scalar_outs:
        lead = se.iadd(se.imul(kn.part, tr), "%tid")      # 0 only at thread 0 of part 0
        first = se.op(f"arith.cmpi eq, {se.ix(lead)}, {se.ix(0)} : index")
        _scalar_outputs(se, em, m, out_names, kn.row, first)


def rowreduce(fn: ir.Operation, caps):
    return synthesize_rowreduce(fn, caps)


__all__ = ["reduce_kind", "row_threads", "row_total", "split_count", "synthesize_rowreduce"]
