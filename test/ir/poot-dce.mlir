// poot-dce: poot ops whose results are unused are erased, to a fixed point (a dead chain goes
// whole); used ops and non-poot ops stay. Upstream canonicalize keeps them (unknown effects).
// RUN: poot-opt %s --split-input-file --pass-pipeline='builtin.module(poot-dce,poot-verify)' | FileCheck %s
// RUN: poot-opt %s --split-input-file --pass-pipeline='builtin.module(canonicalize)' | FileCheck %s --check-prefix=UPSTREAM

// CHECK-LABEL: func.func @dead_chain(
// CHECK-NEXT: %[[L:.+]] = "poot.unary"(%arg0) {fn = "log"}
// CHECK-NEXT: return %[[L]]
// UPSTREAM-LABEL: func.func @dead_chain(
// UPSTREAM: "poot.param"
// UPSTREAM: {fn = "exp"}
func.func @dead_chain(%a: tensor<4xf32>) -> tensor<4xf32> {
  %w = "poot.param"() {name = "w"} : () -> tensor<4xf32>
  %0 = "poot.unary"(%a) {fn = "exp"} : (tensor<4xf32>) -> tensor<4xf32>
  %1 = "poot.binary"(%0, %w) {fn = "mul"} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %2 = "poot.unary"(%1) {fn = "neg"} : (tensor<4xf32>) -> tensor<4xf32>
  %3 = "poot.reduce"(%2) {fn = "sum", axes = array<i64: 0>} : (tensor<4xf32>) -> tensor<f32>
  %4 = "poot.unary"(%a) {fn = "log"} : (tensor<4xf32>) -> tensor<4xf32>
  return %4 : tensor<4xf32>
}

// -----

// A scatter is pure too (it returns a new tensor): unused, it goes.
// CHECK-LABEL: func.func @dead_scatter(
// CHECK-NOT: poot.scatter
// CHECK: return %arg0
func.func @dead_scatter(%d: tensor<8x4xf32>, %i: tensor<2x1xi32>, %u: tensor<2x4xf32>) -> tensor<8x4xf32> {
  %0 = "poot.scatter"(%d, %i, %u) : (tensor<8x4xf32>, tensor<2x1xi32>, tensor<2x4xf32>) -> tensor<8x4xf32>
  return %d : tensor<8x4xf32>
}

// -----

// Used ops stay, including ones used only by another function's call operand.
// CHECK-LABEL: func.func @used(
// CHECK: {fn = "exp"}
// CHECK: call @callee
// CHECK-LABEL: func.func private @callee(
// CHECK: {fn = "neg"}
func.func @used(%a: tensor<4xf32>) -> tensor<4xf32> {
  %0 = "poot.unary"(%a) {fn = "exp"} : (tensor<4xf32>) -> tensor<4xf32>
  %1 = func.call @callee(%0) : (tensor<4xf32>) -> tensor<4xf32>
  return %1 : tensor<4xf32>
}
func.func private @callee(%a: tensor<4xf32>) -> tensor<4xf32> {
  %0 = "poot.unary"(%a) {fn = "neg"} : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}
