"""``poot-cse``: common-subexpression elimination of poot ops.

Two poot ops are the same expression when they have the same op name, the same operands (as SSA
values, in order), the same attributes (attributes are uniqued in MLIR, so equality is exact:
``fn = "add"`` and ``fn = "mul"`` differ, as do dense constants with different data) and the
same result types. The later op's results are replaced by the earlier op's and the later op is
erased. The scan is per block in order, so the kept op always dominates the replaced one; a
block nested in a region that is not isolated from above also sees the expressions of its
enclosing blocks that precede the region's op. Operand order is kept as written (no
commutativity assumption), so ``add(a, b)`` and ``add(b, a)`` stay two ops.

MLIR's ``cse`` does not do this: IRDL-defined ops have unknown side effects. All poot ops are
pure, so this is always valid.
"""

from __future__ import annotations

from mlir import ir

from poot.passes.analysis import is_poot
from poot.passes.registry import register_pass

_ISOLATED = ("func.func", "builtin.module", "gpu.module", "gpu.func")


def _key(op: ir.Operation):
    attrs = tuple(sorted(((op.attributes[i].name, op.attributes[i].attr)
                          for i in range(len(op.attributes))), key=lambda p: p[0]))
    return (op.name, tuple(op.operands), attrs, tuple(r.type for r in op.results))


def _cse_block(block: ir.Block, scope: dict) -> int:
    table = dict(scope)
    erased = 0
    for op in list(block.operations):
        op = op.operation
        if op.regions:
            inherit = {} if op.name in _ISOLATED else table
            for region in op.regions:
                for inner in region.blocks:
                    erased += _cse_block(inner, inherit)
            continue
        if not is_poot(op):
            continue
        key = _key(op)
        prev = table.get(key)
        if prev is None:
            table[key] = op
            continue
        for old, new in zip(op.results, prev.results):
            old.replace_all_uses_with(new)
        op.erase()
        erased += 1
    return erased


def cse(root) -> int:
    """Eliminate common poot subexpressions under ``root``; returns the number of ops erased."""
    root = root.operation if isinstance(root, ir.Module) else root
    total = 0
    for region in root.regions:
        for block in region.blocks:
            total += _cse_block(block, {})
    return total


@register_pass("poot-cse", "common-subexpression elimination of (pure) poot ops")
def run(module: ir.Operation) -> None:
    cse(module)
