"""The table of lowering rules (op mnemonic -> rule) and what a rule is given."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from poot.dialects.types import PootType


@dataclass
class OpInfo:
    """One poot op, as a rule sees it.

    Attributes:
        name: the mnemonic (``binary``); attrs: Python attribute values (by the op's slots);
        args: SSA names of the lowered operands; types: operand types; result: result type;
        location: the op's location text (for refusals).
    """

    name: str
    attrs: dict[str, Any]
    args: list[str]
    types: list[PootType]
    result: PootType
    location: str = ""

    def refuse(self, capability: str):
        from poot.dialects.lowering import LoweringRefusal

        raise LoweringRefusal(f"poot.{self.name}", capability, self.location)


Rule = Callable[..., str]
RULES: dict[str, Rule] = {}


def rule(name: str):
    """Decorator registering ``fn(em: Emitter, op: OpInfo) -> ssa name`` for ``poot.<name>``."""

    def deco(fn: Rule) -> Rule:
        if name in RULES:
            raise ValueError(f"two lowering rules for poot.{name}")
        RULES[name] = fn
        return fn

    return deco
