// poot-canonicalize: semantic folds that are always valid (views, identities with splat
// constants, constant folding by the op's own evaluate), then DCE. Each case also pins what
// must NOT fold.
// RUN: poot-opt %s --split-input-file --pass-pipeline='builtin.module(poot-canonicalize,poot-verify)' | FileCheck %s
// RUN: poot-opt %s --split-input-file --pass-pipeline='builtin.module(poot-canonicalize{no-signed-zeros=true max-fold-bytes=16},poot-verify)' | FileCheck %s --check-prefix=NSZ

// CHECK-LABEL: func.func @reshapes(
// CHECK-NEXT: %[[R:.+]] = "poot.reshape"(%arg0) : (tensor<4x8xf32>) -> tensor<32xf32>
// CHECK-NEXT: return %[[R]], %arg0
func.func @reshapes(%a: tensor<4x8xf32>) -> (tensor<32xf32>, tensor<4x8xf32>) {
  %0 = "poot.reshape"(%a) : (tensor<4x8xf32>) -> tensor<8x4xf32>
  %1 = "poot.reshape"(%0) : (tensor<8x4xf32>) -> tensor<2x16xf32>
  %2 = "poot.reshape"(%1) : (tensor<2x16xf32>) -> tensor<32xf32>
  %3 = "poot.reshape"(%0) : (tensor<8x4xf32>) -> tensor<4x8xf32>
  return %2, %3 : tensor<32xf32>, tensor<4x8xf32>
}

// -----

// CHECK-LABEL: func.func @transposes(
// CHECK-NEXT: %[[T:.+]] = "poot.transpose"(%arg0) {perm = array<i64: 2, 0, 1>}
// CHECK-NEXT: %[[R:.+]] = "poot.reshape"(%arg1) : (tensor<1x4xf32>) -> tensor<4x1xf32>
// CHECK-NEXT: %[[S:.+]] = "poot.transpose"(%arg2) {perm = array<i64: 1, 0>} : (tensor<4x4xf32>) -> tensor<4x4xf32>
// CHECK-NEXT: return %arg0, %[[T]], %[[R]], %[[S]]
func.func @transposes(%a: tensor<2x3x4xf32>, %b: tensor<1x4xf32>, %sq: tensor<4x4xf32>) -> (tensor<2x3x4xf32>, tensor<4x2x3xf32>, tensor<4x1xf32>, tensor<4x4xf32>) {
  %0 = "poot.transpose"(%a) {perm = array<i64: 1, 0, 2>} : (tensor<2x3x4xf32>) -> tensor<3x2x4xf32>
  %1 = "poot.transpose"(%0) {perm = array<i64: 1, 0, 2>} : (tensor<3x2x4xf32>) -> tensor<2x3x4xf32>
  %2 = "poot.transpose"(%0) {perm = array<i64: 2, 1, 0>} : (tensor<3x2x4xf32>) -> tensor<4x2x3xf32>
  // only a size-1 dim moves: the element order is kept, so this is a reshape
  %3 = "poot.transpose"(%b) {perm = array<i64: 1, 0>} : (tensor<1x4xf32>) -> tensor<4x1xf32>
  // same type, but it moves data: must stay
  %4 = "poot.transpose"(%sq) {perm = array<i64: 1, 0>} : (tensor<4x4xf32>) -> tensor<4x4xf32>
  return %1, %2, %3, %4 : tensor<2x3x4xf32>, tensor<4x2x3xf32>, tensor<4x1xf32>, tensor<4x4xf32>
}

// -----

