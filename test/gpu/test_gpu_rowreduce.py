"""The ``rowreduce`` GPU strategy: RMSNorm, softmax and LayerNorm regions (one or two
last-axis reductions, elementwise consumers) compiled alone to ONE kernel, run on a real Vulkan
device (lavapipe in CI) against the numpy oracle over a grid of row counts, row lengths and
dtypes; the same kernels assembled by ptxas; regions it must refuse."""

from __future__ import annotations

import numpy as np
import pytest
pytest.importorskip("mlir.ir", reason="the MLIR wheels (xtc-mlir-python-bindings) are not "
                    "installed here: this module compiles kernels")
from test_gpu_pointwise import _caps, check, ptx_of, rand, region, strategies_of


def rmsnorm(rows: tuple, k: int, dt: str = "f32"):
    """The traced RMSNorm body (as SmolLM2's): x * rsqrt(sum(x*x)/K + eps) * w."""
    r = "x".join(map(str, rows))
    n = len(rows)
    X, R, R1 = f"tensor<{r}x{k}x{dt}>", f"tensor<{r}x{dt}>", f"tensor<{r}x1x{dt}>"
    dims = ", ".join(str(i) for i in range(n + 1))
    body = f"""
  %0 = "poot.constant"() {{value = dense<{float(k):e}> : {R1}}} : () -> {R1}
  %1 = "poot.constant"() {{value = dense<9.99999974E-6> : {R1}}} : () -> {R1}
  %2 = "poot.binary"(%arg0, %arg0) {{fn = "mul"}} : ({X}, {X}) -> {X}
  %3 = "poot.reduce"(%2) {{axes = array<i64: {n}>, fn = "sum"}} : ({X}) -> {R}
  %4 = "poot.reshape"(%3) : ({R}) -> {R1}
  %5 = "poot.binary"(%4, %0) {{fn = "div"}} : ({R1}, {R1}) -> {R1}
  %6 = "poot.binary"(%5, %1) {{fn = "add"}} : ({R1}, {R1}) -> {R1}
  %7 = "poot.unary"(%6) {{fn = "rsqrt"}} : ({R1}) -> {R1}
  %8 = "poot.broadcast"(%7) {{dims = array<i64: {dims}>}} : ({R1}) -> {X}
  %9 = "poot.binary"(%arg0, %8) {{fn = "mul"}} : ({X}, {X}) -> {X}
  %10 = "poot.broadcast"(%arg1) {{dims = array<i64: {n}>}} : (tensor<{k}x{dt}>) -> {X}
  %11 = "poot.binary"(%9, %10) {{fn = "mul"}} : ({X}, {X}) -> {X}
  return %11 : {X}"""
    return region([X, f"tensor<{k}x{dt}>"], [X], body)


TOL = {"f32": 2e-5, "f16": 2e-3, "bf16": 1.6e-2}


