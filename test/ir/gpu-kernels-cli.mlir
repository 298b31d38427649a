// poot-opt --gpu-kernels as a command: it runs after the pass pipeline (so a plain step
// function, outlined by poot-fuse-dispatch, prints its kernels), and bad target options or a
// step it cannot plan are one-line errors, never a traceback.

// RUN: poot-opt --help | FileCheck %s --check-prefix=HELP
// HELP-DAG: --gpu-kernels
// HELP-DAG: --gpu-subgroup-size N
// HELP-DAG: --gpu-shared-bytes N
// HELP-DAG: --gpu-cores N
// HELP-DAG: --gpu-features A,B

// The pipeline outlines exp(x) + x into one elementwise region; the pointwise strategy
// makes it one kernel, one thread an element.
// RUN: poot-opt %s --poot-fuse-dispatch --gpu-kernels --gpu-subgroup-size=32 --gpu-cores=4 | FileCheck %s --check-prefix=FUSED
// FUSED: gpu.module @poot_kernels {
// FUSED-NEXT: gpu.func @[[K:k0_[0-9a-f]+]](%[[X:.+]]: memref<64xf32>, %[[Y:.+]]: memref<64xf32>) kernel attributes {known_block_size = array<i32: 64, 1, 1>}
// FUSED: %[[V:.+]] = memref.load %[[X]][%[[I:.+]]] : memref<64xf32>
// FUSED-NEXT: %[[E:.+]] = math.exp %[[V]] : f32
// FUSED-NEXT: %[[S:.+]] = arith.addf %[[E]], %[[V]] : f32
// FUSED-NEXT: memref.store %[[S]], %[[Y]][%[[I]]] : memref<64xf32>
// FUSED: // launch @[[K]] grid [1, 1, 1] block [64, 1, 1] strategy pointwise

// Ops left outside any dispatch region: the plan refuses (exit 1), one line.
// RUN: not poot-opt %s --gpu-kernels 2>&1 | FileCheck %s --check-prefix=UNFUSED
// UNFUSED: poot-opt: error: the step function holds 'poot.unary' outside any dispatch region
// UNFUSED-NOT: Traceback

// Bad target options: a usage error (exit 2) naming the option.
// RUN: not poot-opt %s --gpu-kernels --gpu-subgroup-size=24 2>&1 | FileCheck %s --check-prefix=BAD-SG
// BAD-SG: poot-opt: error: --gpu-subgroup-size must be a power of two, not 24
// RUN: not poot-opt %s --gpu-kernels --gpu-cores=0 2>&1 | FileCheck %s --check-prefix=BAD-CORES
// BAD-CORES: poot-opt: error: --gpu-cores must be at least 1, not 0
// RUN: not poot-opt %s --gpu-kernels --gpu-shared-bytes=-1 2>&1 | FileCheck %s --check-prefix=BAD-SHARED
// BAD-SHARED: poot-opt: error: --gpu-shared-bytes must not be negative, not -1

func.func @step(%a: tensor<64xf32>) -> tensor<64xf32> {
  %0 = "poot.unary"(%a) {fn = "exp"} : (tensor<64xf32>) -> tensor<64xf32>
  %1 = "poot.binary"(%0, %a) {fn = "add"} : (tensor<64xf32>, tensor<64xf32>) -> tensor<64xf32>
  return %1 : tensor<64xf32>
}
