// poot-lower-to-linalg: every poot op family becomes linalg on tensors (+ tensor, arith, math,
// scf); weights become trailing function arguments listed in `poot.params`; i1 tensors are
// stored as i8; packed weights (Q8_0 ... Q6_K) are read as bytes; an op without a lowering
// rule is refused at the op.
//
// The first RUN checks the lowered IR of the chunks that lower (the refused chunk makes
// poot-opt exit 1, hence `not`); the second checks the refusal's diagnostic.
// RUN: not poot-opt %s --split-input-file --pass-pipeline='builtin.module(poot-lower-to-linalg)' 2>/dev/null | FileCheck %s
// RUN: poot-opt %s --split-input-file --pass-pipeline='builtin.module(poot-lower-to-linalg)' --verify-diagnostics

// CHECK-LABEL: func.func @elementwise(
// CHECK-SAME: attributes {poot.params = []}
// CHECK: linalg.generic {{.*}}iterator_types = ["parallel", "parallel"]{{.*}} ins(%arg0, %arg1 : tensor<2x4xf32>, tensor<2x4xf32>)
// CHECK: arith.addf
// CHECK: linalg.generic
// CHECK: ^bb0(%[[H:.*]]: bf16, %{{.*}}: bf16):
// CHECK-NEXT: %[[W:.*]] = arith.extf %[[H]] : bf16 to f32
// CHECK-NEXT: %[[E:.*]] = math.exp %[[W]] : f32
// CHECK-NEXT: %[[T:.*]] = arith.truncf %[[E]] : f32 to bf16
// CHECK-NEXT: linalg.yield %[[T]] : bf16
// CHECK-NOT: poot.
// Elementwise: binary add (f32) and a bf16 unary computed in f32.
func.func @elementwise(%x: tensor<2x4xf32>, %y: tensor<2x4xf32>, %h: tensor<4xbf16>) -> (tensor<2x4xf32>, tensor<4xbf16>) {
  %0 = "poot.binary"(%x, %y) {fn = "add"} : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
  %1 = "poot.unary"(%h) {fn = "exp"} : (tensor<4xbf16>) -> tensor<4xbf16>
  return %0, %1 : tensor<2x4xf32>, tensor<4xbf16>
}


// -----

// CHECK-LABEL: func.func @compare_select_cast(
// CHECK: %[[C:.*]] = linalg.generic {{.*}} outs(%{{.*}} : tensor<3xi8>)
// CHECK: %[[LT:.*]] = arith.cmpf olt
// CHECK-NEXT: %[[B:.*]] = arith.extui %[[LT]] : i1 to i8
// CHECK-NEXT: linalg.yield %[[B]] : i8
// CHECK: linalg.generic {{.*}} ins(%[[C]], %arg0, %arg1 : tensor<3xi8>, tensor<3xf32>, tensor<3xf32>)
// CHECK: arith.trunci %{{.*}} : i8 to i1
// CHECK: arith.select
// CHECK: arith.fptosi %{{.*}} : f32 to i8
// CHECK: arith.sitofp %{{.*}} : i32 to f32
// CHECK-NEXT: arith.truncf %{{.*}} : f32 to f16
// Compare, select and casts; i1 tensors are stored as i8.
func.func @compare_select_cast(%x: tensor<3xf32>, %y: tensor<3xf32>, %i: tensor<3xi32>) -> (tensor<3xf32>, tensor<3xi8>, tensor<3xf16>) {
  %0 = "poot.compare"(%x, %y) {pred = "lt"} : (tensor<3xf32>, tensor<3xf32>) -> tensor<3xi1>
  %1 = "poot.select"(%0, %x, %y) : (tensor<3xi1>, tensor<3xf32>, tensor<3xf32>) -> tensor<3xf32>
  %2 = "poot.cast"(%x) : (tensor<3xf32>) -> tensor<3xi8>
  %3 = "poot.cast"(%i) : (tensor<3xi32>) -> tensor<3xf16>
  return %1, %2, %3 : tensor<3xf32>, tensor<3xi8>, tensor<3xf16>
}


// -----

