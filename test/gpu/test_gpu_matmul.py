"""The decode-GEMV strategy (:mod:`poot.backends.gpu.strategies.matmul`): which regions it
takes, and its kernels run on a Vulkan device (lavapipe in CI) against the numpy oracle over
weight formats x shapes x epilogues; the same kernels lower to PTX (128-bit loads on the
dense and K-quant paths) that ptxas assembles."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import ml_dtypes
import numpy as np
import pytest
pytest.importorskip("mlir.ir", reason="the MLIR wheels (xtc-mlir-python-bindings) are not "
                    "installed here: this module compiles kernels")
from mlir import ir

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "vulkan"))



from poot import oracle  # noqa: E402
from poot.dialects import make_context  # noqa: E402
from poot.dialects.quant import BY_NAME  # noqa: E402
from poot.graph.builder import Graph  # noqa: E402

#: f32 accumulation in another order than the oracle's
RTOL = 1e-4
ATOL = 1e-5

#: where each format keeps its f16 scale fields (byte offsets in a block)
_F16_FIELDS = {"q4_0": (0,), "q4_1": (0, 2), "q8_0": (0,), "q4_k": (0, 2), "q6_k": (208,)}
_DENSE = {"f32": np.float32, "bf16": ml_dtypes.bfloat16, "f16": np.float16}


def _weight(fmt: str, N: int, K: int, rng):
    """(MLIR type, value, rhs chain text) of a random [N, K] weight of ``fmt``."""
    if fmt in _DENSE:
        w = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(_DENSE[fmt])
        t = f"tensor<{N}x{K}x{fmt}>"
        return t, w, None
    q = BY_NAME[fmt]
    nblk = N * K // q.block_elems
    raw = rng.integers(0, 256, (nblk, q.block_bytes), dtype=np.uint8)
    for off in _F16_FIELDS[fmt]:
        scale = rng.uniform(0.002, 0.02, nblk).astype(np.float16)
        raw[:, off:off + 2] = scale.view(np.uint8).reshape(nblk, 2)
    return f"!poot.packed<#poot.{fmt}, array<i64: {N}, {K}>>", raw.reshape(-1), None


def _norm(kind: str, M: int, K: int, rng) -> tuple[list, list[str]]:
    """(extra arguments, body) of a norm of ``%x`` [1, M, K] into ``%xn``, spelled as the
    tracer's RMSNorm / LayerNorm (as :func:`~poot.backends.gpu.merge.fold_regions` leaves it
    in front of a matmul)."""
    t, t1, tr = f"tensor<1x{M}x{K}xf32>", f"tensor<1x{M}x1xf32>", f"tensor<1x{M}xf32>"
    g = (1 + 0.1 * rng.standard_normal(K)).astype(np.float32)
    args = [("ng", f"tensor<{K}xf32>", g)]
    body = [f'%cK = "poot.constant"() {{value = dense<{float(K)}> : {t1}}} : () -> {t1}',
            f'%eps = "poot.constant"() {{value = dense<1.0e-05> : {t1}}} : () -> {t1}',
            f'%gb = "poot.broadcast"(%ng) {{dims = array<i64: 2>}} : (tensor<{K}xf32>) -> {t}']

    def mean(src, name):
        return [f'%{name}s = "poot.reduce"({src}) {{axes = array<i64: 2>, fn = "sum"}} : '
                f'({t}) -> {tr}',
                f'%{name}r = "poot.reshape"(%{name}s) : ({tr}) -> {t1}',
                f'%{name} = "poot.binary"(%{name}r, %cK) {{fn = "div"}} : ({t1}, {t1}) -> {t1}']

    if kind == "rmsnorm":
        src = "%x"
        body += [f'%sq = "poot.binary"(%x, %x) {{fn = "mul"}} : ({t}, {t}) -> {t}']
        body += mean("%sq", "ms")
        var = "%ms"
    elif kind == "layernorm":
        b = (0.1 * rng.standard_normal(K)).astype(np.float32)
        args.append(("nb", f"tensor<{K}xf32>", b))
        body += mean("%x", "mu")
        body += [f'%mub = "poot.broadcast"(%mu) {{dims = array<i64: 0, 1, 2>}} : ({t1}) -> {t}',
                 f'%dx = "poot.binary"(%x, %mub) {{fn = "sub"}} : ({t}, {t}) -> {t}',
                 f'%d2 = "poot.binary"(%dx, %dx) {{fn = "mul"}} : ({t}, {t}) -> {t}']
        body += mean("%d2", "va")
        src, var = "%dx", "%va"
    else:
        raise ValueError(kind)
    body += [f'%ve = "poot.binary"({var}, %eps) {{fn = "add"}} : ({t1}, {t1}) -> {t1}',
             f'%rs = "poot.unary"(%ve) {{fn = "rsqrt"}} : ({t1}) -> {t1}',
             f'%rsb = "poot.broadcast"(%rs) {{dims = array<i64: 0, 1, 2>}} : ({t1}) -> {t}',
             f'%xr = "poot.binary"({src}, %rsb) {{fn = "mul"}} : ({t}, {t}) -> {t}',
             f'%xn{"" if kind == "rmsnorm" else "0"} = "poot.binary"(%xr, %gb) '
             f'{{fn = "mul"}} : ({t}, {t}) -> {t}']
    if kind == "layernorm":
        body += [f'%bb = "poot.broadcast"(%nb) {{dims = array<i64: 2>}} : (tensor<{K}xf32>) '
                 f'-> {t}',
                 f'%xn = "poot.binary"(%xn0, %bb) {{fn = "add"}} : ({t}, {t}) -> {t}']
    return args, body


def _lhs(x: np.ndarray, norm: str | None, rng, combine: int = 0) -> tuple[list, list[str]]:
    """(arguments, body) of the matmul LHS ``%x2`` [M, K] from the argument x [1, M, K],
    through ``norm`` (:func:`_norm`) when given. ``combine`` = k > 0: x is not an argument
    but a MoE layer's output, ``x0 + sum_j w[j] * ys[j]`` over k rows (a reduction over the
    leading axis, which the kernels compute per element)."""
    _, M, K = x.shape
    t = f"tensor<1x{M}x{K}xf32>"
    body: list = []
    if combine:
        k = combine
        ys, w = f"tensor<{k}x1x{M}x{K}xf32>", f"tensor<{k}x1x1x1xf32>"
        args = [("x0", t, x), ("ys", ys, rng.standard_normal((k, 1, M, K)).astype(np.float32)),
                ("cw", w, rng.uniform(0.1, 1.0, (k, 1, 1, 1)).astype(np.float32))]
        body += [f'%cwb = "poot.broadcast"(%cw) {{dims = array<i64: 0, 1, 2, 3>}} : ({w}) -> {ys}',
                 f'%yw = "poot.binary"(%ys, %cwb) {{fn = "mul"}} : ({ys}, {ys}) -> {ys}',
                 f'%ysum = "poot.reduce"(%yw) {{axes = array<i64: 0>, fn = "sum"}} : ({ys}) -> {t}',
                 f'%x = "poot.binary"(%x0, %ysum) {{fn = "add"}} : ({t}, {t}) -> {t}']
    else:
        args = [("x", t, x)]
    xin = "%x"
    if norm is not None:
        a, b = _norm(norm, M, K, rng)
        args += a
        body += b
        xin = "%xn"
    body.append(f'%x2 = "poot.reshape"({xin}) : (tensor<1x{M}x{K}xf32>) -> '
                f'tensor<{M}x{K}xf32>')
    return args, body


def gemv_region(fmt: str, M: int, N: int, K: int, epilogue: str = "none", seed: int = 0,
                layout: str = "nk", norm: str | None = None, probe: bool = False,
                combine: int = 0):
    """A graph ``@region`` calling one dispatch function ``x [1, M, K] -> [1, M, N]`` (a
    matmul against a ``fmt`` weight, spelled as the tracer does, then ``epilogue``: ``none``,
    ``residual`` (+ an argument) or ``silu_up`` (silu(y) * an argument)), and its inputs;
    ``norm`` (``rmsnorm``/``layernorm``): x goes through that norm first (:func:`_norm`);
    ``combine``: x is a MoE combine of that many rows (:func:`_lhs`)."""
    rng = np.random.default_rng(seed)
    wt, wv, _ = _weight(fmt, N if layout == "nk" else K, K if layout == "nk" else N, rng)
    x = rng.standard_normal((1, M, K)).astype(np.float32)
    args, body = _lhs(x, norm, rng, combine)
    args.insert(1, ("w", wt, wv))
    y = f"tensor<{M}x{N}xf32>"
    o = f"tensor<1x{M}x{N}xf32>"
    rhs = "%wt"
    if fmt in _DENSE:
        wf = f"tensor<{N}x{K}xf32>" if layout == "nk" else f"tensor<{K}x{N}xf32>"
        src = "%w"
        if fmt != "f32":
            body.append(f'%wc = "poot.cast"(%w) : ({wt}) -> {wf}')
            src = "%wc"
        if layout == "nk":
            body.append(f'%wt = "poot.transpose"({src}) {{perm = array<i64: 1, 0>}} : '
                        f'({wf}) -> tensor<{K}x{N}xf32>')
        else:
            rhs = src
    else:
        body.append(f'%wd = "poot.dequantize"(%w) : ({wt}) -> tensor<{N}x{K}xf32>')
        body.append(f'%wt = "poot.transpose"(%wd) {{perm = array<i64: 1, 0>}} : '
                    f'(tensor<{N}x{K}xf32>) -> tensor<{K}x{N}xf32>')
    body.append(f'%y = "poot.matmul"(%x2, {rhs}) {{acc = f32}} : (tensor<{M}x{K}xf32>, '
                f'tensor<{K}x{N}xf32>) -> {y}')
    body.append(f'%y3 = "poot.reshape"(%y) : ({y}) -> {o}')
    if epilogue == "none":
        ret = "%y3"
    elif epilogue == "residual":
        args.append(("r", o, rng.standard_normal((1, M, N)).astype(np.float32)))
        body.append(f'%out = "poot.binary"(%r, %y3) {{fn = "add"}} : ({o}, {o}) -> {o}')
        ret = "%out"
    elif epilogue == "silu_up":
        args.append(("up", y, rng.standard_normal((M, N)).astype(np.float32)))
        body += [
            '%one = "poot.constant"() {value = dense<1.0> : tensor<f32>} : () -> tensor<f32>',
            f'%ones = "poot.broadcast"(%one) {{dims = array<i64>}} : (tensor<f32>) -> {o}',
            f'%n = "poot.unary"(%y3) {{fn = "neg"}} : ({o}) -> {o}',
            f'%e = "poot.unary"(%n) {{fn = "exp"}} : ({o}) -> {o}',
            f'%d = "poot.binary"(%e, %ones) {{fn = "add"}} : ({o}, {o}) -> {o}',
            f'%s = "poot.binary"(%ones, %d) {{fn = "div"}} : ({o}, {o}) -> {o}',
            f'%g = "poot.binary"(%y3, %s) {{fn = "mul"}} : ({o}, {o}) -> {o}',
            f'%u3 = "poot.reshape"(%up) : ({y}) -> {o}',
            f'%out = "poot.binary"(%g, %u3) {{fn = "mul"}} : ({o}, {o}) -> {o}']
        ret = "%out"
    else:
        raise ValueError(epilogue)
    rets, rtypes = [ret], [o]
    if probe:     # two more results, as an LM head feeding the sampler has: y and y - y
        body.append(f'%dd = "poot.binary"(%y, %y) {{fn = "sub"}} : ({y}, {y}) -> {y}')
        rets, rtypes = [ret, "%y", "%dd"], [o, y, y]
    return _region_graph(args, body, rets, rtypes)


def _region_graph(args, body, rets, rtypes, kind="matmul"):
    """(graph ``@region`` calling one dispatch ``@gemv_dispatch`` of ``body``, its inputs)."""
    sig = ", ".join(f"%{n}: {t}" for n, t, _ in args)
    types = ", ".join(t for _, t, _ in args)
    names = ", ".join(f"%a{i}" for i in range(len(args)))
    wrap_args = ", ".join(f'%a{i}: {t} {{poot.name = "a{i}"}}' for i, (_, t, _) in
                          enumerate(args))
    rt = ", ".join(rtypes)
    named = ", ".join(f'{t} {{poot.name = "r{j}"}}' for j, t in enumerate(rtypes))
    res = "%r" if len(rets) == 1 else f"%r:{len(rets)}"
    back = "%r" if len(rets) == 1 else ", ".join(f"%r#{j}" for j in range(len(rets)))
    text = (f'func.func @region({wrap_args}) -> ({named}) {{\n'
            f"  {res} = func.call @gemv_dispatch({names}) : ({types}) -> ({rt})\n"
            f"  return {back} : {rt}\n}}\n"
            f"func.func private @gemv_dispatch({sig}) -> ({rt}) attributes "
            f'{{poot.dispatch = {{kind = "{kind}", ops = {len(body)} : i64}}}} {{\n  '
            + "\n  ".join(body) + f"\n  return {', '.join(rets)} : {rt}\n}}\n")
    with make_context(), ir.Location.unknown():
        module = ir.Module.parse(text)
    g = Graph.from_module(module)
    return g, {f"a{i}": v for i, (_, _, v) in enumerate(args)}


def _rhs(fmt: str, w: str, wt: str, N: int, K: int, body: list) -> str:
    """Append the tracer's spelling of ``w`` [N, K] (of MLIR type ``wt``) as a [K, N] f32
    matmul operand to ``body``; returns its SSA name."""
    if fmt in _DENSE:
        src = w
        if fmt != "f32":
            body.append(f'{w}c = "poot.cast"({w}) : ({wt}) -> tensor<{N}x{K}xf32>')
            src = f"{w}c"
    else:
        body.append(f'{w}d = "poot.dequantize"({w}) : ({wt}) -> tensor<{N}x{K}xf32>')
        src = f"{w}d"
    body.append(f'{w}t = "poot.transpose"({src}) {{perm = array<i64: 1, 0>}} : '
                f'(tensor<{N}x{K}xf32>) -> tensor<{K}x{N}xf32>')
    return f"{w}t"


def swiglu_region(fmt: str, M: int, N: int, K: int, norm: str | None = None, seed: int = 0,
                  fmt_up: str | None = None, second_x: bool = False):
    """A dispatch computing ``silu(x @ Wg) * (x @ Wu)`` (x [1, M, K], optionally normed
    first), two matmuls of one x, as :func:`~poot.backends.gpu.merge.fold_regions` leaves a
    gate region folded into the up projection's; (graph, inputs) as :func:`gemv_region`."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, M, K)).astype(np.float32)
    args, body = _lhs(x, norm, rng)
    y, o = f"tensor<{M}x{N}xf32>", f"tensor<1x{M}x{N}xf32>"
    if second_x:          # (a test of refusal: the up projection reads another x)
        args.append(("x1", f"tensor<{M}x{K}xf32>", x[0]))
    for name, f in (("wg", fmt), ("wu", fmt_up or fmt)):
        wt, wv, _ = _weight(f, N, K, rng)
        args.append((name, wt, wv))
        rhs = _rhs(f, f"%{name}", wt, N, K, body)
        lhs = "%x1" if second_x and name == "wu" else "%x2"
        body += [f'%y{name} = "poot.matmul"({lhs}, {rhs}) {{acc = f32}} : '
                 f'(tensor<{M}x{K}xf32>, tensor<{K}x{N}xf32>) -> {y}',
                 f'%z{name} = "poot.reshape"(%y{name}) : ({y}) -> {o}']
    body += [f'%n = "poot.unary"(%zwg) {{fn = "neg"}} : ({o}) -> {o}',
             f'%e = "poot.unary"(%n) {{fn = "exp"}} : ({o}) -> {o}',
             '%one = "poot.constant"() {value = dense<1.0> : tensor<f32>} : () -> tensor<f32>',
             f'%ones = "poot.broadcast"(%one) {{dims = array<i64>}} : (tensor<f32>) -> {o}',
             f'%d = "poot.binary"(%e, %ones) {{fn = "add"}} : ({o}, {o}) -> {o}',
             f'%g = "poot.binary"(%zwg, %d) {{fn = "div"}} : ({o}, {o}) -> {o}',
             f'%out = "poot.binary"(%g, %zwu) {{fn = "mul"}} : ({o}, {o}) -> {o}']
    return _region_graph(args, body, ["%out"], [o])


