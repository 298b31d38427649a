// poot-lower-to-cpu-kernels' GEMM tile for packed matmuls with M >= 2 rows of x (batched
// decode, prefill) at int16 / int8 x: the W rows of a tile (16 with 512-bit VNNI, m-tile 4;
// 8 otherwise) are decoded once per block into a pack of interleaved weights (lane j = W
// row j) and a vector of the rows' f16 scales, when M spans several x-row tiles; each x row's
// words are broadcast to every lane of the dot products; each x row's tile of results is one
// vector written to the output.
// RUN: poot-opt %s --pass-pipeline='builtin.module(poot-lower-to-cpu-kernels{dot-bits=16 vnni=1 m-tile=4},canonicalize)' | FileCheck %s --check-prefix=ZMM
// RUN: poot-opt %s --pass-pipeline='builtin.module(poot-lower-to-cpu-kernels{dot-bits=8 vnni=1 m-tile=2},canonicalize)' | FileCheck %s --check-prefix=YMM

// ZMM-LABEL: func.func @gemm_q4_1(
// ZMM: vector.transfer_write {{.*}} : vector<16xi32>, tensor<12x32xi32>
// ZMM: vector.from_elements {{.*}} : vector<16xf16>
// ZMM: vector.transfer_write {{.*}} : vector<16xi32>, tensor<32x16xi32>
// ZMM: vector.transfer_read {{.*}} : tensor<32x16xi32>, vector<16xi32>
// ZMM: vector.broadcast {{.*}} : i32 to vector<16xi32>
// ZMM: func.call @__poot_intr_llvm_x86_avx512_vpdpwssd_512({{.*}}) : (vector<16xi32>, vector<32xi16>, vector<32xi16>) -> vector<16xi32>
// ZMM: arith.sitofp {{.*}} : vector<16xi32> to vector<16xf32>
// ZMM: vector.transfer_write {{.*}} : vector<16xf32>, tensor<12x32xf32>
// YMM-LABEL: func.func @gemm_q4_1(
// YMM: vector.from_elements {{.*}} : vector<8xf16>
// YMM: func.call @__poot_intr_llvm_x86_avx512_vpdpbusd_256({{.*}}) : (vector<8xi32>, vector<32xi8>, vector<32xi8>) -> vector<8xi32>
// YMM: vector.transfer_write {{.*}} : vector<8xf32>, tensor<12x32xf32>
func.func @gemm_q4_1(%x: tensor<12x64xf32>) -> tensor<12x32xf32> {
  %0 = "poot.packed_param"() {name = "w"} : () -> !poot.packed<#poot.q4_1, array<i64: 32, 64>>
  %1 = "poot.dequantize"(%0) : (!poot.packed<#poot.q4_1, array<i64: 32, 64>>) -> tensor<32x64xf32>
  %2 = "poot.transpose"(%1) {perm = array<i64: 1, 0>} : (tensor<32x64xf32>) -> tensor<64x32xf32>
  %3 = "poot.matmul"(%x, %2) {acc = f32} : (tensor<12x64xf32>, tensor<64x32xf32>) -> tensor<12x32xf32>
  return %3 : tensor<12x32xf32>
}
