"""Build here (with MLIR) what ``bench/gpu_run/decode_gemm.sh`` runs on the GPU machine: the
compile cache of every program the serving engine runs for the Llama-3.2-1B shape (random
bf16 weights) and the SmolLM2-135M shape (random Q4_1 weights: the same kernels as the GGUF's
Q4_1 projections, no GGUF to stage) at KV capacity 512, every decode bucket up to 128 rows
with its greedy sampler:

    python bench/gpu_run/decode_gemm_build.py [--batches 1,8,32,64,128]   # -> .cache/gpu/decode_gemm

The folder also holds what the machine lacks: ``pylib/gguf`` (the random Q4_1 weights name
their quant type through the ``gguf`` package) and ``shared_bench/batched_baseline.py`` (the
baseline of record, from ``../shared/bench/``), which ``decode_gemm.sh`` uses from there.
The cache keys hash poot's sources: run ``decode_gemm.sh`` on this same working tree.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench", "gpu_run"))

from carry import check_sizes, folder_bytes, fresh_dir  # noqa: E402

#: (name, shape config, random weights' dtype)
MODELS = (("llama1b", "bench/shapes/llama-3.2-1b.json", "bf16"),
          ("smollm2", "bench/shapes/smollm2-135m.json", "q4_1"))


def main() -> int:
    from poot.api import compile_steps
    from poot.compiler.cache import step_source_hash
    from poot.graph.sampling import GREEDY

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cap", type=int, default=512)
    ap.add_argument("--max-batch", type=int, default=128)
    ap.add_argument("--batches", default=None,
                    help="decode buckets (default: every one to max; poot bench needs every "
                    "bucket its ragged tail reaches, so a subset suits only other runs)")
    ap.add_argument("--models", default=",".join(n for n, _, _ in MODELS),
                    help="comma-separated: " + ", ".join(n for n, _, _ in MODELS))
    ap.add_argument("--name", default="decode_gemm",
                    help="the folder under .cache/gpu (decode_gemm.sh reads $DECODE_GEMM_DIR)")
    a = ap.parse_args()
    out = fresh_dir(a.name)
    from poot import settings

    man: dict = {"source_hash_cuda": step_source_hash("cuda"), "cap": a.cap,
                 "wgmma": bool(settings.get_flag("POOT_CUDA_WGMMA")),
                 "max_batch": a.max_batch, "built": time.strftime("%Y-%m-%d %H:%M:%S"),
                 "compile": {}}
    batches = [int(b) for b in a.batches.split(",")] if a.batches else None
    for name, cfg, dtype in MODELS:
        if name not in a.models.split(","):
            continue
        t0 = time.perf_counter()
        # poot bench --batch runs its engines with a prompt budget of 8 chunks a step
        # (bench_cmd.throughput): 128 decoding rows + 256 prompt tokens take T = 512
        r = compile_steps(os.path.join(ROOT, cfg), "cuda", kv_capacity=a.cap,
                          max_batch=a.max_batch, batches=batches, max_prefill_tokens=8 * 32,
                          cache_dir=os.path.join(out, "cache"), random_weights=dtype,
                          samplers=[GREEDY],
                          progress=lambda m, *_: print(f"{name}: {m}", file=sys.stderr,
                                                       flush=True))
        man["compile"][name] = {"seconds": round(time.perf_counter() - t0, 1),
                                "config": cfg, "dtype": dtype, "steps": len(r["steps"])}
    import gguf

    shutil.copytree(os.path.dirname(gguf.__file__), os.path.join(out, "pylib", "gguf"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    shared = os.path.join(ROOT, "..", "shared", "bench", "batched_baseline.py")
    if os.path.exists(shared):
        os.makedirs(os.path.join(out, "shared_bench"))
        shutil.copy(shared, os.path.join(out, "shared_bench"))
    man["shared_baseline"] = os.path.exists(shared)
    man["bytes"] = folder_bytes(out)
    json.dump(man, open(os.path.join(out, "manifest.json"), "w"), indent=1)
    print(json.dumps(man, indent=1))
    return 1 if check_sizes([out]) else 0


if __name__ == "__main__":
    sys.exit(main())
