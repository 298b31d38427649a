// Invalid poot IR: at least one case per op for each of its main rules (operand dtypes, ranks,
// attribute presence/kinds/enum values, result types). poot-opt reports each as an error at the op;
// the rule violations name the op ('poot.<name>' op ...). Structural violations caught by MLIR's
// IRDL verifier (attribute kind, operand kind/count) are matched here on upstream's message;
// dialect-invalid-irdl-op-names.mlir checks that poot-opt prefixes them with the op name.
// test/dialect/test_dialect_coverage.py fails when a registered op has no case here.
// RUN: poot-opt %s --split-input-file --verify-diagnostics

func.func @param_missing_name() {
  // expected-error @+1 {{'poot.param' op attribute "name" is expected but not provided}}
  %0 = "poot.param"() : () -> tensor<4xf32>
  return
}

// -----

func.func @param_empty_name() {
  // expected-error @+1 {{'poot.param' op attribute 'name' must not be empty}}
  %0 = "poot.param"() {name = ""} : () -> tensor<4xf32>
  return
}

// -----

func.func @param_bad_dtype() {
  // expected-error @+1 {{'poot.param' op element type f64 is not a poot dtype}}
  %0 = "poot.param"() {name = "w"} : () -> tensor<4xf64>
  return
}

// -----

func.func @param_dynamic_shape() {
  // expected-error @+1 {{'poot.param' op tensor<?x4xf32>: poot tensors have static shapes}}
  %0 = "poot.param"() {name = "w"} : () -> tensor<?x4xf32>
  return
}

// -----

func.func @param_unknown_attr() {
  // expected-error @+1 {{'poot.param' op has unknown attribute 'scale'}}
  %0 = "poot.param"() {name = "w", scale = 1 : i64} : () -> tensor<4xf32>
  return
}

// -----

func.func @packed_param_block_multiple() {
  // expected-error @+1 {{'poot.packed_param' op innermost dimension 30 is not a multiple of the q4_0 block size 32}}
  %0 = "poot.packed_param"() {name = "w"} : () -> !poot.packed<#poot.q4_0, array<i64: 4, 30>>
  return
}

// -----

func.func @packed_param_kquant_block() {
  // expected-error @+1 {{'poot.packed_param' op innermost dimension 128 is not a multiple of the q6_k block size 256}}
  %0 = "poot.packed_param"() {name = "w"} : () -> !poot.packed<#poot.q6_k, array<i64: 4, 128>>
  return
}

// -----

func.func @packed_param_rank1() {
  // expected-error @+1 {{'poot.packed_param' op packed weights have rank >= 2, got shape [64]}}
  %0 = "poot.packed_param"() {name = "w"} : () -> !poot.packed<#poot.q8_0, array<i64: 64>>
  return
}

// -----

func.func @packed_param_missing_name() {
  // expected-error @+1 {{'poot.packed_param' op attribute "name" is expected but not provided}}
  %0 = "poot.packed_param"() : () -> !poot.packed<#poot.q4_1, array<i64: 2, 32>>
  return
}

// -----

func.func @packed_bad_format() {
  // expected-error @+1 {{expected dynamic attribute}}
  %0 = "poot.packed_param"() {name = "w"} : () -> !poot.packed<#poot.q3_k, array<i64: 4, 256>>
  return
}

// -----

func.func @packed_bad_shape_param() {
  // expected-error @+1 {{expected base attribute 'builtin.dense_array' but got 'builtin.type'}}
  %0 = "poot.packed_param"() {name = "w"} : () -> !poot.packed<#poot.q4_0, i32>
  return
}

// -----

func.func @constant_result_mismatch() {
  // expected-error @+1 {{'poot.constant' op result type tensor<2xi64> does not match the inferred type tensor<2xi32>}}
  %0 = "poot.constant"() {value = dense<[1, 2]> : tensor<2xi32>} : () -> tensor<2xi64>
  return
}

// -----

func.func @constant_missing_value() {
  // expected-error @+1 {{'poot.constant' op attribute "value" is expected but not provided}}
  %0 = "poot.constant"() : () -> tensor<2xi64>
  return
}

// -----

func.func @constant_f64() {
  // expected-error @+1 {{'poot.constant' op element type f64 is not a poot dtype}}
  %0 = "poot.constant"() {value = dense<1.0> : tensor<4xf64>} : () -> tensor<4xf64>
  return
}

// -----

func.func @iota_bool() {
  // expected-error @+1 {{'poot.iota' op result dtype must be int or float, got i1}}
  %0 = "poot.iota"() {axis = 0 : i64} : () -> tensor<4xi1>
  return
}

// -----

func.func @iota_axis() {
  // expected-error @+1 {{'poot.iota' op axis 2 is out of range for rank 2}}
  %0 = "poot.iota"() {axis = 2 : i64} : () -> tensor<4x4xi32>
  return
}

// -----

func.func @iota_negative_axis() {
  // expected-error @+1 {{'poot.iota' op axis -1 is out of range for rank 2}}
  %0 = "poot.iota"() {axis = -1 : i64} : () -> tensor<4x4xi32>
  return
}

// -----

func.func @unary_exp_int(%x: tensor<4xi32>) {
  // expected-error @+1 {{'poot.unary' op fn "exp" does not admit dtype i32}}
  %0 = "poot.unary"(%x) {fn = "exp"} : (tensor<4xi32>) -> tensor<4xi32>
  return
}

// -----

func.func @unary_not_float(%x: tensor<4xf32>) {
  // expected-error @+1 {{'poot.unary' op fn "not" does not admit dtype f32}}
  %0 = "poot.unary"(%x) {fn = "not"} : (tensor<4xf32>) -> tensor<4xf32>
  return
}

// -----

func.func @unary_neg_bool(%x: tensor<4xi1>) {
  // expected-error @+1 {{'poot.unary' op fn "neg" does not admit dtype i1}}
  %0 = "poot.unary"(%x) {fn = "neg"} : (tensor<4xi1>) -> tensor<4xi1>
  return
}

// -----

func.func @unary_bad_enum(%x: tensor<4xf32>) {
  // expected-error @+1 {{'poot.unary' op attribute 'fn' = "gelu" is not one of neg, abs, exp}}
  %0 = "poot.unary"(%x) {fn = "gelu"} : (tensor<4xf32>) -> tensor<4xf32>
  return
}

// -----

func.func @unary_missing_fn(%x: tensor<4xf32>) {
  // expected-error @+1 {{'poot.unary' op attribute "fn" is expected but not provided}}
  %0 = "poot.unary"(%x) : (tensor<4xf32>) -> tensor<4xf32>
  return
}

// -----

func.func @unary_result_type(%x: tensor<4xf32>) {
  // expected-error @+1 {{'poot.unary' op result type tensor<4xf16> does not match the inferred type tensor<4xf32>}}
  %0 = "poot.unary"(%x) {fn = "exp"} : (tensor<4xf32>) -> tensor<4xf16>
  return
}

