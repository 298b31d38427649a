// Not a test: input of poot-opt-cli.mlir and test/dialect/test_dialect_poot_opt.py (exit status 1).
func.func @bad(%a: tensor<4x8xf16>, %b: tensor<8x2xf32>) -> tensor<4x2xf32> {
  // The error is on the next line, column 8.
  %0 = "poot.matmul"(%a, %b) {acc = f32} : (tensor<4x8xf16>, tensor<8x2xf32>) -> tensor<4x2xf32>
  return %0 : tensor<4x2xf32>
}
