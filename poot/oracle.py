"""The CPU oracle: a numpy evaluator of poot modules, for tests and device checks.

Generation never calls it. Each op's semantics come from its one definition
(:meth:`poot.dialects.opdef.OpDef.evaluate`); this module only walks the function, binds
inputs and weights, and checks that bound values have exactly the declared types (it never
narrows or widens at bind: a bf16 input is bound from bf16 words).
"""

from __future__ import annotations

from typing import Callable, Mapping

import numpy as np
from mlir import ir

from poot.dialects.opdef import lookup, read_attrs
from poot.dialects.ops.packed import packed_value
from poot.dialects.types import PackedType, TensorType, type_from_mlir
from poot.errors import PootError
from poot.graph.builder import Graph


class EvalError(PootError):
    """A binding that does not match the graph, or an op the oracle cannot evaluate."""


Params = Mapping[str, np.ndarray] | Callable[[str], np.ndarray]
Observer = Callable[[ir.Operation, np.ndarray], None]


def evaluate(graph: Graph | ir.Module, inputs: Mapping[str, np.ndarray],
             params: Params | None = None, observer: Observer | None = None
             ) -> dict[str, np.ndarray]:
    """Evaluate the graph's function on ``inputs`` (by input name) and ``params`` (weight name
    -> array; packed weights as their stored uint8 bytes). Returns outputs by name.

    Raises :class:`EvalError` for a missing or mistyped binding or an unknown op.
    """
    g = graph if isinstance(graph, Graph) else Graph.from_module(graph)
    lookup_param = params if callable(params) else (lambda n: (params or {})[n])
    block = g.func.regions[0].blocks[0]
    env: dict[ir.Value, object] = {}
    for (name, t), arg in zip(g.inputs, block.arguments):
        if name not in inputs:
            raise EvalError(f"input '{name}' ({t}) is not bound")
        env[arg] = _bind(f"input '{name}'", inputs[name], t)
    for op in block.operations:
        op = op.operation
        if op.name == "func.return":
            return {n: np.asarray(env[v]) for (n, _), v in zip(g.outputs, op.operands)}
        env[op.results[0]] = _eval_op(op, env, lookup_param)
        if observer is not None:
            observer(op, env[op.results[0]])
    raise EvalError("function has no func.return")


def _eval_op(op: ir.Operation, env, lookup_param):
    opdef = lookup(op.name)
    if opdef is None:
        raise EvalError(f"the oracle has no semantics for '{op.name}'")
    rtype = type_from_mlir(op.results[0].type)
    attrs = read_attrs(opdef, op)
    if op.name in ("poot.param", "poot.packed_param"):
        name = attrs["name"]
        try:
            value = lookup_param(name)
        except KeyError:
            raise EvalError(f"weight '{name}' ({rtype}) is not bound") from None
        return _bind(f"weight '{name}'", value, rtype)
    args = [env[v] for v in op.operands]
    out = opdef.evaluate(args, attrs, rtype)
    return np.asarray(out, dtype=rtype.dtype.numpy).reshape(rtype.shape)


def _bind(what: str, value, t):
    if isinstance(t, PackedType):
        try:
            return packed_value(np.asarray(value), t)
        except ValueError as e:
            raise EvalError(f"{what}: {e}") from None
    value = np.asarray(value)
    assert isinstance(t, TensorType)
    if value.dtype != t.dtype.numpy or value.shape != t.shape:
        raise EvalError(f"{what} must be {t}, got {list(value.shape)} x {value.dtype}")
    return value
