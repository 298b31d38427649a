// poot-flash-attention: softmax(softcap(Q K^T * scale) (+|masked) mask) V, however spelled,
// becomes one poot.attention; compositions that mean something else are left alone.
// RUN: poot-opt %s --split-input-file --pass-pipeline='builtin.module(poot-flash-attention,poot-verify)' | FileCheck %s

// The traced spelling: GQA scores viewed as [B, Hkv, G, T, S], causal i1 mask [B, 1, 1, T, S]
// applied by select (-1e30), zeroed numerator, max(sum, 1) denominator. The mask operand is
// the broadcast's source (never the full mask), k the composed transpose, q viewed with rows.
// CHECK-LABEL: func.func @masked_gqa(
// CHECK: %[[Q:.+]] = "poot.reshape"(%arg0) : (tensor<1x1x4x4xf32>) -> tensor<1x1x2x2x4xf32>
// CHECK: %[[K:.+]] = "poot.transpose"(%arg1) {perm = array<i64: 0, 2, 1, 3>}
// CHECK: %[[A:.+]] = "poot.attention"(%[[Q]], %[[K]], %arg2, %arg3) {scale = 5.000000e-01 : f64, softcap = 0.000000e+00 : f64} : (tensor<1x1x2x2x4xf32>, tensor<1x1x4x4xf32>, tensor<1x1x4x4xf32>, tensor<1x1x1x2x4xi1>) -> tensor<1x1x2x2x4xf32>
// CHECK: %[[R:.+]] = "poot.reshape"(%[[A]]) : (tensor<1x1x2x2x4xf32>) -> tensor<1x1x4x4xf32>
// CHECK-NOT: poot.matmul
// CHECK-NOT: poot.reduce
// CHECK: return %[[R]]
func.func @masked_gqa(%arg0: tensor<1x1x4x4xf32> {poot.name = "q"}, %arg1: tensor<1x4x1x4xf32> {poot.name = "k"}, %arg2: tensor<1x1x4x4xf32> {poot.name = "v"}, %arg3: tensor<1x1x1x2x4xi1> {poot.name = "vis"}) -> (tensor<1x1x4x4xf32> {poot.name = "out"}) {
  %0 = "poot.transpose"(%arg1) {perm = array<i64: 0, 2, 3, 1>} : (tensor<1x4x1x4xf32>) -> tensor<1x1x4x4xf32>
  %1 = "poot.matmul"(%arg0, %0) {acc = f32} : (tensor<1x1x4x4xf32>, tensor<1x1x4x4xf32>) -> tensor<1x1x4x4xf32>
  %2 = "poot.constant"() {value = dense<5.000000e-01> : tensor<f32>} : () -> tensor<f32>
  %3 = "poot.broadcast"(%2) {dims = array<i64>} : (tensor<f32>) -> tensor<1x1x4x4xf32>
  %4 = "poot.binary"(%1, %3) {fn = "mul"} : (tensor<1x1x4x4xf32>, tensor<1x1x4x4xf32>) -> tensor<1x1x4x4xf32>
  %5 = "poot.reshape"(%4) : (tensor<1x1x4x4xf32>) -> tensor<1x1x2x2x4xf32>
  %6 = "poot.broadcast"(%arg3) {dims = array<i64: 0, 1, 2, 3, 4>} : (tensor<1x1x1x2x4xi1>) -> tensor<1x1x2x2x4xi1>
  %7 = "poot.constant"() {value = dense<-1.000000e+30> : tensor<f32>} : () -> tensor<f32>
  %8 = "poot.broadcast"(%7) {dims = array<i64>} : (tensor<f32>) -> tensor<1x1x2x2x4xf32>
  %9 = "poot.select"(%6, %5, %8) : (tensor<1x1x2x2x4xi1>, tensor<1x1x2x2x4xf32>, tensor<1x1x2x2x4xf32>) -> tensor<1x1x2x2x4xf32>
  %10 = "poot.reduce"(%9) {axes = array<i64: 4>, fn = "max"} : (tensor<1x1x2x2x4xf32>) -> tensor<1x1x2x2xf32>
  %11 = "poot.reshape"(%10) : (tensor<1x1x2x2xf32>) -> tensor<1x1x2x2x1xf32>
  %12 = "poot.broadcast"(%11) {dims = array<i64: 0, 1, 2, 3, 4>} : (tensor<1x1x2x2x1xf32>) -> tensor<1x1x2x2x4xf32>
  %13 = "poot.binary"(%9, %12) {fn = "sub"} : (tensor<1x1x2x2x4xf32>, tensor<1x1x2x2x4xf32>) -> tensor<1x1x2x2x4xf32>
  %14 = "poot.unary"(%13) {fn = "exp"} : (tensor<1x1x2x2x4xf32>) -> tensor<1x1x2x2x4xf32>
  %15 = "poot.broadcast"(%arg3) {dims = array<i64: 0, 1, 2, 3, 4>} : (tensor<1x1x1x2x4xi1>) -> tensor<1x1x2x2x4xi1>
  %16 = "poot.constant"() {value = dense<0.000000e+00> : tensor<f32>} : () -> tensor<f32>
  %17 = "poot.broadcast"(%16) {dims = array<i64>} : (tensor<f32>) -> tensor<1x1x2x2x4xf32>
  %18 = "poot.select"(%15, %14, %17) : (tensor<1x1x2x2x4xi1>, tensor<1x1x2x2x4xf32>, tensor<1x1x2x2x4xf32>) -> tensor<1x1x2x2x4xf32>
  %19 = "poot.reduce"(%18) {axes = array<i64: 4>, fn = "sum"} : (tensor<1x1x2x2x4xf32>) -> tensor<1x1x2x2xf32>
  %20 = "poot.reshape"(%19) : (tensor<1x1x2x2xf32>) -> tensor<1x1x2x2x1xf32>
  %21 = "poot.broadcast"(%20) {dims = array<i64: 0, 1, 2, 3, 4>} : (tensor<1x1x2x2x1xf32>) -> tensor<1x1x2x2x4xf32>
  %22 = "poot.constant"() {value = dense<1.000000e+00> : tensor<f32>} : () -> tensor<f32>
  %23 = "poot.broadcast"(%22) {dims = array<i64>} : (tensor<f32>) -> tensor<1x1x2x2x4xf32>
  %24 = "poot.binary"(%21, %23) {fn = "max"} : (tensor<1x1x2x2x4xf32>, tensor<1x1x2x2x4xf32>) -> tensor<1x1x2x2x4xf32>
  %25 = "poot.binary"(%18, %24) {fn = "div"} : (tensor<1x1x2x2x4xf32>, tensor<1x1x2x2x4xf32>) -> tensor<1x1x2x2x4xf32>
  %26 = "poot.reshape"(%25) : (tensor<1x1x2x2x4xf32>) -> tensor<1x1x4x4xf32>
  %27 = "poot.matmul"(%26, %arg2) {acc = f32} : (tensor<1x1x4x4xf32>, tensor<1x1x4x4xf32>) -> tensor<1x1x4x4xf32>
  return %27 : tensor<1x1x4x4xf32>
}

