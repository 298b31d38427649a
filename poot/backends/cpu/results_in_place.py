"""Dispatch results computed in their out-parameters, not copied there.

``buffer-results-to-out-params`` turns each function result into a caller-allocated
out-parameter filled by one ``memref.copy`` from the buffer the body computed into. For a
dispatch function that copy is pure overhead: every intermediate of the step was written
twice. In SmolLM2's batch-32 decode step on a 2-core Xeon VM the copies were 5-6% of the
step's samples (``__memmove``), all on the calling thread while the other thread waited (the
6.3 MB of logits alone were copied twice). MLIR's own ``hoist-static-allocs`` option does this
only where the copied value is the allocation itself and crashes where two results share one
(an output and a reshape of it).

:func:`write_results_in_place` rewrites, in each private function (the dispatch functions,
whose only caller is the step's entry, which allocates a fresh buffer for each result), the
pattern::

    %a = memref.alloc() : memref<S>                   %v = memref.collapse_shape %out R
    ... %a written (maybe through views) ...    ->    ... %v written ...
    %r = memref.expand_shape %a R  (optional)
    memref.copy %r, %out                              (no copy)

where ``%out`` is a block argument used by that copy alone and no use of ``%a`` (or of a view
of it) comes after the copy: ``%a`` becomes the out-parameter itself (or the inverse reshape
of it: ``collapse_shape`` for an ``expand_shape`` and the other way round, both exact on
identity layouts). Public functions keep their copies (a caller might bind an output to an
array that is also an input, which an early write would clobber), except the step's entry
when named: its callers (:meth:`CpuProgram.run <poot.backends.cpu.codegen.CpuProgram.run>`
allocates fresh outputs, :meth:`CpuDevice.record <poot.backends.cpu.runtime.CpuDevice.record>`
refuses an output sharing memory with another argument) never alias an out-parameter, and
its last copy was the whole logits again (6.3 MB a step at batch 32, serial). Run after
``buffer-results-to-out-params`` and before the deallocation pipeline (the allocation
removed had no dealloc yet).
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import memref

_VIEWS = ("memref.expand_shape", "memref.collapse_shape")


def _top_level(op: ir.Operation, block: ir.Block) -> ir.Operation | None:
    """The ancestor of ``op`` (itself included) that sits directly in ``block``."""
    while op is not None:
        parent = op.parent
        if parent is None:
            return None
        if op.block == block:
            return op
        op = parent
    return None


def _op(x) -> ir.Operation | None:
    """``x`` as an :class:`ir.Operation` (None for a block, an argument's owner)."""
    if isinstance(x, ir.OpView):
        return x.operation
    return x if isinstance(x, ir.Operation) else None


def _users(v: ir.Value) -> list[ir.Operation]:
    return [_op(u.owner) for u in v.uses]


def _rewrite(copy: ir.Operation, block: ir.Block, order: dict) -> bool:
    src, dst = copy.operands[0], copy.operands[1]
    if not isinstance(dst, ir.BlockArgument) or dst.owner != block or len(_users(dst)) != 1:
        return False
    view = None
    root = _op(src.owner)
    if root is not None and root.name in _VIEWS:
        view = root
        root = _op(view.operands[0].owner)
    if root is None or root.name != "memref.alloc" or len(root.operands) \
            or root.block != block:
        return False
    alloc_t = root.results[0].type
    if not alloc_t.has_static_shape or ir.AffineMapAttr(alloc_t.layout).value != ir.AffineMap.get_identity(alloc_t.rank):
        return False
    # every use of the allocation (and of its views) before the copy, none after
    at = order[copy]
    values = [root.results[0]]
    for u in _users(root.results[0]):
        if u.name in _VIEWS:
            values.append(u.results[0])
    for v in values:
        for u in _users(v):
            if u == copy or (view is not None and u == view):
                continue
            top = _top_level(u, block)
            if top is None or order.get(top, at + 1) >= at:
                return False
    with ir.InsertionPoint(root), root.location:
        if view is None:
            new = dst
        elif view.name == "memref.expand_shape":      # %a = collapse_shape %out
            new = memref.CollapseShapeOp(alloc_t, dst, view.attributes["reassociation"]).result
        else:                                         # %a = expand_shape %out
            new = memref.ExpandShapeOp(alloc_t, dst, view.attributes["reassociation"], [],
                                       ir.DenseI64ArrayAttr.get(alloc_t.shape)).result
    copy.erase()
    if view is not None and not list(view.results[0].uses):
        view.erase()
    root.results[0].replace_all_uses_with(new)
    root.erase()
    return True


def write_results_in_place(module: ir.Module, entry: str | None = None) -> int:
    """Drop the result copies of private functions and of the function named ``entry``, whose
    out-parameters its callers never alias (module doc). Returns how many."""
    done = 0
    for f in module.body.operations:
        f = f.operation
        if f.name != "func.func" or not f.regions[0].blocks:
            continue
        vis = f.attributes["sym_visibility"] if "sym_visibility" in f.attributes else None
        name = ir.StringAttr(f.attributes["sym_name"]).value
        if name != entry and (vis is None or ir.StringAttr(vis).value != "private"):
            continue
        block = f.regions[0].blocks[0]
        ops = [op.operation for op in block.operations]
        order = {op: i for i, op in enumerate(ops)}
        for op in ops:
            if op.name == "memref.copy" and _rewrite(op, block, order):
                done += 1
    return done


__all__ = ["write_results_in_place"]
