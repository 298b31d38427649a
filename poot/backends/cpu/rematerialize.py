"""Index-only producers recomputed in each consumer rather than stored.

Elementwise fusion (:data:`poot.backends.pass_pipelines.FUSE`, MLIR's
``linalg-fuse-elementwise-ops``) fuses a producer into its consumer only when the consumer
is its one use. A ``linalg.generic`` that reads nothing (no inputs, its init unread: its
values come from ``linalg.index`` and constants, e.g. the sampler's vocabulary iota) and
has several consumers is then materialized once and read back by every consumer: the
inverse-CDF bisection of the sampler read a ``[B, V]`` i32 iota (6 MiB at B = 32 over
49,152 tokens) in each of its 16 passes. :func:`rematerialize_index_generics` gives each
use beyond the first its own copy, which fusion then folds into that consumer: recomputing
an index costs an add, reading it costs memory bandwidth.
"""

from __future__ import annotations

from mlir import ir


def _index_only(op: ir.Operation) -> bool:
    """A ``linalg.generic`` with no inputs, all-parallel iterators and an unread init."""
    if op.name != "linalg.generic" or len(op.results) != 1 or len(op.operands) != 1:
        return False
    iters = [str(a) for a in ir.ArrayAttr(op.attributes["iterator_types"])]
    if any("parallel" not in i for i in iters):
        return False
    block = op.regions[0].blocks[0]
    return not list(block.arguments[0].uses)


def rematerialize_index_generics(module: ir.Module) -> int:
    """Clone every index-only ``linalg.generic`` of ``module`` (module doc) once per use
    beyond the first, each use reading its own clone. Returns how many clones were made."""
    found = []

    def visit(op):
        op = op.operation
        if _index_only(op) and len(list(op.results[0].uses)) > 1:
            found.append(op)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    made = 0
    with module.context, ir.Location.unknown():
        for op in found:
            uses = [(u.owner, u.operand_number) for u in op.results[0].uses]
            for owner, i in uses[1:]:
                with ir.InsertionPoint(op):
                    copy = op.clone()
                owner.operands[i] = copy.results[0]
                made += 1
    return made


__all__ = ["rematerialize_index_generics"]