// -----

// Scale applied to q before the matmul (folded into scale), soft cap c * tanh(x * (1/c)),
// additive -1e30 bias: plain softmax of scores + bias.
// CHECK-LABEL: func.func @bias_softcap_scale_before(
// CHECK: %[[B:.+]] = "poot.select"(%arg3,
// CHECK: "poot.attention"(%arg0, %{{.+}}, %arg2, %[[B]]) {scale = 5.000000e-01 : f64, softcap = 5.000000e+00 : f64} : ({{.*}}tensor<1x1x4x4xf32>) -> tensor<1x1x4x4xf32>
// CHECK-NOT: poot.matmul
// CHECK-NOT: fn = "exp"
func.func @bias_softcap_scale_before(%arg0: tensor<1x1x4x4xf32> {poot.name = "q"}, %arg1: tensor<1x4x1x4xf32> {poot.name = "k"}, %arg2: tensor<1x1x4x4xf32> {poot.name = "v"}, %arg3: tensor<1x1x4x4xi1> {poot.name = "vis"}) -> (tensor<1x1x4x4xf32> {poot.name = "out"}) {
  %0 = "poot.constant"() {value = dense<5.000000e-01> : tensor<f32>} : () -> tensor<f32>
  %1 = "poot.broadcast"(%0) {dims = array<i64>} : (tensor<f32>) -> tensor<1x1x4x4xf32>
  %2 = "poot.binary"(%arg0, %1) {fn = "mul"} : (tensor<1x1x4x4xf32>, tensor<1x1x4x4xf32>) -> tensor<1x1x4x4xf32>
  %3 = "poot.transpose"(%arg1) {perm = array<i64: 0, 2, 3, 1>} : (tensor<1x4x1x4xf32>) -> tensor<1x1x4x4xf32>
  %4 = "poot.matmul"(%2, %3) {acc = f32} : (tensor<1x1x4x4xf32>, tensor<1x1x4x4xf32>) -> tensor<1x1x4x4xf32>
  %5 = "poot.constant"() {value = dense<2.000000e-01> : tensor<f32>} : () -> tensor<f32>
  %6 = "poot.broadcast"(%5) {dims = array<i64>} : (tensor<f32>) -> tensor<1x1x4x4xf32>
  %7 = "poot.binary"(%4, %6) {fn = "mul"} : (tensor<1x1x4x4xf32>, tensor<1x1x4x4xf32>) -> tensor<1x1x4x4xf32>
  %8 = "poot.unary"(%7) {fn = "tanh"} : (tensor<1x1x4x4xf32>) -> tensor<1x1x4x4xf32>
  %9 = "poot.constant"() {value = dense<5.000000e+00> : tensor<f32>} : () -> tensor<f32>
  %10 = "poot.broadcast"(%9) {dims = array<i64>} : (tensor<f32>) -> tensor<1x1x4x4xf32>
  %11 = "poot.binary"(%8, %10) {fn = "mul"} : (tensor<1x1x4x4xf32>, tensor<1x1x4x4xf32>) -> tensor<1x1x4x4xf32>
  %12 = "poot.constant"() {value = dense<0.000000e+00> : tensor<f32>} : () -> tensor<f32>
  %13 = "poot.constant"() {value = dense<-1.000000e+30> : tensor<f32>} : () -> tensor<f32>
  %14 = "poot.broadcast"(%12) {dims = array<i64>} : (tensor<f32>) -> tensor<1x1x4x4xf32>
  %15 = "poot.broadcast"(%13) {dims = array<i64>} : (tensor<f32>) -> tensor<1x1x4x4xf32>
  %16 = "poot.select"(%arg3, %14, %15) : (tensor<1x1x4x4xi1>, tensor<1x1x4x4xf32>, tensor<1x1x4x4xf32>) -> tensor<1x1x4x4xf32>
  %17 = "poot.binary"(%11, %16) {fn = "add"} : (tensor<1x1x4x4xf32>, tensor<1x1x4x4xf32>) -> tensor<1x1x4x4xf32>
  %18 = "poot.reduce"(%17) {axes = array<i64: 3>, fn = "max"} : (tensor<1x1x4x4xf32>) -> tensor<1x1x4xf32>
  %19 = "poot.reshape"(%18) : (tensor<1x1x4xf32>) -> tensor<1x1x4x1xf32>
  %20 = "poot.broadcast"(%19) {dims = array<i64: 0, 1, 2, 3>} : (tensor<1x1x4x1xf32>) -> tensor<1x1x4x4xf32>
  %21 = "poot.binary"(%17, %20) {fn = "sub"} : (tensor<1x1x4x4xf32>, tensor<1x1x4x4xf32>) -> tensor<1x1x4x4xf32>
  %22 = "poot.unary"(%21) {fn = "exp"} : (tensor<1x1x4x4xf32>) -> tensor<1x1x4x4xf32>
  %23 = "poot.reduce"(%22) {axes = array<i64: 3>, fn = "sum"} : (tensor<1x1x4x4xf32>) -> tensor<1x1x4xf32>
  %24 = "poot.reshape"(%23) : (tensor<1x1x4xf32>) -> tensor<1x1x4x1xf32>
  %25 = "poot.broadcast"(%24) {dims = array<i64: 0, 1, 2, 3>} : (tensor<1x1x4x1xf32>) -> tensor<1x1x4x4xf32>
  %26 = "poot.binary"(%22, %25) {fn = "div"} : (tensor<1x1x4x4xf32>, tensor<1x1x4x4xf32>) -> tensor<1x1x4x4xf32>
  %27 = "poot.matmul"(%26, %arg2) {acc = f32} : (tensor<1x1x4x4xf32>, tensor<1x1x4x4xf32>) -> tensor<1x1x4x4xf32>
  return %27 : tensor<1x1x4x4xf32>
}

// -----