// CHECK-LABEL: func.func @same_type_and_compose(
// CHECK-NEXT: %[[C:.+]] = "poot.cast"(%arg0) : (tensor<4xf32>) -> tensor<4xf16>
// CHECK-NEXT: %[[B:.+]] = "poot.broadcast"(%arg0) {dims = array<i64: 2>} : (tensor<4xf32>) -> tensor<2x3x4xf32>
// CHECK-NEXT: %[[S:.+]] = "poot.slice"(%arg1) {limit = array<i64: 5, 8>, start = array<i64: 1, 2>, stride = array<i64: 3, 1>} : (tensor<8x8xf32>) -> tensor<2x6xf32>
// CHECK-NEXT: return %arg0, %arg0, %arg1, %[[C]], %[[B]], %[[S]]
func.func @same_type_and_compose(%a: tensor<4xf32>, %m: tensor<8x8xf32>) -> (tensor<4xf32>, tensor<4xf32>, tensor<8x8xf32>, tensor<4xf16>, tensor<2x3x4xf32>, tensor<2x6xf32>) {
  %0 = "poot.cast"(%a) : (tensor<4xf32>) -> tensor<4xf32>
  %1 = "poot.broadcast"(%a) {dims = array<i64: 0>} : (tensor<4xf32>) -> tensor<4xf32>
  %2 = "poot.slice"(%m) {start = array<i64: 0, 0>, limit = array<i64: 8, 8>, stride = array<i64: 1, 1>} : (tensor<8x8xf32>) -> tensor<8x8xf32>
  %3 = "poot.cast"(%a) : (tensor<4xf32>) -> tensor<4xf16>
  %4 = "poot.broadcast"(%a) {dims = array<i64: 1>} : (tensor<4xf32>) -> tensor<3x4xf32>
  %5 = "poot.broadcast"(%4) {dims = array<i64: 1, 2>} : (tensor<3x4xf32>) -> tensor<2x3x4xf32>
  %6 = "poot.slice"(%m) {start = array<i64: 1, 0>, limit = array<i64: 8, 8>, stride = array<i64: 3, 1>} : (tensor<8x8xf32>) -> tensor<3x8xf32>
  %7 = "poot.slice"(%6) {start = array<i64: 0, 2>, limit = array<i64: 2, 8>, stride = array<i64: 1, 1>} : (tensor<3x8xf32>) -> tensor<2x6xf32>
  return %0, %1, %2, %3, %5, %7 : tensor<4xf32>, tensor<4xf32>, tensor<8x8xf32>, tensor<4xf16>, tensor<2x3x4xf32>, tensor<2x6xf32>
}

// -----

// x*1, 1*x, x/1, x-0, x+(-0.0) fold for floats; x+(+0.0) does not (it maps -0.0 to +0.0)
// unless no-signed-zeros is set; x*0 and 1/x never fold; x+0 folds for integers.
// CHECK-LABEL: func.func @identities(
// CHECK-NOT: {fn = "mul"}
// CHECK: %[[ADD:.+]] = "poot.binary"(%arg0, %{{.+}}) {fn = "add"}
// CHECK: %[[MUL0:.+]] = "poot.binary"(%arg0, %{{.+}}) {fn = "mul"}
// CHECK: %[[RCP:.+]] = "poot.binary"(%{{.+}}, %arg0) {fn = "div"}
// CHECK: return %arg0, %arg0, %arg0, %arg0, %arg0, %[[ADD]], %[[MUL0]], %[[RCP]], %arg1
// NSZ-LABEL: func.func @identities(
// NSZ: return %arg0, %arg0, %arg0, %arg0, %arg0, %arg0, %{{.+}}, %{{.+}}, %arg1
func.func @identities(%x: tensor<4xf32>, %i: tensor<4xi32>) -> (tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xi32>) {
  %one_s = "poot.constant"() {value = dense<1.0> : tensor<f32>} : () -> tensor<f32>
  %one = "poot.broadcast"(%one_s) {dims = array<i64>} : (tensor<f32>) -> tensor<4xf32>
  %zero = "poot.constant"() {value = dense<0.0> : tensor<4xf32>} : () -> tensor<4xf32>
  %nzero = "poot.constant"() {value = dense<-0.0> : tensor<4xf32>} : () -> tensor<4xf32>
  %izero = "poot.constant"() {value = dense<0> : tensor<4xi32>} : () -> tensor<4xi32>
  %0 = "poot.binary"(%x, %one) {fn = "mul"} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %1 = "poot.binary"(%one, %x) {fn = "mul"} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %2 = "poot.binary"(%x, %one) {fn = "div"} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %3 = "poot.binary"(%x, %zero) {fn = "sub"} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %4 = "poot.binary"(%x, %nzero) {fn = "add"} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %5 = "poot.binary"(%x, %zero) {fn = "add"} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %6 = "poot.binary"(%x, %zero) {fn = "mul"} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %7 = "poot.binary"(%one, %x) {fn = "div"} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %8 = "poot.binary"(%izero, %i) {fn = "add"} : (tensor<4xi32>, tensor<4xi32>) -> tensor<4xi32>
  return %0, %1, %2, %3, %4, %5, %6, %7, %8 : tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xi32>
}

