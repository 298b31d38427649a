// poot-fuse-dispatch: each fusable region becomes one private function with a poot.dispatch
// kind, called from the entry function. Cases that must fuse and cases that must not.
// RUN: poot-opt %s --split-input-file --pass-pipeline='builtin.module(poot-fuse-dispatch,poot-verify)' | FileCheck %s
// RUN: poot-opt %s --split-input-file --pass-pipeline='builtin.module(poot-fuse-dispatch{max-region-ops=2})' | FileCheck %s --check-prefix=SMALL

// A chain of elementwise ops (with a broadcast constant) is one elementwise region; the
// constant is cloned into it, the param is an input.
// CHECK-LABEL: func.func @chain(
// CHECK-NEXT: %[[W:.+]] = "poot.param"() {name = "w"}
// CHECK-NEXT: %[[R:.+]] = call @chain_dispatch_0(%arg0, %[[W]])
// CHECK-NEXT: return %[[R]]
// CHECK: func.func private @chain_dispatch_0(%{{.+}}: tensor<4x8xf32>, %{{.+}}: tensor<4x8xf32>) -> tensor<4x8xf32> attributes {poot.dispatch = {kind = "elementwise", ops = 4 : i64}}
// CHECK-NEXT: "poot.constant"
// CHECK-COUNT-5: "poot.
// CHECK-NEXT: return
// SMALL-LABEL: func.func @chain(
// SMALL-COUNT-2: call @chain_dispatch_
// SMALL-NOT: call
// SMALL: ops = 2
// SMALL: ops = 2
func.func @chain(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %w = "poot.param"() {name = "w"} : () -> tensor<4x8xf32>
  %c = "poot.constant"() {value = dense<2.0> : tensor<f32>} : () -> tensor<f32>
  %0 = "poot.unary"(%x) {fn = "exp"} : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %1 = "poot.binary"(%0, %w) {fn = "mul"} : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %2 = "poot.broadcast"(%c) {dims = array<i64>} : (tensor<f32>) -> tensor<4x8xf32>
  %3 = "poot.binary"(%1, %2) {fn = "add"} : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %4 = "poot.unary"(%3) {fn = "tanh"} : (tensor<4x8xf32>) -> tensor<4x8xf32>
  return %4 : tensor<4x8xf32>
}

// -----

// RMSNorm (square -> sum -> scale -> rsqrt -> broadcast back -> multiply x) is one region.
// CHECK-LABEL: func.func @rmsnorm(
// CHECK-COUNT-1: call @rmsnorm_dispatch_0
// CHECK-NOT: call
// CHECK: func.func private @rmsnorm_dispatch_0({{.*}} attributes {poot.dispatch = {kind = "reduction", ops = 9 : i64}}
// CHECK-NOT: func.func
func.func @rmsnorm(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %n = "poot.constant"() {value = dense<0.125> : tensor<4xf32>} : () -> tensor<4xf32>
  %e = "poot.constant"() {value = dense<1.0e-6> : tensor<4xf32>} : () -> tensor<4xf32>
  %w = "poot.param"() {name = "w"} : () -> tensor<8xf32>
  %0 = "poot.binary"(%x, %x) {fn = "mul"} : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %1 = "poot.reduce"(%0) {fn = "sum", axes = array<i64: 1>} : (tensor<4x8xf32>) -> tensor<4xf32>
  %2 = "poot.binary"(%1, %n) {fn = "mul"} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %3 = "poot.binary"(%2, %e) {fn = "add"} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %4 = "poot.unary"(%3) {fn = "rsqrt"} : (tensor<4xf32>) -> tensor<4xf32>
  %5 = "poot.broadcast"(%4) {dims = array<i64: 0>} : (tensor<4xf32>) -> tensor<4x8xf32>
  %6 = "poot.binary"(%x, %5) {fn = "mul"} : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %7 = "poot.broadcast"(%w) {dims = array<i64: 1>} : (tensor<8xf32>) -> tensor<4x8xf32>
  %8 = "poot.binary"(%6, %7) {fn = "mul"} : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  return %8 : tensor<4x8xf32>
}

// -----

