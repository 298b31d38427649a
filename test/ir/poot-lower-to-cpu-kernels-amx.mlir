// poot-lower-to-cpu-kernels{amx=1}: packed matmuls with M >= 2 rows of x on AMX tiles. x is
// quantized per 32-block to int16 and split into bytes, h (signed) then l (unsigned), one
// row of tensor<Mpad x 2K x i8> (M = 20 rounded up to whole 16-row A tiles: 32); the 16 W
// rows of a tile are decoded into B tiles (8 x 64 bytes a block) and scale vectors on the
// stack (hoisted before the sequential W-tile loop); per block, two tile products (x's h
// signed times unsigned nibbles: zext on B; l unsigned: zext on both) stored to a C buffer,
// recombined as (h_sum << 8) + l_sum and scaled as the VNNI tile does.
// RUN: poot-opt %s --pass-pipeline='builtin.module(poot-lower-to-cpu-kernels{dot-bits=16 vnni=1 m-tile=4 amx=1},canonicalize)' | FileCheck %s

// CHECK-LABEL: func.func @gemm_q4_1(
// CHECK: arith.shr{{[su]}}i {{.*}} : vector<32xi16>
// CHECK: arith.trunci {{.*}} : vector<32xi16> to vector<32xi8>
// CHECK: vector.transfer_write {{.*}} : vector<32xi8>, tensor<32x128xi8>
// CHECK: bufferization.to_buffer {{.*}} : tensor<32x128xi8> to memref<32x128xi8>
// CHECK: memref.alloca() {alignment = 64 : i64} : memref<16x64xi8>
// CHECK: memref.alloca() {alignment = 64 : i64} : memref<32x16xi32>
// CHECK: scf.for
// CHECK: vector.store {{.*}} : memref<16x64xi8>, vector<64xi8>
// CHECK: amx.tile_load {{.*}} : memref<16x64xi8> into !amx.tile<8x64xi8>
// CHECK: amx.tile_muli %{{.*}}, %{{.*}} zext, %{{.*}} : !amx.tile<16x32xi8>, !amx.tile<8x64xi8>, !amx.tile<16x16xi32>
// CHECK: amx.tile_muli %{{.*}} zext, %{{.*}} zext, %{{.*}} : !amx.tile<16x32xi8>, !amx.tile<8x64xi8>, !amx.tile<16x16xi32>
// CHECK: arith.shli {{.*}} : vector<16xi32>
// CHECK: arith.sitofp {{.*}} : vector<16xi32> to vector<16xf32>
// CHECK: vector.transfer_write {{.*}} : vector<16xf32>, tensor<20x32xf32>
func.func @gemm_q4_1(%x: tensor<20x64xf32>) -> tensor<20x32xf32> {
  %0 = "poot.packed_param"() {name = "w"} : () -> !poot.packed<#poot.q4_1, array<i64: 32, 64>>
  %1 = "poot.dequantize"(%0) : (!poot.packed<#poot.q4_1, array<i64: 32, 64>>) -> tensor<32x64xf32>
  %2 = "poot.transpose"(%1) {perm = array<i64: 1, 0>} : (tensor<32x64xf32>) -> tensor<64x32xf32>
  %3 = "poot.matmul"(%x, %2) {acc = f32} : (tensor<20x64xf32>, tensor<64x32xf32>) -> tensor<20x32xf32>
  return %3 : tensor<20x32xf32>
}

// Q8_0 weights are signed: no zext on B. int8 x (one product a block) meets only Q4 on AMX.
// CHECK-LABEL: func.func @gemm_q8_0(
// CHECK: amx.tile_muli %{{.*}}, %{{.*}}, %{{.*}} : !amx.tile<16x32xi8>, !amx.tile<8x64xi8>, !amx.tile<16x16xi32>
// CHECK: amx.tile_muli %{{.*}} zext, %{{.*}}, %{{.*}} : !amx.tile<16x32xi8>, !amx.tile<8x64xi8>, !amx.tile<16x16xi32>
func.func @gemm_q8_0(%x: tensor<20x64xf32>) -> tensor<20x32xf32> {
  %0 = "poot.packed_param"() {name = "w"} : () -> !poot.packed<#poot.q8_0, array<i64: 32, 64>>
  %1 = "poot.dequantize"(%0) : (!poot.packed<#poot.q8_0, array<i64: 32, 64>>) -> tensor<32x64xf32>
  %2 = "poot.transpose"(%1) {perm = array<i64: 1, 0>} : (tensor<32x64xf32>) -> tensor<64x32xf32>
  %3 = "poot.matmul"(%x, %2) {acc = f32} : (tensor<20x64xf32>, tensor<64x32xf32>) -> tensor<20x32xf32>
  return %3 : tensor<20x32xf32>
}

// Fewer than 9 rows keep the VNNI kernels (M = 1 the lane-order GEMV, M = 8 the VNNI tile).
// CHECK-LABEL: func.func @gemv_q4_1(
// CHECK-NOT: amx.
// CHECK: return
func.func @gemv_q4_1(%x: tensor<1x64xf32>) -> tensor<1x32xf32> {
  %0 = "poot.packed_param"() {name = "w"} : () -> !poot.packed<#poot.q4_1, array<i64: 32, 64>>
  %1 = "poot.dequantize"(%0) : (!poot.packed<#poot.q4_1, array<i64: 32, 64>>) -> tensor<32x64xf32>
  %2 = "poot.transpose"(%1) {perm = array<i64: 1, 0>} : (tensor<32x64xf32>) -> tensor<64x32xf32>
  %3 = "poot.matmul"(%x, %2) {acc = f32} : (tensor<1x64xf32>, tensor<64x32xf32>) -> tensor<1x32xf32>
  return %3 : tensor<1x32xf32>
}

// CHECK-LABEL: func.func @gemm_8_rows(
// CHECK-NOT: amx.
// CHECK: vpdpwssd
// CHECK: return
func.func @gemm_8_rows(%x: tensor<8x64xf32>) -> tensor<8x32xf32> {
  %0 = "poot.packed_param"() {name = "w"} : () -> !poot.packed<#poot.q4_1, array<i64: 32, 64>>
  %1 = "poot.dequantize"(%0) : (!poot.packed<#poot.q4_1, array<i64: 32, 64>>) -> tensor<32x64xf32>
  %2 = "poot.transpose"(%1) {perm = array<i64: 1, 0>} : (tensor<32x64xf32>) -> tensor<64x32xf32>
  %3 = "poot.matmul"(%x, %2) {acc = f32} : (tensor<8x64xf32>, tensor<64x32xf32>) -> tensor<8x32xf32>
  return %3 : tensor<8x32xf32>
}
