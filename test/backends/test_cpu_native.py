"""The CPU backend's ahead-of-time code generation (``compile_native``: LLVM's opt and llc in
parallel processes, ``ld -shared``, ``ctypes``) against the oracle and against itself.

What can go wrong there and is checked: a program's calls binding to a function of the same
name loaded before (every graph's entry is ``step``), a later shared object answered with an
earlier one's code (glibc's ``dlopen`` matches a reused inode), the functions split across
processes differently from one process, and the packed C-interface wrapper the runtime calls.
"""

from __future__ import annotations

import numpy as np
import pytest

from poot import oracle
from poot.backends.cpu import codegen as cpu
from poot.compiler import CompileOptions, compile, host_cpu
from poot.dialects.types import DType, TensorType
from poot.graph.builder import Builder, TraceLimits

pytestmark = pytest.mark.skipif(cpu.native_tools() is None,
                                reason="LLVM's opt/llc or the system linker ld not found: "
                                       "the CPU backend uses the in-process JIT")

LIMITS = TraceLimits(max_values=10_000, max_ops=10_000, max_literal_bytes=1 << 20,
                     max_owned_bytes=1 << 28)


def _graph(fn: str, n: int = 64):
    """y = rmsnorm-like row op then ``fn`` of x and the row sum: a step of a few kernels."""
    b = Builder(LIMITS)
    x = b.input("x", TensorType((2, n), DType.F32))
    s = b.reduce("sum", b.binary("mul", x, x), 1, keepdims=True)
    y = b.binary(fn, x, b.broadcast_to(s, (2, n)))
    return b.finish({"y": b.unary("exp", b.binary("mul", y, b.constant(
        np.full((2, n), 0.01, np.float32))))})


def _run(g, x):
    return compile(g, host_cpu(), CompileOptions()).run({"x": x})["y"]


def test_programs_of_one_entry_name_each_run_their_own_code():
    """Three steps named alike, compiled and dropped one after another (their objects
    unloaded, files deleted, inodes free for reuse): each runs its own code."""
    x = np.random.default_rng(0).normal(size=(2, 64)).astype(np.float32)
    for fn in ("add", "sub", "mul", "add"):
        g = _graph(fn)
        want = oracle.evaluate(g, {"x": x})["y"]
        np.testing.assert_allclose(_run(g, x), want, rtol=1e-5, atol=1e-6, err_msg=fn)


def test_split_across_processes_equals_one_process(monkeypatch):
    """The same step compiled as one group and as several groups gives the same bits."""
    x = np.random.default_rng(1).normal(size=(2, 64)).astype(np.float32)
    outs = []
    for jobs in ("1", "3"):
        monkeypatch.setenv("POOT_CPU_CODEGEN_JOBS", jobs)
        outs.append(_run(_graph("sub"), x))
    np.testing.assert_array_equal(outs[0], outs[1])


def test_functions_are_partitioned_by_cost():
    from mlir import ir

    text = """
    llvm.func @big(%a: i64) -> i64 {
      %0 = llvm.add %a, %a : i64
      %1 = llvm.add %0, %0 : i64
      %2 = llvm.add %1, %1 : i64
      %3 = llvm.add %2, %2 : i64
      llvm.return %3 : i64
    }
    llvm.func @small1(%a: i64) -> i64 {
      %0 = llvm.add %a, %a : i64
      llvm.return %0 : i64
    }
    llvm.func @small2(%a: i64) -> i64 {
      %0 = llvm.add %a, %a : i64
      llvm.return %0 : i64
    }
    llvm.func @decl(i64) -> i64
    """
    with ir.Context():
        m = ir.Module.parse(text)
        groups = cpu.partition_functions(m, 2)
        assert sorted(map(sorted, groups)) == [["big"], ["small1", "small2"]]
        assert sorted(cpu.partition_functions(m, 8)) == [["big"], ["small1"], ["small2"]]
        assert [sorted(g) for g in cpu.partition_functions(m, 1)] == [["big", "small1", "small2"]]


def test_packed_wrapper_calls_the_c_interface():
    ir_text = ("define void @_mlir_ciface_f(ptr %0, i1 %1, float %2) {\n  ret void\n}\n"
               "define i64 @_mlir_ciface_g(ptr noundef %0) {\n  ret i64 0\n}\n")
    w = cpu.packed_wrapper(ir_text, "f")
    assert "define void @_mlir__mlir_ciface_f(ptr %args)" in w
    assert "call void @_mlir_ciface_f(ptr %v0, i1 %v1, float %v2)" in w
    g = cpu.packed_wrapper(ir_text, "g")
    assert "%r = call i64 @_mlir_ciface_g(ptr %v0)" in g and "store i64 %r" in g
    assert cpu.packed_wrapper(ir_text, "h") == ""
