// Round-trip of every poot op, the !poot.packed type and every quant format attribute:
// parse, print (generic form), re-parse, print again; the CHECK lines pin the printed form.
// test/dialect/test_dialect_coverage.py fails when a registered op has no case here.
// RUN: poot-opt %s --split-input-file | poot-opt --split-input-file | FileCheck %s
// RUN: poot-opt %s --split-input-file --pass-pipeline='builtin.module(poot-verify)' | FileCheck %s

// CHECK-LABEL: func.func @param_f32(
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.param"() {name = "blk.0.attn_norm.weight"} : () -> tensor<64xf32>
// CHECK-NEXT: return
func.func @param_f32() -> tensor<64xf32> {
  %0 = "poot.param"() {name = "blk.0.attn_norm.weight"} : () -> tensor<64xf32>
  return %0 : tensor<64xf32>
}

// -----

// CHECK-LABEL: func.func @param_bf16_rank3(
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.param"() {name = "w"} : () -> tensor<2x3x4xbf16>
// CHECK-NEXT: return
func.func @param_bf16_rank3() -> tensor<2x3x4xbf16> {
  %0 = "poot.param"() {name = "w"} : () -> tensor<2x3x4xbf16>
  return %0 : tensor<2x3x4xbf16>
}

// -----

// CHECK-LABEL: func.func @param_i64_f16_i8_i1(
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.param"() {name = "a"} : () -> tensor<3xi64>
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.param"() {name = "b"} : () -> tensor<3xf16>
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.param"() {name = "c"} : () -> tensor<3xi8>
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.param"() {name = "d"} : () -> tensor<3xi1>
// CHECK-NEXT: return
func.func @param_i64_f16_i8_i1() -> tensor<3xi1> {
  %0 = "poot.param"() {name = "a"} : () -> tensor<3xi64>
  %1 = "poot.param"() {name = "b"} : () -> tensor<3xf16>
  %2 = "poot.param"() {name = "c"} : () -> tensor<3xi8>
  %3 = "poot.param"() {name = "d"} : () -> tensor<3xi1>
  return %3 : tensor<3xi1>
}

// -----

