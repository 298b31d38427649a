// poot-legalize: arithmetic in a dtype the target cannot compute in runs in f32 between casts;
// storage keeps the declared dtype -- unless the target cannot store it either (option
// storage): then f16/bf16 values are stored, and so computed, as f32 (prefix STORE).
// RUN: poot-opt %s --split-input-file -p 'builtin.module(poot-legalize{compute=f32,i64,i32,i8,i1},poot-verify)' | FileCheck %s
// RUN: poot-opt %s --split-input-file -p 'builtin.module(poot-legalize{compute=f32,f16,bf16,i64,i32,i8,i1})' | FileCheck %s --check-prefix=NATIVE
// RUN: poot-opt %s --split-input-file -p 'builtin.module(poot-legalize{compute=f32,i64,i32,i8,i1 storage=f32,i64,i32,i8,i1},poot-verify)' | FileCheck %s --check-prefix=STORE
// A target that stores Q4 weights row-interleaved (option layouts): 2-D packed weights of
// those formats with N a multiple of 16 take the layout (prefix LAYOUT).
// RUN: poot-opt %s --split-input-file -p 'builtin.module(poot-legalize{layouts=q4_0_r16,q4_1_r16},poot-verify)' | FileCheck %s --check-prefix=LAYOUT

// CHECK-LABEL: func.func @half_exp
// CHECK: %[[W:.*]] = "poot.cast"(%arg0) : (tensor<4xf16>) -> tensor<4xf32>
// CHECK: %[[E:.*]] = "poot.unary"(%[[W]]) {fn = "exp"} : (tensor<4xf32>) -> tensor<4xf32>
// CHECK: %[[N:.*]] = "poot.cast"(%[[E]]) : (tensor<4xf32>) -> tensor<4xf16>
// CHECK: return %[[N]]
// NATIVE-LABEL: func.func @half_exp
// NATIVE-NOT: poot.cast
func.func @half_exp(%a: tensor<4xf16>) -> tensor<4xf16> {
  %0 = "poot.unary"(%a) {fn = "exp"} : (tensor<4xf16>) -> tensor<4xf16>
  return %0 : tensor<4xf16>
}

// -----

// bf16 matmul: both operands widened, f32 result kept as declared (no narrowing cast).
// CHECK-LABEL: func.func @bf16_matmul
// CHECK-DAG: "poot.cast"(%arg0) : (tensor<2x8xbf16>) -> tensor<2x8xf32>
// CHECK-DAG: "poot.cast"(%arg1) : (tensor<8x4xbf16>) -> tensor<8x4xf32>
// CHECK: "poot.matmul"(%{{.*}}, %{{.*}}) {acc = f32} : (tensor<2x8xf32>, tensor<8x4xf32>) -> tensor<2x4xf32>
// CHECK-NEXT: return
func.func @bf16_matmul(%a: tensor<2x8xbf16>, %b: tensor<8x4xbf16>) -> tensor<2x4xf32> {
  %0 = "poot.matmul"(%a, %b) {acc = f32} : (tensor<2x8xbf16>, tensor<8x4xbf16>) -> tensor<2x4xf32>
  return %0 : tensor<2x4xf32>
}

// -----

// compare keeps its i1 result; views and data movement are not arithmetic: untouched.
// CHECK-LABEL: func.func @compare_and_views
// CHECK: "poot.compare"(%{{.*}}, %{{.*}}) {pred = "lt"} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xi1>
// CHECK: "poot.reshape"(%arg0) : (tensor<4xf16>) -> tensor<2x2xf16>
func.func @compare_and_views(%a: tensor<4xf16>, %b: tensor<4xf16>) -> (tensor<4xi1>, tensor<2x2xf16>) {
  %0 = "poot.compare"(%a, %b) {pred = "lt"} : (tensor<4xf16>, tensor<4xf16>) -> tensor<4xi1>
  %1 = "poot.reshape"(%a) : (tensor<4xf16>) -> tensor<2x2xf16>
  return %0, %1 : tensor<4xi1>, tensor<2x2xf16>
}

// -----

