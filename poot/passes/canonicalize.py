"""``poot-canonicalize``: semantic folds of poot ops that are always valid, then DCE.

Each rule fires on what the ops compute, whatever spelled them:

* ``reshape(reshape(x))`` -> one ``reshape(x)``; a reshape, broadcast, cast or slice whose
  result type equals its operand's type -> the operand (for a slice, an equal type means it
  covers the whole operand; for a broadcast, the identity map).
* ``transpose(transpose(x, p), q)`` -> ``transpose(x, p[q])``, and the identity permutation
  -> ``x``. A transpose that only moves size-1 dims keeps the row-major element order: it
  becomes a ``reshape`` (then the reshape rules apply). A transpose to the same type with a
  non-identity permutation (a square matrix) is *not* folded: it moves data.
* ``broadcast(broadcast(x, d1), d2)`` -> ``broadcast(x, d2[d1])``; ``slice(slice(x))`` -> one
  slice.
* algebraic identities with a splat constant (a ``poot.constant`` whose elements are all equal,
  seen through broadcast/reshape/transpose): ``x*1``, ``1*x``, ``x/1``, ``x-0`` -> ``x``;
  ``x+0``/``0+x`` -> ``x`` for integers, and for floats only with ``-0.0`` (``x + +0.0`` turns
  ``-0.0`` into ``+0.0``) unless the option ``no-signed-zeros`` allows it;
  ``and(x, true)``, ``or(x, false)`` -> ``x``; ``max/min/and/or(x, x)`` -> ``x``; ``select``
  with a splat condition or two equal branches -> the chosen operand.
* ``gather`` along an axis of extent 1 -> the table without that axis, broadcast over the
  index dims (every clamped index is 0: a one-slot KV cache read).
* constant folding: a poot op (not a source) whose operands are all ``poot.constant`` and whose
  result is at most ``max-fold-bytes`` bytes is evaluated with the op's own
  :meth:`~poot.dialects.opdef.OpDef.evaluate` (the oracle's semantics) and replaced by a
  constant (bf16 results are not folded: bf16 literals are spelled as f32 + cast).

Rules run to a fixed point (bounded by ``max-iterations`` sweeps); dead poot ops are erased.
"""

from __future__ import annotations

import numpy as np
from mlir import ir

from poot.dialects.opdef import dense_from_mlir, dense_to_mlir, lookup, read_attrs
from poot.dialects.types import DType, TensorType, type_from_mlir
from poot.passes.analysis import SOURCES, defining_op, has_uses, is_poot
from poot.passes.dce import dce
from poot.passes.registry import register_pass


def _create(name: str, at: ir.Operation, operands, result_type, attrs=None) -> ir.Operation:
    with at.context, at.location:
        return ir.Operation.create(name, results=[result_type], operands=list(operands),
                                   attributes=dict(attrs or {}), ip=ir.InsertionPoint(at))


def _attrs(op: ir.Operation) -> dict:
    return read_attrs(lookup(op.name), op)


def _i64s(values) -> ir.Attribute:
    return ir.DenseI64ArrayAttr.get([int(v) for v in values])


def _producer(v: ir.Value, name: str | None = None) -> ir.Operation | None:
    p = defining_op(v)
    if p is None or (name is not None and p.name != name):
        return None
    return p


def splat_value(v: ir.Value):
    """The one element value of ``v`` when it is a splat constant (through broadcast, reshape
    and transpose, which keep a splat a splat), else None."""
    p = defining_op(v)
    while p is not None and p.name in ("poot.broadcast", "poot.reshape", "poot.transpose"):
        p = defining_op(p.operands[0])
    if p is None or p.name != "poot.constant":
        return None
    d = ir.DenseElementsAttr(p.attributes["value"])
    if d.is_splat:
        s = d.get_splat_value()
        dt = DType.from_mlir(ir.RankedTensorType(d.type).element_type)
        if dt.is_float:
            return float(ir.FloatAttr(s).value)
        return int(ir.IntegerAttr(s).value) & 1 if dt.is_bool else int(ir.IntegerAttr(s).value)
    try:
        arr = dense_from_mlir(d)
    except Exception:  # noqa: BLE001 - a literal numpy cannot read is simply not a splat
        return None
    if arr.size and (arr.reshape(-1) == arr.reshape(-1)[0]).all() and not (
            arr.dtype.kind == "f" and np.signbit(arr).any() != np.signbit(arr).all()):
        return arr.reshape(-1)[0].item()
    return None


