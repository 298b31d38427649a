"""Hoist a kernel's loads of the step's constants above its grid dependency wait.

Programmatic dependent launch (:func:`poot.backends.cuda.codegen.add_grid_dependency_control`)
makes a kernel's blocks resident while its predecessor still runs, and has them wait
(``griddepcontrol.wait``) before touching memory. The step's constants (weights, LoRA slots,
the plan's constant buffers) are written by no kernel of the step, so reading them need not
wait: a load of one whose address is known at the top of the kernel (index arithmetic of
thread and block ids and constants) is moved before the wait, and its DRAM latency overlaps
the predecessor instead of following it. What this is for: the straight-line small
contractions of a LoRA expand (16 ranks of ``B[r, n]`` an element, read after the wait they
were one more DRAM round trip on the critical path of every kernel holding one).

A load inside an ``scf.if`` (a bounds check) or a loop of at most one trip is speculated:
its indices are clamped to the memref's static shape (``arith.minui i, dim - 1``), so the
hoisted load is always in bounds and its value is used only where the branch would have read
it. Loads inside other loops stay where they are (their addresses change with the loop). At
most ``limit`` loads are hoisted above one wait (each holds a register across it). A
horizontally fused kernel waits in each member's branch: each member's loads go above its
own wait.
"""

from __future__ import annotations

from typing import Mapping

from mlir import ir

from poot.backends.gpu.kernels import gpu_kernels

#: ops that compute an index from values available at the top of a kernel, with no memory
#: access and no region
_PURE = ("arith.", "gpu.thread_id", "gpu.block_id", "gpu.block_dim", "gpu.grid_dim",
         "gpu.lane_id", "affine.apply", "index.")

#: loads hoisted above one wait at most (each holds a register across it): the batch-32
#: q/k/v LoRA expands of the 1B shape's KV write and attention read 82 constants a thread
LIMIT = 96

#: of those, the ones speculated only with a constant, non-zero divisor
_DIVIDES = ("arith.div", "arith.rem", "arith.ceildiv", "arith.floordiv")

#: region ops a hoisted load may come from: the bounds checks of element-wise code
_SPECULABLE = ("scf.if",)


def _is_wait(op) -> bool:
    return op.name == "nvvm.griddepcontrol" and "wait" in str(op.attributes["kind"])


def _single_trip(op) -> bool:
    """An ``scf.for`` whose body runs at most once, with the induction variable equal to its
    lower bound: a constant upper bound no larger than a constant step and a lower bound
    that cannot be negative (the loop compares signed). The strategies write such loops to
    spread a short stretch over a block's threads (``for i = tid to 256 step 512``)."""
    if op.name != "scf.for":
        return False
    ub, step = _constant(op.operands[1]), _constant(op.operands[2])
    return ub is not None and step is not None and 0 < ub <= step and \
        _non_negative(op.operands[0])


#: index ops whose result is not negative when their operands are not
_MONOTONE = ("arith.addi", "arith.muli", "arith.divui", "arith.remui", "arith.minui",
             "arith.maxui")


def _non_negative(v, depth: int = 8) -> bool:
    """Whether index ``v`` is provably >= 0: a thread or block id or dimension, a
    non-negative constant, or sums, products, unsigned quotients and min/max of those."""
    if isinstance(v, ir.BlockArgument) or depth == 0:
        return False
    op = v.owner
    op = op.operation if hasattr(op, "operation") else op
    if op.name in ("gpu.thread_id", "gpu.block_id", "gpu.block_dim", "gpu.grid_dim",
                   "gpu.lane_id"):
        return True
    if op.name == "arith.constant":
        c = _constant(v)
        return c is not None and c >= 0
    return op.name in _MONOTONE and all(_non_negative(x, depth - 1) for x in op.operands)


def _loads(block, out: list, trips: dict) -> None:
    """memref.load ops of ``block`` and of the scf.if regions and single-trip loops nested in
    it, in order; ``trips`` maps each such loop's induction variable to its lower bound."""
    for o in block.operations:
        o = o.operation
        if o.name == "memref.load":
            out.append(o)
        elif o.name in _SPECULABLE or _single_trip(o):
            if o.name == "scf.for":
                trips[o.regions[0].blocks[0].arguments[0]] = o.operands[0]
            for region in o.regions:
                for b in region.blocks:
                    _loads(b, out, trips)


