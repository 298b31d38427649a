// The ROCDL lowering of poot's ROCm backend (poot/backends/rocm/codegen.py, rocdl_pipeline) on
// an outlined kernel of the shape every shared strategy emits (pointwise, row reductions, the
// GEMV, the scatter): bare-pointer kernel arguments (one !llvm.ptr per buffer, no memref
// descriptors: 8 kernarg bytes each), the known block size as the AMDGPU workgroup-size
// attributes, math the AMDGPU backend selects natively (exp, sqrt) as LLVM intrinsics,
// sin/cos as ocml calls (which codegen then defines itself: no device libraries here), and
// tanh expanded into exp before the conversion (LLVM has no AMDGPU lowering for llvm.tanh).
// RUN: mlir-opt %s --pass-pipeline="builtin.module(convert-vector-to-scf,convert-scf-to-cf,expand-strided-metadata,rocdl-attach-target{chip=gfx942},lower-affine,arith-expand{include-bf16=true},convert-arith-to-llvm,convert-index-to-llvm{index-bitwidth=64},canonicalize,cse,gpu.module(math-expand-ops{ops=tanh,sinh,cosh,asinh,acosh,atanh,powf,fpowi},convert-gpu-to-rocdl{chipset=gfx942 index-bitwidth=64 use-bare-ptr-memref-call-conv=true},canonicalize,cse,reconcile-unrealized-casts),reconcile-unrealized-casts)" | FileCheck %s

// CHECK: rocdl.target<chip = "gfx942">
// CHECK: llvm.func @__ocml_sin_f32(f32) -> f32
// CHECK: llvm.func @__ocml_cos_f32(f32) -> f32
// CHECK: llvm.func @k(%{{.*}}: !llvm.ptr, %{{.*}}: !llvm.ptr) attributes
// CHECK-SAME: rocdl.flat_work_group_size = "64,64", rocdl.kernel, rocdl.reqd_work_group_size = array<i32: 64, 1, 1>
// CHECK: rocdl.workitem.id.x
// CHECK: llvm.call @__ocml_sin_f32
// CHECK: llvm.call @__ocml_cos_f32
// CHECK: llvm.intr.exp
// CHECK: llvm.intr.exp
// CHECK: llvm.intr.sqrt
// CHECK-NOT: tanh
module attributes {gpu.container_module} {
  gpu.module @k {
    gpu.func @k(%x: memref<64xf32>, %y: memref<64xf32>) kernel
        attributes {known_block_size = array<i32: 64, 1, 1>} {
      %t = gpu.thread_id x
      %v = memref.load %x[%t] : memref<64xf32>
      %s = math.sin %v : f32
      %c = math.cos %v : f32
      %h = math.tanh %s : f32
      %e = math.exp %c : f32
      %q = math.sqrt %e : f32
      %a = arith.addf %h, %q : f32
      memref.store %a, %y[%t] : memref<64xf32>
      gpu.return
    }
  }
}