// CHECK-LABEL: func.func @reduce(
// CHECK: %[[Z:.*]] = arith.constant 0.000000e+00 : f32
// CHECK: %[[I:.*]] = linalg.fill ins(%[[Z]] : f32) outs(%{{.*}} : tensor<2x4xf32>)
// CHECK: linalg.generic {indexing_maps = [#map, #map1], iterator_types = ["parallel", "reduction", "parallel"]} ins(%arg0 : tensor<2x3x4xf32>) outs(%[[I]] : tensor<2x4xf32>)
// CHECK: arith.addf
// CHECK: arith.constant 0xFF800000 : f32
// CHECK: iterator_types = ["reduction", "reduction", "reduction"]
// CHECK: arith.maximumf
// Reduce: sum over axis 1 accumulates into a filled tensor; max starts at -inf.
func.func @reduce(%x: tensor<2x3x4xf32>) -> (tensor<2x4xf32>, tensor<f32>) {
  %0 = "poot.reduce"(%x) {axes = array<i64: 1>, fn = "sum"} : (tensor<2x3x4xf32>) -> tensor<2x4xf32>
  %1 = "poot.reduce"(%x) {axes = array<i64: 0, 1, 2>, fn = "max"} : (tensor<2x3x4xf32>) -> tensor<f32>
  return %0, %1 : tensor<2x4xf32>, tensor<f32>
}


// -----

// CHECK: #[[STRETCH:.*]] = affine_map<(d0, d1, d2) -> (d0, 0, d2)>
// CHECK-LABEL: func.func @views(
// CHECK: linalg.generic {indexing_maps = [#[[STRETCH]], #{{.*}}]
// CHECK: tensor.collapse_shape %arg0 {{\[}}[0, 1, 2]] : tensor<2x1x4xf32> into tensor<8xf32>
// CHECK: linalg.transpose ins(%arg1 : tensor<2x3xf32>) outs(%{{.*}} : tensor<3x2xf32>) permutation = [1, 0]
// CHECK: tensor.extract_slice %arg1[1, 0] [1, 2] [1, 2] : tensor<2x3xf32> to tensor<1x2xf32>
// CHECK: %[[S0:.*]] = tensor.insert_slice %arg1 into %{{.*}}[0, 0] [2, 3] [1, 1]
// CHECK: tensor.insert_slice %arg1 into %[[S0]][2, 0] [2, 3] [1, 1]
// Views: broadcast, reshape, transpose, slice, concat.
func.func @views(%x: tensor<2x1x4xf32>, %y: tensor<2x3xf32>) -> (tensor<2x5x4xf32>, tensor<8xf32>, tensor<3x2xf32>, tensor<1x2xf32>, tensor<4x3xf32>) {
  %0 = "poot.broadcast"(%x) {dims = array<i64: 0, 1, 2>} : (tensor<2x1x4xf32>) -> tensor<2x5x4xf32>
  %1 = "poot.reshape"(%x) : (tensor<2x1x4xf32>) -> tensor<8xf32>
  %2 = "poot.transpose"(%y) {perm = array<i64: 1, 0>} : (tensor<2x3xf32>) -> tensor<3x2xf32>
  %3 = "poot.slice"(%y) {start = array<i64: 1, 0>, limit = array<i64: 2, 3>, stride = array<i64: 1, 2>} : (tensor<2x3xf32>) -> tensor<1x2xf32>
  %4 = "poot.concat"(%y, %y) {axis = 0 : i64} : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<4x3xf32>
  return %0, %1, %2, %3, %4 : tensor<2x5x4xf32>, tensor<8xf32>, tensor<3x2xf32>, tensor<1x2xf32>, tensor<4x3xf32>
}


// -----

// CHECK-LABEL: func.func @matmul(
// CHECK: linalg.matmul ins(%arg0, %arg1 : tensor<3x5xf32>, tensor<5x4xf32>) outs(%{{.*}} : tensor<3x4xf32>)
// CHECK: tensor.expand_shape %{{.*}} output_shape [4, 3, 8] : tensor<96xf16> into tensor<4x3x8xf16>
// CHECK: linalg.batch_matmul ins(%{{.*}}, %{{.*}} : tensor<4x3x8xf16>, tensor<4x8x2xf16>) outs(%{{.*}} : tensor<4x3x2xf32>)
// CHECK: arith.truncf %{{.*}} : f32 to f16
// CHECK: tensor.expand_shape %{{.*}} output_shape [2, 2, 3, 2] : tensor<24xf16> into tensor<2x2x3x2xf16>
// Matmul: 2-D to linalg.matmul; batched f16 to batch_matmul with f32 accumulation, then f16.
func.func @matmul(%a: tensor<3x5xf32>, %b: tensor<5x4xf32>, %c: tensor<2x2x3x8xf16>, %d: tensor<2x2x8x2xf16>) -> (tensor<3x4xf32>, tensor<2x2x3x2xf16>) {
  %0 = "poot.matmul"(%a, %b) {acc = f32} : (tensor<3x5xf32>, tensor<5x4xf32>) -> tensor<3x4xf32>
  %1 = "poot.matmul"(%c, %d) {acc = f32} : (tensor<2x2x3x8xf16>, tensor<2x2x8x2xf16>) -> tensor<2x2x3x2xf16>
  return %0, %1 : tensor<3x4xf32>, tensor<2x2x3x2xf16>
}