def _is(value, target: float, signed_zero: bool | None = None) -> bool:
    if value is None:
        return False
    if isinstance(value, float):
        if value != target:
            return False
        if signed_zero is not None:
            return bool(np.signbit(value)) == signed_zero
        return True
    return value == target


class _Canon:
    def __init__(self, max_fold_bytes: int, no_signed_zeros: bool):
        self.max_fold_bytes = max_fold_bytes
        self.no_signed_zeros = no_signed_zeros

    # each rule returns a replacement value (or None for no match)
    def rewrite(self, op: ir.Operation):
        name = op.name
        rtype = op.results[0].type
        x = op.operands[0] if len(op.operands) else None
        if name in ("poot.reshape", "poot.broadcast", "poot.cast", "poot.slice") and \
                x.type == rtype:
            return x
        folded = self.fold_constant(op)
        if folded is not None:
            return folded
        fn = getattr(self, "r_" + name[5:], None)
        return fn(op, rtype) if fn else None

    def r_reshape(self, op, rtype):
        inner = _producer(op.operands[0], "poot.reshape")
        if inner is not None:
            src = inner.operands[0]
            return src if src.type == rtype else _create("poot.reshape", op, [src], rtype).result
        return None

    def r_transpose(self, op, rtype):
        x = op.operands[0]
        perm = list(_attrs(op)["perm"])
        inner = _producer(x, "poot.transpose")
        if inner is not None:
            p1 = list(_attrs(inner)["perm"])
            perm = [p1[q] for q in perm]
            x = inner.operands[0]
        if perm == list(range(len(perm))):
            return x
        shape = type_from_mlir(x.type).shape
        moved = [p for p in perm if shape[p] != 1]
        if moved == sorted(moved):  # only size-1 dims move: the element order is kept
            return _create("poot.reshape", op, [x], rtype).result
        if inner is not None:
            return _create("poot.transpose", op, [x], rtype, {"perm": _i64s(perm)}).result
        return None

    def r_broadcast(self, op, rtype):
        inner = _producer(op.operands[0], "poot.broadcast")
        if inner is None:
            return None
        d1, d2 = _attrs(inner)["dims"], _attrs(op)["dims"]
        dims = [d2[d] for d in d1]
        return _create("poot.broadcast", op, [inner.operands[0]], rtype,
                       {"dims": _i64s(dims)}).result

    def r_slice(self, op, rtype):
        inner = _producer(op.operands[0], "poot.slice")
        if inner is None:
            return None
        a1, s1 = _attrs(inner)["start"], _attrs(inner)["stride"]
        a2, s2 = _attrs(op)["start"], _attrs(op)["stride"]
        n = type_from_mlir(rtype).shape
        start = [p + q * s for p, q, s in zip(a1, a2, s1)]
        stride = [s * t for s, t in zip(s1, s2)]
        limit = [st + (k - 1) * sd + 1 if k else st for st, k, sd in zip(start, n, stride)]
        return _create("poot.slice", op, [inner.operands[0]], rtype,
                       {"start": _i64s(start), "limit": _i64s(limit),
                        "stride": _i64s(stride)}).result

    def r_gather(self, op, rtype):
        """A gather along an axis of extent 1 reads entry 0 whatever the (clamped) index:
        drop the axis and broadcast over the index dims (a KV cache of one slot)."""
        table = op.operands[0]
        tt_ = type_from_mlir(table.type)
        ax = _attrs(op)["axis"]
        if tt_.shape[ax] != 1:
            return None
        it = type_from_mlir(op.operands[1].type)
        if it.numel == 1:        # same elements in the same order: a reshape
            return table if table.type == rtype else \
                _create("poot.reshape", op, [table], rtype).result
        n_idx = it.rank
        kept = tt_.shape[:ax] + tt_.shape[ax + 1:]
        src = table
        if kept != tt_.shape:
            src = _create("poot.reshape", op, [table],
                          TensorType(kept, tt_.dtype).mlir()).result
        dims = list(range(ax)) + [d + n_idx for d in range(ax, len(kept))]
        return _create("poot.broadcast", op, [src], rtype, {"dims": _i64s(dims)}).result

    def r_binary(self, op, rtype):
        fn = _attrs(op)["fn"]
        a, b = op.operands
        is_float = type_from_mlir(rtype).dtype.is_float
        if a == b and fn in ("max", "min", "and", "or"):
            return a
        ca, cb = splat_value(a), splat_value(b)
        if fn == "add":
            if not is_float or self.no_signed_zeros:
                zero = lambda c: _is(c, 0)  # noqa: E731
            else:
                zero = lambda c: _is(c, 0, signed_zero=True)  # noqa: E731
            if zero(cb):
                return a
            if zero(ca):
                return b
        elif fn == "sub":
            if _is(cb, 0, signed_zero=False if is_float and not self.no_signed_zeros else None):
                return a
        elif fn == "mul":
            if _is(cb, 1):
                return a
            if _is(ca, 1):
                return b
        elif fn == "div":
            if _is(cb, 1):
                return a
        elif fn == "and":
            if _is(cb, 1):
                return a
            if _is(ca, 1):
                return b
        elif fn == "or":
            if _is(cb, 0):
                return a
            if _is(ca, 0):
                return b
        return None

    def r_select(self, op, rtype):
        if op.operands[1] == op.operands[2]:
            return op.operands[1]
        c = splat_value(op.operands[0])
        if c is None:
            return None
        return op.operands[1] if c else op.operands[2]

    def fold_constant(self, op):
        if op.name in SOURCES or not op.operands:
            return None
        opdef = lookup(op.name)
        if opdef is None or opdef.packed_operands or opdef.packed_result:
            return None
        rt = type_from_mlir(op.results[0].type)
        if not isinstance(rt, TensorType) or rt.dtype is DType.BF16 or \
                rt.nbytes > self.max_fold_bytes:
            return None
        producers = [_producer(v, "poot.constant") for v in op.operands]
        if any(p is None for p in producers):
            return None
        try:
            args = [dense_from_mlir(p.attributes["value"]) for p in producers]
            out = np.asarray(opdef.evaluate(args, read_attrs(opdef, op), rt),
                             dtype=rt.dtype.numpy).reshape(rt.shape)
            with op.context, op.location:
                value = dense_to_mlir(out)
        except Exception:  # noqa: BLE001 - an op the literal form cannot hold stays as it is
            return None
        return _create("poot.constant", op, [], op.results[0].type, {"value": value}).result


