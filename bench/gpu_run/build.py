"""Build (here, with MLIR) the SmolLM2 decode-step artifacts that smollm2_cuda.py and
smollm2_vulkan.py run on the GPU machine (the first greedy and speed checks, README.md).

    python bench/gpu_run/build.py cuda     # .cache/gpu/first/art (SmolLM2 cap-256 CUDA step) + weights split in two
    python bench/gpu_run/build.py vulkan   # .cache/gpu/first/vk_smollm2 (SmolLM2 cap-256 Vulkan step, sg 32)

The SmolLM2 weights (96.6 MB packed) exceed one device transfer (64 MiB): they are written as
two npz halves, .cache/gpu/first/a/w.npz and .cache/gpu/first/b/w.npz, carried in two consecutive calls (the first
half stays on the warm machine).
"""
from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
OUT = os.path.join(ROOT, ".cache", "gpu", "first")


def weights_npz(weights, names):
    arrays = {}
    for n in names:
        a = np.asarray(weights.arrays[n] if hasattr(weights, "arrays") else weights[n])
        if a.dtype.itemsize == 2 and a.dtype.kind == "V":
            a = a.view(np.uint16)
        arrays[n] = a
    order = sorted(arrays, key=lambda n: -arrays[n].nbytes)
    halves = ({}, {})
    sizes = [0, 0]
    for n in order:                       # greedy balance
        i = 0 if sizes[0] <= sizes[1] else 1
        halves[i][n] = arrays[n]
        sizes[i] += arrays[n].nbytes
    for sub, h in zip("ab", halves):
        os.makedirs(os.path.join(OUT, sub), exist_ok=True)
        np.savez(os.path.join(OUT, sub, "w.npz"), **h)
    return sizes


def cuda(cap=256):
    from poot.backends.cuda.codegen import cuda_target
    from poot.compiler.compile import compile as compile_step
    from poot.load.bundled import smollm2_gguf
    from poot.models import StepSpec, load_model

    model, weights = load_model(str(smollm2_gguf()))
    g = model.trace(StepSpec.decode(kv_capacity=cap), weights.types)
    t0 = time.perf_counter()
    art = compile_step(g, cuda_target()).executable
    art.save(os.path.join(OUT, "art"))
    names = [p["name"] for p in art.plan["params"]]
    sizes = weights_npz(weights, names)
    print(json.dumps({"compile_s": round(time.perf_counter() - t0, 1), "halves": sizes,
                      **art.summary()}))


def vulkan(cap=256):
    from poot.backends.vulkan.codegen import DEFAULT_FEATURES, compile_vulkan, vulkan_target
    from poot.load.bundled import smollm2_gguf
    from poot.models import StepSpec, load_model

    model, weights = load_model(str(smollm2_gguf()))
    g = model.trace(StepSpec.decode(kv_capacity=cap, kv_slots=1), weights.types)
    target = vulkan_target({"features": sorted(DEFAULT_FEATURES), "subgroup_size": 32,
                            "max_shared_bytes": 48 * 1024})
    t0 = time.perf_counter()
    prog = compile_vulkan(g, target)
    prog.executable.save(os.path.join(OUT, "vk_smollm2", "art"))
    meta = {n: [list(s.shape) if hasattr(s, "shape") else str(s)] for n, s in
            prog.executable.params}
    with open(os.path.join(OUT, "vk_smollm2", "params.json"), "w") as f:
        json.dump(sorted(meta), f)
    print(json.dumps({"compile_s": round(time.perf_counter() - t0, 1),
                      "params": len(meta)}))


if __name__ == "__main__":
    {"cuda": cuda, "vulkan": vulkan}[sys.argv[1]]()
