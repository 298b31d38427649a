"""The oracle evaluates ``func.call`` by running the callee's body with the same semantics
(dispatch regions outlined by poot-fuse-dispatch are such calls)."""

from __future__ import annotations

import numpy as np
import pytest
from mlir import ir

from poot import oracle
from poot.dialects import make_context

TEXT = """
func.func @step(%x: tensor<4xf32> {poot.name = "x"}) -> (tensor<4xf32> {poot.name = "y"}, tensor<f32> {poot.name = "s"}) {
  %w = "poot.param"() {name = "w"} : () -> tensor<4xf32>
  %0:2 = func.call @outer(%x, %w) : (tensor<4xf32>, tensor<4xf32>) -> (tensor<4xf32>, tensor<f32>)
  %1 = "poot.unary"(%0#0) {fn = "neg"} : (tensor<4xf32>) -> tensor<4xf32>
  return %1, %0#1 : tensor<4xf32>, tensor<f32>
}
func.func private @outer(%a: tensor<4xf32>, %b: tensor<4xf32>) -> (tensor<4xf32>, tensor<f32>) {
  %0 = func.call @inner(%a, %b) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %1 = "poot.reduce"(%0) {fn = "sum", axes = array<i64: 0>} : (tensor<4xf32>) -> tensor<f32>
  return %0, %1 : tensor<4xf32>, tensor<f32>
}
func.func private @inner(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
  %0 = "poot.binary"(%a, %b) {fn = "mul"} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}
"""


def _module(text):
    ctx = make_context()
    with ctx:
        return ir.Module.parse(text)


def test_nested_calls_evaluate_like_the_inlined_graph():
    x = np.array([1, 2, 3, 4], np.float32)
    w = np.array([0.5, -1, 2, 0], np.float32)
    seen = []
    out = oracle.evaluate(_module(TEXT), {"x": x}, {"w": w},
                          observer=lambda op, v: seen.append(op.name))
    np.testing.assert_array_equal(out["y"], -(x * w))
    np.testing.assert_array_equal(out["s"], np.float32((x * w).astype(np.float64).sum()))
    # the observer sees the ops inside the callees, in execution order
    assert seen == ["poot.param", "poot.binary", "poot.reduce", "poot.unary"]


def test_call_to_a_missing_body_is_an_eval_error():
    text = TEXT.replace("""func.func private @inner(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
  %0 = "poot.binary"(%a, %b) {fn = "mul"} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}""", "func.func private @inner(tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>")
    with pytest.raises(oracle.EvalError, match="inner"):
        oracle.evaluate(_module(text), {"x": np.zeros(4, np.float32)},
                        {"w": np.zeros(4, np.float32)})
