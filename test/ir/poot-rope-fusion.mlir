// poot-rope-fusion: a RoPE rotation (half or interleaved pairs, optional pass-through tail),
// however spelled, is outlined into one private function with poot.dispatch kind "rope".
// RUN: poot-opt %s --split-input-file --pass-pipeline='builtin.module(poot-rope-fusion,poot-verify)' | FileCheck %s
// Half layout (HF rotate_half) on the first 4 of 6 channels, tail passed through: slices,
// products, sub/add and both concats leave the entry function for one rope dispatch; the
// cos/sin views join it (only it uses them).
// CHECK-LABEL: func.func @half_partial(
// CHECK-NEXT: %[[R:.+]] = call @half_partial_rope_0(%arg1, %arg2, %arg0) : (tensor<1x2x2xf32>, tensor<1x2x2xf32>, tensor<1x2x2x6xf32>) -> tensor<1x2x2x6xf32>
// CHECK-NEXT: return %[[R]]
// CHECK: func.func private @half_partial_rope_0({{.*}}) -> tensor<1x2x2x6xf32> attributes {poot.dispatch = {kind = "rope", ops = 17 : i64}}
// CHECK-COUNT-2: "poot.slice"
// CHECK: "poot.concat"({{.*}}) {axis = 3 : i64} : (tensor<1x2x2x2xf32>, tensor<1x2x2x2xf32>)
// CHECK-NEXT: "poot.slice"
// CHECK: "poot.concat"({{.*}}) {axis = 3 : i64} : (tensor<1x2x2x4xf32>, tensor<1x2x2x2xf32>)
// CHECK-NEXT: return
func.func @half_partial(%arg0: tensor<1x2x2x6xf32> {poot.name = "x"}, %arg1: tensor<1x2x2xf32> {poot.name = "cos"}, %arg2: tensor<1x2x2xf32> {poot.name = "sin"}) -> (tensor<1x2x2x6xf32> {poot.name = "out"}) {
  %0 = "poot.reshape"(%arg1) : (tensor<1x2x2xf32>) -> tensor<1x2x1x2xf32>
  %1 = "poot.reshape"(%arg2) : (tensor<1x2x2xf32>) -> tensor<1x2x1x2xf32>
  %2 = "poot.slice"(%arg0) {limit = array<i64: 1, 2, 2, 2>, start = array<i64: 0, 0, 0, 0>, stride = array<i64: 1, 1, 1, 1>} : (tensor<1x2x2x6xf32>) -> tensor<1x2x2x2xf32>
  %3 = "poot.slice"(%arg0) {limit = array<i64: 1, 2, 2, 4>, start = array<i64: 0, 0, 0, 2>, stride = array<i64: 1, 1, 1, 1>} : (tensor<1x2x2x6xf32>) -> tensor<1x2x2x2xf32>
  %4 = "poot.broadcast"(%0) {dims = array<i64: 0, 1, 2, 3>} : (tensor<1x2x1x2xf32>) -> tensor<1x2x2x2xf32>
  %5 = "poot.binary"(%2, %4) {fn = "mul"} : (tensor<1x2x2x2xf32>, tensor<1x2x2x2xf32>) -> tensor<1x2x2x2xf32>
  %6 = "poot.broadcast"(%1) {dims = array<i64: 0, 1, 2, 3>} : (tensor<1x2x1x2xf32>) -> tensor<1x2x2x2xf32>
  %7 = "poot.binary"(%3, %6) {fn = "mul"} : (tensor<1x2x2x2xf32>, tensor<1x2x2x2xf32>) -> tensor<1x2x2x2xf32>
  %8 = "poot.binary"(%5, %7) {fn = "sub"} : (tensor<1x2x2x2xf32>, tensor<1x2x2x2xf32>) -> tensor<1x2x2x2xf32>
  %9 = "poot.broadcast"(%0) {dims = array<i64: 0, 1, 2, 3>} : (tensor<1x2x1x2xf32>) -> tensor<1x2x2x2xf32>
  %10 = "poot.binary"(%3, %9) {fn = "mul"} : (tensor<1x2x2x2xf32>, tensor<1x2x2x2xf32>) -> tensor<1x2x2x2xf32>
  %11 = "poot.broadcast"(%1) {dims = array<i64: 0, 1, 2, 3>} : (tensor<1x2x1x2xf32>) -> tensor<1x2x2x2xf32>
  %12 = "poot.binary"(%2, %11) {fn = "mul"} : (tensor<1x2x2x2xf32>, tensor<1x2x2x2xf32>) -> tensor<1x2x2x2xf32>
  %13 = "poot.binary"(%10, %12) {fn = "add"} : (tensor<1x2x2x2xf32>, tensor<1x2x2x2xf32>) -> tensor<1x2x2x2xf32>
  %14 = "poot.concat"(%8, %13) {axis = 3 : i64} : (tensor<1x2x2x2xf32>, tensor<1x2x2x2xf32>) -> tensor<1x2x2x4xf32>
  %15 = "poot.slice"(%arg0) {limit = array<i64: 1, 2, 2, 6>, start = array<i64: 0, 0, 0, 4>, stride = array<i64: 1, 1, 1, 1>} : (tensor<1x2x2x6xf32>) -> tensor<1x2x2x2xf32>
  %16 = "poot.concat"(%14, %15) {axis = 3 : i64} : (tensor<1x2x2x4xf32>, tensor<1x2x2x2xf32>) -> tensor<1x2x2x6xf32>
  return %16 : tensor<1x2x2x6xf32>
}

