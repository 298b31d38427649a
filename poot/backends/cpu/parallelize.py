"""Row-parallel elementwise work: the large ``linalg.generic`` ops at the top of a dispatch
function spread over the kernels' threads.

The matmul and attention kernels emit their own ``scf.forall`` row loops; everything else a
dispatch computes on tensors (a matmul's fused epilogue such as ``silu(gate) * up``, a
residual add, RMSNorm's scaling, RoPE's rotation, a cast into the KV cache) lowers to
sequential loops on the calling thread while the other threads wait at the next parallel
region. In SmolLM2's batch-32 decode step on a 2-core Xeon VM that was a third of the main
thread's time (``perf``: the OpenMP worker idled in ``__kmp_wait_template`` 38% of the step).

:func:`parallelize_row_loops` tags each such op and tiles it with the transform dialect's
``transform.structured.tile_using_forall`` into ``threads`` chunks of its outermost parallel
loop (``num_threads``; the other loops stay whole in every chunk). After bufferization the
``scf.forall`` becomes ``scf.parallel`` and then an OpenMP worksharing loop like the kernels'.

Which ops: a ``linalg.generic`` directly in a dispatch function's body (not inside a kernel's
loops), on tensors, whose outermost parallel loop has a static extent of at least
``threads`` and whose iteration space has at least :data:`MIN_ELEMENTS` points (below that
the fork and join cost more than the loop: a batch-1 decode step keeps its loops
sequential). Only where each point is computed changes, not how: every element and every row
reduction (the loop tiled is a parallel one) gets the same bits as the sequential loop, so
results do not depend on the thread count or the batch (the engine's batch invariance).
"""

from __future__ import annotations

from mlir import ir

from poot.backends.cpu.transform_script import ANY_OP, run_transform

#: the attribute naming an op to tile (its value: the ``num_threads`` list)
PARALLEL_TILES = "poot.parallel_tiles"
#: fewest iteration points worth a parallel region (two 2-core fork/joins cost ~2-4 us, a
#: sequential elementwise pass over 16 Ki f32 about 5-15 us)
MIN_ELEMENTS = 16384


def loop_extents(op: ir.Operation) -> list[int | None]:
    """The static extent of each loop of a ``linalg.generic`` (None where no operand dimension
    is indexed by that loop alone, or the dimension is dynamic)."""
    iters = ir.ArrayAttr(op.attributes["iterator_types"])
    ext: list[int | None] = [None] * len(iters)
    maps = ir.ArrayAttr(op.attributes["indexing_maps"])
    for value, amap in zip(op.operands, maps):
        if not isinstance(value.type, ir.RankedTensorType):
            continue
        shape = value.type.shape
        for r, expr in enumerate(ir.AffineMapAttr(amap).value.results):
            if isinstance(expr, ir.AffineDimExpr):
                d = expr.position
                if ext[d] is None and shape[r] != ir.ShapedType.get_dynamic_size():
                    ext[d] = shape[r]
    return ext


def _tiles(op: ir.Operation, threads: int) -> str | None:
    """The ``num_threads`` list for ``op`` ("0, ..., threads"), or None to leave it alone."""
    if op.name != "linalg.generic" or not op.results or not all(
            isinstance(r.type, ir.RankedTensorType) for r in op.results):
        return None
    iters = [str(a) for a in ir.ArrayAttr(op.attributes["iterator_types"])]
    ext = loop_extents(op)
    if any(e is None for e in ext):
        return None
    points = 1
    for e in ext:
        points *= e
    if points < MIN_ELEMENTS:
        return None
    for d, (it, e) in enumerate(zip(iters, ext)):
        if "parallel" not in it:
            return None     # a reduction outermost: keep it whole (no partial results)
        if e >= threads:
            return ", ".join(["0"] * d + [str(threads)])
    return None


def parallelize_row_loops(module: ir.Module, threads: int) -> int:
    """Tile the large elementwise and row-wise ``linalg.generic`` ops at the top of each
    dispatch function (``poot.dispatch``) into ``threads`` ``scf.forall`` chunks of their
    outermost parallel loop (module doc). On tensors, before bufferization; ``threads`` < 2
    does nothing. Returns how many ops were tiled."""
    if threads < 2:
        return 0
    tags: dict[str, int] = {}
    for f in module.body.operations:
        f = f.operation
        if f.name != "func.func" or "poot.dispatch" not in f.attributes or not f.regions[0].blocks:
            continue
        for op in f.regions[0].blocks[0].operations:
            op = op.operation
            t = _tiles(op, threads)
            if t is not None:
                op.attributes[PARALLEL_TILES] = ir.StringAttr.get(t)
                tags[t] = tags.get(t, 0) + 1
    if not tags:
        return 0
    any_op = ANY_OP
    lines = []
    for i, tag in enumerate(sorted(tags)):
        lines += [f"%m{i} = transform.structured.match ops{{[\"linalg.generic\"]}} "
                  f"attributes {{{PARALLEL_TILES} = \"{tag}\"}} in %root : ({any_op}) -> {any_op}",
                  f"%t{i}, %f{i} = transform.structured.tile_using_forall %m{i} "
                  f"num_threads [{tag}] : ({any_op}) -> ({any_op}, {any_op})"]
    run_transform(module, lines)
    with module.context:
        def clear(op):
            op = op.operation
            if PARALLEL_TILES in op.attributes:
                del op.attributes[PARALLEL_TILES]
            return ir.WalkResult.ADVANCE

        module.operation.walk(clear)
    return sum(tags.values())


__all__ = ["MIN_ELEMENTS", "PARALLEL_TILES", "loop_extents", "parallelize_row_loops"]
