"""Build here (with MLIR) what ``bench/gpu_run/issue16.sh`` needs on the GPU machine:

    python bench/gpu_run/issue16_build.py        -> .i16b/ (ignored; carried in one call)

``.i16b/cache``: the CUDA compile cache of what ``poot serve --backend cuda --max-batch 64
--kv-capacity 512 --no-warm-up`` runs for greedy requests: SmolLM2 (the GGUF) and the
Llama-3.2-1B shape (random bf16 weights; ``--random-weights``), each with its prefill chunk
and the decode step and greedy sampler of every batch bucket up to 64. ``.i16b/wheels``: the
``serve`` extra and httpx with every dependency, for Python 3.12 (the GPU machine reaches no package index). The
GGUF goes over in ``.i15a``/``.i15c`` (``issue15_build.py``), staged by ``issue15.sh stage``.
The cache keys hash poot's sources: run on this same working tree.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

CAP, MAX_BATCH = 512, 64
SHAPE_1B = "bench/shapes/llama-3.2-1b.json"
#: with their dependencies, resolved by pip for the machine's Python (3.12)
WHEELS = ["fastapi>=0.110", "uvicorn>=0.29", "pydantic>=2.6", "prometheus-client>=0.20",
          "httpx>=0.27"]


def main() -> int:
    from poot.api import compile_steps
    from poot.compiler.cache import step_source_hash
    from poot.graph.sampling import GREEDY
    from poot.load.bundled import smollm2_gguf

    out = os.path.join(ROOT, ".i16b")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(os.path.join(out, "wheels"))
    say = lambda m: print(f"issue16_build: {m}", file=sys.stderr, flush=True)  # noqa: E731
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--python-version", "312", "--platform",
                    "manylinux2014_x86_64", "-d", os.path.join(out, "wheels")] + WHEELS,
                   check=True)
    man: dict = {"source_hash_cuda": step_source_hash("cuda"), "cap": CAP,
                 "max_batch": MAX_BATCH, "compile": {}}
    cache = os.path.join(out, "cache")
    for name, path, rw in (("smollm2", str(smollm2_gguf()), None),
                           ("llama1b", os.path.join(ROOT, SHAPE_1B), "bf16")):
        say(f"compiling {name}")
        t0 = time.perf_counter()
        compile_steps(path, "cuda", kv_capacity=CAP, max_batch=MAX_BATCH, cache_dir=cache,
                      random_weights=rw, samplers=[GREEDY], progress=lambda m, *_: say(m))
        man["compile"][name] = round(time.perf_counter() - t0, 1)
    man["built"] = time.strftime("%Y-%m-%d %H:%M:%S")
    man["bytes"] = sum(os.path.getsize(f) for f in glob.glob(os.path.join(out, "**", "*"),
                                                               recursive=True)
                       if os.path.isfile(f))
    json.dump(man, open(os.path.join(out, "manifest.json"), "w"), indent=1)
    print(json.dumps(man, indent=1))
    return 0 if man["bytes"] < 60 << 20 else 1


if __name__ == "__main__":
    sys.exit(main())
