"""Per-op semantics: each primitive built with the Builder and evaluated by the CPU oracle,
against an independent numpy (or ml_dtypes / gguf) expression."""

from __future__ import annotations

import math

import gguf
import ml_dtypes
import numpy as np
import pytest

from poot import oracle
from poot.dialects import DType, PackedType
from poot.dialects.quant import FORMATS
from poot.graph import Builder

from _graphs import ROOMY, run, tt

RNG = np.random.default_rng(1234)
BF16 = ml_dtypes.bfloat16


def f32(*shape, lo=-3.0, hi=3.0):
    return RNG.uniform(lo, hi, size=shape).astype(np.float32)


def assert_same(got, want, **tol):
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    if tol:
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), **tol)
    else:
        np.testing.assert_array_equal(got, want)


# ---- sources ------------------------------------------------------------------------------
def test_param_binds_weight_and_checks_its_type():
    w = f32(3, 4)
    got = run(lambda b: b.param("w", tt((3, 4))), {}, {"w": w})
    assert_same(got, w)
    with pytest.raises(oracle.EvalError, match="weight 'w'"):
        run(lambda b: b.param("w", tt((3, 4))), {}, {"w": w.astype(np.float16)})
    with pytest.raises(oracle.EvalError, match="weight 'w'.*not bound"):
        run(lambda b: b.param("w", tt((3, 4))), {}, {})


@pytest.mark.parametrize("value", [
    np.array([[1.5, -2.0], [0.25, 8.0]], np.float32),
    np.array(3.0, np.float32),
    np.full((2, 3), 7, np.int64),
    np.array([-128, 0, 127], np.int8),
    np.array([True, True]),
    np.array([0.5, 65504.0], np.float16),
    np.arange(6, dtype=np.int32).reshape(2, 3),
], ids=["f32", "rank0", "splat-i64", "i8", "i1", "f16", "i32"])
def test_constant(value):
    assert_same(run(lambda b: b.constant(value), {}), value)


def test_constant_bool_non_splat():
    # Regression: non-splat i1 constants once failed in dense_to_mlir (buffer wants bit-packed i1).
    value = np.array([True, False, True])
    assert_same(run(lambda b: b.constant(value), {}), value)


@pytest.mark.parametrize("dtype,np_dtype", [(DType.I32, np.int32), (DType.F32, np.float32),
                                            (DType.I64, np.int64), (DType.BF16, BF16)])
def test_iota(dtype, np_dtype):
    got = run(lambda b: b.iota((3, 5), axis=1, dtype=dtype), {})
    assert_same(got, np.tile(np.arange(5), (3, 1)).astype(np_dtype))
    got = run(lambda b: b.iota((3, 5), axis=0, dtype=dtype), {})
    assert_same(got, np.repeat(np.arange(3)[:, None], 5, axis=1).astype(np_dtype))


# ---- elementwise --------------------------------------------------------------------------
_erf = np.vectorize(math.erf)
UNARY = {
    "neg": (lambda x: -x, f32(3, 4)),
    "abs": (np.abs, f32(3, 4)),
    "exp": (np.exp, f32(3, 4)),
    "log": (np.log, f32(3, 4, lo=0.01, hi=10)),
    "sqrt": (np.sqrt, f32(3, 4, lo=0, hi=10)),
    "rsqrt": (lambda x: 1 / np.sqrt(x), f32(3, 4, lo=0.01, hi=10)),
    "tanh": (np.tanh, f32(3, 4)),
    "erf": (lambda x: _erf(x.astype(np.float64)), f32(3, 4)),
    "sin": (np.sin, f32(3, 4)),
    "cos": (np.cos, f32(3, 4)),
    "floor": (np.floor, f32(3, 4)),
    "not": (np.logical_not, RNG.integers(0, 2, (3, 4)).astype(bool)),
}


