"""Build device-check bundles (artifact + oracle fixtures + weights) for the CUDA backend.

    python bench/cuda_bundle.py [OUT_DIR] [--models llama llama_gguf_q4_1] [--steps 4]

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
    ap.add_argument("--models", nargs="+", default=["llama", "llama_gguf_q4_1",
                                                    "llama_gguf_q4_1:256",
                                                    "llama_gguf_q4_1:256:naive"])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--speed", nargs="*", default=[],
                    help="GGUF/HF checkpoints for speed-only bundles (PATH:CAPACITY:STRATEGY)")
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


if __name__ == "__main__":
    main()
