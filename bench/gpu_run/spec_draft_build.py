"""Build here (with MLIR) what ``bench/gpu_run/spec_draft.sh`` runs on the GPU machine: the
compile cache of every program ``bench/speculative_draft.py`` runs for the Llama-3.2-1B shape
(random bf16 weights) with a SmolLM2-shape draft of the same vocabulary
(``bench/shapes/smollm2-135m-llama3-vocab.json``) on CUDA, at the settings of
:data:`ARGS` (batches 1 and 8, k 2 and 4), compiled through the script's own ``--build``
(a stand-in device: the same handle, engines and entries as the run):

    python bench/gpu_run/spec_draft_build.py        # -> .cache/gpu/spec_draft (~10-20 min)

Then the same command again in a process where ``mlir`` cannot be imported (what the GPU
machine is): every entry must load from the cache (exit 1 otherwise). ``args.txt`` holds
the arguments ``spec_draft.sh`` passes to the run. The cache keys hash poot's sources: run
``spec_draft.sh`` on this same working tree.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench", "gpu_run"))

from carry import check_sizes, folder_bytes, fresh_dir  # noqa: E402

#: speculative_draft.py's settings, here and there
ARGS = ["--backend", "cuda", "--target", "bench/shapes/llama-3.2-1b.json",
        "--draft", "bench/shapes/smollm2-135m-llama3-vocab.json", "--dtype", "bf16",
        "--batches", "1,8", "--k", "2,4", "--p", "0.5,0.8,0.95", "--prompt-tokens", "16",
        "--max-tokens", "128", "--kv-capacity", "256", "--reps", "3"]
#: a process in which ``import mlir`` fails (as on the GPU machine)
NO_MLIR = "import sys\nsys.modules['mlir'] = None\n"


def build(cache: str, no_mlir: bool) -> subprocess.CompletedProcess:
    """``speculative_draft.py --build`` into ``cache`` (``no_mlir``: where MLIR is missing,
    so that any program not in the cache is a CacheMiss)."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    with tempfile.TemporaryDirectory() as shim:
        if no_mlir:
            with open(os.path.join(shim, "sitecustomize.py"), "w") as f:
                f.write(NO_MLIR)
            env["PYTHONPATH"] = shim + os.pathsep + ROOT
        return subprocess.run([sys.executable, os.path.join(ROOT, "bench",
                                                            "speculative_draft.py"),
                               "--build", "--cache-dir", cache, *ARGS],
                              cwd=ROOT, env=env, capture_output=True, text=True)


def main() -> int:
    from poot.compiler.cache import step_source_hash

    out = fresh_dir("spec_draft")
    cache = os.path.join(out, "cache")
    man: dict = {"source_hash_cuda": step_source_hash("cuda"), "args": ARGS,
                 "built": time.strftime("%Y-%m-%d %H:%M:%S")}
    for name, no_mlir in (("build", False), ("check_without_mlir", True)):
        t0 = time.perf_counter()
        r = build(cache, no_mlir)
        man[name] = {"seconds": round(time.perf_counter() - t0, 1), "exit": r.returncode}
        if r.returncode:
            print(r.stderr[-4000:], file=sys.stderr)
            print(f"spec_draft_build: {name} failed", file=sys.stderr)
            return 1
        man[name]["compiled"] = json.loads(r.stdout.strip().splitlines()[-1])["compiled"]
    with open(os.path.join(out, "args.txt"), "w") as f:
        f.write(" ".join(ARGS) + "\n")
    man["bytes"] = folder_bytes(out)
    json.dump(man, open(os.path.join(out, "manifest.json"), "w"), indent=1)
    print(json.dumps({k: v for k, v in man.items() if k != "args"}, indent=1))
    return 1 if check_sizes([out]) else 0


if __name__ == "__main__":
    sys.exit(main())