// CHECK-LABEL: func.func @packed_q4_0(
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.packed_param"() {name = "w_q4_0"} : () -> !poot.packed<#poot.q4_0, array<i64: 4, 32>>
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.dequantize"(%{{[a-z0-9_]+}}) : (!poot.packed<#poot.q4_0, array<i64: 4, 32>>) -> tensor<4x32xf32>
// CHECK-NEXT: return
func.func @packed_q4_0() -> tensor<4x32xf32> {
  %0 = "poot.packed_param"() {name = "w_q4_0"} : () -> !poot.packed<#poot.q4_0, array<i64: 4, 32>>
  %1 = "poot.dequantize"(%0) : (!poot.packed<#poot.q4_0, array<i64: 4, 32>>) -> tensor<4x32xf32>
  return %1 : tensor<4x32xf32>
}

// -----

// CHECK-LABEL: func.func @packed_q4_1(
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.packed_param"() {name = "w_q4_1"} : () -> !poot.packed<#poot.q4_1, array<i64: 32, 64>>
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.dequantize"(%{{[a-z0-9_]+}}) : (!poot.packed<#poot.q4_1, array<i64: 32, 64>>) -> tensor<32x64xf16>
// CHECK-NEXT: return
func.func @packed_q4_1() -> tensor<32x64xf16> {
  %0 = "poot.packed_param"() {name = "w_q4_1"} : () -> !poot.packed<#poot.q4_1, array<i64: 32, 64>>
  %1 = "poot.dequantize"(%0) : (!poot.packed<#poot.q4_1, array<i64: 32, 64>>) -> tensor<32x64xf16>
  return %1 : tensor<32x64xf16>
}

// -----

// CHECK-LABEL: func.func @packed_q5_0(
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.packed_param"() {name = "w_q5_0"} : () -> !poot.packed<#poot.q5_0, array<i64: 8, 96>>
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.dequantize"(%{{[a-z0-9_]+}}) : (!poot.packed<#poot.q5_0, array<i64: 8, 96>>) -> tensor<8x96xbf16>
// CHECK-NEXT: return
func.func @packed_q5_0() -> tensor<8x96xbf16> {
  %0 = "poot.packed_param"() {name = "w_q5_0"} : () -> !poot.packed<#poot.q5_0, array<i64: 8, 96>>
  %1 = "poot.dequantize"(%0) : (!poot.packed<#poot.q5_0, array<i64: 8, 96>>) -> tensor<8x96xbf16>
  return %1 : tensor<8x96xbf16>
}

// -----

// CHECK-LABEL: func.func @packed_q5_1(
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.packed_param"() {name = "w_q5_1"} : () -> !poot.packed<#poot.q5_1, array<i64: 2, 32>>
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.dequantize"(%{{[a-z0-9_]+}}) : (!poot.packed<#poot.q5_1, array<i64: 2, 32>>) -> tensor<2x32xf32>
// CHECK-NEXT: return
func.func @packed_q5_1() -> tensor<2x32xf32> {
  %0 = "poot.packed_param"() {name = "w_q5_1"} : () -> !poot.packed<#poot.q5_1, array<i64: 2, 32>>
  %1 = "poot.dequantize"(%0) : (!poot.packed<#poot.q5_1, array<i64: 2, 32>>) -> tensor<2x32xf32>
  return %1 : tensor<2x32xf32>
}

// -----

// CHECK-LABEL: func.func @packed_q8_0(
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.packed_param"() {name = "w_q8_0"} : () -> !poot.packed<#poot.q8_0, array<i64: 16, 128>>
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.dequantize"(%{{[a-z0-9_]+}}) : (!poot.packed<#poot.q8_0, array<i64: 16, 128>>) -> tensor<16x128xf32>
// CHECK-NEXT: return
func.func @packed_q8_0() -> tensor<16x128xf32> {
  %0 = "poot.packed_param"() {name = "w_q8_0"} : () -> !poot.packed<#poot.q8_0, array<i64: 16, 128>>
  %1 = "poot.dequantize"(%0) : (!poot.packed<#poot.q8_0, array<i64: 16, 128>>) -> tensor<16x128xf32>
  return %1 : tensor<16x128xf32>
}

// -----

// CHECK-LABEL: func.func @packed_q4_k(
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.packed_param"() {name = "w_q4_k"} : () -> !poot.packed<#poot.q4_k, array<i64: 2, 256>>
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.dequantize"(%{{[a-z0-9_]+}}) : (!poot.packed<#poot.q4_k, array<i64: 2, 256>>) -> tensor<2x256xf16>
// CHECK-NEXT: return
func.func @packed_q4_k() -> tensor<2x256xf16> {
  %0 = "poot.packed_param"() {name = "w_q4_k"} : () -> !poot.packed<#poot.q4_k, array<i64: 2, 256>>
  %1 = "poot.dequantize"(%0) : (!poot.packed<#poot.q4_k, array<i64: 2, 256>>) -> tensor<2x256xf16>
  return %1 : tensor<2x256xf16>
}

// -----

// CHECK-LABEL: func.func @packed_q5_k(
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.packed_param"() {name = "w_q5_k"} : () -> !poot.packed<#poot.q5_k, array<i64: 3, 512>>
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.dequantize"(%{{[a-z0-9_]+}}) : (!poot.packed<#poot.q5_k, array<i64: 3, 512>>) -> tensor<3x512xf32>
// CHECK-NEXT: return
func.func @packed_q5_k() -> tensor<3x512xf32> {
  %0 = "poot.packed_param"() {name = "w_q5_k"} : () -> !poot.packed<#poot.q5_k, array<i64: 3, 512>>
  %1 = "poot.dequantize"(%0) : (!poot.packed<#poot.q5_k, array<i64: 3, 512>>) -> tensor<3x512xf32>
  return %1 : tensor<3x512xf32>
}

// -----

// CHECK-LABEL: func.func @packed_q6_k(
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.packed_param"() {name = "w_q6_k"} : () -> !poot.packed<#poot.q6_k, array<i64: 1, 256>>
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.dequantize"(%{{[a-z0-9_]+}}) : (!poot.packed<#poot.q6_k, array<i64: 1, 256>>) -> tensor<1x256xbf16>
// CHECK-NEXT: return
func.func @packed_q6_k() -> tensor<1x256xbf16> {
  %0 = "poot.packed_param"() {name = "w_q6_k"} : () -> !poot.packed<#poot.q6_k, array<i64: 1, 256>>
  %1 = "poot.dequantize"(%0) : (!poot.packed<#poot.q6_k, array<i64: 1, 256>>) -> tensor<1x256xbf16>
  return %1 : tensor<1x256xbf16>
}

// -----

// CHECK-LABEL: func.func @packed_rank3_batched(
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.packed_param"() {name = "experts"} : () -> !poot.packed<#poot.q4_k, array<i64: 4, 8, 256>>
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.dequantize"(%{{[a-z0-9_]+}}) : (!poot.packed<#poot.q4_k, array<i64: 4, 8, 256>>) -> tensor<4x8x256xf32>
// CHECK-NEXT: return
func.func @packed_rank3_batched() -> tensor<4x8x256xf32> {
  %0 = "poot.packed_param"() {name = "experts"} : () -> !poot.packed<#poot.q4_k, array<i64: 4, 8, 256>>
  %1 = "poot.dequantize"(%0) : (!poot.packed<#poot.q4_k, array<i64: 4, 8, 256>>) -> tensor<4x8x256xf32>
  return %1 : tensor<4x8x256xf32>
}

// -----

// CHECK-LABEL: func.func @packed_function_argument(
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.dequantize"(%{{[a-z0-9_]+}}) : (!poot.packed<#poot.q8_0, array<i64: 4, 64>>) -> tensor<4x64xf16>
// CHECK-NEXT: return
func.func @packed_function_argument(%p: !poot.packed<#poot.q8_0, array<i64: 4, 64>>) -> tensor<4x64xf16> {
  %0 = "poot.dequantize"(%p) : (!poot.packed<#poot.q8_0, array<i64: 4, 64>>) -> tensor<4x64xf16>
  return %0 : tensor<4x64xf16>
}

// -----

// CHECK-LABEL: func.func @constant_dense_f32(
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.constant"() {value = dense<[1.000000e+00, -2.500000e+00, 3.000000e+00]> : tensor<3xf32>} : () -> tensor<3xf32>
// CHECK-NEXT: return
func.func @constant_dense_f32() -> tensor<3xf32> {
  %0 = "poot.constant"() {value = dense<[1.000000e+00, -2.500000e+00, 3.000000e+00]> : tensor<3xf32>} : () -> tensor<3xf32>
  return %0 : tensor<3xf32>
}

// -----

// CHECK-LABEL: func.func @constant_splat_rank0_and_2d(
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.constant"() {value = dense<0.000000e+00> : tensor<f32>} : () -> tensor<f32>
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.constant"() {value = dense<7> : tensor<2x3xi64>} : () -> tensor<2x3xi64>
// CHECK-NEXT: return
func.func @constant_splat_rank0_and_2d() -> tensor<2x3xi64> {
  %0 = "poot.constant"() {value = dense<0.000000e+00> : tensor<f32>} : () -> tensor<f32>
  %1 = "poot.constant"() {value = dense<7> : tensor<2x3xi64>} : () -> tensor<2x3xi64>
  return %1 : tensor<2x3xi64>
}

// -----

// CHECK-LABEL: func.func @constant_ints_bools_f16(
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.constant"() {value = dense<{{\[\[}}1, -2], [3, 4{{\]\]}}> : tensor<2x2xi32>} : () -> tensor<2x2xi32>
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.constant"() {value = dense<[true, false]> : tensor<2xi1>} : () -> tensor<2xi1>
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.constant"() {value = dense<-128> : tensor<4xi8>} : () -> tensor<4xi8>
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.constant"() {value = dense<[5.000000e-01, 1.000000e+00]> : tensor<2xf16>} : () -> tensor<2xf16>
// CHECK-NEXT: return
func.func @constant_ints_bools_f16() -> tensor<2xf16> {
  %0 = "poot.constant"() {value = dense<[[1, -2], [3, 4]]> : tensor<2x2xi32>} : () -> tensor<2x2xi32>
  %1 = "poot.constant"() {value = dense<[true, false]> : tensor<2xi1>} : () -> tensor<2xi1>
  %2 = "poot.constant"() {value = dense<-128> : tensor<4xi8>} : () -> tensor<4xi8>
  %3 = "poot.constant"() {value = dense<[5.000000e-01, 1.000000e+00]> : tensor<2xf16>} : () -> tensor<2xf16>
  return %3 : tensor<2xf16>
}

// -----

// CHECK-LABEL: func.func @iota(
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.iota"() {axis = 0 : i64} : () -> tensor<8xi32>
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.iota"() {axis = 1 : i64} : () -> tensor<2x8xf32>
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.iota"() {axis = 0 : i64} : () -> tensor<5x3xi64>
// CHECK-NEXT: return
func.func @iota() -> tensor<2x8xf32> {
  %0 = "poot.iota"() {axis = 0 : i64} : () -> tensor<8xi32>
  %1 = "poot.iota"() {axis = 1 : i64} : () -> tensor<2x8xf32>
  %2 = "poot.iota"() {axis = 0 : i64} : () -> tensor<5x3xi64>
  return %1 : tensor<2x8xf32>
}

// -----

// CHECK-LABEL: func.func @unary_neg(
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.unary"(%{{[a-z0-9_]+}}) {fn = "neg"} : (tensor<2x4xf32>) -> tensor<2x4xf32>
// CHECK-NEXT: return
func.func @unary_neg(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {
  %0 = "poot.unary"(%x) {fn = "neg"} : (tensor<2x4xf32>) -> tensor<2x4xf32>
  return %0 : tensor<2x4xf32>
}

// -----

// CHECK-LABEL: func.func @unary_abs(
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.unary"(%{{[a-z0-9_]+}}) {fn = "abs"} : (tensor<2x4xi32>) -> tensor<2x4xi32>
// CHECK-NEXT: return
func.func @unary_abs(%x: tensor<2x4xi32>) -> tensor<2x4xi32> {
  %0 = "poot.unary"(%x) {fn = "abs"} : (tensor<2x4xi32>) -> tensor<2x4xi32>
  return %0 : tensor<2x4xi32>
}

// -----

// CHECK-LABEL: func.func @unary_exp(
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.unary"(%{{[a-z0-9_]+}}) {fn = "exp"} : (tensor<2x4xf32>) -> tensor<2x4xf32>
// CHECK-NEXT: return
func.func @unary_exp(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {
  %0 = "poot.unary"(%x) {fn = "exp"} : (tensor<2x4xf32>) -> tensor<2x4xf32>
  return %0 : tensor<2x4xf32>
}

// -----

// CHECK-LABEL: func.func @unary_log(
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.unary"(%{{[a-z0-9_]+}}) {fn = "log"} : (tensor<2x4xf16>) -> tensor<2x4xf16>
// CHECK-NEXT: return
func.func @unary_log(%x: tensor<2x4xf16>) -> tensor<2x4xf16> {
  %0 = "poot.unary"(%x) {fn = "log"} : (tensor<2x4xf16>) -> tensor<2x4xf16>
  return %0 : tensor<2x4xf16>
}

// -----

// CHECK-LABEL: func.func @unary_sqrt(
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.unary"(%{{[a-z0-9_]+}}) {fn = "sqrt"} : (tensor<2x4xf32>) -> tensor<2x4xf32>
// CHECK-NEXT: return
func.func @unary_sqrt(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {
  %0 = "poot.unary"(%x) {fn = "sqrt"} : (tensor<2x4xf32>) -> tensor<2x4xf32>
  return %0 : tensor<2x4xf32>
}

// -----

// CHECK-LABEL: func.func @unary_rsqrt(
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.unary"(%{{[a-z0-9_]+}}) {fn = "rsqrt"} : (tensor<2x4xbf16>) -> tensor<2x4xbf16>
// CHECK-NEXT: return
func.func @unary_rsqrt(%x: tensor<2x4xbf16>) -> tensor<2x4xbf16> {
  %0 = "poot.unary"(%x) {fn = "rsqrt"} : (tensor<2x4xbf16>) -> tensor<2x4xbf16>
  return %0 : tensor<2x4xbf16>
}

// -----

// CHECK-LABEL: func.func @unary_tanh(
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.unary"(%{{[a-z0-9_]+}}) {fn = "tanh"} : (tensor<2x4xf32>) -> tensor<2x4xf32>
// CHECK-NEXT: return
func.func @unary_tanh(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {
  %0 = "poot.unary"(%x) {fn = "tanh"} : (tensor<2x4xf32>) -> tensor<2x4xf32>
  return %0 : tensor<2x4xf32>
}

// -----

// CHECK-LABEL: func.func @unary_erf(
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.unary"(%{{[a-z0-9_]+}}) {fn = "erf"} : (tensor<2x4xf32>) -> tensor<2x4xf32>
// CHECK-NEXT: return
func.func @unary_erf(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {
  %0 = "poot.unary"(%x) {fn = "erf"} : (tensor<2x4xf32>) -> tensor<2x4xf32>
  return %0 : tensor<2x4xf32>
}

// -----

// CHECK-LABEL: func.func @unary_sin(
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.unary"(%{{[a-z0-9_]+}}) {fn = "sin"} : (tensor<2x4xf32>) -> tensor<2x4xf32>
// CHECK-NEXT: return
func.func @unary_sin(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {
  %0 = "poot.unary"(%x) {fn = "sin"} : (tensor<2x4xf32>) -> tensor<2x4xf32>
  return %0 : tensor<2x4xf32>
}

// -----

// CHECK-LABEL: func.func @unary_cos(
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.unary"(%{{[a-z0-9_]+}}) {fn = "cos"} : (tensor<2x4xf32>) -> tensor<2x4xf32>
// CHECK-NEXT: return
func.func @unary_cos(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {
  %0 = "poot.unary"(%x) {fn = "cos"} : (tensor<2x4xf32>) -> tensor<2x4xf32>
  return %0 : tensor<2x4xf32>
}

// -----

// CHECK-LABEL: func.func @unary_floor(
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.unary"(%{{[a-z0-9_]+}}) {fn = "floor"} : (tensor<2x4xf32>) -> tensor<2x4xf32>
// CHECK-NEXT: return
func.func @unary_floor(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {
  %0 = "poot.unary"(%x) {fn = "floor"} : (tensor<2x4xf32>) -> tensor<2x4xf32>
  return %0 : tensor<2x4xf32>
}

// -----

// CHECK-LABEL: func.func @unary_not(
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.unary"(%{{[a-z0-9_]+}}) {fn = "not"} : (tensor<2x4xi1>) -> tensor<2x4xi1>
// CHECK-NEXT: return
func.func @unary_not(%x: tensor<2x4xi1>) -> tensor<2x4xi1> {
  %0 = "poot.unary"(%x) {fn = "not"} : (tensor<2x4xi1>) -> tensor<2x4xi1>
  return %0 : tensor<2x4xi1>
}

// -----

// CHECK-LABEL: func.func @binary_add(
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.binary"(%{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}) {fn = "add"} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
// CHECK-NEXT: return
func.func @binary_add(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
  %0 = "poot.binary"(%a, %b) {fn = "add"} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// CHECK-LABEL: func.func @binary_sub(
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.binary"(%{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}) {fn = "sub"} : (tensor<4xi64>, tensor<4xi64>) -> tensor<4xi64>
// CHECK-NEXT: return
func.func @binary_sub(%a: tensor<4xi64>, %b: tensor<4xi64>) -> tensor<4xi64> {
  %0 = "poot.binary"(%a, %b) {fn = "sub"} : (tensor<4xi64>, tensor<4xi64>) -> tensor<4xi64>
  return %0 : tensor<4xi64>
}

// -----

// CHECK-LABEL: func.func @binary_mul(
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.binary"(%{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}) {fn = "mul"} : (tensor<4xbf16>, tensor<4xbf16>) -> tensor<4xbf16>
// CHECK-NEXT: return
func.func @binary_mul(%a: tensor<4xbf16>, %b: tensor<4xbf16>) -> tensor<4xbf16> {
  %0 = "poot.binary"(%a, %b) {fn = "mul"} : (tensor<4xbf16>, tensor<4xbf16>) -> tensor<4xbf16>
  return %0 : tensor<4xbf16>
}

// -----

// CHECK-LABEL: func.func @binary_div(
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.binary"(%{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}) {fn = "div"} : (tensor<4xi32>, tensor<4xi32>) -> tensor<4xi32>
// CHECK-NEXT: return
func.func @binary_div(%a: tensor<4xi32>, %b: tensor<4xi32>) -> tensor<4xi32> {
  %0 = "poot.binary"(%a, %b) {fn = "div"} : (tensor<4xi32>, tensor<4xi32>) -> tensor<4xi32>
  return %0 : tensor<4xi32>
}

// -----

// CHECK-LABEL: func.func @binary_max(
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.binary"(%{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}) {fn = "max"} : (tensor<4xf16>, tensor<4xf16>) -> tensor<4xf16>
// CHECK-NEXT: return
func.func @binary_max(%a: tensor<4xf16>, %b: tensor<4xf16>) -> tensor<4xf16> {
  %0 = "poot.binary"(%a, %b) {fn = "max"} : (tensor<4xf16>, tensor<4xf16>) -> tensor<4xf16>
  return %0 : tensor<4xf16>
}

// -----

// CHECK-LABEL: func.func @binary_min(
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.binary"(%{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}) {fn = "min"} : (tensor<4xi8>, tensor<4xi8>) -> tensor<4xi8>
// CHECK-NEXT: return
func.func @binary_min(%a: tensor<4xi8>, %b: tensor<4xi8>) -> tensor<4xi8> {
  %0 = "poot.binary"(%a, %b) {fn = "min"} : (tensor<4xi8>, tensor<4xi8>) -> tensor<4xi8>
  return %0 : tensor<4xi8>
}

// -----

// CHECK-LABEL: func.func @binary_pow(
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.binary"(%{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}) {fn = "pow"} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
// CHECK-NEXT: return
func.func @binary_pow(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
  %0 = "poot.binary"(%a, %b) {fn = "pow"} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// CHECK-LABEL: func.func @binary_and(
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.binary"(%{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}) {fn = "and"} : (tensor<4xi1>, tensor<4xi1>) -> tensor<4xi1>
// CHECK-NEXT: return
func.func @binary_and(%a: tensor<4xi1>, %b: tensor<4xi1>) -> tensor<4xi1> {
  %0 = "poot.binary"(%a, %b) {fn = "and"} : (tensor<4xi1>, tensor<4xi1>) -> tensor<4xi1>
  return %0 : tensor<4xi1>
}

// -----

// CHECK-LABEL: func.func @binary_or(
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.binary"(%{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}) {fn = "or"} : (tensor<4xi1>, tensor<4xi1>) -> tensor<4xi1>
// CHECK-NEXT: return
func.func @binary_or(%a: tensor<4xi1>, %b: tensor<4xi1>) -> tensor<4xi1> {
  %0 = "poot.binary"(%a, %b) {fn = "or"} : (tensor<4xi1>, tensor<4xi1>) -> tensor<4xi1>
  return %0 : tensor<4xi1>
}

// -----

// CHECK-LABEL: func.func @ternary_fma(
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.ternary"(%{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}) {fn = "fma"} : (tensor<3x5xf32>, tensor<3x5xf32>, tensor<3x5xf32>) -> tensor<3x5xf32>
// CHECK-NEXT: return
func.func @ternary_fma(%a: tensor<3x5xf32>, %b: tensor<3x5xf32>, %c: tensor<3x5xf32>) -> tensor<3x5xf32> {
  %0 = "poot.ternary"(%a, %b, %c) {fn = "fma"} : (tensor<3x5xf32>, tensor<3x5xf32>, tensor<3x5xf32>) -> tensor<3x5xf32>
  return %0 : tensor<3x5xf32>
}

// -----

// CHECK-LABEL: func.func @ternary_clamp(
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.ternary"(%{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}) {fn = "clamp"} : (tensor<3x5xi32>, tensor<3x5xi32>, tensor<3x5xi32>) -> tensor<3x5xi32>
// CHECK-NEXT: return
func.func @ternary_clamp(%a: tensor<3x5xi32>, %b: tensor<3x5xi32>, %c: tensor<3x5xi32>) -> tensor<3x5xi32> {
  %0 = "poot.ternary"(%a, %b, %c) {fn = "clamp"} : (tensor<3x5xi32>, tensor<3x5xi32>, tensor<3x5xi32>) -> tensor<3x5xi32>
  return %0 : tensor<3x5xi32>
}

// -----

// CHECK-LABEL: func.func @compare_eq(
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.compare"(%{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}) {pred = "eq"} : (tensor<6xi32>, tensor<6xi32>) -> tensor<6xi1>
// CHECK-NEXT: return
func.func @compare_eq(%a: tensor<6xi32>, %b: tensor<6xi32>) -> tensor<6xi1> {
  %0 = "poot.compare"(%a, %b) {pred = "eq"} : (tensor<6xi32>, tensor<6xi32>) -> tensor<6xi1>
  return %0 : tensor<6xi1>
}

// -----

// CHECK-LABEL: func.func @compare_ne(
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.compare"(%{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}) {pred = "ne"} : (tensor<6xf32>, tensor<6xf32>) -> tensor<6xi1>
// CHECK-NEXT: return
func.func @compare_ne(%a: tensor<6xf32>, %b: tensor<6xf32>) -> tensor<6xi1> {
  %0 = "poot.compare"(%a, %b) {pred = "ne"} : (tensor<6xf32>, tensor<6xf32>) -> tensor<6xi1>
  return %0 : tensor<6xi1>
}

// -----

// CHECK-LABEL: func.func @compare_lt(
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.compare"(%{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}) {pred = "lt"} : (tensor<6xf16>, tensor<6xf16>) -> tensor<6xi1>
// CHECK-NEXT: return
func.func @compare_lt(%a: tensor<6xf16>, %b: tensor<6xf16>) -> tensor<6xi1> {
  %0 = "poot.compare"(%a, %b) {pred = "lt"} : (tensor<6xf16>, tensor<6xf16>) -> tensor<6xi1>
  return %0 : tensor<6xi1>
}

// -----

// CHECK-LABEL: func.func @compare_le(
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.compare"(%{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}) {pred = "le"} : (tensor<6xbf16>, tensor<6xbf16>) -> tensor<6xi1>
// CHECK-NEXT: return
func.func @compare_le(%a: tensor<6xbf16>, %b: tensor<6xbf16>) -> tensor<6xi1> {
  %0 = "poot.compare"(%a, %b) {pred = "le"} : (tensor<6xbf16>, tensor<6xbf16>) -> tensor<6xi1>
  return %0 : tensor<6xi1>
}

// -----

// CHECK-LABEL: func.func @compare_gt(
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.compare"(%{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}) {pred = "gt"} : (tensor<6xi64>, tensor<6xi64>) -> tensor<6xi1>
// CHECK-NEXT: return
func.func @compare_gt(%a: tensor<6xi64>, %b: tensor<6xi64>) -> tensor<6xi1> {
  %0 = "poot.compare"(%a, %b) {pred = "gt"} : (tensor<6xi64>, tensor<6xi64>) -> tensor<6xi1>
  return %0 : tensor<6xi1>
}

// -----

// CHECK-LABEL: func.func @compare_ge(
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.compare"(%{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}) {pred = "ge"} : (tensor<6xi1>, tensor<6xi1>) -> tensor<6xi1>
// CHECK-NEXT: return
func.func @compare_ge(%a: tensor<6xi1>, %b: tensor<6xi1>) -> tensor<6xi1> {
  %0 = "poot.compare"(%a, %b) {pred = "ge"} : (tensor<6xi1>, tensor<6xi1>) -> tensor<6xi1>
  return %0 : tensor<6xi1>
}

// -----

// CHECK-LABEL: func.func @select(
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.select"(%{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}) : (tensor<2x3xi1>, tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32>
// CHECK-NEXT: return
func.func @select(%c: tensor<2x3xi1>, %a: tensor<2x3xf32>, %b: tensor<2x3xf32>) -> tensor<2x3xf32> {
  %0 = "poot.select"(%c, %a, %b) : (tensor<2x3xi1>, tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32>
  return %0 : tensor<2x3xf32>
}

// -----

// CHECK-LABEL: func.func @cast(
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.cast"(%{{[a-z0-9_]+}}) : (tensor<4xf32>) -> tensor<4xbf16>
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.cast"(%{{[a-z0-9_]+}}) : (tensor<4xf32>) -> tensor<4xf16>
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.cast"(%{{[a-z0-9_]+}}) : (tensor<4xbf16>) -> tensor<4xf32>
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.cast"(%{{[a-z0-9_]+}}) : (tensor<4xf32>) -> tensor<4xi32>
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.cast"(%{{[a-z0-9_]+}}) : (tensor<4xi64>) -> tensor<4xf32>
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.cast"(%{{[a-z0-9_]+}}) : (tensor<4xi32>) -> tensor<4xi1>
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.cast"(%{{[a-z0-9_]+}}) : (tensor<4xi1>) -> tensor<4xf32>
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.cast"(%{{[a-z0-9_]+}}) : (tensor<4xi8>) -> tensor<4xi64>
// CHECK-NEXT: return
func.func @cast(%xf32: tensor<4xf32>, %xbf16: tensor<4xbf16>, %xi64: tensor<4xi64>, %xi32: tensor<4xi32>, %xi1: tensor<4xi1>, %xi8: tensor<4xi8>) -> tensor<4xi64> {
  %0 = "poot.cast"(%xf32) : (tensor<4xf32>) -> tensor<4xbf16>
  %1 = "poot.cast"(%xf32) : (tensor<4xf32>) -> tensor<4xf16>
  %2 = "poot.cast"(%xbf16) : (tensor<4xbf16>) -> tensor<4xf32>
  %3 = "poot.cast"(%xf32) : (tensor<4xf32>) -> tensor<4xi32>
  %4 = "poot.cast"(%xi64) : (tensor<4xi64>) -> tensor<4xf32>
  %5 = "poot.cast"(%xi32) : (tensor<4xi32>) -> tensor<4xi1>
  %6 = "poot.cast"(%xi1) : (tensor<4xi1>) -> tensor<4xf32>
  %7 = "poot.cast"(%xi8) : (tensor<4xi8>) -> tensor<4xi64>
  return %7 : tensor<4xi64>
}

// -----

// CHECK-LABEL: func.func @reduce(
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.reduce"(%{{[a-z0-9_]+}}) {axes = array<i64: 2>, fn = "sum"} : (tensor<2x3x4xf32>) -> tensor<2x3xf32>
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.reduce"(%{{[a-z0-9_]+}}) {axes = array<i64: 0, 2>, fn = "max"} : (tensor<2x3x4xf32>) -> tensor<3xf32>
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.reduce"(%{{[a-z0-9_]+}}) {axes = array<i64: 0, 1, 2>, fn = "min"} : (tensor<2x3x4xf32>) -> tensor<f32>
// CHECK-NEXT: return
func.func @reduce(%x: tensor<2x3x4xf32>) -> tensor<f32> {
  %0 = "poot.reduce"(%x) {axes = array<i64: 2>, fn = "sum"} : (tensor<2x3x4xf32>) -> tensor<2x3xf32>
  %1 = "poot.reduce"(%x) {axes = array<i64: 0, 2>, fn = "max"} : (tensor<2x3x4xf32>) -> tensor<3xf32>
  %2 = "poot.reduce"(%x) {axes = array<i64: 0, 1, 2>, fn = "min"} : (tensor<2x3x4xf32>) -> tensor<f32>
  return %2 : tensor<f32>
}

// -----

// CHECK-LABEL: func.func @broadcast(
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.broadcast"(%{{[a-z0-9_]+}}) {dims = array<i64: 1>} : (tensor<3xf32>) -> tensor<2x3x5xf32>
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.broadcast"(%{{[a-z0-9_]+}}) {dims = array<i64: 0, 2>} : (tensor<1x4xi32>) -> tensor<6x7x4xi32>
// CHECK-NEXT: return
func.func @broadcast(%x: tensor<3xf32>, %y: tensor<1x4xi32>) -> tensor<2x3x5xf32> {
  %0 = "poot.broadcast"(%x) {dims = array<i64: 1>} : (tensor<3xf32>) -> tensor<2x3x5xf32>
  %1 = "poot.broadcast"(%y) {dims = array<i64: 0, 2>} : (tensor<1x4xi32>) -> tensor<6x7x4xi32>
  return %0 : tensor<2x3x5xf32>
}

// -----

// CHECK-LABEL: func.func @broadcast_scalar(
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.broadcast"(%{{[a-z0-9_]+}}) {dims = array<i64>} : (tensor<f16>) -> tensor<2x2xf16>
// CHECK-NEXT: return
func.func @broadcast_scalar(%s: tensor<f16>) -> tensor<2x2xf16> {
  %0 = "poot.broadcast"(%s) {dims = array<i64>} : (tensor<f16>) -> tensor<2x2xf16>
  return %0 : tensor<2x2xf16>
}

// -----

// CHECK-LABEL: func.func @reshape(
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.reshape"(%{{[a-z0-9_]+}}) : (tensor<2x3x4xbf16>) -> tensor<6x4xbf16>
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.reshape"(%{{[a-z0-9_]+}}) : (tensor<6x4xbf16>) -> tensor<24xbf16>
// CHECK-NEXT: return
func.func @reshape(%x: tensor<2x3x4xbf16>) -> tensor<24xbf16> {
  %0 = "poot.reshape"(%x) : (tensor<2x3x4xbf16>) -> tensor<6x4xbf16>
  %1 = "poot.reshape"(%0) : (tensor<6x4xbf16>) -> tensor<24xbf16>
  return %1 : tensor<24xbf16>
}

// -----

// CHECK-LABEL: func.func @transpose(
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.transpose"(%{{[a-z0-9_]+}}) {perm = array<i64: 2, 0, 1>} : (tensor<2x3x4xf32>) -> tensor<4x2x3xf32>
// CHECK-NEXT: return
func.func @transpose(%x: tensor<2x3x4xf32>) -> tensor<4x2x3xf32> {
  %0 = "poot.transpose"(%x) {perm = array<i64: 2, 0, 1>} : (tensor<2x3x4xf32>) -> tensor<4x2x3xf32>
  return %0 : tensor<4x2x3xf32>
}

// -----

// CHECK-LABEL: func.func @slice(
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.slice"(%{{[a-z0-9_]+}}) {limit = array<i64: 7, 6>, start = array<i64: 1, 0>, stride = array<i64: 2, 3>} : (tensor<8x6xf32>) -> tensor<3x2xf32>
// CHECK-NEXT: return
func.func @slice(%x: tensor<8x6xf32>) -> tensor<3x2xf32> {
  %0 = "poot.slice"(%x) {limit = array<i64: 7, 6>, start = array<i64: 1, 0>, stride = array<i64: 2, 3>} : (tensor<8x6xf32>) -> tensor<3x2xf32>
  return %0 : tensor<3x2xf32>
}

// -----

// poot.concat is binary; longer concatenations are chains (as Builder.concat emits them).
// Operands of different sizes along the axis: see dialect-roundtrip-concat-sizes.mlir.
// CHECK-LABEL: func.func @concat(
// CHECK-NEXT: %[[C0:[a-z0-9_]+]] = "poot.concat"(%{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}) {axis = 1 : i64} : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x6xf32>
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.concat"(%[[C0]], %{{[a-z0-9_]+}}) {axis = 1 : i64} : (tensor<2x6xf32>, tensor<2x3xf32>) -> tensor<2x9xf32>
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.concat"(%{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}) {axis = 0 : i64} : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<4x3xf32>
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.concat"(%{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}) {axis = 0 : i64} : (tensor<4x2xi32>, tensor<4x2xi32>) -> tensor<8x2xi32>
// CHECK-NEXT: return
func.func @concat(%a: tensor<2x3xf32>, %b: tensor<2x3xf32>, %c: tensor<4x2xi32>) -> tensor<2x9xf32> {
  %0 = "poot.concat"(%a, %b) {axis = 1 : i64} : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x6xf32>
  %1 = "poot.concat"(%0, %a) {axis = 1 : i64} : (tensor<2x6xf32>, tensor<2x3xf32>) -> tensor<2x9xf32>
  %2 = "poot.concat"(%a, %b) {axis = 0 : i64} : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<4x3xf32>
  %3 = "poot.concat"(%c, %c) {axis = 0 : i64} : (tensor<4x2xi32>, tensor<4x2xi32>) -> tensor<8x2xi32>
  return %1 : tensor<2x9xf32>
}

// -----

// CHECK-LABEL: func.func @matmul(
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.matmul"(%{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}) {acc = f32} : (tensor<4x8xf32>, tensor<8x2xf32>) -> tensor<4x2xf32>
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.matmul"(%{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}) {acc = f32} : (tensor<3x4x8xbf16>, tensor<3x8x5xbf16>) -> tensor<3x4x5xbf16>
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.matmul"(%{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}) {acc = i32} : (tensor<2x16xi8>, tensor<16x4xi8>) -> tensor<2x4xi32>
// CHECK-NEXT: return
func.func @matmul(%a: tensor<4x8xf32>, %b: tensor<8x2xf32>, %c: tensor<3x4x8xbf16>, %d: tensor<3x8x5xbf16>, %e: tensor<2x16xi8>, %f: tensor<16x4xi8>) -> tensor<2x4xi32> {
  %0 = "poot.matmul"(%a, %b) {acc = f32} : (tensor<4x8xf32>, tensor<8x2xf32>) -> tensor<4x2xf32>
  %1 = "poot.matmul"(%c, %d) {acc = f32} : (tensor<3x4x8xbf16>, tensor<3x8x5xbf16>) -> tensor<3x4x5xbf16>
  %2 = "poot.matmul"(%e, %f) {acc = i32} : (tensor<2x16xi8>, tensor<16x4xi8>) -> tensor<2x4xi32>
  return %2 : tensor<2x4xi32>
}

// -----

// CHECK-LABEL: func.func @indexed_matmul(
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.indexed_matmul"(%{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}) {acc = f32} : (tensor<6x8xf32>, tensor<4x3x8xf32>, tensor<6xi32>) -> tensor<6x3xf32>
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.indexed_matmul"(%{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}) {acc = f32} : (tensor<6x8xf32>, tensor<4x3x8xbf16>, tensor<6xi64>) -> tensor<6x3xf32>
// CHECK-NEXT: return
func.func @indexed_matmul(%x: tensor<6x8xf32>, %w: tensor<4x3x8xf32>, %h: tensor<4x3x8xbf16>, %i: tensor<6xi32>, %j: tensor<6xi64>) -> tensor<6x3xf32> {
  %0 = "poot.indexed_matmul"(%x, %w, %i) {acc = f32} : (tensor<6x8xf32>, tensor<4x3x8xf32>, tensor<6xi32>) -> tensor<6x3xf32>
  %1 = "poot.indexed_matmul"(%x, %h, %j) {acc = f32} : (tensor<6x8xf32>, tensor<4x3x8xbf16>, tensor<6xi64>) -> tensor<6x3xf32>
  return %1 : tensor<6x3xf32>
}

// -----

// CHECK-LABEL: func.func @gather(
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.gather"(%{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}) {axis = 0 : i64} : (tensor<100x16xf32>, tensor<1x5xi64>) -> tensor<1x5x16xf32>
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.gather"(%{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}) {axis = 1 : i64} : (tensor<100x16xf32>, tensor<3xi32>) -> tensor<100x3xf32>
// CHECK-NEXT: return
func.func @gather(%t: tensor<100x16xf32>, %i: tensor<1x5xi64>, %j: tensor<3xi32>) -> tensor<1x5x16xf32> {
  %0 = "poot.gather"(%t, %i) {axis = 0 : i64} : (tensor<100x16xf32>, tensor<1x5xi64>) -> tensor<1x5x16xf32>
  %1 = "poot.gather"(%t, %j) {axis = 1 : i64} : (tensor<100x16xf32>, tensor<3xi32>) -> tensor<100x3xf32>
  return %0 : tensor<1x5x16xf32>
}

// -----

// CHECK-LABEL: func.func @scatter(
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.scatter"(%{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}) : (tensor<2x64x8xf16>, tensor<3x2xi64>, tensor<3x8xf16>) -> tensor<2x64x8xf16>
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.scatter"(%{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}) : (tensor<2x64x8xf16>, tensor<1x1xi32>, tensor<1x64x8xf16>) -> tensor<2x64x8xf16>
// CHECK-NEXT: return
func.func @scatter(%kv: tensor<2x64x8xf16>, %i: tensor<3x2xi64>, %u: tensor<3x8xf16>, %i1: tensor<1x1xi32>, %u1: tensor<1x64x8xf16>) -> tensor<2x64x8xf16> {
  %0 = "poot.scatter"(%kv, %i, %u) : (tensor<2x64x8xf16>, tensor<3x2xi64>, tensor<3x8xf16>) -> tensor<2x64x8xf16>
  %1 = "poot.scatter"(%0, %i1, %u1) : (tensor<2x64x8xf16>, tensor<1x1xi32>, tensor<1x64x8xf16>) -> tensor<2x64x8xf16>
  return %1 : tensor<2x64x8xf16>
}

// -----

// poot.attention (pass-introduced fused form): i1 visible mask, and a GQA-shaped bf16 case with
// an f32 bias mask broadcast from all-ones dims and a soft cap.
// CHECK-LABEL: func.func @attention(
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.attention"(%{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}) {scale = 0.35355339059327379 : f64, softcap = 0.000000e+00 : f64} : (tensor<2x4x8xf32>, tensor<2x6x8xf32>, tensor<2x6x3xf32>, tensor<1x4x6xi1>) -> tensor<2x4x3xf32>
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.attention"(%{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}) {scale = 5.000000e-01 : f64, softcap = 5.000000e+01 : f64} : (tensor<1x2x2x5x4xbf16>, tensor<1x2x7x4xbf16>, tensor<1x2x7x4xbf16>, tensor<1x1x1x1x7xf32>) -> tensor<1x2x2x5x4xf32>
// CHECK-NEXT: return
func.func @attention(%q: tensor<2x4x8xf32>, %k: tensor<2x6x8xf32>, %v: tensor<2x6x3xf32>, %m: tensor<1x4x6xi1>, %qb: tensor<1x2x2x5x4xbf16>, %kb: tensor<1x2x7x4xbf16>, %vb: tensor<1x2x7x4xbf16>, %bias: tensor<1x1x1x1x7xf32>) -> tensor<2x4x3xf32> {
  %0 = "poot.attention"(%q, %k, %v, %m) {scale = 0.35355339059327379 : f64, softcap = 0.0 : f64} : (tensor<2x4x8xf32>, tensor<2x6x8xf32>, tensor<2x6x3xf32>, tensor<1x4x6xi1>) -> tensor<2x4x3xf32>
  %1 = "poot.attention"(%qb, %kb, %vb, %bias) {scale = 5.000000e-01 : f64, softcap = 5.000000e+01 : f64} : (tensor<1x2x2x5x4xbf16>, tensor<1x2x7x4xbf16>, tensor<1x2x7x4xbf16>, tensor<1x1x1x1x7xf32>) -> tensor<1x2x2x5x4xf32>
  return %0 : tensor<2x4x3xf32>
}

// -----

// poot.paged_attention (pass-introduced): keys/values read through a [B, W] block table from
// [NB, bs, H, D] pools; f16 pools with an i1 mask, and f32 pools with a bias and a soft cap.
// CHECK-LABEL: func.func @paged_attention(
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.paged_attention"(%{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}) {scale = 1.250000e-01 : f64, softcap = 0.000000e+00 : f64} : (tensor<2x3x4x1x16xf32>, tensor<10x4x3x16xf16>, tensor<10x4x3x16xf16>, tensor<2x5xi32>, tensor<2x1x1x1x20xi1>) -> tensor<2x3x4x1x16xf32>
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.paged_attention"(%{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}) {scale = 5.000000e-01 : f64, softcap = 3.000000e+01 : f64} : (tensor<1x2x3x8xf32>, tensor<4x16x2x8xf32>, tensor<4x16x2x4xf32>, tensor<1x2xi32>, tensor<1x1x3x32xf32>) -> tensor<1x2x3x4xf32>
// CHECK-NEXT: return
func.func @paged_attention(%q: tensor<2x3x4x1x16xf32>, %kp: tensor<10x4x3x16xf16>, %vp: tensor<10x4x3x16xf16>, %bt: tensor<2x5xi32>, %m: tensor<2x1x1x1x20xi1>, %q2: tensor<1x2x3x8xf32>, %kp2: tensor<4x16x2x8xf32>, %vp2: tensor<4x16x2x4xf32>, %bt2: tensor<1x2xi32>, %bias: tensor<1x1x3x32xf32>) -> tensor<2x3x4x1x16xf32> {
  %0 = "poot.paged_attention"(%q, %kp, %vp, %bt, %m) {scale = 0.125 : f64, softcap = 0.0 : f64} : (tensor<2x3x4x1x16xf32>, tensor<10x4x3x16xf16>, tensor<10x4x3x16xf16>, tensor<2x5xi32>, tensor<2x1x1x1x20xi1>) -> tensor<2x3x4x1x16xf32>
  %1 = "poot.paged_attention"(%q2, %kp2, %vp2, %bt2, %bias) {scale = 0.5 : f64, softcap = 30.0 : f64} : (tensor<1x2x3x8xf32>, tensor<4x16x2x8xf32>, tensor<4x16x2x4xf32>, tensor<1x2xi32>, tensor<1x1x3x32xf32>) -> tensor<1x2x3x4xf32>
  return %0 : tensor<2x3x4x1x16xf32>
}

// -----

// poot.paged_attention over q8_0 pools: i8 values with their f16 scales (one per 32 values)
// as trailing operands, k's first; here a q8_0 k pool and an f16 v pool.
// CHECK-LABEL: func.func @paged_attention_q8_0(
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.paged_attention"(%{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}) {scale = 1.250000e-01 : f64, softcap = 0.000000e+00 : f64} : (tensor<1x2x3x64xf32>, tensor<4x16x2x64xi8>, tensor<4x16x2x64xf16>, tensor<1x2xi32>, tensor<1x1x3x32xi1>, tensor<4x16x2x2xf16>) -> tensor<1x2x3x64xf32>
// CHECK-NEXT: return
func.func @paged_attention_q8_0(%q: tensor<1x2x3x64xf32>, %kp: tensor<4x16x2x64xi8>, %vp: tensor<4x16x2x64xf16>, %bt: tensor<1x2xi32>, %m: tensor<1x1x3x32xi1>, %ks: tensor<4x16x2x2xf16>) -> tensor<1x2x3x64xf32> {
  %0 = "poot.paged_attention"(%q, %kp, %vp, %bt, %m, %ks) {scale = 0.125 : f64, softcap = 0.0 : f64} : (tensor<1x2x3x64xf32>, tensor<4x16x2x64xi8>, tensor<4x16x2x64xf16>, tensor<1x2xi32>, tensor<1x1x3x32xi1>, tensor<4x16x2x2xf16>) -> tensor<1x2x3x64xf32>
  return %0 : tensor<1x2x3x64xf32>
}

// -----

// poot.dequantize_q8_0: i8 values times their per-32 f16 scales.
// CHECK-LABEL: func.func @dequantize_q8_0(
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.dequantize_q8_0"(%{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}) : (tensor<2x3x64xi8>, tensor<2x3x2xf16>) -> tensor<2x3x64xf32>
// CHECK-NEXT: return
func.func @dequantize_q8_0(%v: tensor<2x3x64xi8>, %s: tensor<2x3x2xf16>) -> tensor<2x3x64xf32> {
  %0 = "poot.dequantize_q8_0"(%v, %s) : (tensor<2x3x64xi8>, tensor<2x3x2xf16>) -> tensor<2x3x64xf32>
  return %0 : tensor<2x3x64xf32>
}

// poot.quantize_fp8: f32 values over their per-head f32 scale as e4m3fn bit patterns.
// CHECK-LABEL: func.func @quantize_fp8(
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.quantize_fp8"(%{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}) : (tensor<2x3x64xf32>, tensor<2x3x1xf32>) -> tensor<2x3x64xi8>
// CHECK-NEXT: return
func.func @quantize_fp8(%x: tensor<2x3x64xf32>, %s: tensor<2x3x1xf32>) -> tensor<2x3x64xi8> {
  %0 = "poot.quantize_fp8"(%x, %s) : (tensor<2x3x64xf32>, tensor<2x3x1xf32>) -> tensor<2x3x64xi8>
  return %0 : tensor<2x3x64xi8>
}

// poot.dequantize_fp8: e4m3fn bit patterns times their per-head f32 scale.
// CHECK-LABEL: func.func @dequantize_fp8(
// CHECK-NEXT: %{{[a-z0-9_]+}} = "poot.dequantize_fp8"(%{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}) : (tensor<2x3x64xi8>, tensor<2x3x1xf32>) -> tensor<2x3x64xf32>
// CHECK-NEXT: return
func.func @dequantize_fp8(%v: tensor<2x3x64xi8>, %s: tensor<2x3x1xf32>) -> tensor<2x3x64xf32> {
  %0 = "poot.dequantize_fp8"(%v, %s) : (tensor<2x3x64xi8>, tensor<2x3x1xf32>) -> tensor<2x3x64xf32>
  return %0 : tensor<2x3x64xf32>
}