@pytest.mark.parametrize("rows,k,r", [(1, 64, 16), (5, 300, 64), (32, 2048, 16)])
def test_rmsnorm_of_a_residual_with_a_lora_term(vk, rows, k, r):
    """RMSNorm of ``h + xa B^T`` (a LoRA expand, r terms, folded in front of the norm): the
    contraction is computed per element wherever the row is read (f32, k ascending)."""
    X, XA, W = f"tensor<{rows}x{k}xf32>", f"tensor<{rows}x{r}xf32>", f"tensor<{k}x{r}xf32>"
    body = f"""
  %t = "poot.transpose"(%arg2) {{perm = array<i64: 1, 0>}} : ({W}) -> tensor<{r}x{k}xf32>
  %e = "poot.matmul"(%arg1, %t) {{acc = f32}} : ({XA}, tensor<{r}x{k}xf32>) -> {X}
  %h = "poot.binary"(%arg0, %e) {{fn = "add"}} : ({X}, {X}) -> {X}
  %0 = "poot.constant"() {{value = dense<{float(k):e}> : tensor<{rows}x1xf32>}} : () -> tensor<{rows}x1xf32>
  %2 = "poot.binary"(%h, %h) {{fn = "mul"}} : ({X}, {X}) -> {X}
  %3 = "poot.reduce"(%2) {{axes = array<i64: 1>, fn = "sum"}} : ({X}) -> tensor<{rows}xf32>
  %4 = "poot.reshape"(%3) : (tensor<{rows}xf32>) -> tensor<{rows}x1xf32>
  %5 = "poot.binary"(%4, %0) {{fn = "div"}} : (tensor<{rows}x1xf32>, tensor<{rows}x1xf32>) -> tensor<{rows}x1xf32>
  %7 = "poot.unary"(%5) {{fn = "rsqrt"}} : (tensor<{rows}x1xf32>) -> tensor<{rows}x1xf32>
  %8 = "poot.broadcast"(%7) {{dims = array<i64: 0, 1>}} : (tensor<{rows}x1xf32>) -> {X}
  %9 = "poot.binary"(%h, %8) {{fn = "mul"}} : ({X}, {X}) -> {X}
  return %9, %h : {X}, {X}"""
    g = region([X, XA, W], [X, X], body)
    rng = np.random.default_rng(k + r)
    check(vk, g, {"a0": rand(rng, (rows, k), "f32"), "a1": rand(rng, (rows, r), "f32"),
                  "a2": rand(rng, (k, r), "f32", -0.5, 0.5)},
          rtol=2e-5, atol=2e-5, strategy="rowreduce")


@pytest.mark.parametrize("rows,k,top", [(1, 64, 2), (3, 1024, 8)])
def test_rmsnorm_of_a_moe_combine(vk, rows, k, top):
    """RMSNorm of ``h = x0 + sum_j w[j] * ys[j]`` (a MoE layer's top-k combine folded in front
    of the final norm): the sum over the leading axis is no row reduction, so it is computed
    per element wherever h is read, and the row kernel reduces h^2 as before."""
    X, Y, W = f"tensor<{rows}x{k}xf32>", f"tensor<{top}x{rows}x{k}xf32>", \
        f"tensor<{top}x{rows}x1xf32>"
    R1 = f"tensor<{rows}x1xf32>"
    body = f"""
  %wb = "poot.broadcast"(%arg2) {{dims = array<i64: 0, 1, 2>}} : ({W}) -> {Y}
  %yw = "poot.binary"(%arg1, %wb) {{fn = "mul"}} : ({Y}, {Y}) -> {Y}
  %ys = "poot.reduce"(%yw) {{axes = array<i64: 0>, fn = "sum"}} : ({Y}) -> {X}
  %h = "poot.binary"(%arg0, %ys) {{fn = "add"}} : ({X}, {X}) -> {X}
  %0 = "poot.constant"() {{value = dense<{float(k):e}> : {R1}}} : () -> {R1}
  %2 = "poot.binary"(%h, %h) {{fn = "mul"}} : ({X}, {X}) -> {X}
  %3 = "poot.reduce"(%2) {{axes = array<i64: 1>, fn = "sum"}} : ({X}) -> tensor<{rows}xf32>
  %4 = "poot.reshape"(%3) : (tensor<{rows}xf32>) -> {R1}
  %5 = "poot.binary"(%4, %0) {{fn = "div"}} : ({R1}, {R1}) -> {R1}
  %7 = "poot.unary"(%5) {{fn = "rsqrt"}} : ({R1}) -> {R1}
  %8 = "poot.broadcast"(%7) {{dims = array<i64: 0, 1>}} : ({R1}) -> {X}
  %9 = "poot.binary"(%h, %8) {{fn = "mul"}} : ({X}, {X}) -> {X}
  return %9, %h : {X}, {X}"""
    g = region([X, Y, W], [X, X], body)
    rng = np.random.default_rng(k + top)
    check(vk, g, {"a0": rand(rng, (rows, k), "f32"), "a1": rand(rng, (top, rows, k), "f32"),
                  "a2": rand(rng, (top, rows, 1), "f32", 0.0, 1.0)},
          rtol=2e-5, atol=2e-5, strategy="rowreduce")


@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("rows,k", [((1, 1), 576), ((1, 3), 64), ((37,), 100), ((2, 5), 7),
                                    ((1,), 3000), ((9,), 1)])
