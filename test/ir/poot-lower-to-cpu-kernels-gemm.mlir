// poot-lower-to-cpu-kernels' GEMM tile for packed matmuls with M >= 2 rows of x (batched
// decode, prefill) at int16 / int8 x: the W rows of a tile (16 with 512-bit VNNI, m-tile 4;
// 8 otherwise) are decoded once per block into a pack of interleaved weights (lane j = W
// row j) and a vector of the rows' f16 scales, when M spans several x-row tiles; each x row's
// words are broadcast to every lane of the dot products; each x row's tile of results is one
// vector written to the output. Q4_1's (d, m) scale pairs of the tile's rows are one 32-bit
// gather (4-byte aligned: 20-byte blocks).
// RUN: poot-opt %s --pass-pipeline='builtin.module(poot-lower-to-cpu-kernels{dot-bits=16 vnni=1 m-tile=4},canonicalize)' | FileCheck %s --check-prefix=ZMM
// RUN: poot-opt %s --pass-pipeline='builtin.module(poot-lower-to-cpu-kernels{dot-bits=8 vnni=1 m-tile=2},canonicalize)' | FileCheck %s --check-prefix=YMM

// ZMM-LABEL: func.func @gemm_q4_1(
// ZMM: vector.transfer_write {{.*}} : vector<16xi32>, tensor<12x32xi32>
// ZMM: vector.gather {{.*}} : memref<320xi32>, vector<16xi32>, vector<16xi1>, vector<16xi32> into vector<16xi32>
// ZMM: vector.transfer_write {{.*}} : vector<16xi32>, tensor<32x16xi32>
// ZMM: vector.transfer_read {{.*}} : tensor<32x16xi32>, vector<16xi32>
// ZMM: vector.broadcast {{.*}} : i32 to vector<16xi32>
// ZMM: func.call @__poot_intr_llvm_x86_avx512_vpdpwssd_512({{.*}}) : (vector<16xi32>, vector<32xi16>, vector<32xi16>) -> vector<16xi32>
// ZMM: arith.sitofp {{.*}} : vector<16xi32> to vector<16xf32>
// ZMM: vector.transfer_write {{.*}} : vector<16xf32>, tensor<12x32xf32>
// YMM-LABEL: func.func @gemm_q4_1(
// YMM: vector.gather {{.*}} : memref<320xi32>, vector<8xi32>, vector<8xi1>, vector<8xi32> into vector<8xi32>
// YMM: func.call @__poot_intr_llvm_x86_avx512_vpdpbusd_256({{.*}}) : (vector<8xi32>, vector<32xi8>, vector<32xi8>) -> vector<8xi32>
// YMM: vector.transfer_write {{.*}} : vector<8xf32>, tensor<12x32xf32>
func.func @gemm_q4_1(%x: tensor<12x64xf32>) -> tensor<12x32xf32> {
  %0 = "poot.packed_param"() {name = "w"} : () -> !poot.packed<#poot.q4_1, array<i64: 32, 64>>
  %1 = "poot.dequantize"(%0) : (!poot.packed<#poot.q4_1, array<i64: 32, 64>>) -> tensor<32x64xf32>
  %2 = "poot.transpose"(%1) {perm = array<i64: 1, 0>} : (tensor<32x64xf32>) -> tensor<64x32xf32>
  %3 = "poot.matmul"(%x, %2) {acc = f32} : (tensor<12x64xf32>, tensor<64x32xf32>) -> tensor<12x32xf32>
  return %3 : tensor<12x32xf32>
}

// The lane-order GEMV for M = 1 (the same formats and N): x stays in registers, each W row's
// integer dot products are summed across lanes by shuffles and adds into one vector whose
// lane j is W row j's block sum, then scaled by the rows' scale vectors with the GEMM tile's
// two FMAs, so a row alone rounds as in a batch. 512-bit VNNI: two Q4 rows a vpdpwssd, x
// repeated in both halves; otherwise one row a 256-bit dot product. The next tiles' bytes are
// prefetched as they go.
// ZMM-LABEL: func.func @gemv_q4_1(
// ZMM: memref.prefetch
// ZMM: scf.for {{.*}} -> (vector<16xf32>)
// ZMM: vector.gather {{.*}} : memref<320xi32>, vector<16xi32>, vector<16xi1>, vector<16xi32> into vector<16xi32>
// ZMM: vector.shuffle {{.*}} [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15] : vector<16xi16>, vector<16xi16>
// ZMM: func.call @__poot_intr_llvm_x86_avx512_vpdpwssd_512({{.*}}) : (vector<16xi32>, vector<32xi16>, vector<32xi16>) -> vector<16xi32>
// ZMM: vector.shuffle {{.*}} [0, 2, 16, 18, 4, 6, 20, 22, 8, 10, 24, 26, 12, 14, 28, 30] : vector<16xi32>, vector<16xi32>
// ZMM: vector.shuffle {{.*}} [0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27] : vector<16xi32>, vector<16xi32>
// ZMM: %[[S:.+]] = arith.addi {{.*}} : vector<16xi32>
// ZMM: %[[F:.+]] = arith.sitofp %[[S]] : vector<16xi32> to vector<16xf32>
// ZMM: %[[A:.+]] = math.fma %[[F]], {{.*}} : vector<16xf32>
// ZMM: math.fma {{.*}}, %[[A]] : vector<16xf32>
// ZMM: vector.transfer_write {{.*}} : vector<16xf32>, tensor<1x32xf32>
// YMM-LABEL: func.func @gemv_q4_1(
// YMM: scf.for {{.*}} -> (vector<8xf32>)
// YMM: func.call @__poot_intr_llvm_x86_avx512_vpdpbusd_256({{.*}}) : (vector<8xi32>, vector<32xi8>, vector<32xi8>) -> vector<8xi32>
// YMM: vector.shuffle {{.*}} [0, 2, 8, 10, 4, 6, 12, 14] : vector<8xi32>, vector<8xi32>
// YMM: vector.shuffle {{.*}} [4, 5, 6, 7, 12, 13, 14, 15] : vector<8xi32>, vector<8xi32>
// YMM: arith.sitofp {{.*}} : vector<8xi32> to vector<8xf32>
// YMM: vector.transfer_write {{.*}} : vector<8xf32>, tensor<1x32xf32>
func.func @gemv_q4_1(%x: tensor<1x64xf32>) -> tensor<1x32xf32> {
  %0 = "poot.packed_param"() {name = "w"} : () -> !poot.packed<#poot.q4_1, array<i64: 32, 64>>
  %1 = "poot.dequantize"(%0) : (!poot.packed<#poot.q4_1, array<i64: 32, 64>>) -> tensor<32x64xf32>
  %2 = "poot.transpose"(%1) {perm = array<i64: 1, 0>} : (tensor<32x64xf32>) -> tensor<64x32xf32>
  %3 = "poot.matmul"(%x, %2) {acc = f32} : (tensor<1x64xf32>, tensor<64x32xf32>) -> tensor<1x32xf32>
  return %3 : tensor<1x32xf32>
}
