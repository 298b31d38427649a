"""The CPU backend: code generation through MLIR and LLVM (:mod:`.codegen`) and the host
runtime that loads and runs the compiled shared object (:mod:`.runtime`)."""
