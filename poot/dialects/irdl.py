"""The poot dialect's IRDL definition, generated from the op definitions.

Generating the IRDL from :mod:`poot.dialects.opdef` keeps one definition per op: IRDL checks
structure when MLIR parses or verifies (op names, operand/result kinds, attribute presence and
kinds), the Python rule checks the rest (shapes, dtypes, enum values). ``poot-opt
--print-irdl`` prints the text.

IRDL gotchas in MLIR 22 (see docs/toolchain.md): one constraint SSA value used for several
operands forces them to one type, so each slot gets its own; ``irdl.any_of`` over a symbol-ref
``irdl.base`` crashes the loader, so formats are ``irdl.parametric`` alternatives.
"""

from __future__ import annotations

import functools

from poot.lazy import lazy_module
ir = lazy_module("mlir.ir")
irdl_d = lazy_module("mlir.dialects.irdl")

from poot.dialects import ops as _ops  # noqa: F401  (registers the ops)
from poot.dialects.opdef import REGISTRY, OpDef, attr_irdl_base
from poot.dialects.quant import ALL_FORMATS


def _packed_type() -> list[str]:
    lines = [f"  irdl.attribute @{f.name} {{ irdl.parameters() }}" for f in ALL_FORMATS]
    alts = [f"    %f{i} = irdl.parametric @poot::@{f.name}<>" for i, f in enumerate(ALL_FORMATS)]
    names = ", ".join(f"%f{i}" for i in range(len(ALL_FORMATS)))
    lines += ["  irdl.type @packed {", *alts,
              f"    %fmt = irdl.any_of({names})",
              '    %shape = irdl.base "#builtin.dense_array"',
              "    irdl.parameters(format: %fmt, shape: %shape)", "  }"]
    return lines


def _operation(op: type[OpDef]) -> list[str]:
    body, slots = [], []
    for i, name in enumerate(op.operands):
        variadic = name.startswith("*")
        name = name.lstrip("*")
        base = "@poot::@packed" if name in op.packed_operands else '"!builtin.tensor"'
        body.append(f"    %o{i} = irdl.base {base}")
        slots.append(f"{name}: {'variadic ' if variadic else ''}%o{i}")
    rbase = "@poot::@packed" if op.packed_result else '"!builtin.tensor"'
    body.append(f"    %r = irdl.base {rbase}")
    attrs = []
    for i, (key, spec) in enumerate(op.attrs.items()):
        body.append(f'    %a{i} = irdl.base "{attr_irdl_base(spec.kind)}"')
        attrs.append(f'"{key}" = %a{i}')
    if slots:
        body.append(f"    irdl.operands({', '.join(slots)})")
    body.append("    irdl.results(result: %r)")
    if attrs:
        body.append(f"    irdl.attributes {{ {', '.join(attrs)} }}")
    return [f"  irdl.operation @{op.name} {{", *body, "  }"]


@functools.cache
def irdl_text() -> str:
    """The IRDL module defining ``poot`` (types, attributes and every registered op)."""
    lines = ["irdl.dialect @poot {", *_packed_type()]
    for op in REGISTRY.values():
        lines += _operation(op)
    lines.append("}")
    return "\n".join(lines) + "\n"


def load_dialect(ctx: ir.Context) -> None:
    """Register the poot dialect in ``ctx`` (idempotent)."""
    if ctx.is_registered_operation("poot.matmul"):
        return
    with ctx, ir.Location.unknown():
        module = ir.Module.parse(irdl_text())
        irdl_d.load_dialects(module)
    # Keep the IRDL module alive as long as any context may use the dialect it defined.
    _KEEP.append(module)


_KEEP: list = []


def make_context() -> ir.Context:
    """A fresh MLIR context with the poot dialect loaded."""
    ctx = ir.Context()
    load_dialect(ctx)
    return ctx
