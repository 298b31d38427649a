"""Verification of poot ops by their Python rules (what IRDL cannot express: shapes, dtypes,
enum values). Runs after MLIR's own verifier in ``poot-opt`` and after every poot pass.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlir import ir

from poot.dialects.opdef import OpDef, VerifyError, lookup, read_attrs
from poot.dialects.types import type_from_mlir


@dataclass(frozen=True)
class Diagnostic:
    """One verification failure: MLIR location text and the message naming op and problem."""

    location: str
    message: str

    def __str__(self) -> str:
        return f"{self.location}: error: {self.message}"


def check_op(op: ir.Operation) -> None:
    """Check one poot op against its definition; raises :class:`VerifyError`."""
    opdef = lookup(op.name)
    if opdef is None:
        return
    try:
        operands = [type_from_mlir(v.type) for v in op.operands]
        results = [type_from_mlir(r.type) for r in op.results]
        attrs = read_attrs(opdef, op)
    except (TypeError, KeyError, ValueError) as e:
        raise VerifyError(op.name, str(e)) from None
    if len(results) != 1:
        raise VerifyError(op.name, f"must have exactly one result, got {len(results)}")
    opdef.check(operands, attrs, results[0])


def verify_module(module: ir.Module | ir.Operation) -> list[Diagnostic]:
    """All rule violations of poot ops under ``module``, in walk order (empty when valid)."""
    diags: list[Diagnostic] = []

    def visit(op):
        op = op.operation
        try:
            check_op(op)
        except VerifyError as e:
            diags.append(Diagnostic(_loc(op), str(e)))
        return ir.WalkResult.ADVANCE

    root = module.operation if isinstance(module, ir.Module) else module
    root.walk(visit)
    return diags


def _loc(op: ir.Operation) -> str:
    # MLIR prints `loc("file":3:8)`; diagnostics conventionally show `file:3:8`.
    text = str(op.location)
    if text.startswith("loc(") and text.endswith(")"):
        text = text[4:-1].replace('"', "")
    return text


__all__ = ["Diagnostic", "check_op", "verify_module", "OpDef"]