// Softmax (max -> sub -> exp -> sum -> div), keep-dims spelling: one region.
// CHECK-LABEL: func.func @softmax(
// CHECK-COUNT-1: call @softmax_dispatch_0
// CHECK-NOT: call
// CHECK: kind = "reduction"
// CHECK-NOT: func.func
func.func @softmax(%x: tensor<2x4x8xf32>) -> tensor<2x4x8xf32> {
  %0 = "poot.reduce"(%x) {fn = "max", axes = array<i64: 2>} : (tensor<2x4x8xf32>) -> tensor<2x4xf32>
  %1 = "poot.reshape"(%0) : (tensor<2x4xf32>) -> tensor<2x4x1xf32>
  %2 = "poot.broadcast"(%1) {dims = array<i64: 0, 1, 2>} : (tensor<2x4x1xf32>) -> tensor<2x4x8xf32>
  %3 = "poot.binary"(%x, %2) {fn = "sub"} : (tensor<2x4x8xf32>, tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
  %4 = "poot.unary"(%3) {fn = "exp"} : (tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
  %5 = "poot.reduce"(%4) {fn = "sum", axes = array<i64: 2>} : (tensor<2x4x8xf32>) -> tensor<2x4xf32>
  %6 = "poot.reshape"(%5) : (tensor<2x4xf32>) -> tensor<2x4x1xf32>
  %7 = "poot.broadcast"(%6) {dims = array<i64: 0, 1, 2>} : (tensor<2x4x1xf32>) -> tensor<2x4x8xf32>
  %8 = "poot.binary"(%4, %7) {fn = "div"} : (tensor<2x4x8xf32>, tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
  return %8 : tensor<2x4x8xf32>
}

// -----

// A packed-weight matmul: dequantize + transpose prologue on the weight, bias and activation
// epilogue, residual add: one matmul region. The second matmul is never fused with the first.
// CHECK-LABEL: func.func @two_matmuls(
// CHECK: %[[A:.+]] = call @two_matmuls_dispatch_0(
// CHECK: call @two_matmuls_dispatch_1(%[[A]]
// CHECK-NOT: call
// CHECK: func.func private @two_matmuls_dispatch_0(
// CHECK-SAME: !poot.packed<#poot.q8_0, array<i64: 32, 32>>
// CHECK-SAME: kind = "matmul", ops = 7
// CHECK: poot.dequantize
// CHECK: poot.transpose
// CHECK: poot.matmul
// CHECK: {fn = "add"}
// CHECK: {fn = "tanh"}
// CHECK: {fn = "add"}
// CHECK-NOT: poot.matmul
// CHECK: func.func private @two_matmuls_dispatch_1(
// CHECK-SAME: kind = "matmul"
// CHECK-COUNT-1: poot.matmul
// CHECK-NOT: poot.matmul
func.func @two_matmuls(%x: tensor<4x32xf32>) -> tensor<4x32xf32> {
  %wp = "poot.packed_param"() {name = "w1"} : () -> !poot.packed<#poot.q8_0, array<i64: 32, 32>>
  %w2 = "poot.param"() {name = "w2"} : () -> tensor<32x32xf32>
  %b = "poot.param"() {name = "b"} : () -> tensor<32xf32>
  %0 = "poot.dequantize"(%wp) : (!poot.packed<#poot.q8_0, array<i64: 32, 32>>) -> tensor<32x32xf32>
  %1 = "poot.transpose"(%0) {perm = array<i64: 1, 0>} : (tensor<32x32xf32>) -> tensor<32x32xf32>
  %2 = "poot.matmul"(%x, %1) {acc = f32} : (tensor<4x32xf32>, tensor<32x32xf32>) -> tensor<4x32xf32>
  %3 = "poot.broadcast"(%b) {dims = array<i64: 1>} : (tensor<32xf32>) -> tensor<4x32xf32>
  %4 = "poot.binary"(%2, %3) {fn = "add"} : (tensor<4x32xf32>, tensor<4x32xf32>) -> tensor<4x32xf32>
  %5 = "poot.unary"(%4) {fn = "tanh"} : (tensor<4x32xf32>) -> tensor<4x32xf32>
  %6 = "poot.binary"(%5, %x) {fn = "add"} : (tensor<4x32xf32>, tensor<4x32xf32>) -> tensor<4x32xf32>
  %7 = "poot.matmul"(%6, %w2) {acc = f32} : (tensor<4x32xf32>, tensor<32x32xf32>) -> tensor<4x32xf32>
  return %7 : tensor<4x32xf32>
}

// -----

// A row sum used at a different shape (broadcast along the other axis: every element needs
// the whole reduction) is not fused into its consumer; merging the consumer into the
// reduction's region would also make a cycle (region -> broadcast -> region).
// CHECK-LABEL: func.func @reduce_other_shape(
// CHECK: %[[R:.+]]:2 = call @reduce_other_shape_dispatch_0(%arg0)
// CHECK: call @reduce_other_shape_dispatch_1(%[[R]]#{{[01]}}, %[[R]]#{{[01]}})
// CHECK: func.func private @reduce_other_shape_dispatch_0({{.*}} -> (tensor<4x4xf32>, tensor<4xf32>) attributes {poot.dispatch = {kind = "reduction", ops = 2
// CHECK: func.func private @reduce_other_shape_dispatch_1({{.*}}kind = "elementwise", ops = 2
func.func @reduce_other_shape(%x: tensor<4x4xf32>) -> tensor<4x4xf32> {
  %0 = "poot.unary"(%x) {fn = "exp"} : (tensor<4x4xf32>) -> tensor<4x4xf32>
  %1 = "poot.reduce"(%0) {fn = "sum", axes = array<i64: 1>} : (tensor<4x4xf32>) -> tensor<4xf32>
  %2 = "poot.broadcast"(%1) {dims = array<i64: 1>} : (tensor<4xf32>) -> tensor<4x4xf32>
  %3 = "poot.binary"(%0, %2) {fn = "div"} : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
  return %3 : tensor<4x4xf32>
}

// -----

// Two reductions over different axes are two regions.
// CHECK-LABEL: func.func @two_spaces(
// CHECK-COUNT-2: call @two_spaces_dispatch_
// CHECK: kind = "reduction"
// CHECK: kind = "reduction"
func.func @two_spaces(%x: tensor<4x8xf32>) -> (tensor<4xf32>, tensor<8xf32>) {
  %0 = "poot.unary"(%x) {fn = "exp"} : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %1 = "poot.reduce"(%0) {fn = "sum", axes = array<i64: 1>} : (tensor<4x8xf32>) -> tensor<4xf32>
  %2 = "poot.reduce"(%0) {fn = "sum", axes = array<i64: 0>} : (tensor<4x8xf32>) -> tensor<8xf32>
  return %1, %2 : tensor<4xf32>, tensor<8xf32>
}

// -----

// Gather with a dequantize prologue and an elementwise epilogue: one gather region (two
// results). The scatter (KV write) takes the reshape of its updates; the gather's epilogue is
// not pulled into the scatter region (a scatter has re-indexing prologues only).
// CHECK-LABEL: func.func @gather_scatter(
// CHECK-COUNT-2: call @gather_scatter_dispatch_
// CHECK-NOT: call
// CHECK: kind = "gather", ops = 4
// CHECK: poot.dequantize
// CHECK: poot.gather
// CHECK: kind = "scatter", ops = 2
// CHECK-NOT: {fn =
// CHECK: poot.scatter
func.func @gather_scatter(%ids: tensor<4xi32>, %cache: tensor<8x32xf32>, %pos: tensor<4x1xi32>) -> (tensor<4x32xf32>, tensor<8x32xf32>) {
  %tp = "poot.packed_param"() {name = "emb"} : () -> !poot.packed<#poot.q8_0, array<i64: 16, 32>>
  %s = "poot.constant"() {value = dense<3.0> : tensor<4x32xf32>} : () -> tensor<4x32xf32>
  %0 = "poot.dequantize"(%tp) : (!poot.packed<#poot.q8_0, array<i64: 16, 32>>) -> tensor<16x32xf32>
  %1 = "poot.gather"(%0, %ids) {axis = 0} : (tensor<16x32xf32>, tensor<4xi32>) -> tensor<4x32xf32>
  %2 = "poot.binary"(%1, %s) {fn = "mul"} : (tensor<4x32xf32>, tensor<4x32xf32>) -> tensor<4x32xf32>
  %3 = "poot.unary"(%2) {fn = "neg"} : (tensor<4x32xf32>) -> tensor<4x32xf32>
  %4 = "poot.reshape"(%3) : (tensor<4x32xf32>) -> tensor<4x32xf32>
  %5 = "poot.scatter"(%cache, %pos, %4) : (tensor<8x32xf32>, tensor<4x1xi32>, tensor<4x32xf32>) -> tensor<8x32xf32>
  return %2, %5 : tensor<4x32xf32>, tensor<8x32xf32>
}

// -----

// A matmul's prologue only re-indexes or decodes: an elementwise producer of its activation
// (which every tile would recompute) stays in its own region.
// CHECK-LABEL: func.func @no_elementwise_prologue(
// CHECK: %[[E:.+]] = call @no_elementwise_prologue_dispatch_0(%arg0)
// CHECK: call @no_elementwise_prologue_dispatch_1(%{{[0-9]+}}, %[[E]])
// CHECK: kind = "elementwise", ops = 1
// CHECK: kind = "matmul", ops = 2
func.func @no_elementwise_prologue(%x: tensor<4x32xf32>) -> tensor<4x16xf32> {
  %w = "poot.param"() {name = "w"} : () -> tensor<16x32xf32>
  %0 = "poot.unary"(%x) {fn = "exp"} : (tensor<4x32xf32>) -> tensor<4x32xf32>
  %1 = "poot.transpose"(%w) {perm = array<i64: 1, 0>} : (tensor<16x32xf32>) -> tensor<32x16xf32>
  %2 = "poot.matmul"(%0, %1) {acc = f32} : (tensor<4x32xf32>, tensor<32x16xf32>) -> tensor<4x16xf32>
  return %2 : tensor<4x16xf32>
}

// -----

// Two matmuls whose epilogues read each other's prologue values: every region stays acyclic
// (a path may enter an outside region at one op and leave it at another), and the output
// verifies (each call's operands are defined before it).
// CHECK-LABEL: func.func @crossed_epilogues(
// CHECK: %[[E:.+]] = call @crossed_epilogues_dispatch_0(%arg0)
// CHECK: %[[M:.+]]:2 = call @crossed_epilogues_dispatch_1(%[[E]], %arg1, %arg0)
// CHECK: call @crossed_epilogues_dispatch_2(%[[M]]#0, %arg1, %[[E]])
// CHECK: kind = "elementwise", ops = 1
// CHECK: kind = "matmul", ops = 3
// CHECK: kind = "matmul", ops = 2
func.func @crossed_epilogues(%x: tensor<4x8xf32>, %w: tensor<8x8xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>) {
  %a = "poot.unary"(%x) {fn = "exp"} : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %m1 = "poot.matmul"(%a, %w) {acc = f32} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %b = "poot.unary"(%x) {fn = "neg"} : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %m2 = "poot.matmul"(%b, %w) {acc = f32} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %c = "poot.binary"(%m1, %b) {fn = "add"} : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %d = "poot.binary"(%m2, %a) {fn = "add"} : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  return %c, %d : tensor<4x8xf32>, tensor<4x8xf32>
}

// -----

// The fused attention op (flash-attention rewrite) is an anchor like matmul: re-indexing
// prologues on q/k/v, the constant-only causal mask cloned in, an elementwise epilogue; a
// second attention is a region of its own.
// CHECK-LABEL: func.func @attention(
// CHECK: %[[A:.+]] = call @attention_dispatch_0(
// CHECK: call @attention_dispatch_1(%[[A]]
// CHECK: func.func private @attention_dispatch_0({{.*}}kind = "attention", ops = 3
// CHECK: poot.iota
// CHECK: poot.compare
// CHECK: poot.transpose
// CHECK: poot.attention
// CHECK: {fn = "exp"}
// CHECK: func.func private @attention_dispatch_1({{.*}}kind = "attention", ops = 1
func.func @attention(%q: tensor<4x2x8xf32>, %k: tensor<2x4x8xf32>, %v: tensor<2x4x8xf32>) -> tensor<2x4x8xf32> {
  %i = "poot.iota"() {axis = 2} : () -> tensor<2x4x4xi32>
  %j = "poot.iota"() {axis = 1} : () -> tensor<2x4x4xi32>
  %m = "poot.compare"(%i, %j) {pred = "le"} : (tensor<2x4x4xi32>, tensor<2x4x4xi32>) -> tensor<2x4x4xi1>
  %qt = "poot.transpose"(%q) {perm = array<i64: 1, 0, 2>} : (tensor<4x2x8xf32>) -> tensor<2x4x8xf32>
  %0 = "poot.attention"(%qt, %k, %v, %m) {scale = 0.35 : f64, softcap = 0.0 : f64} : (tensor<2x4x8xf32>, tensor<2x4x8xf32>, tensor<2x4x8xf32>, tensor<2x4x4xi1>) -> tensor<2x4x8xf32>
  %1 = "poot.unary"(%0) {fn = "exp"} : (tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
  %2 = "poot.attention"(%1, %k, %v, %m) {scale = 0.35 : f64, softcap = 0.0 : f64} : (tensor<2x4x8xf32>, tensor<2x4x8xf32>, tensor<2x4x8xf32>, tensor<2x4x4xi1>) -> tensor<2x4x8xf32>
  return %2 : tensor<2x4x8xf32>
}

// -----

// A view that one op takes as two operands (concat(v, v)) is cloned for that op once, not
// once per operand: each op once in the region.
// CHECK-LABEL: func.func @view_used_twice_by_one_op(
// CHECK-NEXT: %[[R:.+]] = call @view_used_twice_by_one_op_dispatch_0(%arg0)
// CHECK-NEXT: return %[[R]]
// CHECK: func.func private @view_used_twice_by_one_op_dispatch_0({{.*}} attributes {poot.dispatch = {kind = "elementwise", ops = 3 : i64}}
// CHECK-NEXT: "poot.transpose"
// CHECK-NEXT: "poot.reshape"
// CHECK-NEXT: "poot.concat"
// CHECK-NEXT: return
func.func @view_used_twice_by_one_op(%x: tensor<4x8xf32>) -> tensor<8x8xf32> {
  %0 = "poot.transpose"(%x) {perm = array<i64: 1, 0>} : (tensor<4x8xf32>) -> tensor<8x4xf32>
  %1 = "poot.reshape"(%0) : (tensor<8x4xf32>) -> tensor<4x8xf32>
  %2 = "poot.concat"(%1, %1) {axis = 0 : i64} : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<8x8xf32>
  return %2 : tensor<8x8xf32>
}