def test_rmsnorm(vk, rows, k, dt):
    g = rmsnorm(rows, k, dt)
    rng = np.random.default_rng(k)
    check(vk, g, {"a0": rand(rng, rows + (k,), dt), "a1": rand(rng, (k,), dt)},
          rtol=TOL[dt], atol=TOL[dt], strategy="rowreduce")


@pytest.mark.parametrize("rows,k", [((4,), 256), ((3, 7), 33), ((1,), 4096)])
def test_softmax_two_dependent_reductions(vk, rows, k):
    """softmax: the sum's input reads the max of the same row; two results (the
    probabilities, row-shaped, and the row sums, row-scalar)."""
    r = "x".join(map(str, rows))
    n = len(rows)
    X, R, R1 = f"tensor<{r}x{k}xf32>", f"tensor<{r}xf32>", f"tensor<{r}x1xf32>"
    dims = ", ".join(str(i) for i in range(n + 1))
    body = f"""
  %0 = "poot.reduce"(%arg0) {{axes = array<i64: {n}>, fn = "max"}} : ({X}) -> {R}
  %1 = "poot.reshape"(%0) : ({R}) -> {R1}
  %2 = "poot.broadcast"(%1) {{dims = array<i64: {dims}>}} : ({R1}) -> {X}
  %3 = "poot.binary"(%arg0, %2) {{fn = "sub"}} : ({X}, {X}) -> {X}
  %4 = "poot.unary"(%3) {{fn = "exp"}} : ({X}) -> {X}
  %5 = "poot.reduce"(%4) {{axes = array<i64: {n}>, fn = "sum"}} : ({X}) -> {R}
  %6 = "poot.reshape"(%5) : ({R}) -> {R1}
  %7 = "poot.broadcast"(%6) {{dims = array<i64: {dims}>}} : ({R1}) -> {X}
  %8 = "poot.binary"(%4, %7) {{fn = "div"}} : ({X}, {X}) -> {X}
  return %8, %5 : {X}, {R}"""
    g = region([X], [X, R], body)
    rng = np.random.default_rng(2)
    check(vk, g, {"a0": rand(rng, rows + (k,), "f32", -8, 8)}, rtol=2e-5, atol=1e-6,
          strategy="rowreduce")


@pytest.mark.parametrize("rows,k", [((6,), 320), ((2, 2), 31)])
def test_layernorm(vk, rows, k):
    """LayerNorm: mean, then the mean of squared deviations (a reduction over a value that
    depends on the first), normalize, scale and shift by broadcast weights."""
    r = "x".join(map(str, rows))
    n = len(rows)
    X, R, R1 = f"tensor<{r}x{k}xf32>", f"tensor<{r}xf32>", f"tensor<{r}x1xf32>"
    W = f"tensor<{k}xf32>"
    dims = ", ".join(str(i) for i in range(n + 1))
    body = f"""
  %k = "poot.constant"() {{value = dense<{float(k):e}> : {R1}}} : () -> {R1}
  %eps = "poot.constant"() {{value = dense<1.0e-5> : {R1}}} : () -> {R1}
  %0 = "poot.reduce"(%arg0) {{axes = array<i64: {n}>, fn = "sum"}} : ({X}) -> {R}
  %1 = "poot.reshape"(%0) : ({R}) -> {R1}
  %2 = "poot.binary"(%1, %k) {{fn = "div"}} : ({R1}, {R1}) -> {R1}
  %3 = "poot.broadcast"(%2) {{dims = array<i64: {dims}>}} : ({R1}) -> {X}
  %4 = "poot.binary"(%arg0, %3) {{fn = "sub"}} : ({X}, {X}) -> {X}
  %5 = "poot.binary"(%4, %4) {{fn = "mul"}} : ({X}, {X}) -> {X}
  %6 = "poot.reduce"(%5) {{axes = array<i64: {n}>, fn = "sum"}} : ({X}) -> {R}
  %7 = "poot.reshape"(%6) : ({R}) -> {R1}
  %8 = "poot.binary"(%7, %k) {{fn = "div"}} : ({R1}, {R1}) -> {R1}
  %9 = "poot.binary"(%8, %eps) {{fn = "add"}} : ({R1}, {R1}) -> {R1}
  %10 = "poot.unary"(%9) {{fn = "rsqrt"}} : ({R1}) -> {R1}
  %11 = "poot.broadcast"(%10) {{dims = array<i64: {dims}>}} : ({R1}) -> {X}
  %12 = "poot.binary"(%4, %11) {{fn = "mul"}} : ({X}, {X}) -> {X}
  %13 = "poot.broadcast"(%arg1) {{dims = array<i64: {n}>}} : ({W}) -> {X}
  %14 = "poot.broadcast"(%arg2) {{dims = array<i64: {n}>}} : ({W}) -> {X}
  %15 = "poot.ternary"(%12, %13, %14) {{fn = "fma"}} : ({X}, {X}, {X}) -> {X}
  return %15 : {X}"""
    g = region([X, W, W], [X], body)
    rng = np.random.default_rng(4)
    check(vk, g, {"a0": rand(rng, rows + (k,), "f32", 1, 3), "a1": rand(rng, (k,), "f32"),
                  "a2": rand(rng, (k,), "f32")}, rtol=5e-5, atol=5e-5, strategy="rowreduce")


