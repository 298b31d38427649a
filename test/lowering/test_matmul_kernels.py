"""The contraction rules take a target's matmul kernels from its lowering strategy
(``Strategy.kernels``, a :class:`~poot.dialects.lowering.rules.MatmulKernels`): the generic
lowering names no backend. A kernel set is asked first and what it emits is used; one that
declines leaves the portable ``linalg.matmul``; its declarations join the lowered module."""

from __future__ import annotations

import pytest

pytest.importorskip("mlir")

from poot.dialects.lowering import Strategy, lower_module  # noqa: E402
from poot.dialects.types import DType, TensorType  # noqa: E402
from poot.graph.builder import Builder, TraceLimits  # noqa: E402

LIMITS = TraceLimits(max_values=1000, max_ops=1000, max_literal_bytes=1 << 16,
                     max_owned_bytes=1 << 24)


def _graph():
    b = Builder(LIMITS)
    x = b.input("x", TensorType((1, 8), DType.F32))
    w = b.param("w", TensorType((4, 8), DType.F32))
    return b.finish({"y": b.matmul(x, b.transpose(w, (1, 0)))})


class Recorder:
    """Kernels that answer ``take``: a call of a declared function standing for the result."""

    def __init__(self, take: bool):
        self.take, self.asked = take, []

    def matmul(self, em, op):
        self.asked.append(op.name)
        if not self.take:
            return None
        return em.op(f"func.call @stub_matmul({op.args[0]}) : (tensor<1x8xf32>) -> "
                     f"tensor<1x4xf32>", "stub")

    def indexed_matmul(self, em, op, weight):
        return None

    def declarations(self, text: str) -> str:
        return ("func.func private @stub_matmul(tensor<1x8xf32>) -> tensor<1x4xf32>"
                if "@stub_matmul(" in text else "")


def _lowered(kernels) -> str:
    g = _graph()
    with g.context:
        module = g.module
        lower_module(module.operation, Strategy(kernels=kernels))
        return str(module)


def test_a_kernel_set_that_takes_the_matmul_replaces_linalg_matmul():
    rec = Recorder(take=True)
    text = _lowered(rec)
    assert rec.asked == ["matmul"]
    assert "call @stub_matmul" in text and "func.func private @stub_matmul" in text
    assert "linalg.matmul" not in text


def test_a_kernel_set_that_declines_leaves_the_portable_lowering():
    rec = Recorder(take=False)
    text = _lowered(rec)
    assert rec.asked == ["matmul"] and "linalg.matmul" in text and "stub_matmul" not in text


def test_no_kernels_is_the_portable_lowering():
    assert "linalg.matmul" in _lowered(None)
