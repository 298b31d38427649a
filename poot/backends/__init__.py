"""Backends: compiled programs for a target. ``cpu`` (the embedded default) compiles through
MLIR's linalg -> LLVM path and runs on the host with MLIR's ExecutionEngine."""

from poot.backends.cpu import CpuProgram, compile_cpu

__all__ = ["CpuProgram", "compile_cpu"]