def _dispatch_fn(g: Graph):
    return next(o.operation for o in g.module.body.operations
                if o.operation.name == "func.func" and
                ir.StringAttr(o.operation.attributes["sym_name"]).value == "gemv_dispatch")


def _caps(sg=32, cores=132, features=("sm_90",)):
    from poot.compiler.target import Capabilities

    return Capabilities(subgroup_size=sg, cores=cores, features=frozenset(features))


# ---- matching (no device) -----------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["f32", "bf16", "f16", "q4_0", "q4_1", "q8_0", "q4_k", "q6_k"])
def test_decode_regions_are_taken(fmt):
    from poot.backends.gpu.strategies.matmul import gemv

    g, _ = gemv_region(fmt, 2, 192, 512, "silu_up")
    fn = _dispatch_fn(g)
    with fn.context, ir.Location.unknown():
        s = gemv(fn, _caps())
    assert s is not None
    (L,) = s.launches
    assert L.block[0] % 32 == 0
    assert L.grid[0] * L.block[0] // 32 >= 192
    assert ("out", 0) in L.args and len(L.args) == 4      # x, w, up, out


def test_prefill_and_unknown_subgroup_are_refused():
    from poot.backends.gpu.strategies.matmul import gemv
    from poot.backends.gpu.strategies.matmul_match import MAX_M, SMALL_N

    g, _ = gemv_region("q4_1", MAX_M + 1, SMALL_N + 1, 64)
    fn = _dispatch_fn(g)
    with fn.context, ir.Location.unknown():
        assert gemv(fn, _caps()) is None
    g, _ = gemv_region("q4_1", 1, 64, 64)
    fn = _dispatch_fn(g)
    with fn.context, ir.Location.unknown():
        assert gemv(fn, _caps(sg=None)) is None
        assert gemv(fn, _caps()) is not None


