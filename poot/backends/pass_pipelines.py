"""MLIR pass-pipeline pieces the CPU and GPU backends share (``PassManager.parse`` syntax).

Both lower poot to linalg on tensors, fuse elementwise work, then bufferize over function
boundaries with results as caller-allocated out-parameters; they differ afterwards in how
buffers are managed (the CPU frees them, GPU kernels hoist them), so each backend appends its
own stages to :data:`BUFFERIZE_TO_OUT_PARAMS`.
"""

# On tensors: named ops become generics so that elementwise producers (broadcasts, casts,
# dequantization, transposes) fuse into their consumers, matmuls included: a dequantize ->
# transpose -> matmul chain becomes one contraction reading the packed bytes in place.
FUSE = (
    "linalg-generalize-named-ops,"
    "linalg-fuse-elementwise-ops,"
    "canonicalize,"
    "cse"
)

# One-shot bufferization over function boundaries with identity layouts; results become
# caller-allocated out-parameters, filled by one copy each. (Its hoist-static-allocs option
# would write results in place, but it crashes when two results share an allocation, e.g. an
# output and a reshape of it.)
ONE_SHOT_BUFFERIZE = (
    "eliminate-empty-tensors,"
    "empty-tensor-to-alloc-tensor,"
    "one-shot-bufferize{bufferize-function-boundaries "
    "function-boundary-type-conversion=identity-layout-map}"
)
RESULTS_TO_OUT_PARAMS = (
    "buffer-results-to-out-params{modify-public-functions=true},"
    "canonicalize"
)
BUFFERIZE_TO_OUT_PARAMS = ONE_SHOT_BUFFERIZE + "," + RESULTS_TO_OUT_PARAMS
# A private function's result that bufferized to one of its arguments (a dispatch that
# updated its argument in place: a KV pool written by a scatter) is dropped and its callers
# use the argument's buffer, so no out-parameter (and no copy of the whole pool) is made for
# it (canonicalize first: a loop-carried buffer yielded unchanged is the argument itself).
# The public entry keeps its results here: the CPU backend drops the in-place ones itself,
# after checking they are the argument buffers, before the out-parameters are made.
BUFFERIZE_KEEP_IN_PLACE = (ONE_SHOT_BUFFERIZE + ",canonicalize,"
                           "drop-equivalent-buffer-results")
