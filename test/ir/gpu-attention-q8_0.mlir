// A poot.paged_attention over q8_0 KV pools (i8 values, one f16 scale per 32 of them; the
// scales are the trailing operands) planned by `poot-opt --gpu-kernels`: the target it plans
// for lists q8_0 among its KV formats (poot/opt.py gpu_caps, from the GPU target's
// Capabilities.kv_formats), so planning takes it, and the block loop's kernel reads the i8
// pools and their f16 scales in place, dequantizing where it loads (sitofp, times the
// widened scale). GQA decode, 2 kv heads x 2 query heads, D = 32, 4-key blocks, 12 keys.
// RUN: poot-opt %s --gpu-kernels --gpu-subgroup-size=32 --gpu-shared-bytes=49152 --gpu-cores=132 | FileCheck %s

// CHECK-LABEL: gpu.module @poot_kernels
// CHECK: gpu.func @[[K:k[0-9]+_[0-9a-f]+]](%{{.+}}: memref<i32>, %{{.+}}: memref<1x3xi32>, %{{.+}}: memref<5x4x2x32xi8>, %{{.+}}: memref<5x4x2x1xf16>, %{{.+}}: memref<4x1x1x32xf32>, %{{.+}}: memref<5x4x2x32xi8>, %{{.+}}: memref<5x4x2x1xf16>,
// CHECK: memref.load %{{.+}} : memref<1x3xi32>
// CHECK: arith.sitofp %{{.+}} : i8 to f32
// CHECK-NEXT: arith.extf %{{.+}} : f16 to f32
// CHECK-NEXT: arith.mulf
// CHECK: math.exp
// CHECK: gpu.return
// CHECK: // launch @[[K]] grid
module {
  func.func @region(%q: tensor<1x2x2x1x32xf32> {poot.name = "a0"}, %kp: tensor<5x4x2x32xi8> {poot.name = "a1"}, %vp: tensor<5x4x2x32xi8> {poot.name = "a2"}, %bt: tensor<1x3xi32> {poot.name = "a3"}, %m: tensor<1x1x1x1x12xi1> {poot.name = "a4"}, %ks: tensor<5x4x2x1xf16> {poot.name = "a5"}, %vs: tensor<5x4x2x1xf16> {poot.name = "a6"}) -> (tensor<1x2x2x1x32xf32> {poot.name = "r0"}) {
    %0 = call @attn(%q, %kp, %vp, %bt, %m, %ks, %vs) : (tensor<1x2x2x1x32xf32>, tensor<5x4x2x32xi8>, tensor<5x4x2x32xi8>, tensor<1x3xi32>, tensor<1x1x1x1x12xi1>, tensor<5x4x2x1xf16>, tensor<5x4x2x1xf16>) -> tensor<1x2x2x1x32xf32>
    return %0 : tensor<1x2x2x1x32xf32>
  }
  func.func private @attn(%q: tensor<1x2x2x1x32xf32>, %kp: tensor<5x4x2x32xi8>, %vp: tensor<5x4x2x32xi8>, %bt: tensor<1x3xi32>, %m: tensor<1x1x1x1x12xi1>, %ks: tensor<5x4x2x1xf16>, %vs: tensor<5x4x2x1xf16>) -> tensor<1x2x2x1x32xf32> attributes {poot.dispatch = {kind = "attention", ops = 1 : i64}} {
    %0 = "poot.paged_attention"(%q, %kp, %vp, %bt, %m, %ks, %vs) {scale = 1.250000e-01 : f64, softcap = 0.000000e+00 : f64} : (tensor<1x2x2x1x32xf32>, tensor<5x4x2x32xi8>, tensor<5x4x2x32xi8>, tensor<1x3xi32>, tensor<1x1x1x1x12xi1>, tensor<5x4x2x1xf16>, tensor<5x4x2x1xf16>) -> tensor<1x2x2x1x32xf32>
    return %0 : tensor<1x2x2x1x32xf32>
  }
}