@pytest.mark.parametrize("fmt,K,N,M", [("bf16", 256, 16, 32), ("f32", 576, 48, 24),
                                       ("q8_0", 256, 64, 16)])
def test_narrow_matmuls_past_max_m_are_gemvs_on_vulkan(vk_device, vk_target, fmt, K, N, M):
    """N <= SMALL_N columns at M <= SMALL_N_MAX_M rows (a rank-16 LoRA shrink at batch 32, an
    MoE router) on a target without tensor cores (the GEMM refuses) take the GEMV (a warp a
    column) and equal the oracle; one more row or column is past the GEMV's shapes."""
    from poot.backends.gpu.strategies.gemm import gemm
    from poot.backends.gpu.strategies.matmul import gemv
    from poot.backends.gpu.strategies.matmul_match import SMALL_N, SMALL_N_MAX_M, gemv_rows

    assert gemv_rows(M, N) and not gemv_rows(SMALL_N_MAX_M + 1, N) and \
        not gemv_rows(M, SMALL_N + 1)
    g, inputs = gemv_region(fmt, M, N, K, "residual", seed=K + N + M)
    fn = _dispatch_fn(g)
    with fn.context, ir.Location.unknown():
        assert gemm(fn, _caps()) is None
        assert gemv(fn, _caps()) is not None
    want = oracle.evaluate(g, inputs)["r0"]
    got = _run(vk_device, vk_target, g, inputs)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL * np.abs(want).max())


def test_unsupported_epilogue_is_refused():
    """A transpose after the matmul reorders elements: not an elementwise epilogue."""
    from poot.backends.gpu.strategies.matmul import gemv

    head = ('func.func @d(%x: tensor<2x64xf32>, %w: tensor<64x64xf32>) -> {rt} {{\n'
            '  %t = "poot.transpose"(%w) {{perm = array<i64: 1, 0>}} : (tensor<64x64xf32>) -> '
            'tensor<64x64xf32>\n'
            '  %y = "poot.matmul"(%x, %t) {{acc = f32}} : (tensor<2x64xf32>, tensor<64x64xf32>)'
            ' -> tensor<2x64xf32>\n')
    tail = ('  %z = "poot.transpose"(%y) {perm = array<i64: 1, 0>} : (tensor<2x64xf32>) -> '
            'tensor<64x2xf32>\n  return %z : tensor<64x2xf32>\n}')
    with make_context(), ir.Location.unknown():
        bad = ir.Module.parse(head.format(rt="tensor<64x2xf32>") + tail)
        assert gemv(bad.body.operations[0].operation, _caps()) is None
        good = ir.Module.parse(head.format(rt="tensor<2x64xf32>") +
                               "  return %y : tensor<2x64xf32>\n}")
        assert gemv(good.body.operations[0].operation, _caps()) is not None


# ---- PTX (no device) ---------------------------------------------------------------------------

def _ptx(fmt, M=1, N=192, K=576, epilogue="none", norm=None):
    from poot.backends.cuda.codegen import ptx_text
    from poot.backends.gpu.plan import plan_program

    g, _ = gemv_region(fmt, M, N, K, epilogue, norm=norm)
    plan = plan_program(SimpleNamespace(graph=g, storage=[]), _caps())
    assert plan.strategies == {"gemv": 1}
    return ptx_text(plan.module)


@pytest.mark.parametrize("fmt,v4", [("bf16", True), ("f32", True), ("f16", True),
                                    ("q4_k", True), ("q4_1", False), ("q8_0", False),
                                    ("q4_0", False), ("q6_k", False)])
def test_ptx_assembles_with_vector_loads(fmt, v4):
    """x rows are read 16 bytes at a time; so are weights whose units are 16-byte aligned
    (dense rows, Q4_K super-blocks): then no scalar global load is left."""
    import re

    from poot.backends.cuda.codegen import ptxas_check

    K = 1536 if fmt in ("q4_k", "q6_k") else 576
    ptx = _ptx(fmt, 2, 192, K)
    loads = re.findall(r"ld\.global\.nc\.(\w+)", ptx)        # read-only path
    assert "v4" in loads and not re.findall(r"ld\.global\.(?!nc)", ptx)
    assert ("b32" not in loads) == v4, loads
    assert "shfl.sync.bfly" in ptx
    ptxas_check(ptx)


