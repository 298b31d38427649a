"""The decode GEMM's tilings on a CUDA device, timed with the weights streamed from DRAM as a
decode step streams them: each shape of the Llama-3.2-1B (bf16) and SmolLM2 (Q4_1) decode
projections at several M under :func:`~poot.backends.gpu.strategies.gemm_decode.decode_tiling`'s
own tiling, under every forced ``(NT, WN, S, U)`` of a grid, and under the tiled GEMM, next to
torch's bf16 matmul. Built here (MLIR), run there:

    PYTHONPATH=. python bench/gpu_run/decode_gemm_sweep.py --build .cache/gpu/decode_sweep
    # there, carrying .cache/gpu/decode_sweep:
    PYTHONPATH=. python3 bench/gpu_run/decode_gemm_sweep.py --check .cache/gpu/decode_sweep \\
        --json $OUT/decode_sweep.json

Timing: one CUDA graph of ``R`` launches, launch ``i`` reading copy ``i`` of the weight, the
copies together over :data:`COLD_BYTES` (past the L2 cache: every launch reads its weight from
DRAM, as a step that reads each of its weights once does); x and the split-K partials stay
one buffer each (L2-resident, as in a step). 5 replays, min of 3. Each variant's result is
also held to ``(x rounded to the mma type) @ w.T`` in f64 (a layout bug shows as a relative
error near 1; rounding stays near 1e-6). ``best``: per shape the fastest variant, its GB/s
and its ratio to the default tiling and to torch.
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
for p in (ROOT, ROOT / "bench" / "gpu_run"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import gemm_check as GC  # noqa: E402

#: (format, N, K): the 1B's q/o, k/v, gate/up, down; SmolLM2's q/o, k/v, gate/up, down
SHAPES = [("bf16", 2048, 2048), ("bf16", 512, 2048), ("bf16", 8192, 2048),
          ("bf16", 2048, 8192), ("q4_1", 576, 576), ("q4_1", 192, 576),
          ("q4_1", 1536, 576), ("q4_1", 576, 1536)]
MS = (16, 32, 64, 128)
#: the forced wgmma tilings' grid
RS, WGS, US = (1, 2), (1, 2), (1, 2, 4)
#: K steps a chunk of the ring's variants, and its depths
RING_US = (1, 2)
RING_STAGES = (4, 8, 16)
#: ``--swap``: also the wgmma kernel with its descriptor's offsets exchanged (bring-up)
SWAP = False
#: bytes of weight copies a timing graph cycles through (H100/H200 L2: 50 MB)
COLD_BYTES = 192 << 20
#: ``--ablate``: gemm_decode.ABLATE for every variant (timing only)
ABLATE: str | None = None
#: ``--variants``: only these forced tilings
ONLY: list | None = None
WBYTES = {"bf16": 2.0, "f16": 2.0, "q4_0": 18 / 32, "q4_1": 20 / 32, "q8_0": 34 / 32}


def grid(M: int, N: int, K: int, dense: bool = False) -> list[tuple]:
    """The forced wgmma ``(R, WG, S, U, xpack)`` worth timing at this shape (each tiling
    with x packed by a first kernel and without): accumulators within
    :data:`~.gemm_decode_wgmma.MAX_ACCS`, x's chunk within its buffer, S dividing the K
    steps with a whole number of chunks, the partials under 64 MB, at least one block per 4
    compute units. ``dense`` (16-bit weights): the ring's tilings instead, ``(R, WG, S, U,
    1, stages)``."""
    from poot.backends.gpu.strategies import gemm_decode as D
    from poot.backends.gpu.strategies import gemm_decode_wgmma as W

    Np, KT = -(-M // 8) * 8, K // D.KSTEP
    out = []
    splits = [s for s in (1, 2, 3, 4, 6, 8, 9, 12, 16) if KT % s == 0]
    if dense:       # the ring (x packed): RING_STAGES deep (those its chunks fill) and its
        #             deepest, over the same grid
        for R, WG, S, U in itertools.product(RS, WGS, splits, RING_US):
            top = W.ring_stages(Np, R, WG, U)
            if R * Np // 2 > W.MAX_ACCS or (KT // S) % U or top < 2:
                continue
            if (S > 1 and S * M * N * 4 > 64 << 20) or -(-N // (64 * R * WG)) * S < 33:
                continue
            chunks = KT // S // U
            out += [(R, WG, S, U, 1, st) for st in sorted(
                {min(top, st) for st in RING_STAGES if st <= chunks + 1} | {min(top, chunks + 1)})]
        return out
    us = [u for u in US if u >= 2 or Np >= 128]
    for R, WG, S, U in itertools.product(RS, WGS, splits, us):
        if R * Np // 2 > W.MAX_ACCS or U * Np * 64 > W.X_BUF_BYTES or (KT // S) % U:
            continue
        if S > 1 and S * M * N * 4 > 64 << 20:
            continue
        if -(-N // (64 * R * WG)) * S < 33:
            continue
        out += [(R, WG, S, U, 0), (R, WG, S, U, 1)]
    return out


def _artifact(folder: Path, fmt, M, N, K, caps, variant) -> dict:
    """Variant ``default`` (the target's strategy and tiling: wgmma on sm_90a), ``mma``
    (the mma.sync decode GEMM, the target without sm_90a), ``reg`` (wgmma with A in
    registers: no ring), ``swap`` (wgmma, the descriptor's offsets exchanged: bring-up),
    ``tiled`` (the tiled GEMM) or a forced wgmma ``(R, WG, S, U, xpack[, stages])`` (from
    any M: :data:`~.gemm_decode_wgmma.MIN_M` lifted)."""
    from dataclasses import replace

    from mlir import ir

    from poot.backends.gpu.strategies import gemm_decode as D
    from poot.backends.gpu.strategies import gemm_decode_wgmma as W
    from poot.dialects import make_context
    from poot.graph.builder import Graph

    with make_context(), ir.Location.unknown():
        g = Graph.from_module(ir.Module.parse(GC._region_text(fmt, M, N, K)))
    old = (D.MAX_M, D.FORCE_TILING, D.ABLATE, W.FORCE_TILING, W.SWAP_DESC, W.FORCE_XPACK,
           W.FORCE_STAGES, W.MIN_M)
    mma_caps = replace(caps, features=caps.features - {W.FEATURE})
    try:
        D.ABLATE = ABLATE
        if variant == "tiled":
            D.MAX_M = 0
        elif variant == "swap":
            W.SWAP_DESC = True
        elif variant == "reg":
            W.FORCE_STAGES = 0
        elif isinstance(variant, tuple):
            W.FORCE_TILING, W.FORCE_XPACK = variant[:4], bool(variant[4])
            W.FORCE_STAGES = variant[5] if len(variant) > 5 else 0
            W.MIN_M = 1
        use = mma_caps if variant == "mma" else caps
        art = GC._region_artifact(g, use)
    finally:
        (D.MAX_M, D.FORCE_TILING, D.ABLATE, W.FORCE_TILING, W.SWAP_DESC, W.FORCE_XPACK,
         W.FORCE_STAGES, W.MIN_M) = old
    art.save(str(folder))
    return {"fmt": fmt, "M": M, "N": N, "K": K, "variant": list(variant)
            if isinstance(variant, tuple) else variant,
            "strategies": art.meta["strategies"],
            "launch": [(L["grid"], L["block"]) for L in art.plan["launches"]
                       if L["op"] == "kernel"]}


def build(out: str, shapes=None, ms=None) -> dict:
    from poot.backends.cuda.codegen import cuda_target

    caps = cuda_target().caps
    d = Path(out)
    if d.exists():
        shutil.rmtree(d)
    man: dict = {"format": "poot-decode-gemm-sweep-1", "timing": {}}
    t0 = time.perf_counter()
    for fmt, N, K in shapes or SHAPES:
        for M in ms or MS:
            dense = fmt in ("bf16", "f16")
            variants = ["default", "mma"] + (["reg"] if dense else []) + \
                (["swap"] if SWAP else []) + \
                [v for v in (ONLY if ONLY is not None else grid(M, N, K, dense))
                 if v != _default(M, N, K, fmt, caps)]
            for v in variants:
                name = f"{fmt}_{M}x{N}x{K}_" + (v if isinstance(v, str) else
                                                 "t" + "_".join(map(str, v)))
                man["timing"][name] = _artifact(d / name, fmt, M, N, K, caps, v)
            print(f"{fmt} M={M} N={N} K={K}: {len(variants)} variants", flush=True)
    man["build_s"] = round(time.perf_counter() - t0, 1)
    with open(d / "manifest.json", "w") as f:
        json.dump(man, f, indent=1)
    size = sum(p.stat().st_size for p in d.rglob("*") if p.is_file())
    print(json.dumps({"built": str(d), "bytes": size, "timing": len(man["timing"]),
                      "build_s": man["build_s"]}))
    return man


def _default(M, N, K, fmt, caps):
    from poot.backends.gpu.strategies import gemm_decode_wgmma as W

    t = W.wgmma_tiling(M, N, K, caps.cores, int(N * K * WBYTES[fmt]), fmt in ("bf16", "f16"))
    return (t.R, t.WG, t.S, t.U, int(t.xpack)) + ((t.stages,) if t.stages else ())


def _reference(fmt: str, x: np.ndarray, w: np.ndarray, N: int, K: int) -> np.ndarray:
    """``x @ w.T`` in f64 with x rounded as the kernel rounds it (bf16 for bf16 weights,
    else f16) and the weight decoded (ggml's formulas)."""
    if fmt == "bf16":
        xb = ((x.view(np.uint32) + 0x7FFF + ((x.view(np.uint32) >> 16) & 1)) >> 16 << 16) \
            .view(np.float32)
    else:
        xb = x.astype(np.float16).astype(np.float32)
    if fmt == "bf16":
        wd = (w.astype(np.uint32) << 16).view(np.float32).reshape(N, K)
    else:
        wd = GC._decoded(fmt, w, N, K)
    return xb.astype(np.float64).reshape(-1, K) @ wd.astype(np.float64).T


def _time_cold(dev, runner, wname: str, reps: int) -> float:
    """Seconds per launch over one CUDA graph of ``reps`` launches, launch i reading weight
    copy i (copies made by device-to-device copies of the bound weight)."""
    rt, _ = GC._rt()
    cu = rt.driver()
    ptrs, _ = dev._pointers(runner.kernel, runner.bindings)
    a = runner.by_name[("input", wname)]
    src = runner.bufs[a.buffer]
    copies = [src] + [dev.alloc(a.type) for _ in range(reps - 1)]
    for c in copies[1:]:
        rt._check(cu.cuMemcpyDtoD(c.ptr, src.ptr, src.nbytes), "cuMemcpyDtoD")
    dev.synchronize()
    keep: list = []
    rt._check(cu.cuStreamBeginCapture(
        dev.stream, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
        "cuStreamBeginCapture")
    try:
        for c in copies:
            dev._enqueue(runner.kernel, {**ptrs, a.buffer: c.ptr}, [], keep)
    finally:
        graph = rt._check(cu.cuStreamEndCapture(dev.stream), "cuStreamEndCapture")
    gexec = rt._check(cu.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
    ev0 = rt._check(cu.cuEventCreate(0), "cuEventCreate")
    ev1 = rt._check(cu.cuEventCreate(0), "cuEventCreate")
    rt._check(cu.cuGraphLaunch(gexec, dev.stream), "cuGraphLaunch")
    dev.synchronize()
    best = float("inf")
    for _ in range(3):
        rt._check(cu.cuEventRecord(ev0, dev.stream), "cuEventRecord")
        for _ in range(5):
            rt._check(cu.cuGraphLaunch(gexec, dev.stream), "cuGraphLaunch")
        rt._check(cu.cuEventRecord(ev1, dev.stream), "cuEventRecord")
        rt._check(cu.cuEventSynchronize(ev1), "cuEventSynchronize")
        ms = float(rt._check(cu.cuEventElapsedTime(ev0, ev1), "cuEventElapsedTime"))
        best = min(best, ms / 1e3 / (reps * 5))
    rt._check(cu.cuGraphExecDestroy(gexec), "cuGraphExecDestroy")
    rt._check(cu.cuGraphDestroy(graph), "cuGraphDestroy")
    for c in copies[1:]:
        rt._check(cu.cuMemFree(c.ptr), "cuMemFree")
    return best


def _torch_cold(M, N, K, reps: int) -> float | None:
    try:
        import torch
    except Exception:  # noqa: BLE001
        return None
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    ws = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) for _ in range(reps)]
    y = [x @ w.T for w in ws]
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = [x @ w.T for w in ws]
    g.replay()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(3):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(5):
            g.replay()
        e1.record()
        torch.cuda.synchronize()
        best = min(best, e0.elapsed_time(e1) / 1e3 / (reps * 5))
    del y, ws
    return best


def check(folder: str) -> dict:
    rt, CudaArtifact = GC._rt()
    d = Path(folder)
    man = json.load(open(d / "manifest.json"))
    ok, why = rt.device_available()
    if not ok:
        return {"ok": False, "error": why}
    dev = rt.CudaDevice()
    rep: dict = {"device": dev.device_name, "timing": {}, "best": {}}
    torch_t: dict = {}
    ref: dict = {}
    for name, spec in man["timing"].items():
        fmt, M, N, K = spec["fmt"], spec["M"], spec["N"], spec["K"]
        key = (fmt, M, N, K)
        wb = N * K * WBYTES[fmt]
        reps = max(4, min(256, int(-(-COLD_BYTES // wb))))
        try:
            art = CudaArtifact.load(str(d / name))
            runner = rt.StepRunner(dev, art, {})
            if key not in ref:
                ref.clear()
                inp = GC._random_inputs(art.plan, fmt)
                if fmt == "q4_1":           # the block minimum too (random bytes: NaN)
                    blocks = inp["a1"].reshape(-1, 20)
                    blocks[:, 2:4] = np.full(len(blocks), -0.05, np.float16) \
                        .view(np.uint8).reshape(-1, 2)
                ref[key] = (inp, _reference(fmt, inp["a0"], inp["a1"], N, K))
            inp, want = ref[key]
            got = runner.step(inp, read=["r0"])["r0"].reshape(want.shape)
            rel = float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))
            s = _time_cold(dev, runner, "a1", reps)
            r = {"us": round(s * 1e6, 2), "GBps": round(wb / s / 1e9, 1), "rel_err": rel,
                 "ok": bool(np.isfinite(got).all()) and rel < 1e-3,
                 "variant": spec["variant"], "launch": spec["launch"]}
            del runner
        except Exception as e:  # noqa: BLE001
            r = {"error": f"{type(e).__name__}: {e}", "variant": spec["variant"], "ok": False}
        if (M, N, K) not in torch_t:
            torch_t[(M, N, K)] = _torch_cold(M, N, K, max(4, min(256, int(
                -(-COLD_BYTES // (N * K * 2))))))
        rep["timing"][name] = r
        print(name, json.dumps(r), flush=True)
    by_shape: dict = {}
    for name, r in rep["timing"].items():
        spec = man["timing"][name]
        by_shape.setdefault((spec["fmt"], spec["M"], spec["N"], spec["K"]), []).append(r)
    for (fmt, M, N, K), rs in by_shape.items():
        good = [r for r in rs if r.get("ok")]
        if not good:
            continue
        best = min(good, key=lambda r: r["us"])
        dflt = next((r for r in rs if r["variant"] == "default" and "us" in r), None)
        mma = next((r for r in rs if r["variant"] == "mma" and "us" in r), None)
        reg = next((r for r in rs if r["variant"] == "reg" and "us" in r), None)
        tt = torch_t.get((M, N, K))
        rep["best"][f"{fmt} M={M} N={N} K={K}"] = {
            "variant": best["variant"], "us": best["us"], "GBps": best["GBps"],
            "default_us": dflt and dflt["us"], "mma_us": mma and mma["us"],
            "torch_bf16_us": tt and round(tt * 1e6, 2),
            "default_over_best": dflt and round(dflt["us"] / best["us"], 2),
            "mma_over_default": mma and dflt and round(mma["us"] / dflt["us"], 2),
            "reg_us": reg and reg["us"],
            "reg_over_default": reg and dflt and round(reg["us"] / dflt["us"], 2),
            "torch_over_best": tt and round(tt * 1e6 / best["us"], 2)}
    rep["ok"] = all(r.get("ok") for r in rep["timing"].values())
    print(json.dumps({"ok": rep["ok"], "best": rep["best"]}, indent=1), flush=True)
    return rep


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--build", metavar="DIR", help="compile here (needs MLIR)")
    g.add_argument("--check", metavar="DIR", help="run on a CUDA device (no MLIR)")
    ap.add_argument("--ms", help="comma-separated M (default: 16,32,64,128)")
    ap.add_argument("--shapes", help="fmt:N:K,... (default: the 1B's and SmolLM2's)")
    ap.add_argument("--variants", help="R:WG:S:U:XPACK[:STAGES],... only these wgmma tilings "
                    "(and the default, mma, reg); 'none': no forced tiling")
    ap.add_argument("--swap", action="store_true",
                    help="also the wgmma kernel with its descriptor's offsets exchanged")
    ap.add_argument("--ablate", choices=("no_x", "no_mma", "stream"),
                    help="build: gemm_decode.ABLATE (wrong results, timing only)")
    ap.add_argument("--json", help="write the check's report here")
    a = ap.parse_args(argv)
    if a.build:
        shapes = [(f, int(n), int(k)) for f, n, k in
                  (s.split(":") for s in a.shapes.split(","))] if a.shapes else None
        ms = [int(m) for m in a.ms.split(",")] if a.ms else None
        global ABLATE, ONLY, SWAP
        ABLATE, SWAP = a.ablate, a.swap
        ONLY = None if not a.variants else [] if a.variants == "none" else \
            [tuple(int(v) for v in t.split(":")) for t in a.variants.split(",")]
        build(a.build, shapes, ms)
        return 0
    rep = check(a.check)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rep, f, indent=1, default=str)
    return 0 if rep.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
