"""The CPU backend (poot -> linalg -> LLVM, ExecutionEngine) against the numpy oracle.

Every primitive op is compiled and run for several dtypes and shapes and compared with
:func:`poot.oracle.evaluate`. Cases are batched: one graph holds many outputs, so each test
compiles one or a few modules (~0.1 s each).

Stated tolerances (see :func:`assert_matches`):
  * integers, i1, views, gathers/scatters, casts to int, dequantization: exact;
  * f32 results: rtol 1e-5, atol 1e-6 (libm vs numpy transcendental ulps; f32 sums vs the
    oracle's f64 sums); matmuls and composites rtol 2e-5 with atol 1e-5 (dot products that
    cancel, summed in another order than numpy's BLAS);
  * f16 results: rtol 1e-3; bf16 results: rtol 8e-3 (one rounding of the same f32 value, so
    at most one ulp apart when the f32 values differ in the last bits).
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from poot import oracle
from poot.backends.cpu.codegen import compile_cpu
from poot.dialects.lowering import LoweringRefusal
from poot.dialects.quant import Quant
from poot.dialects.types import DType, PackedType, TensorType
from poot.graph.builder import Builder, TraceLimits

LIMITS = TraceLimits(max_values=100_000, max_ops=100_000, max_literal_bytes=1 << 20,
                     max_owned_bytes=1 << 30)
RNG = np.random.default_rng(1234)


@pytest.fixture(autouse=True)
def _seed_per_test(request):
    """Each test draws from its own seed (stable when tests are added or reordered)."""
    global RNG
    RNG = np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))

FLOATS = [DType.F32, DType.F16, DType.BF16]
INTS = [DType.I64, DType.I32, DType.I8]
TOL = {DType.F32: (1e-5, 1e-6), DType.F16: (1e-3, 1e-4), DType.BF16: (8e-3, 1e-3)}


def assert_matches(got: dict, want: dict, rtol: float | None = None,
                   atol: float | None = None):
    assert set(got) == set(want)
    for name in want:
        g, w = got[name], want[name]
        assert g.dtype == w.dtype and g.shape == w.shape, (name, g.dtype, w.dtype, g.shape,
                                                          w.shape)
        dt = DType.from_numpy(w.dtype)
        if dt.is_float:
            r, a = TOL[dt]
            np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64),
                                       rtol=rtol or r, atol=atol or a, equal_nan=True,
                                       err_msg=name)
        else:
            np.testing.assert_array_equal(g, w, err_msg=name)


def check(g, inputs, params=None, rtol=None, fuse=True, atol=None):
    prog = compile_cpu(g, fuse=fuse)
    got = prog.run(inputs, params or {})
    want = oracle.evaluate(g, inputs, params or {})
    assert_matches(got, want, rtol, atol)
    return prog


def rand(shape, dtype: DType, lo=-3.0, hi=3.0):
    if dtype.is_bool:
        return RNG.random(shape) < 0.5
    if dtype.is_int:
        info = np.iinfo(dtype.numpy)
        lo_i, hi_i = max(int(lo * 20), info.min + 1), min(int(hi * 20), info.max)
        return RNG.integers(lo_i, hi_i + 1, size=shape).astype(dtype.numpy)
    return RNG.uniform(lo, hi, size=shape).astype(np.float32).astype(dtype.numpy)


# ---- elementwise ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_unary_binary_ternary_float(dtype):
    b = Builder(LIMITS)
    shape = (3, 5)
    x = b.input("x", TensorType(shape, dtype))
    y = b.input("y", TensorType(shape, dtype))
    p = b.input("p", TensorType(shape, dtype))  # positive, for log/sqrt/pow
    outs = {}
    for fn in ("neg", "abs", "exp", "tanh", "erf", "sin", "cos", "floor"):
        outs[fn] = b.unary(fn, x)
    for fn in ("log", "sqrt", "rsqrt"):
        outs[fn] = b.unary(fn, p)
    for fn in ("add", "sub", "mul", "div", "max", "min"):
        outs[fn] = b.binary(fn, x, y)
    outs["pow"] = b.binary("pow", p, y)
    outs["fma"] = b.ternary("fma", x, y, p)
    outs["clamp"] = b.ternary("clamp", x, b.unary("neg", p), p)
    g = b.finish(outs)
    xv = rand(shape, dtype)
    xv.reshape(-1)[0] = np.nan
    check(g, {"x": xv, "y": rand(shape, dtype), "p": rand(shape, dtype, 0.1, 3.0)})


@pytest.mark.parametrize("dtype", INTS, ids=str)
def test_unary_binary_ternary_int(dtype):
    b = Builder(LIMITS)
    shape = (4, 6)
    x = b.input("x", TensorType(shape, dtype))
    y = b.input("y", TensorType(shape, dtype))
    z = b.input("z", TensorType(shape, dtype))
    outs = {fn: b.unary(fn, x) for fn in ("neg", "abs")}
    outs.update({fn: b.binary(fn, x, y) for fn in ("add", "sub", "mul", "div", "max", "min")})
    outs["clamp"] = b.ternary("clamp", x, y, z)
    g = b.finish(outs)
    yv = rand(shape, dtype)
    yv[0, :4] = [0, -1, 1, 0]  # division by zero and by -1
    check(g, {"x": rand(shape, dtype), "y": yv, "z": rand(shape, dtype)})


def test_bool_ops():
    b = Builder(LIMITS)
    shape = (2, 3, 4)
    x = b.input("x", TensorType(shape, DType.I1))
    y = b.input("y", TensorType(shape, DType.I1))
    g = b.finish({"not": b.unary("not", x), "and": b.binary("and", x, y),
                  "or": b.binary("or", x, y)})
    check(g, {"x": rand(shape, DType.I1), "y": rand(shape, DType.I1)})


@pytest.mark.parametrize("dtype", [DType.F32, DType.F16, DType.BF16, DType.I32, DType.I8,
                                   DType.I1], ids=str)
def test_compare_select(dtype):
    b = Builder(LIMITS)
    shape = (5, 7)
    x = b.input("x", TensorType(shape, dtype))
    y = b.input("y", TensorType(shape, dtype))
    outs = {p: b.compare(p, x, y) for p in ("eq", "ne", "lt", "le", "gt", "ge")}
    outs["select"] = b.select(outs["lt"], x, y)
    g = b.finish(outs)
    xv, yv = rand(shape, dtype), rand(shape, dtype)
    xv[0] = yv[0]  # ties
    if dtype.is_float:
        xv[1, 0] = np.nan
        yv[1, 1] = np.nan
    check(g, {"x": xv, "y": yv})


ALL = [DType.F32, DType.F16, DType.BF16, DType.I64, DType.I32, DType.I8, DType.I1]


@pytest.mark.parametrize("src", ALL, ids=str)
def test_cast_matrix(src):
    b = Builder(LIMITS)
    shape = (3, 8)
    x = b.input("x", TensorType(shape, src))
    g = b.finish({str(d): b.cast(x, d) for d in ALL if d is not src})
    xv = rand(shape, src, -100.0, 100.0) if src.is_float else rand(shape, src)
    if src.is_float:  # values every int dtype holds, with fractions, zeros and halves
        xv = (np.clip(xv.astype(np.float32), -120, 120)).astype(src.numpy)
        xv[0, :4] = np.array([0.0, -0.0, 2.5, -2.5]).astype(src.numpy)
    check(g, {"x": xv})


# ---- reductions -----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [DType.F32, DType.F16, DType.BF16, DType.I32, DType.I8,
                                   DType.I64, DType.I1], ids=str)
def test_reduce(dtype):
    b = Builder(LIMITS)
    shape = (3, 4, 5)
    x = b.input("x", TensorType(shape, dtype))
    outs = {}
    fns = ("max", "min") if dtype.is_bool else ("sum", "max", "min")
    for fn in fns:
        for axes in ((0,), (1,), (2,), (0, 2), (0, 1, 2)):
            outs[f"{fn}{axes}"] = b.reduce(fn, x, axes)
    g = b.finish(outs)
    xv = rand(shape, dtype, 0.5, 2.0) if dtype in (DType.F16, DType.BF16) else rand(shape, dtype)
    check(g, {"x": xv}, rtol=1e-5 if dtype is DType.F32 else None)


# ---- views and sources --------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [DType.F32, DType.BF16, DType.I8, DType.I1], ids=str)
def test_views(dtype):
    b = Builder(LIMITS)
    x = b.input("x", TensorType((2, 3, 4), dtype))
    s = b.input("s", TensorType((), dtype))
    c = b.input("c", TensorType((2, 1, 4), dtype))
    w4 = b.input("w4", TensorType((2, 3, 4, 3), dtype))
    outs = {
        "bc_scalar": b.broadcast_to(s, (3, 2)),
        "bc_stretch": b.op("broadcast", [c], {"dims": (0, 2, 3)},
                           TensorType((2, 5, 3, 4), dtype)),
        "bc_new": b.op("broadcast", [x], {"dims": (1, 2, 3)}, TensorType((2, 2, 3, 4), dtype)),
        "bc_mid": b.op("broadcast", [x], {"dims": (0, 1, 3)}, TensorType((2, 3, 2, 4), dtype)),
        "reshape_flat": b.reshape(x, (24,)),
        "reshape_4d": b.reshape(x, (4, 1, 3, 2)),
        "reshape_scalar": b.reshape(b.reshape(s, (1, 1)), ()),
        "reshape_from1": b.reshape(b.reshape(x, (24,)), (6, 4)),
        "t_210": b.transpose(x, (2, 1, 0)),
        "t_102": b.transpose(x, (1, 0, 2)),
        "slice": b.slice(x, (0, 1, 0), (2, 3, 4), (1, 1, 2)),
        "slice_strided": b.slice(x, (1, 0, 1), (2, 3, 4), (1, 2, 2)),
        "slice_empty": b.slice(x, (0, 0, 0), (2, 0, 4)),
        "concat0": b.concat([x, x], 0),
        "concat1": b.concat([x, b.slice_axis(x, 1, 0, 1), x], 1),
        "concat2": b.concat([c, x], 1),
        # pieces one wide on the axis (RoPE's interleave): one generic selecting the piece by
        # the axis index on the CPU (views.concat_generic), in a shuffled order
        "stack_last": b.concat([b.slice(w4, (0, 0, 0, k), (2, 3, 4, k + 1)) for k in (2, 0, 1)],
                               3),
        "stack_mid": b.concat([b.slice(x, (0, k, 0), (2, k + 1, 4)) for k in (1, 2, 0)], 1),
        "stack_first": b.concat([b.slice(x, (k, 0, 0), (k + 1, 3, 4)) for k in (1, 0)], 0),
        "identity": x,
    }
    g = b.finish(outs)
    check(g, {"x": rand((2, 3, 4), dtype), "s": rand((), dtype), "c": rand((2, 1, 4), dtype),
              "w4": rand((2, 3, 4, 3), dtype)})


@pytest.mark.parametrize("dtype", [DType.F32, DType.F16, DType.BF16, DType.I64, DType.I32,
                                   DType.I8], ids=str)
def test_iota_constant_param(dtype):
    b = Builder(LIMITS)
    outs = {"iota0": b.iota((5, 3), 0, dtype), "iota1": b.iota((5, 3), 1, dtype),
            "iota_1d": b.iota((7,), 0, dtype)}
    if dtype is not DType.BF16:
        outs["const"] = b.constant(rand((2, 3), dtype))
        outs["splat"] = b.constant(np.full((4,), 3, dtype=dtype.numpy))
        outs["scalar"] = b.constant(np.array(-2, dtype=dtype.numpy))
    w = b.param("w", TensorType((2, 3), dtype))
    w2 = b.param("w", TensorType((2, 3), dtype))  # the same weight, used twice
    outs["w_twice"] = b.binary("add", w, w2)
    g = b.finish(outs)
    prog = check(g, {}, {"w": rand((2, 3), dtype)})
    assert [n for n, _ in prog.params] == ["w"]


def test_bool_constant():
    b = Builder(LIMITS)
    g = b.finish({"t": b.constant(np.ones((3,), bool)), "f": b.constant(np.array(False)),
                  "m": b.constant(np.array([[True, False], [False, True]]))})
    check(g, {})


# ---- contraction ----------------------------------------------------------------------------

def test_matmul():
    b = Builder(LIMITS)
    outs = {}
    ins = {}
    for name, dt, a_shape, b_shape, out in (
            ("f32_2d", DType.F32, (3, 5), (5, 4), None),
            ("f32_gemv", DType.F32, (1, 16), (16, 7), None),
            ("f32_3d", DType.F32, (2, 3, 5), (2, 5, 4), None),
            ("f32_4d", DType.F32, (2, 2, 3, 4), (2, 2, 4, 2), None),
            ("f16_f16out", DType.F16, (3, 8), (8, 2), DType.F16),
            ("f16_f32out", DType.F16, (2, 3, 8), (2, 8, 2), None),
            ("bf16_bf16out", DType.BF16, (4, 8), (8, 3), DType.BF16),
            ("i8", DType.I8, (3, 9), (9, 4), None),
            ("i8_3d", DType.I8, (2, 3, 9), (2, 9, 4), None)):
        a = b.input(name + "_a", TensorType(a_shape, dt))
        c = b.input(name + "_b", TensorType(b_shape, dt))
        outs[name] = b.matmul(a, c, out)
        ins[name + "_a"] = rand(a_shape, dt, -1, 1) if dt.is_float else rand(a_shape, dt, -6, 6)
        ins[name + "_b"] = rand(b_shape, dt, -1, 1) if dt.is_float else rand(b_shape, dt, -6, 6)
    check(b.finish(outs), ins, rtol=2e-5, atol=1e-5)


# ---- indexing -------------------------------------------------------------------------------

def test_indexing_i8_indices_large_table():
    """i8 indices into a table longer than 127 rows: bounds are compared in i64."""
    b = Builder(LIMITS)
    t = b.input("t", TensorType((300, 2), DType.F32))
    i = b.input("i", TensorType((4,), DType.I8))
    d = b.input("d", TensorType((200, 2), DType.F32))
    r = b.input("r", TensorType((3, 1), DType.I8))
    u = b.input("u", TensorType((3, 2), DType.F32))
    g = b.finish({"g": b.gather(t, i, 0), "s": b.scatter(d, r, u)})
    check(g, {"t": rand((300, 2), DType.F32), "i": np.array([127, -128, 5, 0], np.int8),
              "d": rand((200, 2), DType.F32), "r": np.array([[127], [-1], [3]], np.int8),
              "u": rand((3, 2), DType.F32)})


@pytest.mark.parametrize("idx_dtype", [DType.I32, DType.I64], ids=str)
def test_gather(idx_dtype):
    b = Builder(LIMITS)
    t = b.input("t", TensorType((6, 4, 3), DType.F32))
    i1 = b.input("i1", TensorType((5,), idx_dtype))
    i2 = b.input("i2", TensorType((2, 3), idx_dtype))
    i0 = b.input("i0", TensorType((), idx_dtype))
    g = b.finish({"ax0": b.gather(t, i1, 0), "ax1": b.gather(t, i1, 1),
                  "ax2_2d": b.gather(t, i2, 2), "ax0_2d": b.gather(t, i2, 0),
                  "scalar_idx": b.gather(t, i0, 1)})
    check(g, {"t": rand((6, 4, 3), DType.F32),
              "i1": np.array([0, 5, -3, 9, 2], dtype=idx_dtype.numpy),  # clamped both ways
              "i2": np.array([[2, 0, 1], [7, -1, 1]], dtype=idx_dtype.numpy),
              "i0": np.array(3, dtype=idx_dtype.numpy)})


@pytest.mark.parametrize("dtype", [DType.F32, DType.BF16, DType.I32], ids=str)
def test_scatter(dtype):
    b = Builder(LIMITS)
    d = b.input("d", TensorType((5, 3, 4), dtype))
    i1 = b.input("i1", TensorType((4, 1), DType.I32))
    u1 = b.input("u1", TensorType((4, 3, 4), dtype))
    i2 = b.input("i2", TensorType((4, 2), DType.I64))
    u2 = b.input("u2", TensorType((4, 4), dtype))
    i3 = b.input("i3", TensorType((3, 3), DType.I32))
    u3 = b.input("u3", TensorType((3,), dtype))
    g = b.finish({"rows": b.scatter(d, i1, u1), "pairs": b.scatter(d, i2, u2),
                  "points": b.scatter(d, i3, u3), "dest_unchanged": d})
    check(g, {"d": rand((5, 3, 4), dtype),
              "i1": np.array([[1], [5], [1], [-1]], np.int32),  # 5, -1 dropped; later 1 wins
              "u1": rand((4, 3, 4), dtype),
              "i2": np.array([[0, 2], [4, 0], [4, 3], [0, 2]], np.int64),
              "u2": rand((4, 4), dtype),
              "i3": np.array([[4, 2, 3], [0, 0, 0], [1, 1, 4]], np.int32),
              "u3": rand((3,), dtype)})


# ---- packed weights -------------------------------------------------------------------------

def _random_blocks(fmt, shape):
    """Random but valid packed bytes: f16 scales kept finite and small."""
    nblk = fmt.packed_bytes(shape) // fmt.block_bytes
    raw = RNG.integers(0, 256, size=(nblk, fmt.block_bytes), dtype=np.uint8)
    scale_offs = {"q8_0": (0,), "q4_0": (0,), "q5_0": (0,), "q4_1": (0, 2), "q5_1": (0, 2),
                  "q4_k": (0, 2), "q5_k": (0, 2), "q6_k": (208,)}
    for off in scale_offs[fmt.name]:
        v = RNG.uniform(-0.1, 0.1, size=nblk).astype(np.float16)
        raw[:, off:off + 2] = v.view(np.uint8).reshape(nblk, 2)
    return raw.reshape(-1)


@pytest.mark.parametrize("q", list(Quant), ids=lambda q: q.value.name)
def test_dequantize_exact(q):
    """Every packed format decodes bit-exactly like the numpy reference (quant_ref)."""
    fmt = q.value
    n = fmt.block_elems
    b = Builder(LIMITS)
    p2 = b.param("p2", PackedType(fmt, (3, 2 * n)))
    p3 = b.param("p3", PackedType(fmt, (2, 2, n)))
    g = b.finish({"d2": b.dequantize(p2), "d3": b.dequantize(p3),
                  "d2_f16": b.dequantize(p2, DType.F16)})
    prog = compile_cpu(g)
    params = {"p2": _random_blocks(fmt, (3, 2 * n)), "p3": _random_blocks(fmt, (2, 2, n))}
    got = prog.run({}, params)
    want = oracle.evaluate(g, {}, params)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)


@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "unfused"])
@pytest.mark.parametrize("q", [Quant.Q8_0, Quant.Q4_1, Quant.Q4_0, Quant.Q5_1],
                         ids=lambda q: q.value.name)
def test_dequantize_matmul_gguf(q, fuse):
    """x @ dequantize(W)^T with W quantized by gguf-py (K-quants: gguf-py has no quantizer;
    they are covered bit-exactly by test_dequantize_exact)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    fmt = q.value
    rows, cols = 16, 64  # W is [rows, cols] with blocks along cols; y = x @ W^T
    w = RNG.normal(size=(rows, cols)).astype(np.float32)
    packed = np.asarray(quantize(w, GGMLQuantizationType(fmt.ggml_type)),
                        dtype=np.uint8).reshape(-1)
    b = Builder(LIMITS)
    x = b.input("x", TensorType((2, cols), DType.F32))
    wq = b.param("wq", PackedType(fmt, (rows, cols)))
    y = b.matmul(x, b.transpose(b.dequantize(wq), (1, 0)))
    g = b.finish({"y": y})
    # Dot products of 64 terms of size ~1 cancel: absolute tolerance 1e-5 besides rtol 2e-5
    # (the oracle's BLAS sums in another order).
    check(g, {"x": rand((2, cols), DType.F32)}, {"wq": packed}, rtol=2e-5, atol=1e-5,
          fuse=fuse)


