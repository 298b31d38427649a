"""Index-only producers (:mod:`poot.backends.cpu.rematerialize`): the sampler's inverse-CDF
bisection reads its vocabulary iota in 16 passes; each pass gets its own copy, fused into it,
so no ``[B, V]`` i32 tensor is stored, and the drawn tokens still equal numpy's."""

from __future__ import annotations

import numpy as np
from mlir.passmanager import PassManager

from poot.backends.cpu import codegen as cpu
from poot.backends.cpu.rematerialize import rematerialize_index_generics
from poot.backends.pass_pipelines import FUSE
from poot.dialects.types import DType, TensorType
from poot.graph.builder import Builder, TraceLimits
from poot.graph.sampling import inverse_cdf

LIMITS = TraceLimits(max_values=100_000, max_ops=100_000, max_literal_bytes=1 << 20,
                     max_owned_bytes=1 << 30)
B, V = 4, 4096


def _graph():
    b = Builder(LIMITS)
    w = b.input("w", TensorType((B, V), DType.F32))
    u = b.input("u", TensorType((B,), DType.F32))
    return b.finish({"t": inverse_cdf(b, w, u)})


def _fused(remat: bool) -> tuple[int, str]:
    module, _ = cpu.lower_graph(_graph(), cpu.strategy_for())
    with module.context:
        made = rematerialize_index_generics(module) if remat else 0
        PassManager.parse(f"builtin.module({FUSE})").run(module.operation)
    return made, str(module)


def test_the_bisections_iota_is_recomputed_in_each_pass_not_stored():
    made, text = _fused(True)
    assert made == 12        # 12 bisection passes and the last-positive search: 13 uses
    _, before = _fused(False)
    assert f"tensor<{B}x{V}xi32>" in before   # without: the iota is a tensor of its own
    assert f"tensor<{B}x{V}xi32>" not in text


def test_inverse_cdf_draws_numpys_token():
    """The smallest i whose prefix sum exceeds u * total (weights exact in f32: small
    integers, so any summation order gives the same prefix sums)."""
    rng = np.random.default_rng(5)
    w = rng.integers(0, 4, (B, V)).astype(np.float32)
    w[1, :] = 0.0
    w[1, 777] = 2.0                           # one token of positive weight
    u = np.array([0.0, 0.5, 0.999, 0.3], np.float32)
    got = cpu.compile_cpu(_graph()).run({"w": w, "u": u})["t"]
    csum = np.cumsum(w, axis=1)
    want = [int(np.argmax(csum[r] > u[r] * csum[r, -1])) for r in range(B)]
    np.testing.assert_array_equal(got, want)
    assert got[1] == 777
