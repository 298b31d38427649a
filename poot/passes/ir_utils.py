"""Small IR helpers shared by poot's pattern-matching passes (flash attention, RoPE fusion,
dispatch fusion): a match-failure exception, typed-value queries, attribute readers, value
equality up to recomputation, and op cloning."""

from __future__ import annotations

from mlir import ir

from poot.dialects.types import DType, type_from_mlir
from poot.passes.analysis import defining_op


class NoMatch(Exception):
    """A pattern does not match here (the message says why)."""


def need(cond: bool, why: str = "") -> None:
    """Raise :class:`NoMatch` (``why``) unless ``cond``."""
    if not cond:
        raise NoMatch(why)


def shape_of(v: ir.Value) -> tuple[int, ...]:
    return type_from_mlir(v.type).shape


def dtype_of(v: ir.Value) -> DType:
    return type_from_mlir(v.type).dtype


def fn_attr(op: ir.Operation) -> str:
    """The op's ``fn`` string attribute (``unary``/``binary``/``reduce`` ... kind)."""
    return ir.StringAttr(op.attributes["fn"]).value


def i64s(op: ir.Operation, key: str) -> tuple[int, ...]:
    """The op's dense i64 array attribute ``key``."""
    return tuple(ir.DenseI64ArrayAttr(op.attributes[key]))


def same_value(a: ir.Value, b: ir.Value, depth: int = 6) -> bool:
    """Whether ``a`` and ``b`` are the same value: identical, or computed by the same pure op
    (name, attributes, type) from the same values (CSE need not have run)."""
    if a == b:
        return True
    pa, pb = defining_op(a), defining_op(b)
    if depth == 0 or pa is None or pb is None or pa.name != pb.name or a.type != b.type or \
            not pa.name.startswith("poot.") or pa.name == "poot.param" or \
            len(pa.operands) != len(pb.operands):
        return False
    attrs = lambda o: sorted((o.attributes[i].name, str(o.attributes[i].attr))  # noqa: E731
                             for i in range(len(o.attributes)))
    return attrs(pa) == attrs(pb) and all(
        same_value(x, y, depth - 1) for x, y in zip(pa.operands, pb.operands))


def op_attributes(op: ir.Operation) -> dict[str, ir.Attribute]:
    """The op's attributes as a name -> attribute dict (for :func:`ir.Operation.create`)."""
    return {op.attributes[i].name: op.attributes[i].attr for i in range(len(op.attributes))}


def clone_into(op: ir.Operation, mapping: dict, ip: ir.InsertionPoint) -> ir.Operation:
    """Create a copy of ``op`` at ``ip`` with its operands looked up in ``mapping``; its
    results are added to ``mapping``. Returns the copy."""
    with op.context, op.location:
        c = ir.Operation.create(op.name, results=[r.type for r in op.results],
                                operands=[mapping[v] for v in op.operands],
                                attributes=op_attributes(op), ip=ip)
    for r, n in zip(op.results, c.results):
        mapping[r] = n
    return c
