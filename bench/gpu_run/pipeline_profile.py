"""Where a pipelined decode step's time goes: the decode entry replayed whole
(PipelineDevice.replay: stages, copies, event waits) vs each stage's CUDA graph replayed
alone on its device, and the boundary copy alone; stages as N contexts on GPU 0 or, with
``--shared``, N streams of one context.

    python bench/gpu_run/pipeline_profile.py bench/shapes/llama-3-8b.json [--shared] > prof.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("--shared", action="store_true")
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--n", type=int, default=200)
    args = ap.parse_args()
    from poot.api import ModelHandle
    from poot.backends.cuda.runtime import CudaDevice
    from poot.sampling_params import SamplingParams
    from poot.runtime.pipeline_parallel import PipelineDevice

    devs = [CudaDevice(0, own_context=not args.shared) for _ in range(args.stages)]
    h = ModelHandle.load(args.config, "cuda", random_weights="bf16", kv_capacity=512,
                         max_batch=64, pipeline_parallel=args.stages,
                         device=PipelineDevice(devs))
    h.engine.generate([1, 2, 3], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    list(h.engine.generate([1, 2, 3], SamplingParams(temperature=0, max_tokens=4,
                                                      ignore_eos=True)))
    eng = h.runner.session
    pdev = eng.device
    entry = h.runner.decode_entry(args.batch)
    eng.step(entry)                           # recorded
    rec = next(iter(entry.recordings.values()))

    def timed(fn) -> float:
        fn()
        pdev.synchronize()
        t0 = time.perf_counter()
        for _ in range(args.n):
            fn()
        pdev.synchronize()
        return (time.perf_counter() - t0) / args.n * 1e6

    out = {"config": args.config, "shared_context": args.shared, "batch": args.batch,
           "whole_step_us": timed(lambda: pdev.replay(rec))}
    for i, (st, drec, _, _) in enumerate(rec.stages):
        d = pdev.devices[st.device]
        out[f"stage{i}_alone_us"] = timed(lambda d=d, drec=drec: d.replay(drec))
    k = rec.kernel
    (name, bufs), = list(k.boundary.items())[:1] or [(None, None)]
    if name is not None:
        a, b = pdev.devices[0], pdev.devices[1]
        out["copy_alone_us"] = timed(lambda: b.copy_from(a, bufs[0], bufs[1]))
        out["signal_wait_copy_us"] = timed(lambda: (b.wait_for(a.signal()),
                                                    b.copy_from(a, bufs[0], bufs[1])))
    t0 = time.perf_counter()
    for _ in range(args.n):
        pdev.replay(rec)
    out["host_issue_us"] = (time.perf_counter() - t0) / args.n * 1e6
    pdev.synchronize()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
