"""KV cache storage on the CPU: SmolLM2-135M (GGUF Q4_1) decode with a q8_0 KV cache against
an f16 one, at several context lengths, and what the same KV memory holds. Prints one JSON
object.

    python bench/kv_storage.py [--contexts 512,2048,3500,4096] [--steps 20] [--rounds 3]

Each storage's decode step (batch 1, KV capacity 4096 in 32-position blocks, as the engine
compiles it) is compiled once and run alone in a loop with fixed inputs (prebuilt arguments,
no host work): the token at position ``context - 1`` attends to ``context`` keys read through
the block table. Per context the two storages are timed alternately, ``--rounds`` times
``--steps`` steps each, and the best mean per step is kept (the machine is shared: noise only
adds time). ``speedup`` is f16's time over q8_0's (>= 1: q8_0 is as fast or faster).
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
    a = ap.parse_args(argv)
    from poot.backends.cpu.codegen import cpu_threads
    from poot.load.bundled import smollm2_gguf
    from poot.models import load_model

    model, weights = load_model(str(smollm2_gguf()))
    progs, compile_s = {}, {}
    for s in STORAGES:
        progs[s], compile_s[s] = compile_decode(model, weights, s)
    params = {s: {n: np.asarray(weights[n]) for n, _ in p.params} for s, p in progs.items()}
    rng = np.random.default_rng(0)
    rows = []
    for ctx in (int(c) for c in a.contexts.split(",")):
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
              "block_size": BS, "threads": cpu_threads(), "steps": a.steps,
              "rounds": a.rounds, "compile_s": {s: round(v, 1) for s, v in compile_s.items()},
              "decode": rows, "capacity": capacity(model, weights, 256 << 20)}
    json.dump(report, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