def test_refusal_names_op_and_format(monkeypatch):
    """A format without a decoder is a LoweringRefusal naming the op and the format (every
    format poot knows has one today, so one is removed for the test)."""
    from poot.dialects.lowering import packed

    monkeypatch.delitem(packed.DECODERS, "q6_k")
    b = Builder(LIMITS)
    g = b.finish({"d": b.dequantize(b.param("w", PackedType(Quant.Q6_K.value, (2, 256))))})
    with pytest.raises(LoweringRefusal) as e:
        compile_cpu(g)
    assert e.value.op == "poot.dequantize"
    assert "q6_k" in e.value.capability


# ---- composites ---------------------------------------------------------------------------

@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "unfused"])
def test_composite_block(fuse):
    """x @ W, an RMSNorm-like reduce and a softmax-like normalisation in one graph."""
    b = Builder(LIMITS)
    n, d, h = 3, 16, 8
    x = b.input("x", TensorType((n, d), DType.F32))
    w = b.param("w", TensorType((d, h), DType.F32))
    g_ = b.param("g", TensorType((h,), DType.F32))
    y = b.matmul(x, w)
    ms = b.reduce("sum", y * y, 1, keepdims=True) / float(h)
    yn = y * b.unary("rsqrt", ms + 1e-6) * g_
    m = b.reduce("max", yn, 1, keepdims=True)
    e = b.unary("exp", yn - m)
    sm = e / b.reduce("sum", e, 1, keepdims=True)
    g = b.finish({"norm": yn, "softmax": sm})
    check(g, {"x": rand((n, d), DType.F32)},
          {"w": rand((d, h), DType.F32, -0.5, 0.5), "g": rand((h,), DType.F32)}, rtol=2e-5,
          atol=1e-5, fuse=fuse)


