"""Decode-GEMV tuning sweep: the ``gemv`` strategy's kernel over weight shapes x tuning knobs
(warps per block, 16-byte units in flight per lane, lanes per block of a packed weight),
timed on a CUDA device from a CUDA graph of back-to-back launches, next to
``torch.nn.functional.linear`` on the same shapes.

    python bench/gpu_run/gemv_sweep.py --build DIR      # here (MLIR): one artifact a variant
    python bench/gpu_run/gemv_sweep.py --run DIR        # the GPU machine (no MLIR): JSON

Each timed graph cycles through enough copies of the weight that they do not fit in L2
(a decode step reads every weight once), so the numbers are DRAM streaming rates. Prints one
JSON object: per shape and variant, microseconds per launch and GB/s of weight bytes, and
torch's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

#: (name, fmt, M, N, K): the decode projections of the Llama-3-8B / 3.2-1B / SmolLM2 shapes
SHAPES = [("8b.qo", "bf16", 1, 4096, 4096), ("8b.kv", "bf16", 1, 1024, 4096),
          ("8b.gate", "bf16", 1, 14336, 4096), ("8b.down", "bf16", 1, 4096, 14336),
          ("8b.head", "bf16", 1, 128256, 4096),
          ("1b.qo", "bf16", 1, 2048, 2048), ("1b.kv", "bf16", 1, 512, 2048),
          ("1b.gate", "bf16", 1, 8192, 2048), ("1b.down", "bf16", 1, 2048, 8192),
          ("smol.q", "q4_1", 1, 576, 576), ("smol.gate", "q4_1", 1, 1536, 576),
          ("smol.down", "q4_1", 1, 576, 1536), ("smol.head", "q8_0", 1, 49152, 576)]
#: ``--small-m``: the 1B projections and LM head at a few rows (a batch of 2-8 decode rows),
#: each as the GEMV (the strategy's own below MAX_M) and as the split-K GEMM (MAX_M lowered)
SMALL_M = [(f"1b.{n}.m{M}", "bf16", M, N, K) for M in (2, 4, 8)
           for n, N, K in (("qo", 2048, 2048), ("gate", 8192, 2048), ("down", 2048, 8192),
                           ("head", 128256, 2048))]
#: (warps per block, units in flight per lane, warps per column (split-K)); None: the rule
VARIANTS = [(None, None, None), (4, 4, None), (8, 4, None), (4, 8, None), (8, 8, None),
            (2, 8, None), (16, 4, None), (8, 4, 2), (8, 4, 4), (8, 2, 4), (16, 4, 4),
            (16, 2, 8), (4, 4, 4)]
#: lanes per 32-weight block of a packed weight (the ``parts`` knob), swept with the rule's
#: other knobs for the packed shapes
PARTS = [1, 2]
L2_BYTES = 256 << 20          # weight copies per graph: at least this many bytes in rotation


def build_small_m(out: str) -> None:
    """The :data:`SMALL_M` shapes, each with the rule's GEMV and with the GEMM (``.gemm``)."""
    sys.path.insert(0, os.path.join(ROOT, "test", "gpu"))
    from types import SimpleNamespace

    from poot.backends.cuda.codegen import compile_program, cuda_target
    from poot.backends.gpu.strategies import matmul, matmul_match
    from test_gpu_matmul import gemv_region  # type: ignore

    target = cuda_target()
    index = []
    for name, fmt, M, N, K in SMALL_M:
        g, _ = gemv_region(fmt, M, N, K)
        for kind in ("gemv", "gemm"):
            # MAX_M is read by matmul_match (gemm_rows, gemv_rows) and by matmul.gemv
            old = matmul.MAX_M, matmul_match.MAX_M
            if kind == "gemm":
                matmul.MAX_M = matmul_match.MAX_M = 1
            try:
                art = compile_program(SimpleNamespace(graph=g, storage=[], target=target,
                                                      dispatches={}))
            finally:
                matmul.MAX_M, matmul_match.MAX_M = old
            vname = f"{name}.{kind}"
            art.save(os.path.join(out, vname))
            index.append({"variant": vname, "shape": name, "fmt": fmt, "M": M, "N": N, "K": K,
                          "strategies": art.meta.get("strategies"),
                          "grid": [L["grid"] for L in art.plan["launches"] if L["op"] == "kernel"],
                          "block": art.plan["launches"][-1]["block"]})
    with open(os.path.join(out, "index.json"), "w") as f:
        json.dump(index, f, indent=1)
    print(f"{len(index)} variants in {out}")


def build(out: str, only: str | None = None) -> None:
    sys.path.insert(0, os.path.join(ROOT, "test", "gpu"))
    from types import SimpleNamespace

    from poot.backends.cuda.codegen import compile_program, cuda_target
    from poot.backends.gpu.strategies import matmul
    from test_gpu_matmul import gemv_region  # type: ignore

    target = cuda_target()
    index = []
    for name, fmt, M, N, K in SHAPES:
        if only and not name.startswith(only):
            continue
        g, _ = gemv_region(fmt, M, N, K)
        variants = [v + (None,) for v in VARIANTS]
        if fmt in matmul.PART_FORMATS:
            variants += [(None, None, None, p) for p in PARTS]
        for warps, unroll, ksplit, parts in variants:
            matmul.TUNING.update(warps=warps, unroll=unroll, ksplit=ksplit, parts=parts)
            art = compile_program(SimpleNamespace(graph=g, storage=[], target=target,
                                                  dispatches={}))
            vname = f"{name}.w{warps or 'auto'}.u{unroll or 'auto'}.k{ksplit or 1}" + \
                (f".p{parts}" if parts else "")
            art.save(os.path.join(out, vname))
            L = art.plan["launches"][0]
            index.append({"variant": vname, "shape": name, "fmt": fmt, "M": M, "N": N, "K": K,
                          "warps": warps, "unroll": unroll, "ksplit": ksplit, "parts": parts,
                          "grid": L["grid"],
                          "block": L["block"]})
    matmul.TUNING.update(warps=None, unroll=None, ksplit=None, parts=None)
    with open(os.path.join(out, "index.json"), "w") as f:
        json.dump(index, f, indent=1)
    print(f"{len(index)} variants in {out}")


