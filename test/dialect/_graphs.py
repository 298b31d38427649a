"""Helpers shared by the dialect tests: a roomy builder and one-shot graph evaluation."""

from __future__ import annotations

from typing import Callable

import numpy as np

from poot import oracle
from poot.dialects import DType, TensorType
from poot.graph import Builder, TraceLimits

ROOMY = TraceLimits(max_values=10_000, max_ops=10_000, max_literal_bytes=1 << 22,
                    max_owned_bytes=1 << 28)


def tt(shape, dtype=DType.F32) -> TensorType:
    return TensorType(tuple(shape), dtype)


def run(build: Callable, inputs: dict[str, np.ndarray], params: dict | None = None,
        types: dict[str, TensorType] | None = None):
    """Build a graph whose inputs are ``inputs`` (types from the arrays unless given in
    ``types``), with ``build(b, **handles)`` returning the output handle (or a dict of them);
    evaluate it with the oracle and return the output(s)."""
    b = Builder(ROOMY)
    handles = {}
    for name, arr in inputs.items():
        t = (types or {}).get(name) or TensorType(arr.shape, DType.from_numpy(arr.dtype))
        handles[name] = b.input(name, t)
    out = build(b, **handles)
    g = b.finish(out if isinstance(out, dict) else {"out": out})
    res = oracle.evaluate(g, inputs, params)
    return res if isinstance(out, dict) else res["out"]
