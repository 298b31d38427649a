"""Build here (with MLIR) what ``bench/gpu_run/kv_step.sh`` runs on the GPU machine: the
compile cache of the serving engine's programs for the Llama-3.2-1B shape (random bf16
weights) at a 2k context, once with a bf16 KV pool and once with a q8_0 one, decode at
``--batch`` rows (and every smaller bucket the batch drains through) with its greedy sampler:

    python bench/gpu_run/kv_step_build.py [--cap 2112] [--batch 64]   # -> .cache/gpu/kv_step

The whole decode step with each KV storage is then timed by ``poot bench`` there (issue 49's
GPU target: q8_0 KV >= 1.1x bf16 KV at B = 64 and 2k context). The cache keys hash poot's
sources: run ``kv_step.sh`` on this same working tree.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench", "gpu_run"))

from carry import check_sizes, folder_bytes, fresh_dir  # noqa: E402

SHAPE = "bench/shapes/llama-3.2-1b.json"
KV_DTYPES = ("bf16", "q8_0", "fp8")
#: prefill tokens a chunk (kv_step.sh passes the same to poot bench)
CHUNK = 16


def main() -> int:
    from poot.api import compile_steps
    from poot.compiler.cache import step_source_hash
    from poot.graph.sampling import GREEDY

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cap", type=int, default=2112, help="KV capacity (prompt + new tokens)")
    ap.add_argument("--batch", type=int, default=64)
    a = ap.parse_args()
    out = fresh_dir("kv_step")
    man: dict = {"source_hash_cuda": step_source_hash("cuda"), "cap": a.cap, "batch": a.batch,
                 "shape": SHAPE, "built": time.strftime("%Y-%m-%d %H:%M:%S"), "compile": {}}
    for kv in KV_DTYPES:
        t0 = time.perf_counter()
        r = compile_steps(os.path.join(ROOT, SHAPE), "cuda", kv_capacity=a.cap,
                          # poot bench's prompt budget is 8 chunks: at 16 tokens a chunk its
                          # ragged buckets (16..128) are the engine's at max_batch 64
                          max_batch=a.batch, prefill_chunk=CHUNK, kv_dtype=kv,
                          cache_dir=os.path.join(out, "cache"), random_weights="bf16",
                          samplers=[GREEDY],
                          progress=lambda m, *_: print(f"{kv}: {m}", file=sys.stderr,
                                                       flush=True))
        man["compile"][kv] = {"seconds": round(time.perf_counter() - t0, 1),
                              "steps": len(r["steps"])}
    man["bytes"] = folder_bytes(out)
    json.dump(man, open(os.path.join(out, "manifest.json"), "w"), indent=1)
    print(json.dumps(man, indent=1))
    return 1 if check_sizes([out]) else 0


if __name__ == "__main__":
    sys.exit(main())