def _blocks(root: ir.Operation):
    out = []

    def visit(o):
        for region in o.operation.regions:
            out.extend(region.blocks)
        return ir.WalkResult.ADVANCE

    root.walk(visit)
    return out


def canonicalize(root, max_fold_bytes: int = 4096, no_signed_zeros: bool = False,
                 max_iterations: int = 32) -> int:
    """Apply the rules under ``root`` to a fixed point; returns the number of rewrites."""
    root = root.operation if isinstance(root, ir.Module) else root
    canon = _Canon(max_fold_bytes, no_signed_zeros)
    total = 0
    for _ in range(max_iterations):
        changed = 0
        for block in _blocks(root):
            for op in list(block.operations):
                op = op.operation
                if not is_poot(op) or op.regions or len(op.results) != 1 or not has_uses(op):
                    continue
                with op.context, op.location:
                    new = canon.rewrite(op)
                if new is not None and new != op.results[0]:
                    op.results[0].replace_all_uses_with(new)
                    changed += 1
        dce(root)
        total += changed
        if not changed:
            break
    return total


@register_pass("poot-canonicalize", "semantic folds of poot ops (views, identities, constants)",
               {"max-fold-bytes": (int, 4096, "largest constant result folded, in bytes"),
                "no-signed-zeros": (bool, False, "fold x + 0.0 -> x for floats (ignores -0.0)"),
                "max-iterations": (int, 32, "sweeps before giving up on a fixed point")})
def run(module: ir.Operation, **opts) -> None:
    canonicalize(module, max_fold_bytes=opts.get("max-fold-bytes", 4096),
                 no_signed_zeros=opts.get("no-signed-zeros", False),
                 max_iterations=opts.get("max-iterations", 32))
