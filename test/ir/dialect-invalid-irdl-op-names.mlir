// Structural violations found by MLIR's IRDL verifier must name the op like every other poot
// diagnostic ('poot.<name>' op ...); poot-opt takes the name from MLIR's
// `see current operation` note (poot/opt.py _name_op).
//
// Operand/result COUNT errors: upstream's message itself starts with "op " ("op expects exactly
// 1 operands, but got 2"); _name_op drops that word before naming the op.
// RUN: poot-opt %s --split-input-file --verify-diagnostics

func.func @concat_packed_operand(%a: tensor<4x32xf32>, %p: !poot.packed<#poot.q4_0, array<i64: 4, 32>>) {
  // expected-error @+1 {{'poot.concat' op expected base type 'builtin.tensor' but got 'poot.packed'}}
  %0 = "poot.concat"(%a, %p) {axis = 0 : i64} : (tensor<4x32xf32>, !poot.packed<#poot.q4_0, array<i64: 4, 32>>) -> tensor<8x32xf32>
  return
}

// -----

func.func @concat_operand_count(%a: tensor<2x3xf32>) {
  // expected-error @+1 {{'poot.concat' op expects exactly 2 operands, but got 3}}
  %0 = "poot.concat"(%a, %a, %a) {axis = 1 : i64} : (tensor<2x3xf32>, tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x9xf32>
  return
}

// -----

func.func @matmul_acc_not_type(%a: tensor<4x8xf32>, %b: tensor<8x2xf32>) {
  // expected-error @+1 {{'poot.matmul' op expected base attribute 'builtin.type' but got 'builtin.string'}}
  %0 = "poot.matmul"(%a, %b) {acc = "f32"} : (tensor<4x8xf32>, tensor<8x2xf32>) -> tensor<4x2xf32>
  return
}

// -----

func.func @matmul_packed_operand(%a: tensor<4x32xf32>, %p: !poot.packed<#poot.q4_0, array<i64: 32, 32>>) {
  // expected-error @+1 {{'poot.matmul' op expected base type 'builtin.tensor' but got 'poot.packed'}}
  %0 = "poot.matmul"(%a, %p) {acc = f32} : (tensor<4x32xf32>, !poot.packed<#poot.q4_0, array<i64: 32, 32>>) -> tensor<4x32xf32>
  return
}

// -----

func.func @dequantize_tensor_operand(%x: tensor<2x32xf32>) {
  // expected-error @+1 {{'poot.dequantize' op expected base type 'poot.packed' but got 'builtin.tensor'}}
  %0 = "poot.dequantize"(%x) : (tensor<2x32xf32>) -> tensor<2x32xf32>
  return
}

// -----

func.func @dequantize_packed_result(%p: !poot.packed<#poot.q8_0, array<i64: 2, 32>>) {
  // expected-error @+1 {{'poot.dequantize' op expected base type 'builtin.tensor' but got 'poot.packed'}}
  %0 = "poot.dequantize"(%p) : (!poot.packed<#poot.q8_0, array<i64: 2, 32>>) -> !poot.packed<#poot.q8_0, array<i64: 2, 32>>
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
  // expected-error @+1 {{'poot.unary' op expected base attribute 'builtin.string' but got 'builtin.integer'}}
  %0 = "poot.unary"(%x) {fn = 3 : i64} : (tensor<4xf32>) -> tensor<4xf32>
  return
}

// -----

func.func @gather_axis_kind(%t: tensor<10x4xf32>, %i: tensor<3xi32>) {
  // expected-error @+1 {{'poot.gather' op expected base attribute 'builtin.integer' but got 'builtin.dense_array'}}
  %0 = "poot.gather"(%t, %i) {axis = array<i64: 0>} : (tensor<10x4xf32>, tensor<3xi32>) -> tensor<3x4xf32>
  return
}