// -----

// CHECK-LABEL: func.func @sources(
// CHECK-SAME: %arg0: tensor<4xf32>, %arg1: tensor<4xf32> {poot.param = "w"}
// CHECK-SAME: attributes {poot.params = ["w"]}
// CHECK: %[[CST:.*]] = arith.constant dense<[1.000000e+00, 2.000000e+00, 3.000000e+00, 4.000000e+00]> : tensor<4xf32>
// CHECK: ins(%arg0, %arg1, %[[CST]] :
// CHECK: arith.mulf
// CHECK-NEXT: arith.addf
// CHECK: ^bb0(%{{.*}}: i32):
// CHECK-NEXT: %[[IX:.*]] = linalg.index 1 : index
// Sources: params become trailing arguments (in first-use order), constants and iota.
func.func @sources(%x: tensor<4xf32>) -> (tensor<4xf32>, tensor<2x3xi32>) {
  %0 = "poot.param"() {name = "w"} : () -> tensor<4xf32>
  %1 = "poot.constant"() {value = dense<[1.0, 2.0, 3.0, 4.0]> : tensor<4xf32>} : () -> tensor<4xf32>
  %2 = "poot.ternary"(%x, %0, %1) {fn = "fma"} : (tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %3 = "poot.iota"() {axis = 1 : i64} : () -> tensor<2x3xi32>
  return %2, %3 : tensor<4xf32>, tensor<2x3xi32>
}


// -----

// CHECK-LABEL: func.func @indexing(
// CHECK: arith.maxsi
// CHECK-NEXT: arith.minsi
// CHECK: tensor.extract %arg0[
// CHECK: scf.for %[[N:.*]] = %{{.*}} to %{{.*}} step %{{.*}} iter_args(%[[D:.*]] = %arg2) -> (tensor<5x4xf32>)
// CHECK: arith.cmpi sge
// CHECK: arith.cmpi sle
// CHECK: %[[OK:.*]] = arith.andi
// CHECK: %[[AT:.*]] = arith.index_cast
// CHECK: %[[NEW:.*]] = tensor.extract_slice %arg4[%[[N]], 0] [1, 4] [1, 1] : tensor<2x4xf32> to tensor<4xf32>
// CHECK: %[[CUR:.*]] = tensor.extract_slice %[[D]][%[[AT]], 0] [1, 4] [1, 1]
// CHECK: %[[ROW:.*]] = linalg.generic {{.*}} ins(%[[NEW]], %[[CUR]] :
// CHECK: arith.select %[[OK]]
// CHECK: %[[W:.*]] = tensor.insert_slice %[[ROW]] into %[[D]][%[[AT]], 0] [1, 4] [1, 1]
// CHECK-NEXT: scf.yield %[[W]]
// Indexing: gather with clamped indices; scatter as a loop over update rows, each written at
// clamped coordinates as itself (in range) or as the row already there (out of range).
func.func @indexing(%t: tensor<6x4xf32>, %i: tensor<3xi32>, %d: tensor<5x4xf32>, %r: tensor<2x1xi64>, %u: tensor<2x4xf32>) -> (tensor<3x4xf32>, tensor<5x4xf32>) {
  %0 = "poot.gather"(%t, %i) {axis = 0 : i64} : (tensor<6x4xf32>, tensor<3xi32>) -> tensor<3x4xf32>
  %1 = "poot.scatter"(%d, %r, %u) : (tensor<5x4xf32>, tensor<2x1xi64>, tensor<2x4xf32>) -> tensor<5x4xf32>
  return %0, %1 : tensor<3x4xf32>, tensor<5x4xf32>
}


// -----

// CHECK-LABEL: func.func @indexed_matmul(
// CHECK: linalg.fill
// CHECK: linalg.generic {{.*}}iterator_types = ["parallel", "parallel", "reduction"]{{.*}} ins(%arg0, %arg1 : tensor<3x8xf32>, tensor<3xi32>)
// CHECK: arith.maxsi
// CHECK: arith.minsi
// CHECK: tensor.extract %arg2[{{.*}}] : tensor<4x5x8xbf16>
// CHECK: arith.extf {{.*}} : bf16 to f32
// CHECK: arith.mulf
// CHECK: arith.addf
// CHECK-NOT: poot.
// indexed_matmul, portable: one generic over (t, o, k) reading w[clamp(idx[t]), o, k].
func.func @indexed_matmul(%x: tensor<3x8xf32>, %i: tensor<3xi32>, %w: tensor<4x5x8xbf16>) -> tensor<3x5xf32> {
  %0 = "poot.indexed_matmul"(%x, %w, %i) {acc = f32} : (tensor<3x8xf32>, tensor<4x5x8xbf16>, tensor<3xi32>) -> tensor<3x5xf32>
  return %0 : tensor<3x5xf32>
}


// -----

// CHECK-LABEL: func.func @dequantize_q8_0(
// CHECK-SAME: %arg1: tensor<136xi8> {poot.packed = "q8_0", poot.param = "wq"}
// CHECK: arith.constant 34 : index
// CHECK: arith.extui %{{.*}} : i8 to i16
// CHECK: arith.shli
// CHECK: %[[WORD:.*]] = arith.ori
// CHECK-NEXT: %[[D:.*]] = arith.bitcast %[[WORD]] : i16 to f16
// CHECK-NEXT: %[[DF:.*]] = arith.extf %[[D]] : f16 to f32
// CHECK: %[[Q:.*]] = arith.sitofp %{{.*}} : i8 to f32
// CHECK-NEXT: arith.mulf %[[Q]], %[[DF]] : f32
// CHECK: linalg.matmul
// Dequantize Q8_0: the packed weight is its bytes (2 rows x 2 blocks x 34 = 136), f16 scale from an i16 word.
func.func @dequantize_q8_0(%x: tensor<1x64xf32>) -> tensor<1x2xf32> {
  %0 = "poot.packed_param"() {name = "wq"} : () -> !poot.packed<#poot.q8_0, array<i64: 2, 64>>
  %1 = "poot.dequantize"(%0) : (!poot.packed<#poot.q8_0, array<i64: 2, 64>>) -> tensor<2x64xf32>
  %2 = "poot.transpose"(%1) {perm = array<i64: 1, 0>} : (tensor<2x64xf32>) -> tensor<64x2xf32>
  %3 = "poot.matmul"(%x, %2) {acc = f32} : (tensor<1x64xf32>, tensor<64x2xf32>) -> tensor<1x2xf32>
  return %3 : tensor<1x2xf32>
}


// -----

// CHECK-LABEL: func.func @dequantize_q4_k(
// CHECK-SAME: %arg0: tensor<288xi8> {poot.packed = "q4_k", poot.param = "wk"}
// CHECK: arith.constant 144 : index
// CHECK: arith.cmpi uge
// CHECK: arith.select
// CHECK: arith.subf
func.func @dequantize_q4_k() -> tensor<2x256xf32> {
  %0 = "poot.packed_param"() {name = "wk"} : () -> !poot.packed<#poot.q4_k, array<i64: 2, 256>>
  %1 = "poot.dequantize"(%0) : (!poot.packed<#poot.q4_k, array<i64: 2, 256>>) -> tensor<2x256xf32>
  return %1 : tensor<2x256xf32>
}

// -----

// An op without a lowering rule (here a foreign op inside a poot function) is a typed
// refusal at the op; the function is not lowered.
// CHECK-NOT: func.func @refused_foreign_op
func.func @refused_foreign_op(%x: tensor<4xf32>) -> tensor<4xf32> {
  %0 = "poot.unary"(%x) {fn = "exp"} : (tensor<4xf32>) -> tensor<4xf32>
  // expected-error @+1 {{'arith.addf' op cannot be lowered to linalg: no lowering rule for this op}}
  %1 = arith.addf %0, %x : tensor<4xf32>
  return %1 : tensor<4xf32>
}
