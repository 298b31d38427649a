"""``poot-lower-to-linalg``: rewrite every poot function of a module into a ``func.func`` that
uses only upstream dialects (linalg on tensors, tensor, arith, math, scf), by the per-op rules
of :mod:`poot.dialects.lowering`.

Weights become trailing function arguments (``poot.params`` lists them in order; packed ones
are their stored bytes, ``tensor<NBYTESxi8>``). An op with no lowering (for example a
dequantize of a packed format without an in-kernel decoder) fails the pass with a diagnostic
at the op naming the missing capability; the module is then left unchanged.
"""

from __future__ import annotations

from mlir import ir

from poot.dialects.lowering import LoweringRefusal, lower_module
from poot.passes.registry import PassFailure, register_pass


@register_pass("poot-lower-to-linalg", "lower poot ops to linalg/tensor/arith/math/scf")
def run(module: ir.Operation) -> None:
    try:
        lower_module(module)
    except LoweringRefusal as e:
        where = f"{e.location}: error: " if e.location else ""
        raise PassFailure(f"{where}{e}") from e
