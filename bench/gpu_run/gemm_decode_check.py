"""The decode GEMM (poot/backends/gpu/strategies/gemm_decode.py) on a CUDA device: every
format at M = 3..128 (ragged M and N, split-K and not, epilogues) held to the error bound,
the tiny Q4_1 Llama's 32-token prefill step against the oracle, and the time of the
Llama-3.2-1B (bf16) and SmolLM2 (Q4_1) decode projections at M = 8..128 under the decode
GEMM, under the tiled GEMM it replaced, and as torch's bf16 matmul. Built here (MLIR), run
there with ``gemm_check.py``'s machinery:

    PYTHONPATH=. python bench/gpu_run/gemm_decode_check.py --build .cache/gpu/gemm_decode
    # there, carrying .cache/gpu/gemm_decode:
    PYTHONPATH=. python3 bench/gpu_run/gemm_decode_check.py --check .cache/gpu/gemm_decode \\
        --json $OUT/gemm_decode.json

Timing: x f32 [M, K] and the weight random on the device's host side (nothing large
travels), 20 launches a CUDA graph x 10 replays, min of 3 (``gemm_check._time_graph``);
weights under 50 MB stay L2-warm between launches, as in ``gemm_check.py`` (the same for
every variant and for torch). ``summary``: per shape us and weight GB/s of each variant.
Exit status 1 when a correctness case fails.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for p in (ROOT, ROOT / "bench" / "gpu_run"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import gemm_check as GC  # noqa: E402

#: (format, M, N, K, epilogue): small enough to carry (weights <= 2 MB each)
CASES = [
    ("bf16", 3, 300, 576, "residual"),
    ("bf16", 8, 1000, 576, "none"),
    ("bf16", 64, 1024, 1024, "silu_up"),
    ("bf16", 128, 520, 2048, "none"),
    ("f16", 33, 576, 1536, "residual"),
    ("f16", 100, 300, 576, "none"),
    ("q4_0", 9, 576, 576, "residual"),
    ("q4_0", 64, 1000, 1024, "silu_up"),
    ("q4_1", 16, 576, 1536, "none"),
    ("q4_1", 64, 1536, 576, "residual"),
    ("q4_1", 100, 300, 2048, "none"),
    ("q8_0", 33, 576, 576, "silu_up"),
    ("q8_0", 128, 1000, 1024, "none"),
]
#: sibling cases (gemm_check.build_sibling_case): decode GEMMs of one x fused phase by phase
#: (poot/backends/gpu/horizontal.py), as a decode step's q/k/v and gate/up are
SIBLINGS = [(64, 1024, (1024, 256, 256)), (16, 512, (2048, 2048))]
#: timed shapes: (format, N, K) at each M of ``MS``; the 1B's LM head at M = 64 alone
SHAPES = [("bf16", N, K) for N, K in ((2048, 2048), (512, 2048), (8192, 2048), (2048, 8192))] \
    + [("q4_1", N, K) for N, K in ((576, 576), (192, 576), (1536, 576), (576, 1536))]
MS = (8, 16, 32, 64, 128)
HEAD = ("bf16", 64, 128256, 2048)
WBYTES = {"bf16": 2.0, "f16": 2.0, "q4_0": 18 / 32, "q4_1": 20 / 32, "q8_0": 34 / 32}


def _timing_artifact(folder: Path, fmt, M, N, K, caps, tiled: bool) -> dict:
    from mlir import ir

    from poot.backends.gpu.strategies import gemm_decode
    from poot.dialects import make_context
    from poot.graph.builder import Graph

    with make_context(), ir.Location.unknown():
        g = Graph.from_module(ir.Module.parse(GC._region_text(fmt, M, N, K)))
    old = gemm_decode.MAX_M
    try:
        if tiled:
            gemm_decode.MAX_M = 0
        art = GC._region_artifact(g, caps)
    finally:
        gemm_decode.MAX_M = old
    art.save(str(folder))
    return {"fmt": fmt, "M": M, "N": N, "K": K, "variant": "tiled" if tiled else "decode",
            "strategies": art.meta["strategies"],
            "launch": [(L["grid"], L["block"]) for L in art.plan["launches"]
                       if L["op"] == "kernel"]}


def build(out: str, timing: bool = True, kernels=("wgmma", "mma")) -> dict:
    """Every case under each of ``kernels``: ``wgmma`` (the target's decode GEMM on sm_90a),
    ``mma`` (the mma.sync one: the target without sm_90a; names end ``_mma``), ``swap``
    (wgmma, its descriptor's offsets exchanged: bring-up; ``_swap``), ``xpack`` (wgmma
    with x packed by a first kernel at every shape; ``_xpack``); the timing artifacts
    unless not ``timing``."""
    from dataclasses import replace

    from poot.backends.cuda.codegen import cuda_target
    from poot.backends.gpu.strategies import gemm_decode
    from poot.backends.gpu.strategies import gemm_decode_wgmma as W

    caps = cuda_target().caps
    known = {"wgmma": ("", caps, "gemm_decode_wgmma"),
             "mma": ("_mma", replace(caps, features=caps.features - {W.FEATURE}),
                     "gemm_decode"),
             "swap": ("_swap", caps, "gemm_decode_wgmma"),
             "xpack": ("_xpack", caps, "gemm_decode_wgmma")}
    variants = [known[k] for k in kernels]
    d = Path(out)
    if d.exists():
        shutil.rmtree(d)
    man: dict = {"format": "poot-gemm-decode-check-1", "cases": {}, "timing": {}}
    t0 = time.perf_counter()
    for suffix, vcaps, want_k in variants:
        W.SWAP_DESC = suffix == "_swap"
        W.FORCE_XPACK = True if suffix == "_xpack" else None
        try:
            for i, (fmt, M, N, K, epi) in enumerate(CASES):
                name = f"{fmt}_{M}x{N}x{K}_{epi}{suffix}"
                # the wgmma kernel takes M >= MIN_M; fewer rows stay the mma.sync one's
                want = want_k if M >= W.MIN_M or want_k == "gemm_decode" else "gemm_decode"
                man["cases"][name] = GC.build_case(d / "cases" / name, fmt, M, N, K, epi,
                                                   vcaps, seed=i)
                if set(man["cases"][name]["strategies"]) != {want}:
                    raise SystemExit(f"{name}: not {want}: {man['cases'][name]['strategies']}")
                print(f"case {name}: built", flush=True)
            for i, (M, K, Ns) in enumerate(SIBLINGS):
                name = f"siblings_{M}x{K}_" + "_".join(map(str, Ns)) + suffix
                man["cases"][name] = GC.build_sibling_case(d / "cases" / name, M, K, Ns,
                                                           vcaps, seed=i)
                print(f"case {name}: built", flush=True)
        finally:
            W.SWAP_DESC, W.FORCE_XPACK = False, None
    shapes = [(f, M, N, K) for f, N, K in SHAPES for M in MS] + [HEAD] if timing else []
    for fmt, M, N, K in shapes:
        for tiled in (False, True):
            name = f"{fmt}_{M}x{N}x{K}_{'tiled' if tiled else 'decode'}"
            man["timing"][name] = _timing_artifact(d / "timing" / name, fmt, M, N, K, caps,
                                                   tiled)
            print(f"timing {name}: {man['timing'][name]['launch']}", flush=True)
    man["prefill"] = GC.build_prefill(d / "prefill") if timing else None
    man["build_s"] = round(time.perf_counter() - t0, 1)
    with open(d / "manifest.json", "w") as f:
        json.dump(man, f, indent=1)
    size = sum(p.stat().st_size for p in d.rglob("*") if p.is_file())
    print(json.dumps({"built": str(d), "bytes": size, "cases": len(man["cases"]),
                      "timing": len(man["timing"]), "build_s": man["build_s"]}))
    return man


def check(folder: str) -> dict:
    rt, _ = GC._rt()
    d = Path(folder)
    man = json.load(open(d / "manifest.json"))
    ok, why = rt.device_available()
    if not ok:
        return {"ok": False, "error": why}
    dev = rt.CudaDevice()
    rep: dict = {"device": dev.device_name, "cases": {}, "timing": {}, "summary": {}}
    for name in man["cases"]:
        try:
            rep["cases"][name] = GC.check_case(dev, d / "cases" / name)
        except Exception as e:  # noqa: BLE001
            rep["cases"][name] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        print(name, json.dumps(rep["cases"][name]), flush=True)
    try:
        rep["prefill"] = GC.check_prefill(d / "prefill") if man.get("prefill") else \
            {"ok": True, "skipped": "not built"}
    except Exception as e:  # noqa: BLE001
        rep["prefill"] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    print("prefill", json.dumps({k: v for k, v in rep["prefill"].items() if k != "steps"},
                                default=str), flush=True)
    rep["ok"] = all(c.get("ok") for c in rep["cases"].values()) and \
        bool(rep["prefill"].get("ok"))
    torch_t: dict = {}
    for name, spec in man["timing"].items():
        key = (spec["M"], spec["N"], spec["K"])
        try:
            r = GC.check_timing(dev, d / "timing" / name, spec)
            r["GBps"] = round(spec["N"] * spec["K"] * WBYTES[spec["fmt"]] / (r["us"] * 1e-6)
                              / 1e9, 1)
            if key not in torch_t:
                torch_t[key] = GC._torch_time(*key, reps=20, rounds=10)
            if torch_t[key]:
                r["torch_bf16_us"] = round(torch_t[key] * 1e6, 2)
        except Exception as e:  # noqa: BLE001
            r = {"error": f"{type(e).__name__}: {e}"}
        rep["timing"][name] = r
        s = rep["summary"].setdefault(f"{spec['fmt']} M={spec['M']} N={spec['N']} "
                                      f"K={spec['K']}", {})
        s[spec["variant"]] = {k: r.get(k) for k in ("us", "GBps", "launch")}
        s["torch_bf16_us"] = r.get("torch_bf16_us")
        if "us" in s.get("decode", {}) and "us" in s.get("tiled", {}) and \
                s["decode"]["us"] and s["tiled"]["us"]:
            s["tiled_over_decode"] = round(s["tiled"]["us"] / s["decode"]["us"], 2)
        print(name, json.dumps(r), flush=True)
    print(json.dumps({"ok": rep["ok"], "summary": rep["summary"]}, indent=1), flush=True)
    return rep


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--build", metavar="DIR", help="compile here (needs MLIR)")
    g.add_argument("--check", metavar="DIR", help="run on a CUDA device (no MLIR)")
    ap.add_argument("--json", help="write the check's report here")
    ap.add_argument("--cases-only", action="store_true",
                    help="build: the correctness cases only (no timing, no prefill)")
    ap.add_argument("--kernels", default="wgmma,mma",
                    help="build: the cases under these decode GEMMs (wgmma, mma, swap: wgmma "
                    "with the descriptor's offsets exchanged, xpack: wgmma with x packed)")
    a = ap.parse_args(argv)
    if a.build:
        build(a.build, timing=not a.cases_only, kernels=a.kernels.split(","))
        return 0
    rep = check(a.check)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rep, f, indent=1, default=str)
    return 0 if rep.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
