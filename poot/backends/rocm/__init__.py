"""The ROCm backend: gpu-dialect kernels (:mod:`poot.backends.gpu`) lowered through ROCDL to
AMDGCN code objects (:mod:`poot.backends.rocm.codegen`, needs MLIR, llvmlite and ``ld.lld``),
and a runtime on the HSA runtime's C API (:mod:`poot.backends.rocm.runtime`, imports no MLIR)
that records a step as AQL packets (:mod:`poot.backends.rocm.aql`) and reads the serialized
artifact (:mod:`poot.backends.rocm.artifact`)."""
