// The full optimization pipeline on a traced Llama step (the tiny fixture's decode step, 2
// layers): every primitive op ends up inside a dispatch region, attention becomes one fused
// op per layer, RoPE one region per q/k per layer, and lowering leaves no poot op behind.
//
// RUN: poot-opt %S/Inputs/llama-decode-step.mlir -p 'builtin.module(poot-canonicalize,poot-cse,poot-dce,poot-rope-fusion,poot-flash-attention,poot-legalize,poot-fuse-dispatch,poot-verify)' > %t.mlir
// RUN: FileCheck %s < %t.mlir
// RUN: grep -c '"poot.attention"' %t.mlir | FileCheck %s --check-prefix=ATTN
// RUN: grep -c 'kind = "rope"' %t.mlir | FileCheck %s --check-prefix=ROPE
// RUN: grep -c ' call @' %t.mlir | FileCheck %s --check-prefix=CALLS
// RUN: poot-opt %t.mlir -p 'builtin.module(poot-lower-to-linalg)' | FileCheck %s --check-prefix=LINALG
//
// The step function holds only calls, weights and free views; the arithmetic is in regions.
// CHECK-LABEL: func.func @llama_decode(
// CHECK-NOT: "poot.unary"
// CHECK-NOT: "poot.binary"
// CHECK-NOT: "poot.matmul"
// CHECK-NOT: "poot.reduce"
// CHECK: return
// CHECK-DAG: func.func private @llama_decode_rope_0(
// CHECK-DAG: func.func private @llama_decode_dispatch_0(
// CHECK-DAG: poot.dispatch = {kind = "attention"
// CHECK-DAG: poot.dispatch = {kind = "matmul"
// CHECK-DAG: poot.dispatch = {kind = "reduction"
// CHECK-DAG: poot.dispatch = {kind = "scatter"
//
// ATTN: 2
// ROPE: 4
// 346 primitive ops in the input (one kernel each unfused); 34 dispatch regions after the
// pipeline (the one-slot KV gathers fold away: 2 per layer).
// CALLS: 34
//
// LINALG-NOT: "poot.
// LINALG: linalg.matmul
// LINALG: scf.for
