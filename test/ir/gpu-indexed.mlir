// The indexed-GEMV strategy (poot/backends/gpu/strategies/indexed.py) over a MoE expert
// projection (5 tokens, each against the q5_0 weight slab its index picks, tanh(y) * z), as
// `poot-opt --gpu-kernels` prints the shared GPU plan: grid (output groups, tokens), the
// token's index loaded and clamped to the slabs, a block of 8 subgroups (one output row
// each), the q5_0 blocks decoded from bytes, a butterfly, the epilogue.
// RUN: poot-opt %s --gpu-kernels --gpu-subgroup-size=32 --gpu-shared-bytes=49152 --gpu-cores=132 | FileCheck %s

// CHECK-LABEL: gpu.module @poot_kernels
// CHECK: gpu.func @[[K:k0_[0-9a-f]+]](%[[X:.+]]: memref<5x256xf32>, %[[W:.+]]: memref<28160xi8>, %[[IDX:.+]]: memref<5xi32>, %[[Z:.+]]: memref<5x40xf32>, %[[Y:.+]]: memref<5x40xf32>) kernel attributes {known_block_size = array<i32: 256, 1, 1>}
// CHECK: gpu.block_id y
// CHECK: memref.load %[[IDX]][%block_id_y] : memref<5xi32>
// CHECK: arith.maxsi %{{.+}}, %c0_i64 : i64
// CHECK: arith.minsi %{{.+}}, %c3_i64 : i64
// CHECK: scf.for %{{.+}} = %{{.+}} to %c256 step %c128 iter_args({{.*}}) -> (f32, f32, f32, f32) {
// CHECK: memref.load %[[X]][%block_id_y, %{{.+}}] : memref<5x256xf32>
// the f16 scale (two bytes), the high bit of each q5_0 element, x - 16
// CHECK: memref.load %[[W]][%{{.+}}] : memref<28160xi8>
// CHECK: arith.shli %{{.+}}, %c8_i16 : i16
// CHECK: arith.subi %{{.+}}, %c16_i32 : i32
// CHECK: arith.sitofp
// CHECK: scf.yield
// CHECK-COUNT-5: gpu.shuffle xor
// CHECK: scf.if
// CHECK: math.tanh
// CHECK: memref.load %[[Z]]
// CHECK: memref.store %{{.+}}, %[[Y]][%{{.+}}, %{{.+}}] : memref<5x40xf32>
// CHECK: gpu.return
// CHECK: // launch @[[K]] grid [5, 5, 1] block [256, 1, 1] strategy indexed_gemv
module {
  func.func @region(%arg0: tensor<5x256xf32> {poot.name = "a0"}, %arg1: !poot.packed<#poot.q5_0, array<i64: 4, 40, 256>> {poot.name = "a1"}, %arg2: tensor<5xi32> {poot.name = "a2"}, %arg3: tensor<5x40xf32> {poot.name = "a3"}) -> (tensor<5x40xf32> {poot.name = "r0"}) {
    %0 = call @d(%arg0, %arg1, %arg2, %arg3) : (tensor<5x256xf32>, !poot.packed<#poot.q5_0, array<i64: 4, 40, 256>>, tensor<5xi32>, tensor<5x40xf32>) -> tensor<5x40xf32>
    return %0 : tensor<5x40xf32>
  }
  func.func private @d(%arg0: tensor<5x256xf32>, %arg1: !poot.packed<#poot.q5_0, array<i64: 4, 40, 256>>, %arg2: tensor<5xi32>, %arg3: tensor<5x40xf32>) -> tensor<5x40xf32> {
    %0 = "poot.dequantize"(%arg1) : (!poot.packed<#poot.q5_0, array<i64: 4, 40, 256>>) -> tensor<4x40x256xf32>
    %1 = "poot.indexed_matmul"(%arg0, %0, %arg2) {acc = f32} : (tensor<5x256xf32>, tensor<4x40x256xf32>, tensor<5xi32>) -> tensor<5x40xf32>
    %2 = "poot.unary"(%1) {fn = "tanh"} : (tensor<5x40xf32>) -> tensor<5x40xf32>
    %3 = "poot.binary"(%2, %arg3) {fn = "mul"} : (tensor<5x40xf32>, tensor<5x40xf32>) -> tensor<5x40xf32>
    return %3 : tensor<5x40xf32>
  }
}