def _time_graph(cu, dev, enqueue, reps: int = 5) -> float:
    """Seconds of one replay of the graph ``enqueue`` captures (min over ``reps``)."""
    from poot.backends.cuda.runtime import _check

    _check(cu.cuStreamBeginCapture(dev.stream,
                                   cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
           "cuStreamBeginCapture")
    try:
        enqueue()
    finally:
        graph = _check(cu.cuStreamEndCapture(dev.stream), "cuStreamEndCapture")
    gexec = _check(cu.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
    ev0 = _check(cu.cuEventCreate(0), "cuEventCreate")
    ev1 = _check(cu.cuEventCreate(0), "cuEventCreate")
    best = float("inf")
    for _ in range(reps + 1):
        _check(cu.cuEventRecord(ev0, dev.stream), "cuEventRecord")
        _check(cu.cuGraphLaunch(gexec, dev.stream), "cuGraphLaunch")
        _check(cu.cuEventRecord(ev1, dev.stream), "cuEventRecord")
        _check(cu.cuEventSynchronize(ev1), "cuEventSynchronize")
        best = min(best, _check(cu.cuEventElapsedTime(ev0, ev1), "cuEventElapsedTime") / 1e3)
    return best


def run(folder: str) -> dict:
    from poot.backends.cuda.artifact import CudaArtifact
    from poot.backends.cuda.runtime import CudaDevice, _check, driver

    cu = driver()
    dev = CudaDevice()
    with open(os.path.join(folder, "index.json")) as f:
        index = json.load(f)
    results = []
    for v in index:
        art = CudaArtifact.load(os.path.join(folder, v["variant"]))
        k = dev.load(art)
        bufs = [dev.alloc(a.type) for a in k.args]
        ptrs, _ = dev._pointers(k, bufs)
        # the region's second argument is the weight (gemv_region: x, w, ...)
        wbuf = next(a.buffer for a in k.args if a.name == "a1")
        wbytes = next(a.type.nbytes for a in k.args if a.name == "a1")
        copies = max(1, min(64, -(-L2_BYTES // wbytes)))
        wptrs = [dev._alloc_bytes(wbytes) for _ in range(copies)]
        launches = max(copies, 16)

        def enqueue():
            keep: list = []
            for i in range(launches):
                ptrs[wbuf] = wptrs[i % copies]
                dev._enqueue(k, ptrs, [], keep)
        s = _time_graph(cu, dev, enqueue)
        us = s / launches * 1e6
        results.append({**v, "us": round(us, 2), "GBps": round(wbytes / (us * 1e-6) / 1e9, 1),
                        "copies": copies})
        print(json.dumps(results[-1]), file=sys.stderr)
        for p in wptrs:
            _check(cu.cuMemFree(p), "cuMemFree")
        for b in bufs:
            _check(cu.cuMemFree(b.ptr), "cuMemFree")
    torch_res = []
    try:
        import torch

        for name, fmt, M, N, K in SHAPES:
            if fmt != "bf16":
                continue
            nb = N * K * 2
            copies = max(1, min(64, -(-L2_BYTES // nb)))
            ws = [torch.empty(N, K, dtype=torch.bfloat16, device="cuda").normal_()
                  for _ in range(copies)]
            x = torch.randn(M, K, dtype=torch.bfloat16, device="cuda")
            launches = max(copies, 16)
            s = torch.cuda.Stream()
            with torch.cuda.stream(s):
                for w in ws:
                    torch.nn.functional.linear(x, w)
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for i in range(launches):
                    torch.nn.functional.linear(x, ws[i % copies])
            best = float("inf")
            for _ in range(6):
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                g.replay()
                e1.record()
                torch.cuda.synchronize()
                best = min(best, e0.elapsed_time(e1) / 1e3)
            us = best / launches * 1e6
            torch_res.append({"shape": name, "us": round(us, 2),
                              "GBps": round(nb / (us * 1e-6) / 1e9, 1)})
            del ws
            torch.cuda.empty_cache()
    except Exception as e:  # noqa: BLE001
        torch_res.append({"error": f"{type(e).__name__}: {e}"})
    return {"device": dev.device_name, "poot": results, "torch_linear": torch_res}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", metavar="DIR")
    ap.add_argument("--run", metavar="DIR")
    ap.add_argument("--out", default=None)
    ap.add_argument("--only", default=None, help="build only the shapes named with this prefix")
    ap.add_argument("--small-m", action="store_true",
                    help="build the SMALL_M shapes as the GEMV and as the GEMM instead")
    a = ap.parse_args()
    if a.build:
        (build_small_m(a.build) if a.small_m else build(a.build, a.only))
    if a.run:
        res = run(a.run)
        text = json.dumps(res, indent=1)
        if a.out:
            with open(a.out, "w") as f:
                f.write(text)
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
