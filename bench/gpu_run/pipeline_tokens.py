"""Greedy tokens of a random-init shape on one device and as an N-stage layer pipeline, in
one process, compared; with ``--backend cuda --same-gpu`` the N stages are N CUDA contexts
on GPU 0 (the one-GPU machine standing in for N GPUs: stages, their CUDA graphs, the peer
copies and event ordering are the multi-GPU path), else GPUs 0..N-1.

    python bench/gpu_run/pipeline_tokens.py bench/shapes/smollm2-135m.json --backend cuda \\
        --stages 2 [--kv-capacity 512 --max-batch 64 --max-tokens 64] > same.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

PROMPTS = [[17, 48, 79, 110, 141, 172, 203, 234], [5, 900, 31, 2],
           [1000, 2000, 3000, 4000, 5000, 6000], [42]]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--kv-capacity", type=int, default=512)
    ap.add_argument("--max-batch", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--same-gpu", action="store_true",
                    help="cuda: the stages as contexts on GPU 0 (else GPUs 0..N-1)")
    args = ap.parse_args()
    from poot.api import LLM, ModelHandle
    from poot.sampling_params import SamplingParams
    from poot.runtime.pipeline_parallel import PipelineDevice

    def devices(n):
        if args.backend != "cuda" or not args.same_gpu:
            return None
        from poot.backends.cuda.runtime import CudaDevice

        return PipelineDevice([CudaDevice(0, own_context=True) for _ in range(n)])

    from poot.engine import EngineConfig, LLMEngine

    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)

    def run(h, micro: int) -> list[list[int]]:
        eng = LLMEngine(h.runner, h.tokenizer, EngineConfig(max_batch=args.max_batch,
                                                            micro_batches=micro))
        rids = [eng.add_request(p, params) for p in PROMPTS]
        done = {o.request_id: o for o in eng.run_until_done() if o.finished}
        return [list(done[r].output_ids) for r in rids]

    res = {}
    for n in (1, args.stages):
        t0 = time.perf_counter()
        kw = dict(pipeline_parallel=n, device=devices(n)) if n > 1 else {}
        h = ModelHandle.load(args.config, args.backend, random_weights=args.dtype,
                             kv_capacity=args.kv_capacity, max_batch=args.max_batch, **kw)
        r = {"load_s": round(time.perf_counter() - t0, 1)}
        t0 = time.perf_counter()
        r["alone"] = [run_alone for run_alone in
                      (list(LLM(handle=h).generate([p], params)[0].token_ids) for p in PROMPTS)]
        r["batched"] = run(h, 1)
        r["micro"] = run(h, args.stages)
        r["generate_s"] = round(time.perf_counter() - t0, 2)
        dev = h.runner.session.device
        if n > 1:
            r["peer_copies"] = dev.peer_copies
            r["records"] = [getattr(d, "records", None) for d in dev.devices]
        res[n] = r

    def diff(a, b):
        return next(([i, j] for i, (x, y) in enumerate(zip(a, b))
                     for j, (p, q) in enumerate(zip(x, y)) if p != q), None)

    one, pipe = res[1], res[args.stages]
    print(json.dumps({
        "config": args.config, "backend": args.backend, "stages": args.stages,
        "tokens": sum(map(len, one["alone"])),
        # the same rows in the same decode bucket: identical kernels, identical tokens
        "equal_alone": one["alone"] == pipe["alone"],
        "equal_batched": one["batched"] == pipe["batched"],
        "equal_micro_batched": one["micro"] == pipe["micro"],
        "first_difference": {k: diff(one[k], pipe[k]) for k in ("alone", "batched", "micro")},
        "one_device": one, "pipeline": pipe}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
