// The scatter strategy (poot/backends/gpu/strategies/scatter.py) over a KV-cache write
// (one row of 2 heads x 8 into a cache [2, 16, 2, 8] at (slot, position) indices), as
// `poot-opt --gpu-kernels` prints the shared GPU plan: the cache is not written in place
// here (it is not a carried state), so the plan copies it to the output first; one thread
// per updated element, an index out of range writes nothing, and of repeated indices the
// last row wins (each thread looks for a later row with its index).
// RUN: poot-opt %s --gpu-kernels --gpu-subgroup-size=32 --gpu-shared-bytes=49152 --gpu-cores=132 | FileCheck %s

// CHECK-LABEL: gpu.module @poot_kernels
// CHECK: gpu.func @[[K:k0_[0-9a-f]+]](%{{.+}}: memref<2x16x2x8xf32>, %[[IDX:.+]]: memref<1x2xi32>, %[[UPD:.+]]: memref<1x2x8xf32>, %[[OUT:.+]]: memref<512xf32>) kernel attributes {known_block_size = array<i32: 32, 1, 1>}
// CHECK: gpu.block_id y
// CHECK: scf.if
// CHECK: memref.load %[[IDX]][%block_id_y, %c0] : memref<1x2xi32>
// CHECK: memref.load %[[IDX]][%block_id_y, %c1] : memref<1x2xi32>
// a later row with the same index?
// CHECK: scf.for %{{.+}} = %{{.+}} to %c1 step %c1 iter_args(%{{.+}} = %false) -> (i1) {
// CHECK: arith.ori
// CHECK: scf.yield
// CHECK: arith.xori %{{.+}}, %true : i1
// CHECK: scf.if
// CHECK-NEXT: memref.load %[[UPD]][%block_id_y, %{{.+}}, %{{.+}}] : memref<1x2x8xf32>
// CHECK: memref.store %{{.+}}, %[[OUT]][%{{.+}}] : memref<512xf32>
// CHECK: gpu.return
// CHECK: // copy buffer 0 -> 3 (2048 bytes)
// CHECK-NEXT: // launch @[[K]] grid [1, 1, 1] block [32, 1, 1] strategy scatter
module {
  func.func @region(%arg0: tensor<2x16x2x8xf32> {poot.name = "a0"}, %arg1: tensor<1x2xi32> {poot.name = "a1"}, %arg2: tensor<1x2x8xf32> {poot.name = "a2"}) -> (tensor<2x16x2x8xf32> {poot.name = "r0"}) {
    %0 = call @d(%arg0, %arg1, %arg2) : (tensor<2x16x2x8xf32>, tensor<1x2xi32>, tensor<1x2x8xf32>) -> tensor<2x16x2x8xf32>
    return %0 : tensor<2x16x2x8xf32>
  }
  func.func private @d(%arg0: tensor<2x16x2x8xf32>, %arg1: tensor<1x2xi32>, %arg2: tensor<1x2x8xf32>) -> tensor<2x16x2x8xf32> {
    %0 = "poot.scatter"(%arg0, %arg1, %arg2) : (tensor<2x16x2x8xf32>, tensor<1x2xi32>, tensor<1x2x8xf32>) -> tensor<2x16x2x8xf32>
    return %0 : tensor<2x16x2x8xf32>
  }
}