def test_inputs_not_written_and_rerun():
    b = Builder(LIMITS)
    d = b.input("d", TensorType((4, 2), DType.F32))
    i = b.input("i", TensorType((1, 1), DType.I32))
    u = b.input("u", TensorType((1, 2), DType.F32))
    g = b.finish({"s": b.scatter(d, i, u)})
    prog = compile_cpu(g)
    dv = np.zeros((4, 2), np.float32)
    for k in range(3):
        out = prog.run({"d": dv, "i": np.array([[k]], np.int32),
                        "u": np.full((1, 2), k + 1, np.float32)}, {})
        assert out["s"][k].tolist() == [k + 1, k + 1]
        assert not dv.any()


# ---- property: random small elementwise / reduce / view graphs ---------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_KINDS = ("unary", "binary", "reduce", "transpose", "reshape", "slice", "broadcast", "cast",
          "compare_select")


def _build_random(shape, dtype, steps):
    """A graph from a recipe: each step applies one op kind to live values; every live value
    is an output. ``seed`` picks the op's details deterministically."""
    b = Builder(LIMITS)
    x = b.input("x", TensorType(shape, dtype))
    y = b.input("y", TensorType(shape, dtype))
    live = [x, y]
    for kind, seed in steps:
        r = np.random.default_rng(seed)
        v = live[r.integers(len(live))]
        fdt = v.dtype.is_float
        if kind == "unary":
            fns = ("neg", "abs", "tanh", "sin", "floor") if fdt else ("neg", "abs")
            out = b.unary(str(r.choice(fns)), v)
        elif kind == "binary":
            same = [w for w in live if w.shape == v.shape and w.dtype == v.dtype]
            w = same[r.integers(len(same))]
            out = b.binary(str(r.choice(("add", "sub", "mul", "max", "min", "div"))), v, w)
        elif kind == "reduce":
            if v.rank == 0:
                continue
            axes = sorted(set(int(a) for a in r.choice(v.rank, r.integers(1, v.rank + 1),
                                                        replace=False)))
            out = b.reduce(str(r.choice(("sum", "max", "min"))), v, axes,
                           keepdims=bool(r.integers(2)))
        elif kind == "transpose":
            out = b.transpose(v, tuple(int(p) for p in r.permutation(v.rank)))
        elif kind == "reshape":
            out = b.reshape(v, (v.type.numel,) if r.integers(2) else tuple(reversed(v.shape)))
        elif kind == "slice":
            st_, li, sd = [], [], []
            for d in v.shape:
                a = int(r.integers(d))
                st_.append(a)
                li.append(int(r.integers(a + 1, d + 1)))
                sd.append(int(r.integers(1, 3)))
            out = b.slice(v, st_, li, sd)
        elif kind == "broadcast":
            out = b.broadcast_to(v, (2,) + v.shape)
        elif kind == "cast":
            out = b.cast(v, DType.F32 if not fdt else DType.F16)
        else:  # compare_select
            same = [w for w in live if w.shape == v.shape and w.dtype == v.dtype]
            w = same[r.integers(len(same))]
            out = b.select(b.compare(str(r.choice(("lt", "ge", "eq"))), v, w), v, w)
        live.append(out)
    return b.finish({f"v{i}": t for i, t in enumerate(live[2:])} or {"x": x})


