"""Expected results for the device check, computed on the host with the CPU oracle (needs
MLIR; the device side, :mod:`poot.backends.cuda.devcheck`, does not).

    write_check_bundle(folder, program, artifact, weights, steps)

writes ``folder/plan.json`` + ``kernels.ptx`` (the artifact), ``weights.npz`` (unless
``with_weights=False``) and ``fixtures.npz``:

* ``d{i}.a{j}`` / ``d{i}.o{j}``: the j-th argument / result of the i-th dispatch call of the
  step, as the oracle computes them on the first step's inputs (weights are not repeated:
  the device binds them by name);
* ``s{k}.in.{name}`` / ``s{k}.out.{name}``: per-step inputs (not carried state) and expected
  non-carried outputs over ``steps`` consecutive steps, carried state starting at zero and
  threaded through the oracle like the device threads it.
"""

from __future__ import annotations

import os
from typing import Mapping, Sequence

import numpy as np
from mlir import ir

from poot.oracle import _bind, _eval_op, _functions, _run_block  # the oracle's own walk


def _host(v, spec: dict) -> np.ndarray:
    """An oracle value as the device stores it (i1 as bytes, bf16/f16 as words)."""
    a = np.asarray(v)
    if a.dtype == np.bool_:
        return a.astype(np.uint8)
    if spec["dtype"] == "uint16" and a.dtype.itemsize == 2:
        return a.view(np.uint16)
    return a


def oracle_step(program, weights: Mapping[str, np.ndarray], inputs: Mapping[str, np.ndarray],
                record: bool = True):
    """Run the step on the oracle, call by call. Returns (outputs by name, per-call
    (args, results) value lists in step order)."""
    g = program.graph
    block = g.func.regions[0].blocks[0]
    funcs = _functions(g.module)
    lookup = lambda n: weights[n]  # noqa: E731
    env = {}
    for (name, t), arg in zip(g.inputs, block.arguments):
        env[arg] = _bind(f"input '{name}'", inputs[name], t)
    calls = []
    for op in block.operations:
        op = op.operation
        if op.name == "func.return":
            outs = [env[v] for v in op.operands]
            return {n: np.asarray(v) for (n, _), v in zip(g.outputs, outs)}, calls
        if op.name == "func.call":
            callee = ir.FlatSymbolRefAttr(op.attributes["callee"]).value
            body = funcs[callee].regions[0].blocks[0]
            args = [env[v] for v in op.operands]
            res = _run_block(body, dict(zip(body.arguments, args)), lookup, None, funcs, 1)
            for r, v in zip(op.results, res):
                env[r] = v
            if record:
                calls.append((args, res))
            continue
        env[op.results[0]] = _eval_op(op, env, lookup)
    raise RuntimeError("step function has no return")


def make_fixtures(program, artifact, weights: Mapping[str, np.ndarray],
                  steps: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Fixture arrays (see the module doc) for ``steps`` (per-step inputs, carried state
    excluded) of ``program``, whose compiled form is ``artifact``."""
    plan = artifact.plan
    specs = {b["id"]: b for b in plan["buffers"]}
    carried = {o["aliases"]: o["name"] for o in plan["outputs"] if o.get("aliases")}
    state = {x["name"]: np.zeros(x["shape"], np.dtype(x["dtype"])) for x in plan["inputs"]
             if x["name"] in carried}
    g = program.graph
    types = dict(g.inputs)
    fx: dict[str, np.ndarray] = {}
    for k, step_inputs in enumerate(steps):
        ins = dict(step_inputs)
        for n, v in state.items():
            # f16/bf16 state is held as the device holds it (16-bit words)
            ins[n] = v.view(types[n].dtype.numpy) if v.dtype == np.uint16 else \
                v.astype(types[n].dtype.numpy)
        outs, calls = oracle_step(program, weights, ins, record=(k == 0))
        for n, v in step_inputs.items():
            fx[f"s{k}.in.{n}"] = np.asarray(v)
        for o in plan["outputs"]:
            if o.get("aliases"):
                state[o["aliases"]] = _host(outs[o["name"]], o)
            else:
                fx[f"s{k}.out.{o['name']}"] = _host(outs[o["name"]], o)
        if k == 0:
            for i, (d, (args, res)) in enumerate(zip(plan["dispatches"], calls)):
                for j, (bid, v) in enumerate(zip(d["args"], args)):
                    if specs[bid]["role"] != "param":
                        fx[f"d{i}.a{j}"] = _host(v, specs[bid])
                for j, (bid, v) in enumerate(zip(d["outs"], res)):
                    fx[f"d{i}.o{j}"] = _host(v, specs[bid])
    for n, v in state.items():
        fx[f"final.{carried[n]}"] = v
    return fx


def greedy_inputs(program, artifact, weights: Mapping[str, np.ndarray],
                  steps: Sequence[Mapping[str, np.ndarray]], forced: int) -> list[dict]:
    """``steps`` (per-step inputs of a decode step, batch B) with ``tokens`` [B, 1] of every
    step from ``forced`` on replaced by the oracle's greedy choice: the argmax of its logits
    [B, 1, V] at the step before (lowest id on a tie), carried state threaded as
    :func:`make_fixtures` threads it. The device check then compares each step's logits and
    their argmax against the oracle's (a bundle of greedy tokens)."""
    plan = artifact.plan
    carried = {o["aliases"]: o["name"] for o in plan["outputs"] if o.get("aliases")}
    state = {x["name"]: np.zeros(x["shape"], np.dtype(x["dtype"])) for x in plan["inputs"]
             if x["name"] in carried}
    types = dict(program.graph.inputs)
    out: list[dict] = []
    prev = None
    for k, step in enumerate(steps):
        ins = dict(step)
        if k >= forced and prev is not None:
            ins["tokens"] = prev.reshape(ins["tokens"].shape).astype(np.int32)
        out.append(ins)
        run = dict(ins)
        for n, v in state.items():
            run[n] = v.view(types[n].dtype.numpy) if v.dtype == np.uint16 else \
                v.astype(types[n].dtype.numpy)
        outs, _ = oracle_step(program, weights, run, record=False)
        for o in plan["outputs"]:
            if o.get("aliases"):
                state[o["aliases"]] = _host(outs[o["name"]], o)
        prev = np.argmax(outs["logits"].reshape(outs["logits"].shape[0], -1), axis=-1)
    return out


def write_check_bundle(folder: str, program, artifact, weights: Mapping[str, np.ndarray],
                       steps: Sequence[Mapping[str, np.ndarray]], with_weights: bool = True
                       ) -> str:
    """Artifact + fixtures (+ weights) in ``folder``: everything the device check reads."""
    artifact.save(folder)
    np.savez(os.path.join(folder, "fixtures.npz"),
             **make_fixtures(program, artifact, weights, steps))
    if with_weights:
        names = {p["name"] for p in artifact.plan["params"]}
        np.savez(os.path.join(folder, "weights.npz"),
                 **{n: np.asarray(weights[n]) for n in names})
    return folder


__all__ = ["greedy_inputs", "make_fixtures", "oracle_step", "write_check_bundle"]
