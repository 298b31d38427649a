// A subgroup butterfly (the shared generator's warp-per-row reduction) lowers to SPIR-V only
// at the device's subgroup size: the Vulkan codegen writes the gpu.module's target env itself
// (not spirv-attach-target, which has no subgroup-size option) with the size the device
// reports (8 on lavapipe, 32 on NVIDIA) and the GroupNonUniform capabilities it supports.
// RUN: mlir-opt %s --pass-pipeline="builtin.module(convert-gpu-to-spirv{use-64bit-index=false})" | FileCheck %s

// CHECK: spirv.module @__spv__k Logical GLSL450
// CHECK: workgroup_size = [16, 1, 1]
// CHECK: spirv.GroupNonUniformShuffleXor <Subgroup> %{{.*}}, %{{.*}} : f32, i32
module attributes {gpu.container_module} {
  gpu.module @k [#spirv.target_env<#spirv.vce<v1.3, [Shader, GroupNonUniform, GroupNonUniformShuffle], [SPV_KHR_storage_buffer_storage_class]>, api=Vulkan, #spirv.resource_limits<subgroup_size = 8>>] {
    gpu.func @k(%x: memref<16xf32>, %y: memref<16xf32>) kernel
        attributes {spirv.entry_point_abi = #spirv.entry_point_abi<workgroup_size = [16, 1, 1]>} {
      %t = gpu.thread_id x
      %c1 = arith.constant 1 : i32
      %c8 = arith.constant 8 : i32
      %v = memref.load %x[%t] : memref<16xf32>
      %s, %ok = gpu.shuffle xor %v, %c1, %c8 : f32
      %r = arith.addf %v, %s : f32
      memref.store %r, %y[%t] : memref<16xf32>
      gpu.return
    }
  }
}