@pytest.mark.parametrize("fn", sorted(UNARY))
def test_unary(fn):
    ref, x = UNARY[fn]
    got = run(lambda b, x: b.unary(fn, x), {"x": x})
    assert_same(got, ref(x).astype(x.dtype), rtol=2e-6, atol=1e-7) if x.dtype != bool else \
        assert_same(got, ref(x))


@pytest.mark.parametrize("fn,np_fn", [("neg", np.negative), ("abs", np.abs)])
def test_unary_int(fn, np_fn):
    x = np.array([-5, 0, 7, -1], np.int32)
    assert_same(run(lambda b, x: b.unary(fn, x), {"x": x}), np_fn(x))


@pytest.mark.parametrize("dtype", [np.float16, BF16])
def test_unary_half_computes_in_f32_and_rounds_once(dtype):
    x = f32(16).astype(dtype)
    got = run(lambda b, x: b.unary("exp", x), {"x": x})
    assert_same(got, np.exp(x.astype(np.float32)).astype(dtype))


BINARY = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
    "max": np.maximum, "min": np.minimum,
}


@pytest.mark.parametrize("fn", sorted(BINARY))
def test_binary_f32(fn):
    a, c = f32(2, 5), f32(2, 5, lo=0.5, hi=3)
    got = run(lambda b, a, c: b.binary(fn, a, c), {"a": a, "c": c})
    assert_same(got, BINARY[fn](a, c).astype(np.float32))


def test_binary_pow():
    a, c = f32(8, lo=0.1, hi=4), f32(8)
    got = run(lambda b, a, c: b.binary("pow", a, c), {"a": a, "c": c})
    assert_same(got, np.power(a, c), rtol=2e-6)


@pytest.mark.parametrize("fn,np_fn", [("and", np.logical_and), ("or", np.logical_or)])
def test_binary_bool(fn, np_fn):
    a = np.array([True, True, False, False])
    c = np.array([True, False, True, False])
    assert_same(run(lambda b, a, c: b.binary(fn, a, c), {"a": a, "c": c}), np_fn(a, c))


@pytest.mark.parametrize("fn", ["add", "sub", "mul", "max", "min"])
def test_binary_int(fn):
    a = np.array([-7, 7, 100, -3], np.int64)
    c = np.array([2, -2, 3, -3], np.int64)
    assert_same(run(lambda b, a, c: b.binary(fn, a, c), {"a": a, "c": c}), BINARY[fn](a, c))


def _c_div(a, c):
    """C integer division (truncation toward zero), in Python's arbitrary precision."""
    return np.array([int(x / y) if abs(x) < 2**52 else
                     (abs(int(x)) // abs(int(y))) * (1 if (x < 0) == (y < 0) else -1)
                     for x, y in zip(a.tolist(), c.tolist())], dtype=a.dtype)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.int8])
def test_int_division_truncates_toward_zero(dtype):
    a = np.array([-7, 7, -7, 7, 0, -8, 9, -1], dtype)
    c = np.array([2, -2, -2, 2, 3, 3, -4, 5], dtype)
    got = run(lambda b, a, c: a / c, {"a": a, "c": c})
    assert_same(got, _c_div(a, c))
    assert got.tolist() == [-3, -3, 3, 3, 0, -2, -2, 0]


@pytest.mark.parametrize("dtype", [np.int8, np.int32])
def test_int_division_of_int_min(dtype):
    lo = np.iinfo(dtype).min
    a = np.array([lo, lo, lo], dtype)
    c = np.array([2, -2, 3], dtype)
    got = run(lambda b, a, c: a / c, {"a": a, "c": c})
    assert_same(got, _c_div(a, c))


@pytest.mark.parametrize("fn", ["fma", "clamp"])
def test_ternary(fn):
    x, lo, hi = f32(3, 4), f32(3, 4, lo=-1, hi=0), f32(3, 4, lo=0, hi=1)
    want = x * lo + hi if fn == "fma" else np.minimum(np.maximum(x, lo), hi)
    got = run(lambda b, x, lo, hi: b.ternary(fn, x, lo, hi), {"x": x, "lo": lo, "hi": hi})
    assert_same(got, want.astype(np.float32), rtol=1e-6)


