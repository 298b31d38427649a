// poot-cse: identical poot ops (name, operands, attributes, result types) are merged; ops that
// differ in any of those stay. Upstream `cse` leaves these ops alone (IRDL ops have unknown
// effects), which the last RUN line pins.
// RUN: poot-opt %s --split-input-file --pass-pipeline='builtin.module(poot-cse,poot-verify)' | FileCheck %s
// RUN: poot-opt %s --split-input-file --pass-pipeline='builtin.module(cse)' | FileCheck %s --check-prefix=UPSTREAM

// CHECK-LABEL: func.func @merge_identical(
// CHECK-NEXT: %[[A:.+]] = "poot.binary"(%arg0, %arg1) {fn = "add"}
// CHECK-NEXT: %[[B:.+]] = "poot.binary"(%[[A]], %[[A]]) {fn = "mul"}
// CHECK-NEXT: return %[[B]], %[[A]]
// UPSTREAM-LABEL: func.func @merge_identical(
// UPSTREAM-COUNT-2: {fn = "add"}
func.func @merge_identical(%a: tensor<4xf32>, %b: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>) {
  %0 = "poot.binary"(%a, %b) {fn = "add"} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %1 = "poot.binary"(%a, %b) {fn = "add"} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %2 = "poot.binary"(%0, %1) {fn = "mul"} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return %2, %1 : tensor<4xf32>, tensor<4xf32>
}

// -----

// Cascades: once %1 becomes %0, %3 and %4 have the same operands and merge too.
// CHECK-LABEL: func.func @cascade(
// CHECK-COUNT-1: {fn = "exp"}
// CHECK-NOT: {fn = "exp"}
// CHECK-COUNT-1: {fn = "neg"}
// CHECK-NOT: poot.
// CHECK: return
func.func @cascade(%a: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>) {
  %0 = "poot.unary"(%a) {fn = "exp"} : (tensor<4xf32>) -> tensor<4xf32>
  %1 = "poot.unary"(%a) {fn = "exp"} : (tensor<4xf32>) -> tensor<4xf32>
  %3 = "poot.unary"(%0) {fn = "neg"} : (tensor<4xf32>) -> tensor<4xf32>
  %4 = "poot.unary"(%1) {fn = "neg"} : (tensor<4xf32>) -> tensor<4xf32>
  return %3, %4 : tensor<4xf32>, tensor<4xf32>
}

// -----

// Different attributes, operand order, result types or constant data: nothing merges.
// CHECK-LABEL: func.func @no_merge(
// CHECK: {fn = "add"}
// CHECK: {fn = "mul"}
// CHECK: "poot.binary"(%arg1, %arg0) {fn = "add"}
// CHECK: "poot.reduce"(%arg2) {axes = array<i64: 0>, fn = "sum"}
// CHECK: "poot.reduce"(%arg2) {axes = array<i64: 1>, fn = "sum"}
// CHECK: "poot.cast"(%arg0) : (tensor<4xf32>) -> tensor<4xf16>
// CHECK: "poot.cast"(%arg0) : (tensor<4xf32>) -> tensor<4xi32>
// CHECK: dense<1.000000e+00>
// CHECK: dense<2.000000e+00>
func.func @no_merge(%a: tensor<4xf32>, %b: tensor<4xf32>, %m: tensor<4x4xf32>) -> (tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf16>, tensor<4xi32>, tensor<f32>, tensor<f32>) {
  %0 = "poot.binary"(%a, %b) {fn = "add"} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %1 = "poot.binary"(%a, %b) {fn = "mul"} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %2 = "poot.binary"(%b, %a) {fn = "add"} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %3 = "poot.reduce"(%m) {fn = "sum", axes = array<i64: 0>} : (tensor<4x4xf32>) -> tensor<4xf32>
  %4 = "poot.reduce"(%m) {fn = "sum", axes = array<i64: 1>} : (tensor<4x4xf32>) -> tensor<4xf32>
  %5 = "poot.cast"(%a) : (tensor<4xf32>) -> tensor<4xf16>
  %6 = "poot.cast"(%a) : (tensor<4xf32>) -> tensor<4xi32>
  %7 = "poot.constant"() {value = dense<1.0> : tensor<f32>} : () -> tensor<f32>
  %8 = "poot.constant"() {value = dense<2.0> : tensor<f32>} : () -> tensor<f32>
  return %0, %1, %2, %3, %4, %5, %6, %7, %8 : tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf16>, tensor<4xi32>, tensor<f32>, tensor<f32>
}

// -----

// Params with the same name are one weight; constants with the same data one literal.
// CHECK-LABEL: func.func @sources(
// CHECK-COUNT-1: "poot.param"
// CHECK-NOT: "poot.param"
// CHECK-COUNT-1: "poot.constant"
// CHECK-NOT: "poot.constant"
func.func @sources() -> (tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) {
  %0 = "poot.param"() {name = "w"} : () -> tensor<4xf32>
  %1 = "poot.param"() {name = "w"} : () -> tensor<4xf32>
  %2 = "poot.constant"() {value = dense<[1.0, 2.0, 3.0, 4.0]> : tensor<4xf32>} : () -> tensor<4xf32>
  %3 = "poot.constant"() {value = dense<[1.0, 2.0, 3.0, 4.0]> : tensor<4xf32>} : () -> tensor<4xf32>
  return %0, %1, %2, %3 : tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>
}

// -----

// Per function: identical ops in two functions both stay.
// CHECK-LABEL: func.func @f1(
// CHECK: {fn = "exp"}
// CHECK-LABEL: func.func @f2(
// CHECK: {fn = "exp"}
func.func @f1(%a: tensor<4xf32>) -> tensor<4xf32> {
  %0 = "poot.unary"(%a) {fn = "exp"} : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}
func.func @f2(%a: tensor<4xf32>) -> tensor<4xf32> {
  %0 = "poot.unary"(%a) {fn = "exp"} : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}
