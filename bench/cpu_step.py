"""CPU backend benchmark: the SmolLM2-135M (GGUF Q4_1, tied Q8_0 embedding) decode step,
compiled for the host, run alone in a loop with fixed inputs. Prints one JSON object.

    python bench/cpu_step.py [--steps 50] [--threads N] [--no-micro] [--batch B | --prefill T]
                             [--kv-capacity N] [--position P] [--precision int16|int8|exact]

Reports: compile time, dispatches per step, ms/token and tok/s of the compiled step (raw
call with prebuilt arguments, and through ``CpuProgram.run``), single-GEMV kernels (GB/s of
weight bytes streamed) next to numpy on the same GEMVs (dequantized f32 ``W @ x``), and the
numpy time of all the step's GEMVs together. ``--batch B``: a decode step of B rows (paged
KV cache, one sequence a row; tok/s = B / step), with the per-dispatch-kind estimate.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import time

import numpy as np


def _timeit(fn, steps: int, warm: int = 3) -> float:
    for _ in range(warm):
        fn()
    best = []
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(steps):
            fn()
        best.append((time.perf_counter() - t0) / steps)
    return min(best)


def prepared_call(prog, inputs, params):
    """A zero-argument callable running ``prog`` on fixed arrays (descriptors built once);
    ``params`` as the file holds them (repacked as ``prog`` stores them)."""
    from poot.backends.cpu.codegen import _bind, _descriptor

    params = prog.stored_params(params)
    keep = [_bind(n, inputs[n], t) for n, t in prog.inputs]
    keep += [_bind(n, params[n], t) for n, t in prog.params]
    outs = [np.empty(t.shape, dtype=t.dtype.numpy) for _, t in prog.outputs]
    keep += outs
    descs = [_descriptor(a) for a in keep]
    ptrs = [ctypes.pointer(d) for d in descs]
    packed = (ctypes.c_void_p * len(ptrs))(
        *[ctypes.cast(ctypes.pointer(p), ctypes.c_void_p) for p in ptrs])
    fn = prog._fn

    def call():
        fn(packed)

    call._keep = (keep, descs, ptrs, packed, prog)  # keep the memory alive
    return call


def _spec(prefill: int, batch: int, kv_capacity: int | None = None):
    """The step timed: prefill of ``prefill`` tokens, else decode of ``batch`` rows (1: the
    single-sequence decode step, as before ``--batch``). ``kv_capacity``: positions per
    sequence (default 256, 512 for ``batch`` > 1; the pool holds ``batch`` sequences)."""
    from poot.models import StepSpec

    if prefill:
        return StepSpec.prefill(prefill, kv_capacity=kv_capacity or 256)
    if batch > 1:
        return StepSpec.decode(batch=batch, kv_capacity=kv_capacity or 512, block_size=32,
                               kv_slots=batch)
    return StepSpec.decode(kv_capacity=kv_capacity or 256)


def _step_inputs(prog, prefill: int, position: int = 17) -> dict:
    """Fixed inputs: token 42 everywhere, positions 0.. (prefill) or ``position`` (decode),
    each sequence its own cache blocks, no cache writes (slot -1) for batched decode. The KV
    pools hold random values (seeded; int8 q8_0 values, f16 scales and values ~N(0, 1)): a
    zero pool is untouched pages that all map the kernel's one zero page, which a step
    reads from cache however long the context (batch 32 at position 96: 27 ms a step on
    zeros where the engine's steps took 34)."""
    rng = np.random.default_rng(0)
    inputs = {}
    for n, t in prog.inputs:
        a = np.zeros(t.shape, t.dtype.numpy)
        if n.startswith("kv."):
            if a.dtype == np.int8:
                a[...] = rng.integers(-127, 128, a.shape, dtype=np.int8)
            elif a.dtype.kind == "f":
                a[...] = rng.standard_normal(a.shape).astype(a.dtype) * (
                    0.01 if n.endswith("_scale") else 1.0)
        inputs[n] = a
    inputs["tokens"][...] = 42
    inputs["positions"][...] = np.arange(inputs["positions"].shape[-1]) + (
        0 if prefill else position)
    if "block_table" in inputs:
        bt = inputs["block_table"]
        bt[...] = np.arange(bt.size).reshape(bt.shape) % bt.size
    if "slot_mapping" in inputs:
        inputs["slot_mapping"][...] = -1
    return inputs


def step_bench(path, steps: int, threads: int | None, prefill: int = 0, batch: int = 1,
               kv_capacity: int | None = None, precision: str = "int16", position: int = 17):
    from poot.backends.cpu.codegen import cpu_threads, strategy_for
    from poot.compiler import CompileOptions, compile
    from poot.compiler.target import host_cpu
    from poot.models import load_model

    t0 = time.perf_counter()
    model, weights = load_model(path)
    g = model.trace(_spec(prefill, batch, kv_capacity), weights.types)
    trace_s = time.perf_counter() - t0
    if threads is not None:
        os.environ["POOT_CPU_THREADS"] = str(threads)
    t0 = time.perf_counter()
    options = CompileOptions(precision=precision)
    program = compile(g, host_cpu(), options)
    compile_s = time.perf_counter() - t0
    prog = program.executable
    params = {n: np.asarray(weights[n]) for n, _ in prog.params}
    inputs = _step_inputs(prog, prefill, position)
    raw = prepared_call(prog, inputs, params)
    step_s = _timeit(raw, steps)
    run_s = _timeit(lambda: prog.run(inputs, params), max(3, steps // 5), warm=1)
    logits = prog.run(inputs, params)["logits"]
    return {
        "model": os.path.basename(str(path)),
        "step": f"prefill {prefill}" if prefill else f"decode batch {batch}",
        "threads": cpu_threads(),
        "kv_capacity": _spec(prefill, batch, kv_capacity).kv_capacity,
        "position": None if prefill else position,
        "dot_bits": strategy_for(precision=options.precision).dot_bits,
        "trace_s": round(trace_s, 3),
        "compile_s": round(compile_s, 3),
        "codegen_s": round(program.pass_seconds.get("codegen", 0.0), 3),
        "dispatches": program.dispatches,
        "dispatch_count": program.dispatch_count,
        "step_ms": round(step_s * 1e3, 3),
        "tok_s": round((prefill or batch) / step_s, 2),
        "run_ms": round(run_s * 1e3, 3),
        "logits_finite": bool(np.isfinite(logits).all()),
        "_call": raw,
        "_lowered": prog.lowered,
    }, g, weights


def _gemvs(g, weights):
    """(name, packed/dense type) of every weight used as a matmul rhs in the step."""
    from poot.dialects.types import PackedType

    out = {}
    for name, t in g.params.items():
        if len(t.shape) == 2 and (isinstance(t, PackedType) or t.shape[1] >= 256):
            out[name] = t
    return out


def micro(g, weights, steps: int):
    """Single GEMV kernels compiled alone (x[1, K] @ W^T) vs numpy on the dequantized W."""
    from poot.backends.cpu.codegen import compile_cpu
    from poot.dialects.quant_ref import dequantize
    from poot.dialects.types import DType, PackedType, TensorType
    from poot.graph.builder import Builder, TraceLimits

    gemvs = _gemvs(g, weights)
    shapes = {}
    for name, t in gemvs.items():
        key = (t.format.name if isinstance(t, PackedType) else t.dtype.value, tuple(t.shape))
        shapes.setdefault(key, name)
    rows = []
    for (fmt, shape), name in sorted(shapes.items(), key=lambda kv: -np.prod(kv[0][1])):
        t = gemvs[name]
        n, k = t.shape
        b = Builder(TraceLimits(max_values=1000, max_ops=1000, max_literal_bytes=1 << 20,
                                max_owned_bytes=1 << 30))
        x = b.input("x", TensorType((1, k), DType.F32))
        if isinstance(t, PackedType):
            w = b.dequantize(b.param("w", t), DType.F32)
        else:
            w = b.param("w", t)
        y = b.matmul(x, b.transpose(w, (1, 0)), DType.F32)
        gg = b.finish({"y": y})
        prog = compile_cpu(gg)
        raw = np.asarray(weights[name])
        xv = np.random.default_rng(0).standard_normal((1, k)).astype(np.float32)
        call = prepared_call(prog, {"x": xv}, {"w": raw})
        sec = _timeit(call, steps)
        wd = dequantize(t.format, raw, t.shape).astype(np.float32) if isinstance(t, PackedType) \
            else raw.astype(np.float32)
        xv1 = xv[0]
        time.sleep(0.3)  # let OpenMP workers stop spinning (KMP_BLOCKTIME) before numpy runs
        nsec = _timeit(lambda: wd @ xv1, max(3, steps // 2))
        nbytes = raw.nbytes
        rows.append({"weight": name, "format": fmt, "shape": [n, k], "bytes": int(nbytes),
                     "us": round(sec * 1e6, 1), "GB_s": round(nbytes / sec / 1e9, 2),
                     "numpy_f32_us": round(nsec * 1e6, 1),
                     "numpy_f32_GB_s": round(wd.nbytes / nsec / 1e9, 2)})
    return rows


def numpy_all(g, weights):
    """numpy time of every GEMV of one decode step on dequantized f32 weights."""
    from poot.dialects.quant_ref import dequantize
    from poot.dialects.types import PackedType

    mats = []
    for name, t in _gemvs(g, weights).items():
        raw = np.asarray(weights[name])
        w = dequantize(t.format, raw, t.shape).astype(np.float32) if isinstance(t, PackedType) \
            else raw.astype(np.float32)
        mats.append(w)
    # the tied embedding is both the gather table and lm_head: counted once as a GEMV
    xs = {m.shape[1]: np.random.default_rng(1).standard_normal(m.shape[1]).astype(np.float32)
          for m in mats}
    time.sleep(0.3)
    sec = _timeit(lambda: [m @ xs[m.shape[1]] for m in mats], 3, warm=1)
    return {"gemvs": len(mats), "ms": round(sec * 1e3, 3), "tok_s": round(1 / sec, 2),
            "f32_bytes": int(sum(m.nbytes for m in mats))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--no-micro", action="store_true")
    ap.add_argument("--int8", action="store_true",
                    help="int8 dot products for packed weights (POOT_CPU_INT8=1)")
    ap.add_argument("--precision", default="int16", choices=("int16", "int8", "exact"),
                    help="CompileOptions.precision of the step (as poot's --precision)")
    ap.add_argument("--kv-capacity", type=int, default=None,
                    help="KV positions per sequence (default 256; 512 with --batch)")
    ap.add_argument("--prefill", type=int, default=0,
                    help="time a prefill step of this many tokens instead of decode")
    ap.add_argument("--batch", type=int, default=1,
                    help="time a decode step of this many rows (one sequence each)")
    ap.add_argument("--position", type=int, default=17,
                    help="decode: every row's position (keys attended: position + 1)")
    ap.add_argument("--model", default=None, help="GGUF path (default: the bundled SmolLM2)")
    a = ap.parse_args(argv)
    if a.batch < 1 or a.prefill < 0 or (a.batch > 1 and a.prefill):
        ap.error("--batch must be >= 1, --prefill >= 0, and not both")
    if a.kv_capacity is not None and a.kv_capacity < 1:
        ap.error("--kv-capacity must be >= 1")
    cap = a.kv_capacity or (512 if a.batch > 1 else 256)
    if not 0 <= a.position < cap:
        ap.error(f"--position must be in 0..{cap - 1} (the KV capacity)")
    from poot.load.bundled import smollm2_gguf

    path = a.model or smollm2_gguf()
    if a.int8:
        os.environ["POOT_CPU_INT8"] = "1"
    report, g, weights = step_bench(path, a.steps, a.threads, a.prefill, a.batch,
                                    a.kv_capacity, a.precision, a.position)
    call = report.pop("_call")
    print(json.dumps(report), file=sys.stderr, flush=True)
    if not a.no_micro and not a.prefill:
        report["per_kind_ms_estimate"] = per_kind(report.pop("_lowered"), a.steps)
        if a.batch == 1:
            report["gemv_kernels"] = micro(g, weights, a.steps)
            report["numpy_step_gemvs"] = numpy_all(g, weights)
    else:
        report.pop("_lowered")
    del call
    json.dump(report, sys.stdout, indent=1)
    print()
    return 0



_NP = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16, "i8": np.int8, "i32": np.int32,
       "i64": np.int64, "i1": np.int8}


def _np_of(t) -> np.ndarray:
    from mlir import ir

    rt = ir.RankedTensorType(t)
    return np.zeros(rt.shape, _NP[str(rt.element_type)])


def _in_place(ft) -> dict[int, int]:
    """Result index -> argument index of a dispatch function type's results that may update
    an argument in place: the one argument of the result's type (a KV pool a scatter
    writes). Inside the step, bufferization writes such a result into the argument's buffer
    (``drop-equivalent-buffer-results``); compiled alone with read-only arguments it would
    copy the whole pool on every call instead."""
    out = {}
    for ri, rt in enumerate(ft.results):
        same = [ai for ai, at in enumerate(ft.inputs) if at == rt]
        if len(same) == 1:
            out[ri] = same[0]
    return out


def _compile_dispatch(m, name: str, ft, threads: int):
    """(engine, in-place results) of the module ``m`` holding dispatch ``name`` (public)
    alone: the results that update an argument written into it as in the step
    (:func:`_in_place`), else (when bufferization cannot keep them in place) every argument
    read-only."""
    from mlir import ir

    from poot.backends.cpu import codegen as cpu

    def entry(module):
        return next(op.operation for op in module.body.operations
                    if op.operation.name == "func.func"
                    and ir.StringAttr(op.operation.attributes["sym_name"]).value == name)

    want = _in_place(ft)
    if want:
        trial = ir.Module.parse(str(m))
        cpu._prepare_abi(entry(trial), frozenset(want.values()))
        try:
            return cpu.compile_lowered(trial, threads=threads, entry=name, in_place=want,
                                       in_place_names={r: f"result {r}" for r in want}), want
        except cpu.CpuRunError:
            pass
    cpu._prepare_abi(entry(m))
    return cpu.compile_lowered(m, threads=threads), {}


def compiled_dispatches(lowered: str):
    """Each distinct dispatch function of the lowered step compiled alone: yields (name,
    kind, calls per step, the packed-call function, its argument arrays: zero inputs, then
    the out-parameters). A dispatch updating state in place (the KV scatter) writes into its
    argument as in the step (:func:`_in_place`), not into a copy of the whole pool. Yields
    inside an MLIR context; a compiled function lives until the next one is yielded."""
    import re
    from collections import Counter

    from mlir import ir

    from poot.backends.cpu import codegen as cpu
    from poot.backends.cpu.gemv import INTRINSIC_PREFIX
    from poot.dialects import make_context

    calls = Counter(re.findall(r"call @([\w.$-]+)\(", lowered))
    with make_context(), ir.Location.unknown():
        m0 = ir.Module.parse(lowered)
        for f in list(m0.body.operations):
            f = f.operation
            if "poot.dispatch" not in f.attributes:
                continue
            name = ir.StringAttr(f.attributes["sym_name"]).value
            kind = re.search(r'kind = "(\w+)"', str(f.attributes["poot.dispatch"])).group(1)
            ft = ir.FunctionType(ir.TypeAttr(f.attributes["function_type"]).value)
            m = ir.Module.create()
            for d in m0.body.operations:  # the intrinsic stand-ins the kernels call
                if ir.StringAttr(d.operation.attributes["sym_name"]).value.startswith(
                        INTRINSIC_PREFIX):
                    d.operation.clone(ip=ir.InsertionPoint(m.body))
            g = f.clone(ip=ir.InsertionPoint(m.body))
            del g.attributes["sym_visibility"]
            engine, dropped = _compile_dispatch(m, name, ft, cpu.cpu_threads())
            arrays = [_np_of(t) for t in ft.inputs] + \
                [_np_of(t) for i, t in enumerate(ft.results) if i not in dropped]
            yield name, kind, calls[name], engine.lookup(name), arrays
            del engine


def per_kind(lowered: str, steps: int = 20) -> dict:
    """Each distinct dispatch function of the lowered step compiled alone
    (:func:`compiled_dispatches`) and timed on zero inputs, times the number of calls the
    step makes: an estimate of ms per step by kind."""
    from poot.backends.cpu import codegen as cpu

    out: dict[str, float] = {}
    for name, kind, calls, fn, arrays in compiled_dispatches(lowered):
        descs = [cpu._descriptor(a) for a in arrays]
        ptrs = [ctypes.pointer(d) for d in descs]
        packed = (ctypes.c_void_p * len(ptrs))(
            *[ctypes.cast(ctypes.pointer(p), ctypes.c_void_p) for p in ptrs])
        sec = _timeit(lambda: fn(packed), steps)
        out[kind] = out.get(kind, 0.0) + sec * calls * 1e3
    return {k: round(v, 3) for k, v in sorted(out.items(), key=lambda kv: -kv[1])}


if __name__ == "__main__":
    sys.exit(main())
