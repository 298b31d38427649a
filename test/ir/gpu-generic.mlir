// The generic mapping (poot/backends/gpu/kernels.py: linalg -> parallel loops -> one thread
// or one subgroup per row), what a region gets when no strategy takes it, here forced with
// POOT_GPU_STRATEGIES=generic on the RMSNorm region of gpu-rowreduce.mlir: three launches
// (the sum's scratch zeroed, a subgroup per row accumulating into it, the elementwise rest)
// where the rowreduce strategy makes one.
// RUN: env POOT_GPU_STRATEGIES=generic poot-opt %s --gpu-kernels --gpu-subgroup-size=32 --gpu-shared-bytes=49152 --gpu-cores=132 | FileCheck %s

// CHECK-LABEL: gpu.module @poot_kernels
// CHECK: gpu.func @[[ZERO:k0_[0-9a-f]+]](%[[S0:.+]]: memref<4x1xf32>) kernel attributes {known_block_size = array<i32: 32, 1, 1>}
// CHECK: memref.store %{{.+}}, %[[S0]][%{{.+}}, %c0] : memref<4x1xf32>
// CHECK: gpu.func @[[SUM:k1_[0-9a-f]+]](%[[X:.+]]: memref<4x256xf32>, %[[S1:.+]]: memref<4x1xf32>) kernel attributes {known_block_size = array<i32: 128, 1, 1>}
// CHECK: scf.for %{{.+}} = %{{.+}} to %c256 step %c32 iter_args(%{{.+}} = %{{.+}}) -> (f32) {
// CHECK: memref.load %[[X]]
// CHECK-COUNT-5: gpu.shuffle xor
// CHECK: memref.load %[[S1]]
// CHECK: memref.store %{{.+}}, %[[S1]][%{{.+}}, %c0] : memref<4x1xf32>
// CHECK: gpu.func @[[ROW:k2_[0-9a-f]+]](%{{.+}}: memref<4x256xf32>, %{{.+}}: memref<4x1xf32>, %{{.+}}: memref<256xf32>, %[[Y:.+]]: memref<4x256xf32>) kernel attributes {known_block_size = array<i32: 256, 1, 1>}
// CHECK-NOT: gpu.shuffle
// CHECK: math.sqrt
// CHECK: memref.store %{{.+}}, %[[Y]]
// CHECK: // launch @[[ZERO]] grid [1, 1, 1] block [32, 1, 1] strategy naive
// CHECK-NEXT: // launch @[[SUM]] grid [1, 1, 1] block [128, 1, 1] strategy warp_rows
// CHECK-NEXT: // launch @[[ROW]] grid [4, 1, 1] block [256, 1, 1] strategy naive
// CHECK-NEXT: // scratch {{.+}} memref<4x1xf32> (16 bytes)
module {
  func.func @region(%arg0: tensor<4x256xf32> {poot.name = "a0"}, %arg1: tensor<256xf32> {poot.name = "a1"}) -> (tensor<4x256xf32> {poot.name = "r0"}) {
    %0 = call @d(%arg0, %arg1) : (tensor<4x256xf32>, tensor<256xf32>) -> tensor<4x256xf32>
    return %0 : tensor<4x256xf32>
  }
  func.func private @d(%arg0: tensor<4x256xf32>, %arg1: tensor<256xf32>) -> tensor<4x256xf32> {
    %0 = "poot.constant"() {value = dense<2.560000e+02> : tensor<4x1xf32>} : () -> tensor<4x1xf32>
    %1 = "poot.constant"() {value = dense<9.99999974E-6> : tensor<4x1xf32>} : () -> tensor<4x1xf32>
    %2 = "poot.binary"(%arg0, %arg0) {fn = "mul"} : (tensor<4x256xf32>, tensor<4x256xf32>) -> tensor<4x256xf32>
    %3 = "poot.reduce"(%2) {axes = array<i64: 1>, fn = "sum"} : (tensor<4x256xf32>) -> tensor<4xf32>
    %4 = "poot.reshape"(%3) : (tensor<4xf32>) -> tensor<4x1xf32>
    %5 = "poot.binary"(%4, %0) {fn = "div"} : (tensor<4x1xf32>, tensor<4x1xf32>) -> tensor<4x1xf32>
    %6 = "poot.binary"(%5, %1) {fn = "add"} : (tensor<4x1xf32>, tensor<4x1xf32>) -> tensor<4x1xf32>
    %7 = "poot.unary"(%6) {fn = "rsqrt"} : (tensor<4x1xf32>) -> tensor<4x1xf32>
    %8 = "poot.broadcast"(%7) {dims = array<i64: 0, 1>} : (tensor<4x1xf32>) -> tensor<4x256xf32>
    %9 = "poot.binary"(%arg0, %8) {fn = "mul"} : (tensor<4x256xf32>, tensor<4x256xf32>) -> tensor<4x256xf32>
    %10 = "poot.broadcast"(%arg1) {dims = array<i64: 1>} : (tensor<256xf32>) -> tensor<4x256xf32>
    %11 = "poot.binary"(%9, %10) {fn = "mul"} : (tensor<4x256xf32>, tensor<4x256xf32>) -> tensor<4x256xf32>
    return %11 : tensor<4x256xf32>
  }
}
