// The GEMM strategy (poot/backends/gpu/strategies/gemm.py) over a prefill projection
// (x [256, 64] . W^T, a bf16 W [128, 64]: a 256-token prompt chunk; at 128 rows or fewer the
// decode GEMM takes a dense weight), as `poot-opt --gpu-kernels` prints the shared GPU plan for
// an sm_90 target with an H100's 227 KB of workgroup memory: warp-level mma.sync m16n8k16 on
// bf16 tiles staged in workgroup memory, the weight streamed through a cp.async ring.
// RUN: poot-opt %s --gpu-kernels --gpu-subgroup-size=32 --gpu-shared-bytes=232448 --gpu-cores=132 --gpu-features=sm_90 | FileCheck %s
// Without a matrix instruction (no sm_80+ feature) no strategy takes these rows: the
// generic mapping (poot/backends/gpu/kernels.py) does.
// RUN: poot-opt %s --gpu-kernels --gpu-subgroup-size=32 --gpu-shared-bytes=232448 --gpu-cores=132 | FileCheck %s --check-prefix=NOMMA

// CHECK-LABEL: gpu.module @poot_kernels
// the block: 8 warps; x's tile (converted to bf16, 2 buffers of 128 x (64 + 8) words) and the
// weight's ring of 4 stages of 128 x (64 + 8) words
// CHECK: gpu.func @[[K:k0_[0-9a-f]+]](%{{.+}}: memref<16384xf32> {{.*}}, %[[W:.+]]: memref<8192xi16> {{.*}}, %[[Y:.+]]: memref<1x256x128xf32>) workgroup(%[[XS:.+]] : memref<2x128x72xi16, #gpu.address_space<workgroup>> {{.*}}, %[[WS:.+]] : memref<4x128x72xi16, #gpu.address_space<workgroup>> {{.*}}) kernel attributes {known_block_size = array<i32: 256, 1, 1>}
// the prologue: weight stages in flight (cp.async groups), x converted and stored
// CHECK: nvgpu.device_async_copy %[[W]][%{{.+}}], %[[WS]][{{.+}}], 8 {bypassL1}
// CHECK: nvgpu.device_async_create_group
// CHECK: nvvm.convert.f32x2.to.bf16x2
// CHECK: vector.store %{{.+}}, %[[XS]]
// CHECK: nvgpu.device_async_wait %{{.+}} {numGroups = 2 : i32}
// CHECK-NEXT: gpu.barrier
// the K loop: 64 accumulators a lane (2 x 8 mma tiles of 4), fragments by ldmatrix
// CHECK: scf.for %{{.+}} = %c0 to %c1 step %c1 iter_args({{.*}}) -> ({{(f32, ){63}f32}}) {
// CHECK: nvgpu.device_async_copy
// CHECK: nvgpu.ldmatrix %[[XS]][{{.+}}] {numTiles = 4 : i32, transpose = false}
// CHECK: nvgpu.ldmatrix %[[WS]][{{.+}}] {numTiles = 4 : i32, transpose = false}
// CHECK-COUNT-16: nvvm.mma.sync A[{{.+}}] B[{{.+}}] C[{{.+}}] {{.*}}multiplicandAPtxType = #nvvm.mma_type<bf16>{{.*}}shape = #nvvm.shape<m = 16, n = 8, k = 16>
// CHECK: gpu.barrier
// CHECK-NEXT: scf.yield
// CHECK-COUNT-64: memref.store %{{.+}}, %[[Y]][%c0, %{{.+}}, %{{.+}}] : memref<1x256x128xf32>
// CHECK: gpu.return
// CHECK: // launch @[[K]] grid [1, 2, 1] block [256, 1, 1] strategy gemm
// NOMMA-NOT: nvvm.mma.sync
// NOMMA-NOT: strategy gemm
// NOMMA: // launch @{{.+}} strategy naive
module {
  func.func @region(%arg0: tensor<1x256x64xf32> {poot.name = "a0"}, %arg1: tensor<128x64xbf16> {poot.name = "a1"}) -> (tensor<1x256x128xf32> {poot.name = "r0"}) {
    %0 = call @gemv_dispatch(%arg0, %arg1) : (tensor<1x256x64xf32>, tensor<128x64xbf16>) -> tensor<1x256x128xf32>
    return %0 : tensor<1x256x128xf32>
  }
  func.func private @gemv_dispatch(%arg0: tensor<1x256x64xf32>, %arg1: tensor<128x64xbf16>) -> tensor<1x256x128xf32> attributes {poot.dispatch = {kind = "matmul", ops = 5 : i64}} {
    %0 = "poot.reshape"(%arg0) : (tensor<1x256x64xf32>) -> tensor<256x64xf32>
    %1 = "poot.cast"(%arg1) : (tensor<128x64xbf16>) -> tensor<128x64xf32>
    %2 = "poot.transpose"(%1) {perm = array<i64: 1, 0>} : (tensor<128x64xf32>) -> tensor<64x128xf32>
    %3 = "poot.matmul"(%0, %2) {acc = f32} : (tensor<256x64xf32>, tensor<64x128xf32>) -> tensor<256x128xf32>
    %4 = "poot.reshape"(%3) : (tensor<256x128xf32>) -> tensor<1x256x128xf32>
    return %4 : tensor<1x256x128xf32>
  }
}
