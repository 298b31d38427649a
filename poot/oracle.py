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
    results = _run_block(block, env, lookup_param, observer, _functions(g.module))
    return {n: np.asarray(v) for (n, _), v in zip(g.outputs, results)}


def _functions(module: ir.Module) -> dict[str, ir.Operation]:
    """``func.func`` ops of the module by symbol name (the callees of ``func.call``)."""
    out = {}
    for op in module.body.operations:
        if op.operation.name == "func.func":
            out[ir.StringAttr(op.operation.attributes["sym_name"]).value] = op.operation
    return out


def _run_block(block, env, lookup_param, observer, funcs, depth: int = 0) -> list:
    """Evaluate a function body; returns the values of its ``func.return``. A ``func.call``
    evaluates the callee's body recursively with the same semantics."""
    for op in block.operations:
        op = op.operation
        if op.name == "func.return":
            return [env[v] for v in op.operands]
        if op.name == "func.call":
            callee = ir.FlatSymbolRefAttr(op.attributes["callee"]).value
            fn = funcs.get(callee)
            if fn is None or not fn.regions[0].blocks:
                raise EvalError(f"func.call to '{callee}', which has no body in the module")
            if depth > 64:
                raise EvalError(f"func.call to '{callee}': call depth exceeds 64")
            body = fn.regions[0].blocks[0]
            inner = {arg: env[v] for arg, v in zip(body.arguments, op.operands)}
            outs = _run_block(body, inner, lookup_param, observer, funcs, depth + 1)
            for r, v in zip(op.results, outs):
                env[r] = v
            continue
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
