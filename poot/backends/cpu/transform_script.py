"""Running a transform-dialect script on a module: MLIR's own structured rewrites (tiling,
vectorization, pattern sets) applied to ops the CPU backend tagged.

:func:`run_transform` wraps ``lines`` (transform ops over the handle ``%root``, the module) in
the named sequence ``@__transform_main`` that the ``transform-interpreter`` pass runs, puts
it at the top of ``module`` for the run and removes it after, so the module holds nothing of
the script afterwards (Source: MLIR's Transform dialect, ``transform.named_sequence`` and
``-transform-interpreter``).
"""

from __future__ import annotations

from mlir import ir
from mlir.passmanager import PassManager

#: the type of every handle the scripts pass around
ANY_OP = "!transform.any_op"


def run_transform(module: ir.Module, lines: list[str]) -> None:
    """Run the transform ops ``lines`` (``%root``: ``module``) with ``transform-interpreter``;
    errors of the interpreter (a transform that does not apply) raise ``MLIRError``."""
    script = ("module attributes {transform.with_named_sequence} {\n"
              f"transform.named_sequence @__transform_main(%root: {ANY_OP} "
              "{transform.readonly}) {\n" + "\n".join(lines) + "\ntransform.yield\n}\n}")
    with module.context, ir.Location.unknown():
        lib = ir.Module.parse(script)       # kept alive while its op is moved
        seq = lib.body.operations[0]
        seq.operation.move_before(module.body.operations[0])
        module.operation.attributes["transform.with_named_sequence"] = ir.UnitAttr.get()
        try:
            PassManager.parse("builtin.module(transform-interpreter)").run(module.operation)
        finally:
            seq.erase()
            del module.operation.attributes["transform.with_named_sequence"]


__all__ = ["ANY_OP", "run_transform"]