// No mask: a zero bias [1, 1, 1, 1]; k already [B, H, S, D] (its transpose folds away).
// CHECK-LABEL: func.func @plain(
// CHECK: %[[Z:.+]] = "poot.constant"() {value = dense<0.000000e+00> : tensor<1x1x1x1xf32>}
// CHECK-NEXT: "poot.attention"(%arg0, %arg1, %arg2, %[[Z]])
// CHECK-NOT: poot.matmul
func.func @plain(%arg0: tensor<1x1x4x4xf32> {poot.name = "q"}, %arg1: tensor<1x1x4x4xf32> {poot.name = "k"}, %arg2: tensor<1x1x4x4xf32> {poot.name = "v"}, %arg3: tensor<1x1x4x4xi1> {poot.name = "vis"}) -> (tensor<1x1x4x4xf32> {poot.name = "out"}) {
  %0 = "poot.transpose"(%arg1) {perm = array<i64: 0, 1, 3, 2>} : (tensor<1x1x4x4xf32>) -> tensor<1x1x4x4xf32>
  %1 = "poot.matmul"(%arg0, %0) {acc = f32} : (tensor<1x1x4x4xf32>, tensor<1x1x4x4xf32>) -> tensor<1x1x4x4xf32>
  %2 = "poot.constant"() {value = dense<5.000000e-01> : tensor<f32>} : () -> tensor<f32>
  %3 = "poot.broadcast"(%2) {dims = array<i64>} : (tensor<f32>) -> tensor<1x1x4x4xf32>
  %4 = "poot.binary"(%1, %3) {fn = "mul"} : (tensor<1x1x4x4xf32>, tensor<1x1x4x4xf32>) -> tensor<1x1x4x4xf32>
  %5 = "poot.reduce"(%4) {axes = array<i64: 3>, fn = "max"} : (tensor<1x1x4x4xf32>) -> tensor<1x1x4xf32>
  %6 = "poot.reshape"(%5) : (tensor<1x1x4xf32>) -> tensor<1x1x4x1xf32>
  %7 = "poot.broadcast"(%6) {dims = array<i64: 0, 1, 2, 3>} : (tensor<1x1x4x1xf32>) -> tensor<1x1x4x4xf32>
  %8 = "poot.binary"(%4, %7) {fn = "sub"} : (tensor<1x1x4x4xf32>, tensor<1x1x4x4xf32>) -> tensor<1x1x4x4xf32>
  %9 = "poot.unary"(%8) {fn = "exp"} : (tensor<1x1x4x4xf32>) -> tensor<1x1x4x4xf32>
  %10 = "poot.reduce"(%9) {axes = array<i64: 3>, fn = "sum"} : (tensor<1x1x4x4xf32>) -> tensor<1x1x4xf32>
  %11 = "poot.reshape"(%10) : (tensor<1x1x4xf32>) -> tensor<1x1x4x1xf32>
  %12 = "poot.broadcast"(%11) {dims = array<i64: 0, 1, 2, 3>} : (tensor<1x1x4x1xf32>) -> tensor<1x1x4x4xf32>
  %13 = "poot.binary"(%9, %12) {fn = "div"} : (tensor<1x1x4x4xf32>, tensor<1x1x4x4xf32>) -> tensor<1x1x4x4xf32>
  %14 = "poot.matmul"(%13, %arg2) {acc = f32} : (tensor<1x1x4x4xf32>, tensor<1x1x4x4xf32>) -> tensor<1x1x4x4xf32>
  return %14 : tensor<1x1x4x4xf32>
}

// -----

// Must not fire: the max/sum reduce over the query axis (2), not the key axis P @ V contracts.
// CHECK-LABEL: func.func @wrong_axis(
// CHECK-NOT: poot.attention
// CHECK: "poot.reduce"({{.*}}axes = array<i64: 2>, fn = "max"
// CHECK-COUNT-1: "poot.matmul"(%{{.+}}, %arg2)
func.func @wrong_axis(%arg0: tensor<1x1x4x4xf32> {poot.name = "q"}, %arg1: tensor<1x4x1x4xf32> {poot.name = "k"}, %arg2: tensor<1x1x4x4xf32> {poot.name = "v"}, %arg3: tensor<1x1x4x4xi1> {poot.name = "vis"}) -> (tensor<1x1x4x4xf32> {poot.name = "out"}) {
  %0 = "poot.transpose"(%arg1) {perm = array<i64: 0, 2, 3, 1>} : (tensor<1x4x1x4xf32>) -> tensor<1x1x4x4xf32>
  %1 = "poot.matmul"(%arg0, %0) {acc = f32} : (tensor<1x1x4x4xf32>, tensor<1x1x4x4xf32>) -> tensor<1x1x4x4xf32>
  %2 = "poot.constant"() {value = dense<5.000000e-01> : tensor<f32>} : () -> tensor<f32>
  %3 = "poot.broadcast"(%2) {dims = array<i64>} : (tensor<f32>) -> tensor<1x1x4x4xf32>
  %4 = "poot.binary"(%1, %3) {fn = "mul"} : (tensor<1x1x4x4xf32>, tensor<1x1x4x4xf32>) -> tensor<1x1x4x4xf32>
  %5 = "poot.reduce"(%4) {axes = array<i64: 2>, fn = "max"} : (tensor<1x1x4x4xf32>) -> tensor<1x1x4xf32>
  %6 = "poot.reshape"(%5) : (tensor<1x1x4xf32>) -> tensor<1x1x1x4xf32>
  %7 = "poot.broadcast"(%6) {dims = array<i64: 0, 1, 2, 3>} : (tensor<1x1x1x4xf32>) -> tensor<1x1x4x4xf32>
  %8 = "poot.binary"(%4, %7) {fn = "sub"} : (tensor<1x1x4x4xf32>, tensor<1x1x4x4xf32>) -> tensor<1x1x4x4xf32>
  %9 = "poot.unary"(%8) {fn = "exp"} : (tensor<1x1x4x4xf32>) -> tensor<1x1x4x4xf32>
  %10 = "poot.reduce"(%9) {axes = array<i64: 2>, fn = "sum"} : (tensor<1x1x4x4xf32>) -> tensor<1x1x4xf32>
  %11 = "poot.reshape"(%10) : (tensor<1x1x4xf32>) -> tensor<1x1x1x4xf32>
  %12 = "poot.broadcast"(%11) {dims = array<i64: 0, 1, 2, 3>} : (tensor<1x1x1x4xf32>) -> tensor<1x1x4x4xf32>
  %13 = "poot.binary"(%9, %12) {fn = "div"} : (tensor<1x1x4x4xf32>, tensor<1x1x4x4xf32>) -> tensor<1x1x4x4xf32>
  %14 = "poot.matmul"(%13, %arg2) {acc = f32} : (tensor<1x1x4x4xf32>, tensor<1x1x4x4xf32>) -> tensor<1x1x4x4xf32>
  return %14 : tensor<1x1x4x4xf32>
}

// -----

