"""The serving engine's correctness on a device: 32 prompts (the reference prompts among them)
arriving at staggered times, batched, each equal to the same prompt run alone; the reference
prompts also equal HF transformers' tokens up to the first near-tie (margin < 0.01). Seeded
sampled requests mixed in equal their alone samples. Every request asks for its top-2
log-probs, so a batched result that differs from its alone run reports the alone run's
top-1/top-2 margin where they diverge (kernels of different batch sizes sum in different
orders: a difference at a near-tie is rounding, anywhere else a bug). Writes one JSON
object.

    python3 bench/gpu_run/engine_check.py OUT.json --backend cuda --model GGUF --ref DIR \
        [--kv-capacity 512] [--max-batch 128]
    python3 bench/gpu_run/engine_check.py OUT.json --model bench/shapes/llama-3.2-1b.json \
        --random-weights bf16 --greedy --max-batch 64      # in the serve build's cache

Runs anywhere poot runs (``--backend cpu`` with a tiny fixture checks the script itself);
on the GPU machine the programs come from the carried compile cache.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

TEXTS = [
    "The three primary colors are", "Write a haiku about the sea.", "def fibonacci(n):",
    "The capital of Japan is", "List three uses of copper:", "Once upon a time, a robot",
    "Translate 'good morning' to French:", "The speed of light is", "import numpy as np\n",
    "Why is the sky blue?", "A recipe for pancakes:", "The first man on the moon was",
    "SELECT name FROM users WHERE", "Dear hiring manager,", "The largest planet is",
    "In 1492, Columbus", "Photosynthesis converts", "The opposite of hot is",
    "Water boils at", "My favourite book is", "To be or not to be,", "2 + 2 =",
    "The quick brown fox", "Mount Everest is", "The chemical symbol for gold is",
    "Shakespeare wrote", "A prime number is", "The heart pumps", "Bonjour, je",
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--model", required=True)
    ap.add_argument("--ref", default=None, help="folder of the reference JSONs")
    ap.add_argument("--kv-capacity", type=int, default=512)
    ap.add_argument("--max-batch", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--engine-max-batch", type=int, default=None,
                    help="schedule at most this many sequences (the programs of --max-batch)")
    ap.add_argument("--random-weights", default=None, metavar="DTYPE",
                    help="--model is a HF config.json given random weights of DTYPE")
    ap.add_argument("--greedy", action="store_true",
                    help="greedy requests without log-probs only (the programs of a greedy "
                         "server's compile cache, serve_under_load_build.py)")
    a = ap.parse_args()

    from poot.api import ModelHandle
    from poot.sampling_params import SamplingParams

    t0 = time.perf_counter()
    from poot.engine import EngineConfig

    cfg = EngineConfig(max_batch=a.engine_max_batch or a.max_batch)
    h = ModelHandle.load(a.model, a.backend, kv_capacity=a.kv_capacity, max_batch=a.max_batch,
                         engine_config=cfg, random_weights=a.random_weights)
    res: dict = {"backend": a.backend, "load_s": round(time.perf_counter() - t0, 2),
                 "kv": {"block_size": h.runner.kv.block_size, "blocks": h.runner.kv.num_blocks,
                        "dtype": h.runner.kv.kv_dtype.value}}
    eng = h.engine
    refs = [json.load(open(f)) for f in sorted(glob.glob(os.path.join(a.ref or "", "0*.json")))]
    prompts = [r["prompt_ids"] for r in refs]
    if h.tokenizer is not None:
        prompts += [h.encode(t) for t in TEXTS]
    else:
        prompts += [[(7 * i + 3 * j) % h.runner.vocab + 1 for j in range(5 + i % 9)]
                    for i in range(len(TEXTS))]
    prompts = prompts[:32]
    params = []
    for i in range(len(prompts)):
        if a.greedy:
            params.append(SamplingParams(temperature=0.0, max_tokens=a.tokens, ignore_eos=True))
        elif i >= len(refs) and i % 4 == 1:
            params.append(SamplingParams(temperature=0.8, top_p=0.95, seed=i, logprobs=2,
                                         max_tokens=a.tokens, ignore_eos=True))
        else:
            params.append(SamplingParams(temperature=0.0, max_tokens=a.tokens, logprobs=2,
                                         ignore_eos=True))

    def alone(p, sp):
        ids, margins = [], []
        for o in eng.generate(p, sp):
            for lp in o.logprobs or []:
                margins.append(lp.top[0][1] - lp.top[1][1])
            if o.finished:
                ids = o.output_ids
        return ids, margins

    t0 = time.perf_counter()
    runs = [alone(p, sp) for p, sp in zip(prompts, params)]
    want = [r[0] for r in runs]
    res["alone_s"] = round(time.perf_counter() - t0, 2)
    ref_ok = []
    for r, w in zip(refs, want):
        n = next((i + 1 for i, s in enumerate(r["steps"]) if s["top1_minus_top2"] < 0.01),
                 len(r["generated_ids"]))
        n = min(n, a.tokens)
        ref_ok.append({"name": r.get("name"), "compared": n,
                       "equal": w[:n] == r["generated_ids"][:n]})
    res["reference"] = ref_ok
    # staggered: one request added every 2 steps
    t0 = time.perf_counter()
    pending = list(zip(prompts, params))
    ids, final, step = [], {}, 0
    while pending or eng.has_unfinished():
        if pending and step % 2 == 0:
            p, sp = pending.pop(0)
            ids.append(eng.add_request(p, sp))
        for out in eng.step():
            if out.finished:
                final[out.request_id] = out.output_ids
        step += 1
    res["batched_s"] = round(time.perf_counter() - t0, 2)
    same = [final[r] == w for r, w in zip(ids, want)]
    res["batched_equal_alone"] = sum(same)
    res["requests"] = len(same)
    mism = []
    for i, ok in enumerate(same):
        if ok:
            continue
        b = final[ids[i]]
        at = next((j for j, (x, y) in enumerate(zip(want[i], b)) if x != y),
                  min(len(want[i]), len(b)))
        margins = runs[i][1]
        mism.append({"index": i, "first_difference": at,
                     "alone_margin_there": margins[at] if at < len(margins) else None,
                     "greedy": params[i].greedy, "alone": want[i], "batched": b})
    res["mismatches"] = mism
    st = eng.stats()
    res["stats"] = st.to_dict()
    res["pipelined"] = eng.pipelined
    res["ahead_steps"] = st.ahead_steps       # issued before the step in flight was read
    res["ok"] = all(same) and all(r["equal"] for r in ref_ok) and st.max_decode_batch > 1
    json.dump(res, open(a.out, "w"), indent=1)
    print(json.dumps({k: res[k] for k in ("ok", "batched_equal_alone", "requests", "reference",
                                          "pipelined", "ahead_steps")}))
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