@pytest.mark.parametrize("fn", ["sum", "max", "min"])
@pytest.mark.parametrize("r,k", [(5, 77), (1, 49999)])     # 49999: 8 chains, ragged
def test_int_reductions_row_scalar_outputs(vk, fn, r, k):
    X, R = f"tensor<{r}x{k}xi32>", f"tensor<{r}xi32>"
    body = f"""
  %0 = "poot.reduce"(%arg0) {{axes = array<i64: 1>, fn = "{fn}"}} : ({X}) -> {R}
  %1 = "poot.reshape"(%0) : ({R}) -> tensor<{r}x1xi32>
  return %1 : tensor<{r}x1xi32>"""
    g = region([X], [f"tensor<{r}x1xi32>"], body)
    rng = np.random.default_rng(1)
    check(vk, g, {"a0": rand(rng, (r, k), "i32")}, strategy="rowreduce")


def _any_all(vk, fn: str, k: int, **check_kw) -> None:
    """any (max) / all (min) of 3 boolean rows of ``k``: no true, a single true on the last
    element, all true."""
    X, B = f"tensor<3x{k}xf32>", f"tensor<3x{k}xi1>"
    body = f"""
  %h = "poot.constant"() {{value = dense<0.5> : {X}}} : () -> {X}
  %1 = "poot.compare"(%arg0, %h) {{pred = "gt"}} : ({X}, {X}) -> {B}
  %2 = "poot.reduce"(%1) {{axes = array<i64: 1>, fn = "{fn}"}} : ({B}) -> tensor<3xi1>
  return %2 : tensor<3xi1>"""
    g = region([X], ["tensor<3xi1>"], body)
    x = np.zeros((3, k), np.float32)
    x[1, k - 1] = 1.0
    x[2, :] = 1.0
    got = check(vk, g, {"a0": x}, strategy="rowreduce", **check_kw)
    want = [False, True, True] if fn == "max" else [False, False, True]
    np.testing.assert_array_equal(np.asarray(got["r0"]).astype(bool), want)


@pytest.mark.parametrize("fn", ["max", "min"])
@pytest.mark.parametrize("k", [7, 5000])
def test_bool_any_all_of_a_compare(vk, fn, k):
    """any (max) / all (min) of a boolean row, as the sampler's non-finite check reduces one.
    (The check itself, ``x - x != 0``, is not used here: lavapipe folds ``x - x`` to 0.)"""
    _any_all(vk, fn, k)


def _dispatch(g):
    return next(o.operation for o in g.module.body.operations
                if str(o.operation.attributes["sym_name"]) == '"d"')


