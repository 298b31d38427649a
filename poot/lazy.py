"""Modules imported on first use: MLIR is needed to trace and compile, not to run a cached
program, so modules that need it only inside functions bind it lazily.

    ir = lazy_module("mlir.ir")      # nothing imported yet
    ir.Context()                      # imports mlir.ir now (ImportError here when absent)
"""

from __future__ import annotations

import importlib
import types


class _LazyModule(types.ModuleType):
    def __getattr__(self, attr):
        mod = importlib.import_module(self.__name__)
        self.__dict__.update(mod.__dict__)
        return getattr(mod, attr)


def lazy_module(name: str) -> types.ModuleType:
    """A stand-in for module ``name`` that imports it on the first attribute access."""
    return _LazyModule(name)
