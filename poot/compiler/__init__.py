"""The compiler entry: ``compile(graph, target, options) -> Program`` or a typed refusal."""

from poot.compiler.compile import CompileError, CompileLimitExceeded, Program, compile
from poot.compiler.options import CompileLimits, CompileOptions
from poot.compiler.planning import Buffer, Refusal
from poot.compiler.target import Capabilities, Target, host_cpu

__all__ = ["CompileError", "CompileLimitExceeded", "Program", "compile", "CompileLimits",
           "CompileOptions", "Buffer", "Refusal", "Capabilities", "Target", "host_cpu"]
