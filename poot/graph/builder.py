"""The graph builder: records primitive poot ops into an MLIR module, under stated limits.

A :class:`Builder` is created with the :class:`TraceLimits` its caller states (there is no
default and no unlimited builder). Every call validates shapes and dtypes with the op's one
definition (:mod:`poot.dialects.opdef`) and checks the limits *before* creating anything; a
violation is a :class:`BuilderError` (or :class:`BuilderLimitExceeded`, naming the resource,
the limit and the attempted total).

    b = Builder(TraceLimits(max_values=1024, max_ops=1024, max_literal_bytes=4096,
                            max_owned_bytes=1 << 20))
    x = b.input("x", TensorType((1, 8), DType.F32))
    w = b.param("w", TensorType((8,), DType.F32))
    y = ops.rmsnorm(b, x, w, eps=1e-6)
    graph = b.finish({"y": y})

The result is a ``func.func`` whose arguments are the step inputs (``poot.name`` argument
attributes), whose weights are ``poot.param``/``poot.packed_param`` ops, and whose results are
the named outputs.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np
from poot.lazy import lazy_module
ir = lazy_module("mlir.ir")
func = lazy_module("mlir.dialects.func")

from poot.dialects import make_context
from poot.dialects.opdef import REGISTRY, VerifyError, attr_to_mlir
from poot.dialects.types import DType, PackedType, PootType, TensorType, type_from_mlir
from poot.errors import LimitExceeded, PootError


class BuilderError(PootError):
    """A builder call the graph does not admit: bad shape/dtype, foreign handle, finished
    builder."""


class BuilderLimitExceeded(BuilderError, LimitExceeded):
    """A builder call past one of its :class:`TraceLimits`; nothing was created."""

    def __init__(self, resource: str, limit: int, attempted: int):
        LimitExceeded.__init__(self, resource, limit, attempted, where="graph builder")


@dataclass(frozen=True)
class TraceLimits:
    """What one builder may construct. Every field is a positive bound.

    Attributes:
        max_values: SSA values (inputs + op results).
        max_ops: ops.
        max_literal_bytes: bytes of constant data embedded in the IR.
        max_owned_bytes: bytes of all op results (the storage the graph can ask for).
        max_tokens: tokens per step a model trace may request (read by model tracers).
    """

    max_values: int
    max_ops: int
    max_literal_bytes: int
    max_owned_bytes: int
    max_tokens: int = 1

    def __post_init__(self):
        for k, v in self.__dict__.items():
            if not isinstance(v, int) or v <= 0:
                raise ValueError(f"TraceLimits.{k} must be a positive int, got {v!r}")


class Tensor:
    """A handle to a value under construction: its :class:`TensorType`/:class:`PackedType`
    and the MLIR value. Arithmetic operators build elementwise ops with numpy broadcasting."""

    __slots__ = ("builder", "value", "type")

    def __init__(self, builder: "Builder", value: ir.Value, type_: PootType):
        self.builder, self.value, self.type = builder, value, type_

    @property
    def shape(self) -> tuple[int, ...]:
        return self.type.shape

    @property
    def dtype(self) -> DType:
        if isinstance(self.type, PackedType):
            raise BuilderError(f"packed value {self.type} has no dense dtype")
        return self.type.dtype

    @property
    def rank(self) -> int:
        return len(self.type.shape)

    def _other(self, other) -> "Tensor":
        if isinstance(other, Tensor):
            return other
        return self.builder.scalar(other, self.dtype)

    def __add__(self, o): return self.builder.binary("add", self, self._other(o))
    def __radd__(self, o): return self.builder.binary("add", self._other(o), self)
    def __sub__(self, o): return self.builder.binary("sub", self, self._other(o))
    def __rsub__(self, o): return self.builder.binary("sub", self._other(o), self)
    def __mul__(self, o): return self.builder.binary("mul", self, self._other(o))
    def __rmul__(self, o): return self.builder.binary("mul", self._other(o), self)
    def __truediv__(self, o): return self.builder.binary("div", self, self._other(o))
    def __rtruediv__(self, o): return self.builder.binary("div", self._other(o), self)
    def __neg__(self): return self.builder.unary("neg", self)

    def __repr__(self) -> str:
        return f"Tensor({self.type})"


@dataclass
class Graph:
    """A finished graph: the MLIR module (owning its context) and its interface.

    Attributes:
        module: ``builtin.module`` holding one ``func.func`` named ``name``.
        inputs / outputs: (name, type) in argument / result order.
        params: weight name -> type, for every ``poot.param``/``poot.packed_param``.
    """

    module: ir.Module
    name: str
    inputs: list[tuple[str, PootType]]
    outputs: list[tuple[str, PootType]]
    params: dict[str, PootType] = field(default_factory=dict)

    @property
    def context(self) -> ir.Context:
        return self.module.context

    @property
    def func(self) -> ir.Operation:
        return entry_function(self.module)

    def text(self) -> str:
        return str(self.module)

    def op_count(self) -> int:
        return sum(1 for _ in self.func.regions[0].blocks[0].operations) - 1

    @staticmethod
    def from_module(module: ir.Module) -> "Graph":
        """Read the interface of a module made by a builder (or parsed from its text)."""
        fn = entry_function(module)
        block = fn.regions[0].blocks[0]
        names = _names(fn, "arg_attrs", len(block.arguments), "arg")
        inputs = [(n, type_from_mlir(a.type)) for n, a in zip(names, block.arguments)]
        ret = list(block.operations)[-1]
        onames = _names(fn, "res_attrs", len(ret.operands), "out")
        outputs = [(n, type_from_mlir(v.type)) for n, v in zip(onames, ret.operands)]
        params = {}
        for op in block.operations:
            if op.operation.name in ("poot.param", "poot.packed_param"):
                params[ir.StringAttr(op.attributes["name"]).value] = type_from_mlir(
                    op.results[0].type)
        return Graph(module, ir.StringAttr(fn.attributes["sym_name"]).value, inputs, outputs,
                     params)


def entry_function(module: ir.Module) -> ir.Operation:
    """The step function: the first public ``func.func`` (dispatch regions are private)."""
    for op in module.body.operations:
        op = op.operation
        if op.name == "func.func" and "sym_visibility" not in op.attributes:
            return op
    raise BuilderError("module holds no public func.func")


def _names(fn: ir.Operation, key: str, n: int, prefix: str) -> list[str]:
    if key not in fn.attributes:
        return [f"{prefix}{i}" for i in range(n)]
    out = []
    for i, d in enumerate(ir.ArrayAttr(fn.attributes[key])):
        d = ir.DictAttr(d)
        out.append(ir.StringAttr(d["poot.name"]).value if "poot.name" in d else f"{prefix}{i}")
    return out


def broadcast_shapes(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...]:
    """numpy's broadcasting rule; raises BuilderError when the shapes do not broadcast."""
    out = []
    for x, y in zip(reversed((1,) * (len(b) - len(a)) + tuple(a)),
                    reversed((1,) * (len(a) - len(b)) + tuple(b))):
        if x != y and 1 not in (x, y):
            raise BuilderError(f"shapes {list(a)} and {list(b)} do not broadcast")
        out.append(max(x, y) if 1 in (x, y) else x)
    return tuple(reversed(out))