def test_refuses_other_rows_and_other_axes():
    """A reduction result read at another row (a transpose of the row sums), a reduction over
    a leading axis, and two reductions of different shapes stay with other strategies."""
    from poot.backends.gpu.strategies.rowreduce import synthesize_rowreduce

    other_row = """
  %0 = "poot.reduce"(%arg0) {axes = array<i64: 2>, fn = "sum"} : (tensor<2x3x8xf32>) -> tensor<2x3xf32>
  %1 = "poot.transpose"(%0) {perm = array<i64: 1, 0>} : (tensor<2x3xf32>) -> tensor<3x2xf32>
  %2 = "poot.reshape"(%1) : (tensor<3x2xf32>) -> tensor<2x3x1xf32>
  %3 = "poot.broadcast"(%2) {dims = array<i64: 0, 1, 2>} : (tensor<2x3x1xf32>) -> tensor<2x3x8xf32>
  %4 = "poot.binary"(%arg0, %3) {fn = "mul"} : (tensor<2x3x8xf32>, tensor<2x3x8xf32>) -> tensor<2x3x8xf32>
  return %4 : tensor<2x3x8xf32>"""
    lead_axis = """
  %0 = "poot.reduce"(%arg0) {axes = array<i64: 0>, fn = "sum"} : (tensor<2x3x8xf32>) -> tensor<3x8xf32>
  return %0 : tensor<3x8xf32>"""
    for body, res in ((other_row, "tensor<2x3x8xf32>"), (lead_axis, "tensor<3x8xf32>")):
        g = region(["tensor<2x3x8xf32>"], [res], body)
        with g.module.context:
            assert synthesize_rowreduce(_dispatch(g), _caps(32)) is None
    g = rmsnorm((2,), 16)
    with g.module.context:
        assert synthesize_rowreduce(_dispatch(g), _caps(32)) is not None


@pytest.mark.parametrize("sg", [32, None])
def test_ptx_assembles(sg):
    """Shuffles + workgroup memory (subgroup size known) and the workgroup-memory tree (not
    known) both lower through NVVM to PTX that ptxas accepts."""
    g = rmsnorm((3,), 2048, "bf16")
    assert strategies_of(g, _caps(sg)) == {"rowreduce": 1}
    ptx = ptx_of(g, _caps(sg))
    assert ("shfl.sync.bfly" in ptx) == (sg is not None) and "bar.sync" in ptx


def test_workgroup_tree_without_subgroup_size(vk):
    """A device that reports no subgroup size gets the workgroup-memory tree (no shuffles)."""
    from poot.backends.vulkan.codegen import vulkan_target

    dev, target = vk
    blind = (dev, vulkan_target({**dev.capabilities(), "subgroup_size": None}))
    assert blind[1].caps.subgroup_size is None
    g = rmsnorm((5,), 300)
    rng = np.random.default_rng(8)
    check(blind, g, {"a0": rand(rng, (5, 300), "f32"), "a1": rand(rng, (300,), "f32")},
          rtol=2e-5, atol=2e-5, strategy="rowreduce")


# ---- long rows split across blocks --------------------------------------------------------------

@pytest.fixture
def vk_wide(vk):
    """The Vulkan device compiled for as if it had 64 compute units (lavapipe reports none,
    so its target says 1 core and the split never fires on it)."""
    from poot.backends.vulkan.codegen import vulkan_target

    dev, _ = vk
    target = vulkan_target({**dev.capabilities(), "compute_units": 64})
    assert target.caps.cores == 64
    return dev, target


