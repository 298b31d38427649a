"""Wrapping a ``poot.*`` op in Python must not search the import path each time (MLIR's
bindings look for ``mlir.dialects.poot`` on every wrap and do not remember a miss; that
search was ~40% of a cold SmolLM2 compile)."""

from __future__ import annotations

import importlib._bootstrap as bootstrap

import numpy as np  # noqa: F401  (imported before the spy: nothing else to load)
from mlir import ir

from poot.dialects.types import DType, TensorType
from poot.graph import Builder, TraceLimits, ops


def test_wrapping_poot_ops_does_not_search_imports(monkeypatch):
    b = Builder(TraceLimits(max_values=1024, max_ops=1024, max_literal_bytes=4096,
                            max_owned_bytes=1 << 20))
    x = b.input("x", TensorType((1, 8), DType.F32))
    w = b.param("w", TensorType((8,), DType.F32))
    y = x
    for _ in range(20):
        y = ops.rmsnorm(b, y, w, eps=1e-6)
    g = b.finish({"y": y})
    searched: list[str] = []
    real = bootstrap._find_and_load

    def spy(name, *a):
        searched.append(name)
        return real(name, *a)

    monkeypatch.setattr(bootstrap, "_find_and_load", spy)
    names: list[str] = []

    def visit(op):
        names.append(op.opview.operation.name)      # op.opview: the op's Python class
        return ir.WalkResult.ADVANCE

    g.module.operation.walk(visit)
    assert sum(n.startswith("poot.") for n in names) > 50
    assert "mlir.dialects.poot" not in searched, searched.count("mlir.dialects.poot")
