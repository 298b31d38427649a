// poot-lower-to-cpu-kernels: matmuls that read a weight in place become the row-streaming
// vector kernel (no linalg.matmul, no dequantized copy of the weight); the rest lowers as in
// poot-lower-to-linalg. canonicalize drops the dead dequantize of the weight.
// RUN: poot-opt %s --split-input-file --pass-pipeline='builtin.module(poot-lower-to-cpu-kernels{cores=2 parallel-min-bytes=0},canonicalize)' | FileCheck %s
// RUN: poot-opt %s --split-input-file --pass-pipeline='builtin.module(poot-lower-to-cpu-kernels,canonicalize)' | FileCheck %s --check-prefix=SERIAL

// Q4_1 GEMV (decode M = 1): rows of W as scf.forall; per 32-element block: the two f16
// scales through vector.bitcast + extf, 16 bytes of nibbles split with andi/shrui, decoded
// with fma (q * d + m) in registers, multiplied into two vector<16xf32> accumulators.
// CHECK-LABEL: func.func @gemv_q4_1(
// CHECK-SAME: %[[X:.+]]: tensor<1x64xf32>, %[[W:.+]]: tensor<1600xi8> {poot.packed = "q4_1"
// CHECK-NOT: linalg.matmul
// CHECK-NOT: tensor<40x64xf32>
// CHECK: scf.forall (%[[N:.+]]) in (40) shared_outs
// CHECK: scf.for {{.*}} -> (vector<16xf32>, vector<16xf32>)
// CHECK: vector.transfer_read %[[W]][{{.*}}], %{{.*}} {in_bounds = [true]} : tensor<1600xi8>, vector<4xi8>
// CHECK: vector.bitcast {{.*}} : vector<4xi8> to vector<2xf16>
// CHECK: arith.extf {{.*}} : vector<2xf16> to vector<2xf32>
// CHECK: vector.transfer_read %[[W]]{{.*}} : tensor<1600xi8>, vector<16xi8>
// CHECK: arith.andi {{.*}} : vector<16xi8>
// CHECK: arith.shrui {{.*}} : vector<16xi8>
// CHECK: math.fma {{.*}} : vector<16xf32>
// CHECK: vector.transfer_read %[[X]]{{.*}} : tensor<1x64xf32>, vector<16xf32>
// CHECK: math.fma {{.*}} : vector<16xf32>
// CHECK: vector.reduction <add>, {{.*}} : vector<16xf32> into f32
// CHECK: tensor.parallel_insert_slice
// SERIAL-LABEL: func.func @gemv_q4_1(
// SERIAL-NOT: scf.forall
// SERIAL: scf.for
// SERIAL: math.fma
func.func @gemv_q4_1(%x: tensor<1x64xf32>) -> tensor<1x40xf32> {
  %0 = "poot.packed_param"() {name = "w"} : () -> !poot.packed<#poot.q4_1, array<i64: 40, 64>>
  %1 = "poot.dequantize"(%0) : (!poot.packed<#poot.q4_1, array<i64: 40, 64>>) -> tensor<40x64xf32>
  %2 = "poot.transpose"(%1) {perm = array<i64: 1, 0>} : (tensor<40x64xf32>) -> tensor<64x40xf32>
  %3 = "poot.matmul"(%x, %2) {acc = f32} : (tensor<1x64xf32>, tensor<64x40xf32>) -> tensor<1x40xf32>
  return %3 : tensor<1x40xf32>
}

// -----

// Dense f32 weight, K = 40 (not a multiple of 32): one full chunk, then a masked chunk
// (a transfer_read that may run past K, padding 0) for the last 8 columns; M = 3 in a tile of 2 rows and a
// tail tile of 1.
// CHECK-LABEL: func.func @gemv_dense_tail(
// CHECK-NOT: linalg.matmul
// CHECK: scf.forall
// CHECK: vector.transfer_read {{.*}} {in_bounds = [true]} : tensor<5x40xf32>, vector<16xf32>
// CHECK: vector.transfer_read %{{.*}}[%{{.*}}, %c32], %{{[a-z0-9_]+}} : tensor<5x40xf32>, vector<16xf32>
// CHECK: vector.transfer_read %{{.*}}[%{{.*}}, %c32], %{{[a-z0-9_]+}} : tensor<3x40xf32>, vector<16xf32>
// CHECK: vector.reduction <add>
func.func @gemv_dense_tail(%x: tensor<3x40xf32>) -> tensor<3x5xf32> {
  %w = "poot.param"() {name = "w"} : () -> tensor<5x40xf32>
  %t = "poot.transpose"(%w) {perm = array<i64: 1, 0>} : (tensor<5x40xf32>) -> tensor<40x5xf32>
  %y = "poot.matmul"(%x, %t) {acc = f32} : (tensor<3x40xf32>, tensor<40x5xf32>) -> tensor<3x5xf32>
  return %y : tensor<3x5xf32>
}

// -----

// A matmul of two activations (no weight read in place) keeps linalg.matmul.
// CHECK-LABEL: func.func @activations(
// CHECK: linalg.matmul
// CHECK-NOT: math.fma
func.func @activations(%a: tensor<2x8xf32>, %b: tensor<8x3xf32>) -> tensor<2x3xf32> {
  %y = "poot.matmul"(%a, %b) {acc = f32} : (tensor<2x8xf32>, tensor<8x3xf32>) -> tensor<2x3xf32>
  return %y : tensor<2x3xf32>
}

// -----

// indexed_matmul (MoE experts read in place): a loop over the rows; each reads its index,
// clamps it to the 4 slabs, and streams the slab's 40 rows of Q8_0 blocks through the row
// kernel at byte offset (slab * 40 + row) * 68; no dequantized copy of the 4 x 40 x 64
// weight.
// CHECK-LABEL: func.func @indexed_q8_0(
// CHECK-SAME: %[[X:.+]]: tensor<3x64xf32>, %[[I:.+]]: tensor<3xi32>, %[[W:.+]]: tensor<10880xi8> {poot.packed = "q8_0"
// CHECK-NOT: tensor<4x40x64xf32>
// CHECK: scf.for %[[T:arg[0-9]+]] = {{.*}} -> (tensor<3x40xf32>)
// CHECK: tensor.extract %[[I]][%[[T]]] : tensor<3xi32>
// CHECK: arith.maxsi
// CHECK: arith.minsi
// CHECK: tensor.extract_slice %[[X]][%[[T]], 0] [1, 64] [1, 1]
// CHECK: scf.forall
// CHECK: vector.transfer_read %[[W]]{{.*}} : tensor<10880xi8>, vector<16xi8>
// CHECK: math.fma
// CHECK: tensor.insert_slice {{.*}} into %{{.*}}[%[[T]], 0] [1, 40] [1, 1]
// SERIAL-LABEL: func.func @indexed_q8_0(
// SERIAL-NOT: scf.forall
// SERIAL: math.fma
func.func @indexed_q8_0(%x: tensor<3x64xf32>, %i: tensor<3xi32>) -> tensor<3x40xf32> {
  %0 = "poot.packed_param"() {name = "w"} : () -> !poot.packed<#poot.q8_0, array<i64: 4, 40, 64>>
  %1 = "poot.dequantize"(%0) : (!poot.packed<#poot.q8_0, array<i64: 4, 40, 64>>) -> tensor<4x40x64xf32>
  %2 = "poot.indexed_matmul"(%x, %1, %i) {acc = f32} : (tensor<3x64xf32>, tensor<4x40x64xf32>, tensor<3xi32>) -> tensor<3x40xf32>
  return %2 : tensor<3x40xf32>
}
