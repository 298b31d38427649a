// poot-lower-to-cpu-kernels: matmuls that read a weight in place become the row-streaming
// vector kernel (no linalg.matmul, no dequantized copy of the weight); the rest lowers as in
// poot-lower-to-linalg. canonicalize drops the dead dequantize of the weight.
// RUN: poot-opt %s --split-input-file --pass-pipeline='builtin.module(poot-lower-to-cpu-kernels{cores=2 parallel-min-bytes=0},canonicalize)' | FileCheck %s
// RUN: poot-opt %s --split-input-file --pass-pipeline='builtin.module(poot-lower-to-cpu-kernels,canonicalize)' | FileCheck %s --check-prefix=SERIAL
// RUN: poot-opt %s --split-input-file --pass-pipeline='builtin.module(poot-lower-to-cpu-kernels{cores=2 parallel-min-bytes=0 m-tile=4},canonicalize)' | FileCheck %s --check-prefix=BLOCK

// Q4_1 GEMV (decode M = 1, f32 x): W's 40 rows as scf.forall over 2 items of 20 (one a
// thread); per 32-element block: the two f16 scales through vector.bitcast + extf, 16 bytes
// of nibbles split with andi/shrui, decoded with fma (q * d + m) in registers, multiplied
// into one vector<16xf32> accumulator (low half, then high), whose lanes the fold sums.
// CHECK-LABEL: func.func @gemv_q4_1(
// CHECK-SAME: %[[X:.+]]: tensor<1x64xf32>, %[[W:.+]]: tensor<1600xi8> {poot.packed = "q4_1"
// CHECK-NOT: linalg.matmul
// CHECK-NOT: tensor<40x64xf32>
// CHECK: scf.forall (%[[N:.+]]) in (2) shared_outs
// CHECK: scf.for {{.*}} -> (vector<16xf32>)
// CHECK: vector.transfer_read %[[W]][{{.*}}], %{{.*}} {in_bounds = [true]} : tensor<1600xi8>, vector<4xi8>
// CHECK: vector.bitcast {{.*}} : vector<4xi8> to vector<2xf16>
// CHECK: arith.extf {{.*}} : vector<2xf16> to vector<2xf32>
// CHECK: vector.transfer_read %[[W]]{{.*}} : tensor<1600xi8>, vector<16xi8>
// CHECK: arith.andi {{.*}} : vector<16xi8>
// CHECK: arith.shrui {{.*}} : vector<16xi8>
// CHECK: math.fma {{.*}} : vector<16xf32>
// CHECK: vector.transfer_read %[[X]]{{.*}} : tensor<1x64xf32>, vector<16xf32>
// CHECK: math.fma {{.*}} : vector<16xf32>
// CHECK: vector.shuffle
// CHECK-NOT: vector.reduction
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
// (a transfer_read that may run past K, padding 0) for the last 8 columns; M = 3 in a tile of
// 2 rows and a tail tile of 1; N = 5 takes one W row a register block. Each accumulator's
// lanes are summed by the fold: shuffles halving every output's lanes (8 + 8, then 4 + 4, ...),
// a zero vector beside an odd one out, so each x row's result is the same halving tree
// whatever it is folded with.
// CHECK-LABEL: func.func @gemv_dense_tail(
// CHECK-NOT: linalg.matmul
// CHECK: scf.forall
// CHECK: vector.transfer_read {{.*}} {in_bounds = [true]} : tensor<5x40xf32>, vector<16xf32>
// CHECK: vector.transfer_read %{{.*}}[%{{.*}}, %c32], %{{[a-z0-9_]+}} : tensor<5x40xf32>, vector<16xf32>
// CHECK: vector.transfer_read %{{.*}}[%{{.*}}, %c32], %{{[a-z0-9_]+}} : tensor<3x40xf32>, vector<16xf32>
// CHECK: %[[A:.+]] = math.fma
// CHECK: %[[B:.+]] = math.fma
// CHECK: vector.shuffle %[[A]], %[[B]] [0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23]
// CHECK: vector.shuffle %[[A]], %[[B]] [8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31]
// CHECK: vector.shuffle {{.*}} [0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27]
// CHECK: vector.shuffle {{.*}} [0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30]
// CHECK: vector.extract_strided_slice {{.*}} {offsets = [1], sizes = [1], strides = [1]}
// CHECK-NOT: vector.reduction
func.func @gemv_dense_tail(%x: tensor<3x40xf32>) -> tensor<3x5xf32> {
  %w = "poot.param"() {name = "w"} : () -> tensor<5x40xf32>
  %t = "poot.transpose"(%w) {perm = array<i64: 1, 0>} : (tensor<5x40xf32>) -> tensor<40x5xf32>
  %y = "poot.matmul"(%x, %t) {acc = f32} : (tensor<3x40xf32>, tensor<40x5xf32>) -> tensor<3x5xf32>
  return %y : tensor<3x5xf32>
}

// -----

// Dense f16 weight, N = 64, M = 8 at m-tile 4: register blocks of 4 x rows x 4 W rows (16
// accumulators, the W rows widened with extf), a thread's item 32 W rows (N / 32 = 2 items,
// one a thread): for each tile of 4 x rows, a loop of 8 blocks (the x tile stays in L1 while
// it meets the item's W rows); the bytes 16 KiB past a block prefetched as one
// stream; the 16 accumulators folded into one vector whose lanes 4i..4i+3 are x row i's
// 4 results, written as one vector<4xf32>.
// BLOCK-LABEL: func.func @gemm_dense_block(
// BLOCK-NOT: linalg.matmul
// BLOCK: scf.forall (%{{.*}}) in (2)
// BLOCK: scf.for %{{.*}} = %c0 to %c2 step %c1
// BLOCK: scf.for %{{.*}} = %c0 to %c8 step %c1
// BLOCK: scf.for {{.*}} -> (vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>)
// BLOCK: memref.prefetch %{{.*}}[%{{.*}}], read, locality<3>, data : memref<8192xf16>
// BLOCK: arith.extf {{.*}} : vector<16xf16> to vector<16xf32>
// BLOCK-COUNT-32: math.fma
// BLOCK: scf.yield
// BLOCK: vector.extract_strided_slice {{.*}} {offsets = [12], sizes = [4], strides = [1]} : vector<16xf32> to vector<4xf32>
// BLOCK: vector.transfer_write {{.*}} : vector<4xf32>, tensor<8x32xf32>
func.func @gemm_dense_block(%x: tensor<8x128xf32>) -> tensor<8x64xf32> {
  %w = "poot.param"() {name = "w"} : () -> tensor<64x128xf16>
  %c = "poot.cast"(%w) : (tensor<64x128xf16>) -> tensor<64x128xf32>
  %t = "poot.transpose"(%c) {perm = array<i64: 1, 0>} : (tensor<64x128xf32>) -> tensor<128x64xf32>
  %y = "poot.matmul"(%x, %t) {acc = f32} : (tensor<8x128xf32>, tensor<128x64xf32>) -> tensor<8x64xf32>
  return %y : tensor<8x64xf32>
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
