"""Where a batched decode step's GPU time goes: the engine runs B sequences until all decode,
then :func:`poot.backends.cuda.runtime.profile_kernel` times each dispatch body of the decode
step of bucket B (and of its sampler). Writes one JSON object.

    python3 bench/gpu_run/profile_batch.py OUT.json --config bench/shapes/llama-3.2-1b.json \
        --batches 1,8,64 [--kv-capacity 512] [--max-batch 128]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--config", default=None)
    ap.add_argument("--model", default=None)
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--kv-capacity", type=int, default=512)
    ap.add_argument("--max-batch", type=int, default=128)
    ap.add_argument("--lora-rank", type=int, default=0)
    a = ap.parse_args()

    from poot.api import ModelHandle
    from poot.backends.cuda.runtime import profile_kernel
    from poot.cli.bench_cmd import synthetic_prompts
    from poot.sampling_params import SamplingParams
    from poot.engine import EngineConfig, LLMEngine
    from poot.graph.sampling import GREEDY

    h = ModelHandle.load(a.config or a.model, "cuda", kv_capacity=a.kv_capacity,
                         max_batch=a.max_batch, random_weights="bf16" if a.config else None,
                         max_loras=1 if a.lora_rank else 0, max_lora_rank=a.lora_rank or 16)
    lora = None
    if a.lora_rank:
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        from lora_bench import random_adapter

        base = {k: v for k, v in h.weights.types.items() if not k.startswith("lora.")}
        adapter = random_adapter(base, h.model.dims().n_layers, a.lora_rank)
        h.engine.run_in_loop(lambda: h.runner.lora.load("bench", adapter))
        lora = "bench"
    dev = h.runner.session.device
    res: dict = {}
    first = True
    for b in [int(x) for x in a.batches.split(",")]:
        eng = LLMEngine(h.runner, None, EngineConfig(max_batch=b, prefix_caching=False,
                                                      max_prefill_tokens=32 * b))
        sp = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True, detokenize=False)
        for p in synthetic_prompts(h.runner.vocab, b, 32, seed=b):
            eng.add_request(p, sp, lora=lora)
        for _ in range(8):
            eng.step()
        dev.synchronize()
        rows = {}
        entries = [("decode", h.runner.decode_entry(h.runner.bucket(b))),
                   ("sampler", h.runner.sampler_entry(h.runner.bucket(b), GREEDY))]
        if first:
            entries.append(("prefill", h.runner.prefill_entry()))
            first = False
        for name, entry in entries:
            rows[name] = profile_kernel(dev, entry.kernel, h.runner.session._bindings(entry),
                                        top=24)
        res[str(b)] = rows
        eng.run_until_done()
        print(json.dumps({b: {k: v["total_ms"] for k, v in rows.items()}}), flush=True)
    json.dump(res, open(a.out, "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
