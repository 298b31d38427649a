"""KV cache storage on the CPU: SmolLM2-135M (GGUF Q4_1) decode with a q8_0 KV cache against
an f16 one, at several context lengths, and what the same KV memory holds. Prints one JSON
object.

    python bench/kv_storage.py [--contexts 512,2048,3500,4096] [--steps 20] [--rounds 3]
    python bench/kv_storage.py --attention [...]   # one layer's paged attention alone

Each storage's decode step (batch 1, KV capacity 4096 in 32-position blocks, as the engine
compiles it) is compiled once and run alone in a loop with fixed inputs (prebuilt arguments,
no host work): the token at position ``context - 1`` attends to ``context`` keys read through
the block table. Per context the two storages are timed alternately, ``--rounds`` times
``--steps`` steps each, and the best mean per step is kept (the machine is shared: noise only
adds time). ``speedup`` is f16's time over q8_0's (>= 1: q8_0 is as fast or faster);
``load_avg_1min``: the machine's 1-minute load average when the run started and ended.
``capacity``: the blocks and full-context sequences a 256 MiB ``--kv-memory`` pool holds in
each storage (:func:`poot.api.memory.plan_kv`, what ``poot serve --kv-memory`` admits).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cpu_step import prepared_call  # noqa: E402

CAPACITY, BS = 4096, 32
STORAGES = ("f16", "q8_0")


def compile_decode(model, weights, storage):
    """The batch-1 decode step over a 4096-position paged pool in ``storage``."""
    from poot.api.options import kv_dtype_of
    from poot.compiler import CompileOptions, compile
    from poot.compiler.target import host_cpu
    from poot.models import StepSpec

    spec = StepSpec.decode(kv_capacity=CAPACITY, block_size=BS,
                           num_blocks=CAPACITY // BS + 1, kv_dtype=kv_dtype_of(storage))
    t0 = time.perf_counter()
    program = compile(model.trace(spec, weights.types), host_cpu(), CompileOptions())
    return program.executable, time.perf_counter() - t0


def step_inputs(prog, context: int, rng) -> dict[str, np.ndarray]:
    """Random pools (i8 values in [-127, 127], small f16 scales or values) and one decode
    token at position ``context - 1`` whose table lists blocks 1..W in order."""
    inputs = {}
    for n, t in prog.inputs:
        if n.startswith("kv.") and t.dtype.value == "i8":
            inputs[n] = rng.integers(-127, 128, t.shape).astype(np.int8)
        elif n.startswith("kv."):
            inputs[n] = (rng.standard_normal(t.shape) * 0.01).astype(t.dtype.numpy)
        else:
            inputs[n] = np.zeros(t.shape, t.dtype.numpy)
    pos = context - 1
    inputs["tokens"][...] = 42
    inputs["positions"][...] = pos
    inputs["block_table"][0] = np.arange(1, CAPACITY // BS + 1)
    inputs["slot_mapping"][0] = (1 + pos // BS) * BS + pos % BS
    return inputs


def best_step_s(call, steps: int) -> float:
    for _ in range(2):
        call()
    t0 = time.perf_counter()
    for _ in range(steps):
        call()
    return (time.perf_counter() - t0) / steps


def attention_alone(contexts, steps: int, rounds: int, threads: int) -> list[dict]:
    """One layer's ``poot.paged_attention`` at SmolLM2's decode shape (3 KV heads of 3 query
    heads, D = 64, the 4096-position pool of :func:`compile_decode`), compiled alone: f16
    pools, q8_0 pools (the CPU kernel), and q8_0 pools through the generic lowering (no
    backend kernel, as before it), each on one thread and on ``threads``. Per context: the
    best mean wall time per call in microseconds, all timed alternately (one thread is the
    steadier number on a shared machine: two threads wait for each other when another
    process holds a core)."""
    from dataclasses import replace

    from poot.backends.cpu.codegen import compile_cpu, strategy_for
    from poot.dialects.kv_quant import quantize_q8_0
    from poot.dialects.types import DType, TensorType
    from poot.graph.builder import Builder, TraceLimits

    nb, h, d, w = CAPACITY // BS + 1, 3, 64, CAPACITY // BS
    rng = np.random.default_rng(0)
    kx, vx = (rng.standard_normal((nb, BS, h, d)).astype(np.float32) for _ in range(2))
    pools = {"f16": [kx.astype(np.float16), vx.astype(np.float16)],
             "q8_0": [*zip(quantize_q8_0(kx), quantize_q8_0(vx))]}
    pools["q8_0"] = [pools["q8_0"][0][0], pools["q8_0"][0][1], pools["q8_0"][1][0],
                     pools["q8_0"][1][1]]                       # kq, vq, ks, vs

    def program(storage, strategy):
        b = Builder(TraceLimits(max_values=64, max_ops=64, max_literal_bytes=1 << 22,
                                max_owned_bytes=1 << 30))
        arrs = pools[storage]
        ins = [b.input("q", TensorType((1, h, 3, 1, d), DType.F32))]
        ins += [b.input(f"p{i}", TensorType(a.shape, DType.from_numpy(a.dtype)))
                for i, a in enumerate(arrs[:2])]
        ins += [b.input("bt", TensorType((1, w), DType.I32)),
                b.input("m", TensorType((1, 1, 1, 1, w * BS), DType.I1))]
        ins += [b.input(f"p{i + 2}", TensorType(a.shape, DType.F16))
                for i, a in enumerate(arrs[2:])]
        out = b.op("paged_attention", ins, {"scale": 0.125, "softcap": 0.0})
        return compile_cpu(b.finish(out), strategy=strategy)

    kinds, progs = {}, {}
    for t in sorted({1, threads}):
        for storage, generic in (("f16", False), ("q8_0", False), ("q8_0", True)):
            k = f"{storage}{'_generic' if generic else ''}_t{t}"
            st = strategy_for(threads=t)
            kinds[k] = storage
            progs[k] = program(storage, replace(st, kernels=None) if generic else st)
    rows = []
    for ctx in contexts:
        base = {"q": rng.standard_normal((1, h, 3, 1, d)).astype(np.float32),
                "bt": np.arange(1, w + 1, dtype=np.int32)[None],
                "m": (np.arange(w * BS) < ctx).reshape(1, 1, 1, 1, -1)}
        calls = {k: prepared_call(p, {**base, **{f"p{i}": a for i, a in
                                                 enumerate(pools[kinds[k]])}}, {})
                 for k, p in progs.items()}
        wall = {k: float("inf") for k in calls}
        for _ in range(rounds):
            for k, call in calls.items():
                wall[k] = min(wall[k], best_step_s(call, steps))
        rows.append({"context": ctx, **{f"{k}_us": round(v * 1e6, 1) for k, v in wall.items()}})
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return rows


def capacity(model, weights, kv_memory: int) -> dict:
    """Blocks and full-context (4096) sequences ``kv_memory`` bytes hold per storage."""
    from poot.api.memory import plan_kv
    from poot.api.options import kv_dtype_of
    from poot.compiler.target import host_cpu

    out = {}
    for s in STORAGES:
        kv = plan_kv(model, weights.types, host_cpu(), CAPACITY, 1, None, kv_dtype_of(s),
                     kv_memory)
        usable = kv.num_blocks - 1
        out[s] = {"blocks": usable, "sequences_at_4096": usable // (CAPACITY // BS),
                  "kv_bytes_per_token": model.dims().n_layers * kv.token_bytes(model.dims())}
    out["blocks_ratio"] = round(out["q8_0"]["blocks"] / out["f16"]["blocks"], 3)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", default="512,2048,3500,4096")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--attention", action="store_true",
                    help="time one layer's paged attention alone (f16, q8_0, q8_0 through "
                         "the generic lowering) instead of the decode step")
    a = ap.parse_args(argv)
    contexts = [int(c) for c in a.contexts.split(",")]
    if a.attention:
        load0 = round(os.getloadavg()[0], 2)
        from poot.backends.cpu.codegen import cpu_threads
        rows = attention_alone(contexts, a.steps, a.rounds, cpu_threads())
        json.dump({"attention_per_layer": rows, "steps": a.steps, "rounds": a.rounds,
                   "load_avg_1min": {"start": load0, "end": round(os.getloadavg()[0], 2)}},
                  sys.stdout, indent=1)
        print()
        return 0
    from poot.backends.cpu.codegen import cpu_threads
    from poot.load.bundled import smollm2_gguf
    from poot.models import load_model

    load0 = round(os.getloadavg()[0], 2)     # the machine is shared: how busy it was
    model, weights = load_model(str(smollm2_gguf()))
    progs, compile_s = {}, {}
    for s in STORAGES:
        progs[s], compile_s[s] = compile_decode(model, weights, s)
    params = {s: {n: np.asarray(weights[n]) for n, _ in p.params} for s, p in progs.items()}
    rng = np.random.default_rng(0)
    rows = []
    for ctx in contexts:
        calls = {s: prepared_call(progs[s], step_inputs(progs[s], ctx, rng), params[s])
                 for s in STORAGES}
        best = {s: float("inf") for s in STORAGES}
        for _ in range(a.rounds):
            for s in STORAGES:
                best[s] = min(best[s], best_step_s(calls[s], a.steps))
        rows.append({"context": ctx, **{f"{s}_ms": round(best[s] * 1e3, 3) for s in STORAGES},
                     "speedup": round(best["f16"] / best["q8_0"], 3)})
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        del calls
    report = {"model": os.path.basename(str(smollm2_gguf())), "kv_capacity": CAPACITY,
              "load_avg_1min": {"start": load0, "end": round(os.getloadavg()[0], 2)},
              "block_size": BS, "threads": cpu_threads(), "steps": a.steps,
              "rounds": a.rounds, "compile_s": {s: round(v, 1) for s, v in compile_s.items()},
              "decode": rows, "capacity": capacity(model, weights, 256 << 20)}
    json.dump(report, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
