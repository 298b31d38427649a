// poot-opt as a command: help, the IRDL it loads, pipeline errors and exit statuses.
// test/dialect/test_dialect_poot_opt.py checks the same against the live registries.

// RUN: poot-opt --help | FileCheck %s --check-prefix=HELP
// HELP: usage: poot-opt
// HELP-DAG: --pass-pipeline
// HELP-DAG: --split-input-file
// HELP-DAG: --verify-diagnostics
// HELP-DAG: --print-irdl
// HELP: poot passes:
// HELP: --poot-verify check poot ops against their type rules
// HELP: Upstream MLIR passes are named inside --pass-pipeline

// --print-irdl defines the dialect, every quant format attribute, the packed type and every op.
// RUN: poot-opt --print-irdl | FileCheck %s --check-prefix=IRDL
// IRDL: irdl.dialect @poot {
// IRDL-DAG: irdl.attribute @q4_0 { irdl.parameters() }
// IRDL-DAG: irdl.attribute @q4_1 { irdl.parameters() }
// IRDL-DAG: irdl.attribute @q5_0 { irdl.parameters() }
// IRDL-DAG: irdl.attribute @q5_1 { irdl.parameters() }
// IRDL-DAG: irdl.attribute @q8_0 { irdl.parameters() }
// IRDL-DAG: irdl.attribute @q4_k { irdl.parameters() }
// IRDL-DAG: irdl.attribute @q5_k { irdl.parameters() }
// IRDL-DAG: irdl.attribute @q6_k { irdl.parameters() }
// IRDL-DAG: irdl.type @packed {
// IRDL-DAG: irdl.operation @matmul {
// IRDL-DAG: irdl.operation @unary {
// IRDL-DAG: irdl.operation @binary {
// IRDL-DAG: irdl.operation @ternary {
// IRDL-DAG: irdl.operation @compare {
// IRDL-DAG: irdl.operation @select {
// IRDL-DAG: irdl.operation @cast {
// IRDL-DAG: irdl.operation @gather {
// IRDL-DAG: irdl.operation @scatter {
// IRDL-DAG: irdl.operation @dequantize {
// IRDL-DAG: irdl.operation @reduce {
// IRDL-DAG: irdl.operation @param {
// IRDL-DAG: irdl.operation @packed_param {
// IRDL-DAG: irdl.operation @constant {
// IRDL-DAG: irdl.operation @iota {
// IRDL-DAG: irdl.operation @broadcast {
// IRDL-DAG: irdl.operation @reshape {
// IRDL-DAG: irdl.operation @transpose {
// IRDL-DAG: irdl.operation @slice {
// IRDL-DAG: irdl.operation @concat {
// The IRDL it prints is itself valid IRDL for upstream mlir-opt.
// RUN: poot-opt --print-irdl | mlir-opt | FileCheck %s --check-prefix=UPSTREAM
// UPSTREAM: irdl.dialect @poot
// UPSTREAM: irdl.operation @matmul

// Unknown poot- pass names are a clean one-line error (exit 2), not a traceback.
// RUN: not poot-opt %s --pass-pipeline='builtin.module(poot-no-such-pass)' 2>&1 | FileCheck %s --check-prefix=UNKNOWN
// UNKNOWN: poot-opt: error: unknown poot pass 'poot-no-such-pass'; registered: {{.*}}poot-verify
// UNKNOWN-NOT: Traceback
// RUN: not poot-opt %s --poot-no-such-pass 2>&1 | FileCheck %s --check-prefix=UNKNOWN-FLAG
// UNKNOWN-FLAG: poot-opt: error: unrecognized arguments: --poot-no-such-pass
// RUN: not poot-opt %s --pass-pipeline='builtin.module(no-such-upstream-pass)' 2>&1 | FileCheck %s --check-prefix=UPSTREAM-UNKNOWN
// UPSTREAM-UNKNOWN: poot-opt: error: bad upstream pipeline 'no-such-upstream-pass'
// UPSTREAM-UNKNOWN-NOT: Traceback
// RUN: not poot-opt %s --pass-pipeline='builtin.module(poot-verify{bogus=1})' 2>&1 | FileCheck %s --check-prefix=BAD-OPTION
// BAD-OPTION: poot-opt: error: pass 'poot-verify' has no option 'bogus'
// RUN: not poot-opt %s --poot-verify --pass-pipeline='builtin.module(cse)' 2>&1 | FileCheck %s --check-prefix=BOTH
// BOTH: poot-opt: error: use either --pass-pipeline or pass flags
// RUN: not poot-opt %s.does-not-exist 2>&1 | FileCheck %s --check-prefix=NOFILE
// NOFILE: poot-opt: error: cannot read

// A pipeline mixing poot and upstream passes runs and prints the module; stdin works too.
// RUN: poot-opt %s --pass-pipeline='builtin.module(poot-verify,canonicalize,cse,poot-verify)' | FileCheck %s --check-prefix=MIXED
// RUN: poot-opt --poot-verify < %s | FileCheck %s --check-prefix=MIXED
// RUN: poot-opt %s -o %t && FileCheck %s --check-prefix=MIXED < %t
// MIXED-LABEL: func.func @cli(
// MIXED: "poot.binary"(%arg0, %arg0) {fn = "add"}
// MIXED: return

// Invalid input: the diagnostic names file, line, column and op; exit status 1.
// RUN: not poot-opt %S/Inputs/invalid-matmul.mlir 2>&1 | FileCheck %s --check-prefix=INVALID
// INVALID: invalid-matmul.mlir:4:8: error: 'poot.matmul' op operand dtypes differ: f16 and f32

func.func @cli(%a: tensor<4xf32>) -> tensor<4xf32> {
  %0 = "poot.binary"(%a, %a) {fn = "add"} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}
