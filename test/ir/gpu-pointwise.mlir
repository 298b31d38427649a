// The pointwise strategy (poot/backends/gpu/strategies/pointwise.py) over a causal-mask
// region (iota <= position, i1 stored as i8), as `poot-opt --gpu-kernels` prints the shared
// GPU plan: one thread per output element, the position loaded, the compare computed in
// place (no iota buffer), out-of-range threads guarded.
// RUN: poot-opt %s --gpu-kernels --gpu-subgroup-size=32 --gpu-shared-bytes=49152 --gpu-cores=132 | FileCheck %s

// CHECK-LABEL: gpu.module @poot_kernels
// CHECK: gpu.func @[[K:k0_[0-9a-f]+]](%[[POS:.+]]: memref<1x1xi32>, %[[M:.+]]: memref<1x1x40xi8>) kernel attributes {known_block_size = array<i32: 64, 1, 1>}
// CHECK-NOT: workgroup
// CHECK: gpu.thread_id x
// CHECK: arith.cmpi ult, %{{.+}}, %c40 : index
// CHECK: scf.if
// CHECK: memref.load %[[POS]][%c0, %c0] : memref<1x1xi32>
// CHECK: arith.cmpi sle
// CHECK: arith.extui %{{.+}} : i1 to i8
// CHECK: memref.store %{{.+}}, %[[M]][%c0, %c0, %{{.+}}] : memref<1x1x40xi8>
// CHECK-NOT: gpu.barrier
// CHECK: gpu.return
// CHECK: // launch @[[K]] grid [1, 1, 1] block [64, 1, 1] strategy pointwise
module {
  func.func @region(%arg0: tensor<1x1xi32> {poot.name = "a0"}) -> (tensor<1x1x40xi1> {poot.name = "r0"}) {
    %0 = call @d(%arg0) : (tensor<1x1xi32>) -> tensor<1x1x40xi1>
    return %0 : tensor<1x1x40xi1>
  }
  func.func private @d(%arg0: tensor<1x1xi32>) -> tensor<1x1x40xi1> {
    %0 = "poot.iota"() {axis = 1 : i64} : () -> tensor<1x40xi32>
    %1 = "poot.reshape"(%0) : (tensor<1x40xi32>) -> tensor<1x1x40xi32>
    %2 = "poot.reshape"(%arg0) : (tensor<1x1xi32>) -> tensor<1x1x1xi32>
    %3 = "poot.broadcast"(%2) {dims = array<i64: 0, 1, 2>} : (tensor<1x1x1xi32>) -> tensor<1x1x40xi32>
    %4 = "poot.compare"(%1, %3) {pred = "le"} : (tensor<1x1x40xi32>, tensor<1x1x40xi32>) -> tensor<1x1x40xi1>
    return %4 : tensor<1x1x40xi1>
  }
}
