"""Build here (with MLIR) what ``bench/gpu_run/lora_embed.sh`` needs on the GPU machine:

    python bench/gpu_run/lora_embed_build.py        -> .cache/gpu/lora_embed (ignored; carried in one call)

The CUDA compile cache of the pooled steps: the three tiny pooled fixtures at batch 4 x 16
tokens (what ``PoolingModel.load(..., max_batch=4, max_tokens=16)`` warms up) and the
Llama-3.2-1B shape with random bf16 weights at batch 32 x 128 tokens, last-token pooling
(what ``bench/embed_bench.py --config bench/shapes/llama-3.2-1b.json --backend cuda`` runs);
the LoRA steps of ``lora_check.py`` (the tiny llama fixture with two slots of rank 8, its
greedy and log-prob samplers) and of ``bench/lora_bench.py`` on the 1B shape (KV 256, up to
32 sequences, without slots and with one slot of rank 16).
The cache keys hash poot's sources: run on this same working tree.
"""

from __future__ import annotations

import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench", "gpu_run"))


def main() -> int:
    from poot.api import DEFAULT_COMPILE_OPTIONS, compile_cached, target_for
    from poot.engine.pooling import PoolingRunner
    from poot.compiler.cache import CompileCache

    cache = CompileCache(os.path.join(ROOT, ".cache", "gpu", "lora_embed"))
    target = target_for("cuda")
    out = {}

    def compile_step(key_model, types, spec, trace):
        return compile_cached(cache, key_model, types, spec, trace, target,
                              DEFAULT_COMPILE_OPTIONS)

    class NoDevice:          # PoolingRunner.entry compiles before it touches the device
        pass

    from poot.api.pooling import PoolingModel
    for name in ("qwen3_embed", "bert_embed", "bert_cross_encoder"):
        t0 = time.perf_counter()
        pm = PoolingModel.load(os.path.join(ROOT, "test/fixtures/tiny", name), "cpu",
                               max_batch=4, max_tokens=16, warm_up=False)
        r = pm.runner
        spec = r.spec(4, 16)
        compile_step(pm.model, pm.weights.types, spec,
                     lambda: pm.model.trace_pooled(spec, pm.weights.types))
        out[name] = round(time.perf_counter() - t0, 1)
    from poot.models.random_init import load_random_model

    t0 = time.perf_counter()
    model, weights = load_random_model(os.path.join(ROOT, "bench/shapes/llama-3.2-1b.json"),
                                       "bf16")
    runner = PoolingRunner(model, weights, NoDevice(), compile_step, 32, 128, "last", True)
    spec = runner.spec(32, 128)
    compile_step(model, weights.types, spec, lambda: model.trace_pooled(spec, weights.types))
    out["llama1b_B32_T128"] = round(time.perf_counter() - t0, 1)

    from lora_check import FIX, LOAD, params
    from poot.api import compile_steps
    from poot.engine.runner import sampler_spec_for
    from poot.graph.sampling import GREEDY

    cache_dir = os.path.join(ROOT, ".cache", "gpu", "lora_embed")
    t0 = time.perf_counter()
    compile_steps(os.path.join(FIX, "llama"), "cuda", cache_dir=cache_dir,
                  samplers=[GREEDY, sampler_spec_for([params()])], **LOAD)
    out["lora_check"] = round(time.perf_counter() - t0, 1)
    for slots in (0, 1):
        t0 = time.perf_counter()
        compile_steps(os.path.join(ROOT, "bench/shapes/llama-3.2-1b.json"), "cuda",
                      cache_dir=cache_dir, random_weights="bf16", kv_capacity=256,
                      max_batch=32, max_loras=slots, max_lora_rank=16)
        out[f"lora_bench_1b_slots{slots}"] = round(time.perf_counter() - t0, 1)
    print(json.dumps({"compile_s": out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
