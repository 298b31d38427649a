// The flash-decoding strategy (poot/backends/gpu/strategies/attention/) over a
// poot.attention dispatch region, as `poot-opt --gpu-kernels` prints the shared GPU plan
// (what the CUDA, Vulkan, ROCm and wgpu backends lower) for a target of 32-lane subgroups,
// 48 KiB of workgroup memory and 132 cores. GQA decode, 2 kv heads x 2 query heads, D = 32.
// RUN: poot-opt %s --split-input-file --gpu-kernels --gpu-subgroup-size=32 --gpu-shared-bytes=49152 --gpu-cores=132 | FileCheck %s

// A short context (64 keys): ONE kernel, a block of 8 subgroups per kv head walking the key
// batches interleaved (KL = 8 keys at a time, a key's dot product over 4 lanes), merging
// their (m, l, acc) through workgroup memory (8 subgroups x 2 rows x (32 + 2) floats).
// CHECK-LABEL: gpu.module @poot_kernels
// CHECK: gpu.func @[[K:k0_[0-9a-f]+]](%{{.+}}: memref<128xf32>, %{{.+}}: memref<4096xf32>, %{{.+}}: memref<4096xf32>, %{{.+}}: memref<64xi8>, %[[OUT:.+]]: memref<128xf32>) workgroup(%[[RED:.+]] : memref<544xf32, #gpu.address_space<workgroup>> {{.*}}) kernel attributes {known_block_size = array<i32: 256, 1, 1>}
// CHECK: gpu.thread_id x
// CHECK: gpu.block_id z
// the walk: 8 subgroups x 8 keys a step, carrying (m, l) and one accumulator per row
// CHECK: scf.for %{{.+}} = %{{.+}} to %{{.+}} step %c64 iter_args({{.*}}) -> (f32, f32, f32, f32, f32, f32) {
// an i1 mask: the subgroup votes whether any row sees a key of the batch (else it is skipped)
// CHECK-COUNT-5: gpu.shuffle xor %{{.+}}, %c{{[0-9]+}}_i32, %c32_i32 : i32
// CHECK: scf.if %{{.+}} -> (f32, f32, f32, f32, f32, f32) {
// the dot products (each lane's share), completed over the key's 4 lanes
// CHECK: scf.for %{{.+}} = %c0 to %c2 step %c2 iter_args({{.*}}) -> (f32, f32) {
// CHECK: gpu.shuffle xor %{{.+}}#0, %c1_i32, %c32_i32 : f32
// CHECK-NEXT: arith.addf
// CHECK-NEXT: gpu.shuffle xor %{{.+}}, %c2_i32, %c32_i32 : f32
// the masked score (-1e30), the batch max over the keys, the online-softmax rescale
// CHECK: arith.select %{{.+}}, %{{.+}}, %cst_{{[0-9]+}} : f32
// CHECK: gpu.shuffle xor %{{.+}}, %c4_i32, %c32_i32 : f32
// CHECK: arith.maximumf
// CHECK: math.exp
// p * v: each key's weight broadcast from its lanes
// CHECK: scf.for %{{.+}} = %c0 to %c8 step %c8 iter_args({{.*}}) -> (f32, f32) {
// CHECK: gpu.shuffle idx
// the subgroups' states into workgroup memory, a barrier, then one merge per output
// CHECK: memref.store %{{.+}}, %[[RED]][%{{.+}}] : memref<544xf32, #gpu.address_space<workgroup>>
// CHECK: gpu.barrier
// CHECK: scf.for %{{.+}} = %thread_id_x to %c64 step %c256 {
// CHECK: memref.load %[[RED]]
// CHECK: arith.divf
// CHECK: memref.store %{{.+}}, %[[OUT]][%{{.+}}] : memref<128xf32>
// CHECK: gpu.return
// CHECK-NOT: gpu.func
// CHECK: // launch @[[K]] grid [1, 1, 2] block [256, 1, 1] strategy flash_decode
// CHECK-NOT: // launch
// CHECK-NOT: // scratch
module {
  func.func @region(%arg0: tensor<1x1x4x32xf32> {poot.name = "a0"}, %arg1: tensor<1x64x2x32xf32> {poot.name = "a1"}, %arg2: tensor<1x64x2x32xf32> {poot.name = "a2"}, %arg3: tensor<1x1x64xi1> {poot.name = "a3"}) -> (tensor<1x4x1x32xf32> {poot.name = "r0"}) {
    %0 = call @attn(%arg0, %arg1, %arg2, %arg3) : (tensor<1x1x4x32xf32>, tensor<1x64x2x32xf32>, tensor<1x64x2x32xf32>, tensor<1x1x64xi1>) -> tensor<1x4x1x32xf32>
    return %0 : tensor<1x4x1x32xf32>
  }
  func.func private @attn(%arg0: tensor<1x1x4x32xf32>, %arg1: tensor<1x64x2x32xf32>, %arg2: tensor<1x64x2x32xf32>, %arg3: tensor<1x1x64xi1>) -> tensor<1x4x1x32xf32> attributes {poot.dispatch = {kind = "attention", ops = 7 : i64}} {
    %0 = "poot.reshape"(%arg0) : (tensor<1x1x4x32xf32>) -> tensor<1x1x2x2x32xf32>
    %1 = "poot.transpose"(%0) {perm = array<i64: 0, 2, 3, 1, 4>} : (tensor<1x1x2x2x32xf32>) -> tensor<1x2x2x1x32xf32>
    %2 = "poot.reshape"(%1) : (tensor<1x2x2x1x32xf32>) -> tensor<1x2x2x32xf32>
    %3 = "poot.reshape"(%2) : (tensor<1x2x2x32xf32>) -> tensor<1x2x2x1x32xf32>
    %4 = "poot.transpose"(%arg1) {perm = array<i64: 0, 2, 1, 3>} : (tensor<1x64x2x32xf32>) -> tensor<1x2x64x32xf32>
    %5 = "poot.transpose"(%arg2) {perm = array<i64: 0, 2, 1, 3>} : (tensor<1x64x2x32xf32>) -> tensor<1x2x64x32xf32>
    %6 = "poot.reshape"(%arg3) : (tensor<1x1x64xi1>) -> tensor<1x1x1x1x64xi1>
    %7 = "poot.attention"(%3, %4, %5, %6) {scale = 0.17677669529663687 : f64, softcap = 0.000000e+00 : f64} : (tensor<1x2x2x1x32xf32>, tensor<1x2x64x32xf32>, tensor<1x2x64x32xf32>, tensor<1x1x1x1x64xi1>) -> tensor<1x2x2x1x32xf32>
    %8 = "poot.reshape"(%7) : (tensor<1x2x2x1x32xf32>) -> tensor<1x4x1x32xf32>
    return %8 : tensor<1x4x1x32xf32>
  }
}

