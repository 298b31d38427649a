"""The one definition of each poot op: structure, type rule and semantics.

Every op of the dialect is an :class:`OpDef` subclass registered with :func:`register`. That one
class is read by

* the IRDL generator (:mod:`poot.dialects.irdl`), which derives the structural constraints
  (operand kinds, attribute kinds) MLIR checks when parsing;
* the type rule :meth:`OpDef.check`, used by the graph builder to infer result types and by
  the verifier (:mod:`poot.dialects.verify`) to reject malformed IR with a diagnostic that
  names the op and the problem;
* :meth:`OpDef.evaluate`, the reference semantics the CPU oracle runs;
* the lowerings, which must agree with ``evaluate`` within the tolerance they state.

Attribute values on the Python side: ``i64`` -> int, ``i64s`` -> tuple[int, ...], ``str`` and
``enum`` -> str, ``type`` -> :class:`DType`, ``f64`` -> float, ``dense`` -> numpy array.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from poot.lazy import lazy_module
ir = lazy_module("mlir.ir")

from poot.dialects.types import DType, PackedType, PootType, TensorType
from poot.errors import PootError


class VerifyError(PootError):
    """An op whose operands, attributes or result type break its rule.

    Attributes:
        op: the op name (``poot.matmul``); problem: what is wrong.
    """

    def __init__(self, op: str, problem: str):
        self.op, self.problem = op, problem
        super().__init__(f"'{op}' op {problem}")


@dataclass(frozen=True)
class Attr:
    """An attribute slot: ``kind`` is one of i64, i64s, str, enum, type, f64, dense."""

    kind: str
    choices: tuple[str, ...] = ()
    doc: str = ""


# (IRDL base constraint, to-MLIR, from-MLIR) per attribute kind.
def _i64(v):
    return ir.IntegerAttr.get(ir.IntegerType.get_signless(64), int(v))


_ATTR_KINDS = {
    "i64": ("#builtin.integer", _i64, lambda a: ir.IntegerAttr(a).value),
    "i64s": ("#builtin.dense_array", lambda v: ir.DenseI64ArrayAttr.get([int(x) for x in v]),
             lambda a: tuple(ir.DenseI64ArrayAttr(a))),
    "str": ("#builtin.string", lambda v: ir.StringAttr.get(v), lambda a: ir.StringAttr(a).value),
    "enum": ("#builtin.string", lambda v: ir.StringAttr.get(v), lambda a: ir.StringAttr(a).value),
    "type": ("#builtin.type", lambda v: ir.TypeAttr.get(v.mlir()),
             lambda a: DType.from_mlir(ir.TypeAttr(a).value)),
    "f64": ("#builtin.float", lambda v: ir.FloatAttr.get(ir.F64Type.get(), float(v)),
            lambda a: ir.FloatAttr(a).value),
    "dense": ("#builtin.dense_int_or_fp_elements", None, None),
}


def attr_irdl_base(kind: str) -> str:
    return _ATTR_KINDS[kind][0]


def attr_to_mlir(kind: str, value: Any) -> ir.Attribute:
    if kind == "dense":
        return dense_to_mlir(value)
    return _ATTR_KINDS[kind][1](value)


def attr_from_mlir(kind: str, attr: ir.Attribute) -> Any:
    if kind == "dense":
        return dense_from_mlir(attr)
    return _ATTR_KINDS[kind][2](attr)


def dense_to_mlir(value: np.ndarray) -> ir.Attribute:
    """A numpy array as a DenseElementsAttr (splat when all elements are equal)."""
    value = np.asarray(value)
    dtype = DType.from_numpy(value.dtype)
    if dtype is DType.BF16:
        raise TypeError("bf16 constants are spelled as an f32 constant and a cast")
    ttype = TensorType(value.shape, dtype).mlir()
    flat = value.reshape(-1)
    if flat.size and (flat == flat[0]).all():
        return ir.DenseElementsAttr.get_splat(ttype, _scalar_attr(dtype, flat[0]))
    if dtype is DType.I1:
        # The buffer protocol path wants bit-packed i1 data; spell small bool tensors as text.
        body = np.array2string(value, separator=", ", threshold=value.size + 1,
                               formatter={"bool": lambda b: "true" if b else "false"})
        return ir.Attribute.parse(f"dense<{body.replace(chr(10), '')}> : {ttype}")
    return ir.DenseElementsAttr.get(np.ascontiguousarray(value), type=ttype)


def _scalar_attr(dtype: DType, v) -> ir.Attribute:
    if dtype.is_float:
        return ir.FloatAttr.get(dtype.mlir(), float(v))
    return ir.IntegerAttr.get(dtype.mlir(), int(v))


def dense_from_mlir(attr: ir.Attribute) -> np.ndarray:
    d = ir.DenseElementsAttr(attr)
    t = TensorType(tuple(ir.RankedTensorType(d.type).shape),
                   DType.from_mlir(ir.RankedTensorType(d.type).element_type))
    if d.is_splat:
        s = d.get_splat_value()
        v = ir.FloatAttr(s).value if t.dtype.is_float else ir.IntegerAttr(s).value
        if t.dtype.is_bool:
            v = bool(v & 1)
        return np.full(t.shape, v, dtype=t.dtype.numpy)
    return np.array(d).astype(t.dtype.numpy, copy=False).reshape(t.shape)


class OpDef:
    """Base of op definitions. Subclasses set the class attributes and override
    :meth:`check` and :meth:`evaluate`.

    Class attributes:
        name: mnemonic (``matmul``); the op is ``poot.<name>``.
        operands: operand names; a leading ``*`` marks the one variadic operand.
        packed_operands: names of operands that are ``!poot.packed`` rather than tensors.
        packed_result: whether the result is ``!poot.packed``.
        attrs: attribute slots by name.
        summary: one line for ``poot-opt --help`` and docs.
    """

    name: ClassVar[str]
    operands: ClassVar[tuple[str, ...]] = ()
    packed_operands: ClassVar[tuple[str, ...]] = ()
    packed_result: ClassVar[bool] = False
    attrs: ClassVar[dict[str, Attr]] = {}
    summary: ClassVar[str] = ""

    @classmethod
    def full_name(cls) -> str:
        return f"poot.{cls.name}"

    @classmethod
    def fail(cls, problem: str):
        raise VerifyError(cls.full_name(), problem)

    @classmethod
    def check(cls, operands: list[PootType], attrs: dict[str, Any],
              result: PootType | None) -> PootType:
        """Validate operand types and attributes; return the result type.

        ``result`` is the declared result type when there is one (parsed IR, or a builder call
        that must state it, such as reshape's target shape); ops whose result follows from the
        operands compare it with the inferred one. Raises :class:`VerifyError`.
        Every registered op overrides it (:func:`register` checks).
        """
        raise TypeError(f"{cls.full_name()} has no type rule")

    @classmethod
    def evaluate(cls, args: list[np.ndarray], attrs: dict[str, Any],
                 result: PootType) -> np.ndarray:
        """Reference semantics on numpy arrays (the CPU oracle). Every registered op
        overrides it (:func:`register` checks)."""
        raise TypeError(f"{cls.full_name()} has no semantics")

    # ---- helpers shared by the rules ----
    @classmethod
    def check_attrs(cls, attrs: dict[str, Any]) -> None:
        for key, spec in cls.attrs.items():
            if key not in attrs:
                cls.fail(f"requires attribute '{key}'")
            if spec.kind == "enum" and attrs[key] not in spec.choices:
                cls.fail(f"attribute '{key}' = \"{attrs[key]}\" is not one of "
                         f"{', '.join(spec.choices)}")
        for key in attrs:
            if key not in cls.attrs:
                cls.fail(f"has unknown attribute '{key}'")

    @classmethod
    def tensor(cls, t: PootType, what: str) -> TensorType:
        if not isinstance(t, TensorType):
            cls.fail(f"{what} must be a tensor, got {t}")
        return t

    @classmethod
    def same_result(cls, inferred: PootType, result: PootType | None) -> PootType:
        if result is not None and result != inferred:
            cls.fail(f"result type {result} does not match the inferred type {inferred}")
        return inferred

    @classmethod
    def need_result(cls, result: PootType | None) -> TensorType:
        if result is None:
            cls.fail("needs an explicit result type")
        return cls.tensor(result, "result")

    @classmethod
    def axis(cls, axis: int, rank: int, what: str = "axis") -> int:
        if not 0 <= axis < rank:
            cls.fail(f"{what} {axis} is out of range for rank {rank}")
        return axis


REGISTRY: dict[str, type[OpDef]] = {}


def register(cls: type[OpDef]) -> type[OpDef]:
    """Class decorator adding an op definition to the dialect."""
    if cls.name in REGISTRY:
        raise ValueError(f"poot.{cls.name} defined twice")
    for rule in ("check", "evaluate"):
        if getattr(cls, rule).__func__ is getattr(OpDef, rule).__func__:
            raise TypeError(f"poot.{cls.name} does not define its {rule} rule")
    REGISTRY[cls.name] = cls
    return cls


def lookup(full_name: str) -> type[OpDef] | None:
    """The definition of ``poot.<name>``, or None for ops of other dialects."""
    if not full_name.startswith("poot."):
        return None
    return REGISTRY.get(full_name[5:])


def read_attrs(opdef: type[OpDef], op: ir.Operation) -> dict[str, Any]:
    """Python values of ``op``'s attributes by ``opdef``'s slots; unknown ones kept raw."""
    out: dict[str, Any] = {}
    for i in range(len(op.attributes)):
        named = op.attributes[i]
        spec = opdef.attrs.get(named.name)
        out[named.name] = attr_from_mlir(spec.kind, named.attr) if spec else named.attr
    return out


def float_compute(x: np.ndarray) -> np.ndarray:
    """Oracle convention: f16/bf16 arithmetic is done in f32, then rounded to the result."""
    return x.astype(np.float32) if x.dtype.kind == "f" or x.dtype.name == "bfloat16" else x
