"""Where a wgpu decode token's host time goes, run by run, in one process: SmolLM2 (random
Q4_1 weights) generating 128 tokens greedily several times; per run the tok/s and the host
seconds inside ``WgpuDevice`` replay (encode), submit (``_flush``), readback waits (the device
poll) and the rest, plus how many reads fell back to waiting for every submission
(``_Native.full_polls``). The same build measured 0.26-0.50x CUDA from run to run.

    python3 bench/gpu_run/wgpu_loop_parts.py OUT.json CACHE_DIR [--runs 6] [--gc on|freeze|off]

``--gc``: Python's cyclic garbage collector left on (default), its objects from loading
frozen (``gc.freeze()`` after the warm-up: collections then skip them), or disabled.

Runs on the GPU machine from a compile cache built here (bench/gpu_run/README.md, backends.py).
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time


def main() -> int:
    out, cache = sys.argv[1], sys.argv[2]
    runs = int(sys.argv[sys.argv.index("--runs") + 1]) if "--runs" in sys.argv else 6
    os.environ["POOT_CACHE_DIR"] = cache
    from poot.api import Driver, ModelHandle
    from poot.backends.wgpu import runtime as R
    from poot.sampling_params import SamplingParams

    spent = {"replay": 0.0, "flush": 0.0, "wait": 0.0, "poll": 0.0}
    counts = {"replay": 0, "flush": 0, "wait": 0, "poll": 0}

    def timed(cls, name, key):
        fn = getattr(cls, name)

        def wrapper(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[key] += time.perf_counter() - t0
                counts[key] += 1
        setattr(cls, name, wrapper)

    timed(R.WgpuDevice, "replay", "replay")
    timed(R.WgpuDevice, "_flush", "flush")
    timed(R.WgpuReadback, "wait", "wait")
    timed(R._Native, "poll", "poll")
    h = ModelHandle.load("bench/shapes/smollm2-135m.json", backend="wgpu", kv_capacity=256,
                         max_batch=1, random_weights="q4_1")
    params = SamplingParams(temperature=0, max_tokens=128, ignore_eos=True)
    drv = Driver(h)
    drv.complete(list(range(1, 33)), SamplingParams(temperature=0, max_tokens=8,
                                                   ignore_eos=True))
    native = h.runner.session.device._native()
    mode = sys.argv[sys.argv.index("--gc") + 1] if "--gc" in sys.argv else "on"
    if mode == "freeze":
        gc.collect()
        gc.freeze()
    elif mode == "off":
        gc.disable()
    report = {"runs": []}
    for i in range(runs):
        for d in (spent, counts):
            for k in d:
                d[k] = 0
        full0 = native.full_polls if native else 0
        gc0 = [g["collections"] for g in gc.get_stats()]
        t0 = time.perf_counter()
        res = drv.complete(list(range(1, 33)), params)
        wall = time.perf_counter() - t0
        st = res.stats
        row = {"tok_s": round(st.decode_tokens_per_s, 1), "wall_s": round(wall, 4),
               "ttft_s": round(st.ttft_s, 4),
               "us_per_token": {k: round(v / 128 * 1e6, 1) for k, v in spent.items()},
               "calls": dict(counts),
               "full_polls": (native.full_polls - full0) if native else None,
               "gc": mode, "collections": [g["collections"] - c for g, c in zip(gc.get_stats(), gc0)]}
        row["us_per_token"]["other"] = round(wall / 128 * 1e6 - spent["replay"] / 128 * 1e6
                                             - spent["wait"] / 128 * 1e6, 1)
        print(json.dumps(row), flush=True)
        report["runs"].append(row)
    with open(out, "w") as f:
        json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
