"""``poot-verify``: check every poot op against its definition's rule (shapes, dtypes, enum
attributes), beyond the structural checks IRDL makes. poot-opt also runs it on its input."""

from __future__ import annotations

from mlir import ir

from poot.dialects.verify import verify_module
from poot.passes.registry import PassFailure, register_pass


@register_pass("poot-verify", "check poot ops against their type rules")
def run(module: ir.Operation) -> None:
    diags = verify_module(module)
    if diags:
        raise PassFailure("\n".join(str(d) for d in diags))
