"""``poot-expand-exp`` on the CPU backend: the compiled f32 ``exp`` against numpy's f64 exp.

Measured bound: at most 2 ulp of the correctly rounded f32 result where it is normal, at
most 2 * 2^-149 absolute where it is subnormal, and the IEEE edges exact (``exp(-inf) = 0``
keeps masked logits at probability 0)."""

import numpy as np
import pytest

from poot.dialects.types import DType, TensorType
from poot.graph.builder import Builder, TraceLimits

pytest.importorskip("mlir")


@pytest.fixture(scope="module")
def exp_program():
    from poot.backends.cpu.codegen import compile_cpu

    b = Builder(TraceLimits(max_values=100, max_ops=100, max_literal_bytes=1 << 20,
                            max_owned_bytes=1 << 30))
    x = b.input("x", TensorType((1 << 16,), DType.F32))
    return compile_cpu(b.finish({"y": b.unary("exp", x)}))


def _run(prog, xs: np.ndarray) -> np.ndarray:
    pad = np.zeros(1 << 16, np.float32)
    pad[:xs.size] = xs
    return prog.run({"x": pad}, {})["y"][:xs.size]


def test_no_libm_call_is_left(exp_program):
    assert "math.exp" not in exp_program.lowered
    assert "math.roundeven" in exp_program.lowered


def test_within_two_ulp_over_the_finite_range(exp_program):
    rng = np.random.default_rng(0)
    xs = np.concatenate([rng.uniform(-104, 89, 40000), rng.uniform(-2, 2, 20000),
                         np.linspace(-0.5, 0.5, 5000)]).astype(np.float32)
    got = _run(exp_program, xs).astype(np.float64)
    with np.errstate(over="ignore"):
        ref64 = np.exp(xs.astype(np.float64))
        ref = ref64.astype(np.float32)
    normal = np.isfinite(ref) & (ref >= np.finfo(np.float32).tiny)
    ulp = np.abs(got[normal] - ref64[normal]) / np.spacing(ref[normal]).astype(np.float64)
    assert ulp.max() <= 2.0, f"max {ulp.max():.2f} ulp at x = {xs[normal][ulp.argmax()]}"
    sub = np.isfinite(ref) & ~normal
    assert sub.any()
    assert np.abs(got[sub] - ref64[sub]).max() <= 2 * 2.0 ** -149
    assert np.isinf(got[np.isinf(ref)]).all()


def test_ieee_edges(exp_program):
    xs = np.array([-np.inf, np.inf, np.nan, 0.0, -0.0, 89.0, -104.0, -200.0, 1000.0],
                  np.float32)
    got = _run(exp_program, xs)
    assert got[0] == 0.0 and not np.signbit(got[0])
    assert got[1] == np.inf and np.isnan(got[2])
    assert got[3] == 1.0 and got[4] == 1.0
    assert got[5] == np.inf and got[8] == np.inf
    assert got[6] == 0.0 and got[7] == 0.0