// -----

// Constant folding with the op's own semantics; results over max-fold-bytes stay computed.
// CHECK-LABEL: func.func @fold_constants(
// CHECK-NEXT: %[[C:.+]] = "poot.constant"() {value = dense<[5.000000e+00, 7.000000e+00, 9.000000e+00]> : tensor<3xf32>}
// CHECK-NEXT: %[[K:.+]] = "poot.constant"() {value = dense<[0, 1, 2, 3, 4, 5, 6, 7]> : tensor<8xi32>}
// CHECK-NEXT: %[[BIG:.+]] = "poot.constant"() {value = dense<2.000000e+00> : tensor<f32>}
// CHECK-NEXT: %[[BB:.+]] = "poot.broadcast"(%[[BIG]]) {dims = array<i64>} : (tensor<f32>) -> tensor<2048xf32>
// CHECK-NEXT: return %[[C]], %[[K]], %[[BB]]
// NSZ-LABEL: func.func @fold_constants(
// NSZ: "poot.constant"() {value = dense<[5.000000e+00, 7.000000e+00, 9.000000e+00]> : tensor<3xf32>}
// NSZ: "poot.binary"
func.func @fold_constants() -> (tensor<3xf32>, tensor<8xi32>, tensor<2048xf32>) {
  %0 = "poot.constant"() {value = dense<[[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]> : tensor<2x3xf32>} : () -> tensor<2x3xf32>
  %1 = "poot.reduce"(%0) {fn = "sum", axes = array<i64: 0>} : (tensor<2x3xf32>) -> tensor<3xf32>
  %2 = "poot.iota"() {axis = 0} : () -> tensor<8xi32>
  %3 = "poot.constant"() {value = dense<[0, 1, 2, 3, 4, 5, 6, 7]> : tensor<8xi32>} : () -> tensor<8xi32>
  %4 = "poot.binary"(%3, %3) {fn = "max"} : (tensor<8xi32>, tensor<8xi32>) -> tensor<8xi32>
  %5 = "poot.constant"() {value = dense<2.0> : tensor<f32>} : () -> tensor<f32>
  %6 = "poot.broadcast"(%5) {dims = array<i64>} : (tensor<f32>) -> tensor<2048xf32>
  return %1, %4, %6 : tensor<3xf32>, tensor<8xi32>, tensor<2048xf32>
}

// -----

// A select on a splat condition picks its operand.
// CHECK-LABEL: func.func @select_splat(
// CHECK-NEXT: return %arg1, %arg0
func.func @select_splat(%a: tensor<4xf32>, %b: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>) {
  %t = "poot.constant"() {value = dense<true> : tensor<4xi1>} : () -> tensor<4xi1>
  %f = "poot.constant"() {value = dense<false> : tensor<4xi1>} : () -> tensor<4xi1>
  %0 = "poot.select"(%f, %a, %b) : (tensor<4xi1>, tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %1 = "poot.select"(%t, %a, %b) : (tensor<4xi1>, tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return %0, %1 : tensor<4xf32>, tensor<4xf32>
}

// -----

// Idempotent binaries and a select of two equal branches; i1 and f16 constants fold.
// CHECK-LABEL: func.func @same_operands(
// CHECK-NEXT: %[[N:.+]] = "poot.constant"() {value = dense<[false, true, false, false]> : tensor<4xi1>}
// CHECK-NEXT: %[[H:.+]] = "poot.constant"() {value = dense<[1.000000e+00, 6.250000e+00, 9.000000e+00, 1.600000e+01]> : tensor<4xf16>}
// CHECK-NEXT: %[[S:.+]] = "poot.binary"(%arg0, %arg0) {fn = "sub"}
// CHECK-NEXT: return %[[N]], %arg0, %[[H]], %arg0, %arg0, %[[S]]
func.func @same_operands(%a: tensor<4xf32>) -> (tensor<4xi1>, tensor<4xf32>, tensor<4xf16>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) {
  %m = "poot.constant"() {value = dense<[true, false, true, true]> : tensor<4xi1>} : () -> tensor<4xi1>
  %n = "poot.unary"(%m) {fn = "not"} : (tensor<4xi1>) -> tensor<4xi1>
  %s = "poot.select"(%m, %a, %a) : (tensor<4xi1>, tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %h = "poot.constant"() {value = dense<[1.0, 2.5, 3.0, 4.0]> : tensor<4xf16>} : () -> tensor<4xf16>
  %h2 = "poot.binary"(%h, %h) {fn = "mul"} : (tensor<4xf16>, tensor<4xf16>) -> tensor<4xf16>
  %mx = "poot.binary"(%a, %a) {fn = "max"} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %mn = "poot.binary"(%a, %a) {fn = "min"} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  // x - x is not 0 for x = inf or nan: it stays
  %sb = "poot.binary"(%a, %a) {fn = "sub"} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return %n, %s, %h2, %mx, %mn, %sb : tensor<4xi1>, tensor<4xf32>, tensor<4xf16>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>
}

// -----

// A gather along an axis of extent 1 (a one-slot KV cache): every clamped index reads entry 0,
// so the table is reshaped (and broadcast over the index dims when there are several).
// CHECK-LABEL: func.func @gather_unit_axis(
// CHECK-NOT: poot.gather
// CHECK: %[[R:.+]] = "poot.reshape"(%arg0) : (tensor<1x8x2xf32>) -> tensor<8x2xf32>
// CHECK-NEXT: %[[B:.+]] = "poot.broadcast"(%[[R]]) {dims = array<i64: 1, 2>} : (tensor<8x2xf32>) -> tensor<3x8x2xf32>
// CHECK-NEXT: %[[G:.+]] = "poot.gather"(%arg2, %arg1) {axis = 0 : i64}
// CHECK-NEXT: return %arg0, %[[B]], %[[G]]
func.func @gather_unit_axis(%t: tensor<1x8x2xf32>, %i: tensor<1xi32>, %u: tensor<2x8xf32>, %j: tensor<3xi32>) -> (tensor<1x8x2xf32>, tensor<3x8x2xf32>, tensor<1x8xf32>) {
  %0 = "poot.gather"(%t, %i) {axis = 0 : i64} : (tensor<1x8x2xf32>, tensor<1xi32>) -> tensor<1x8x2xf32>
  %1 = "poot.gather"(%t, %j) {axis = 0 : i64} : (tensor<1x8x2xf32>, tensor<3xi32>) -> tensor<3x8x2xf32>
  %2 = "poot.gather"(%u, %i) {axis = 0 : i64} : (tensor<2x8xf32>, tensor<1xi32>) -> tensor<1x8xf32>
  return %0, %1, %2 : tensor<1x8x2xf32>, tensor<3x8x2xf32>, tensor<1x8xf32>
}