// Must not fire: exp of the raw scores (not max-subtracted; overflows where the op would not).
// CHECK-LABEL: func.func @no_max_subtract(
// CHECK-NOT: poot.attention
// CHECK: "poot.unary"(%{{.+}}) {fn = "exp"}
// CHECK: "poot.matmul"(%{{.+}}, %arg2)
func.func @no_max_subtract(%arg0: tensor<1x1x4x4xf32> {poot.name = "q"}, %arg1: tensor<1x4x1x4xf32> {poot.name = "k"}, %arg2: tensor<1x1x4x4xf32> {poot.name = "v"}, %arg3: tensor<1x1x4x4xi1> {poot.name = "vis"}) -> (tensor<1x1x4x4xf32> {poot.name = "out"}) {
  %0 = "poot.transpose"(%arg1) {perm = array<i64: 0, 2, 3, 1>} : (tensor<1x4x1x4xf32>) -> tensor<1x1x4x4xf32>
  %1 = "poot.matmul"(%arg0, %0) {acc = f32} : (tensor<1x1x4x4xf32>, tensor<1x1x4x4xf32>) -> tensor<1x1x4x4xf32>
  %2 = "poot.constant"() {value = dense<5.000000e-01> : tensor<f32>} : () -> tensor<f32>
  %3 = "poot.broadcast"(%2) {dims = array<i64>} : (tensor<f32>) -> tensor<1x1x4x4xf32>
  %4 = "poot.binary"(%1, %3) {fn = "mul"} : (tensor<1x1x4x4xf32>, tensor<1x1x4x4xf32>) -> tensor<1x1x4x4xf32>
  %5 = "poot.reduce"(%4) {axes = array<i64: 3>, fn = "max"} : (tensor<1x1x4x4xf32>) -> tensor<1x1x4xf32>
  %6 = "poot.reshape"(%5) : (tensor<1x1x4xf32>) -> tensor<1x1x4x1xf32>
  %7 = "poot.broadcast"(%6) {dims = array<i64: 0, 1, 2, 3>} : (tensor<1x1x4x1xf32>) -> tensor<1x1x4x4xf32>
  %8 = "poot.unary"(%4) {fn = "exp"} : (tensor<1x1x4x4xf32>) -> tensor<1x1x4x4xf32>
  %9 = "poot.reduce"(%8) {axes = array<i64: 3>, fn = "sum"} : (tensor<1x1x4x4xf32>) -> tensor<1x1x4xf32>
  %10 = "poot.reshape"(%9) : (tensor<1x1x4xf32>) -> tensor<1x1x4x1xf32>
  %11 = "poot.broadcast"(%10) {dims = array<i64: 0, 1, 2, 3>} : (tensor<1x1x4x1xf32>) -> tensor<1x1x4x4xf32>
  %12 = "poot.binary"(%8, %11) {fn = "div"} : (tensor<1x1x4x4xf32>, tensor<1x1x4x4xf32>) -> tensor<1x1x4x4xf32>
  %13 = "poot.matmul"(%12, %arg2) {acc = f32} : (tensor<1x1x4x4xf32>, tensor<1x1x4x4xf32>) -> tensor<1x1x4x4xf32>
  return %13 : tensor<1x1x4x4xf32>
}

// -----

// Must not fire: the scaled scores are also a function result (another consumer).
// CHECK-LABEL: func.func @scores_escape(
// CHECK-NOT: poot.attention
// CHECK: "poot.matmul"(%{{.+}}, %arg2)
// CHECK: return
func.func @scores_escape(%arg0: tensor<1x1x4x4xf32> {poot.name = "q"}, %arg1: tensor<1x4x1x4xf32> {poot.name = "k"}, %arg2: tensor<1x1x4x4xf32> {poot.name = "v"}, %arg3: tensor<1x1x4x4xi1> {poot.name = "vis"}) -> (tensor<1x1x4x4xf32> {poot.name = "out"}, tensor<1x1x4x4xf32> {poot.name = "scores"}) {
  %0 = "poot.transpose"(%arg1) {perm = array<i64: 0, 2, 3, 1>} : (tensor<1x4x1x4xf32>) -> tensor<1x1x4x4xf32>
  %1 = "poot.matmul"(%arg0, %0) {acc = f32} : (tensor<1x1x4x4xf32>, tensor<1x1x4x4xf32>) -> tensor<1x1x4x4xf32>
  %2 = "poot.constant"() {value = dense<5.000000e-01> : tensor<f32>} : () -> tensor<f32>
  %3 = "poot.broadcast"(%2) {dims = array<i64>} : (tensor<f32>) -> tensor<1x1x4x4xf32>
  %4 = "poot.binary"(%1, %3) {fn = "mul"} : (tensor<1x1x4x4xf32>, tensor<1x1x4x4xf32>) -> tensor<1x1x4x4xf32>
  %5 = "poot.constant"() {value = dense<0.000000e+00> : tensor<f32>} : () -> tensor<f32>
  %6 = "poot.constant"() {value = dense<-1.000000e+30> : tensor<f32>} : () -> tensor<f32>
  %7 = "poot.broadcast"(%5) {dims = array<i64>} : (tensor<f32>) -> tensor<1x1x4x4xf32>
  %8 = "poot.broadcast"(%6) {dims = array<i64>} : (tensor<f32>) -> tensor<1x1x4x4xf32>
  %9 = "poot.select"(%arg3, %7, %8) : (tensor<1x1x4x4xi1>, tensor<1x1x4x4xf32>, tensor<1x1x4x4xf32>) -> tensor<1x1x4x4xf32>
  %10 = "poot.binary"(%4, %9) {fn = "add"} : (tensor<1x1x4x4xf32>, tensor<1x1x4x4xf32>) -> tensor<1x1x4x4xf32>
  %11 = "poot.reduce"(%10) {axes = array<i64: 3>, fn = "max"} : (tensor<1x1x4x4xf32>) -> tensor<1x1x4xf32>
  %12 = "poot.reshape"(%11) : (tensor<1x1x4xf32>) -> tensor<1x1x4x1xf32>
  %13 = "poot.broadcast"(%12) {dims = array<i64: 0, 1, 2, 3>} : (tensor<1x1x4x1xf32>) -> tensor<1x1x4x4xf32>
  %14 = "poot.binary"(%10, %13) {fn = "sub"} : (tensor<1x1x4x4xf32>, tensor<1x1x4x4xf32>) -> tensor<1x1x4x4xf32>
  %15 = "poot.unary"(%14) {fn = "exp"} : (tensor<1x1x4x4xf32>) -> tensor<1x1x4x4xf32>
  %16 = "poot.reduce"(%15) {axes = array<i64: 3>, fn = "sum"} : (tensor<1x1x4x4xf32>) -> tensor<1x1x4xf32>
  %17 = "poot.reshape"(%16) : (tensor<1x1x4xf32>) -> tensor<1x1x4x1xf32>
  %18 = "poot.broadcast"(%17) {dims = array<i64: 0, 1, 2, 3>} : (tensor<1x1x4x1xf32>) -> tensor<1x1x4x4xf32>
  %19 = "poot.binary"(%15, %18) {fn = "div"} : (tensor<1x1x4x4xf32>, tensor<1x1x4x4xf32>) -> tensor<1x1x4x4xf32>
  %20 = "poot.matmul"(%19, %arg2) {acc = f32} : (tensor<1x1x4x4xf32>, tensor<1x1x4x4xf32>) -> tensor<1x1x4x4xf32>
  return %20, %4 : tensor<1x1x4x4xf32>, tensor<1x1x4x4xf32>
}