# ---- Vulkan vs the oracle -----------------------------------------------------------------------

def _run(vk_device, vk_target, g, inputs, name="r0"):
    from poot.backends.gpu.plan import plan_program
    from poot.backends.vulkan.codegen import codegen_vulkan
    from test_vulkan_kernels import run_artifact

    plan = plan_program(SimpleNamespace(graph=g, storage=[]), vk_target.caps)
    assert plan.strategies == {"gemv": 1}, plan.strategies
    got = run_artifact(vk_device, codegen_vulkan(g, vk_target), inputs)
    return got if name is None else got[name]


def _cases():
    out = []
    for fmt in ("f32", "bf16", "f16", "q4_0", "q4_1", "q8_0", "q4_k", "q6_k"):
        ks = (256, 1536) if fmt in ("q4_k", "q6_k") else (64, 576, 1536)
        if fmt in ("q4_k", "q6_k"):
            ks = ks + (4096,)
        for K in ks:
            for N in (1, 192, 576, 1000):
                for M in (1, 2):
                    out.append((fmt, K, N, M))
    # K = 3584 (a MoE expert's down projection): 448 dense units (or 448 quarter blocks), the
    # unit loop's last iteration not whole: a loop of 4 units then 2 straight-line rounds
    return out + [("bf16", 3584, 1000, 1), ("f16", 3584, 576, 2), ("q4_0", 3584, 192, 2)]


_EPI = ("none", "residual", "silu_up")


@pytest.mark.parametrize("fmt,K,N,M", _cases())
def test_gemv_matches_oracle(vk_device, vk_target, fmt, K, N, M):
    epilogue = _EPI[(K + N + M) % 3]       # every epilogue over every format, spread out
    g, inputs = gemv_region(fmt, M, N, K, epilogue, seed=K * 7 + N + M)
    want = oracle.evaluate(g, inputs)["r0"]
    got = _run(vk_device, vk_target, g, inputs)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL * np.abs(want).max(),
                               err_msg=f"{fmt} K={K} N={N} M={M} {epilogue}")


@pytest.mark.parametrize("epilogue", _EPI)
@pytest.mark.parametrize("fmt", ["q4_1", "bf16"])
def test_each_epilogue(vk_device, vk_target, fmt, epilogue):
    g, inputs = gemv_region(fmt, 2, 192, 576, epilogue, seed=3)
    want = oracle.evaluate(g, inputs)["r0"]
    got = _run(vk_device, vk_target, g, inputs)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL * np.abs(want).max())


@pytest.mark.parametrize("fmt", ["q8_0", "bf16"])
def test_several_results_of_one_matmul(vk_device, vk_target, fmt):
    """An LM head feeding the sampler: the epilogue's result, the raw result and y - y, all
    written by the one kernel."""
    g, inputs = gemv_region(fmt, 1, 1000, 576, "residual", seed=9, probe=True)
    want = oracle.evaluate(g, inputs)
    got = _run(vk_device, vk_target, g, inputs, name=None)
    for k in ("r0", "r1", "r2"):
        w = want[k]
        np.testing.assert_allclose(np.asarray(got[k]).reshape(w.shape), w, rtol=RTOL,
                                   atol=ATOL * max(np.abs(w).max(), 1.0), err_msg=k)


@pytest.mark.parametrize("fmt", ["f32", "bf16", "f16"])
def test_dense_kn_weight(vk_device, vk_target, fmt):
    g, inputs = gemv_region(fmt, 2, 100, 96, "residual", seed=5, layout="kn")
    want = oracle.evaluate(g, inputs)["r0"]
    got = _run(vk_device, vk_target, g, inputs)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL * np.abs(want).max())


# ---- a folded norm in front of the GEMV -----------------------------------------------------

def _norm_cases():
    out = []
    for fmt in ("f32", "bf16", "q4_1", "q8_0", "q4_k"):
        for K in ((256, 1536) if fmt == "q4_k" else (64, 576, 1536)):
            for M in (1, 2):
                for epilogue in ("none", "silu_up" if K == 576 else "residual"):
                    out.append((fmt, K, M, epilogue))
    return out


@pytest.mark.parametrize("fmt,K,M,epilogue", _norm_cases())
def test_rmsnorm_gemv_matches_oracle(vk_device, vk_target, fmt, K, M, epilogue):
    """x = RMSNorm(h) (the norm region folded into the GEMV's): every warp reduces its rows
    itself, then evaluates x's elements in the main loop."""
    N = 100 if K == 64 else 192            # 100: a partial last block of warps
    g, inputs = gemv_region(fmt, M, N, K, epilogue, seed=K + M + N, norm="rmsnorm")
    want = oracle.evaluate(g, inputs)["r0"]
    got = _run(vk_device, vk_target, g, inputs)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL * np.abs(want).max(),
                               err_msg=f"{fmt} K={K} M={M} {epilogue}")


@pytest.mark.parametrize("norm", [None, "rmsnorm", "layernorm"])
@pytest.mark.parametrize("fmt,k", [("bf16", 2), ("q4_1", 8)])
def test_gemv_of_a_moe_combine_matches_oracle(vk_device, vk_target, fmt, k, norm):
    """x = (a norm of) ``x0 + sum_j w[j] * ys[j]``, a MoE layer's top-k combine folded into the
    next projection: the k-term sum over the leading axis is computed per element inside the
    dot (and inside the norm's row reductions), one GEMV kernel."""
    from poot.backends.gpu.plan import plan_program

    g, inputs = gemv_region(fmt, 1, 192, 576, "residual", seed=k, norm=norm, combine=k)
    plan = plan_program(SimpleNamespace(graph=g, storage=[]), vk_target.caps)
    assert plan.strategies == {"gemv": 1}, plan.strategies
    want = oracle.evaluate(g, inputs)["r0"]
    got = _run(vk_device, vk_target, g, inputs)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL * np.abs(want).max(),
                               err_msg=f"{fmt} k={k} {norm}")


@pytest.mark.parametrize("fmt,M", [("q4_1", 1), ("bf16", 2), ("q8_0", 2)])
def test_layernorm_gemv_matches_oracle(vk_device, vk_target, fmt, M):
    """LayerNorm: the variance's operand reads the mean of the same row (two reductions per
    row, in dependency order)."""
    g, inputs = gemv_region(fmt, M, 192, 576, "residual", seed=11, norm="layernorm")
    want = oracle.evaluate(g, inputs)["r0"]
    got = _run(vk_device, vk_target, g, inputs)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL * np.abs(want).max())


@pytest.mark.parametrize("fmt,norm", [("q4_1", "rmsnorm"), ("bf16", "rmsnorm"),
                                      ("q4_k", "rmsnorm"), ("q8_0", "layernorm")])
