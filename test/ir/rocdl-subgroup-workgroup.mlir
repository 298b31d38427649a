// The ROCDL lowering (poot/backends/rocm/codegen.py, rocdl_pipeline) of what the attention,
// GEMM, GEMV and row-reduction strategies share: a subgroup butterfly (gpu.shuffle xor) at
// the arch's wavefront becomes ds_bpermute with the lane id from mbcnt, a workgroup
// attribution becomes an LDS global (addr_space 3), gpu.barrier the workgroup barrier. The
// same kernel lowers for CDNA (gfx942, wave64) and RDNA (gfx1100, wave32).
// RUN: mlir-opt %s --pass-pipeline="builtin.module(convert-vector-to-scf,convert-scf-to-cf,expand-strided-metadata,rocdl-attach-target{chip=gfx942},lower-affine,arith-expand{include-bf16=true},convert-arith-to-llvm,convert-index-to-llvm{index-bitwidth=64},canonicalize,cse,gpu.module(math-expand-ops{ops=tanh,sinh,cosh,asinh,acosh,atanh,powf,fpowi},convert-gpu-to-rocdl{chipset=gfx942 index-bitwidth=64 use-bare-ptr-memref-call-conv=true},canonicalize,cse,reconcile-unrealized-casts),reconcile-unrealized-casts)" | FileCheck %s
// RUN: mlir-opt %s --pass-pipeline="builtin.module(convert-vector-to-scf,convert-scf-to-cf,expand-strided-metadata,rocdl-attach-target{chip=gfx1100},lower-affine,arith-expand{include-bf16=true},convert-arith-to-llvm,convert-index-to-llvm{index-bitwidth=64},canonicalize,cse,gpu.module(math-expand-ops{ops=tanh,sinh,cosh,asinh,acosh,atanh,powf,fpowi},convert-gpu-to-rocdl{chipset=gfx1100 index-bitwidth=64 use-bare-ptr-memref-call-conv=true},canonicalize,cse,reconcile-unrealized-casts),reconcile-unrealized-casts)" | FileCheck %s --check-prefix=RDNA

// CHECK: rocdl.target<chip = "gfx942">
// CHECK: llvm.mlir.global internal @__wg_k_0() {addr_space = 3 : i32} : !llvm.array<2 x f32>
// CHECK: llvm.func @k(%{{.*}}: !llvm.ptr, %{{.*}}: !llvm.ptr)
// CHECK: llvm.mlir.addressof @__wg_k_0 : !llvm.ptr<3>
// CHECK: rocdl.mbcnt.lo
// CHECK: rocdl.mbcnt.hi
// CHECK: rocdl.ds_bpermute
// CHECK: rocdl.barrier
// RDNA: rocdl.target<chip = "gfx1100">
// RDNA: rocdl.ds_bpermute
// RDNA: rocdl.barrier
module attributes {gpu.container_module} {
  gpu.module @k {
    gpu.func @k(%x: memref<64xf32>, %y: memref<1xf32>) workgroup(%buf : memref<2xf32, #gpu.address_space<workgroup>>) kernel
        attributes {known_block_size = array<i32: 64, 1, 1>} {
      %t = gpu.thread_id x
      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      %c32 = arith.constant 32 : i32
      %one = arith.constant 1 : i32
      %v = memref.load %x[%t] : memref<64xf32>
      %s, %ok = gpu.shuffle xor %v, %one, %c32 : f32
      %r = arith.addf %v, %s : f32
      memref.store %r, %buf[%c0] : memref<2xf32, #gpu.address_space<workgroup>>
      gpu.barrier
      %w = memref.load %buf[%c0] : memref<2xf32, #gpu.address_space<workgroup>>
      memref.store %w, %y[%c0] : memref<1xf32>
      gpu.return
    }
  }
}
