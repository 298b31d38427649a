"""The CPU backend, one folder: code generation through MLIR and LLVM (:mod:`.codegen`), the
row-streaming matmul kernels its lowering strategy supplies (:mod:`.gemv`; the pass
``poot-lower-to-cpu-kernels`` runs that lowering alone for ``poot-opt``,
:mod:`.lower_to_cpu_kernels`), the compile cache's entries of its linked machine code
(:mod:`.link`), and the host runtime that loads and runs the compiled shared object
(:mod:`.runtime`)."""
