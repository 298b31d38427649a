"""CUDA, raw Vulkan and wgpu side by side on one GPU: ``poot bench`` (batch-1 decode tok/s,
time to first token, replay-only step time, and GPU time per dispatch kind where the device
times dispatches) of each backend on the same shapes and random weights, from a compile cache built elsewhere (``poot compile --device-caps``), plus, for
wgpu, the host time of re-encoding one decode step. Prints and writes one JSON object with
the ratios to CUDA.

    python3 bench/gpu_run/backends.py OUT.json CACHE_DIR [--tokens 128] [--only SUBSTRING] [--backends cuda,wgpu] [--no-profile]

Runs on the GPU machine (no MLIR there); see bench/gpu_run/README.md for the build here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

#: (shape config, random-weights dtype, backends)
RUNS = [("bench/shapes/smollm2-135m.json", "q4_1", ("cuda", "vulkan", "wgpu")),
        ("bench/shapes/llama-3.2-1b.json", "bf16", ("cuda", "vulkan", "wgpu")),
        ("bench/shapes/llama-3.2-1b.json", "f32", ("cuda", "wgpu"))]


#: backends whose devices time their dispatches (``poot bench --profile``)
PROFILED = ("cuda", "vulkan")


def bench(backend: str, config: str, dtype: str, cache: str, tokens: int) -> dict:
    out = f"/tmp/bench-{backend}-{os.path.basename(config)}-{dtype}.json"
    cmd = [sys.executable, "-m", "poot.cli", "bench", "--backend", backend, "--config", config,
           "--random-weights", "--dtype", dtype, "--kv-capacity", "256", "--max-batch", "1",
           "--max-tokens", str(tokens), "--runs", "2", "--replay", "50", "--out", out]
    if backend in PROFILED and "--no-profile" not in sys.argv:
        cmd.append("--profile")
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ,
                                                                  "POOT_CACHE_DIR": cache})
    if r.returncode != 0:
        return {"error": (r.stderr.strip().splitlines() or ["?"])[-1], "wall_s":
                round(time.perf_counter() - t0, 1)}
    with open(out) as f:
        res = json.load(f)
    res["wall_s"] = round(time.perf_counter() - t0, 1)
    return res


def wgpu_encode_us(config: str, dtype: str, cache: str, n: int = 50) -> dict:
    """Host microseconds to re-encode and submit one decode step on wgpu, apart from the GPU:
    ``encode`` builds the command buffers alone; ``replay`` adds submit + wait."""
    os.environ["POOT_CACHE_DIR"] = cache
    from poot.api import Driver, ModelHandle
    from poot.cli.bench_cmd import decode_entry
    from poot.sampling_params import SamplingParams

    h = ModelHandle.load(config, backend="wgpu", kv_capacity=256, max_batch=1,
                         random_weights=dtype)
    Driver(h).complete([1, 2, 3], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    dev = h.runner.session.device
    rec = next(iter(decode_entry(h).recordings.values()))
    t0 = time.perf_counter()
    for _ in range(n):
        dev._encode(rec.ops)
    enc = (time.perf_counter() - t0) / n * 1e6
    dispatches = sum(1 for op in rec.ops if op[0] == "dispatch")
    return {"encode_us": round(enc, 1), "dispatches": dispatches,
            "encode_us_per_dispatch": round(enc / max(dispatches, 1), 2)}


def main() -> int:
    out, cache = sys.argv[1], sys.argv[2]
    tokens = int(sys.argv[sys.argv.index("--tokens") + 1]) if "--tokens" in sys.argv else 128
    only = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else ""
    report: dict = {"runs": []}
    for config, dtype, backends in RUNS:
        if only and only not in f"{config}:{dtype}":
            continue
        row = {"config": config, "dtype": dtype}
        if "--backends" in sys.argv:
            keep = sys.argv[sys.argv.index("--backends") + 1].split(",")
            backends = tuple(b for b in backends if b in keep)
        for b in backends:
            row[b] = bench(b, config, dtype, cache, tokens)
            print(b, config, dtype, {k: row[b].get(k) for k in
                                     ("decode_tokens_per_s", "ttft_s", "replay_us_per_step",
                                      "pipelined", "error")}, flush=True)
            prof = row[b].get("poot", {}).get("profile")
            if prof:
                print("  profile ms", {k: v["ms"] for k, v in prof["by_kind"].items()},
                      "total", prof["total_ms"], flush=True)
        ref = row.get("cuda", {}).get("decode_tokens_per_s")
        for b in backends:
            v = row[b].get("decode_tokens_per_s")
            if ref and v:
                row[f"{b}_vs_cuda"] = round(v / ref, 4)
        report["runs"].append(row)
        with open(out, "w") as f:          # what finished, if the call runs out of time
            json.dump(report, f, indent=1)
    try:
        report["wgpu_encode"] = wgpu_encode_us(RUNS[0][0], RUNS[0][1], cache)
    except Exception as e:  # noqa: BLE001  (a report, not a failure)
        report["wgpu_encode"] = {"error": f"{type(e).__name__}: {e}"}
    print(json.dumps(report["wgpu_encode"]))
    with open(out, "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps({r["config"] + ":" + r["dtype"]: {k: v for k, v in r.items()
                                                       if k.endswith("_vs_cuda")}
                      for r in report["runs"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
