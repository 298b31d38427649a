"""LoRA adapters through the serving engine on a device, against HF + PEFT's recorded outputs
(test/fixtures/tiny/llama_lora): one batch of the base model and two adapters (rank 4 on
q/k/v/o; rank 8 rsLoRA on q/v and the MLP) gives each request its adapter's greedy tokens,
and the first token's top-20 log-probs within 1e-4 of ``log_softmax`` of HF's logits; then
an adapter is unloaded while three of its requests run (none is lost, each keeps its
tokens) and another is loaded into the freed slot. Writes one JSON object; exit 1 if any
check fails.

    python3 bench/gpu_run/lora_check.py OUT.json --backend cuda

Runs anywhere poot runs (``--backend cpu`` checks the script itself); on the GPU machine the
programs come from the carried compile cache (``lora_embed_build.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

FIX = os.path.join(ROOT, "test", "fixtures", "tiny")
LOAD = dict(kv_capacity=64, max_batch=4, prefill_chunk=8, max_loras=2, max_lora_rank=8)
TOL = 1e-4
TOP = 20


def params():
    from poot.sampling_params import SamplingParams

    return SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=TOP)


def reference():
    base = np.load(os.path.join(FIX, "llama", "reference.npz"))
    lora = np.load(os.path.join(FIX, "llama_lora", "reference.npz"))
    want = {None: (base["prefill_logits"][-1], list(base["greedy_ids"]))}
    for name in ("adapter_a", "adapter_b"):
        want[name] = (lora[f"{name}.prefill_logits"][-1], list(lora[f"{name}.greedy_ids"]))
    return [int(x) for x in base["prompt_ids"]], want


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max()
    return x - m - np.log(np.exp(x - m).sum())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--backend", default="cuda")
    args = ap.parse_args(argv)
    from poot.api import ModelHandle

    lora = os.path.join(FIX, "llama_lora")
    h = ModelHandle.load(os.path.join(FIX, "llama"), args.backend, **LOAD,
                         loras={"adapter_a": os.path.join(lora, "adapter_a"),
                                "adapter_b": os.path.join(lora, "adapter_b")})
    ids, want = reference()
    eng = h.engine
    res = {"backend": args.backend, "mixed_batch": {}, "ok": True}
    rids = {eng.add_request(ids, params(), lora=name): name for name in want}
    outs = eng.run_until_done()
    done = {o.request_id: o for o in outs if o.finished}
    first = {}                                  # each request's first token's log-probs
    for o in outs:
        if o.logprobs:
            first.setdefault(o.request_id, o.logprobs[0])
    res["max_decode_batch"] = eng.stats().max_decode_batch
    for rid, name in rids.items():
        o = done[rid]
        logits, tokens = want[name]
        ref_lp = log_softmax(logits)
        top = first[rid].top
        diff = max(abs(lp - ref_lp[t]) for t, lp in top)
        r = {"tokens": list(o.output_ids), "tokens_equal": list(o.output_ids) == tokens,
             "top20_logprob_max_abs_diff": float(diff),
             "top20_ids_equal": [t for t, _ in top] == [int(i) for i in np.argsort(-ref_lp)[:TOP]]}
        res["mixed_batch"][name or "base"] = r
        res["ok"] &= bool(r["tokens_equal"] and diff < TOL)
    eng.start()
    try:      # unload under traffic: the adapter's running requests finish as they began
        rids = [eng.add_request(ids, params(), stream=True, lora="adapter_a") for _ in range(3)]
        h.unload_lora("adapter_a")
        finals = [[o for o in eng.stream(r, timeout=300)][-1] for r in rids]
        kept = [f.finish_reason == "length" and list(f.output_ids) == want["adapter_a"][1]
                for f in finals]
        slot = h.load_lora("c", os.path.join(lora, "adapter_b"))
        rid = eng.add_request(ids, params(), stream=True, lora="c")
        last = [o for o in eng.stream(rid, timeout=300)][-1]
        res["unload_under_traffic"] = {"requests_kept": sum(kept), "of": len(kept),
                                       "reloaded_slot": slot,
                                       "reloaded_tokens_equal":
                                           list(last.output_ids) == want["adapter_b"][1]}
        res["ok"] &= all(kept) and res["unload_under_traffic"]["reloaded_tokens_equal"]
    finally:
        eng.shutdown(timeout=30)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps(res))
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