// -----

// Paged KV: keys and values gathered from f16 block pools through one block table (the
// traced spelling: gather [B, W, bs, H, D], reshape to [B, W * bs, H, D], cast to f32): the
// fused op reads the pools in place; no gather, cast or transpose of the keys remains.
// CHECK-LABEL: func.func @paged_gqa(
// CHECK: %[[A:.+]] = "poot.paged_attention"(%{{.+}}, %arg1, %arg2, %arg3, %{{.+}}) {scale = 5.000000e-01 : f64, softcap = 0.000000e+00 : f64} : (tensor<1x1x2x2x4xf32>, tensor<6x4x1x4xf16>, tensor<6x4x1x4xf16>, tensor<1x2xi32>, tensor<1x1x1x2x8xi1>) -> tensor<1x1x2x2x4xf32>
// CHECK-NOT: "poot.gather"
// CHECK-NOT: "poot.attention"
// CHECK: return
func.func @paged_gqa(%arg0: tensor<1x2x2x4xf32> {poot.name = "q"}, %arg1: tensor<6x4x1x4xf16> {poot.name = "k_pool"}, %arg2: tensor<6x4x1x4xf16> {poot.name = "v_pool"}, %arg3: tensor<1x2xi32> {poot.name = "block_table"}, %arg4: tensor<1x2xi32> {poot.name = "positions"}) -> (tensor<1x2x2x4xf32> {poot.name = "out"}) {
  %0 = "poot.gather"(%arg1, %arg3) {axis = 0 : i64} : (tensor<6x4x1x4xf16>, tensor<1x2xi32>) -> tensor<1x2x4x1x4xf16>
  %1 = "poot.reshape"(%0) : (tensor<1x2x4x1x4xf16>) -> tensor<1x8x1x4xf16>
  %2 = "poot.cast"(%1) : (tensor<1x8x1x4xf16>) -> tensor<1x8x1x4xf32>
  %3 = "poot.gather"(%arg2, %arg3) {axis = 0 : i64} : (tensor<6x4x1x4xf16>, tensor<1x2xi32>) -> tensor<1x2x4x1x4xf16>
  %4 = "poot.reshape"(%3) : (tensor<1x2x4x1x4xf16>) -> tensor<1x8x1x4xf16>
  %5 = "poot.cast"(%4) : (tensor<1x8x1x4xf16>) -> tensor<1x8x1x4xf32>
  %6 = "poot.reshape"(%arg0) : (tensor<1x2x2x4xf32>) -> tensor<1x2x1x2x4xf32>
  %7 = "poot.transpose"(%6) {perm = array<i64: 0, 2, 3, 1, 4>} : (tensor<1x2x1x2x4xf32>) -> tensor<1x1x2x2x4xf32>
  %8 = "poot.reshape"(%7) : (tensor<1x1x2x2x4xf32>) -> tensor<1x1x4x4xf32>
  %9 = "poot.transpose"(%2) {perm = array<i64: 0, 2, 3, 1>} : (tensor<1x8x1x4xf32>) -> tensor<1x1x4x8xf32>
  %10 = "poot.matmul"(%8, %9) {acc = f32} : (tensor<1x1x4x4xf32>, tensor<1x1x4x8xf32>) -> tensor<1x1x4x8xf32>
  %11 = "poot.constant"() {value = dense<5.000000e-01> : tensor<f32>} : () -> tensor<f32>
  %12 = "poot.broadcast"(%11) {dims = array<i64>} : (tensor<f32>) -> tensor<1x1x4x8xf32>
  %13 = "poot.binary"(%10, %12) {fn = "mul"} : (tensor<1x1x4x8xf32>, tensor<1x1x4x8xf32>) -> tensor<1x1x4x8xf32>
  %14 = "poot.reshape"(%13) : (tensor<1x1x4x8xf32>) -> tensor<1x1x2x2x8xf32>
  %15 = "poot.iota"() {axis = 1 : i64} : () -> tensor<1x8xi32>
  %16 = "poot.reshape"(%arg4) : (tensor<1x2xi32>) -> tensor<1x2x1xi32>
  %17 = "poot.reshape"(%15) : (tensor<1x8xi32>) -> tensor<1x1x8xi32>
  %18 = "poot.broadcast"(%17) {dims = array<i64: 0, 1, 2>} : (tensor<1x1x8xi32>) -> tensor<1x2x8xi32>
  %19 = "poot.broadcast"(%16) {dims = array<i64: 0, 1, 2>} : (tensor<1x2x1xi32>) -> tensor<1x2x8xi32>
  %20 = "poot.compare"(%18, %19) {pred = "le"} : (tensor<1x2x8xi32>, tensor<1x2x8xi32>) -> tensor<1x2x8xi1>
  %21 = "poot.reshape"(%20) : (tensor<1x2x8xi1>) -> tensor<1x1x1x2x8xi1>
  %22 = "poot.broadcast"(%21) {dims = array<i64: 0, 1, 2, 3, 4>} : (tensor<1x1x1x2x8xi1>) -> tensor<1x1x2x2x8xi1>
  %23 = "poot.constant"() {value = dense<-1.000000e+30> : tensor<f32>} : () -> tensor<f32>
  %24 = "poot.broadcast"(%23) {dims = array<i64>} : (tensor<f32>) -> tensor<1x1x2x2x8xf32>
  %25 = "poot.select"(%22, %14, %24) : (tensor<1x1x2x2x8xi1>, tensor<1x1x2x2x8xf32>, tensor<1x1x2x2x8xf32>) -> tensor<1x1x2x2x8xf32>
  %26 = "poot.reduce"(%25) {axes = array<i64: 4>, fn = "max"} : (tensor<1x1x2x2x8xf32>) -> tensor<1x1x2x2xf32>
  %27 = "poot.reshape"(%26) : (tensor<1x1x2x2xf32>) -> tensor<1x1x2x2x1xf32>
  %28 = "poot.broadcast"(%27) {dims = array<i64: 0, 1, 2, 3, 4>} : (tensor<1x1x2x2x1xf32>) -> tensor<1x1x2x2x8xf32>
  %29 = "poot.binary"(%25, %28) {fn = "sub"} : (tensor<1x1x2x2x8xf32>, tensor<1x1x2x2x8xf32>) -> tensor<1x1x2x2x8xf32>
  %30 = "poot.unary"(%29) {fn = "exp"} : (tensor<1x1x2x2x8xf32>) -> tensor<1x1x2x2x8xf32>
  %31 = "poot.constant"() {value = dense<0.000000e+00> : tensor<f32>} : () -> tensor<f32>
  %32 = "poot.broadcast"(%31) {dims = array<i64>} : (tensor<f32>) -> tensor<1x1x2x2x8xf32>
  %33 = "poot.select"(%22, %30, %32) : (tensor<1x1x2x2x8xi1>, tensor<1x1x2x2x8xf32>, tensor<1x1x2x2x8xf32>) -> tensor<1x1x2x2x8xf32>
  %34 = "poot.reduce"(%33) {axes = array<i64: 4>, fn = "sum"} : (tensor<1x1x2x2x8xf32>) -> tensor<1x1x2x2xf32>
  %35 = "poot.reshape"(%34) : (tensor<1x1x2x2xf32>) -> tensor<1x1x2x2x1xf32>
  %36 = "poot.constant"() {value = dense<1.000000e+00> : tensor<f32>} : () -> tensor<f32>
  %37 = "poot.broadcast"(%36) {dims = array<i64>} : (tensor<f32>) -> tensor<1x1x2x2x1xf32>
  %38 = "poot.binary"(%35, %37) {fn = "max"} : (tensor<1x1x2x2x1xf32>, tensor<1x1x2x2x1xf32>) -> tensor<1x1x2x2x1xf32>
  %39 = "poot.broadcast"(%38) {dims = array<i64: 0, 1, 2, 3, 4>} : (tensor<1x1x2x2x1xf32>) -> tensor<1x1x2x2x8xf32>
  %40 = "poot.binary"(%33, %39) {fn = "div"} : (tensor<1x1x2x2x8xf32>, tensor<1x1x2x2x8xf32>) -> tensor<1x1x2x2x8xf32>
  %41 = "poot.reshape"(%40) : (tensor<1x1x2x2x8xf32>) -> tensor<1x1x4x8xf32>
  %42 = "poot.transpose"(%5) {perm = array<i64: 0, 2, 1, 3>} : (tensor<1x8x1x4xf32>) -> tensor<1x1x8x4xf32>
  %43 = "poot.matmul"(%41, %42) {acc = f32} : (tensor<1x1x4x8xf32>, tensor<1x1x8x4xf32>) -> tensor<1x1x4x4xf32>
  %44 = "poot.reshape"(%43) : (tensor<1x1x4x4xf32>) -> tensor<1x1x2x2x4xf32>
  %45 = "poot.transpose"(%44) {perm = array<i64: 0, 3, 1, 2, 4>} : (tensor<1x1x2x2x4xf32>) -> tensor<1x2x1x2x4xf32>
  %46 = "poot.reshape"(%45) : (tensor<1x2x1x2x4xf32>) -> tensor<1x2x2x4xf32>
  return %46 : tensor<1x2x2x4xf32>
}

