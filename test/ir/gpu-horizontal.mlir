// Horizontal fusion (poot/backends/gpu/horizontal.py, the `horizontal` strategy): two
// independent GEMVs of one x (as a layer's q/k/v projections) become ONE kernel launch, as
// `poot-opt --gpu-kernels` prints the shared GPU plan: its blocks are the two GEMVs' grids
// laid end to end (64 + 64), each range running its GEMV's body on its own arguments.
// RUN: poot-opt %s --gpu-kernels --gpu-subgroup-size=32 --gpu-shared-bytes=49152 --gpu-cores=132 | FileCheck %s
// POOT_GPU_HORIZONTAL=0 turns it off: two launches of the GEMV strategy.
// RUN: env POOT_GPU_HORIZONTAL=0 poot-opt %s --gpu-kernels --gpu-subgroup-size=32 --gpu-shared-bytes=49152 --gpu-cores=132 | FileCheck %s --check-prefix=OFF

// CHECK-LABEL: gpu.module @poot_kernels
// CHECK: gpu.func @[[K:k0_[0-9a-f]+]](%[[X:.+]]: memref<128xf32>, %[[W0:.+]]: memref<8192xi32>, %[[Y0:.+]]: memref<1x64xf32>, %[[W1:.+]]: memref<8192xi32>, %[[Y1:.+]]: memref<1x64xf32>) kernel attributes {known_block_size = array<i32: 32, 1, 1>}
// CHECK: gpu.block_id x
// CHECK: arith.cmpi ult, %block_id_x, %c64 : index
// CHECK: scf.if
// CHECK: memref.load %[[W0]]
// CHECK-COUNT-5: gpu.shuffle xor
// CHECK: memref.store %{{.+}}, %[[Y0]]
// CHECK: arith.cmpi ult, %block_id_x, %c128 : index
// CHECK: scf.if
// CHECK: arith.subi %block_id_x, %{{.+}} : index
// CHECK: memref.load %[[W1]]
// CHECK-COUNT-5: gpu.shuffle xor
// CHECK: memref.store %{{.+}}, %[[Y1]]
// CHECK: gpu.return
// CHECK-NOT: gpu.func
// CHECK: // launch @[[K]] grid [128, 1, 1] block [32, 1, 1] strategy horizontal
// CHECK-NOT: // launch
// OFF: // launch @{{.+}} grid [64, 1, 1] block [32, 1, 1] strategy gemv
// OFF-NEXT: // launch @{{.+}} grid [64, 1, 1] block [32, 1, 1] strategy gemv
module {
  func.func @region(%arg0: tensor<1x128xf32> {poot.name = "a0"}, %arg1: tensor<64x128xf32> {poot.name = "a1"}, %arg2: tensor<64x128xf32> {poot.name = "a2"}) -> (tensor<1x64xf32> {poot.name = "r0"}, tensor<1x64xf32> {poot.name = "r1"}) {
    %0 = call @d0(%arg0, %arg1) : (tensor<1x128xf32>, tensor<64x128xf32>) -> tensor<1x64xf32>
    %1 = call @d1(%arg0, %arg2) : (tensor<1x128xf32>, tensor<64x128xf32>) -> tensor<1x64xf32>
    return %0, %1 : tensor<1x64xf32>, tensor<1x64xf32>
  }
  func.func private @d0(%arg0: tensor<1x128xf32>, %arg1: tensor<64x128xf32>) -> tensor<1x64xf32> attributes {poot.dispatch = {kind = "matmul", ops = 1 : i64}} {
    %0 = "poot.transpose"(%arg1) {perm = array<i64: 1, 0>} : (tensor<64x128xf32>) -> tensor<128x64xf32>
    %1 = "poot.matmul"(%arg0, %0) {acc = f32} : (tensor<1x128xf32>, tensor<128x64xf32>) -> tensor<1x64xf32>
    return %1 : tensor<1x64xf32>
  }
  func.func private @d1(%arg0: tensor<1x128xf32>, %arg1: tensor<64x128xf32>) -> tensor<1x64xf32> attributes {poot.dispatch = {kind = "matmul", ops = 1 : i64}} {
    %0 = "poot.transpose"(%arg1) {perm = array<i64: 1, 0>} : (tensor<64x128xf32>) -> tensor<128x64xf32>
    %1 = "poot.matmul"(%arg0, %0) {acc = f32} : (tensor<1x128xf32>, tensor<128x64xf32>) -> tensor<1x64xf32>
    return %1 : tensor<1x64xf32>
  }
}