// -----

// Interleaved pairs (2i, 2i+1), spelled with the factors first, an add of a negation and the
// second half computed first: still one rope dispatch.
// CHECK-LABEL: func.func @interleaved(
// CHECK-NEXT: %[[R:.+]] = call @interleaved_rope_0(%arg1, %arg2, %arg0)
// CHECK-NEXT: return %[[R]]
// CHECK: func.func private @interleaved_rope_0({{.*}}attributes {poot.dispatch = {kind = "rope", ops = 19 : i64}}
// CHECK: "poot.slice"(%arg2) {limit = array<i64: 1, 2, 2, 6>, start = array<i64: 0, 0, 0, 0>, stride = array<i64: 1, 1, 1, 2>}
// CHECK: "poot.concat"({{.*}}) {axis = 4 : i64}
func.func @interleaved(%arg0: tensor<1x2x2x6xf32> {poot.name = "x"}, %arg1: tensor<1x2x3xf32> {poot.name = "cos"}, %arg2: tensor<1x2x3xf32> {poot.name = "sin"}) -> (tensor<1x2x2x6xf32> {poot.name = "out"}) {
  %0 = "poot.reshape"(%arg1) : (tensor<1x2x3xf32>) -> tensor<1x2x1x3xf32>
  %1 = "poot.reshape"(%arg2) : (tensor<1x2x3xf32>) -> tensor<1x2x1x3xf32>
  %2 = "poot.slice"(%arg0) {limit = array<i64: 1, 2, 2, 6>, start = array<i64: 0, 0, 0, 0>, stride = array<i64: 1, 1, 1, 2>} : (tensor<1x2x2x6xf32>) -> tensor<1x2x2x3xf32>
  %3 = "poot.slice"(%arg0) {limit = array<i64: 1, 2, 2, 6>, start = array<i64: 0, 0, 0, 1>, stride = array<i64: 1, 1, 1, 2>} : (tensor<1x2x2x6xf32>) -> tensor<1x2x2x3xf32>
  %4 = "poot.broadcast"(%1) {dims = array<i64: 0, 1, 2, 3>} : (tensor<1x2x1x3xf32>) -> tensor<1x2x2x3xf32>
  %5 = "poot.binary"(%4, %2) {fn = "mul"} : (tensor<1x2x2x3xf32>, tensor<1x2x2x3xf32>) -> tensor<1x2x2x3xf32>
  %6 = "poot.broadcast"(%0) {dims = array<i64: 0, 1, 2, 3>} : (tensor<1x2x1x3xf32>) -> tensor<1x2x2x3xf32>
  %7 = "poot.binary"(%6, %3) {fn = "mul"} : (tensor<1x2x2x3xf32>, tensor<1x2x2x3xf32>) -> tensor<1x2x2x3xf32>
  %8 = "poot.binary"(%5, %7) {fn = "add"} : (tensor<1x2x2x3xf32>, tensor<1x2x2x3xf32>) -> tensor<1x2x2x3xf32>
  %9 = "poot.broadcast"(%1) {dims = array<i64: 0, 1, 2, 3>} : (tensor<1x2x1x3xf32>) -> tensor<1x2x2x3xf32>
  %10 = "poot.binary"(%9, %3) {fn = "mul"} : (tensor<1x2x2x3xf32>, tensor<1x2x2x3xf32>) -> tensor<1x2x2x3xf32>
  %11 = "poot.unary"(%10) {fn = "neg"} : (tensor<1x2x2x3xf32>) -> tensor<1x2x2x3xf32>
  %12 = "poot.broadcast"(%0) {dims = array<i64: 0, 1, 2, 3>} : (tensor<1x2x1x3xf32>) -> tensor<1x2x2x3xf32>
  %13 = "poot.binary"(%12, %2) {fn = "mul"} : (tensor<1x2x2x3xf32>, tensor<1x2x2x3xf32>) -> tensor<1x2x2x3xf32>
  %14 = "poot.binary"(%11, %13) {fn = "add"} : (tensor<1x2x2x3xf32>, tensor<1x2x2x3xf32>) -> tensor<1x2x2x3xf32>
  %15 = "poot.reshape"(%14) : (tensor<1x2x2x3xf32>) -> tensor<1x2x2x3x1xf32>
  %16 = "poot.reshape"(%8) : (tensor<1x2x2x3xf32>) -> tensor<1x2x2x3x1xf32>
  %17 = "poot.concat"(%15, %16) {axis = 4 : i64} : (tensor<1x2x2x3x1xf32>, tensor<1x2x2x3x1xf32>) -> tensor<1x2x2x3x2xf32>
  %18 = "poot.reshape"(%17) : (tensor<1x2x2x3x2xf32>) -> tensor<1x2x2x6xf32>
  return %18 : tensor<1x2x2x6xf32>
}