def argmax_region(r: int, k: int):
    """The greedy sampler's shape: the first index of the row maximum (``min`` over
    ``select(x == max, iota, K)``, clamped to ``K - 1``), an ``any(x > 1e30)`` probe, and a
    row-shaped history update ``select(iota == token, 1, hist)``."""
    X, R, R1 = f"tensor<{r}x{k}xf32>", f"tensor<{r}xf32>", f"tensor<{r}x1xf32>"
    I, IR, IR1 = f"tensor<{r}x{k}xi32>", f"tensor<{r}xi32>", f"tensor<{r}x1xi32>"
    B, BR = f"tensor<{r}x{k}xi1>", f"tensor<{r}xi1>"
    body = f"""
  %n = "poot.constant"() {{value = dense<{k}> : {I}}} : () -> {I}
  %last = "poot.constant"() {{value = dense<{k - 1}> : {IR}}} : () -> {IR}
  %one = "poot.constant"() {{value = dense<1> : {I}}} : () -> {I}
  %big = "poot.constant"() {{value = dense<1.0e30> : {X}}} : () -> {X}
  %0 = "poot.reduce"(%arg0) {{axes = array<i64: 1>, fn = "max"}} : ({X}) -> {R}
  %1 = "poot.reshape"(%0) : ({R}) -> {R1}
  %2 = "poot.broadcast"(%1) {{dims = array<i64: 0, 1>}} : ({R1}) -> {X}
  %3 = "poot.compare"(%arg0, %2) {{pred = "eq"}} : ({X}, {X}) -> {B}
  %4 = "poot.iota"() {{axis = 1 : i64}} : () -> {I}
  %5 = "poot.select"(%3, %4, %n) : ({B}, {I}, {I}) -> {I}
  %6 = "poot.reduce"(%5) {{axes = array<i64: 1>, fn = "min"}} : ({I}) -> {IR}
  %7 = "poot.binary"(%6, %last) {{fn = "min"}} : ({IR}, {IR}) -> {IR}
  %8 = "poot.compare"(%arg0, %big) {{pred = "gt"}} : ({X}, {X}) -> {B}
  %9 = "poot.reduce"(%8) {{axes = array<i64: 1>, fn = "max"}} : ({B}) -> {BR}
  %10 = "poot.reshape"(%7) : ({IR}) -> {IR1}
  %11 = "poot.broadcast"(%10) {{dims = array<i64: 0, 1>}} : ({IR1}) -> {I}
  %12 = "poot.compare"(%4, %11) {{pred = "eq"}} : ({I}, {I}) -> {B}
  %13 = "poot.select"(%12, %one, %arg1) : ({B}, {I}, {I}) -> {I}
  return %7, %9, %13 : {IR}, {BR}, {I}"""
    return region([X, I], [IR, BR, I], body)


@pytest.mark.parametrize("k", [128256, 100003])
def test_split_argmax_first_index_of_ties(vk_wide, k):
    """Ties at the maximum in different slices (the first wins: past the first slice in row
    0, in it in row 1), a row whose maximum also trips the ``any`` probe; max, any (one launch), min
    (a second), outputs (a third: the token, the probe, the history row)."""
    rng = np.random.default_rng(k)
    x = rng.uniform(-2, 2, size=(2, k)).astype(np.float32)
    x[0, [50000, 90000, k - 1]] = 3.5
    x[1, [k - 7, 61000, 900]] = 2e31             # the first in the first slice
    hist = rng.integers(0, 2, size=(2, k)).astype(np.int32)
    got = check(vk_wide, argmax_region(2, k), {"a0": x, "a1": hist}, strategy="rowreduce",
                launches=3)
    np.testing.assert_array_equal(np.asarray(got["r0"]).reshape(-1), [50000, 900])
    np.testing.assert_array_equal(np.asarray(got["r1"]).reshape(-1).astype(bool),
                                  [False, True])


