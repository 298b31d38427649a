// poot-expand-exp: a scalar f32 math.exp becomes arithmetic (Cody-Waite reduction by
// round(x * log2 e), a polynomial, 2^n from the float's bits as two factors, then the IEEE
// edges: +inf above ln(FLT_MAX), +0 below ln(2^-150), NaN kept), so LLVM can vectorize the
// loop around it instead of calling libm's expf. Vector and f64 exps are left alone.
// RUN: poot-opt %s --split-input-file --pass-pipeline='builtin.module(poot-expand-exp)' | FileCheck %s

// CHECK-LABEL: func.func @scalar(
// CHECK-NOT: math.exp
// CHECK: arith.maxnumf
// CHECK: arith.minnumf
// CHECK: math.roundeven
// CHECK: arith.mulf
// CHECK: arith.subf
// CHECK: arith.fptosi {{.*}} : f32 to i32
// CHECK: arith.shrsi
// CHECK: arith.shli
// CHECK: arith.bitcast {{.*}} : i32 to f32
// CHECK: arith.cmpf olt
// CHECK: arith.cmpf ogt
// CHECK: arith.cmpf uno
// CHECK: return
func.func @scalar(%x: f32) -> f32 {
  %0 = math.exp %x : f32
  return %0 : f32
}

// -----

// Inside a linalg.generic body (where the lowering puts it), the same.
// CHECK-LABEL: func.func @in_generic(
// CHECK: linalg.generic
// CHECK-NOT: math.exp
// CHECK: math.roundeven
// CHECK: linalg.yield
#id = affine_map<(d0) -> (d0)>
func.func @in_generic(%x: tensor<8xf32>) -> tensor<8xf32> {
  %e = tensor.empty() : tensor<8xf32>
  %0 = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel"]} ins(%x : tensor<8xf32>) outs(%e : tensor<8xf32>) {
  ^bb0(%a: f32, %o: f32):
    %1 = math.exp %a : f32
    linalg.yield %1 : f32
  } -> tensor<8xf32>
  return %0 : tensor<8xf32>
}

// -----

// CHECK-LABEL: func.func @untouched(
// CHECK: math.exp {{.*}} : f64
// CHECK: math.exp {{.*}} : vector<4xf32>
func.func @untouched(%x: f64, %v: vector<4xf32>) -> (f64, vector<4xf32>) {
  %0 = math.exp %x : f64
  %1 = math.exp %v : vector<4xf32>
  return %0, %1 : f64, vector<4xf32>
}
