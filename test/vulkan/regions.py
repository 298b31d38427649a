"""Test-side helpers: a fused step split into its dispatch regions, each a graph of its own
(``@region`` calling the outlined dispatch function), evaluated on the CPU oracle with the
values the whole step feeds it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from mlir import ir

from poot import oracle
from poot.dialects import make_context
from poot.graph.builder import Graph


@dataclass
class Region:
    name: str          # the dispatch function
    kind: str          # poot.dispatch kind (matmul, gather, ...)
    graph: Graph       # @region(a0, a1, ...) -> (r0, ...) calling it
    inputs: dict       # a<i> -> the value the step feeds it (from the oracle)
    want: dict         # r<j> -> the oracle's result


def _sym(op) -> str:
    return ir.StringAttr(op.attributes["sym_name"]).value


def region_graph(call: ir.Operation, callee: ir.Operation) -> Graph:
    ins = [str(v.type) for v in call.operands]
    outs = [str(r.type) for r in call.results]
    args = ", ".join(f'%a{i}: {t} {{poot.name = "a{i}"}}' for i, t in enumerate(ins))
    res = ", ".join(f'{t} {{poot.name = "r{j}"}}' for j, t in enumerate(outs))
    names = ", ".join(f"%a{i}" for i in range(len(ins)))
    rets = ", ".join(f"%r#{j}" for j in range(len(outs))) if len(outs) > 1 else "%r"
    head = f"%r:{len(outs)}" if len(outs) > 1 else "%r"
    text = (f"func.func @region({args}) -> ({res}) {{\n"
            f"  {head} = func.call @{_sym(callee)}({names}) : ({', '.join(ins)}) -> "
            f"({', '.join(outs)})\n  return {rets} : {', '.join(outs)}\n}}\n{callee}")
    ctx = make_context()
    with ctx, ir.Location.unknown():
        module = ir.Module.parse(text)
    return Graph.from_module(module)


def split_regions(program_graph: Graph, inputs: dict, weights) -> list[Region]:
    """Walk the fused step's entry function with the oracle; one :class:`Region` per call."""
    g = program_graph
    funcs = {_sym(o.operation): o.operation for o in g.module.body.operations
             if o.operation.name == "func.func"}
    block = g.func.regions[0].blocks[0]
    env = {arg: np.asarray(inputs[n]) for (n, _), arg in zip(g.inputs, block.arguments)}
    regions = []
    for op in block.operations:
        op = op.operation
        if op.name == "func.return":
            break
        if op.name == "func.call":
            callee = funcs[ir.FlatSymbolRefAttr(op.attributes["callee"]).value]
            rg = region_graph(op, callee)
            vals = {f"a{i}": env[v] for i, v in enumerate(op.operands)}
            want = oracle.evaluate(rg, vals)
            for j, r in enumerate(op.results):
                env[r] = want[f"r{j}"]
            kind = "dispatch"
            if "poot.dispatch" in callee.attributes:
                kind = ir.StringAttr(ir.DictAttr(callee.attributes["poot.dispatch"])["kind"]).value
            regions.append(Region(_sym(callee), kind, rg, vals, want))
        elif op.name in ("poot.param", "poot.packed_param"):
            env[op.results[0]] = np.asarray(weights[ir.StringAttr(op.attributes["name"]).value])
        else:
            env[op.results[0]] = oracle._eval_op(op, env, lambda n: weights[n])
    return regions
