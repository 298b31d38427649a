"""Results computed in the caller's buffer: no copy into the out-parameter.

``buffer-results-to-out-params`` turns each function result into an argument the caller
allocates and fills it with one ``memref.copy`` before the return. On the CPU every
dispatch function (a matmul's ``[B, N]`` output, the step's ``[B, V]`` logits) then computes
its result into a buffer of its own and copies it out on one thread, while the other
threads wait: a B = 32 SmolLM2 decode step copied ~26 MB that way. The pass's
``hoist-static-allocs`` option would write in place, but only where the returned value is
the allocation itself (a matmul returns a reshape of it) and it crashes when two results
share one allocation.

:func:`write_results_in_place` rewrites, in every function, each final ``memref.copy`` of a
buffer the function allocated itself (at its top level, with an identity layout; looking
through ``memref.expand_shape`` / ``collapse_shape`` views of it) into an out-parameter:
the allocation becomes the out-parameter, viewed in its shape, and the copy goes. The
values are the same; only where they are written changes.
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import memref

_VIEWS = ("memref.expand_shape", "memref.collapse_shape")


def _identity_layout(t: ir.MemRefType) -> bool:
    return t.layout == ir.AffineMapAttr.get(ir.AffineMap.get_identity(t.rank))


def _source_alloc(v: ir.Value, body: ir.Block):
    """(the ``memref.alloc`` op behind ``v``, the view ops from it to ``v``, outermost
    last), or None: ``v`` must be an allocation in ``body`` (the function's top level) seen
    through expand/collapse views only."""
    views = []
    while not isinstance(v.owner, ir.Block) and v.owner.operation.name in _VIEWS:
        views.append(v.owner.operation)
        v = v.owner.operation.operands[0]
    if isinstance(v.owner, ir.Block):
        return None
    op = v.owner.operation
    if op.name != "memref.alloc" or len(op.operands) or op.parent != body.owner or \
            not _identity_layout(ir.MemRefType(v.type)):
        return None
    return op, views[::-1]


def _inverse_view(dst: ir.Value, views: list[ir.Operation]) -> ir.Value:
    """``dst`` (the type of the last view's result) seen as the allocation: each view
    undone, last first (an expand by the collapse of the same reassociation and back)."""
    for view in reversed(views):
        src_t = ir.MemRefType(view.operands[0].type)
        assoc = ir.ArrayAttr(view.attributes["reassociation"])
        groups = [[ir.IntegerAttr(i).value for i in ir.ArrayAttr(g)] for g in assoc]
        if view.name == "memref.expand_shape":
            dst = memref.CollapseShapeOp(src_t, dst, groups).result
        else:
            dst = memref.ExpandShapeOp(src_t, dst, groups, [], list(src_t.shape)).result
    return dst


def write_results_in_place(module: ir.Module) -> int:
    """Replace each ``memref.copy`` of a function's own top-level allocation (or a reshaped
    view of it) into one of its arguments, just before the return, by computing into that
    argument (module doc). Run after ``buffer-results-to-out-params`` and before
    deallocation is planned. Returns how many copies were removed."""
    done = 0
    with module.context, ir.Location.unknown():
        for fn in module.body.operations:
            fn = fn.operation
            if fn.name != "func.func" or not len(fn.regions[0].blocks):
                continue
            body = fn.regions[0].blocks[0]
            ops = [o.operation for o in body.operations]
            args = list(body.arguments)
            if not ops or ops[-1].name != "func.return":
                continue
            copies = []
            for op in reversed(ops[:-1]):
                if op.name != "memref.copy":
                    break
                copies.append(op)
            for op in copies:
                src, dst = op.operands[0], op.operands[1]
                if dst not in args:
                    continue
                found = _source_alloc(src, body)
                if found is None:    # (a second copy of one allocation: now a view of
                    continue         # the first out-parameter, copied as before)
                alloc, views = found
                if ir.MemRefType(dst.type).shape != ir.MemRefType(src.type).shape:
                    continue
                with ir.InsertionPoint(alloc):
                    here = _inverse_view(dst, views)
                alloc.results[0].replace_all_uses_with(here)
                op.erase()
                alloc.erase()
                done += 1
    return done


__all__ = ["write_results_in_place"]
