// poot.concat of operands whose sizes differ along the axis (the normal use: appending a new
// KV row to a cache, joining RoPE halves of different widths) must parse, verify and round-trip.
// concat is binary (IRDL binds one type to all operands of a variadic slot, so a variadic concat
// could only ever join identical types); three pieces are a chain of two concats.
//
// RUN: poot-opt %s | poot-opt | FileCheck %s

// CHECK-LABEL: func.func @concat_sizes(
// CHECK-NEXT: %[[AB:[0-9]+]] = "poot.concat"(%arg0, %arg1) {axis = 1 : i64} : (tensor<2x3xf32>, tensor<2x1xf32>) -> tensor<2x4xf32>
// CHECK-NEXT: %{{[0-9]+}} = "poot.concat"(%[[AB]], %arg2) {axis = 1 : i64} : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x8xf32>
// CHECK-NEXT: return
func.func @concat_sizes(%a: tensor<2x3xf32>, %b: tensor<2x1xf32>, %c: tensor<2x4xf32>) -> tensor<2x8xf32> {
  %0 = "poot.concat"(%a, %b) {axis = 1 : i64} : (tensor<2x3xf32>, tensor<2x1xf32>) -> tensor<2x4xf32>
  %1 = "poot.concat"(%0, %c) {axis = 1 : i64} : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x8xf32>
  return %1 : tensor<2x8xf32>
}

// Appending one KV row (axis 0) to a cache of a different length; i8 payload.
// CHECK-LABEL: func.func @kv_append(
// CHECK-NEXT: %{{[0-9]+}} = "poot.concat"(%arg0, %arg1) {axis = 0 : i64} : (tensor<7x4xi8>, tensor<1x4xi8>) -> tensor<8x4xi8>
func.func @kv_append(%cache: tensor<7x4xi8>, %row: tensor<1x4xi8>) -> tensor<8x4xi8> {
  %0 = "poot.concat"(%cache, %row) {axis = 0 : i64} : (tensor<7x4xi8>, tensor<1x4xi8>) -> tensor<8x4xi8>
  return %0 : tensor<8x4xi8>
}