def test_ternary_clamp_int():
    x = np.array([-9, -1, 0, 4, 9], np.int32)
    lo, hi = np.full(5, -2, np.int32), np.full(5, 5, np.int32)
    got = run(lambda b, x, lo, hi: b.ternary("clamp", x, lo, hi), {"x": x, "lo": lo, "hi": hi})
    assert_same(got, np.clip(x, -2, 5).astype(np.int32))


@pytest.mark.parametrize("pred,np_fn", [("eq", np.equal), ("ne", np.not_equal),
                                        ("lt", np.less), ("le", np.less_equal),
                                        ("gt", np.greater), ("ge", np.greater_equal)])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, BF16])
def test_compare(pred, np_fn, dtype):
    a = np.array([1, 2, 3, -1, 0, 5], np.float32).astype(dtype)
    c = np.array([1, 3, 2, -1, 1, -5], np.float32).astype(dtype)
    got = run(lambda b, a, c: b.compare(pred, a, c), {"a": a, "c": c})
    assert_same(got, np_fn(a.astype(np.float64), c.astype(np.float64)))


def test_select_with_broadcast_scalar_branch():
    cnd = np.array([[True, False, True], [False, False, True]])
    a = f32(2, 3)
    got = run(lambda b, cnd, a: b.select(cnd, a, b.scalar(-1.0)), {"cnd": cnd, "a": a})
    assert_same(got, np.where(cnd, a, np.float32(-1)))


