// Attributes whose payload is not a poot type must be diagnostics at the op, not a crash.
//
// XFAIL: *
// Known bug (dialects/verify.py check_op): `read_attrs(opdef, op)` runs outside the try that
// turns TypeError/KeyError into VerifyError, and ValueError is not caught at all, so
// poot-opt dies with a Python traceback:
//   acc = f64 / index         -> TypeError: element type f64 is not a poot dtype
//   dense<...> : vector<...>  -> ValueError: Cannot cast type to RankedTensorType
// Fix: read the attributes inside that try and also catch ValueError. Remove XFAIL once fixed.
//
// RUN: poot-opt %s --split-input-file --verify-diagnostics

func.func @matmul_acc_f64(%x: tensor<2x2xf32>) {
  // expected-error @+1 {{'poot.matmul' op element type f64 is not a poot dtype}}
  %0 = "poot.matmul"(%x, %x) {acc = f64} : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
  return
}

// -----

func.func @matmul_acc_index(%x: tensor<2x2xf32>) {
  // expected-error @+1 {{'poot.matmul' op element type index is not a poot dtype}}
  %0 = "poot.matmul"(%x, %x) {acc = index} : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
  return
}

// -----

func.func @constant_f64_value_f32_result() {
  // expected-error @+1 {{'poot.constant' op element type f64 is not a poot dtype}}
  %0 = "poot.constant"() {value = dense<1.0> : tensor<4xf64>} : () -> tensor<4xf32>
  return
}

// -----

func.func @constant_vector_value() {
  // expected-error @+1 {{'poot.constant' op}}
  %0 = "poot.constant"() {value = dense<1.0> : vector<4xf32>} : () -> tensor<4xf32>
  return
}