@st.composite
def _recipes(draw):
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
    dtype = draw(st.sampled_from([DType.F32, DType.F16, DType.BF16, DType.I32, DType.I8]))
    steps = draw(st.lists(st.tuples(st.sampled_from(_KINDS), st.integers(0, 2**31 - 1)),
                          min_size=1, max_size=6))
    return shape, dtype, steps


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(_recipes())
def test_random_graphs(recipe):
    """Random elementwise/reduce/view graphs match the oracle (f32: rtol 1e-4, atol 1e-4,
    looser than per-op checks because sums of mixed-sign values cancel; f16/bf16: TOL)."""
    shape, dtype, steps = recipe
    g = _build_random(shape, dtype, steps)
    r = np.random.default_rng(len(steps))
    if dtype.is_float:
        xs = {k: r.uniform(-2, 2, shape).astype(np.float32).astype(dtype.numpy)
              for k in ("x", "y")}
    else:
        xs = {k: r.integers(-5, 6, shape).astype(dtype.numpy) for k in ("x", "y")}
    got = compile_cpu(g).run(xs, {})
    want = oracle.evaluate(g, xs, {})
    for k in want:
        dt = DType.from_numpy(want[k].dtype)
        if dt.is_float:
            rtol, atol = (1e-4, 1e-4) if dt is DType.F32 else TOL[dt]
            np.testing.assert_allclose(got[k].astype(np.float64), want[k].astype(np.float64),
                                       rtol=rtol, atol=atol, equal_nan=True, err_msg=k)
        else:
            np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def test_bf16_as_uint16_words():
    b = Builder(LIMITS)
    x = b.input("x", TensorType((4,), DType.BF16))
    w = b.param("w", TensorType((4,), DType.BF16))
    g = b.finish({"y": b.binary("mul", x, w)})
    xv, wv = rand((4,), DType.BF16), rand((4,), DType.BF16)
    prog = compile_cpu(g)
    got = prog.run({"x": xv.view(np.uint16)}, {"w": wv.view(np.uint16)})
    assert_matches(got, oracle.evaluate(g, {"x": xv}, {"w": wv}))


