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
BUFFERIZE_TO_OUT_PARAMS = (
    "eliminate-empty-tensors,"
    "empty-tensor-to-alloc-tensor,"
    "one-shot-bufferize{bufferize-function-boundaries "
    "function-boundary-type-conversion=identity-layout-map},"
    "buffer-results-to-out-params{modify-public-functions=true},"
    "canonicalize"
)