@pytest.mark.parametrize("blind", [False, True])
def test_split_softmax_sum_and_row_outputs(vk_wide, blind):
    """max, then sum(exp(x - max)) reading it (one launch each), then the probabilities
    (row-shaped, split across the blocks) and the sums; ragged K, one row. ``blind``: no
    subgroup size known (the block combine is the workgroup-memory tree)."""
    from poot.backends.vulkan.codegen import vulkan_target

    if blind:
        dev, target = vk_wide
        caps = {**dev.capabilities(), "compute_units": 64, "subgroup_size": None}
        vk_wide = (dev, vulkan_target(caps))
    k = 100003
    X, R, R1 = f"tensor<1x{k}xf32>", "tensor<1xf32>", "tensor<1x1xf32>"
    body = f"""
  %0 = "poot.reduce"(%arg0) {{axes = array<i64: 1>, fn = "max"}} : ({X}) -> {R}
  %1 = "poot.reshape"(%0) : ({R}) -> {R1}
  %2 = "poot.broadcast"(%1) {{dims = array<i64: 0, 1>}} : ({R1}) -> {X}
  %3 = "poot.binary"(%arg0, %2) {{fn = "sub"}} : ({X}, {X}) -> {X}
  %4 = "poot.unary"(%3) {{fn = "exp"}} : ({X}) -> {X}
  %5 = "poot.reduce"(%4) {{axes = array<i64: 1>, fn = "sum"}} : ({X}) -> {R}
  %6 = "poot.reshape"(%5) : ({R}) -> {R1}
  %7 = "poot.broadcast"(%6) {{dims = array<i64: 0, 1>}} : ({R1}) -> {X}
  %8 = "poot.binary"(%4, %7) {{fn = "div"}} : ({X}, {X}) -> {X}
  return %8, %5 : {X}, {R}"""
    g = region([X], [X, R], body)
    rng = np.random.default_rng(3)
    check(vk_wide, g, {"a0": rand(rng, (1, k), "f32", -8, 8)}, rtol=2e-5, atol=1e-10,
          strategy="rowreduce", launches=3)


@pytest.mark.parametrize("fn", ["max", "min"])
def test_split_bool_any_all(vk_wide, fn):
    """any / all of a long boolean row (i32 0/1 partials), split across blocks."""
    _any_all(vk_wide, fn, 120000, launches=2)


@pytest.mark.parametrize("dt", ["f32", "bf16"])
def test_split_rmsnorm_one_long_row(vk_wide, dt):
    """One reduction (a bf16 sum accumulated in f32 partials, rounded once after the fold),
    row-shaped output: two launches."""
    k = 70000
    g = rmsnorm((1,), k, dt)
    rng = np.random.default_rng(9)
    check(vk_wide, g, {"a0": rand(rng, (1, k), dt), "a1": rand(rng, (k,), dt)},
          rtol=TOL[dt], atol=TOL[dt], strategy="rowreduce", launches=2)


def test_split_rule_and_switch(monkeypatch):
    """Few long rows split (slices from the cores, capped, thousands of columns each); many
    rows, short rows, or ``POOT_GPU_ROWSPLIT=0`` keep one kernel."""
    from poot.backends.gpu.strategies.rowreduce import MAX_SPLIT, split_count

    assert split_count(1, 128256, 132) == min(MAX_SPLIT, 128256 // 4096)
    assert split_count(2, 49152, 132) == 1         # one block: about as fast (module doc)
    assert split_count(2, 65536, 132) == 16
    assert split_count(1, 128256, 1) == 1          # one core: nothing to spread over
    assert split_count(100, 128256, 132) == 1      # rows already fill the cores
    assert split_count(1, 4096, 132) == 1          # one block streams it quickly
    monkeypatch.setenv("POOT_GPU_ROWSPLIT", "0")
    assert split_count(1, 128256, 132) == 1
    assert strategies_of(argmax_region(1, 128256), _caps(32)) == {"rowreduce": 1}


def test_split_argmax_ptx():
    """The split argmax for an H200-like target (subgroup 32, 132 SMs): three launches,
    31 blocks a row, lowered through NVVM to PTX (assembled by ptxas where installed)."""
    from poot.backends.gpu.strategies.rowreduce import synthesize_rowreduce

    g = argmax_region(1, 128256)
    with g.module.context:
        s = synthesize_rowreduce(_dispatch(g), _caps(32))
    assert [L.grid[0] for L in s.launches] == [31, 31, 31]
    assert [L.block[0] for L in s.launches] == [1024, 1024, 1024]
    assert strategies_of(g, _caps(32)) == {"rowreduce": 3}
    # several launches: horizontal fusion must not take it as a member
    from mlir import ir

    from poot.backends.gpu.horizontal import single_launch
    from poot.backends.gpu.strategies import synthesize

    kc = ir.Context()
    kc.allow_unregistered_dialects = True
    assert not single_launch(synthesize(_dispatch(g), _caps(32), kc))
    ptx = ptx_of(g, _caps(32))
    assert "shfl.sync.bfly" in ptx and "bar.sync" in ptx