def test_bad_bindings_are_typed_errors():
    from poot.backends.cpu.codegen import CpuRunError

    b = Builder(LIMITS)
    x = b.input("x", TensorType((4,), DType.F32))
    wq = b.param("wq", PackedType(Quant.Q8_0.value, (1, 32)))
    g = b.finish({"y": b.binary("add", x, x), "d": b.dequantize(wq)})
    prog = compile_cpu(g)
    good = np.zeros(34, np.uint8)
    with pytest.raises(CpuRunError, match="input 'x'"):
        prog.run({"x": np.zeros((5,), np.float32)}, {"wq": good})
    with pytest.raises(CpuRunError, match="input 'x'"):
        prog.run({}, {"wq": good})
    with pytest.raises(CpuRunError, match="weight 'wq'"):
        prog.run({"x": np.zeros((4,), np.float32)}, {"wq": np.zeros(33, np.uint8)})
    with pytest.raises(CpuRunError, match="weight 'wq'"):
        prog.run({"x": np.zeros((4,), np.float32)}, {})
    out = prog.run({"x": np.ones((4,), np.float32)}, {"wq": good})
    assert out["y"].tolist() == [2, 2, 2, 2] and not out["d"].any()


def test_many_weights_and_scatter():
    """Weights become arguments in first-use order, however many (names never collide with
    values the rules emit)."""
    b = Builder(LIMITS)
    d = b.input("d", TensorType((6, 2), DType.F32))
    i = b.input("i", TensorType((2, 1), DType.I32))
    acc = b.param("w0", TensorType((2, 2), DType.F32))
    for k in range(1, 9):
        acc = b.binary("add", acc, b.param(f"w{k}", TensorType((2, 2), DType.F32)))
    g = b.finish({"s": b.scatter(d, i, acc)})
    params = {f"w{k}": rand((2, 2), DType.F32) for k in range(9)}
    prog = check(g, {"d": rand((6, 2), DType.F32), "i": np.array([[4], [1]], np.int32)}, params)
    assert [n for n, _ in prog.params] == [f"w{k}" for k in range(9)]