# ---- cast ---------------------------------------------------------------------------------
def _bf16_rne_bits(x: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even f32 -> bf16 by bit arithmetic (finite inputs)."""
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    bias = 0x7FFF + ((bits >> 16) & 1)
    return ((bits + bias) >> 16).astype(np.uint16)


CAST_EDGES = np.array([
    1.0, 1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-11, 1 + 3 * 2**-11, -(1 + 2**-8), 65504.0, 65520.0,
    3.4028235e38, -0.0, 1e-40, 6e-8, 2**-25, 3.14159265, -2.5e-5, 123456.789,
], np.float32)


def test_cast_f32_to_bf16_rounds_to_nearest_even():
    x = np.concatenate([CAST_EDGES, f32(64, lo=-1e4, hi=1e4)])
    got = run(lambda b, x: b.cast(x, DType.BF16), {"x": x})
    assert got.dtype == BF16
    np.testing.assert_array_equal(got.view(np.uint16), _bf16_rne_bits(x))
    np.testing.assert_array_equal(got.view(np.uint16), x.astype(BF16).view(np.uint16))
    # The ties above round to even: 1 + 2^-8 -> 1.0, 1 + 3*2^-8 -> 1 + 2^-6.
    assert float(got[1]) == 1.0 and float(got[2]) == 1 + 2**-6


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
def test_cast_f32_to_f16_matches_numpy():
    x = np.concatenate([CAST_EDGES, f32(64, lo=-7e4, hi=7e4)])
    got = run(lambda b, x: b.cast(x, DType.F16), {"x": x})
    want = x.astype(np.float16)
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
    assert float(got[3]) == 1.0 and float(got[4]) == 1 + 2**-9       # ties to even
    assert np.isinf(got[7]) and got[6] == 65504                        # overflow to inf


def test_cast_bf16_f16_to_f32_is_exact():
    x = f32(32).astype(BF16)
    assert_same(run(lambda b, x: b.cast(x, DType.F32), {"x": x}), x.astype(np.float32))
    h = f32(32).astype(np.float16)
    assert_same(run(lambda b, h: b.cast(h, DType.F32), {"h": h}), h.astype(np.float32))


@pytest.mark.parametrize("dtype,np_dtype", [(DType.I32, np.int32), (DType.I64, np.int64),
                                            (DType.I8, np.int8)])
def test_cast_float_to_int_truncates(dtype, np_dtype):
    x = np.array([2.7, -2.7, 0.5, -0.5, 99.99, -100.0], np.float32)
    got = run(lambda b, x: b.cast(x, dtype), {"x": x})
    assert_same(got, np.array([2, -2, 0, 0, 99, -100], np_dtype))


def test_cast_to_and_from_bool():
    x = np.array([0.0, -0.0, 1.5, -3.0, np.nan], np.float32)
    assert_same(run(lambda b, x: b.cast(x, DType.I1), {"x": x}),
                np.array([False, False, True, True, True]))
    i = np.array([0, 3, -1], np.int32)
    assert_same(run(lambda b, i: b.cast(i, DType.I1), {"i": i}), np.array([False, True, True]))
    t = np.array([True, False])
    assert_same(run(lambda b, t: b.cast(t, DType.F32), {"t": t}), np.array([1, 0], np.float32))
    assert_same(run(lambda b, t: b.cast(t, DType.I64), {"t": t}), np.array([1, 0], np.int64))


def test_cast_int_to_float():
    i = np.array([0, 1, -7, 2**24 + 1], np.int64)
    assert_same(run(lambda b, i: b.cast(i, DType.F32), {"i": i}),
                np.array([0, 1, -7, 2**24], np.float32))


# ---- reduce -------------------------------------------------------------------------------
@pytest.mark.parametrize("fn,np_fn", [("sum", np.sum), ("max", np.max), ("min", np.min)])
@pytest.mark.parametrize("axes", [(0,), (1,), (2,), (0, 2), (1, 2), (0, 1, 2)])
def test_reduce_over_axes(fn, np_fn, axes):
    x = f32(3, 4, 5)
    got = run(lambda b, x: b.reduce(fn, x, axes), {"x": x})
    want = np_fn(x.astype(np.float64), axis=axes).astype(np.float32)
    assert_same(got, want, rtol=1e-6, atol=1e-6)


def test_reduce_keepdims_and_negative_axes():
    x = f32(2, 3, 4)
    got = run(lambda b, x: b.reduce("sum", x, [-1, 0], keepdims=True), {"x": x})
    assert_same(got, x.sum(axis=(0, 2), keepdims=True), rtol=1e-6)


def test_reduce_int_and_bool():
    x = RNG.integers(-50, 50, (4, 6)).astype(np.int32)
    assert_same(run(lambda b, x: b.reduce("sum", x, 1), {"x": x}), x.sum(axis=1).astype(np.int32))
    t = RNG.integers(0, 2, (4, 6)).astype(bool)
    assert_same(run(lambda b, t: b.reduce("max", t, 1), {"t": t}), t.any(axis=1))
    assert_same(run(lambda b, t: b.reduce("min", t, 1), {"t": t}), t.all(axis=1))


def test_reduce_bf16_sum_accumulates_wide():
    # 4096 ones + tiny values: a bf16 accumulator would stall at 256.
    x = np.ones(4096, np.float32).astype(BF16)
    got = run(lambda b, x: b.reduce("sum", x, 0), {"x": x})
    assert got.dtype == BF16 and float(got) == 4096.0


# ---- views --------------------------------------------------------------------------------
def test_broadcast_in_dim():
    x = f32(3)
    got = run(lambda b, x: b.broadcast_to(x, (2, 3, 4), dims=(1,)), {"x": x})
    assert_same(got, np.broadcast_to(x[None, :, None], (2, 3, 4)))
    y = f32(1, 4)
    got = run(lambda b, y: b.broadcast_to(y, (5, 6, 4), dims=(0, 2)), {"y": y})
    assert_same(got, np.broadcast_to(y[:, None, :], (5, 6, 4)))
    s = np.array(2.5, np.float32)
    got = run(lambda b, s: b.broadcast_to(s, (2, 2)), {"s": s})
    assert_same(got, np.full((2, 2), 2.5, np.float32))


def test_broadcast_numpy_alignment_through_binary():
    a, c = f32(4, 1, 3), f32(5, 1)
    assert_same(run(lambda b, a, c: a + c, {"a": a, "c": c}), a + c)


def test_reshape_and_transpose():
    x = f32(2, 3, 4)
    assert_same(run(lambda b, x: b.reshape(x, (4, -1)), {"x": x}), x.reshape(4, 6))
    for perm in [(2, 0, 1), (1, 0, 2), (0, 2, 1)]:
        assert_same(run(lambda b, x: b.transpose(x, perm), {"x": x}), np.transpose(x, perm))


def test_slice_strides():
    x = f32(9, 7)
    got = run(lambda b, x: b.slice(x, (1, 0), (8, 7), (3, 2)), {"x": x})
    assert_same(got, x[1:8:3, 0:7:2])
    got = run(lambda b, x: b.slice_axis(x, -1, 2, 6, 2), {"x": x})
    assert_same(got, x[:, 2:6:2])
    got = run(lambda b, x: b.slice(x, (0, 3), (9, 4)), {"x": x})
    assert_same(got, x[:, 3:4])


def test_concat():
    a, c, d = f32(2, 3), f32(2, 1), f32(2, 4)
    got = run(lambda b, a, c, d: b.concat([a, c, d], axis=1), {"a": a, "c": c, "d": d})
    assert_same(got, np.concatenate([a, c, d], axis=1))
    got = run(lambda b, a: b.concat([a, a], axis=-2), {"a": a})
    assert_same(got, np.concatenate([a, a], axis=0))


# ---- contraction, indexing ------------------------------------------------------------------
def test_matmul_f32_batched():
    a, c = f32(3, 4, 8), f32(3, 8, 5)
    got = run(lambda b, a, c: b.matmul(a, c), {"a": a, "c": c})
    want = np.einsum("bmk,bkn->bmn", a.astype(np.float64), c.astype(np.float64))
    assert_same(got, want.astype(np.float32), rtol=1e-5, atol=1e-5)


def test_matmul_bf16_accumulates_in_f32():
    a, c = f32(4, 64).astype(BF16), f32(64, 3).astype(BF16)
    got = run(lambda b, a, c: b.matmul(a, c), {"a": a, "c": c})
    want = a.astype(np.float64) @ c.astype(np.float64)
    assert_same(got, want.astype(np.float32), rtol=1e-5, atol=1e-5)
    got = run(lambda b, a, c: b.matmul(a, c, out_dtype=DType.BF16), {"a": a, "c": c})
    assert got.dtype == BF16
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=1e-2, atol=1e-2)


def test_matmul_i8_to_i32_exact():
    a = RNG.integers(-128, 128, (5, 300)).astype(np.int8)
    c = RNG.integers(-128, 128, (300, 4)).astype(np.int8)
    got = run(lambda b, a, c: b.matmul(a, c), {"a": a, "c": c})
    assert_same(got, (a.astype(np.int64) @ c.astype(np.int64)).astype(np.int32))


def test_gather_clamps_indices():
    t = f32(6, 4)
    idx = np.array([[0, 5, -3], [100, 2, 6]], np.int32)
    got = run(lambda b, t, idx: b.gather(t, idx, axis=0), {"t": t, "idx": idx})
    want = np.stack([np.stack([t[min(max(i, 0), 5)] for i in row]) for row in idx.tolist()])
    assert_same(got, want)
    j = np.array([3, -1, 9], np.int64)
    got = run(lambda b, t, j: b.gather(t, j, axis=1), {"t": t, "j": j})
    assert_same(got, t[:, [3, 0, 3]])


def test_scatter_drops_out_of_range_rows_and_later_wins():
    dest = f32(4, 3, 2)
    idx = np.array([[1, 2], [0, 0], [4, 0], [1, 2], [-1, 1], [3, 3], [2, 1]], np.int64)
    upd = f32(7, 2)
    got = run(lambda b, d, i, u: b.scatter(d, i, u), {"d": dest, "i": idx, "u": upd})
    want = dest.copy()
    last = {}
    for n, (p, q) in enumerate(idx.tolist()):
        if 0 <= p < 4 and 0 <= q < 3:
            last[(p, q)] = n            # later rows overwrite earlier ones
    for (p, q), n in last.items():
        want[p, q] = upd[n]
    assert last[(1, 2)] == 3
    assert_same(got, want)
    assert not np.shares_memory(got, dest)


def test_scatter_whole_rows():
    dest = np.zeros((5, 3), np.float16)
    idx = np.array([[4], [0], [7]], np.int32)
    upd = np.arange(9, dtype=np.float16).reshape(3, 3)
    got = run(lambda b, d, i, u: b.scatter(d, i, u), {"d": dest, "i": idx, "u": upd})
    want = dest.copy()
    want[4], want[0] = upd[0], upd[1]
    assert_same(got, want)


# ---- packed weights ------------------------------------------------------------------------
_SCALES = {  # byte offsets of the f16 scale fields inside one block
    "q4_0": [0], "q4_1": [0, 2], "q5_0": [0], "q5_1": [0, 2], "q8_0": [0],
    "q4_k": [0, 2], "q5_k": [0, 2], "q6_k": [208],
}


def _random_blocks(fmt, rows, cols):
    nblocks = rows * cols // fmt.block_elems
    raw = RNG.integers(0, 256, (nblocks, fmt.block_bytes), dtype=np.uint8)
    for off in _SCALES[fmt.name]:
        raw[:, off:off + 2] = (RNG.uniform(-0.1, 0.1, (nblocks, 1)).astype("<f2")
                               .view(np.uint8).reshape(nblocks, 2))
    return raw.reshape(-1)


@pytest.mark.parametrize("fmt", FORMATS, ids=[f.name for f in FORMATS])
def test_dequantize_matches_gguf(fmt):
    rows, cols = 3, 2 * fmt.block_elems
    raw = _random_blocks(fmt, rows, cols)
    ptype = PackedType(fmt, (rows, cols))
    got = run(lambda b: b.dequantize(b.param("w", ptype)), {}, {"w": raw})
    qtype = gguf.GGMLQuantizationType(fmt.ggml_type)
    assert qtype.name.lower() == fmt.name
    want = gguf.quants.dequantize(raw.reshape(rows, -1), qtype)
    assert_same(got, want.astype(np.float32))
    assert np.isfinite(got).all() and np.abs(got).max() > 0


def test_dequantize_to_f16_and_into_matmul():
    fmt = next(f for f in FORMATS if f.name == "q8_0")
    raw = _random_blocks(fmt, 4, 64)
    ptype = PackedType(fmt, (4, 64))
    want = gguf.quants.dequantize(raw.reshape(4, -1), gguf.GGMLQuantizationType.Q8_0)
    got = run(lambda b: b.dequantize(b.param("w", ptype), DType.F16), {}, {"w": raw})
    assert_same(got, want.astype(np.float16))
    x = f32(2, 64)
    got = run(lambda b, x: b.matmul(x, b.transpose(b.dequantize(b.param("w", ptype)), (1, 0))),
              {"x": x}, {"w": raw})
    assert_same(got, (x.astype(np.float64) @ want.T.astype(np.float64)).astype(np.float32),
                rtol=1e-5, atol=1e-5)


def test_packed_binding_is_checked():
    fmt = FORMATS[0]
    ptype = PackedType(fmt, (2, 32))
    with pytest.raises(oracle.EvalError, match="needs 36 uint8 bytes"):
        run(lambda b: b.dequantize(b.param("w", ptype)), {}, {"w": np.zeros(35, np.uint8)})


def test_input_binding_is_checked():
    b = Builder(ROOMY)
    x = b.input("x", tt((2, 2)))
    g = b.finish({"y": b.unary("neg", x)})
    with pytest.raises(oracle.EvalError, match="input 'x'"):
        oracle.evaluate(g, {"x": np.zeros((2, 2), np.float64)})
    with pytest.raises(oracle.EvalError, match="not bound"):
        oracle.evaluate(g, {})
