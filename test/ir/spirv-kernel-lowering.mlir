// The SPIR-V lowering of poot's Vulkan backend (poot/backends/vulkan/codegen.py) on an outlined
// gpu kernel of the shape the shared generator emits: storage buffers at set 0 binding i,
// structured control flow (scf -> spirv.mlir.selection/loop, never cf branches), i64 clamp
// math of a gather narrowed to i32 (lavapipe miscompiles 64-bit compares), math -> GLSL ops,
// 32-bit index math, workgroup size from spirv.entry_point_abi.
// RUN: mlir-opt %s --pass-pipeline="builtin.module(gpu.module(scf-parallel-for-to-nested-fors,lower-affine,arith-int-range-narrowing{int-bitwidths-supported=32},canonicalize,cse),spirv-attach-target{ver=v1.3 caps=Shader,Int64 exts=SPV_KHR_storage_buffer_storage_class client_api=Vulkan},gpu.module(convert-math-to-spirv),convert-gpu-to-spirv{use-64bit-index=false})" | FileCheck %s

// CHECK: spirv.module @__spv__k Logical GLSL450
// CHECK: spirv.func @k(%{{.*}}: !spirv.ptr<!spirv.struct<(!spirv.array<4 x i32, stride=4> [0])>, StorageBuffer> {spirv.interface_var_abi = #spirv.interface_var_abi<(0, 0)>}
// CHECK-SAME: {spirv.interface_var_abi = #spirv.interface_var_abi<(0, 1)>}
// CHECK-SAME: {spirv.interface_var_abi = #spirv.interface_var_abi<(0, 2)>}
// CHECK-SAME: workgroup_size = [8, 1, 1]
// CHECK: spirv.mlir.selection
// CHECK: spirv.GL.SMax {{.*}} : i32
// CHECK: spirv.GL.SMin {{.*}} : i32
// CHECK: spirv.mlir.loop
// CHECK: spirv.GL.Exp
// CHECK-NOT: {{cf.br|cf.cond_br}}
module attributes {gpu.container_module} {
  gpu.module @k {
    gpu.func @k(%ids: memref<4xi32>, %table: memref<16x8xf32>, %out: memref<4x8xf32>) kernel
        attributes {spirv.entry_point_abi = #spirv.entry_point_abi<workgroup_size = [8, 1, 1]>} {
      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      %c8 = arith.constant 8 : index
      %c4 = arith.constant 4 : index
      %lo = arith.constant 0 : i64
      %hi = arith.constant 15 : i64
      %z = arith.constant 0.0 : f32
      %b = gpu.block_id x
      %t = gpu.thread_id x
      %ok = arith.cmpi ult, %b, %c4 : index
      scf.if %ok {
        %raw = memref.load %ids[%b] : memref<4xi32>
        %w = arith.extsi %raw : i32 to i64
        %m = arith.maxsi %w, %lo : i64
        %c = arith.minsi %m, %hi : i64
        %row = arith.index_cast %c : i64 to index
        %s = scf.for %j = %c0 to %c8 step %c1 iter_args(%acc = %z) -> (f32) {
          %v = memref.load %table[%row, %j] : memref<16x8xf32>
          %e = math.exp %v : f32
          %n = arith.addf %acc, %e : f32
          scf.yield %n : f32
        }
        memref.store %s, %out[%b, %t] : memref<4x8xf32>
      }
      gpu.return
    }
  }
}