def test_compile_parsed_module():
    """A module parsed from text (as poot-opt reads it) compiles like a builder's graph."""
    from poot.dialects import make_context
    from mlir import ir

    text = """
    func.func @step(%x: tensor<2x3xf32> {poot.name = "x"}) -> (tensor<3xf32> {poot.name = "s"}) {
      %w = "poot.param"() {name = "w"} : () -> tensor<2x3xf32>
      %0 = "poot.binary"(%x, %w) {fn = "mul"} : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32>
      %1 = "poot.reduce"(%0) {axes = array<i64: 0>, fn = "sum"} : (tensor<2x3xf32>) -> tensor<3xf32>
      return %1 : tensor<3xf32>
    }"""
    with make_context() as ctx, ir.Location.unknown(ctx):
        module = ir.Module.parse(text)
    prog = compile_cpu(module)
    xv, wv = rand((2, 3), DType.F32), rand((2, 3), DType.F32)
    assert_matches(prog.run({"x": xv}, {"w": wv}), oracle.evaluate(module, {"x": xv}, {"w": wv}))


def test_rank0_values():
    b = Builder(LIMITS)
    s = b.input("s", TensorType((), DType.F32))
    t = b.input("t", TensorType((), DType.F32))
    g = b.finish({"add": b.binary("add", s, t), "tr": b.transpose(s, ()),
                  "cast": b.cast(s, DType.I32), "sel": b.select(b.compare("lt", s, t), s, t),
                  "sl": b.slice(s, (), (), ())})
    check(g, {"s": np.array(2.5, np.float32), "t": np.array(-1.0, np.float32)})


