"""Build here (with MLIR) what ``bench/gpu_run/serve_under_load.sh`` needs on the GPU machine:

    python bench/gpu_run/serve_under_load_build.py   -> .cache/gpu/serve, .cache/gpu/gguf0..2

``.cache/gpu/serve/cache``: the CUDA compile cache of what ``poot serve --backend cuda
--max-batch 64 --kv-capacity 512 --no-warm-up`` runs for greedy requests: SmolLM2 (the GGUF)
and the Llama-3.2-1B shape (random bf16 weights; ``--random-weights``), each with its prefill
chunk and the decode step and greedy sampler of every batch bucket up to 64.
``.cache/gpu/serve/wheels``: the ``serve`` extra (pyproject.toml), httpx and py-spy with every
dependency, for Python 3.12 (the GPU machine reaches no package index). The GGUF goes over in parts
(``carry.split_gguf``), joined there by ``stage_gguf.sh``. The cache keys hash poot's
sources: run on this same working tree.
"""

from __future__ import annotations

import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench", "gpu_run"))

from carry import check_sizes, download_wheels, folder_bytes, fresh_dir, split_gguf  # noqa: E402

CAP, MAX_BATCH = 512, 64
SHAPE_1B = "bench/shapes/llama-3.2-1b.json"
#: beside the ``serve`` extra of pyproject.toml: the load client's httpx, and py-spy for
#: serve_under_load.sh's SERVE_PROFILE; all with their dependencies, resolved by pip for the
#: machine's Python (3.12)
EXTRA_WHEELS = ["httpx>=0.27", "py-spy>=0.3"]


def serve_requirements() -> list[str]:
    """The ``serve`` extra's requirements (pyproject.toml), then :data:`EXTRA_WHEELS`."""
    import tomllib

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]
    return list(extras["serve"]) + EXTRA_WHEELS


def main() -> int:
    from poot.api import compile_steps
    from poot.compiler.cache import step_source_hash
    from poot.graph.sampling import GREEDY
    from poot.load.bundled import smollm2_gguf

    out = fresh_dir("serve")
    say = lambda m: print(f"serve_under_load_build: {m}", file=sys.stderr, flush=True)  # noqa: E731
    download_wheels(os.path.join(out, "wheels"), serve_requirements())
    man: dict = {"source_hash_cuda": step_source_hash("cuda"), "cap": CAP,
                 "max_batch": MAX_BATCH, "smollm2": split_gguf(str(smollm2_gguf())),
                 "compile": {}}
    cache = os.path.join(out, "cache")
    for name, path, rw in (("smollm2", str(smollm2_gguf()), None),
                           ("llama1b", os.path.join(ROOT, SHAPE_1B), "bf16")):
        say(f"compiling {name}")
        t0 = time.perf_counter()
        compile_steps(path, "cuda", kv_capacity=CAP, max_batch=MAX_BATCH, cache_dir=cache,
                      random_weights=rw, samplers=[GREEDY], progress=lambda m, *_: say(m))
        man["compile"][name] = round(time.perf_counter() - t0, 1)
    man["built"] = time.strftime("%Y-%m-%d %H:%M:%S")
    man["bytes"] = folder_bytes(out)
    json.dump(man, open(os.path.join(out, "manifest.json"), "w"), indent=1)
    print(json.dumps(man, indent=1))
    return 1 if check_sizes([out]) else 0


if __name__ == "__main__":
    sys.exit(main())