// -----

// Must not fire: a*C + b*S in the first half is not a rotation.
// CHECK-LABEL: func.func @wrong_sign(
// CHECK-NOT: call
// CHECK: "poot.concat"
// CHECK-NOT: func.func private
func.func @wrong_sign(%arg0: tensor<1x2x2x6xf32> {poot.name = "x"}, %arg1: tensor<1x2x3xf32> {poot.name = "cos"}, %arg2: tensor<1x2x3xf32> {poot.name = "sin"}) -> (tensor<1x2x2x6xf32> {poot.name = "out"}) {
  %0 = "poot.reshape"(%arg1) : (tensor<1x2x3xf32>) -> tensor<1x2x1x3xf32>
  %1 = "poot.reshape"(%arg2) : (tensor<1x2x3xf32>) -> tensor<1x2x1x3xf32>
  %2 = "poot.slice"(%arg0) {limit = array<i64: 1, 2, 2, 3>, start = array<i64: 0, 0, 0, 0>, stride = array<i64: 1, 1, 1, 1>} : (tensor<1x2x2x6xf32>) -> tensor<1x2x2x3xf32>
  %3 = "poot.slice"(%arg0) {limit = array<i64: 1, 2, 2, 6>, start = array<i64: 0, 0, 0, 3>, stride = array<i64: 1, 1, 1, 1>} : (tensor<1x2x2x6xf32>) -> tensor<1x2x2x3xf32>
  %4 = "poot.broadcast"(%0) {dims = array<i64: 0, 1, 2, 3>} : (tensor<1x2x1x3xf32>) -> tensor<1x2x2x3xf32>
  %5 = "poot.binary"(%2, %4) {fn = "mul"} : (tensor<1x2x2x3xf32>, tensor<1x2x2x3xf32>) -> tensor<1x2x2x3xf32>
  %6 = "poot.broadcast"(%1) {dims = array<i64: 0, 1, 2, 3>} : (tensor<1x2x1x3xf32>) -> tensor<1x2x2x3xf32>
  %7 = "poot.binary"(%3, %6) {fn = "mul"} : (tensor<1x2x2x3xf32>, tensor<1x2x2x3xf32>) -> tensor<1x2x2x3xf32>
  %8 = "poot.binary"(%5, %7) {fn = "add"} : (tensor<1x2x2x3xf32>, tensor<1x2x2x3xf32>) -> tensor<1x2x2x3xf32>
  %9 = "poot.broadcast"(%0) {dims = array<i64: 0, 1, 2, 3>} : (tensor<1x2x1x3xf32>) -> tensor<1x2x2x3xf32>
  %10 = "poot.binary"(%3, %9) {fn = "mul"} : (tensor<1x2x2x3xf32>, tensor<1x2x2x3xf32>) -> tensor<1x2x2x3xf32>
  %11 = "poot.broadcast"(%1) {dims = array<i64: 0, 1, 2, 3>} : (tensor<1x2x1x3xf32>) -> tensor<1x2x2x3xf32>
  %12 = "poot.binary"(%2, %11) {fn = "mul"} : (tensor<1x2x2x3xf32>, tensor<1x2x2x3xf32>) -> tensor<1x2x2x3xf32>
  %13 = "poot.binary"(%10, %12) {fn = "add"} : (tensor<1x2x2x3xf32>, tensor<1x2x2x3xf32>) -> tensor<1x2x2x3xf32>
  %14 = "poot.concat"(%8, %13) {axis = 3 : i64} : (tensor<1x2x2x3xf32>, tensor<1x2x2x3xf32>) -> tensor<1x2x2x6xf32>
  return %14 : tensor<1x2x2x6xf32>
}

