"""``poot-dce``: erase poot ops whose results are unused, to a fixed point.

Every poot op is pure (value semantics on tensors; ``poot.scatter`` returns a new tensor), so
an op with no uses computes nothing observable. MLIR's own DCE does not touch them: IRDL ops
have unknown side effects. Ops of other dialects are left alone.
"""

from __future__ import annotations

from mlir import ir

from poot.passes.analysis import defining_op, has_uses, is_poot
from poot.passes.registry import register_pass


def dce(root) -> int:
    """Erase unused poot ops under ``root`` (an Operation or Module); returns how many.

    One backward sweep over each block, entering an op's regions when the sweep reaches it:
    in SSA form every user of a value comes after it in its block or inside the regions of
    an op after it, so each op is looked at once, after all its users. The operands' producers
    of each erased op are looked at again at the end (a worklist), so the result is a fixed
    point whatever the nesting."""
    root = root.operation if isinstance(root, ir.Module) else root
    # ops by pointer (an Operation's hash, taken while the op lives: Python objects of one op
    # are not unique); no op is created while this runs, so no pointer is reused
    erased: set[int] = set()
    work: list[tuple[int, ir.Operation]] = []

    def erase(op: ir.Operation) -> None:
        for v in op.operands:
            p = defining_op(v)
            if p is not None:
                work.append((hash(p), p))
        erased.add(hash(op))
        op.erase()

    def sweep(block: ir.Block) -> None:
        for op in reversed(list(block.operations)):
            op = op.operation
            if op.regions:
                for region in op.regions:
                    for b in region.blocks:
                        sweep(b)
            elif is_poot(op) and not has_uses(op):
                erase(op)

    for region in root.regions:
        for block in region.blocks:
            sweep(block)
    while work:
        key, op = work.pop()
        if key not in erased and is_poot(op) and not op.regions and not has_uses(op):
            erase(op)
    return len(erased)


@register_pass("poot-dce", "erase poot ops with no uses (to a fixed point)")
def run(module: ir.Operation) -> None:
    dce(module)