def hoist_constant_loads(module: ir.Module, constant_args: Mapping[str, set[int]],
                         limit: int = LIMIT) -> int:
    """Move the loads of each kernel's constant arguments (``constant_args[kernel name]``:
    positions of its ``gpu.func`` arguments bound to a weight or constant buffer in every
    launch) above the ``griddepcontrol.wait`` that guards them (the kernel's top-level one,
    or a fused member branch's) where their indices allow (see the module doc). Run after
    :func:`~poot.backends.cuda.codegen.add_grid_dependency_control`. Returns the number of
    loads hoisted."""
    total = 0
    with module.context, ir.Location.unknown():
        for f in gpu_kernels(module):
            consts = constant_args.get(ir.StringAttr(f.attributes["sym_name"]).value)
            if consts:
                total += _hoist_kernel(f.regions[0].blocks[0], consts, limit)
    return total


def _waits(entry) -> list[tuple]:
    """(block, wait, ops of the enclosing blocks above it) of each wait the PDL pass placed:
    the top-level one, or one at the top of each member branch of a fused kernel."""
    top = [o.operation for o in entry.operations]
    w = [o for o in top if _is_wait(o)]
    if w:
        return [(entry, w[0], set())]
    out = []
    for i, o in enumerate(top):
        if o.name != "scf.if":
            continue
        for region in o.regions:
            for b in region.blocks:
                w = [x.operation for x in b.operations if _is_wait(x.operation)]
                if w:
                    out.append((b, w[0], set(top[:i])))
    return out


def _hoist_kernel(entry, consts: set[int], limit: int) -> int:
    return sum(_hoist(entry, block, wait, outer, consts, limit)
               for block, wait, outer in _waits(entry))


def _hoist(entry, block, wait, outer: set, consts: set[int], limit: int) -> int:
    before = set(outer)               # ops whose results are available above the wait
    for o in block.operations:
        o = o.operation
        if o == wait:
            break
        before.add(o)
    args = list(entry.arguments)
    const_args = {args[i] for i in consts if i < len(args)}
    memo: dict = {}
    trips: dict = {}
    ip = ir.InsertionPoint(wait)

    def avail(v):
        """``v`` or a copy of it computed above the wait; None when it needs memory."""
        if v in memo:
            return memo[v]
        res = None
        if isinstance(v, ir.BlockArgument):
            if v in trips:               # a single-trip loop's induction variable
                res = avail(trips[v])
            else:
                res = v if v.owner == entry else None
        else:
            op = v.owner
            op = op.operation if hasattr(op, "operation") else op
            if op in before:
                res = v
            elif op.name.startswith(_PURE) and not len(op.regions) and \
                    (not op.name.startswith(_DIVIDES) or _constant(op.operands[1])):
                ops_ = [avail(x) for x in op.operands]
                if all(x is not None for x in ops_):
                    new = op.clone(ip)
                    for i, x in enumerate(ops_):
                        new.operands[i] = x
                    res = new.results[list(op.results).index(v)] if len(op.results) > 1 \
                        else new.result
        memo[v] = res
        return res

    loads: list = []
    _loads(block, loads, trips)
    n = 0
    done: dict = {}
    clamps: dict = {}
    index = ir.IndexType.get()
    for ld in loads:
        if n >= limit:
            break
        mem = ld.operands[0]
        if mem not in const_args:
            continue
        mt = ir.MemRefType(mem.type)
        if any(d == ir.ShapedType.get_dynamic_size() for d in mt.shape):
            continue
        idx = [avail(x) for x in list(ld.operands)[1:]]
        if any(x is None for x in idx):
            continue
        key = (mem, tuple(idx))
        if key in done:                  # the same element hoisted already: reuse it
            ld.result.replace_all_uses_with(done[key])
            ld.erase()
            continue
        clamped = []
        for x, dim in zip(idx, mt.shape):
            c = _constant(x)
            if c is not None and 0 <= c < dim:
                clamped.append(x)
            elif (x, dim) in clamps:
                clamped.append(clamps[x, dim])
            else:
                hi = ir.Operation.create("arith.constant", results=[index],
                                         attributes={"value": ir.IntegerAttr.get(index,
                                                                                 dim - 1)},
                                         ip=ip).result
                clamps[x, dim] = ir.Operation.create("arith.minui", results=[index],
                                                     operands=[x, hi], ip=ip).result
                clamped.append(clamps[x, dim])
        new = ir.Operation.create("memref.load", results=[ld.result.type],
                                  operands=[mem] + clamped, ip=ip)
        ld.result.replace_all_uses_with(new.result)
        ld.erase()
        done[key] = new.result
        n += 1
    return n


def _constant(v) -> int | None:
    """The value of an ``arith.constant`` index, else None."""
    if isinstance(v, ir.BlockArgument):
        return None
    op = v.owner
    op = op.operation if hasattr(op, "operation") else op
    if op.name == "arith.constant":
        try:
            return ir.IntegerAttr(op.attributes["value"]).value
        except (ValueError, TypeError):
            return None
    return None


__all__ = ["hoist_constant_loads"]