// -----

// Must not fire: the first rotated half is also a function result.
// CHECK-LABEL: func.func @leaking_half(
// CHECK-NOT: call
// CHECK: return
// CHECK-NOT: poot.dispatch
func.func @leaking_half(%arg0: tensor<1x2x2x6xf32> {poot.name = "x"}, %arg1: tensor<1x2x3xf32> {poot.name = "cos"}, %arg2: tensor<1x2x3xf32> {poot.name = "sin"}) -> (tensor<1x2x2x6xf32> {poot.name = "out"}, tensor<1x2x2x3xf32> {poot.name = "leak"}) {
  %0 = "poot.reshape"(%arg1) : (tensor<1x2x3xf32>) -> tensor<1x2x1x3xf32>
  %1 = "poot.reshape"(%arg2) : (tensor<1x2x3xf32>) -> tensor<1x2x1x3xf32>
  %2 = "poot.slice"(%arg0) {limit = array<i64: 1, 2, 2, 6>, start = array<i64: 0, 0, 0, 0>, stride = array<i64: 1, 1, 1, 2>} : (tensor<1x2x2x6xf32>) -> tensor<1x2x2x3xf32>
  %3 = "poot.slice"(%arg0) {limit = array<i64: 1, 2, 2, 6>, start = array<i64: 0, 0, 0, 1>, stride = array<i64: 1, 1, 1, 2>} : (tensor<1x2x2x6xf32>) -> tensor<1x2x2x3xf32>
  %4 = "poot.broadcast"(%0) {dims = array<i64: 0, 1, 2, 3>} : (tensor<1x2x1x3xf32>) -> tensor<1x2x2x3xf32>
  %5 = "poot.binary"(%2, %4) {fn = "mul"} : (tensor<1x2x2x3xf32>, tensor<1x2x2x3xf32>) -> tensor<1x2x2x3xf32>
  %6 = "poot.broadcast"(%1) {dims = array<i64: 0, 1, 2, 3>} : (tensor<1x2x1x3xf32>) -> tensor<1x2x2x3xf32>
  %7 = "poot.binary"(%3, %6) {fn = "mul"} : (tensor<1x2x2x3xf32>, tensor<1x2x2x3xf32>) -> tensor<1x2x2x3xf32>
  %8 = "poot.binary"(%5, %7) {fn = "sub"} : (tensor<1x2x2x3xf32>, tensor<1x2x2x3xf32>) -> tensor<1x2x2x3xf32>
  %9 = "poot.broadcast"(%0) {dims = array<i64: 0, 1, 2, 3>} : (tensor<1x2x1x3xf32>) -> tensor<1x2x2x3xf32>
  %10 = "poot.binary"(%3, %9) {fn = "mul"} : (tensor<1x2x2x3xf32>, tensor<1x2x2x3xf32>) -> tensor<1x2x2x3xf32>
  %11 = "poot.broadcast"(%1) {dims = array<i64: 0, 1, 2, 3>} : (tensor<1x2x1x3xf32>) -> tensor<1x2x2x3xf32>
  %12 = "poot.binary"(%2, %11) {fn = "mul"} : (tensor<1x2x2x3xf32>, tensor<1x2x2x3xf32>) -> tensor<1x2x2x3xf32>
  %13 = "poot.binary"(%10, %12) {fn = "add"} : (tensor<1x2x2x3xf32>, tensor<1x2x2x3xf32>) -> tensor<1x2x2x3xf32>
  %14 = "poot.reshape"(%8) : (tensor<1x2x2x3xf32>) -> tensor<1x2x2x3x1xf32>
  %15 = "poot.reshape"(%13) : (tensor<1x2x2x3xf32>) -> tensor<1x2x2x3x1xf32>
  %16 = "poot.concat"(%14, %15) {axis = 4 : i64} : (tensor<1x2x2x3x1xf32>, tensor<1x2x2x3x1xf32>) -> tensor<1x2x2x3x2xf32>
  %17 = "poot.reshape"(%16) : (tensor<1x2x2x3x2xf32>) -> tensor<1x2x2x6xf32>
  return %17, %8 : tensor<1x2x2x6xf32>, tensor<1x2x2x3xf32>
}