// -----

func.func @unary_dtype_f64(%x: tensor<4xf64>) {
  // expected-error @+1 {{'poot.unary' op element type f64 is not a poot dtype}}
  %0 = "poot.unary"(%x) {fn = "exp"} : (tensor<4xf64>) -> tensor<4xf64>
  return
}

// -----

func.func @binary_shape_mismatch(%a: tensor<4xf32>, %b: tensor<1xf32>) {
  // expected-error @+1 {{'poot.binary' op operand #1 type tensor<1xf32> differs from operand #0 type tensor<4xf32>}}
  %0 = "poot.binary"(%a, %b) {fn = "add"} : (tensor<4xf32>, tensor<1xf32>) -> tensor<4xf32>
  return
}

// -----

func.func @binary_dtype_mismatch(%a: tensor<4xf32>, %b: tensor<4xf16>) {
  // expected-error @+1 {{'poot.binary' op operand #1 type tensor<4xf16> differs from operand #0 type tensor<4xf32>}}
  %0 = "poot.binary"(%a, %b) {fn = "mul"} : (tensor<4xf32>, tensor<4xf16>) -> tensor<4xf32>
  return
}

// -----

func.func @binary_pow_int(%a: tensor<4xi32>, %b: tensor<4xi32>) {
  // expected-error @+1 {{'poot.binary' op fn "pow" does not admit dtype i32}}
  %0 = "poot.binary"(%a, %b) {fn = "pow"} : (tensor<4xi32>, tensor<4xi32>) -> tensor<4xi32>
  return
}

// -----

func.func @binary_and_float(%a: tensor<4xf32>, %b: tensor<4xf32>) {
  // expected-error @+1 {{'poot.binary' op fn "and" does not admit dtype f32}}
  %0 = "poot.binary"(%a, %b) {fn = "and"} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return
}

// -----

func.func @binary_bad_enum(%a: tensor<4xf32>, %b: tensor<4xf32>) {
  // expected-error @+1 {{'poot.binary' op attribute 'fn' = "xor" is not one of add, sub, mul, div, max, min, pow, and, or}}
  %0 = "poot.binary"(%a, %b) {fn = "xor"} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return
}

// -----

func.func @ternary_fma_int(%a: tensor<4xi32>) {
  // expected-error @+1 {{'poot.ternary' op fn "fma" does not admit dtype i32}}
  %0 = "poot.ternary"(%a, %a, %a) {fn = "fma"} : (tensor<4xi32>, tensor<4xi32>, tensor<4xi32>) -> tensor<4xi32>
  return
}

// -----

func.func @ternary_type_mismatch(%a: tensor<4xf32>, %b: tensor<4xf32>, %c: tensor<2x2xf32>) {
  // expected-error @+1 {{'poot.ternary' op operand #2 type tensor<2x2xf32> differs from operand #0 type tensor<4xf32>}}
  %0 = "poot.ternary"(%a, %b, %c) {fn = "clamp"} : (tensor<4xf32>, tensor<4xf32>, tensor<2x2xf32>) -> tensor<4xf32>
  return
}

// -----

