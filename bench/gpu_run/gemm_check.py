"""The prefill GEMM strategy (poot/backends/gpu/strategies/gemm.py) on a CUDA device: built
here (MLIR), checked and timed on the GPU machine (no MLIR there).

    # here (repo root, MLIR installed): PTX + inputs + oracle outputs + error bounds (~70 MB,
    # over the device's 64 MiB carry: --formats bf16,f16,siblings keeps ~55 MB)
    PYTHONPATH=. python bench/gpu_run/gemm_check.py --build .cache/gpu/gemm [--formats F,...]
    # there (repo root; numpy + cuda-bindings, torch optional): run, compare, time -> JSON
    PYTHONPATH=. python3 bench/gpu_run/gemm_check.py --check .cache/gpu/gemm --json $OUT/gemm.json

``--build DIR`` writes ``DIR/manifest.json`` and one folder per case:

* ``cases/<name>/``: a one-dispatch region (``x [1, M, K] f32 @ weight^T`` + an epilogue)
  compiled for the CUDA target (plan.json + kernels.ptx, the strategy the plan chose in
  ``meta``), ``inputs.npz`` (bf16/f16 as uint16 words, packed weights as bytes) and
  ``expected.npz``: ``want`` (the oracle's f32 result) and ``bound`` (per element: the error
  bound stated in the strategy's docstring, :func:`~poot.backends.gpu.strategies.gemm.
  error_bound`, times the epilogue's slope). A case passes when every ``|got - want| <=
  bound``.
* ``timing/<name>/``: PTX of the bf16 and Q4_0 GEMMs N x K = 4096x4096 and 14336x4096 at
  M = 32 and 128 tokens and of the Llama-3.2-1B projections at M = 32 (x f32 [M, K], y f32
  [M, N]), with the tile and split-K the strategy picks (``strategy_own_tile``), that tile
  with each split of :data:`SPLITS`, and every other BN x BK of the same BM that fits (names
  end in ``_BMxBNxBKxSPLIT``); the check fills the inputs with random values on the host (nothing large
  travels) and times 20 launches per CUDA graph x 10 graph replays between CUDA events, min
  of 3; torch.matmul (bf16 x bf16, x already bf16) on the same shapes gives the ratio.
  Weights up to 117 MB: the 4096x4096 ones fit the H200's 50 MB L2, so those numbers are
  L2-warm (the same holds for torch). ``summary`` lists per shape the strategy's tile and the
  fastest one.
* ``prefill/``: the tiny Llama Q4_1 fixture's 32-token prefill step, planned for CUDA (its
  matmuls through the GEMM), with the oracle's per-dispatch and whole-step results (the
  device check of :mod:`poot.backends.cuda.devcheck`, run at the f16-input tolerance
  ``PREFILL_TOL`` instead of its f32 one: x and the decoded weights are rounded to f16).

``--check DIR`` prints (and with ``--json`` writes) one JSON report; exit status 1 when a
correctness case fails.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: correctness cases: (format, M, N, K, epilogue); ragged M/N/K included
CASES = [
    ("bf16", 32, 1000, 576, "residual"),
    ("bf16", 77, 300, 200, "none"),           # K % 32 != 0, M and N ragged
    ("bf16", 130, 192, 36, "silu_up"),        # K % 8 != 0: scalar staging
    ("f16", 32, 576, 1536, "none"),
    ("f16", 9, 100, 64, "residual"),          # smallest M the GEMM takes
    ("q4_0", 32, 1000, 576, "silu_up"),
    ("q4_0", 128, 2048, 2048, "none"),
    ("q4_1", 48, 576, 1536, "residual"),
    ("q8_0", 200, 333, 576, "none"),
    ("q4_k", 32, 512, 1536, "residual"),
    ("q6_k", 64, 300, 512, "none"),
    ("bf16", 32, 1024, 4096, "residual"),     # split-K: slices + the reduction's epilogue
    ("q4_1", 32, 512, 4096, "silu_up"),
]

#: sibling cases: split-K GEMMs of one x [M, K] (bf16 weights of widths Ns), fused phase by
#: phase into one launch each (poot/backends/gpu/horizontal.py): the 1B shape's q/k/v with
#: its LoRA shrink (tiles of two shapes: views of one workgroup buffer), and gate/up (one
#: tile shape, shared; at K = 1024 to keep the case small)
SIBLINGS = [(32, 2048, (2048, 512, 512, 48)), (32, 1024, (4096, 4096, 32))]

#: timing GEMMs: (format, M, N, K); then the Llama-3.2-1B projections at M = 32 (a batch-32
#: decode step, a 32-token prefill chunk): q/o, k/v, gate/up, down
TIMING = [(f, M, N, 4096) for f in ("bf16", "q4_0") for N in (4096, 14336) for M in (32, 128)] \
    + [("bf16", 32, N, K) for N, K in ((2048, 2048), (512, 2048), (8192, 2048), (2048, 8192))] \
    + [("bf16", 32, N, K) for N, K in ((16, 2048), (48, 2048), (16, 8192))]   # LoRA shrinks
#: split-K slice counts timed with every tile (besides the strategy's own choice)
SPLITS = (1, 2, 4, 8, 16)

#: devcheck tolerance for the prefill bundle (relative to max(1, max|want|)): f16 inputs
PREFILL_TOL = 5e-3
PREFILL_TOKENS = 32


# ---- build (here, with MLIR) --------------------------------------------------------------------

def _region_artifact(g, caps):
    from types import SimpleNamespace

    from poot.backends.cuda.artifact import CudaArtifact
    from poot.backends.cuda.codegen import ptx_text, target_chip
    from poot.backends.gpu.plan import plan_program

    plan = plan_program(SimpleNamespace(graph=g, storage=[]), caps)
    chip = target_chip(caps)
    ptx = ptx_text(plan.module, chip)
    p = {"entry": plan.entry, "target": {"arch": chip, "subgroup_size": 32},
         "kernels": plan.kernels, "buffers": plan.buffers, "launches": plan.launches,
         "dispatches": plan.dispatches, "inputs": plan.inputs, "params": plan.params,
         "outputs": plan.outputs}
    return CudaArtifact(p, ptx, {"strategies": plan.strategies})


def _host(v) -> np.ndarray:
    a = np.asarray(v)
    return a.view(np.uint16) if a.dtype.itemsize == 2 and a.dtype.kind != "i" else a


def _decoded(fmt: str, w, N: int, K: int) -> np.ndarray:
    if fmt in ("bf16", "f16", "f32"):
        return np.asarray(w).astype(np.float32)
    from poot.dialects.quant import BY_NAME
    from poot.dialects.quant_ref import dequantize

    return dequantize(BY_NAME[fmt], np.asarray(w), (N, K))


def _mma(fmt: str) -> str:
    return "bf16" if fmt == "bf16" else "f16" if fmt == "f16" else "f16q"


def case_bound(fmt, M, N, K, epilogue, inputs) -> np.ndarray:
    """The per-element tolerance of a case: the GEMM's bound times the epilogue's slope
    (1 for none/residual; silu_up: |silu'(y)| <= 1.1 times |up|), plus f32 slack."""
    from poot.backends.gpu.strategies.gemm import error_bound

    b = error_bound(inputs["a0"].reshape(M, K), _decoded(fmt, inputs["a1"], N, K), _mma(fmt))
    if epilogue == "silu_up":
        b = b * 1.1 * np.abs(inputs["a2"].reshape(M, N))
    return b


def _gemv_region():
    sys.path.insert(0, str(ROOT / "test" / "models"))
    sys.path.insert(0, str(ROOT / "test" / "gpu"))
    from test_gpu_matmul import gemv_region  # the tracer's spelling of the region

    return gemv_region


def build_case(folder: Path, fmt, M, N, K, epilogue, caps, seed=0) -> dict:
    from poot import oracle

    g, inputs = _gemv_region()(fmt, M, N, K, epilogue, seed=seed)
    art = _region_artifact(g, caps)
    want = np.asarray(oracle.evaluate(g, inputs)["r0"], np.float32)
    bound = case_bound(fmt, M, N, K, epilogue, inputs).reshape(want.shape)
    bound = bound + 1e-6 * np.abs(want)
    art.save(str(folder))
    np.savez(folder / "inputs.npz", **{k: _host(v) for k, v in inputs.items()})
    np.savez(folder / "expected.npz", want=want, bound=bound.astype(np.float32))
    return {"fmt": fmt, "M": M, "N": N, "K": K, "epilogue": epilogue,
            "strategies": art.meta["strategies"]}


def build_sibling_case(folder: Path, M, K, Ns, caps, seed=0) -> dict:
    """A :data:`SIBLINGS` case: the merged step of the sibling GEMMs (built by the same
    planning as a decode step's), each result with its own bound."""
    sys.path.insert(0, str(ROOT / "test" / "gpu"))
    from test_gpu_horizontal import _gemm_step

    from poot import oracle

    g, inputs = _gemm_step(M, K, list(Ns), seed=seed)
    art = _region_artifact(g, caps)
    launches = [L["strategy"] for L in art.plan["launches"] if L["op"] == "kernel"]
    if launches != ["horizontal", "horizontal"]:
        raise SystemExit(f"siblings {Ns}: not fused phase by phase: {launches}")
    want = oracle.evaluate(g, inputs)
    exp = {}
    for i, N in enumerate(Ns):
        w = np.asarray(want[f"r{i}"], np.float32)
        b = case_bound("bf16", M, N, K, "none", {"a0": inputs["a0"], "a1": inputs[f"a{i + 1}"]})
        exp[f"want_r{i}"], exp[f"bound_r{i}"] = w, (b.reshape(w.shape) +
                                                   1e-6 * np.abs(w)).astype(np.float32)
    art.save(str(folder))
    np.savez(folder / "inputs.npz", **{k: _host(v) for k, v in inputs.items()})
    np.savez(folder / "expected.npz", **exp)
    return {"fmt": "bf16", "M": M, "K": K, "Ns": list(Ns), "strategies": art.meta["strategies"]}


def tiles(fmt, M, N, K, caps) -> list[tuple[int, int, int, int]]:
    """(BM, BN, BK, split-K slices) to time: the strategy's own first, its tile with each
    slice count of :data:`SPLITS`, then every other BN x BK of the same BM that fits in
    workgroup memory (and, packed, divides K) with the slices :func:`choose_split` gives it."""
    from poot.backends.gpu.strategies import gemm as G

    packed = fmt not in ("bf16", "f16")
    own = G.choose_tiling(M, N, K, caps.cores, caps.max_shared_bytes, packed)
    out = [(own.BM, own.BN, own.BK, G.choose_split(own, M, N, K, caps.cores))]
    for bn in (32, 64, 128):
        for bk in G.BKS:
            t = G.Tiling(own.BM, bn, *G.WARPS[own.BM], bk)
            if t.smem_bytes > caps.max_shared_bytes or (packed and K % bk):
                continue
            for s in sorted({*SPLITS, G.choose_split(t, M, N, K, caps.cores)}):
                if s <= -(-K // bk) and (t.BM, t.BN, t.BK, s) not in out:
                    out.append((t.BM, t.BN, t.BK, s))
    return out


def build_timing(folder: Path, fmt, M, N, K, caps, tile) -> dict:
    """PTX only: the weight and x are random on the device. ``tile``: (BM, BN, BK, split)."""
    from mlir import ir

    from poot.backends.gpu.strategies import gemm as G
    from poot.dialects import make_context
    from poot.graph.builder import Graph

    with make_context(), ir.Location.unknown():
        g = Graph.from_module(ir.Module.parse(_region_text(fmt, M, N, K)))
    from poot.backends.gpu.strategies import matmul, matmul_match

    # SMALL_N is read by matmul_match.gemv_rows and by matmul.gemv (its own import)
    old = G.FORCE_TILING, G.FORCE_SPLIT, matmul_match.SMALL_N, matmul.SMALL_N
    try:                                  # narrow shapes too (production: the GEMV's)
        G.FORCE_TILING, G.FORCE_SPLIT = tuple(tile[:3]), tile[3]
        matmul_match.SMALL_N = matmul.SMALL_N = 0
        art = _region_artifact(g, caps)
    finally:
        G.FORCE_TILING, G.FORCE_SPLIT, matmul_match.SMALL_N, matmul.SMALL_N = old
    art.save(str(folder))
    return {"fmt": fmt, "M": M, "N": N, "K": K, "tile_bm_bn_bk_split": list(tile),
            "strategies": art.meta["strategies"],
            "launch": [(L["grid"], L["block"]) for L in art.plan["launches"]
                       if L["op"] == "kernel"]}


def _region_text(fmt, M, N, K) -> str:
    """``y = x @ w^T`` as the tracer spells it, no epilogue (weights not materialized)."""
    if fmt in ("bf16", "f16"):
        wt = f"tensor<{N}x{K}x{fmt}>"
        body = [f'%wc = "poot.cast"(%a1) : ({wt}) -> tensor<{N}x{K}xf32>',
                f'%wt = "poot.transpose"(%wc) {{perm = array<i64: 1, 0>}} : '
                f'(tensor<{N}x{K}xf32>) -> tensor<{K}x{N}xf32>']
    else:
        wt = f"!poot.packed<#poot.{fmt}, array<i64: {N}, {K}>>"
        body = [f'%wd = "poot.dequantize"(%a1) : ({wt}) -> tensor<{N}x{K}xf32>',
                f'%wt = "poot.transpose"(%wd) {{perm = array<i64: 1, 0>}} : '
                f'(tensor<{N}x{K}xf32>) -> tensor<{K}x{N}xf32>']
    xt, yt, ot = f"tensor<1x{M}x{K}xf32>", f"tensor<{M}x{N}xf32>", f"tensor<1x{M}x{N}xf32>"
    body = [f'%x2 = "poot.reshape"(%a0) : ({xt}) -> tensor<{M}x{K}xf32>'] + body + [
        f'%y = "poot.matmul"(%x2, %wt) {{acc = f32}} : (tensor<{M}x{K}xf32>, '
        f'tensor<{K}x{N}xf32>) -> {yt}',
        f'%y3 = "poot.reshape"(%y) : ({yt}) -> {ot}']
    return (f'func.func @region(%b0: {xt} {{poot.name = "a0"}}, %b1: {wt} {{poot.name = "a1"}})'
            f' -> ({ot} {{poot.name = "r0"}}) {{\n'
            f"  %r = func.call @mm(%b0, %b1) : ({xt}, {wt}) -> {ot}\n  return %r : {ot}\n}}\n"
            f"func.func private @mm(%a0: {xt}, %a1: {wt}) -> {ot} attributes "
            f'{{poot.dispatch = {{kind = "matmul", ops = {len(body)} : i64}}}} {{\n  '
            + "\n  ".join(body) + f"\n  return %y3 : {ot}\n}}\n")


def build_prefill(folder: Path) -> dict:
    from poot.backends.cuda.codegen import cuda_target
    from poot.backends.cuda.fixtures import write_check_bundle
    from poot.compiler.compile import compile as compile_step
    from poot.models import StepSpec, contiguous_inputs, load_model

    fx = ROOT / "test" / "fixtures" / "tiny" / "llama_gguf_q4_1"
    model, weights = load_model(str(fx))
    g = model.trace(StepSpec.prefill(PREFILL_TOKENS, kv_capacity=64, kv_slots=1),
                    weights.types)
    prog = compile_step(g, cuda_target())
    rng = np.random.default_rng(0)
    step = contiguous_inputs(64, rng.integers(3, 250, (1, PREFILL_TOKENS)),
                             np.arange(PREFILL_TOKENS)[None], [0])
    write_check_bundle(str(folder), prog, prog.executable, weights.arrays, [step])
    return {"fixture": "llama_gguf_q4_1", "tokens": PREFILL_TOKENS,
            "strategies": prog.executable.meta.get("strategies")}


def build(out: str, formats: set[str] | None = None) -> dict:
    """Compile the cases and timing kernels into ``out`` (module doc); ``formats``: only the
    correctness and timing cases of these weight formats (``"siblings"`` for the fused
    sibling cases), e.g. to stay under a carry limit. Returns the manifest."""
    from poot.backends.cuda.codegen import cuda_target

    def kept(fmt: str) -> bool:
        return formats is None or fmt in formats

    caps = cuda_target().caps
    d = Path(out)
    if d.exists():
        shutil.rmtree(d)
    man: dict = {"format": "poot-gemm-check-1", "cases": {}, "timing": {}}
    t0 = time.perf_counter()
    for i, (fmt, M, N, K, epi) in enumerate(CASES):
        name = f"{fmt}_{M}x{N}x{K}_{epi}"
        if not kept(fmt):
            continue
        man["cases"][name] = build_case(d / "cases" / name, fmt, M, N, K, epi, caps, seed=i)
        if set(man["cases"][name]["strategies"]) != {"gemm"}:
            raise SystemExit(f"{name}: the plan did not take the GEMM: "
                             f"{man['cases'][name]['strategies']}")
        print(f"case {name}: built", flush=True)
    for i, (M, K, Ns) in enumerate(SIBLINGS if kept("siblings") else []):
        name = f"siblings_{M}x{K}_" + "_".join(map(str, Ns))
        man["cases"][name] = build_sibling_case(d / "cases" / name, M, K, Ns, caps, seed=i)
        print(f"case {name}: built", flush=True)
    for fmt, M, N, K in (t for t in TIMING if kept(t[0])):
        for i, tile in enumerate(tiles(fmt, M, N, K, caps)):
            name = f"{fmt}_{M}x{N}x{K}_" + "x".join(map(str, tile))
            man["timing"][name] = build_timing(d / "timing" / name, fmt, M, N, K, caps, tile)
            man["timing"][name]["strategy_own_tile"] = i == 0
            print(f"timing {name}: built", flush=True)
    man["prefill"] = build_prefill(d / "prefill")
    man["build_s"] = round(time.perf_counter() - t0, 1)
    with open(d / "manifest.json", "w") as f:
        json.dump(man, f, indent=1)
    size = sum(p.stat().st_size for p in d.rglob("*") if p.is_file())
    print(json.dumps({"built": str(d), "bytes": size, "cases": len(man["cases"]),
                      "timing": len(man["timing"]), "build_s": man["build_s"]}))
    return man


# ---- check (on the GPU machine: numpy + cuda.bindings, no MLIR) ---------------------------

def _rt():
    from poot.backends.cuda import runtime as rt
    from poot.backends.cuda.artifact import CudaArtifact

    return rt, CudaArtifact


def check_case(dev, folder: Path) -> dict:
    rt, CudaArtifact = _rt()
    art = CudaArtifact.load(str(folder))
    inputs = dict(np.load(folder / "inputs.npz"))
    exp = np.load(folder / "expected.npz")
    # one result "r0" (want, bound) or several (want_r<i>, bound_r<i>: sibling cases)
    names = ["r0"] if "want" in exp else [k[5:] for k in exp.files if k.startswith("want_")]
    runner = rt.StepRunner(dev, art, {})
    out = runner.step(inputs, read=names)
    rep: dict = {"ok": True, "max_abs_err": 0.0, "max_err_over_max_want": 0.0,
                 "max_err_over_bound": 0.0}
    for n in names:
        want, bound = (exp["want"], exp["bound"]) if "want" in exp else \
            (exp[f"want_{n}"], exp[f"bound_{n}"])
        got = out[n].reshape(want.shape).astype(np.float64)
        err = np.abs(got - want)
        rep["ok"] = rep["ok"] and bool(np.isfinite(got).all()) and bool((err <= bound).all())
        rep["max_abs_err"] = max(rep["max_abs_err"], float(err.max()))
        rep["max_err_over_max_want"] = max(rep["max_err_over_max_want"], float(
            err.max() / max(np.abs(want).max(), 1e-30)))
        rep["max_err_over_bound"] = max(rep["max_err_over_bound"], float((err / bound).max()))
    rep["strategies"] = art.meta.get("strategies")
    return rep


def _random_inputs(plan: dict, fmt: str, seed: int = 0) -> dict:
    """Random x (f32 normal), weights (bf16/f16 words of N(0, 0.02); packed: random bytes
    with f16 scales in [0.002, 0.02])."""
    rng = np.random.default_rng(seed)
    out = {}
    for x in plan["inputs"]:
        shape, dt = tuple(x["shape"]), np.dtype(x["dtype"])
        if x["name"] == "a0":
            out["a0"] = rng.standard_normal(shape, dtype=np.float32)
        elif fmt == "bf16":
            f = (rng.standard_normal(shape, dtype=np.float32) * 0.02)
            out[x["name"]] = (f.view(np.uint32) >> 16).astype(np.uint16)
        elif fmt == "f16":
            out[x["name"]] = (rng.standard_normal(shape, dtype=np.float32) * 0.02) \
                .astype(np.float16).view(np.uint16)
        else:
            raw = rng.integers(0, 256, shape, dtype=np.uint8)
            bb = {"q4_0": 18, "q4_1": 20, "q8_0": 34}[fmt]
            blocks = raw.reshape(-1, bb)
            s = rng.uniform(0.002, 0.02, len(blocks)).astype(np.float16)
            blocks[:, 0:2] = s.view(np.uint8).reshape(-1, 2)
            out[x["name"]] = blocks.reshape(shape)
        assert out[x["name"]].dtype == dt, (x["name"], out[x["name"]].dtype, dt)
    return out


def _time_graph(dev, runner, reps: int, rounds: int) -> float:
    """Seconds per kernel launch: ``reps`` launches of the step captured in one CUDA graph,
    replayed ``rounds`` times between CUDA events, min over 3 tries."""
    rt, _ = _rt()
    cu = rt.driver()
    ptrs, _ = dev._pointers(runner.kernel, runner.bindings)
    keep: list = []
    rt._check(cu.cuStreamBeginCapture(
        dev.stream, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
        "cuStreamBeginCapture")
    try:
        for _ in range(reps):
            dev._enqueue(runner.kernel, ptrs, [], keep)
    finally:
        graph = rt._check(cu.cuStreamEndCapture(dev.stream), "cuStreamEndCapture")
    gexec = rt._check(cu.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
    ev0 = rt._check(cu.cuEventCreate(0), "cuEventCreate")
    ev1 = rt._check(cu.cuEventCreate(0), "cuEventCreate")
    rt._check(cu.cuGraphLaunch(gexec, dev.stream), "cuGraphLaunch")      # warm-up
    dev.synchronize()
    best = float("inf")
    for _ in range(3):
        rt._check(cu.cuEventRecord(ev0, dev.stream), "cuEventRecord")
        for _ in range(rounds):
            rt._check(cu.cuGraphLaunch(gexec, dev.stream), "cuGraphLaunch")
        rt._check(cu.cuEventRecord(ev1, dev.stream), "cuEventRecord")
        rt._check(cu.cuEventSynchronize(ev1), "cuEventSynchronize")
        ms = float(rt._check(cu.cuEventElapsedTime(ev0, ev1), "cuEventElapsedTime"))
        best = min(best, ms / 1e3 / (reps * rounds))
    return best


def _torch_time(M, N, K, reps: int, rounds: int) -> float | None:
    try:
        import torch
    except Exception:  # noqa: BLE001
        return None
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.02
    for _ in range(3):
        y = x @ w.T
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            y = x @ w.T
    del y
    g.replay()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(3):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(rounds):
            g.replay()
        e1.record()
        torch.cuda.synchronize()
        best = min(best, e0.elapsed_time(e1) / 1e3 / (reps * rounds))
    return best


_INPUTS: dict = {}


def check_timing(dev, folder: Path, spec: dict, reps=20, rounds=10) -> dict:
    rt, CudaArtifact = _rt()
    art = CudaArtifact.load(str(folder))
    runner = rt.StepRunner(dev, art, {})
    key = (spec["fmt"], spec["M"], spec["N"], spec["K"])
    if key not in _INPUTS:
        _INPUTS.clear()
        _INPUTS[key] = _random_inputs(art.plan, spec["fmt"])
    runner.step(_INPUTS[key], read=["r0"])
    got = runner.step(None, read=["r0"])["r0"]
    s = _time_graph(dev, runner, reps, rounds)
    flops = 2.0 * spec["M"] * spec["N"] * spec["K"]
    wbytes = spec["N"] * spec["K"] * {"bf16": 2, "f16": 2, "q4_0": 18 / 32}.get(spec["fmt"], 0)
    out = {"us": round(s * 1e6, 2), "tflops": round(flops / s / 1e12, 2),
           "GBps": round(wbytes / s / 1e9, 1),       # the weight's bytes over the time
           "finite": bool(np.isfinite(got).all()),
           "tile_bm_bn_bk_split": spec.get("tile_bm_bn_bk_split"),
           "strategy_own_tile": spec.get("strategy_own_tile"), "launch": spec.get("launch")}
    return out


def check_prefill(folder: Path) -> dict:
    from poot.backends.cuda import devcheck

    old = dict(devcheck.TOL)
    devcheck.TOL["float32"] = PREFILL_TOL
    try:
        r = devcheck.run_check(str(folder))
    finally:
        devcheck.TOL.clear()
        devcheck.TOL.update(old)
    return {"ok": r["ok"], "tolerance": PREFILL_TOL, "failures": r["failures"][:20],
            "missing": r["missing"][:20], "steps": r.get("steps"),
            "max_abs_diff_by_kind": r.get("max_abs_diff_by_kind"),
            "strategies": r.get("meta", {}).get("strategies")}


def check(folder: str, only_correctness: bool = False) -> dict:
    rt, _ = _rt()
    d = Path(folder)
    with open(d / "manifest.json") as f:
        man = json.load(f)
    ok, why = rt.device_available()
    if not ok:
        return {"ok": False, "error": why}
    dev = rt.CudaDevice()
    rep: dict = {"device": dev.device_name, "cases": {}, "timing": {}}
    for name in man["cases"]:
        try:
            rep["cases"][name] = check_case(dev, d / "cases" / name)
        except Exception as e:  # noqa: BLE001
            rep["cases"][name] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        print(name, json.dumps(rep["cases"][name]), flush=True)
    try:
        rep["prefill"] = check_prefill(d / "prefill")
    except Exception as e:  # noqa: BLE001
        rep["prefill"] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    print("prefill", json.dumps({k: v for k, v in rep["prefill"].items() if k != "steps"},
                                default=str), flush=True)
    rep["ok"] = all(c.get("ok") for c in rep["cases"].values()) and \
        bool(rep["prefill"].get("ok"))
    if only_correctness:
        return rep
    torch_t: dict = {}
    for name, spec in man["timing"].items():
        try:
            r = check_timing(dev, d / "timing" / name, spec)
            key = (spec["M"], spec["N"], spec["K"])
            if key not in torch_t:
                torch_t[key] = _torch_time(*key, reps=20, rounds=10)
            tt = torch_t[key]
            if tt:
                r["torch_bf16_us"] = round(tt * 1e6, 2)
                r["torch_bf16_tflops"] = round(2.0 * np.prod(key) / tt / 1e12, 2)
                r["speed_vs_torch"] = round(tt * 1e6 / r["us"], 3)
            rep["timing"][name] = r
        except Exception as e:  # noqa: BLE001
            rep["timing"][name] = {"error": f"{type(e).__name__}: {e}"}
        print(name, json.dumps(rep["timing"][name]), flush=True)
    rep["summary"] = summarize(man, rep)
    print(json.dumps({"summary": rep["summary"]}, indent=1), flush=True)
    return rep


def summarize(man: dict, rep: dict) -> dict:
    """Per timed shape: the strategy's own tile and the fastest tile (us, TFLOP/s, vs torch)."""
    out: dict = {}
    for name, spec in man["timing"].items():
        r = rep["timing"].get(name, {})
        if "us" not in r:
            continue
        key = f"{spec['fmt']} M={spec['M']} N={spec['N']} K={spec['K']}"
        e = out.setdefault(key, {"torch_bf16_us": r.get("torch_bf16_us"),
                                 "torch_bf16_tflops": r.get("torch_bf16_tflops")})
        brief = {"tile_bm_bn_bk_split": spec["tile_bm_bn_bk_split"], "us": r["us"],
                 "tflops": r["tflops"], "GBps": r.get("GBps"),
                 "speed_vs_torch": r.get("speed_vs_torch")}
        if spec.get("strategy_own_tile"):
            e["own"] = brief
        if "best" not in e or r["us"] < e["best"]["us"]:
            e["best"] = brief
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--build", metavar="DIR", help="compile here (needs MLIR)")
    g.add_argument("--check", metavar="DIR", help="run on a CUDA device (no MLIR)")
    ap.add_argument("--json", help="write the check's report here")
    ap.add_argument("--no-timing", action="store_true", help="correctness only")
    ap.add_argument("--formats", help="with --build: only these weight formats' cases, "
                    "comma-separated (bf16,f16,q4_0,...,siblings)")
    a = ap.parse_args(argv)
    if a.build:
        build(a.build, set(a.formats.split(",")) if a.formats else None)
        return 0
    rep = check(a.check, a.no_timing)
    text = json.dumps(rep, indent=1, default=str)
    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        with open(a.json, "w") as f:
            f.write(text)
    print(json.dumps({"ok": rep.get("ok"), "device": rep.get("device"),
                      "error": rep.get("error")}))
    return 0 if rep.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
