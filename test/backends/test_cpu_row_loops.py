"""The CPU backend keeps the outer loop of a loop nest rolled (``keep_outer_loops_rolled``):
LLVM would otherwise fully unroll a small row loop (B rows of a [B, V] reduction) and vectorize
each copy of the inner loop, so a batch-8 program (a sampler) compiled to 8x the machine code,
and took 8x the opt/llc time, of the batch-1 one."""

from __future__ import annotations

import numpy as np
import pytest

from mlir import ir
from mlir.passmanager import PassManager

from poot.backends.cpu import codegen as cpu
from poot.dialects.types import DType, TensorType
from poot.graph.builder import Builder, TraceLimits

LIMITS = TraceLimits(max_values=10_000, max_ops=10_000, max_literal_bytes=1 << 20,
                     max_owned_bytes=1 << 28)


def _row_counts(batch: int, vocab: int = 4096):
    """Six threshold counts per row (what a sampler's search passes compute): [B] each."""
    b = Builder(LIMITS)
    x = b.input("x", TensorType((batch, vocab), DType.F32))
    t = b.input("t", TensorType((batch, 1), DType.F32))
    return b.finish({f"c{i}": b.reduce("sum", b.cast(b.compare("ge", x, t * b.scalar(i + 1.0)),
                                                         DType.I32), 1) for i in range(6)})


@pytest.mark.skipif(cpu.native_tools() is None, reason="LLVM's opt/llc or the linker ld not "
                    "found: the CPU backend uses the in-process JIT (no object code to size)")
def test_a_batch_8_reduction_compiles_to_the_code_of_batch_1():
    rng = np.random.default_rng(0)
    sizes = {}
    for batch in (1, 8):
        prog = cpu.compile_cpu(_row_counts(batch))
        x = rng.random((batch, 4096)).astype(np.float32)
        t = rng.random((batch, 1)).astype(np.float32) * 0.2
        out = prog.run({"x": x, "t": t})
        for i in range(6):
            np.testing.assert_array_equal(out[f"c{i}"], (x >= t * (i + 1)).sum(1))
        sizes[batch] = len(prog.engine.so_bytes)
    # unrolled, the batch-8 object was ~3x the batch-1 one here (8 vectorized copies); the
    # reductions split into 16 lanes (poot.backends.cpu.reductions) add a fixed ~0.3x at
    # B > 1 (the final [B, 16] -> [B] combinations, which B = 1 folds into straight code)
    assert sizes[8] <= 1.5 * sizes[1], sizes


def test_only_loops_that_hold_a_loop_are_marked():
    src = """
    func.func @f(%m: memref<8x64xf32>, %o: memref<8xf32>, %v: memref<8xf32>) {
      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      %c8 = arith.constant 8 : index
      %c64 = arith.constant 64 : index
      scf.for %i = %c0 to %c8 step %c1 {
        scf.for %j = %c0 to %c64 step %c1 {
          %a = memref.load %m[%i, %j] : memref<8x64xf32>
          memref.store %a, %o[%i] : memref<8xf32>
        }
      }
      scf.for %i = %c0 to %c8 step %c1 {
        %a = memref.load %o[%i] : memref<8xf32>
        memref.store %a, %v[%i] : memref<8xf32>
      }
      return
    }"""
    with ir.Context():
        m = ir.Module.parse(src)
        assert cpu.keep_outer_loops_rolled(m) == 1
        fn = m.body.operations[0]
        nest, single = [op for op in fn.regions[0].blocks[0].operations
                        if op.operation.name == "scf.for"]
        inner = nest.regions[0].blocks[0].operations[0]
        assert "loop_annotation" in nest.attributes
        assert "loop_annotation" not in inner.attributes
        assert "loop_annotation" not in single.attributes
        PassManager.parse("builtin.module(convert-scf-to-cf)").run(m.operation)
        # the mark ends on the outer loop's back edge only: LLVM's !llvm.loop metadata
        assert str(m).count("{loop_annotation = #") == 1


@pytest.mark.skipif(cpu.native_tools() is None, reason="LLVM's opt/llc or the linker ld not "
                    "found: the CPU backend uses the in-process JIT (no object code to size)")
def test_the_batch_8_full_sampler_is_not_8_batch_1_samplers():
    """The serving engine's full sampler (31 + 31 + 10 passes over the vocabulary, each a
    [B, V] loop nest): its batch-8 object stays within 2x the batch-1 one (it was 4.4x,
    and LLVM's time grew with it: a minute for B = 8 at V = 49152 on 2 loaded cores)."""
    from poot.graph import sampling as S

    sizes = {b: len(cpu.compile_cpu(S.trace_sampler(S.SamplerStep(b, 1000, b + 1, S.FULL)))
                    .engine.so_bytes) for b in (1, 8)}
    assert sizes[8] <= 2 * sizes[1], sizes
