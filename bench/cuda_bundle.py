"""Build device-check bundles (artifact + oracle fixtures + weights) for the CUDA backend.

    python bench/cuda_bundle.py [OUT_DIR] [--models llama llama_gguf_q4_1] [--steps 4]
        [--paged llama:f16 llama:q8_0 llama:fp8] [--greedy llama:fp8]

Each bundle is OUT_DIR/<model>/ (OUT_DIR defaults to ``.cache/cuda_bundles``, ignored: bundles
are generated, never committed) and is read by poot/backends/cuda/devcheck.py on a machine
with a CUDA device (no MLIR needed there; ``bench/cuda_check.sh`` runs them all). Prints a
JSON summary per bundle.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "test", "fixtures", "tiny")
#: where bundles go by default: inside the checkout's ignored cache, not the source tree
DEFAULT_OUT = os.path.join(ROOT, ".cache", "cuda_bundles")


def fixture_path(name: str) -> str:
    folder = os.path.join(FIXTURES, name)
    gguf = os.path.join(folder, "model.gguf")
    return gguf if os.path.exists(gguf) else folder


def build(name: str, out: str, steps: int, capacity: int = 16, path: str | None = None,
          with_weights: bool = True, label: str | None = None, strategy: str = "auto"
          ) -> dict:
    from poot.backends.cuda.codegen import compile_program, cuda_target, ptxas_check
    from poot.backends.cuda.fixtures import write_check_bundle
    from poot.compiler.compile import compile as compile_step
    from poot.models import StepSpec, contiguous_inputs, load_model

    model, weights = load_model(path or fixture_path(name))
    g = model.trace(StepSpec.decode(kv_capacity=capacity), weights.types)
    t0 = time.perf_counter()
    prog = compile_step(g, cuda_target())
    art = prog.executable if strategy == "auto" else compile_program(prog, strategy=strategy)
    compile_s = time.perf_counter() - t0
    ptxas = ptxas_check(art.ptx)
    ids = [int(i) for i in np.load(os.path.join(FIXTURES, name, "reference.npz"))["prompt_ids"]] \
        if path is None else [1, 2, 3, 4, 5, 6, 7, 8]
    seq = [contiguous_inputs(capacity, [[ids[p % len(ids)]]], [[p]], [0])
           for p in range(steps)]
    folder = os.path.join(out, label or name)
    t1 = time.perf_counter()
    write_check_bundle(folder, prog, art, weights.arrays, seq, with_weights=with_weights)
    return {"bundle": folder, "compile_s": round(compile_s, 2),
            "fixtures_s": round(time.perf_counter() - t1, 2), "ptxas": bool(ptxas),
            **art.summary(), **art.meta}


def paged_inputs(spec, steps: int, seed: int = 0) -> list[dict]:
    """Per-step inputs of a paged decode step ``spec`` over ``steps`` steps: sequence b at
    positions ``3 b + k`` (k the step; the positions before its first are zero in the pools,
    as carried state starts), its blocks a permutation of the pool's (block 0 left out, the
    null block), random tokens."""
    rng = np.random.default_rng(seed)
    B, TW, bs = spec.batch, spec.table_width, spec.bs
    table = (1 + rng.permutation(spec.n_blocks - 1)[:B * TW]).reshape(B, TW).astype(np.int32)
    out = []
    for k in range(steps):
        pos = (3 * np.arange(B) + k).astype(np.int32)
        slots = table[np.arange(B), pos // bs] * bs + pos % bs
        out.append({"tokens": rng.integers(0, 64, (B, 1)).astype(np.int32),
                    "positions": pos[:, None], "block_table": table,
                    "slot_mapping": slots.astype(np.int32)})
    return out


def build_paged(name: str, kv: str, out: str, steps: int) -> dict:
    """A device-check bundle of tiny fixture ``name``'s paged decode step (batch 2, 16-position
    blocks, capacity 64) with 32-wide heads (q8_0 needs a multiple of 32; random f32 weights)
    and KV storage ``kv`` (``f16``, ``q8_0`` or ``fp8``: quantize-on-write in the KV scatter,
    the flash-decoding kernel dequantizing where it loads; fp8 with the e4m3 conversions of
    sm_89+, checked on the device: its values, e4m3fn bit patterns, within one code of the
    oracle's, as q8_0's)."""
    import tempfile

    from poot.backends.cuda.codegen import cuda_target, ptxas_check
    from poot.backends.cuda.fixtures import write_check_bundle
    from poot.compiler.compile import compile as compile_step
    from poot.dialects.kv_quant import KV_FORMATS
    from poot.models import StepSpec
    from poot.models.random_init import load_random_model

    with open(os.path.join(FIXTURES, name, "config.json")) as f:
        cfg = {**json.load(f), "head_dim": 32}
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f)
        model, weights = load_random_model(os.path.join(d, "config.json"), dtype="f32")
    spec = StepSpec.decode(kv_capacity=64, block_size=16, num_blocks=9, batch=2,
                           kv_dtype=KV_FORMATS[kv])
    t0 = time.perf_counter()
    prog = compile_step(model.trace(spec, weights.types), cuda_target())
    art = prog.executable
    compile_s = time.perf_counter() - t0
    folder = os.path.join(out, f"{name}_hd32_paged_{kv}")
    write_check_bundle(folder, prog, art, weights.arrays, paged_inputs(spec, steps))
    return {"bundle": folder, "compile_s": round(compile_s, 2),
            "ptxas": bool(ptxas_check(art.ptx)), **art.summary(), **art.meta}


def build_greedy(name: str, kv: str, out: str, steps: int) -> dict:
    """A device-check bundle of greedy decoding: tiny fixture ``name`` (its own weights) as a
    paged decode step (batch 2, 16-position blocks, capacity 64) with KV storage ``kv``, fed
    its reference prompt (sequence 1: reversed) a token a step, then from the prompt's end
    the oracle's greedy tokens (:func:`~poot.backends.cuda.fixtures.greedy_inputs`); the
    device check compares every step's logits and greedy token with the oracle's."""
    from poot.backends.cuda.codegen import cuda_target, ptxas_check
    from poot.backends.cuda.fixtures import greedy_inputs, write_check_bundle
    from poot.compiler.compile import compile as compile_step
    from poot.dialects.kv_quant import KV_FORMATS
    from poot.models import StepSpec, load_model

    model, weights = load_model(fixture_path(name))
    spec = StepSpec.decode(kv_capacity=64, block_size=16, num_blocks=9, batch=2,
                           kv_dtype=KV_FORMATS[kv])
    t0 = time.perf_counter()
    prog = compile_step(model.trace(spec, weights.types), cuda_target())
    art = prog.executable
    compile_s = time.perf_counter() - t0
    ids = [int(i) for i in np.load(os.path.join(FIXTURES, name, "reference.npz"))["prompt_ids"]]
    prompt = np.array([ids, ids[::-1]], np.int32)                       # [2, P]
    table = np.array([[1, 2, 3, 4], [5, 6, 7, 8]], np.int32)
    seq = []
    for k in range(steps):
        pos = np.full(2, k, np.int32)
        seq.append({"tokens": prompt[:, min(k, prompt.shape[1] - 1)][:, None],
                    "positions": pos[:, None], "block_table": table,
                    "slot_mapping": (table[:, k // 16] * 16 + k % 16).astype(np.int32)})
    seq = greedy_inputs(prog, art, weights.arrays, seq, forced=prompt.shape[1])
    folder = os.path.join(out, f"{name}_greedy_{kv}")
    write_check_bundle(folder, prog, art, weights.arrays, seq)
    return {"bundle": folder, "compile_s": round(compile_s, 2), "steps": steps,
            "greedy_from_step": prompt.shape[1], "ptxas": bool(ptxas_check(art.ptx)),
            **art.summary(), **art.meta}


def build_speed(path: str, out: str, label: str, capacity: int, strategy: str = "auto"
                ) -> dict:
    """A speed-only bundle (artifact, no weights or fixtures: the device check makes stand-in
    weights of the right sizes) of a real checkpoint's decode step."""
    from poot.backends.cuda.codegen import compile_program, cuda_target
    from poot.compiler.compile import compile as compile_step
    from poot.models import StepSpec, load_model

    model, weights = load_model(path)
    g = model.trace(StepSpec.decode(kv_capacity=capacity), weights.types)
    prog = compile_step(g, cuda_target())
    art = prog.executable if strategy == "auto" else compile_program(prog, strategy=strategy)
    art.save(os.path.join(out, label))
    return {"bundle": os.path.join(out, label), **art.summary(), **art.meta}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?", default=DEFAULT_OUT,
                    help=f"folder of the bundles (default {os.path.relpath(DEFAULT_OUT, ROOT)})")
    ap.add_argument("--models", nargs="*", default=["llama", "llama_gguf_q4_1",
                                                    "llama_gguf_q4_1:256",
                                                    "llama_gguf_q4_1:256:naive"])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--speed", nargs="*", default=[],
                    help="GGUF/HF checkpoints for speed-only bundles (PATH:CAPACITY:STRATEGY)")
    ap.add_argument("--paged", nargs="*", default=["llama:f16", "llama:q8_0", "llama:fp8"],
                    help="paged decode bundles with 32-wide heads (FIXTURE:KV_DTYPE)")
    ap.add_argument("--greedy", nargs="*", default=["llama:fp8"],
                    help="greedy-decoding bundles of a fixture's own weights "
                         "(FIXTURE:KV_DTYPE; prompt then 8 greedy steps)")
    a = ap.parse_args()
    for sp in a.speed:
        path, cap, strat = (sp.split(":") + ["", ""])[:3]
        label = os.path.basename(path).split(".")[0].lower() + f"_cap{cap or 256}_" + \
            (strat or "auto") + "_speed"
        print(json.dumps(build_speed(path, a.out, label, int(cap or 256), strat or "auto")))
    for m in a.models:                  # NAME[:KV_CAPACITY[:STRATEGY]]
        name, cap, strat = (m.split(":") + ["", ""])[:3]
        label = name + (f"_cap{cap}" if cap else "") + (f"_{strat}" if strat else "")
        r = build(name, a.out, a.steps, capacity=int(cap or 16), label=label,
                  strategy=strat or "auto")
        print(json.dumps(r))
    for m in a.paged:
        name, kv = m.split(":")
        print(json.dumps(build_paged(name, kv, a.out, a.steps)))
    for m in a.greedy:
        name, kv = m.split(":")
        print(json.dumps(build_greedy(name, kv, a.out, 20)))


if __name__ == "__main__":
    main()
