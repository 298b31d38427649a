"""A CPU function computes its results in the caller's out-parameters
(:mod:`poot.backends.cpu.out_params`): a result that is the function's own allocation, or a
reshaped view of it, is no longer copied into the out-parameter at the return; other
copies stay; compiled programs compute the same values."""

from __future__ import annotations

import numpy as np
from mlir import ir
from mlir.passmanager import PassManager

from poot.backends.cpu import codegen as cpu
from poot.backends.cpu.out_params import write_results_in_place
from poot.backends.pass_pipelines import RESULTS_TO_OUT_PARAMS
from poot.dialects import make_context
from poot.dialects.types import DType, TensorType
from poot.graph.builder import Builder, TraceLimits

SRC = """
func.func private @f(%a: memref<4x8xf32>, %b: memref<32xf32>) -> (memref<4x2x4xf32>, memref<32xf32>) {
  %0 = memref.alloc() {alignment = 64 : i64} : memref<4x8xf32>
  memref.copy %a, %0 : memref<4x8xf32> to memref<4x8xf32>
  %1 = memref.expand_shape %0 [[0], [1, 2]] output_shape [4, 2, 4] : memref<4x8xf32> into memref<4x2x4xf32>
  return %1, %b : memref<4x2x4xf32>, memref<32xf32>
}
"""


def test_an_own_allocation_is_computed_in_the_out_parameter():
    with make_context():
        m = ir.Module.parse(SRC)
        PassManager.parse(f"builtin.module({RESULTS_TO_OUT_PARAMS})").run(m.operation)
        assert str(m).count("memref.copy") == 3   # the write, and one copy per result
        assert write_results_in_place(m) == 1
        m.operation.verify()
        text = str(m)
    assert "memref.alloc" not in text
    # left: the function's own write (now into the out-parameter) and the copy of its
    # argument %b, which it does not own
    assert text.count("memref.copy") == 2
    assert "memref.collapse_shape %arg2" in text


def test_compiled_results_are_unchanged():
    b = Builder(TraceLimits(max_values=100, max_ops=100, max_literal_bytes=1 << 16,
                            max_owned_bytes=1 << 24))
    x = b.input("x", TensorType((4, 64), DType.F32))
    w = b.input("w", TensorType((64, 48), DType.F32))
    y = b.matmul(x, w)
    g = b.finish({"y": b.reshape(y, (4, 3, 16)), "z": b.reduce("max", y, 1)})
    rng = np.random.default_rng(0)
    xv = rng.standard_normal((4, 64)).astype(np.float32)
    wv = rng.standard_normal((64, 48)).astype(np.float32)
    out = cpu.compile_cpu(g).run({"x": xv, "w": wv})
    want = xv @ wv
    np.testing.assert_allclose(out["y"], want.reshape(4, 3, 16), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(out["z"], out["y"].reshape(4, 48).max(1))