def test_ptx_assembles_with_norm(fmt, norm, monkeypatch):
    """A folded norm: the row reductions are warp shuffles, and the norm's inputs are read
    through the read-only path like x, 16 bytes at a time in the main loop. (One warp per
    column: split-K, which a narrow bf16 GEMV would get, refuses a folded norm.)"""
    import re

    from poot.backends.gpu.strategies import matmul

    monkeypatch.setitem(matmul.TUNING, "ksplit", 1)

    from poot.backends.cuda.codegen import ptxas_check

    def scalar_loads(ptx):
        return len(re.findall(r"ld\.global\.nc\.(?!v4)", ptx))

    ptx = _ptx(fmt, 2, 192, 1536, "residual", norm=norm)
    plain = _ptx(fmt, 2, 192, 1536, "residual")
    nred = 1 if norm == "rmsnorm" else 2
    extra = scalar_loads(ptx) - scalar_loads(plain)
    if norm == "rmsnorm":
        # deferred: the sum of squares accumulates in the main loop from the 16-byte loads of
        # h that the dot reads; the row scale is read once per row in the epilogue
        assert extra <= 2 * 2, extra
    else:
        # beyond the plain-x kernel's, only the row reductions' own loads (their lane loops,
        # each lane reading 1536 / 32 = 48 elements per row in independent chains: ptxas may
        # unroll them), nothing per element of the main loop
        assert 2 * nred <= extra <= 2 * nred * (1536 // 32), extra
    assert not re.findall(r"ld\.global\.(?!nc)", ptx[:ptx.index("shfl")])
    assert ptx.count("shfl.sync.bfly") == 2 * 5 * (1 if norm == "rmsnorm" else 2) + 2 * 5
    ptxas_check(ptx)


def test_norm_is_folded_only_into_small_gemvs():
    """The cost rule (PROLOGUE_MAX_EXTRA_BYTES) for a norm that must be reduced before the
    main loop (LayerNorm): every warp recomputes it, so a GEMV whose N * K * 8 bytes of extra
    reads pass the limit refuses it (the norm keeps its own launch) while the same norm over
    a small GEMV is taken. A deferred RMSNorm (its sum accumulates in the main loop, its scale
    applies after: no prologue) is held to the same rule, by measurement (module doc)."""
    from poot.backends.gpu.strategies.matmul import PROLOGUE_MAX_EXTRA_BYTES, gemv
    from poot.backends.gpu.strategies.matmul_match import match

    small, _ = gemv_region("bf16", 1, 192, 576, norm="layernorm")
    n_big = PROLOGUE_MAX_EXTRA_BYTES // (576 * 8) + 32
    big, _ = gemv_region("bf16", 1, n_big, 576, norm="layernorm")
    rms, _ = gemv_region("bf16", 1, n_big, 576, norm="rmsnorm")
    plain, _ = gemv_region("bf16", 1, n_big, 576)
    with small.context:
        assert gemv(_dispatch_fn(small), _caps()) is not None
        assert match(_dispatch_fn(small)).deferred is None
    with big.context:
        assert gemv(_dispatch_fn(big), _caps()) is None
    with rms.context:
        assert match(_dispatch_fn(rms)).deferred is not None
        assert gemv(_dispatch_fn(rms), _caps()) is None
    with plain.context:
        assert gemv(_dispatch_fn(plain), _caps()) is not None


@pytest.mark.parametrize("features", [(), ("sm_90",)], ids=["spirv", "sm_90"])
def test_norm_prologue_loops_are_bounded(features):
    """PROLOGUE_MAX_LOOPS: a LayerNorm (two reductions a row, not deferred) folded into a
    narrow GEMV (N <= SMALL_N, rows up to SMALL_N_MAX_M) is taken for a batch of MAX_M rows
    (2 * MAX_M loops a warp) and refused for one row more, whatever the target: past it,
    each warp would run a loop over K per row and reduction before its dot."""
    from poot.backends.gpu.strategies.matmul import PROLOGUE_MAX_LOOPS, gemv
    from poot.backends.gpu.strategies.matmul_match import MAX_M, match

    caps = _caps(features=features)
    for M, taken in ((MAX_M, True), (MAX_M + 1, False), (32, False)):
        g, _ = gemv_region("q4_1", M, 48, 256, norm="layernorm")
        with g.context:
            m = match(_dispatch_fn(g))
            assert m is not None and m.deferred is None
            assert (len(m.prologue) <= PROLOGUE_MAX_LOOPS) == taken, len(m.prologue)
            assert (gemv(_dispatch_fn(g), caps) is not None) == taken, M


@pytest.mark.parametrize("fmt,K,N,M,epilogue,norm", [
    ("bf16", 2048, 200, 1, "residual", None), ("q4_1", 4096, 96, 2, "silu_up", None),
    ("f16", 1024, 33, 1, "none", None), ("bf16", 2048, 200, 2, "residual", "rmsnorm"),
    ("q4_k", 4096, 40, 1, "none", "rmsnorm")])
def test_split_k_gemv_matches_oracle(vk_device, vk_target, monkeypatch, fmt, K, N, M, epilogue,
                                     norm):
    """Split-K inside a block (warps of one column each take a slice of K, the parts meet in
    workgroup memory behind a barrier): same results as the oracle, ragged N included."""
    from poot.backends.gpu.strategies import matmul

    monkeypatch.setitem(matmul.TUNING, "warps", 8)
    monkeypatch.setitem(matmul.TUNING, "ksplit", 4)
    g, inputs = gemv_region(fmt, M, N, K, epilogue, seed=K + N, norm=norm)
    fn = next(o.operation for o in g.module.body.operations
              if o.operation.name == "func.func" and "gemv_dispatch" in str(o.operation.name)
              or "gemv_dispatch" in str(o.operation.attributes["sym_name"]))
    syn = matmul.gemv(fn, vk_target.caps)
    assert syn.launches[0].grid == (-(-N // 2), 1, 1)      # 2 columns x 4 parts per block
    assert "gpu.barrier" in syn.text
    want = oracle.evaluate(g, inputs)["r0"]
    got = _run(vk_device, vk_target, g, inputs)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL * np.abs(want).max(),
                               err_msg=f"{fmt} K={K} N={N} M={M} {epilogue}")


def test_split_k_rule_and_norm_refusal():
    """ksplit_for: narrow projections get several warps per column, wide ones one; a GEMV
    that would split refuses a folded LayerNorm (it keeps its own launch) and takes a
    deferred RMSNorm (its sum of squares splits along K like the dot)."""
    from poot.backends.gpu.strategies.matmul import gemv, ksplit_for

    caps = _caps()
    assert ksplit_for(1024, 4096 * 2 // 16, 32, caps) == 8        # Llama-3-8B k/v
    assert ksplit_for(4096, 4096 * 2 // 16, 32, caps) == 2        # its q/o
    assert ksplit_for(14336, 4096 * 2 // 16, 32, caps) == 1       # its gate/up
    assert ksplit_for(576, 576 // 32, 32, caps) == 1              # SmolLM2: short rows
    g, _ = gemv_region("bf16", 1, 512, 2048, "none", norm="layernorm")
    assert gemv(_dispatch_fn(g), caps) is None
    g, _ = gemv_region("bf16", 1, 512, 2048, "none", norm="rmsnorm")
    syn = gemv(_dispatch_fn(g), caps)
    assert syn is not None and syn.launches[0].grid == (512 // 2, 1, 1)
    g, _ = gemv_region("bf16", 1, 512, 2048, "none")
    syn = gemv(_dispatch_fn(g), caps)
    assert syn is not None and syn.launches[0].grid == (512 // 2, 1, 1)   # 4 warps a column


# ---- two matmuls of one x (the SwiGLU gate and up projections) -----------------------------

@pytest.mark.parametrize("fmt,K,N,M,norm,knob", [("q4_1", 576, 1536, 1, "rmsnorm", "lanes"),
                                                 ("bf16", 576, 200, 2, None, None),
                                                 ("q4_k", 256, 100, 1, "rmsnorm", None),
                                                 ("q8_0", 1536, 96, 2, None, "lanes"),
                                                 ("f16", 2048, 64, 1, None, "ksplit"),
                                                 ("bf16", 2048, 40, 1, "rmsnorm", "ksplit")])
def test_swiglu_gemv_matches_oracle(vk_device, vk_target, monkeypatch, fmt, K, N, M, norm,
                                    knob):
    """One kernel computes both matmuls of x (gate and up columns side by side, x's elements
    read once per unit for both) and the SwiGLU epilogue; with a deferred norm, two columns a
    subgroup (``lanes``), split-K over 4 warps a column (``ksplit``) and a ragged N."""
    from poot.backends.gpu.strategies import matmul

    sg = vk_target.caps.subgroup_size
    per_block = None
    if knob == "lanes":
        monkeypatch.setitem(matmul.TUNING, "lanes", sg // 2)
        monkeypatch.setitem(matmul.TUNING, "warps", 4)
        per_block = 4 * 2                     # 4 subgroups of 2 columns
    elif knob == "ksplit":
        monkeypatch.setitem(matmul.TUNING, "warps", 8)
        monkeypatch.setitem(matmul.TUNING, "ksplit", 4)
        per_block = 2                         # 2 columns x 4 parts
    g, inputs = swiglu_region(fmt, M, N, K, norm=norm, seed=K + N + M)
    with g.context:
        syn = matmul.gemv(_dispatch_fn(g), vk_target.caps)
    assert syn is not None and len(syn.launches) == 1
    if per_block:
        assert syn.launches[0].grid == (-(-N // per_block), 1, 1), syn.launches[0].grid
    assert sum(a == ("arg", i) for a in syn.launches[0].args for i in (len(inputs) - 2,
                                                                       len(inputs) - 1)) == 2
    want = oracle.evaluate(g, inputs)["r0"]
    got = _run(vk_device, vk_target, g, inputs)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL * np.abs(want).max(),
                               err_msg=f"{fmt} K={K} N={N} M={M} {norm}")


def test_matmuls_of_different_x_or_formats_are_refused():
    """Only matmuls of the same x, with weights of one storage format, share a kernel."""
    from poot.backends.gpu.strategies.matmul import gemv

    for kw, ok in (({}, True), ({"fmt_up": "q8_0"}, False), ({"second_x": True}, False)):
        g, _ = swiglu_region("q4_1", 1, 64, 256, **kw)
        with g.context:
            assert (gemv(_dispatch_fn(g), _caps()) is not None) == ok, kw


def _swiglu_step(fmt: str, M: int, N: int, K: int, seed: int = 0):
    """A step of three regions as the fusion pass outlines a SwiGLU MLP's first half: an
    RMSNorm region, the gate projection's region, and the up projection's region whose
    epilogue reads the gate's result (silu(gate) * up)."""
    rng = np.random.default_rng(seed)
    X, Y, O = f"tensor<1x{M}x{K}xf32>", f"tensor<{M}x{N}xf32>", f"tensor<1x{M}x{N}xf32>"
    nargs, nbody = _norm("rmsnorm", M, K, rng)
    wg_t, wg, _ = _weight(fmt, N, K, rng)
    wu_t, wu, _ = _weight(fmt, N, K, rng)
    G = nargs[0][1]

    def mm(w, wt, extra=()):
        body = [f'%x2 = "poot.reshape"(%x) : ({X}) -> tensor<{M}x{K}xf32>']
        rhs = _rhs(fmt, w, wt, N, K, body)
        body += [f'%y = "poot.matmul"(%x2, {rhs}) {{acc = f32}} : (tensor<{M}x{K}xf32>, '
                 f'tensor<{K}x{N}xf32>) -> {Y}', f'%y3 = "poot.reshape"(%y) : ({Y}) -> {O}']
        return body + list(extra)

    silu_up = [f'%n = "poot.unary"(%gate) {{fn = "neg"}} : ({O}) -> {O}',
               f'%e = "poot.unary"(%n) {{fn = "exp"}} : ({O}) -> {O}',
               '%one = "poot.constant"() {value = dense<1.0> : tensor<f32>} : () -> '
               'tensor<f32>',
               f'%ones = "poot.broadcast"(%one) {{dims = array<i64>}} : (tensor<f32>) -> {O}',
               f'%d = "poot.binary"(%e, %ones) {{fn = "add"}} : ({O}, {O}) -> {O}',
               f'%s = "poot.binary"(%gate, %d) {{fn = "div"}} : ({O}, {O}) -> {O}',
               f'%out = "poot.binary"(%s, %y3) {{fn = "mul"}} : ({O}, {O}) -> {O}']

    def fn(name, kind, sig, rt, body, ret):
        return (f"func.func private @{name}({sig}) -> {rt} attributes "
                f'{{poot.dispatch = {{kind = "{kind}", ops = {len(body)} : i64}}}} {{\n  '
                + "\n  ".join(body) + f"\n  return {ret} : {rt}\n}}\n")

    text = (f'func.func @region(%a0: {X} {{poot.name = "a0"}}, %a1: {G} {{poot.name = "a1"}}, '
            f'%a2: {wg_t} {{poot.name = "a2"}}, %a3: {wu_t} {{poot.name = "a3"}}) -> '
            f'({O} {{poot.name = "r0"}}) {{\n'
            f"  %xn = func.call @norm(%a0, %a1) : ({X}, {G}) -> {X}\n"
            f"  %g = func.call @gate(%xn, %a2) : ({X}, {wg_t}) -> {O}\n"
            f"  %r = func.call @up(%xn, %a3, %g) : ({X}, {wu_t}, {O}) -> {O}\n"
            f"  return %r : {O}\n}}\n"
            + fn("norm", "reduction", f"%x: {X}, %ng: {G}", X, nbody, "%xn")
            + fn("gate", "matmul", f"%x: {X}, %wg: {wg_t}", O, mm("%wg", wg_t), "%y3")
            + fn("up", "matmul", f"%x: {X}, %wu: {wu_t}, %gate: {O}", O,
                 mm("%wu", wu_t, silu_up), "%out"))
    with make_context(), ir.Location.unknown():
        module = ir.Module.parse(text)
    x = rng.standard_normal((1, M, K)).astype(np.float32)
    return Graph.from_module(module), {"a0": x, "a1": nargs[0][2], "a2": wg, "a3": wu}


@pytest.mark.parametrize("fmt,K,N", [("q4_1", 576, 1536), ("bf16", 256, 96)])
def test_gate_region_folds_into_up_projection(vk_device, vk_target, fmt, K, N):
    """Planning folds the norm into both projections, then the gate's matmul region into the
    up projection's (one x after CSE): the three regions run as ONE GEMV kernel, and the
    step still matches the oracle."""
    from poot.backends.gpu.plan import plan_program
    from poot.backends.vulkan.codegen import codegen_vulkan
    from test_vulkan_kernels import run_artifact

    g, inputs = _swiglu_step(fmt, 1, N, K, seed=N)
    want = oracle.evaluate(g, inputs)["r0"]
    plan = plan_program(SimpleNamespace(graph=g, storage=[]), vk_target.caps)
    assert plan.strategies == {"gemv": 1}, plan.strategies
    g2, _ = _swiglu_step(fmt, 1, N, K, seed=N)
    got = run_artifact(vk_device, codegen_vulkan(g2, vk_target), inputs)["r0"]
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL * np.abs(want).max())


@pytest.mark.parametrize("fmt", ["q4_1", "bf16"])
def test_ptx_assembles_for_swiglu_and_short_rows(fmt, monkeypatch):
    """The two-weight kernel of a SwiGLU step (norm folded) and a short-row LM head with
    several columns a warp (the ``lanes`` knob: a 3-step butterfly) lower to PTX that ptxas
    assembles."""
    import re

    from poot.backends.gpu.strategies import matmul

    from poot.backends.cuda.codegen import ptx_text, ptxas_check
    from poot.backends.gpu.plan import plan_program

    g, _ = _swiglu_step(fmt, 1, 1536, 576)
    plan = plan_program(SimpleNamespace(graph=g, storage=[]), _caps())
    assert plan.strategies == {"gemv": 1}
    ptxas_check(ptx_text(plan.module))
    monkeypatch.setitem(matmul.TUNING, "lanes", 8)
    g, _ = gemv_region("q8_0", 1, 4099, 576, probe=True)
    plan = plan_program(SimpleNamespace(graph=g, storage=[]), _caps())
    ptx = ptx_text(plan.module)
    # 72 quarter-block units a column: 8 lanes of 9 units, 4 columns a warp (offsets 4, 2, 1)
    assert sorted(set(re.findall(r"shfl\.sync\.bfly\.b32\s+\S+, \S+, (\d+)", ptx))) == \
        ["1", "2", "4"], re.findall(r"shfl\.sync\.bfly[^\n]*", ptx)[:4]
    ptxas_check(ptx)


def _knob_region(kind: str, fmt: str, M: int, N: int, K: int):
    """A GEMV region for the knob tests: ``swiglu`` (a folded RMSNorm feeding gate and up),
    ``rmsnorm`` (a folded RMSNorm, SiLU-times-argument epilogue) or an epilogue name."""
    if kind == "swiglu":
        return swiglu_region(fmt, M, N, K, norm="rmsnorm", seed=N)
    if kind == "rmsnorm":
        return gemv_region(fmt, M, N, K, "silu_up", seed=N, norm="rmsnorm")
    return gemv_region(fmt, M, N, K, kind, seed=N)


@pytest.mark.parametrize("lanes,fmt,K,N,M,kind", [(8, "q4_1", 576, 1000, 1, "residual"),
                                                  (4, "q8_0", 576, 33, 2, "rmsnorm"),
                                                  (1, "bf16", 64, 100, 1, "none"),
                                                  (8, "q4_1", 576, 200, 1, "swiglu")])
def test_several_columns_a_warp_match_oracle(vk_device, vk_target, monkeypatch, lanes, fmt, K,
                                             N, M, kind):
    """The ``lanes`` knob: ``32 / lanes`` columns share a warp (lane groups, a shorter
    butterfly, units past the row's end clamped and dropped, the columns past N computed and
    not stored): same results as the oracle."""
    from poot.backends.gpu.strategies import matmul

    sg = vk_target.caps.subgroup_size
    if lanes > sg:
        pytest.skip(f"this Vulkan device's subgroups have {sg} lanes, fewer than {lanes}")
    monkeypatch.setitem(matmul.TUNING, "lanes", lanes)
    g, inputs = _knob_region(kind, fmt, M, N, K)
    with g.context:
        syn = matmul.gemv(_dispatch_fn(g), vk_target.caps)
    L = syn.launches[0]
    assert L.grid[0] * L.block[0] // lanes >= N > (L.grid[0] - 1) * L.block[0] // lanes
    want = oracle.evaluate(g, inputs)["r0"]
    got = _run(vk_device, vk_target, g, inputs)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL * np.abs(want).max(),
                               err_msg=f"lanes={lanes} {fmt} K={K} N={N} M={M} {kind}")


@pytest.mark.parametrize("parts,fmt,K,N,M,kind", [(1, "q4_0", 576, 70, 1, "none"),
                                                  (2, "q4_0", 96, 33, 2, "residual"),
                                                  (4, "q4_0", 1536, 40, 1, "none"),
                                                  (1, "q4_1", 576, 70, 2, "rmsnorm"),
                                                  (2, "q4_1", 576, 50, 1, "swiglu"),
                                                  (4, "q4_1", 64, 200, 3, "residual"),
                                                  (1, "q8_0", 96, 40, 1, "residual"),
                                                  (2, "q8_0", 576, 33, 1, "rmsnorm"),
                                                  (4, "q8_0", 576, 300, 2, "none")])
def test_block_parts_match_oracle(vk_device, vk_target, monkeypatch, parts, fmt, K, N, M,
                                  kind):
    """The ``parts`` knob: ``parts`` lanes share a Q4_0/Q4_1/Q8_0 block (units of ``32 /
    parts`` weights: the low or high nibbles of part of a 4-bit block's bytes, a slice of a
    Q8_0 block's), with a folded norm (deferred: its sums over the same units) and SwiGLU:
    same results as the oracle; the unit count follows."""
    from poot.backends.gpu.strategies import matmul
    from poot.backends.gpu.strategies.matmul_match import match

    monkeypatch.setitem(matmul.TUNING, "parts", parts)
    g, inputs = _knob_region(kind, fmt, M, N, K)
    with g.context:
        m = match(_dispatch_fn(g), max_matmuls=matmul.MAX_MATMULS)
        assert matmul._Kernel(m, 8, 1, False).units() == K // 32 * parts
    want = oracle.evaluate(g, inputs)["r0"]
    got = _run(vk_device, vk_target, g, inputs)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL * np.abs(want).max(),
                               err_msg=f"parts={parts} {fmt} K={K} N={N} M={M} {kind}")


def test_weights_are_prefetched_before_the_grid_dependency_wait(monkeypatch):
    """sm_90: a GEMV warms L2 with its block's weight rows, then waits on its predecessor
    grid; the PDL pass keeps that wait and puts the trigger right after it, and x (the
    predecessor's result) is read only after the wait. ``POOT_GPU_PREFETCH=0``: no prefetch,
    the wait at the top as for any kernel."""
    import re

    from poot.backends.cuda.codegen import add_grid_dependency_control, ptx_text, ptxas_check
    from poot.backends.gpu.plan import plan_program
    from poot.backends.gpu.strategies import matmul

    def ptx_of():
        g, _ = gemv_region("q4_1", 1, 1000, 576, "residual")
        plan = plan_program(SimpleNamespace(graph=g, storage=[]), _caps())
        assert add_grid_dependency_control(plan.module) == 1
        return ptx_text(plan.module)

    ptx = ptx_of()
    ptxas_check(ptx)
    body = ptx[ptx.index(".entry"):]
    wait, trig = body.index("griddepcontrol.wait"), body.index("griddepcontrol.launch_dependents")
    assert body.count("griddepcontrol.wait") == 1 and body.count("launch_dependents") == 1
    assert 0 < body.index("prefetch.global.L2") < wait < trig
    # every load comes after the wait (the weights are only prefetched before it)
    assert not re.findall(r"ld\.global", body[:wait])
    monkeypatch.setattr(matmul, "PREFETCH", False)
    ptx = ptx_of()
    body = ptx[ptx.index(".entry"):]
    assert "prefetch.global" not in body
    assert body.index("griddepcontrol.wait") < body.index("launch_dependents") < \
        body.index("ld.global")


def _pdl_ops(text: str) -> list:
    """The kernel of ``text`` after the PDL pass: [(block path, op names)] of its body and of
    each top-level ``scf.if``'s blocks."""
    from mlir import ir as _ir

    from poot.backends.cuda.codegen import add_grid_dependency_control

    ctx = _ir.Context()
    ctx.allow_unregistered_dialects = True
    with ctx:
        m = _ir.Module.parse(text)
        add_grid_dependency_control(m)
        f = m.body.operations[0].regions[0].blocks[0].operations[0]
        top = [o.operation for o in f.regions[0].blocks[0].operations]
        out = [("top", [o.name for o in top])]
        for i, o in enumerate(o for o in top if o.name == "scf.if"):
            for r, region in enumerate(o.regions):
                for blk in region.blocks:
                    out.append((f"if{i}.{r}", [x.operation.name for x in blk.operations]))
    return out


def test_member_branches_wait_in_place():
    """A horizontally fused kernel (index arithmetic and one branch per member at its top
    level) waits in each branch: a member's own wait after its prefetch is kept and
    triggers right after; a branch without one waits first; nothing waits at the top. A
    kernel that touches memory outside its branches gets its wait at the top."""
    W = "nvvm.griddepcontrol"
    branches = """gpu.module @m {
  gpu.func @k(%o: memref<4xf32>, %c: i1, %d: i1) kernel {
    %i = gpu.block_id x
    scf.if %c {
      %p = arith.constant 0 : index
      nvvm.griddepcontrol wait
      %v = memref.load %o[%p] : memref<4xf32>
    }
    scf.if %d {
      %f = arith.constant 1.0 : f32
      memref.store %f, %o[%i] : memref<4xf32>
    }
    gpu.return
  }
}"""
    got = dict(_pdl_ops(branches))
    assert W not in got["top"], got
    assert got["if0.0"][:4] == ["arith.constant", W, W, "memref.load"], got
    assert got["if1.0"][:3] == [W, W, "arith.constant"], got
    flat = branches.replace("    gpu.return", "    %g = arith.constant 2.0 : f32\n"
                            "    memref.store %g, %o[%i] : memref<4xf32>\n    gpu.return")
    got = dict(_pdl_ops(flat))
    assert got["top"][:2] == [W, W], got
    assert got["if1.0"][0] != W, got


def test_only_small_gemvs_prefetch():
    """The prefetch cost rule (PREFETCH_MAX_BYTES): a bandwidth-bound GEMV does not
    prefetch (its wait stays at the top, added by the PDL pass)."""
    from poot.backends.gpu.strategies.matmul import PREFETCH_MAX_BYTES, gemv

    big_n = PREFETCH_MAX_BYTES // (576 * 2) + 64
    for N, want in ((1000, True), (big_n, False)):
        g, _ = gemv_region("bf16", 1, N, 576)
        with g.context:
            syn = gemv(_dispatch_fn(g), _caps())
        assert ("prefetch.global.L2" in syn.text) == want, N
        assert ("griddepcontrol" in syn.text) == want, N


def test_norm_over_part_of_the_row_is_not_deferred(vk_device, vk_target):
    """A sum over only part of x's row (here its first half) is not the dot's k range: the
    norm is not deferred (the per-warp prologue computes it), and the result still matches
    the oracle."""
    from poot.backends.gpu.strategies.matmul_match import match

    M, N, K = 1, 96, 256
    g, inputs = gemv_region("bf16", M, N, K, "none", seed=2, norm="rmsnorm")
    t, h = f"tensor<1x{M}x{K}xf32>", f"tensor<1x{M}x{K // 2}xf32>"
    src = str(g.module).split("\n")
    i = next(j for j, ln in enumerate(src) if '"poot.reduce"' in ln)
    ln = src[i]
    operand = ln.split('"poot.reduce"(')[1].split(")")[0]
    src[i:i] = [f'    %half = "poot.slice"({operand}) {{limit = array<i64: 1, {M}, {K // 2}>, '
                f'start = array<i64: 0, 0, 0>, stride = array<i64: 1, 1, 1>}} : ({t}) -> {h}']
    src[i + 1] = ln.replace(f'"poot.reduce"({operand})', '"poot.reduce"(%half)') \
        .replace(f"({t}) -> tensor<1x{M}xf32>", f"({h}) -> tensor<1x{M}xf32>")
    with make_context(), ir.Location.unknown():
        g2 = Graph.from_module(ir.Module.parse("\n".join(src)))
    with g2.context:
        m = match(_dispatch_fn(g2))
    assert m is not None and m.prologue and m.deferred is None
    want = oracle.evaluate(g2, inputs)["r0"]
    got = _run(vk_device, vk_target, g2, inputs)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL * np.abs(want).max())


def test_matmul_folded_into_an_elementwise_region_is_not_duplicated(vk_target):
    """y = x @ W feeds one elementwise region whose result two regions read: the matmul
    folds into that region (one GEMV with its epilogue), and the merged region, holding a
    matmul, is not folded again into both readers (W would stream twice)."""
    from poot.backends.gpu.plan import plan_program

    K, N = 256, 64
    X, Y = f"tensor<1x{K}xf32>", f"tensor<1x{N}xf32>"
    W = f"tensor<{N}x{K}xf32>"

    def fn(name, kind, sig, body, ret):
        return (f"func.func private @{name}({sig}) -> {Y} attributes "
                f'{{poot.dispatch = {{kind = "{kind}", ops = {len(body)} : i64}}}} {{\n  '
                + "\n  ".join(body) + f"\n  return {ret} : {Y}\n}}\n")

    mm = [f'%t = "poot.transpose"(%w) {{perm = array<i64: 1, 0>}} : ({W}) -> '
          f'tensor<{K}x{N}xf32>',
          f'%y = "poot.matmul"(%x, %t) {{acc = f32}} : ({X}, tensor<{K}x{N}xf32>) -> {Y}']
    text = (f'func.func @region(%a0: {X} {{poot.name = "a0"}}, %a1: {W} {{poot.name = "a1"}})'
            f' -> ({Y} {{poot.name = "r0"}}, {Y} {{poot.name = "r1"}}) {{\n'
            f"  %y = func.call @mm(%a0, %a1) : ({X}, {W}) -> {Y}\n"
            f"  %e = func.call @th(%y) : ({Y}) -> {Y}\n"
            f"  %r0 = func.call @ex(%e) : ({Y}) -> {Y}\n"
            f"  %r1 = func.call @ng(%e) : ({Y}) -> {Y}\n"
            f"  return %r0, %r1 : {Y}, {Y}\n}}\n"
            + fn("mm", "matmul", f"%x: {X}, %w: {W}", mm, "%y")
            + fn("th", "elementwise", f"%v: {Y}",
                 [f'%o = "poot.unary"(%v) {{fn = "tanh"}} : ({Y}) -> {Y}'], "%o")
            + fn("ex", "elementwise", f"%v: {Y}",
                 [f'%o = "poot.unary"(%v) {{fn = "exp"}} : ({Y}) -> {Y}'], "%o")
            + fn("ng", "elementwise", f"%v: {Y}",
                 [f'%o = "poot.unary"(%v) {{fn = "neg"}} : ({Y}) -> {Y}'], "%o"))
    with make_context(), ir.Location.unknown():
        g = Graph.from_module(ir.Module.parse(text))
    plan = plan_program(SimpleNamespace(graph=g, storage=[]), vk_target.caps)
    matmuls = sum(str(o).count('"poot.matmul"') + str(o).count("poot.matmul ")
                  for o in g.module.body.operations
                  if o.operation.name == "func.func" and o.operation != g.func)
    assert matmuls == 1, plan.strategies
    assert plan.strategies.get("gemv") == 1, plan.strategies
