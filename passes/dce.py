"""``poot-dce``: erase poot ops whose results are unused, to a fixed point.

Every poot op is pure (value semantics on tensors; ``poot.scatter`` returns a new tensor), so
an op with no uses computes nothing observable. MLIR's own DCE does not touch them: IRDL ops
have unknown side effects. Ops of other dialects are left alone.
"""

from __future__ import annotations

from mlir import ir

from poot.passes.analysis import has_uses, is_poot
from poot.passes.registry import register_pass


def _blocks(root: ir.Operation):
    out = []

    def visit(op):
        for region in op.operation.regions:
            for block in region.blocks:
                out.append(block)
        return ir.WalkResult.ADVANCE

    root.walk(visit)
    return out


def dce(root) -> int:
    """Erase unused poot ops under ``root`` (an Operation or Module); returns how many."""
    root = root.operation if isinstance(root, ir.Module) else root
    erased, changed = 0, True
    while changed:
        changed = False
        for block in _blocks(root):
            # users follow their operands in a block, so one backward sweep erases chains
            for op in reversed(list(block.operations)):
                op = op.operation
                if is_poot(op) and not op.regions and not has_uses(op):
                    op.erase()
                    erased += 1
                    changed = True
    return erased


@register_pass("poot-dce", "erase poot ops with no uses (to a fixed point)")
def run(module: ir.Operation) -> None:
    dce(module)
