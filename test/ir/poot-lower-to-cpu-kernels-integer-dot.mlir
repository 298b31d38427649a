// poot-lower-to-cpu-kernels with integer dot products for packed weights (dot-bits: x
// quantized per 32-element block; the CPU backend's precision int16 / int8). The intrinsics
// are calls of declared stand-ins until after bufferization.
// RUN: poot-opt %s --split-input-file --pass-pipeline='builtin.module(poot-lower-to-cpu-kernels{dot-bits=16 vnni=1},canonicalize)' | FileCheck %s --check-prefix=INT16
// RUN: poot-opt %s --split-input-file --pass-pipeline='builtin.module(poot-lower-to-cpu-kernels{dot-bits=16},canonicalize)' | FileCheck %s --check-prefix=AVX2
// RUN: poot-opt %s --split-input-file --pass-pipeline='builtin.module(poot-lower-to-cpu-kernels{dot-bits=8 vnni=1},canonicalize)' | FileCheck %s --check-prefix=INT8
// RUN: not poot-opt %s --split-input-file --pass-pipeline='builtin.module(poot-lower-to-cpu-kernels{dot-bits=12})' 2>&1 | FileCheck %s --check-prefix=BAD

// Q4_1 GEMV at int16 x, N not a multiple of 8 (the row-streaming tile; a multiple of 8 takes
// the lane-order GEMV, poot-lower-to-cpu-kernels-gemm.mlir): x is quantized once, per block, to i16 (scale amax / 32767, and the
// scale times the block's sum for the min term); each block's nibbles are zero-extended to
// two vector<16xi16> halves and multiplied by the x halves with two chained vpdpwssd
// (without VNNI, pmaddwd twice and an add), then scaled into an f32 accumulator; the min term
// m * scale * sum(x) accumulates on the scalar side.
// INT16-LABEL: func.func @gemv_q4_1(
// INT16: arith.constant 3.276700e+04 : f32
// INT16: scf.for {{.*}} -> (tensor<1x64xi16>, tensor<1x2xf32>, tensor<1x2xf32>)
// INT16: math.roundeven {{.*}} : vector<16xf32>
// INT16: arith.fptosi {{.*}} : vector<16xf32> to vector<16xi16>
// INT16: vector.transfer_write {{.*}} : vector<32xi16>, tensor<1x64xi16>
// INT16: scf.for {{.*}} -> (vector<8xf32>, f32)
// INT16: arith.andi {{.*}} : vector<16xi8>
// INT16: arith.shrui {{.*}} : vector<16xi8>
// INT16: arith.extui {{.*}} : vector<16xi8> to vector<16xi16>
// INT16: arith.extui {{.*}} : vector<16xi8> to vector<16xi16>
// INT16: %[[D:.+]] = func.call @__poot_intr_llvm_x86_avx512_vpdpwssd_256(%{{.*}}) : (vector<8xi32>, vector<16xi16>, vector<16xi16>) -> vector<8xi32>
// INT16: %[[D2:.+]] = func.call @__poot_intr_llvm_x86_avx512_vpdpwssd_256(%[[D]], %{{.*}})
// INT16: arith.sitofp %[[D2]] : vector<8xi32> to vector<8xf32>
// INT16: math.fma {{.*}} : vector<8xf32>
// INT16: math.fma {{.*}} : f32
// INT16-NOT: vpdpbusd
// AVX2-LABEL: func.func @gemv_q4_1(
// AVX2: %[[P:.+]] = func.call @__poot_intr_llvm_x86_avx2_pmadd_wd({{.*}}) : (vector<16xi16>, vector<16xi16>) -> vector<8xi32>
// AVX2: %[[Q:.+]] = func.call @__poot_intr_llvm_x86_avx2_pmadd_wd(
// AVX2: arith.addi %[[P]], %[[Q]] : vector<8xi32>
// AVX2-NOT: vpdpwssd
// INT8-LABEL: func.func @gemv_q4_1(
// INT8: arith.constant 1.270000e+02 : f32
// INT8: arith.fptosi {{.*}} : vector<16xf32> to vector<16xi8>
// INT8: func.call @__poot_intr_llvm_x86_avx512_vpdpbusd_256({{.*}}) : (vector<8xi32>, vector<32xi8>, vector<32xi8>) -> vector<8xi32>
// INT8-NOT: vpdpwssd
// BAD: dot-bits must be 0, 8 or 16, got 12
func.func @gemv_q4_1(%x: tensor<1x64xf32>) -> tensor<1x36xf32> {
  %0 = "poot.packed_param"() {name = "w"} : () -> !poot.packed<#poot.q4_1, array<i64: 36, 64>>
  %1 = "poot.dequantize"(%0) : (!poot.packed<#poot.q4_1, array<i64: 36, 64>>) -> tensor<36x64xf32>
  %2 = "poot.transpose"(%1) {perm = array<i64: 1, 0>} : (tensor<36x64xf32>) -> tensor<64x36xf32>
  %3 = "poot.matmul"(%x, %2) {acc = f32} : (tensor<1x64xf32>, tensor<64x36xf32>) -> tensor<1x36xf32>
  return %3 : tensor<1x36xf32>
}

// -----

// Q8_0 at int16 x: the signed bytes sign-extended to two vector<16xi16> halves (no min
// term, no sign trick).
// INT16-LABEL: func.func @gemv_q8_0(
// INT16: scf.for {{.*}} -> (vector<8xf32>) {
// INT16: arith.extsi {{.*}} : vector<16xi8> to vector<16xi16>
// INT16: arith.extsi {{.*}} : vector<16xi8> to vector<16xi16>
// INT16: func.call @__poot_intr_llvm_x86_avx512_vpdpwssd_256(
// INT16: func.call @__poot_intr_llvm_x86_avx512_vpdpwssd_256(
// INT16-NOT: psign
// INT8-LABEL: func.func @gemv_q8_0(
// INT8: math.absi {{.*}} : vector<32xi8>
// INT8: func.call @__poot_intr_llvm_x86_avx2_psign_b(
func.func @gemv_q8_0(%x: tensor<1x64xf32>) -> tensor<1x36xf32> {
  %0 = "poot.packed_param"() {name = "w"} : () -> !poot.packed<#poot.q8_0, array<i64: 36, 64>>
  %1 = "poot.dequantize"(%0) : (!poot.packed<#poot.q8_0, array<i64: 36, 64>>) -> tensor<36x64xf32>
  %2 = "poot.transpose"(%1) {perm = array<i64: 1, 0>} : (tensor<36x64xf32>) -> tensor<64x36xf32>
  %3 = "poot.matmul"(%x, %2) {acc = f32} : (tensor<1x64xf32>, tensor<64x36xf32>) -> tensor<1x36xf32>
  return %3 : tensor<1x36xf32>
}
