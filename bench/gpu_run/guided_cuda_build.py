"""Build here (with MLIR) what ``bench/gpu_run/guided_cuda.sh`` needs on the GPU machine:

    python bench/gpu_run/guided_cuda_build.py   -> .cache/gpu/guided, .cache/gpu/gguf0..2

``.cache/gpu/guided/cache``: the CUDA compile cache of every program guided decoding runs for
SmolLM2 at KV capacity 512 and up to 32 sequences (prefill, the decode step of each bucket,
and the samplers: greedy, greedy + guided, sampled + guided); ``wheels``: llguidance and
jsonschema (the GPU machine reaches no package index); ``expected.json``: the CPU's greedy
guided outputs of ``guided_check.py``'s cases (the oracle CUDA is compared with). The GGUF
goes over in parts (``carry.split_gguf``), joined there by ``stage_gguf.sh``. The cache keys
hash poot's sources: run on this same working tree.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench", "gpu_run"))

from carry import check_sizes, download_wheels, folder_bytes, fresh_dir, split_gguf  # noqa: E402

CAP, MAX_BATCH = 512, 32
WHEELS = ["llguidance", "jsonschema", "attrs", "referencing", "jsonschema-specifications",
          "typing-extensions"]


def main() -> int:
    from guided_check import cases, run_cases
    from poot.api import ModelHandle, compile_steps
    from poot.engine import sampler_spec_for
    from poot.compiler.cache import step_source_hash
    from poot.graph.sampling import GREEDY
    from poot.load.bundled import smollm2_gguf

    out = fresh_dir("guided")
    say = lambda m: print(f"guided_cuda_build: {m}", file=sys.stderr, flush=True)  # noqa: E731
    wheels = os.path.join(out, "wheels")
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", wheels]
                   + WHEELS, check=True)
    for v in ("310", "311", "312", "313"):    # rpds-py is compiled: one wheel per Python
        download_wheels(wheels, ["rpds-py"], python=v, deps=False)
    gguf = str(smollm2_gguf())
    _, params = cases()
    samplers = sorted({GREEDY, *(sampler_spec_for([p]) for p in params),
                       sampler_spec_for(params)}, key=repr)
    say(f"compiling {len(samplers)} samplers per bucket for cuda")
    t0 = time.perf_counter()
    compile_steps(gguf, "cuda", kv_capacity=CAP, max_batch=MAX_BATCH,
                  cache_dir=os.path.join(out, "cache"), samplers=samplers,
                  progress=lambda m, *_: say(m))
    man = {"source_hash_cuda": step_source_hash("cuda"), "cap": CAP, "max_batch": MAX_BATCH,
           "compile_s": round(time.perf_counter() - t0, 1),
           "built": time.strftime("%Y-%m-%d %H:%M:%S"), "smollm2": split_gguf(gguf)}
    say("the CPU oracle's greedy outputs")
    h = ModelHandle.load(gguf, "cpu", kv_capacity=CAP, max_batch=8)
    exp = run_cases(h, greedy_only=True)
    json.dump(exp, open(os.path.join(out, "expected.json"), "w"))
    man["bytes"] = folder_bytes(out)
    json.dump(man, open(os.path.join(out, "manifest.json"), "w"), indent=1)
    print(json.dumps(man, indent=1))
    return 1 if check_sizes([out]) else 0


if __name__ == "__main__":
    sys.exit(main())