func.func @ternary_bad_enum(%a: tensor<4xf32>) {
  // expected-error @+1 {{'poot.ternary' op attribute 'fn' = "lerp" is not one of fma, clamp}}
  %0 = "poot.ternary"(%a, %a, %a) {fn = "lerp"} : (tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return
}

// -----

func.func @compare_result_not_i1(%a: tensor<4xf32>) {
  // expected-error @+1 {{'poot.compare' op result type tensor<4xf32> does not match the inferred type tensor<4xi1>}}
  %0 = "poot.compare"(%a, %a) {pred = "lt"} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return
}

// -----

func.func @compare_operand_mismatch(%a: tensor<4xf32>, %b: tensor<4xi32>) {
  // expected-error @+1 {{'poot.compare' op operand #1 type tensor<4xi32> differs from operand #0 type tensor<4xf32>}}
  %0 = "poot.compare"(%a, %b) {pred = "eq"} : (tensor<4xf32>, tensor<4xi32>) -> tensor<4xi1>
  return
}

// -----

func.func @compare_bad_pred(%a: tensor<4xf32>) {
  // expected-error @+1 {{'poot.compare' op attribute 'pred' = "ult" is not one of eq, ne, lt, le, gt, ge}}
  %0 = "poot.compare"(%a, %a) {pred = "ult"} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xi1>
  return
}

// -----

func.func @compare_missing_pred(%a: tensor<4xf32>) {
  // expected-error @+1 {{'poot.compare' op attribute "pred" is expected but not provided}}
  %0 = "poot.compare"(%a, %a) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xi1>
  return
}

// -----

func.func @select_cond_not_i1(%c: tensor<4xi32>, %a: tensor<4xf32>) {
  // expected-error @+1 {{'poot.select' op condition must have dtype i1, got i32}}
  %0 = "poot.select"(%c, %a, %a) : (tensor<4xi32>, tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return
}

// -----

func.func @select_cond_shape(%c: tensor<2xi1>, %a: tensor<4xf32>) {
  // expected-error @+1 {{'poot.select' op condition shape [2] differs from value shape [4]}}
  %0 = "poot.select"(%c, %a, %a) : (tensor<2xi1>, tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return
}

// -----

func.func @select_branch_mismatch(%c: tensor<4xi1>, %a: tensor<4xf32>, %b: tensor<4xbf16>) {
  // expected-error @+1 {{'poot.select' op operand #2 type tensor<4xbf16> differs from operand #1 type tensor<4xf32>}}
  %0 = "poot.select"(%c, %a, %b) : (tensor<4xi1>, tensor<4xf32>, tensor<4xbf16>) -> tensor<4xf32>
  return
}

// -----

func.func @cast_shape(%x: tensor<4xf32>) {
  // expected-error @+1 {{'poot.cast' op result shape [2, 2] differs from operand shape [4]}}
  %0 = "poot.cast"(%x) : (tensor<4xf32>) -> tensor<2x2xbf16>
  return
}

// -----

func.func @cast_unknown_attr(%x: tensor<4xf32>) {
  // expected-error @+1 {{'poot.cast' op has unknown attribute 'rounding'}}
  %0 = "poot.cast"(%x) {rounding = "up"} : (tensor<4xf32>) -> tensor<4xbf16>
  return
}

// -----

func.func @reduce_axes_unsorted(%x: tensor<2x3x4xf32>) {
  // expected-error @+1 {{'poot.reduce' op axes [2, 0] must be sorted and unique}}
  %0 = "poot.reduce"(%x) {axes = array<i64: 2, 0>, fn = "sum"} : (tensor<2x3x4xf32>) -> tensor<3xf32>
  return
}

// -----

func.func @reduce_axes_empty(%x: tensor<2x3xf32>) {
  // expected-error @+1 {{'poot.reduce' op attribute 'axes' must not be empty}}
  %0 = "poot.reduce"(%x) {axes = array<i64>, fn = "sum"} : (tensor<2x3xf32>) -> tensor<2x3xf32>
  return
}

// -----

func.func @reduce_axis_range(%x: tensor<2x3xf32>) {
  // expected-error @+1 {{'poot.reduce' op axis 2 is out of range for rank 2}}
  %0 = "poot.reduce"(%x) {axes = array<i64: 2>, fn = "max"} : (tensor<2x3xf32>) -> tensor<2x3xf32>
  return
}

// -----

func.func @reduce_sum_bool(%x: tensor<2x3xi1>) {
  // expected-error @+1 {{'poot.reduce' op sum does not admit dtype i1}}
  %0 = "poot.reduce"(%x) {axes = array<i64: 1>, fn = "sum"} : (tensor<2x3xi1>) -> tensor<2xi1>
  return
}

// -----

func.func @reduce_result_keeps_dim(%x: tensor<2x3xf32>) {
  // expected-error @+1 {{'poot.reduce' op result type tensor<2x1xf32> does not match the inferred type tensor<2xf32>}}
  %0 = "poot.reduce"(%x) {axes = array<i64: 1>, fn = "sum"} : (tensor<2x3xf32>) -> tensor<2x1xf32>
  return
}

// -----

func.func @reduce_bad_fn(%x: tensor<2x3xf32>) {
  // expected-error @+1 {{'poot.reduce' op attribute 'fn' = "mean" is not one of sum, max, min}}
  %0 = "poot.reduce"(%x) {axes = array<i64: 1>, fn = "mean"} : (tensor<2x3xf32>) -> tensor<2xf32>
  return
}

// -----

func.func @reduce_missing_axes(%x: tensor<2x3xf32>) {
  // expected-error @+1 {{'poot.reduce' op attribute "axes" is expected but not provided}}
  %0 = "poot.reduce"(%x) {fn = "sum"} : (tensor<2x3xf32>) -> tensor<2xf32>
  return
}

// -----

func.func @broadcast_dims_count(%x: tensor<2x3xf32>) {
  // expected-error @+1 {{'poot.broadcast' op rank mismatch: 'dims' has 1 entries for an operand of rank 2}}
  %0 = "poot.broadcast"(%x) {dims = array<i64: 1>} : (tensor<2x3xf32>) -> tensor<4x2x3xf32>
  return
}

// -----

func.func @broadcast_dims_order(%x: tensor<2x3xf32>) {
  // expected-error @+1 {{'poot.broadcast' op dims [2, 1] must be strictly increasing}}
  %0 = "poot.broadcast"(%x) {dims = array<i64: 2, 1>} : (tensor<2x3xf32>) -> tensor<4x3x2xf32>
  return
}

// -----

func.func @broadcast_size(%x: tensor<3xf32>) {
  // expected-error @+1 {{'poot.broadcast' op operand dim 0 of size 3 cannot broadcast to result dim 1 of size 4}}
  %0 = "poot.broadcast"(%x) {dims = array<i64: 1>} : (tensor<3xf32>) -> tensor<2x4xf32>
  return
}

// -----

func.func @broadcast_dim_range(%x: tensor<3xf32>) {
  // expected-error @+1 {{'poot.broadcast' op dims entry 2 is out of range for rank 2}}
  %0 = "poot.broadcast"(%x) {dims = array<i64: 2>} : (tensor<3xf32>) -> tensor<2x3xf32>
  return
}

// -----

func.func @broadcast_dtype(%x: tensor<3xf32>) {
  // expected-error @+1 {{'poot.broadcast' op result dtype f16 differs from operand dtype f32}}
  %0 = "poot.broadcast"(%x) {dims = array<i64: 1>} : (tensor<3xf32>) -> tensor<2x3xf16>
  return
}

// -----

func.func @reshape_count(%x: tensor<2x3xf32>) {
  // expected-error @+1 {{'poot.reshape' op cannot reshape tensor<2x3xf32> to tensor<4x2xf32>}}
  %0 = "poot.reshape"(%x) : (tensor<2x3xf32>) -> tensor<4x2xf32>
  return
}

// -----

func.func @reshape_dtype(%x: tensor<2x3xf32>) {
  // expected-error @+1 {{'poot.reshape' op cannot reshape tensor<2x3xf32> to tensor<6xi32>}}
  %0 = "poot.reshape"(%x) : (tensor<2x3xf32>) -> tensor<6xi32>
  return
}

// -----

func.func @transpose_not_perm(%x: tensor<2x3x4xf32>) {
  // expected-error @+1 {{'poot.transpose' op perm [0, 0, 1] is not a permutation of rank 3}}
  %0 = "poot.transpose"(%x) {perm = array<i64: 0, 0, 1>} : (tensor<2x3x4xf32>) -> tensor<2x2x3xf32>
  return
}

// -----

func.func @transpose_perm_length(%x: tensor<2x3xf32>) {
  // expected-error @+1 {{'poot.transpose' op perm [1, 0, 2] is not a permutation of rank 2}}
  %0 = "poot.transpose"(%x) {perm = array<i64: 1, 0, 2>} : (tensor<2x3xf32>) -> tensor<3x2xf32>
  return
}

// -----

func.func @transpose_result(%x: tensor<2x3xf32>) {
  // expected-error @+1 {{'poot.transpose' op result type tensor<2x3xf32> does not match the inferred type tensor<3x2xf32>}}
  %0 = "poot.transpose"(%x) {perm = array<i64: 1, 0>} : (tensor<2x3xf32>) -> tensor<2x3xf32>
  return
}

// -----

func.func @transpose_missing_perm(%x: tensor<2x3xf32>) {
  // expected-error @+1 {{'poot.transpose' op attribute "perm" is expected but not provided}}
  %0 = "poot.transpose"(%x) : (tensor<2x3xf32>) -> tensor<3x2xf32>
  return
}

// -----

func.func @slice_bounds_count(%x: tensor<8x6xf32>) {
  // expected-error @+1 {{'poot.slice' op rank mismatch: start/limit/stride have 1/1/1 entries for an operand of rank 2}}
  %0 = "poot.slice"(%x) {limit = array<i64: 4>, start = array<i64: 0>, stride = array<i64: 1>} : (tensor<8x6xf32>) -> tensor<4x6xf32>
  return
}

// -----

func.func @slice_out_of_bounds(%x: tensor<8x6xf32>) {
  // expected-error @+1 {{'poot.slice' op dim 0: slice 0:9:1 is invalid for size 8}}
  %0 = "poot.slice"(%x) {limit = array<i64: 9, 6>, start = array<i64: 0, 0>, stride = array<i64: 1, 1>} : (tensor<8x6xf32>) -> tensor<9x6xf32>
  return
}

// -----

func.func @slice_zero_stride(%x: tensor<8x6xf32>) {
  // expected-error @+1 {{'poot.slice' op dim 1: slice 0:6:0 is invalid for size 6}}
  %0 = "poot.slice"(%x) {limit = array<i64: 8, 6>, start = array<i64: 0, 0>, stride = array<i64: 1, 0>} : (tensor<8x6xf32>) -> tensor<8x6xf32>
  return
}

// -----

func.func @slice_start_after_limit(%x: tensor<8x6xf32>) {
  // expected-error @+1 {{'poot.slice' op dim 0: slice 5:2:1 is invalid for size 8}}
  %0 = "poot.slice"(%x) {limit = array<i64: 2, 6>, start = array<i64: 5, 0>, stride = array<i64: 1, 1>} : (tensor<8x6xf32>) -> tensor<0x6xf32>
  return
}

// -----

func.func @slice_result(%x: tensor<8x6xf32>) {
  // expected-error @+1 {{'poot.slice' op result type tensor<2x6xf32> does not match the inferred type tensor<3x6xf32>}}
  %0 = "poot.slice"(%x) {limit = array<i64: 8, 6>, start = array<i64: 0, 0>, stride = array<i64: 3, 1>} : (tensor<8x6xf32>) -> tensor<2x6xf32>
  return
}

// -----

func.func @slice_missing_stride(%x: tensor<8x6xf32>) {
  // expected-error @+1 {{'poot.slice' op attribute "stride" is expected but not provided}}
  %0 = "poot.slice"(%x) {limit = array<i64: 8, 6>, start = array<i64: 0, 0>} : (tensor<8x6xf32>) -> tensor<8x6xf32>
  return
}

// -----

func.func @concat_result(%a: tensor<2x3xf32>) {
  // expected-error @+1 {{'poot.concat' op result type tensor<2x6xf32> does not match the inferred type tensor<4x3xf32>}}
  %0 = "poot.concat"(%a, %a) {axis = 0 : i64} : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x6xf32>
  return
}

// -----

func.func @concat_axis(%a: tensor<2x3xf32>) {
  // expected-error @+1 {{'poot.concat' op axis 2 is out of range for rank 2}}
  %0 = "poot.concat"(%a, %a) {axis = 2 : i64} : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x6xf32>
  return
}

// -----

// concat is binary: IRDL rejects any other operand count before Concat.check runs.
func.func @concat_no_operands() {
  // expected-error @+1 {{expects exactly 2 operands, but got 0}}
  %0 = "poot.concat"() {axis = 0 : i64} : () -> tensor<2xf32>
  return
}

// -----

func.func @concat_one_operand(%a: tensor<2x3xf32>) {
  // expected-error @+1 {{expects exactly 2 operands, but got 1}}
  %0 = "poot.concat"(%a) {axis = 0 : i64} : (tensor<2x3xf32>) -> tensor<2x3xf32>
  return
}

// -----

func.func @concat_three_operands(%a: tensor<2x3xf32>) {
  // expected-error @+1 {{expects exactly 2 operands, but got 3}}
  %0 = "poot.concat"(%a, %a, %a) {axis = 1 : i64} : (tensor<2x3xf32>, tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x9xf32>
  return
}

// -----

func.func @concat_mismatch(%a: tensor<2x3xf32>, %b: tensor<3x3xf32>) {
  // expected-error @+1 {{'poot.concat' op operand #1 type tensor<3x3xf32> is not concatenable with tensor<2x3xf32> on axis 1}}
  %0 = "poot.concat"(%a, %b) {axis = 1 : i64} : (tensor<2x3xf32>, tensor<3x3xf32>) -> tensor<2x6xf32>
  return
}

// -----

func.func @concat_dtype_mismatch(%a: tensor<2x3xf32>, %b: tensor<2x3xi32>) {
  // expected-error @+1 {{'poot.concat' op operand #1 type tensor<2x3xi32> is not concatenable with tensor<2x3xf32> on axis 0}}
  %0 = "poot.concat"(%a, %b) {axis = 0 : i64} : (tensor<2x3xf32>, tensor<2x3xi32>) -> tensor<4x3xf32>
  return
}

// -----

func.func @concat_rank_mismatch(%a: tensor<2x3xf32>, %b: tensor<3xf32>) {
  // expected-error @+1 {{'poot.concat' op operand #1 type tensor<3xf32> is not concatenable with tensor<2x3xf32> on axis 0}}
  %0 = "poot.concat"(%a, %b) {axis = 0 : i64} : (tensor<2x3xf32>, tensor<3xf32>) -> tensor<3x3xf32>
  return
}

// -----

func.func @matmul_dtype_mix(%a: tensor<4x8xf16>, %b: tensor<8x2xf32>) {
  // expected-error @+1 {{'poot.matmul' op operand dtypes differ: f16 and f32}}
  %0 = "poot.matmul"(%a, %b) {acc = f32} : (tensor<4x8xf16>, tensor<8x2xf32>) -> tensor<4x2xf32>
  return
}

// -----

func.func @matmul_rank(%a: tensor<4x8xf32>, %b: tensor<1x8x2xf32>) {
  // expected-error @+1 {{'poot.matmul' op rank mismatch: lhs tensor<4x8xf32> and rhs tensor<1x8x2xf32> need equal rank >= 2}}
  %0 = "poot.matmul"(%a, %b) {acc = f32} : (tensor<4x8xf32>, tensor<1x8x2xf32>) -> tensor<4x2xf32>
  return
}

// -----

func.func @matmul_rank1(%a: tensor<8xf32>) {
  // expected-error @+1 {{'poot.matmul' op rank mismatch}}
  %0 = "poot.matmul"(%a, %a) {acc = f32} : (tensor<8xf32>, tensor<8xf32>) -> tensor<f32>
  return
}

// -----

func.func @matmul_contraction(%a: tensor<4x8xf32>, %b: tensor<7x2xf32>) {
  // expected-error @+1 {{'poot.matmul' op contraction dims differ: lhs K=8, rhs K=7}}
  %0 = "poot.matmul"(%a, %b) {acc = f32} : (tensor<4x8xf32>, tensor<7x2xf32>) -> tensor<4x2xf32>
  return
}

// -----

func.func @matmul_batch(%a: tensor<2x4x8xf32>, %b: tensor<3x8x2xf32>) {
  // expected-error @+1 {{'poot.matmul' op batch dims [2] and [3] differ}}
  %0 = "poot.matmul"(%a, %b) {acc = f32} : (tensor<2x4x8xf32>, tensor<3x8x2xf32>) -> tensor<2x4x2xf32>
  return
}

// -----

func.func @matmul_acc_float(%a: tensor<4x8xf16>, %b: tensor<8x2xf16>) {
  // expected-error @+1 {{'poot.matmul' op float operands need acc = f32, got f16}}
  %0 = "poot.matmul"(%a, %b) {acc = f16} : (tensor<4x8xf16>, tensor<8x2xf16>) -> tensor<4x2xf32>
  return
}

// -----

func.func @matmul_int_not_i8(%a: tensor<4x8xi32>, %b: tensor<8x2xi32>) {
  // expected-error @+1 {{'poot.matmul' op integer matmul takes i8 operands with acc = i32, got i32/i32}}
  %0 = "poot.matmul"(%a, %b) {acc = i32} : (tensor<4x8xi32>, tensor<8x2xi32>) -> tensor<4x2xi32>
  return
}

// -----

func.func @matmul_bool(%a: tensor<4x8xi1>, %b: tensor<8x2xi1>) {
  // expected-error @+1 {{'poot.matmul' op does not admit dtype i1}}
  %0 = "poot.matmul"(%a, %b) {acc = i32} : (tensor<4x8xi1>, tensor<8x2xi1>) -> tensor<4x2xi32>
  return
}

// -----

func.func @matmul_result(%a: tensor<4x8xi8>, %b: tensor<8x2xi8>) {
  // expected-error @+1 {{'poot.matmul' op result type tensor<4x2xf32> does not match tensor<4x2xi32>}}
  %0 = "poot.matmul"(%a, %b) {acc = i32} : (tensor<4x8xi8>, tensor<8x2xi8>) -> tensor<4x2xf32>
  return
}

// -----

func.func @indexed_matmul_k(%x: tensor<6x8xf32>, %w: tensor<4x3x7xf32>, %i: tensor<6xi32>) {
  // expected-error @+1 {{'poot.indexed_matmul' op contraction dims differ: x K=8, w K=7}}
  %0 = "poot.indexed_matmul"(%x, %w, %i) {acc = f32} : (tensor<6x8xf32>, tensor<4x3x7xf32>, tensor<6xi32>) -> tensor<6x3xf32>
  return
}

// -----

func.func @indexed_matmul_rows(%x: tensor<6x8xf32>, %w: tensor<4x3x8xf32>, %i: tensor<5xi32>) {
  // expected-error @+1 {{'poot.indexed_matmul' op idx has 5 rows, x has 6}}
  %0 = "poot.indexed_matmul"(%x, %w, %i) {acc = f32} : (tensor<6x8xf32>, tensor<4x3x8xf32>, tensor<5xi32>) -> tensor<6x3xf32>
  return
}

// -----

func.func @indexed_matmul_float_idx(%x: tensor<6x8xf32>, %w: tensor<4x3x8xf32>, %i: tensor<6xf32>) {
  // expected-error @+1 {{'poot.indexed_matmul' op idx must have an integer dtype, got f32}}
  %0 = "poot.indexed_matmul"(%x, %w, %i) {acc = f32} : (tensor<6x8xf32>, tensor<4x3x8xf32>, tensor<6xf32>) -> tensor<6x3xf32>
  return
}

// -----

func.func @indexed_matmul_rank(%x: tensor<6x8xf32>, %w: tensor<3x8xf32>, %i: tensor<6xi32>) {
  // expected-error @+1 {{'poot.indexed_matmul' op needs x [T, K], w [E, O, K] and idx [T]}}
  %0 = "poot.indexed_matmul"(%x, %w, %i) {acc = f32} : (tensor<6x8xf32>, tensor<3x8xf32>, tensor<6xi32>) -> tensor<6x3xf32>
  return
}

// -----

func.func @indexed_matmul_missing_acc(%x: tensor<6x8xf32>, %w: tensor<4x3x8xf32>, %i: tensor<6xi32>) {
  // expected-error @+1 {{'poot.indexed_matmul' op attribute "acc" is expected but not provided}}
  %0 = "poot.indexed_matmul"(%x, %w, %i) : (tensor<6x8xf32>, tensor<4x3x8xf32>, tensor<6xi32>) -> tensor<6x3xf32>
  return
}

// -----

func.func @matmul_missing_acc(%a: tensor<4x8xf32>, %b: tensor<8x2xf32>) {
  // expected-error @+1 {{'poot.matmul' op attribute "acc" is expected but not provided}}
  %0 = "poot.matmul"(%a, %b) : (tensor<4x8xf32>, tensor<8x2xf32>) -> tensor<4x2xf32>
  return
}

// -----

func.func @matmul_acc_not_type(%a: tensor<4x8xf32>, %b: tensor<8x2xf32>) {
  // expected-error @+1 {{expected base attribute 'builtin.type' but got 'builtin.string'}}
  %0 = "poot.matmul"(%a, %b) {acc = "f32"} : (tensor<4x8xf32>, tensor<8x2xf32>) -> tensor<4x2xf32>
  return
}

// -----

func.func @matmul_packed_operand(%a: tensor<4x32xf32>, %p: !poot.packed<#poot.q4_0, array<i64: 32, 32>>) {
  // expected-error @+1 {{expected base type 'builtin.tensor' but got 'poot.packed'}}
  %0 = "poot.matmul"(%a, %p) {acc = f32} : (tensor<4x32xf32>, !poot.packed<#poot.q4_0, array<i64: 32, 32>>) -> tensor<4x32xf32>
  return
}

// -----

func.func @gather_float_indices(%t: tensor<10x4xf32>, %i: tensor<3xf32>) {
  // expected-error @+1 {{'poot.gather' op indices must have an integer dtype, got f32}}
  %0 = "poot.gather"(%t, %i) {axis = 0 : i64} : (tensor<10x4xf32>, tensor<3xf32>) -> tensor<3x4xf32>
  return
}

// -----

func.func @gather_bool_indices(%t: tensor<10x4xf32>, %i: tensor<3xi1>) {
  // expected-error @+1 {{'poot.gather' op indices must have an integer dtype, got i1}}
  %0 = "poot.gather"(%t, %i) {axis = 0 : i64} : (tensor<10x4xf32>, tensor<3xi1>) -> tensor<3x4xf32>
  return
}

// -----

func.func @gather_axis(%t: tensor<10x4xf32>, %i: tensor<3xi32>) {
  // expected-error @+1 {{'poot.gather' op axis 2 is out of range for rank 2}}
  %0 = "poot.gather"(%t, %i) {axis = 2 : i64} : (tensor<10x4xf32>, tensor<3xi32>) -> tensor<3x4xf32>
  return
}

// -----

func.func @gather_result(%t: tensor<10x4xf32>, %i: tensor<2x3xi32>) {
  // expected-error @+1 {{'poot.gather' op result type tensor<6x4xf32> does not match the inferred type tensor<2x3x4xf32>}}
  %0 = "poot.gather"(%t, %i) {axis = 0 : i64} : (tensor<10x4xf32>, tensor<2x3xi32>) -> tensor<6x4xf32>
  return
}

// -----

func.func @gather_missing_axis(%t: tensor<10x4xf32>, %i: tensor<3xi32>) {
  // expected-error @+1 {{'poot.gather' op attribute "axis" is expected but not provided}}
  %0 = "poot.gather"(%t, %i) : (tensor<10x4xf32>, tensor<3xi32>) -> tensor<3x4xf32>
  return
}

// -----

func.func @scatter_indices_rank(%d: tensor<8x4xf32>, %i: tensor<3xi32>, %u: tensor<3x4xf32>) {
  // expected-error @+1 {{'poot.scatter' op rank mismatch: indices must be [N, r] with 1 <= r <= 2, got [3]}}
  %0 = "poot.scatter"(%d, %i, %u) : (tensor<8x4xf32>, tensor<3xi32>, tensor<3x4xf32>) -> tensor<8x4xf32>
  return
}

// -----

func.func @scatter_index_depth(%d: tensor<8x4xf32>, %i: tensor<3x3xi32>, %u: tensor<3xf32>) {
  // expected-error @+1 {{'poot.scatter' op rank mismatch: indices must be [N, r] with 1 <= r <= 2, got [3, 3]}}
  %0 = "poot.scatter"(%d, %i, %u) : (tensor<8x4xf32>, tensor<3x3xi32>, tensor<3xf32>) -> tensor<8x4xf32>
  return
}

// -----

func.func @scatter_float_indices(%d: tensor<8x4xf32>, %i: tensor<3x1xf32>, %u: tensor<3x4xf32>) {
  // expected-error @+1 {{'poot.scatter' op indices must have an integer dtype, got f32}}
  %0 = "poot.scatter"(%d, %i, %u) : (tensor<8x4xf32>, tensor<3x1xf32>, tensor<3x4xf32>) -> tensor<8x4xf32>
  return
}

// -----

func.func @scatter_updates_shape(%d: tensor<8x4xf32>, %i: tensor<3x1xi64>, %u: tensor<3x5xf32>) {
  // expected-error @+1 {{'poot.scatter' op updates must be tensor<3x4xf32>, got tensor<3x5xf32>}}
  %0 = "poot.scatter"(%d, %i, %u) : (tensor<8x4xf32>, tensor<3x1xi64>, tensor<3x5xf32>) -> tensor<8x4xf32>
  return
}

// -----

func.func @scatter_updates_dtype(%d: tensor<8x4xf32>, %i: tensor<3x1xi64>, %u: tensor<3x4xf16>) {
  // expected-error @+1 {{'poot.scatter' op updates must be tensor<3x4xf32>, got tensor<3x4xf16>}}
  %0 = "poot.scatter"(%d, %i, %u) : (tensor<8x4xf32>, tensor<3x1xi64>, tensor<3x4xf16>) -> tensor<8x4xf32>
  return
}

// -----

func.func @scatter_result(%d: tensor<8x4xf32>, %i: tensor<3x1xi64>, %u: tensor<3x4xf32>) {
  // expected-error @+1 {{'poot.scatter' op result type tensor<8x4xf16> does not match the inferred type tensor<8x4xf32>}}
  %0 = "poot.scatter"(%d, %i, %u) : (tensor<8x4xf32>, tensor<3x1xi64>, tensor<3x4xf32>) -> tensor<8x4xf16>
  return
}

// -----

func.func @dequantize_shape(%p: !poot.packed<#poot.q4_1, array<i64: 32, 64>>) {
  // expected-error @+1 {{'poot.dequantize' op result tensor<64x32xf32> must be a float tensor of shape [32, 64]}}
  %0 = "poot.dequantize"(%p) : (!poot.packed<#poot.q4_1, array<i64: 32, 64>>) -> tensor<64x32xf32>
  return
}

// -----

func.func @dequantize_int_result(%p: !poot.packed<#poot.q8_0, array<i64: 2, 32>>) {
  // expected-error @+1 {{'poot.dequantize' op result tensor<2x32xi8> must be a float tensor of shape [2, 32]}}
  %0 = "poot.dequantize"(%p) : (!poot.packed<#poot.q8_0, array<i64: 2, 32>>) -> tensor<2x32xi8>
  return
}

// -----

func.func @dequantize_tensor_operand(%x: tensor<2x32xf32>) {
  // expected-error @+1 {{expected base type 'poot.packed' but got 'builtin.tensor'}}
  %0 = "poot.dequantize"(%x) : (tensor<2x32xf32>) -> tensor<2x32xf32>
  return
}

// -----

func.func @dequantize_packed_result(%p: !poot.packed<#poot.q8_0, array<i64: 2, 32>>) {
  // expected-error @+1 {{expected base type 'builtin.tensor' but got 'poot.packed'}}
  %0 = "poot.dequantize"(%p) : (!poot.packed<#poot.q8_0, array<i64: 2, 32>>) -> !poot.packed<#poot.q8_0, array<i64: 2, 32>>
  return
}

// -----

func.func @unknown_op(%x: tensor<4xf32>) {
  // expected-error @+1 {{unregistered operation 'poot.gelu' found in dialect ('poot')}}
  %0 = "poot.gelu"(%x) : (tensor<4xf32>) -> tensor<4xf32>
  return
}

// -----

func.func @operand_count(%x: tensor<4xf32>) {
  // expected-error @+1 {{'poot.unary' op expects exactly 1 operands, but got 2}}
  %0 = "poot.unary"(%x, %x) {fn = "exp"} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return
}

// -----

func.func @result_count(%x: tensor<4xf32>) {
  // expected-error @+1 {{'poot.unary' op expects exactly 1 results, but got 2}}
  %0:2 = "poot.unary"(%x) {fn = "exp"} : (tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>)
  return
}

// -----

func.func @attr_kind(%x: tensor<4xf32>) {
  // expected-error @+1 {{expected base attribute 'builtin.string' but got 'builtin.integer'}}
  %0 = "poot.unary"(%x) {fn = 3 : i64} : (tensor<4xf32>) -> tensor<4xf32>
  return
}

// -----

func.func @gather_axis_kind(%t: tensor<10x4xf32>, %i: tensor<3xi32>) {
  // expected-error @+1 {{expected base attribute 'builtin.integer' but got 'builtin.dense_array'}}
  %0 = "poot.gather"(%t, %i) {axis = array<i64: 0>} : (tensor<10x4xf32>, tensor<3xi32>) -> tensor<3x4xf32>
  return
}

// -----

func.func @binary_missing_fn(%a: tensor<4xf32>) {
  // expected-error @+1 {{'poot.binary' op attribute "fn" is expected but not provided}}
  %0 = "poot.binary"(%a, %a) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return
}

// -----

func.func @ternary_missing_fn(%a: tensor<4xf32>) {
  // expected-error @+1 {{'poot.ternary' op attribute "fn" is expected but not provided}}
  %0 = "poot.ternary"(%a, %a, %a) : (tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return
}

// -----

func.func @reduce_missing_fn(%x: tensor<2x3xf32>) {
  // expected-error @+1 {{'poot.reduce' op attribute "fn" is expected but not provided}}
  %0 = "poot.reduce"(%x) {axes = array<i64: 1>} : (tensor<2x3xf32>) -> tensor<2xf32>
  return
}

// -----

func.func @broadcast_missing_dims(%x: tensor<3xf32>) {
  // expected-error @+1 {{'poot.broadcast' op attribute "dims" is expected but not provided}}
  %0 = "poot.broadcast"(%x) : (tensor<3xf32>) -> tensor<2x3xf32>
  return
}

// -----

func.func @concat_missing_axis(%a: tensor<2x3xf32>) {
  // expected-error @+1 {{'poot.concat' op attribute "axis" is expected but not provided}}
  %0 = "poot.concat"(%a, %a) : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<4x3xf32>
  return
}

// -----

func.func @iota_missing_axis() {
  // expected-error @+1 {{'poot.iota' op attribute "axis" is expected but not provided}}
  %0 = "poot.iota"() : () -> tensor<4xi32>
  return
}

// -----

func.func @slice_missing_start(%x: tensor<8x6xf32>) {
  // expected-error @+1 {{'poot.slice' op attribute "start" is expected but not provided}}
  %0 = "poot.slice"(%x) {limit = array<i64: 8, 6>, stride = array<i64: 1, 1>} : (tensor<8x6xf32>) -> tensor<8x6xf32>
  return
}

// -----

func.func @slice_missing_limit(%x: tensor<8x6xf32>) {
  // expected-error @+1 {{'poot.slice' op attribute "limit" is expected but not provided}}
  %0 = "poot.slice"(%x) {start = array<i64: 0, 0>, stride = array<i64: 1, 1>} : (tensor<8x6xf32>) -> tensor<8x6xf32>
  return
}

// -----

func.func @attention_missing_scale(%q: tensor<2x4x8xf32>, %k: tensor<2x6x8xf32>, %v: tensor<2x6x3xf32>, %m: tensor<1x4x6xi1>) {
  // expected-error @+1 {{'poot.attention' op attribute "scale" is expected but not provided}}
  %0 = "poot.attention"(%q, %k, %v, %m) {softcap = 0.0 : f64} : (tensor<2x4x8xf32>, tensor<2x6x8xf32>, tensor<2x6x3xf32>, tensor<1x4x6xi1>) -> tensor<2x4x3xf32>
  return
}

// -----

func.func @attention_missing_softcap(%q: tensor<2x4x8xf32>, %k: tensor<2x6x8xf32>, %v: tensor<2x6x3xf32>, %m: tensor<1x4x6xi1>) {
  // expected-error @+1 {{'poot.attention' op attribute "softcap" is expected but not provided}}
  %0 = "poot.attention"(%q, %k, %v, %m) {scale = 1.0 : f64} : (tensor<2x4x8xf32>, tensor<2x6x8xf32>, tensor<2x6x3xf32>, tensor<1x4x6xi1>) -> tensor<2x4x3xf32>
  return
}

// -----

func.func @attention_head_dims(%q: tensor<2x4x5xf32>, %k: tensor<2x6x8xf32>, %v: tensor<2x6x3xf32>, %m: tensor<1x4x6xi1>) {
  // expected-error @+1 {{'poot.attention' op head dims differ: q D=5, k D=8}}
  %0 = "poot.attention"(%q, %k, %v, %m) {scale = 1.0 : f64, softcap = 0.0 : f64} : (tensor<2x4x5xf32>, tensor<2x6x8xf32>, tensor<2x6x3xf32>, tensor<1x4x6xi1>) -> tensor<2x4x3xf32>
  return
}

// -----

func.func @attention_mask_dtype(%q: tensor<2x4x8xf32>, %k: tensor<2x6x8xf32>, %v: tensor<2x6x3xf32>, %m: tensor<1x4x6xi8>) {
  // expected-error @+1 {{'poot.attention' op mask must be i1 (visible) or f32 (additive bias), got i8}}
  %0 = "poot.attention"(%q, %k, %v, %m) {scale = 1.0 : f64, softcap = 0.0 : f64} : (tensor<2x4x8xf32>, tensor<2x6x8xf32>, tensor<2x6x3xf32>, tensor<1x4x6xi8>) -> tensor<2x4x3xf32>
  return
}

// -----

func.func @attention_negative_softcap(%q: tensor<2x4x8xf32>, %k: tensor<2x6x8xf32>, %v: tensor<2x6x3xf32>, %m: tensor<1x4x6xi1>) {
  // expected-error @+1 {{'poot.attention' op softcap must be >= 0 (0 = none), got -1.0}}
  %0 = "poot.attention"(%q, %k, %v, %m) {scale = 1.0 : f64, softcap = -1.0 : f64} : (tensor<2x4x8xf32>, tensor<2x6x8xf32>, tensor<2x6x3xf32>, tensor<1x4x6xi1>) -> tensor<2x4x3xf32>
  return
}

// -----

func.func @attention_result(%q: tensor<2x4x8xbf16>, %k: tensor<2x6x8xbf16>, %v: tensor<2x6x3xbf16>, %m: tensor<1x4x6xi1>) {
  // expected-error @+1 {{'poot.attention' op result type tensor<2x4x3xbf16> does not match the inferred type tensor<2x4x3xf32>}}
  %0 = "poot.attention"(%q, %k, %v, %m) {scale = 1.0 : f64, softcap = 0.0 : f64} : (tensor<2x4x8xbf16>, tensor<2x6x8xbf16>, tensor<2x6x3xbf16>, tensor<1x4x6xi1>) -> tensor<2x4x3xbf16>
  return
}

// -----

func.func @paged_attention_pool_dtypes(%q: tensor<1x2x3x8xf32>, %kp: tensor<4x16x2x8xf16>, %vp: tensor<4x16x2x8xf32>, %bt: tensor<1x2xi32>, %m: tensor<1x1x3x32xi1>) {
  // expected-error @+1 {{'poot.paged_attention' op pools need one float dtype, got f16, f32}}
  %0 = "poot.paged_attention"(%q, %kp, %vp, %bt, %m) {scale = 1.0 : f64, softcap = 0.0 : f64} : (tensor<1x2x3x8xf32>, tensor<4x16x2x8xf16>, tensor<4x16x2x8xf32>, tensor<1x2xi32>, tensor<1x1x3x32xi1>) -> tensor<1x2x3x8xf32>
  return
}

// -----

func.func @paged_attention_heads(%q: tensor<1x3x3x8xf32>, %kp: tensor<4x16x2x8xf32>, %vp: tensor<4x16x2x8xf32>, %bt: tensor<1x2xi32>, %m: tensor<1x1x3x32xi1>) {
  // expected-error @+1 {{'poot.paged_attention' op q must be [B, H, rows..., D] = [1, 2, ..., 8], got tensor<1x3x3x8xf32>}}
  %0 = "poot.paged_attention"(%q, %kp, %vp, %bt, %m) {scale = 1.0 : f64, softcap = 0.0 : f64} : (tensor<1x3x3x8xf32>, tensor<4x16x2x8xf32>, tensor<4x16x2x8xf32>, tensor<1x2xi32>, tensor<1x1x3x32xi1>) -> tensor<1x3x3x8xf32>
  return
}

// -----

func.func @paged_attention_mask_keys(%q: tensor<1x2x3x8xf32>, %kp: tensor<4x16x2x8xf32>, %vp: tensor<4x16x2x8xf32>, %bt: tensor<1x2xi32>, %m: tensor<1x1x3x16xi1>) {
  // expected-error @+1 {{'poot.paged_attention' op mask tensor<1x1x3x16xi1> does not broadcast to the scores [1, 2, 3, 32]}}
  %0 = "poot.paged_attention"(%q, %kp, %vp, %bt, %m) {scale = 1.0 : f64, softcap = 0.0 : f64} : (tensor<1x2x3x8xf32>, tensor<4x16x2x8xf32>, tensor<4x16x2x8xf32>, tensor<1x2xi32>, tensor<1x1x3x16xi1>) -> tensor<1x2x3x8xf32>
  return
}

// -----

func.func @paged_attention_table(%q: tensor<1x2x3x8xf32>, %kp: tensor<4x16x2x8xf32>, %vp: tensor<4x16x2x8xf32>, %bt: tensor<1x2xf32>, %m: tensor<1x1x3x32xi1>) {
  // expected-error @+1 {{'poot.paged_attention' op block_table must be an integer [B, W], got tensor<1x2xf32>}}
  %0 = "poot.paged_attention"(%q, %kp, %vp, %bt, %m) {scale = 1.0 : f64, softcap = 0.0 : f64} : (tensor<1x2x3x8xf32>, tensor<4x16x2x8xf32>, tensor<4x16x2x8xf32>, tensor<1x2xf32>, tensor<1x1x3x32xi1>) -> tensor<1x2x3x8xf32>
  return
}

// -----

func.func @paged_attention_missing_scale(%q: tensor<1x2x3x8xf32>, %kp: tensor<4x16x2x8xf32>, %vp: tensor<4x16x2x8xf32>, %bt: tensor<1x2xi32>, %m: tensor<1x1x3x32xi1>) {
  // expected-error @+1 {{'poot.paged_attention' op attribute "scale" is expected but not provided}}
  %0 = "poot.paged_attention"(%q, %kp, %vp, %bt, %m) {softcap = 0.0 : f64} : (tensor<1x2x3x8xf32>, tensor<4x16x2x8xf32>, tensor<4x16x2x8xf32>, tensor<1x2xi32>, tensor<1x1x3x32xi1>) -> tensor<1x2x3x8xf32>
  return
}

// -----

func.func @paged_attention_missing_softcap(%q: tensor<1x2x3x8xf32>, %kp: tensor<4x16x2x8xf32>, %vp: tensor<4x16x2x8xf32>, %bt: tensor<1x2xi32>, %m: tensor<1x1x3x32xi1>) {
  // expected-error @+1 {{'poot.paged_attention' op attribute "softcap" is expected but not provided}}
  %0 = "poot.paged_attention"(%q, %kp, %vp, %bt, %m) {scale = 1.0 : f64} : (tensor<1x2x3x8xf32>, tensor<4x16x2x8xf32>, tensor<4x16x2x8xf32>, tensor<1x2xi32>, tensor<1x1x3x32xi1>) -> tensor<1x2x3x8xf32>
  return
}

// -----

func.func @paged_attention_q8_0_no_scales(%q: tensor<1x2x3x64xf32>, %kp: tensor<4x16x2x64xi8>, %vp: tensor<4x16x2x64xi8>, %bt: tensor<1x2xi32>, %m: tensor<1x1x3x32xi1>, %ks: tensor<4x16x2x2xf16>) {
  // expected-error @+1 {{'poot.paged_attention' op v_pool is i8 (q8_0 or fp8) but has no scales operand}}
  %0 = "poot.paged_attention"(%q, %kp, %vp, %bt, %m, %ks) {scale = 1.0 : f64, softcap = 0.0 : f64} : (tensor<1x2x3x64xf32>, tensor<4x16x2x64xi8>, tensor<4x16x2x64xi8>, tensor<1x2xi32>, tensor<1x1x3x32xi1>, tensor<4x16x2x2xf16>) -> tensor<1x2x3x64xf32>
  return
}

// -----

func.func @paged_attention_q8_0_head_dim(%q: tensor<1x2x3x48xf32>, %kp: tensor<4x16x2x48xi8>, %vp: tensor<4x16x2x48xf32>, %bt: tensor<1x2xi32>, %m: tensor<1x1x3x32xi1>, %ks: tensor<4x16x2x1xf16>) {
  // expected-error @+1 {{'poot.paged_attention' op k_pool: q8_0 needs a head dim that is a multiple of 32, got 48}}
  %0 = "poot.paged_attention"(%q, %kp, %vp, %bt, %m, %ks) {scale = 1.0 : f64, softcap = 0.0 : f64} : (tensor<1x2x3x48xf32>, tensor<4x16x2x48xi8>, tensor<4x16x2x48xf32>, tensor<1x2xi32>, tensor<1x1x3x32xi1>, tensor<4x16x2x1xf16>) -> tensor<1x2x3x48xf32>
  return
}

// -----

func.func @dequantize_q8_0_scales(%v: tensor<2x64xi8>, %s: tensor<2x4xf16>) {
  // expected-error @+1 {{'poot.dequantize_q8_0' op scales must be tensor<2x2xf16>, got tensor<2x4xf16>}}
  %0 = "poot.dequantize_q8_0"(%v, %s) : (tensor<2x64xi8>, tensor<2x4xf16>) -> tensor<2x64xf32>
  return
}

// -----

func.func @quantize_fp8_values(%x: tensor<2x64xf16>, %s: tensor<2x1xf32>) {
  // expected-error @+1 {{'poot.quantize_fp8' op x must be f32 [..., D], got tensor<2x64xf16>}}
  %0 = "poot.quantize_fp8"(%x, %s) : (tensor<2x64xf16>, tensor<2x1xf32>) -> tensor<2x64xi8>
  return
}

// -----

func.func @dequantize_fp8_scales(%v: tensor<2x64xi8>, %s: tensor<2x2xf32>) {
  // expected-error @+1 {{'poot.dequantize_fp8' op scales must be tensor<2x1xf32>, got tensor<2x2xf32>}}
  %0 = "poot.dequantize_fp8"(%v, %s) : (tensor<2x64xi8>, tensor<2x2xf32>) -> tensor<2x64xf32>
  return
}