class Builder:
    """Records poot ops into one ``func.func``; see the module docstring."""

    def __init__(self, limits: TraceLimits, name: str = "step"):
        if not isinstance(limits, TraceLimits):
            raise BuilderError("Builder needs explicit TraceLimits")
        self.limits = limits
        self.name = name
        self.ctx = make_context()
        self._scope: list[str] = []
        self._values = self._ops = self._literal = self._owned = 0
        self._inputs: list[tuple[str, PootType]] = []
        self._params: dict[str, PootType] = {}
        self._finished = False
        with self.ctx, ir.Location.unknown():
            self.module = ir.Module.create()
            with ir.InsertionPoint(self.module.body):
                self._func = func.FuncOp(name, ir.FunctionType.get([], []))
            self._block = self._func.add_entry_block()

    # ---- bookkeeping -------------------------------------------------------------------
    def _charge(self, values: int = 0, ops: int = 0, literal: int = 0, owned: int = 0):
        lim = self.limits
        for resource, cur, add, limit in (("values", self._values, values, lim.max_values),
                                          ("ops", self._ops, ops, lim.max_ops),
                                          ("literal_bytes", self._literal, literal,
                                           lim.max_literal_bytes),
                                          ("owned_bytes", self._owned, owned,
                                           lim.max_owned_bytes)):
            if add and cur + add > limit:
                raise BuilderLimitExceeded(resource, limit, cur + add)
        self._values += values
        self._ops += ops
        self._literal += literal
        self._owned += owned

    def _own(self, t: Tensor) -> Tensor:
        if not isinstance(t, Tensor):
            raise BuilderError(f"expected a Tensor handle, got {type(t).__name__}")
        if t.builder is not self:
            raise BuilderError("tensor handle belongs to another builder")
        return t

    def _loc(self) -> ir.Location:
        return ir.Location.name(".".join(self._scope)) if self._scope else ir.Location.unknown()

    @contextlib.contextmanager
    def scope(self, name: str):
        """Name the ops built inside (their MLIR location), e.g. ``blk.3.attn``."""
        self._scope.append(name)
        try:
            yield
        finally:
            self._scope.pop()

    def op(self, name: str, operands: Sequence[Tensor], attrs: dict[str, Any] | None = None,
           result: PootType | None = None) -> Tensor:
        """Create ``poot.<name>``: validate with its definition, charge limits, then build."""
        if self._finished:
            raise BuilderError("builder is finished")
        opdef = REGISTRY[name]
        attrs = dict(attrs or {})
        operands = [self._own(t) for t in operands]
        try:
            rtype = opdef.check([t.type for t in operands], attrs, result)
        except VerifyError as e:
            raise BuilderError(str(e)) from None
        literal = attrs["value"].nbytes if name == "constant" else 0
        owned = rtype.nbytes if isinstance(rtype, TensorType) else 0
        self._charge(values=1, ops=1, literal=literal, owned=owned)
        with self.ctx, self._loc():
            mattrs = {k: attr_to_mlir(opdef.attrs[k].kind, v) for k, v in attrs.items()}
            with ir.InsertionPoint(self._block):
                mop = ir.Operation.create(opdef.full_name(), results=[rtype.mlir()],
                                          operands=[t.value for t in operands],
                                          attributes=mattrs)
        return Tensor(self, mop.result, rtype)

    # ---- sources -------------------------------------------------------------------------
    def input(self, name: str, type_: TensorType) -> Tensor:
        """A per-step input (token ids, positions, ...): a function argument named ``name``."""
        if self._finished:
            raise BuilderError("builder is finished")
        if any(n == name for n, _ in self._inputs):
            raise BuilderError(f"input '{name}' declared twice")
        self._charge(values=1, owned=type_.nbytes)
        with self.ctx, ir.Location.unknown():
            value = self._block.add_argument(type_.mlir(), ir.Location.unknown())
        self._inputs.append((name, type_))
        return Tensor(self, value, type_)

    def param(self, name: str, type_: PootType) -> Tensor:
        """A weight bound by ``name`` at load: dense (``poot.param``) or packed."""
        if name in self._params:
            if self._params[name] != type_:
                raise BuilderError(f"param '{name}' redeclared as {type_}, was "
                                   f"{self._params[name]}")
        self._params[name] = type_
        kind = "packed_param" if isinstance(type_, PackedType) else "param"
        return self.op(kind, [], {"name": name}, type_)

    def constant(self, value: np.ndarray) -> Tensor:
        """A literal tensor (counted against ``max_literal_bytes``)."""
        value = np.asarray(value)
        return self.op("constant", [], {"value": value})

    def scalar(self, value, dtype: DType = DType.F32) -> Tensor:
        """A rank-0 literal of ``dtype`` (bf16 spelled as f32 + cast)."""
        if dtype is DType.BF16:
            return self.cast(self.scalar(value, DType.F32), DType.BF16)
        return self.constant(np.array(value, dtype=dtype.numpy))

    def full(self, shape: Sequence[int], value, dtype: DType = DType.F32) -> Tensor:
        """A tensor of one value (a scalar broadcast; no literal bytes beyond one element)."""
        return self.broadcast_to(self.scalar(value, dtype), shape)

    def iota(self, shape: Sequence[int], axis: int, dtype: DType = DType.I32) -> Tensor:
        return self.op("iota", [], {"axis": axis}, TensorType(tuple(shape), dtype))

    # ---- elementwise ---------------------------------------------------------------------
    def _broadcast_pair(self, *xs: Tensor) -> list[Tensor]:
        shape: tuple[int, ...] = ()
        for x in xs:
            shape = broadcast_shapes(shape, self._own(x).shape)
        return [self.broadcast_to(x, shape) for x in xs]

    def unary(self, fn: str, x: Tensor) -> Tensor:
        return self.op("unary", [x], {"fn": fn})

    def binary(self, fn: str, a: Tensor, b: Tensor) -> Tensor:
        """Elementwise ``fn`` with numpy broadcasting (explicit broadcast ops inserted)."""
        return self.op("binary", self._broadcast_pair(a, b), {"fn": fn})

    def ternary(self, fn: str, a: Tensor, b: Tensor, c: Tensor) -> Tensor:
        return self.op("ternary", self._broadcast_pair(a, b, c), {"fn": fn})

    def compare(self, pred: str, a: Tensor, b: Tensor) -> Tensor:
        return self.op("compare", self._broadcast_pair(a, b), {"pred": pred})

    def select(self, cond: Tensor, a: Tensor, b: Tensor) -> Tensor:
        return self.op("select", self._broadcast_pair(cond, a, b))

    def cast(self, x: Tensor, dtype: DType) -> Tensor:
        x = self._own(x)
        if x.dtype is dtype:
            return x
        return self.op("cast", [x], {}, x.type.with_dtype(dtype))

    # ---- reductions, contractions, indexing ----------------------------------------------
    def reduce(self, fn: str, x: Tensor, axes: int | Iterable[int], keepdims: bool = False
               ) -> Tensor:
        """``fn`` over ``axes`` (negative axes count from the end)."""
        x = self._own(x)
        axes = [axes] if isinstance(axes, int) else list(axes)
        axes = sorted({a % x.rank if -x.rank <= a < x.rank else a for a in axes})
        y = self.op("reduce", [x], {"fn": fn, "axes": tuple(axes)})
        if keepdims:
            y = self.reshape(y, [1 if i in axes else d for i, d in enumerate(x.shape)])
        return y

    def matmul(self, a: Tensor, b: Tensor, out_dtype: DType | None = None) -> Tensor:
        """``a @ b`` over equal batch dims; f32 accumulation (i32 for i8 operands)."""
        a, b = self._own(a), self._own(b)
        acc = DType.I32 if a.dtype is DType.I8 else DType.F32
        result = None
        if out_dtype is not None:
            result = TensorType(a.shape[:-1] + b.shape[-1:], out_dtype)
        return self.op("matmul", [a, b], {"acc": acc}, result)

    def indexed_matmul(self, x: Tensor, w: Tensor, idx: Tensor) -> Tensor:
        """``poot.indexed_matmul``: row t of x [T, K] against slab ``idx[t]`` of w [E, O, K]
        -> f32 [T, O] (only the selected slabs are read)."""
        return self.op("indexed_matmul", [x, w, idx], {"acc": DType.F32})

    def gather(self, table: Tensor, indices: Tensor, axis: int = 0) -> Tensor:
        return self.op("gather", [table, indices], {"axis": axis})

    def scatter(self, dest: Tensor, indices: Tensor, updates: Tensor) -> Tensor:
        return self.op("scatter", [dest, indices, updates])

    def dequantize(self, packed: Tensor, dtype: DType = DType.F32) -> Tensor:
        return self.op("dequantize", [packed], {}, TensorType(packed.shape, dtype))

    # ---- shape ---------------------------------------------------------------------------
    def broadcast_to(self, x: Tensor, shape: Sequence[int],
                     dims: Sequence[int] | None = None) -> Tensor:
        """Broadcast ``x`` to ``shape``; ``dims`` defaults to numpy's trailing alignment."""
        x = self._own(x)
        shape = tuple(shape)
        if dims is None:
            if x.shape == shape:
                return x
            dims = tuple(range(len(shape) - x.rank, len(shape)))
        return self.op("broadcast", [x], {"dims": tuple(dims)}, TensorType(shape, x.dtype))

    def reshape(self, x: Tensor, shape: Sequence[int]) -> Tensor:
        """Row-major reshape; one ``-1`` entry is inferred."""
        x = self._own(x)
        shape = list(shape)
        if shape.count(-1) == 1:
            known = int(np.prod([d for d in shape if d != -1]))
            if known == 0 or x.type.numel % known:
                raise BuilderError(f"cannot reshape {x.type} to {shape}")
            shape[shape.index(-1)] = x.type.numel // known
        if tuple(shape) == x.shape:
            return x
        return self.op("reshape", [x], {}, x.type.with_shape(shape))

    def transpose(self, x: Tensor, perm: Sequence[int]) -> Tensor:
        return self.op("transpose", [x], {"perm": tuple(perm)})

    def slice(self, x: Tensor, start: Sequence[int], limit: Sequence[int],
              stride: Sequence[int] | None = None) -> Tensor:
        stride = tuple(stride) if stride is not None else (1,) * len(start)
        return self.op("slice", [x], {"start": tuple(start), "limit": tuple(limit),
                                      "stride": stride})

    def slice_axis(self, x: Tensor, axis: int, start: int, limit: int, step: int = 1) -> Tensor:
        """``x[..., start:limit:step, ...]`` on one axis."""
        x = self._own(x)
        axis = self._axis(axis, x.rank)
        st = [0] * x.rank
        li = list(x.shape)
        sd = [1] * x.rank
        st[axis], li[axis], sd[axis] = start, limit, step
        return self.slice(x, st, li, sd)

    def concat(self, xs: Sequence[Tensor], axis: int) -> Tensor:
        """Join ``xs`` along ``axis`` (a chain of binary ``poot.concat``)."""
        xs = [self._own(x) for x in xs]
        if not xs:
            raise BuilderError("concat needs at least one tensor")
        axis = self._axis(axis, xs[0].rank)
        out = xs[0]
        for x in xs[1:]:
            out = self.op("concat", [out, x], {"axis": axis})
        return out

    @staticmethod
    def _axis(axis: int, rank: int) -> int:
        if not -rank <= axis < rank:
            raise BuilderError(f"axis {axis} is out of range for rank {rank}")
        return axis % rank

    # ---- finish ----------------------------------------------------------------------------
    def finish(self, outputs: Tensor | dict[str, Tensor]) -> Graph:
        """Return the named outputs and close the function; the builder is then spent."""
        if self._finished:
            raise BuilderError("builder is finished")
        if isinstance(outputs, Tensor):
            outputs = {"output": outputs}
        outs = [(n, self._own(t)) for n, t in outputs.items()]
        with self.ctx, ir.Location.unknown():
            with ir.InsertionPoint(self._block):
                func.ReturnOp([t.value for _, t in outs])
            fop = self._func.operation
            fop.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(
                [t.mlir() for _, t in self._inputs], [t.type.mlir() for _, t in outs]))
            fop.attributes["arg_attrs"] = _name_attrs(n for n, _ in self._inputs)
            fop.attributes["res_attrs"] = _name_attrs(n for n, _ in outs)
        self._finished = True
        return Graph(self.module, self.name, list(self._inputs),
                     [(n, t.type) for n, t in outs], dict(self._params))


def _name_attrs(names: Iterable[str]) -> ir.ArrayAttr:
    return ir.ArrayAttr.get([ir.DictAttr.get({"poot.name": ir.StringAttr.get(n)})
                             for n in names])
