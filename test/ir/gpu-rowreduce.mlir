// The row-reduction strategy (poot/backends/gpu/strategies/rowreduce.py) over an RMSNorm
// region (4 rows of 256), as `poot-opt --gpu-kernels` prints the shared GPU plan: one block
// of 2 subgroups per row, each thread's partial sums, a butterfly in each subgroup, the
// subgroups' sums through workgroup memory and a barrier, then the normalized row.
// RUN: poot-opt %s --gpu-kernels --gpu-subgroup-size=32 --gpu-shared-bytes=49152 --gpu-cores=132 | FileCheck %s

// CHECK-LABEL: gpu.module @poot_kernels
// CHECK: gpu.func @[[K:k0_[0-9a-f]+]](%[[X:.+]]: memref<4x256xf32>, %[[G:.+]]: memref<256xf32>, %[[Y:.+]]: memref<4x256xf32>) workgroup(%[[PART:.+]] : memref<2xf32, #gpu.address_space<workgroup>> {{.*}}) kernel attributes {known_block_size = array<i32: 64, 1, 1>}
// the sum of squares: 2 elements a thread, 2 partial sums
// CHECK: scf.for %{{.+}} = %c0 to %c2 step %c1 iter_args({{.*}}) -> (f32, f32) {
// CHECK: memref.load %[[X]][%block_id_x, %{{.+}}] : memref<4x256xf32>
// CHECK: arith.mulf
// CHECK: scf.yield
// CHECK-COUNT-5: gpu.shuffle xor
// CHECK: memref.store %{{.+}}, %[[PART]][%{{.+}}] : memref<2xf32, #gpu.address_space<workgroup>>
// CHECK: gpu.barrier
// CHECK: memref.load %[[PART]][%c0]
// CHECK: memref.load %[[PART]][%c1]
// the normalized row: x * rsqrt(sum / K + eps) * g
// CHECK: scf.for %{{.+}} = %c0 to %c2 step %c1 {
// CHECK: math.sqrt
// CHECK: memref.load %[[G]]
// CHECK: memref.store %{{.+}}, %[[Y]][%block_id_x, %{{.+}}] : memref<4x256xf32>
// CHECK: gpu.return
// CHECK: // launch @[[K]] grid [4, 1, 1] block [64, 1, 1] strategy rowreduce
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
