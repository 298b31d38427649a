"""Backends: code generation and runtimes per target.

``cpu`` (the embedded default) compiles through MLIR's linalg -> LLVM path and runs with MLIR's
ExecutionEngine; ``cuda`` emits PTX through the gpu dialect and runs on ``cuda.bindings``.
Nothing is imported eagerly: a GPU machine runs a device runtime without MLIR installed.
"""


def __getattr__(name):
    if name in ("CpuProgram", "compile_cpu"):
        from poot.backends import cpu

        return getattr(cpu, name)
    raise AttributeError(name)


__all__ = ["CpuProgram", "compile_cpu"]