# ---- a traced model step ------------------------------------------------------------------

@pytest.mark.parametrize("name", ["llama", "llama_gguf_q4_1"])
def test_tiny_llama_steps(name):
    """A traced prefill step and a decode step of the tiny Llama fixtures (dense f32 and GGUF
    Q4_1), KV caches carried from the compiled program's own outputs, match the oracle
    (logits and caches: atol 1e-4)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
    from model_steps import compiled_steps_match_oracle

    compiled_steps_match_oracle(name, compile_cpu)


def test_runtime_buffer_ownership_compiles_and_runs():
    """Linalg IR whose buffers need runtime ownership (scf.if yielding a fresh buffer or a
    read-only argument) compiles: its i1 ownership memrefs are widened to bytes (MLIR 22's
    memref-to-LLVM lowering aborts on i1 loads/stores), and it computes the right thing."""
    import ctypes

    from mlir import ir

    from poot.backends.cpu.codegen import _descriptor, compile_lowered

    text = """
    func.func @f(%c: i1, %a: tensor<4xf32> {bufferization.writable = false},
                 %b: tensor<4xf32> {bufferization.writable = false}, %v: f32)
        -> (tensor<4xf32>, tensor<4xf32>) attributes {llvm.emit_c_interface} {
      %i = arith.constant 1 : index
      %r = scf.if %c -> (tensor<4xf32>) {
        %w = tensor.insert %v into %a[%i] : tensor<4xf32>
        scf.yield %w : tensor<4xf32>
      } else {
        scf.yield %a : tensor<4xf32>
      }
      %s = scf.if %c -> (tensor<4xf32>) {
        %w = tensor.insert %v into %b[%i] : tensor<4xf32>
        scf.yield %w : tensor<4xf32>
      } else {
        scf.yield %b : tensor<4xf32>
      }
      %e = tensor.empty() : tensor<4xf32>
      %sum = linalg.add ins(%r, %s : tensor<4xf32>, tensor<4xf32>) outs(%e : tensor<4xf32>) -> tensor<4xf32>
      %e2 = tensor.empty() : tensor<4xf32>
      %sum2 = linalg.add ins(%sum, %s : tensor<4xf32>, tensor<4xf32>) outs(%e2 : tensor<4xf32>) -> tensor<4xf32>
      return %sum, %sum2 : tensor<4xf32>, tensor<4xf32>
    }"""
    with ir.Context(), ir.Location.unknown():
        engine = compile_lowered(ir.Module.parse(text))
    for cond in (True, False):
        a, b = np.arange(4, dtype=np.float32), np.full(4, 10, np.float32)
        o1, o2 = np.zeros(4, np.float32), np.zeros(4, np.float32)
        descs = [_descriptor(x) for x in (a, b, o1, o2)]
        c, v = ctypes.c_bool(cond), ctypes.c_float(100.0)
        mem = [ctypes.pointer(ctypes.pointer(d)) for d in descs]
        engine.invoke("f", ctypes.pointer(c), mem[0], mem[1], ctypes.pointer(v), mem[2], mem[3])
        r, s = a.copy(), b.copy()
        if cond:
            r[1] = s[1] = 100
        np.testing.assert_array_equal(o1, r + s)
        np.testing.assert_array_equal(o2, r + 2 * s)
        assert a.tolist() == [0, 1, 2, 3] and b.tolist() == [10] * 4  # inputs untouched