// f32 and integer arithmetic is already legal: the pass must not fire.
// CHECK-LABEL: func.func @legal
// CHECK-NOT: poot.cast
// CHECK: "poot.binary"
func.func @legal(%a: tensor<4xf32>, %b: tensor<4xi32>) -> (tensor<4xf32>, tensor<4xi32>) {
  %0 = "poot.binary"(%a, %a) {fn = "add"} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %1 = "poot.binary"(%b, %b) {fn = "mul"} : (tensor<4xi32>, tensor<4xi32>) -> tensor<4xi32>
  return %0, %1 : tensor<4xf32>, tensor<4xi32>
}

// -----

// A target that stores f32 but no 16-bit float: arguments, weights, constants and results of
// f16/bf16 become f32 (the function type too), so no cast is left to insert.
// STORE-LABEL: func.func @stored_wide(%arg0: tensor<4xf32>) -> (tensor<4xf32>, tensor<2xf32>)
// STORE: "poot.param"() {name = "w"} : () -> tensor<4xf32>
// STORE: "poot.constant"() {value = dense<[1.500000e+00, -2.000000e+00]> : tensor<2xf32>}
// STORE-NOT: poot.cast
// STORE: "poot.binary"(%arg0, %{{.*}}) {fn = "add"} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
// CHECK-LABEL: func.func @stored_wide(%arg0: tensor<4xbf16>)
// CHECK: "poot.param"() {name = "w"} : () -> tensor<4xbf16>
func.func @stored_wide(%a: tensor<4xbf16>) -> (tensor<4xbf16>, tensor<2xf16>) {
  %w = "poot.param"() {name = "w"} : () -> tensor<4xbf16>
  %c = "poot.constant"() {value = dense<[1.5, -2.0]> : tensor<2xf16>} : () -> tensor<2xf16>
  %0 = "poot.binary"(%a, %w) {fn = "add"} : (tensor<4xbf16>, tensor<4xbf16>) -> tensor<4xbf16>
  return %0, %c : tensor<4xbf16>, tensor<2xf16>
}

// -----

// Row-interleaved storage: the q4_1 [32, 64] weight takes q4_1_r16 (its dequantize reads the
// new type); q8_0 has no such layout and N = 8 is not a multiple of 16: both kept.
// LAYOUT-LABEL: func.func @stored_layouts
// LAYOUT: "poot.packed_param"() {name = "w"} : () -> !poot.packed<#poot.q4_1_r16, array<i64: 32, 64>>
// LAYOUT: "poot.dequantize"(%{{.*}}) : (!poot.packed<#poot.q4_1_r16, array<i64: 32, 64>>) -> tensor<32x64xf32>
// LAYOUT: "poot.packed_param"() {name = "e"} : () -> !poot.packed<#poot.q8_0, array<i64: 32, 64>>
// LAYOUT: "poot.packed_param"() {name = "s"} : () -> !poot.packed<#poot.q4_1, array<i64: 8, 64>>
// CHECK-LABEL: func.func @stored_layouts
// CHECK: "poot.packed_param"() {name = "w"} : () -> !poot.packed<#poot.q4_1, array<i64: 32, 64>>
func.func @stored_layouts() -> (tensor<32x64xf32>, tensor<32x64xf32>, tensor<8x64xf32>) {
  %w = "poot.packed_param"() {name = "w"} : () -> !poot.packed<#poot.q4_1, array<i64: 32, 64>>
  %0 = "poot.dequantize"(%w) : (!poot.packed<#poot.q4_1, array<i64: 32, 64>>) -> tensor<32x64xf32>
  %e = "poot.packed_param"() {name = "e"} : () -> !poot.packed<#poot.q8_0, array<i64: 32, 64>>
  %1 = "poot.dequantize"(%e) : (!poot.packed<#poot.q8_0, array<i64: 32, 64>>) -> tensor<32x64xf32>
  %s = "poot.packed_param"() {name = "s"} : () -> !poot.packed<#poot.q4_1, array<i64: 8, 64>>
  %2 = "poot.dequantize"(%s) : (!poot.packed<#poot.q4_1, array<i64: 8, 64>>) -> tensor<8x64xf32>
  return %0, %1, %2 : tensor<32x64xf32>, tensor<32x64xf32>, tensor<8x64xf32>
}
