// Attributes whose payload is not a poot type must be diagnostics at the op, not a crash.
//
// Regression (poot/dialects/verify.py check_op): attributes are read inside the try that turns
// TypeError/KeyError/ValueError into a VerifyError; before, poot-opt died with a traceback:
//   acc = f64 / index         -> TypeError: element type f64 is not a poot dtype
//   dense<...> : vector<...>  -> ValueError: Cannot cast type to RankedTensorType
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
  // expected-error @+1 {{'poot.constant' op Cannot cast type to RankedTensorType}}
  %0 = "poot.constant"() {value = dense<1.0> : vector<4xf32>} : () -> tensor<4xf32>
  return
}