// -----

// A long context (4096 keys) with an additive mask: split over the GPU (256 chunks a kv
// head, one subgroup a block, no workgroup memory) into a scratch of (acc, m, l) per chunk,
// then a combine kernel (one thread per output, 16 chunks at a time) that divides.
// CHECK-LABEL: gpu.module @poot_kernels
// CHECK: gpu.func @[[SPLIT:k0_[0-9a-f]+]](%{{.+}}: memref<128xf32>, %{{.+}}: memref<262144xf32>, %{{.+}}: memref<262144xf32>, %{{.+}}: memref<4096xf32>, %[[SCR:.+]]: memref<34816xf32>) kernel attributes {known_block_size = array<i32: 32, 1, 1>}
// CHECK-NOT: gpu.barrier
// CHECK: scf.for %{{.+}} = %{{.+}} to %{{.+}} step %c8 iter_args({{.*}}) -> (f32, f32, f32, f32, f32, f32) {
// the bias is read and added (no vote: a bias mask never skips a batch)
// CHECK-NOT: gpu.shuffle xor %{{.+}} : i32
// CHECK: memref.load %arg3
// CHECK: math.exp
// CHECK: gpu.shuffle idx
// no division here: (acc, m, l) go to the scratch
// CHECK-NOT: arith.divf
// CHECK: memref.store %{{.+}}, %[[SCR]][%{{.+}}] : memref<34816xf32>
// CHECK: gpu.return
// CHECK: gpu.func @[[COMB:k1_[0-9a-f]+]](%{{.+}}: memref<34816xf32>, %{{.+}}: memref<128xf32>) kernel attributes {known_block_size = array<i32: 128, 1, 1>}
// CHECK: scf.for %{{.+}} = %c0 to %c256 step %c16 iter_args({{.*}}) -> (f32, f32, f32) {
// CHECK: arith.maximumf
// CHECK: math.exp
// CHECK: scf.yield
// CHECK: arith.divf
// CHECK: gpu.return
// CHECK: // launch @[[SPLIT]] grid [256, 1, 2] block [32, 1, 1] strategy flash_decode
// CHECK-NEXT: // launch @[[COMB]] grid [1, 1, 1] block [128, 1, 1] strategy flash_decode
// CHECK-NEXT: // scratch {{.+}} memref<34816xf32> (139264 bytes)
module {
  func.func @region(%arg0: tensor<1x1x4x32xf32> {poot.name = "a0"}, %arg1: tensor<1x4096x2x32xf32> {poot.name = "a1"}, %arg2: tensor<1x4096x2x32xf32> {poot.name = "a2"}, %arg3: tensor<1x4096xf32> {poot.name = "a3"}) -> (tensor<1x4x1x32xf32> {poot.name = "r0"}) {
    %0 = call @attn(%arg0, %arg1, %arg2, %arg3) : (tensor<1x1x4x32xf32>, tensor<1x4096x2x32xf32>, tensor<1x4096x2x32xf32>, tensor<1x4096xf32>) -> tensor<1x4x1x32xf32>
    return %0 : tensor<1x4x1x32xf32>
  }
  func.func private @attn(%arg0: tensor<1x1x4x32xf32>, %arg1: tensor<1x4096x2x32xf32>, %arg2: tensor<1x4096x2x32xf32>, %arg3: tensor<1x4096xf32>) -> tensor<1x4x1x32xf32> attributes {poot.dispatch = {kind = "attention", ops = 7 : i64}} {
    %0 = "poot.reshape"(%arg0) : (tensor<1x1x4x32xf32>) -> tensor<1x1x2x2x32xf32>
    %1 = "poot.transpose"(%0) {perm = array<i64: 0, 2, 3, 1, 4>} : (tensor<1x1x2x2x32xf32>) -> tensor<1x2x2x1x32xf32>
    %2 = "poot.reshape"(%1) : (tensor<1x2x2x1x32xf32>) -> tensor<1x2x2x32xf32>
    %3 = "poot.reshape"(%2) : (tensor<1x2x2x32xf32>) -> tensor<1x2x2x1x32xf32>
    %4 = "poot.transpose"(%arg1) {perm = array<i64: 0, 2, 1, 3>} : (tensor<1x4096x2x32xf32>) -> tensor<1x2x4096x32xf32>
    %5 = "poot.transpose"(%arg2) {perm = array<i64: 0, 2, 1, 3>} : (tensor<1x4096x2x32xf32>) -> tensor<1x2x4096x32xf32>
    %6 = "poot.broadcast"(%arg3) {dims = array<i64: 3, 4>} : (tensor<1x4096xf32>) -> tensor<1x1x1x1x4096xf32>
    %7 = "poot.attention"(%3, %4, %5, %6) {scale = 0.17677669529663687 : f64, softcap = 0.000000e+00 : f64} : (tensor<1x2x2x1x32xf32>, tensor<1x2x4096x32xf32>, tensor<1x2x4096x32xf32>, tensor<1x1x1x1x4096xf32>) -> tensor<1x2x2x1x32xf32>
    %8 = "poot.reshape"(%7) : (tensor<1x2x2x1x32xf32>) -> tensor<1x4x1x32xf32>
    return %8 : tensor<1x4x1x32xf32>
  }
}