// -----

// Multi-head latent attention's spelling: one pool of [latent, rope key] rows read as the keys
// (all 6 channels) and, through a slice of its first 4 channels, as the values: paged, the
// values being that channel slice of the pool (a view the lowerings read in place).
// CHECK-LABEL: func.func @paged_split_key(
// CHECK: %[[V:.+]] = "poot.slice"(%arg1) {limit = array<i64: 6, 4, 1, 4>, start = array<i64: 0, 0, 0, 0>, stride = array<i64: 1, 1, 1, 1>} : (tensor<6x4x1x6xf16>) -> tensor<6x4x1x4xf16>
// CHECK: "poot.paged_attention"(%{{.+}}, %arg1, %[[V]], %arg2, %{{.+}}) {{.*}} : (tensor<1x1x2x2x6xf32>, tensor<6x4x1x6xf16>, tensor<6x4x1x4xf16>, tensor<1x2xi32>, tensor<1x1x1x2x8xi1>) -> tensor<1x1x2x2x4xf32>
// CHECK-NOT: "poot.gather"
// CHECK-NOT: "poot.attention"
// CHECK: return
func.func @paged_split_key(%arg0: tensor<1x2x2x6xf32> {poot.name = "q"}, %arg1: tensor<6x4x1x6xf16> {poot.name = "kv_pool"}, %arg2: tensor<1x2xi32> {poot.name = "block_table"}, %arg3: tensor<1x2xi32> {poot.name = "positions"}) -> (tensor<1x2x2x4xf32> {poot.name = "out"}) {
  %0 = "poot.gather"(%arg1, %arg2) {axis = 0 : i64} : (tensor<6x4x1x6xf16>, tensor<1x2xi32>) -> tensor<1x2x4x1x6xf16>
  %1 = "poot.reshape"(%0) : (tensor<1x2x4x1x6xf16>) -> tensor<1x8x1x6xf16>
  %2 = "poot.cast"(%1) : (tensor<1x8x1x6xf16>) -> tensor<1x8x1x6xf32>
  %5 = "poot.slice"(%2) {start = array<i64: 0, 0, 0, 0>, limit = array<i64: 1, 8, 1, 4>, stride = array<i64: 1, 1, 1, 1>} : (tensor<1x8x1x6xf32>) -> tensor<1x8x1x4xf32>
  %6 = "poot.reshape"(%arg0) : (tensor<1x2x2x6xf32>) -> tensor<1x2x1x2x6xf32>
  %7 = "poot.transpose"(%6) {perm = array<i64: 0, 2, 3, 1, 4>} : (tensor<1x2x1x2x6xf32>) -> tensor<1x1x2x2x6xf32>
  %8 = "poot.reshape"(%7) : (tensor<1x1x2x2x6xf32>) -> tensor<1x1x4x6xf32>
  %9 = "poot.transpose"(%2) {perm = array<i64: 0, 2, 3, 1>} : (tensor<1x8x1x6xf32>) -> tensor<1x1x6x8xf32>
  %10 = "poot.matmul"(%8, %9) {acc = f32} : (tensor<1x1x4x6xf32>, tensor<1x1x6x8xf32>) -> tensor<1x1x4x8xf32>
  %11 = "poot.constant"() {value = dense<5.000000e-01> : tensor<f32>} : () -> tensor<f32>
  %12 = "poot.broadcast"(%11) {dims = array<i64>} : (tensor<f32>) -> tensor<1x1x4x8xf32>
  %13 = "poot.binary"(%10, %12) {fn = "mul"} : (tensor<1x1x4x8xf32>, tensor<1x1x4x8xf32>) -> tensor<1x1x4x8xf32>
  %14 = "poot.reshape"(%13) : (tensor<1x1x4x8xf32>) -> tensor<1x1x2x2x8xf32>
  %15 = "poot.iota"() {axis = 1 : i64} : () -> tensor<1x8xi32>
  %16 = "poot.reshape"(%arg3) : (tensor<1x2xi32>) -> tensor<1x2x1xi32>
  %17 = "poot.reshape"(%15) : (tensor<1x8xi32>) -> tensor<1x1x8xi32>
  %18 = "poot.broadcast"(%17) {dims = array<i64: 0, 1, 2>} : (tensor<1x1x8xi32>) -> tensor<1x2x8xi32>
  %19 = "poot.broadcast"(%16) {dims = array<i64: 0, 1, 2>} : (tensor<1x2x1xi32>) -> tensor<1x2x8xi32>
  %20 = "poot.compare"(%18, %19) {pred = "le"} : (tensor<1x2x8xi32>, tensor<1x2x8xi32>) -> tensor<1x2x8xi1>
  %21 = "poot.reshape"(%20) : (tensor<1x2x8xi1>) -> tensor<1x1x1x2x8xi1>
  %22 = "poot.broadcast"(%21) {dims = array<i64: 0, 1, 2, 3, 4>} : (tensor<1x1x1x2x8xi1>) -> tensor<1x1x2x2x8xi1>
  %23 = "poot.constant"() {value = dense<-1.000000e+30> : tensor<f32>} : () -> tensor<f32>
  %24 = "poot.broadcast"(%23) {dims = array<i64>} : (tensor<f32>) -> tensor<1x1x2x2x8xf32>
  %25 = "poot.select"(%22, %14, %24) : (tensor<1x1x2x2x8xi1>, tensor<1x1x2x2x8xf32>, tensor<1x1x2x2x8xf32>) -> tensor<1x1x2x2x8xf32>
  %26 = "poot.reduce"(%25) {axes = array<i64: 4>, fn = "max"} : (tensor<1x1x2x2x8xf32>) -> tensor<1x1x2x2xf32>
  %27 = "poot.reshape"(%26) : (tensor<1x1x2x2xf32>) -> tensor<1x1x2x2x1xf32>
  %28 = "poot.broadcast"(%27) {dims = array<i64: 0, 1, 2, 3, 4>} : (tensor<1x1x2x2x1xf32>) -> tensor<1x1x2x2x8xf32>
  %29 = "poot.binary"(%25, %28) {fn = "sub"} : (tensor<1x1x2x2x8xf32>, tensor<1x1x2x2x8xf32>) -> tensor<1x1x2x2x8xf32>
  %30 = "poot.unary"(%29) {fn = "exp"} : (tensor<1x1x2x2x8xf32>) -> tensor<1x1x2x2x8xf32>
  %31 = "poot.constant"() {value = dense<0.000000e+00> : tensor<f32>} : () -> tensor<f32>
  %32 = "poot.broadcast"(%31) {dims = array<i64>} : (tensor<f32>) -> tensor<1x1x2x2x8xf32>
  %33 = "poot.select"(%22, %30, %32) : (tensor<1x1x2x2x8xi1>, tensor<1x1x2x2x8xf32>, tensor<1x1x2x2x8xf32>) -> tensor<1x1x2x2x8xf32>
  %34 = "poot.reduce"(%33) {axes = array<i64: 4>, fn = "sum"} : (tensor<1x1x2x2x8xf32>) -> tensor<1x1x2x2xf32>
  %35 = "poot.reshape"(%34) : (tensor<1x1x2x2xf32>) -> tensor<1x1x2x2x1xf32>
  %36 = "poot.constant"() {value = dense<1.000000e+00> : tensor<f32>} : () -> tensor<f32>
  %37 = "poot.broadcast"(%36) {dims = array<i64>} : (tensor<f32>) -> tensor<1x1x2x2x1xf32>
  %38 = "poot.binary"(%35, %37) {fn = "max"} : (tensor<1x1x2x2x1xf32>, tensor<1x1x2x2x1xf32>) -> tensor<1x1x2x2x1xf32>
  %39 = "poot.broadcast"(%38) {dims = array<i64: 0, 1, 2, 3, 4>} : (tensor<1x1x2x2x1xf32>) -> tensor<1x1x2x2x8xf32>
  %40 = "poot.binary"(%33, %39) {fn = "div"} : (tensor<1x1x2x2x8xf32>, tensor<1x1x2x2x8xf32>) -> tensor<1x1x2x2x8xf32>
  %41 = "poot.reshape"(%40) : (tensor<1x1x2x2x8xf32>) -> tensor<1x1x4x8xf32>
  %42 = "poot.transpose"(%5) {perm = array<i64: 0, 2, 1, 3>} : (tensor<1x8x1x4xf32>) -> tensor<1x1x8x4xf32>
  %43 = "poot.matmul"(%41, %42) {acc = f32} : (tensor<1x1x4x8xf32>, tensor<1x1x8x4xf32>) -> tensor<1x1x4x4xf32>
  %44 = "poot.reshape"(%43) : (tensor<1x1x4x4xf32>) -> tensor<1x1x2x2x4xf32>
  %45 = "poot.transpose"(%44) {perm = array<i64: 0, 3, 1, 2, 4>} : (tensor<1x1x2x2x4xf32>) -> tensor<1x2x1x2x4xf32>
  %46 = "poot.reshape"(%45) : (tensor<1x2x1x2x4xf32>) -> tensor<1x2x2x4xf32>
  return %46 : tensor<1x2x2x4xf32>
}


