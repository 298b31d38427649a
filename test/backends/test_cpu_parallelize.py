"""The CPU backend spreads a dispatch's large elementwise and row-wise work over the kernel
threads (:func:`poot.backends.cpu.parallelize.parallelize_row_loops`): those ops are tiled
into ``scf.forall`` chunks of their outermost parallel loop, small ones and ones reducing
outermost stay sequential, and the compiled step computes the same bits with one thread or
two (where a point is computed moves, not how)."""

from __future__ import annotations

import numpy as np
import pytest
from mlir import ir
from mlir.passmanager import PassManager

from poot.backends.cpu import codegen as cpu
from poot.backends.cpu.parallelize import MIN_ELEMENTS, PARALLEL_TILES, parallelize_row_loops
from poot.backends.pass_pipelines import FUSE
from poot.compiler import CompileOptions, compile, host_cpu
from poot.dialects import make_context
from poot.dialects.types import DType, TensorType
from poot.graph.builder import Builder, TraceLimits

LIMITS = TraceLimits(max_values=10_000, max_ops=10_000, max_literal_bytes=1 << 20,
                     max_owned_bytes=1 << 28)


def _gated(rows: int, width: int = 1536):
    """``silu(g) * u + r`` and a row sum of squares (RMSNorm's): the epilogue and norm of a
    decode step's MLP, [rows, width] f32."""
    b = Builder(LIMITS)
    g = b.input("g", TensorType((rows, width), DType.F32))
    u = b.input("u", TensorType((rows, width), DType.F32))
    r = b.input("r", TensorType((rows, width), DType.F32))
    one = b.scalar(1.0)
    silu = b.binary("div", g, b.binary("add", one, b.unary("exp", b.unary("neg", g))))
    y = b.binary("add", b.binary("mul", silu, u), r)
    return b.finish({"y": y, "ss": b.reduce("sum", b.binary("mul", y, y), 1)})


def _dispatch_module(graph) -> ir.Module:
    """The step's lowered module (dispatch functions outlined by the compiler), fused."""
    lowered = compile(graph, host_cpu(), CompileOptions()).executable.lowered
    ctx = make_context()
    with ctx, ir.Location.unknown():
        module = ir.Module.parse(lowered)
        PassManager.parse(f"builtin.module({FUSE})").run(module.operation)
    return module


def test_large_elementwise_work_is_tiled_over_the_threads():
    module = _dispatch_module(_gated(32))
    with module.context:
        tiled = parallelize_row_loops(module, 2)
        module.operation.verify()
    assert tiled >= 1
    text = str(module)
    assert "scf.forall" in text and PARALLEL_TILES not in text and "transform." not in text


def test_one_thread_and_small_work_stay_sequential():
    module = _dispatch_module(_gated(32))
    with module.context:
        assert parallelize_row_loops(module, 1) == 0
    small = _dispatch_module(_gated(2, 64))
    assert 2 * 64 < MIN_ELEMENTS
    with small.context:
        assert parallelize_row_loops(small, 2) == 0
        assert "scf.forall" not in str(small)


def test_an_outermost_reduction_is_not_tiled():
    """A column sum (rows reduced, the reduction loop outermost) keeps its loop whole: tiling it
    would need partial results."""
    b = Builder(LIMITS)
    x = b.input("x", TensorType((512, 64), DType.F32))
    module = _dispatch_module(b.finish({"s": b.reduce("sum", b.binary("mul", x, x), 0)}))
    assert "iterator_types = [\"reduction\", \"parallel\"]" in str(module)
    with module.context:
        assert parallelize_row_loops(module, 2) == 0
    assert "scf.forall" not in str(module)


@pytest.mark.skipif(cpu.openmp_lib() is None, reason="no OpenMP runtime found: the CPU "
                    "backend runs one thread, so nothing is tiled")
def test_two_threads_compute_the_bits_of_one(monkeypatch):
    """The whole compiled program, once with POOT_CPU_THREADS=1 and once with 2 (tiled): the
    same bits; both within f32 rounding of numpy."""
    rng = np.random.default_rng(3)
    args = {n: rng.standard_normal((32, 1536)).astype(np.float32) for n in "gur"}
    outs = {}
    for threads in ("1", "2"):
        monkeypatch.setenv("POOT_CPU_THREADS", threads)
        prog = compile(_gated(32), host_cpu(), CompileOptions()).executable
        outs[threads] = prog.run(args, {})
    for name in ("y", "ss"):
        np.testing.assert_array_equal(outs["1"][name], outs["2"][name])
    g, u, r = args["g"], args["u"], args["r"]
    y = g / (1 + np.exp(-g)) * u + r
    np.testing.assert_allclose(outs["2"]["y"], y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(outs["2"]["ss"], (y * y).sum(1), rtol=1e-4)
