"""The CUDA backend: gpu-dialect kernels (:mod:`poot.backends.gpu`) lowered through NVVM to
PTX (:mod:`poot.backends.cuda.codegen`, needs MLIR) and a runtime on ``cuda.bindings``
(:mod:`poot.backends.cuda.runtime`, imports no MLIR) that reads the serialized artifact
(:mod:`poot.backends.cuda.artifact`)."""
