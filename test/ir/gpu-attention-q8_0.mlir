// RUN: poot-opt %s --gpu-kernels --gpu-subgroup-size=32 --gpu-shared-bytes=49152 --gpu-cores=132 | FileCheck %s

// The flash-decoding strategy (poot/backends/gpu/strategies/attention/) over a
// poot.paged_attention region whose pools are q8_0 (poot/dialects/kv_quant.py): i8 values
// [80 blocks, 16 positions, 2 kv heads, 32] and their f16 scales [80, 16, 2, 1] as the
// trailing operands; a 1152-key table, so the key axis splits (one subgroup a block) and a
// combine kernel merges the chunks. The split kernel reads the pools in place: a lane loads
// its key's values and their group's f16 scale and multiplies them as it loads (K: the
// round's four values from one 32-bit word, the K pool bound as i32 words, one scale load a
// round; V: a byte and a scale a value). Nothing dequantizes the pools beforehand.
// CHECK-LABEL: gpu.module @poot_kernels
// CHECK: gpu.func @[[K:k0_[0-9a-f]+]](%{{.+}}: memref<128xf32>, %[[KP:.+]]: memref<20480xi32>, %[[VP:.+]]: memref<81920xi8>, %{{.+}}: memref<72xi32>, %{{.+}}: memref<1152xi8>, %[[KS:.+]]: memref<2560xf16>, %[[VS:.+]]: memref<2560xf16>, %{{.+}}: memref<19584xf32>)
// CHECK-SAME: known_block_size = array<i32: 32, 1, 1>
// the dot products: the round's scale and word, then each byte sign-extended, times the scale
// CHECK: memref.load %[[KS]][%{{.+}}] : memref<2560xf16>
// CHECK-NEXT: %[[KD:.+]] = arith.extf %{{.+}} : f16 to f32
// CHECK: %[[W:.+]] = memref.load %[[KP]][%{{.+}}] : memref<20480xi32>
// CHECK-NEXT: %[[B0:.+]] = arith.trunci %[[W]] : i32 to i8
// CHECK-NEXT: %[[KQ:.+]] = arith.sitofp %[[B0]] : i8 to f32
// CHECK-NEXT: arith.mulf %[[KQ]], %[[KD]] : f32
// CHECK: arith.shrui %[[W]], %c8_i32 : i32
// CHECK: arith.shrui %[[W]], %c16_i32 : i32
// CHECK: arith.shrui %[[W]], %c24_i32 : i32
// p * v: each value dequantized with its own group's scale
// CHECK: gpu.shuffle xor
// CHECK: memref.load %[[VP]][%{{.+}}] : memref<81920xi8>
// CHECK-NEXT: %[[VQ:.+]] = arith.sitofp %{{.+}} : i8 to f32
// CHECK: memref.load %[[VS]][%{{.+}}] : memref<2560xf16>
// CHECK-NEXT: %[[VD:.+]] = arith.extf %{{.+}} : f16 to f32
// CHECK-NEXT: arith.mulf %[[VQ]], %[[VD]] : f32
// CHECK: gpu.shuffle idx
// CHECK: gpu.return
// CHECK: gpu.func @[[C:k1_[0-9a-f]+]]
// CHECK: // launch @[[K]] grid [144, 1, 2] block [32, 1, 1] strategy flash_decode
// CHECK-NEXT: // launch @[[C]] grid [1, 1, 1] block [128, 1, 1] strategy flash_decode
// CHECK-NOT: // launch
module {
  func.func @region(%arg0: tensor<1x1x4x32xf32> {poot.name = "a0"}, %arg1: tensor<80x16x2x32xi8> {poot.name = "a1"}, %arg2: tensor<80x16x2x32xi8> {poot.name = "a2"}, %arg3: tensor<1x72xi32> {poot.name = "a3"}, %arg4: tensor<1x1x1152xi1> {poot.name = "a4"}, %arg5: tensor<80x16x2x1xf16> {poot.name = "a5"}, %arg6: tensor<80x16x2x1xf16> {poot.name = "a6"}) -> (tensor<1x4x1x32xf32> {poot.name = "r0"}) {
    %0 = call @attn(%arg0, %arg1, %arg2, %arg3, %arg4, %arg5, %arg6) : (tensor<1x1x4x32xf32>, tensor<80x16x2x32xi8>, tensor<80x16x2x32xi8>, tensor<1x72xi32>, tensor<1x1x1152xi1>, tensor<80x16x2x1xf16>, tensor<80x16x2x1xf16>) -> tensor<1x4x1x32xf32>
    return %0 : tensor<1x4x1x32xf32>
  }
  func.func private @attn(%arg0: tensor<1x1x4x32xf32>, %arg1: tensor<80x16x2x32xi8>, %arg2: tensor<80x16x2x32xi8>, %arg3: tensor<1x72xi32>, %arg4: tensor<1x1x1152xi1>, %arg5: tensor<80x16x2x1xf16>, %arg6: tensor<80x16x2x1xf16>) -> tensor<1x4x1x32xf32> attributes {poot.dispatch = {kind = "paged_attention", ops = 5 : i64}} {
    %0 = "poot.reshape"(%arg0) : (tensor<1x1x4x32xf32>) -> tensor<1x1x2x2x32xf32>
    %1 = "poot.transpose"(%0) {perm = array<i64: 0, 2, 3, 1, 4>} : (tensor<1x1x2x2x32xf32>) -> tensor<1x2x2x1x32xf32>
    %2 = "poot.reshape"(%arg4) : (tensor<1x1x1152xi1>) -> tensor<1x1x1x1x1152xi1>
    %3 = "poot.paged_attention"(%1, %arg1, %arg2, %arg3, %2, %arg5, %arg6) {scale = 0.17677669529663687 : f64, softcap = 0.000000e+00 : f64} : (tensor<1x2x2x1x32xf32>, tensor<80x16x2x32xi8>, tensor<80x16x2x32xi8>, tensor<1x72xi32>, tensor<1x1x1x1x1152xi1>, tensor<80x16x2x1xf16>, tensor<80x16x2x1xf16>) -> tensor<1x2x2x1x32xf32>
    %4 = "poot.reshape"(%3) : (tensor<1x2x2x1x32xf32>) -> tensor<1x4x1x32xf32>
    return %4 : tensor<1x4x1x32xf32>
  }
}