// -----

// Values through another table than the keys: not one paged read, poot.attention over the
// gathered tensors stays.
// CHECK-LABEL: func.func @two_tables(
// CHECK: "poot.gather"
// CHECK: "poot.attention"
// CHECK-NOT: "poot.paged_attention"
func.func @two_tables(%arg0: tensor<1x2x2x4xf32> {poot.name = "q"}, %arg1: tensor<6x4x1x4xf16> {poot.name = "k_pool"}, %arg2: tensor<6x4x1x4xf16> {poot.name = "v_pool"}, %arg3: tensor<1x2xi32> {poot.name = "block_table"}, %arg4: tensor<1x2xi32> {poot.name = "positions"}, %arg5: tensor<1x2xi32> {poot.name = "other_table"}) -> (tensor<1x2x2x4xf32> {poot.name = "out"}) {
  %0 = "poot.gather"(%arg1, %arg3) {axis = 0 : i64} : (tensor<6x4x1x4xf16>, tensor<1x2xi32>) -> tensor<1x2x4x1x4xf16>
  %1 = "poot.reshape"(%0) : (tensor<1x2x4x1x4xf16>) -> tensor<1x8x1x4xf16>
  %2 = "poot.cast"(%1) : (tensor<1x8x1x4xf16>) -> tensor<1x8x1x4xf32>
  %3 = "poot.gather"(%arg2, %arg5) {axis = 0 : i64} : (tensor<6x4x1x4xf16>, tensor<1x2xi32>) -> tensor<1x2x4x1x4xf16>
  %4 = "poot.reshape"(%3) : (tensor<1x2x4x1x4xf16>) -> tensor<1x8x1x4xf16>
  %5 = "poot.cast"(%4) : (tensor<1x8x1x4xf16>) -> tensor<1x8x1x4xf32>
  %6 = "poot.reshape"(%arg0) : (tensor<1x2x2x4xf32>) -> tensor<1x2x1x2x4xf32>
  %7 = "poot.transpose"(%6) {perm = array<i64: 0, 2, 3, 1, 4>} : (tensor<1x2x1x2x4xf32>) -> tensor<1x1x2x2x4xf32>
  %8 = "poot.reshape"(%7) : (tensor<1x1x2x2x4xf32>) -> tensor<1x1x4x4xf32>
  %9 = "poot.transpose"(%2) {perm = array<i64: 0, 2, 3, 1>} : (tensor<1x8x1x4xf32>) -> tensor<1x1x4x8xf32>
  %10 = "poot.matmul"(%8, %9) {acc = f32} : (tensor<1x1x4x4xf32>, tensor<1x1x4x8xf32>) -> tensor<1x1x4x8xf32>
  %11 = "poot.constant"() {value = dense<5.000000e-01> : tensor<f32>} : () -> tensor<f32>
  %12 = "poot.broadcast"(%11) {dims = array<i64>} : (tensor<f32>) -> tensor<1x1x4x8xf32>
  %13 = "poot.binary"(%10, %12) {fn = "mul"} : (tensor<1x1x4x8xf32>, tensor<1x1x4x8xf32>) -> tensor<1x1x4x8xf32>
  %14 = "poot.reshape"(%13) : (tensor<1x1x4x8xf32>) -> tensor<1x1x2x2x8xf32>
  %15 = "poot.iota"() {axis = 1 : i64} : () -> tensor<1x8xi32>
  %16 = "poot.reshape"(%arg4) : (tensor<1x2xi32>) -> tensor<1x2x1xi32>
  %17 = "poot.reshape"(%15) : (tensor<1x8xi32>) -> tensor<1x1x8xi32>
  %18 = "poot.broadcast"(%17) {dims = array<i64: 0, 1, 2>} : (tensor<1x1x8xi32>) -> tensor<1x2x8xi32>
  %19 = "poot.broadcast"(%16) {dims = array<i64: 0, 1, 2>} : (tensor<1x2x1xi32>) -> tensor<1x2x8xi32>
  %20 = "poot.compare"(%18, %19) {pred = "le"} : (tensor<1x2x8xi32>, tensor<1x2x8xi32>) -> tensor<1x2x8xi1>
  %21 = "poot.reshape"(%20) : (tensor<1x2x8xi1>) -> tensor<1x1x1x2x8xi1>
  %22 = "poot.broadcast"(%21) {dims = array<i64: 0, 1, 2, 3, 4>} : (tensor<1x1x1x2x8xi1>) -> tensor<1x1x2x2x8xi1>
  %23 = "poot.constant"() {value = dense<-1.000000e+30> : tensor<f32>} : () -> tensor<f32>
  %24 = "poot.broadcast"(%23) {dims = array<i64>} : (tensor<f32>) -> tensor<1x1x2x2x8xf32>
  %25 = "poot.select"(%22, %14, %24) : (tensor<1x1x2x2x8xi1>, tensor<1x1x2x2x8xf32>, tensor<1x1x2x2x8xf32>) -> tensor<1x1x2x2x8xf32>
  %26 = "poot.reduce"(%25) {axes = array<i64: 4>, fn = "max"} : (tensor<1x1x2x2x8xf32>) -> tensor<1x1x2x2xf32>
  %27 = "poot.reshape"(%26) : (tensor<1x1x2x2xf32>) -> tensor<1x1x2x2x1xf32>
  %28 = "poot.broadcast"(%27) {dims = array<i64: 0, 1, 2, 3, 4>} : (tensor<1x1x2x2x1xf32>) -> tensor<1x1x2x2x8xf32>
  %29 = "poot.binary"(%25, %28) {fn = "sub"} : (tensor<1x1x2x2x8xf32>, tensor<1x1x2x2x8xf32>) -> tensor<1x1x2x2x8xf32>
  %30 = "poot.unary"(%29) {fn = "exp"} : (tensor<1x1x2x2x8xf32>) -> tensor<1x1x2x2x8xf32>
  %31 = "poot.constant"() {value = dense<0.000000e+00> : tensor<f32>} : () -> tensor<f32>
  %32 = "poot.broadcast"(%31) {dims = array<i64>} : (tensor<f32>) -> tensor<1x1x2x2x8xf32>
  %33 = "poot.select"(%22, %30, %32) : (tensor<1x1x2x2x8xi1>, tensor<1x1x2x2x8xf32>, tensor<1x1x2x2x8xf32>) -> tensor<1x1x2x2x8xf32>
  %34 = "poot.reduce"(%33) {axes = array<i64: 4>, fn = "sum"} : (tensor<1x1x2x2x8xf32>) -> tensor<1x1x2x2xf32>
  %35 = "poot.reshape"(%34) : (tensor<1x1x2x2xf32>) -> tensor<1x1x2x2x1xf32>
  %36 = "poot.constant"() {value = dense<1.000000e+00> : tensor<f32>} : () -> tensor<f32>
  %37 = "poot.broadcast"(%36) {dims = array<i64>} : (tensor<f32>) -> tensor<1x1x2x2x1xf32>
  %38 = "poot.binary"(%35, %37) {fn = "max"} : (tensor<1x1x2x2x1xf32>, tensor<1x1x2x2x1xf32>) -> tensor<1x1x2x2x1xf32>
  %39 = "poot.broadcast"(%38) {dims = array<i64: 0, 1, 2, 3, 4>} : (tensor<1x1x2x2x1xf32>) -> tensor<1x1x2x2x8xf32>
  %40 = "poot.binary"(%33, %39) {fn = "div"} : (tensor<1x1x2x2x8xf32>, tensor<1x1x2x2x8xf32>) -> tensor<1x1x2x2x8xf32>
  %41 = "poot.reshape"(%40) : (tensor<1x1x2x2x8xf32>) -> tensor<1x1x4x8xf32>
  %42 = "poot.transpose"(%5) {perm = array<i64: 0, 2, 1, 3>} : (tensor<1x8x1x4xf32>) -> tensor<1x1x8x4xf32>
  %43 = "poot.matmul"(%41, %42) {acc = f32} : (tensor<1x1x4x8xf32>, tensor<1x1x8x4xf32>) -> tensor<1x1x4x4xf32>
  %44 = "poot.reshape"(%43) : (tensor<1x1x4x4xf32>) -> tensor<1x1x2x2x4xf32>
  %45 = "poot.transpose"(%44) {perm = array<i64: 0, 3, 1, 2, 4>} : (tensor<1x1x2x2x4xf32>) -> tensor<1x2x1x2x4xf32>
  %46 = "poot.reshape"(%45) : (tensor<1x2x1x2x4xf32>) -> tensor<1x2x2x4xf32>
  return %46 : tensor<1x2x2x4xf32>
}
