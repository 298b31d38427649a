// The GEMV strategy (poot/backends/gpu/strategies/matmul.py) over a decode projection
// (x [1, K] . W^T, K = 128, N = 64), as `poot-opt --gpu-kernels` prints the shared GPU plan:
// one subgroup per output row, each lane a slice of K, a butterfly sum, lane 0 stores.
// RUN: poot-opt %s --gpu-kernels --gpu-subgroup-size=32 --gpu-shared-bytes=49152 --gpu-cores=132 --split-input-file | FileCheck %s
// RUN: poot-opt %s --gpu-kernels --gpu-subgroup-size=32 --gpu-shared-bytes=49152 --gpu-cores=132 --split-input-file --gpu-features=sm_90 | FileCheck %s --check-prefix=SM90

// A q4_1 weight decoded in place: each 32-element block's f16 scale and minimum (one i32
// word), its nibbles masked out of the packed words, the products fused.
// CHECK-LABEL: gpu.module @poot_kernels
// CHECK: gpu.func @[[K:k0_[0-9a-f]+]](%{{.+}}: memref<128xf32>, %[[W:.+]]: memref<1280xi32>, %[[Y:.+]]: memref<1x1x64xf32>) kernel attributes {known_block_size = array<i32: 32, 1, 1>}
// CHECK: gpu.thread_id x
// CHECK: gpu.block_id x
// CHECK: memref.load %[[W]]
// CHECK: arith.bitcast %{{.+}} : i16 to f16
// CHECK: arith.andi %{{.+}}, %c15_i32 : i32
// CHECK: math.fma
// CHECK: gpu.shuffle xor %{{.+}}, %c16_i32, %c32_i32 : f32
// CHECK: gpu.shuffle xor %{{.+}}, %c8_i32, %c32_i32 : f32
// CHECK: gpu.shuffle xor %{{.+}}, %c4_i32, %c32_i32 : f32
// CHECK: gpu.shuffle xor %{{.+}}, %c2_i32, %c32_i32 : f32
// CHECK: gpu.shuffle xor %{{.+}}, %c1_i32, %c32_i32 : f32
// CHECK: scf.if
// CHECK-NEXT: memref.store %{{.+}}, %[[Y]][%c0, %c0, %{{.+}}] : memref<1x1x64xf32>
// CHECK: gpu.return
// CHECK-NOT: gpu.barrier
// CHECK: // launch @[[K]] grid [64, 1, 1] block [32, 1, 1] strategy gemv
module {
  func.func @region(%arg0: tensor<1x1x128xf32> {poot.name = "a0"}, %arg1: !poot.packed<#poot.q4_1, array<i64: 64, 128>> {poot.name = "a1"}) -> (tensor<1x1x64xf32> {poot.name = "r0"}) {
    %0 = call @gemv_dispatch(%arg0, %arg1) : (tensor<1x1x128xf32>, !poot.packed<#poot.q4_1, array<i64: 64, 128>>) -> tensor<1x1x64xf32>
    return %0 : tensor<1x1x64xf32>
  }
  func.func private @gemv_dispatch(%arg0: tensor<1x1x128xf32>, %arg1: !poot.packed<#poot.q4_1, array<i64: 64, 128>>) -> tensor<1x1x64xf32> attributes {poot.dispatch = {kind = "matmul", ops = 5 : i64}} {
    %0 = "poot.reshape"(%arg0) : (tensor<1x1x128xf32>) -> tensor<1x128xf32>
    %1 = "poot.dequantize"(%arg1) : (!poot.packed<#poot.q4_1, array<i64: 64, 128>>) -> tensor<64x128xf32>
    %2 = "poot.transpose"(%1) {perm = array<i64: 1, 0>} : (tensor<64x128xf32>) -> tensor<128x64xf32>
    %3 = "poot.matmul"(%0, %2) {acc = f32} : (tensor<1x128xf32>, tensor<128x64xf32>) -> tensor<1x64xf32>
    %4 = "poot.reshape"(%3) : (tensor<1x64xf32>) -> tensor<1x1x64xf32>
    return %4 : tensor<1x1x64xf32>
  }
}

// -----

// An f32 weight (as i32 words). With the sm_90 feature (CUDA) the lanes load 16 bytes at a
// time and prefetch the row into L2; without it, scalar loads (every SPIR-V target).
// CHECK-LABEL: gpu.module @poot_kernels
// CHECK: gpu.func @[[K2:k0_[0-9a-f]+]](%{{.+}}: memref<128xf32>, %{{.+}}: memref<8192xi32>, %{{.+}}: memref<1x1x64xf32>) kernel attributes {known_block_size = array<i32: 32, 1, 1>}
// CHECK-NOT: vector.load
// CHECK: memref.load %{{.+}} : memref<8192xi32>
// CHECK: gpu.shuffle xor
// CHECK: // launch @[[K2]] grid [64, 1, 1] block [32, 1, 1] strategy gemv
// SM90: gpu.func @[[K3:k0_[0-9a-f]+]](%{{.+}}: memref<128xf32> {llvm.noalias, llvm.readonly}, %[[W3:.+]]: memref<8192xi32> {llvm.noalias, llvm.readonly}, %{{.+}}: memref<1x1x64xf32>)
// SM90: prefetch.global.L2
// SM90: nvvm.griddepcontrol wait
// SM90: vector.load %[[W3]][%{{.+}}] {alignment = 16 : i64} : memref<8192xi32>, vector<4xi32>
// SM90: vector.load %{{.+}} {alignment = 16 : i64} : memref<128xf32>, vector<4xf32>
// SM90: gpu.shuffle xor
// SM90: // launch @[[K3]] grid [64, 1, 1] block [32, 1, 1] strategy gemv
module {
  func.func @region(%arg0: tensor<1x1x128xf32> {poot.name = "a0"}, %arg1: tensor<64x128xf32> {poot.name = "a1"}) -> (tensor<1x1x64xf32> {poot.name = "r0"}) {
    %0 = call @gemv_dispatch(%arg0, %arg1) : (tensor<1x1x128xf32>, tensor<64x128xf32>) -> tensor<1x1x64xf32>
    return %0 : tensor<1x1x64xf32>
  }
  func.func private @gemv_dispatch(%arg0: tensor<1x1x128xf32>, %arg1: tensor<64x128xf32>) -> tensor<1x1x64xf32> attributes {poot.dispatch = {kind = "matmul", ops = 4 : i64}} {
    %0 = "poot.reshape"(%arg0) : (tensor<1x1x128xf32>) -> tensor<1x128xf32>
    %1 = "poot.transpose"(%arg1) {perm = array<i64: 1, 0>} : (tensor<64x128xf32>) -> tensor<128x64xf32>
    %2 = "poot.matmul"(%0, %1) {acc = f32} : (tensor<1x128xf32>, tensor<128x64xf32>) -> tensor<1x64xf32>
    %3 = "poot.reshape"(%2) : (tensor<1x64xf32>) -> tensor<1x1x64xf32>
    return %3 : tensor<1x1x64xf32>
  }
}
