// The ROCDL lowering (poot/backends/rocm/codegen.py, rocdl_pipeline) of what the prefill GEMM
// strategy (poot/backends/gpu/strategies/gemm.py) emits on AMD: each lane's operand run read
// from a workgroup tile as one vector (an LDS load of 4 or 16 halves), the f32 accumulators
// gathered into a vector, and the arch's matrix instruction: v_mfma_f32_16x16x16_f16 on CDNA
// (gfx942, wave64: 4 accumulators a lane), v_wmma_f32_16x16x16_f16 on RDNA 3 (gfx1100, wave32:
// 8). The instruction reaches LLVM IR as its intrinsic; the AMDGPU backend selects it
// (test/gpu/test_gpu_gemm_matrix_ops.py reads the assembly).
// RUN: mlir-opt %s --pass-pipeline="builtin.module(convert-vector-to-scf,convert-scf-to-cf,expand-strided-metadata,rocdl-attach-target{chip=gfx942},lower-affine,arith-expand{include-bf16=true},convert-arith-to-llvm,convert-index-to-llvm{index-bitwidth=64},canonicalize,cse,gpu.module(math-expand-ops{ops=tanh,sinh,cosh,asinh,acosh,atanh,powf,fpowi},convert-gpu-to-rocdl{chipset=gfx942 index-bitwidth=64 use-bare-ptr-memref-call-conv=true},canonicalize,cse,reconcile-unrealized-casts),reconcile-unrealized-casts)" | FileCheck %s
// RUN: mlir-opt %s --pass-pipeline="builtin.module(convert-vector-to-scf,convert-scf-to-cf,expand-strided-metadata,rocdl-attach-target{chip=gfx1100},lower-affine,arith-expand{include-bf16=true},convert-arith-to-llvm,convert-index-to-llvm{index-bitwidth=64},canonicalize,cse,gpu.module(math-expand-ops{ops=tanh,sinh,cosh,asinh,acosh,atanh,powf,fpowi},convert-gpu-to-rocdl{chipset=gfx1100 index-bitwidth=64 use-bare-ptr-memref-call-conv=true},canonicalize,cse,reconcile-unrealized-casts),reconcile-unrealized-casts)" | FileCheck %s --check-prefix=RDNA

// CHECK: rocdl.target<chip = "gfx942">
// CHECK-LABEL: llvm.func @mfma(
// CHECK: rocdl.workitem.id.x
// CHECK: llvm.load %{{.*}} {alignment = 8 : i64} : !llvm.ptr<3> -> vector<4xi16>
// CHECK: llvm.bitcast %{{.*}} : vector<4xi16> to vector<4xf16>
// CHECK: rocdl.mfma.f32.16x16x16f16 {{.*}} : (vector<4xf16>, vector<4xf16>, vector<4xf32>, i32, i32, i32) -> vector<4xf32>
// CHECK: llvm.extractelement
// RDNA: rocdl.target<chip = "gfx1100">
// RDNA-LABEL: llvm.func @wmma(
// RDNA: llvm.load %{{.*}} {alignment = 16 : i64} : !llvm.ptr<3> -> vector<16xi16>
// RDNA: rocdl.wmma.f32.16x16x16.f16 {{.*}} : (vector<16xf16>, vector<16xf16>, vector<8xf32>) -> vector<8xf32>
module attributes {gpu.container_module} {
  gpu.module @k {
    gpu.func @mfma(%y: memref<1024xf32>) workgroup(%sa: memref<16x24xi16, #gpu.address_space<workgroup>> {llvm.align = 16 : i64}) kernel
        attributes {known_block_size = array<i32: 64, 1, 1>} {
      %t = gpu.thread_id x
      %c4 = arith.constant 4 : index
      %c15 = arith.constant 15 : index
      %row = arith.andi %t, %c15 : index
      %hi = arith.shrui %t, %c4 : index
      %k = arith.muli %hi, %c4 : index
      %a = vector.load %sa[%row, %k] {alignment = 8 : i64} : memref<16x24xi16, #gpu.address_space<workgroup>>, vector<4xi16>
      %ah = vector.bitcast %a : vector<4xi16> to vector<4xf16>
      %z = arith.constant 0.0 : f32
      %c = vector.from_elements %z, %z, %z, %z : vector<4xf32>
      %i0 = arith.constant 0 : i32
      %d = rocdl.mfma.f32.16x16x16f16 %ah, %ah, %c, %i0, %i0, %i0 : (vector<4xf16>, vector<4xf16>, vector<4xf32>, i32, i32, i32) -> vector<4xf32>
      %d0 = vector.extract %d[0] : f32 from vector<4xf32>
      memref.store %d0, %y[%t] : memref<1024xf32>
      gpu.return
    }
    gpu.func @wmma(%y: memref<1024xf32>) workgroup(%sa: memref<16x24xi16, #gpu.address_space<workgroup>> {llvm.align = 16 : i64}) kernel
        attributes {known_block_size = array<i32: 32, 1, 1>} {
      %t = gpu.thread_id x
      %c0 = arith.constant 0 : index
      %c15 = arith.constant 15 : index
      %row = arith.andi %t, %c15 : index
      %a = vector.load %sa[%row, %c0] {alignment = 16 : i64} : memref<16x24xi16, #gpu.address_space<workgroup>>, vector<16xi16>
      %ah = vector.bitcast %a : vector<16xi16> to vector<16xf16>
      %z = arith.constant 0.0 : f32
      %c = vector.from_elements %z, %z, %z, %z, %z, %z, %z, %z : vector<8xf32>
      %d = rocdl.wmma.f32.16x16x16.f16 %ah, %ah, %c : (vector<16xf16>, vector<16xf16>, vector<8xf32>) -> vector<8xf32>
      %d0 = vector.extract %d[7] : f32 from vector<8xf32>
      memref.store %d0, %y[%t] : memref<1024xf32>
      gpu.return
    }
  }
}
