"""The ``pointwise`` GPU strategy (and the scalar emitter under it): small elementwise-class
regions, each compiled alone to ONE kernel, run on a real Vulkan device (lavapipe in CI)
against the numpy oracle, and lowered to PTX that ``ptxas`` assembles.

The helpers here (``region``, ``run_region``, ``plan_of``, ``ptx_of``) are shared with
``test_gpu_rowreduce.py``."""

from __future__ import annotations

from types import SimpleNamespace

import ml_dtypes
import numpy as np
import pytest
pytest.importorskip("mlir.ir", reason="the MLIR wheels (xtc-mlir-python-bindings) are not "
                    "installed here: this module compiles kernels")



# ---- helpers ---------------------------------------------------------------------------------

def region(args: list[str], results: list[str], body: str):
    """A graph ``@region(a0, ...) -> (r0, ...)`` calling ``@d``, the dispatch function whose
    arguments are ``%arg0..`` of types ``args`` and whose body is ``body`` (poot ops, ending
    with its ``return``)."""
    from mlir import ir

    from poot.dialects import make_context
    from poot.graph.builder import Graph

    sig = ", ".join(f'%a{i}: {t} {{poot.name = "a{i}"}}' for i, t in enumerate(args))
    res = ", ".join(f'{t} {{poot.name = "r{j}"}}' for j, t in enumerate(results))
    names = ", ".join(f"%a{i}" for i in range(len(args)))
    n = len(results)
    head = f"%r:{n}" if n > 1 else "%r"
    rets = ", ".join(f"%r#{j}" for j in range(n)) if n > 1 else "%r"
    dsig = ", ".join(f"%arg{i}: {t}" for i, t in enumerate(args))
    text = (f"func.func @region({sig}) -> ({res}) {{\n"
            f"  {head} = func.call @d({names}) : ({', '.join(args)}) -> ({', '.join(results)})\n"
            f"  return {rets} : {', '.join(results)}\n}}\n"
            f"func.func private @d({dsig}) -> ({', '.join(results)}) {{\n{body}\n}}\n")
    with make_context() as ctx, ir.Location.unknown():
        module = ir.Module.parse(text)
        module.operation.verify()
    g = Graph.from_module(module)
    g._ctx = ctx        # keep the context alive with the graph
    return g


def _caps(sg):
    from poot.backends.cuda.codegen import cuda_target

    return cuda_target(subgroup_size=sg).caps


def plan_of(g, caps):
    """The shared GPU plan of a one-region graph."""
    from poot.backends.gpu.plan import plan_program

    return plan_program(SimpleNamespace(graph=g, storage=[]), caps)


def strategies_of(g, caps) -> dict:
    return plan_of(g, caps).strategies


def ptx_of(g, caps=None) -> str:
    """PTX of the region's kernels, assembled by ptxas where one is installed."""
    from poot.backends.cuda.codegen import ptx_text, ptxas_check

    plan = plan_of(g, caps or _caps(32))
    ptx = ptx_text(plan.module)
    ptxas_check(ptx)
    return ptx




def run_region(vk, g, inputs: dict) -> tuple[dict, dict]:
    """Compile ``g`` for the Vulkan device, run it once; (outputs by name, plan strategies)."""
    from poot.backends.vulkan.codegen import codegen_vulkan

    dev, target = vk
    art = codegen_vulkan(g, target)
    k = dev.load(art)
    bufs = []
    for a in k.args:
        b = dev.alloc(a.type)
        if a.role == "input":
            dev.upload(b, inputs[a.name])
        bufs.append(b)
    rec = dev.record(k, bufs)
    dev.replay(rec)
    dev.synchronize()
    got = {a.name: dev.download(b) for a, b in zip(k.args, bufs) if a.role == "output"}
    return got, strategies_of(g, target.caps)


def check(vk, g, inputs, rtol=1e-5, atol=1e-5, strategy="pointwise", launches=1):
    from poot import oracle

    want = oracle.evaluate(g, inputs)
    got, strategies = run_region(vk, g, inputs)
    assert strategies == {strategy: launches}, strategies
    for k, w in want.items():
        gk = got[k]
        if w.dtype.itemsize == 2 and gk.dtype == np.uint16:     # f16/bf16 come back as words
            gk = gk.view(w.dtype)
        gk = np.asarray(gk).reshape(w.shape)
        if w.dtype.kind in "biu":
            np.testing.assert_array_equal(gk.astype(w.dtype), w, err_msg=k)
        else:
            np.testing.assert_allclose(gk.astype(np.float32), w.astype(np.float32), rtol=rtol,
                                       atol=atol, err_msg=k)
    return got


NP = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16, "i32": np.int32,
      "i64": np.int64}


def rand(rng, shape, dt, lo=-2.0, hi=2.0):
    if dt in ("i32", "i64"):
        return rng.integers(-50, 50, size=shape).astype(NP[dt])
    if dt == "i1":
        return rng.integers(0, 2, size=shape).astype(bool)
    return rng.uniform(lo, hi, size=shape).astype(NP[dt])


def rope_body(shape, dt: str, out: str) -> str:
    """The body of a RoPE dispatch (interleaved pairs) over ``%arg0`` of ``shape`` [a, b, h, d]
    in ``dt`` with the cos/sin tables ``%arg1``/``%arg2`` [a, b, h, d/2], ending in a
    ``return`` of type ``out``: strided slices, products, a concat of two unit-axis reshapes,
    a reshape back (as the tracer spells it)."""
    a, b, h, d = shape
    x, half = f"tensor<{a}x{b}x{h}x{d}x{dt}>", f"tensor<{a}x{b}x{h}x{d // 2}x{dt}>"
    h5 = f"tensor<{a}x{b}x{h}x{d // 2}x1x{dt}>"
    two = f"tensor<{a}x{b}x{h}x{d // 2}x2x{dt}>"
    return f"""
  %0 = "poot.slice"(%arg0) {{limit = array<i64: {a}, {b}, {h}, {d}>, start = array<i64: 0, 0, 0, 0>, stride = array<i64: 1, 1, 1, 2>}} : ({x}) -> {half}
  %1 = "poot.slice"(%arg0) {{limit = array<i64: {a}, {b}, {h}, {d}>, start = array<i64: 0, 0, 0, 1>, stride = array<i64: 1, 1, 1, 2>}} : ({x}) -> {half}
  %2 = "poot.binary"(%0, %arg1) {{fn = "mul"}} : ({half}, {half}) -> {half}
  %3 = "poot.binary"(%1, %arg2) {{fn = "mul"}} : ({half}, {half}) -> {half}
  %4 = "poot.binary"(%2, %3) {{fn = "sub"}} : ({half}, {half}) -> {half}
  %5 = "poot.reshape"(%4) : ({half}) -> {h5}
  %6 = "poot.binary"(%1, %arg1) {{fn = "mul"}} : ({half}, {half}) -> {half}
  %7 = "poot.binary"(%0, %arg2) {{fn = "mul"}} : ({half}, {half}) -> {half}
  %8 = "poot.binary"(%6, %7) {{fn = "add"}} : ({half}, {half}) -> {half}
  %9 = "poot.reshape"(%8) : ({half}) -> {h5}
  %10 = "poot.concat"(%5, %9) {{axis = 4 : i64}} : ({h5}, {h5}) -> {two}
  %11 = "poot.reshape"(%10) : ({two}) -> {out}
  return %11 : {out}"""


# ---- tests -----------------------------------------------------------------------------------

@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("shape", [(1, 1, 3, 64), (2, 5, 4, 8), (3, 1, 1, 6)])
def test_rope_region(vk, dt, shape):
    """RoPE: strided slices, products, a concat of two unit-axis reshapes, a reshape back."""
    a, b, h, d = shape
    x, half = f"tensor<{a}x{b}x{h}x{d}x{dt}>", f"tensor<{a}x{b}x{h}x{d // 2}x{dt}>"
    out = f"tensor<{a}x{b * h}x{d}x{dt}>"
    body = rope_body(shape, dt, out)
    g = region([x, half, half], [out], body)
    rng = np.random.default_rng(0)
    ins = {"a0": rand(rng, shape, dt), "a1": rand(rng, (a, b, h, d // 2), dt),
           "a2": rand(rng, (a, b, h, d // 2), dt)}
    check(vk, g, ins, rtol=1e-6, atol=1e-6)     # each op rounds as the oracle does


def test_rope_tables_four_results_one_launch(vk):
    """The cos/sin tables region: a non-splat constant (a const buffer), int->float cast,
    broadcasts; four results of two shapes written by one launch."""
    freqs = ", ".join(f"{1.0 / 10000 ** (2 * i / 16):.8e}" for i in range(8))
    t8, t9, t3 = "tensor<1x1x8xf32>", "tensor<1x1x5x8xf32>", "tensor<1x1x2x8xf32>"
    body = f"""
  %0 = "poot.constant"() {{value = dense<[[[{freqs}]]]> : {t8}}} : () -> {t8}
  %1 = "poot.cast"(%arg0) : (tensor<1x1xi32>) -> tensor<1x1xf32>
  %2 = "poot.reshape"(%1) : (tensor<1x1xf32>) -> tensor<1x1x1xf32>
  %3 = "poot.broadcast"(%2) {{dims = array<i64: 0, 1, 2>}} : (tensor<1x1x1xf32>) -> {t8}
  %4 = "poot.binary"(%3, %0) {{fn = "mul"}} : ({t8}, {t8}) -> {t8}
  %5 = "poot.unary"(%4) {{fn = "cos"}} : ({t8}) -> {t8}
  %6 = "poot.unary"(%4) {{fn = "sin"}} : ({t8}) -> {t8}
  %7 = "poot.reshape"(%5) : ({t8}) -> tensor<1x1x1x8xf32>
  %8 = "poot.reshape"(%6) : ({t8}) -> tensor<1x1x1x8xf32>
  %9 = "poot.broadcast"(%7) {{dims = array<i64: 0, 1, 2, 3>}} : (tensor<1x1x1x8xf32>) -> {t9}
  %10 = "poot.broadcast"(%8) {{dims = array<i64: 0, 1, 2, 3>}} : (tensor<1x1x1x8xf32>) -> {t9}
  %11 = "poot.broadcast"(%7) {{dims = array<i64: 0, 1, 2, 3>}} : (tensor<1x1x1x8xf32>) -> {t3}
  %12 = "poot.broadcast"(%8) {{dims = array<i64: 0, 1, 2, 3>}} : (tensor<1x1x1x8xf32>) -> {t3}
  return %9, %10, %11, %12 : {t9}, {t9}, {t3}, {t3}"""
    g = region(["tensor<1x1xi32>"], [t9, t9, t3, t3], body)
    for pos in (0, 7, 300):
        check(vk, g, {"a0": np.array([[pos]], np.int32)}, rtol=2e-5, atol=2e-5)


def test_mask_iota_compare_broadcast(vk):
    """The causal mask region: iota, reshape, broadcast of a position, compare -> i1."""
    body = """
  %0 = "poot.iota"() {axis = 1 : i64} : () -> tensor<1x40xi32>
  %1 = "poot.reshape"(%0) : (tensor<1x40xi32>) -> tensor<1x1x40xi32>
  %2 = "poot.reshape"(%arg0) : (tensor<1x1xi32>) -> tensor<1x1x1xi32>
  %3 = "poot.broadcast"(%2) {dims = array<i64: 0, 1, 2>} : (tensor<1x1x1xi32>) -> tensor<1x1x40xi32>
  %4 = "poot.compare"(%1, %3) {pred = "le"} : (tensor<1x1x40xi32>, tensor<1x1x40xi32>) -> tensor<1x1x40xi1>
  return %4 : tensor<1x1x40xi1>"""
    g = region(["tensor<1x1xi32>"], ["tensor<1x1x40xi1>"], body)
    for pos in (0, 13, 39, 77):
        check(vk, g, {"a0": np.array([[pos]], np.int32)})


@pytest.mark.parametrize("dt", ["f32", "f16", "bf16", "i32", "i64"])
def test_elementwise_grid(vk, dt):
    """Every unary/binary/ternary fn a dtype admits, compare/select, casts both ways,
    transpose and broadcast views, in one region per dtype."""
    from poot.dialects.ops.elementwise import BINARY, TERNARY, UNARY

    is_f = dt in ("f32", "f16", "bf16")
    T = f"tensor<6x10x{dt}>"
    lines, outs = [], []
    n = [0]

    def emit(text, ty=T):
        lines.append(f"  %v{n[0]} = {text} -> {ty}")
        n[0] += 1
        return f"%v{n[0] - 1}"

    xt = emit(f'"poot.transpose"(%arg0) {{perm = array<i64: 1, 0>}} : (tensor<10x6x{dt}>)')
    row = emit(f'"poot.broadcast"(%arg2) {{dims = array<i64: 1>}} : (tensor<10x{dt}>)')
    for fn, (_, cls) in UNARY.items():
        # erf computes in f64 (as the oracle), which SPIR-V without Float64 cannot: PTX test
        if (cls == "float" and is_f or cls == "num") and fn != "erf":
            src = emit(f'"poot.unary"(%arg1) {{fn = "abs"}} : ({T})') \
                if fn in ("log", "sqrt", "rsqrt") else "%arg1"
            if fn in ("log", "sqrt", "rsqrt") and not is_f:
                continue
            outs.append(emit(f'"poot.unary"({src}) {{fn = "{fn}"}} : ({T})'))
    for fn, (_, cls) in BINARY.items():
        if (cls == "float" and is_f or cls == "num") and fn != "pow":
            outs.append(emit(f'"poot.binary"({xt}, %arg1) {{fn = "{fn}"}} : ({T}, {T})'))
    for fn, (_, cls) in TERNARY.items():
        if cls == "float" and is_f or cls == "num":
            outs.append(emit(f'"poot.ternary"({xt}, %arg1, {row}) {{fn = "{fn}"}} : '
                             f'({T}, {T}, {T})'))
    c = emit(f'"poot.compare"({xt}, %arg1) {{pred = "lt"}} : ({T}, {T})', "tensor<6x10xi1>")
    outs.append(c)
    outs.append(emit(f'"poot.select"({c}, {row}, %arg1) : (tensor<6x10xi1>, {T}, {T})'))
    for other in ("f32", "f16", "bf16", "i32", "i1"):
        if other != dt:
            y = emit(f'"poot.cast"(%arg1) : ({T})', f"tensor<6x10x{other}>")
            outs.append(y)
            outs.append(emit(f'"poot.cast"({y}) : (tensor<6x10x{other}>)'))
    types = []
    for o in outs:
        ln = next(x for x in lines if x.lstrip().startswith(o + " "))
        types.append(ln.rsplit("-> ", 1)[1])
    lines.append(f"  return {', '.join(outs)} : {', '.join(types)}")
    g = region([f"tensor<10x6x{dt}>", T, f"tensor<10x{dt}>"], types, "\n".join(lines))
    rng = np.random.default_rng(3)
    ins = {"a0": rand(rng, (10, 6), dt), "a1": rand(rng, (6, 10), dt),
           "a2": rand(rng, (10,), dt)}
    ins["a1"].reshape(-1)[:3] = 0        # div by zero, cast to i1 of zero
    tol = {"f32": 2e-6, "f16": 1e-3, "bf16": 8e-3}.get(dt, 0)
    check(vk, g, ins, rtol=tol, atol=tol)


@pytest.mark.parametrize("fmt", ["q8_0", "q4_1", "q4_k", "q6_k"])
def test_embedding_gather_of_packed_table(vk, fmt):
    """A gather of rows of a dequantized packed table (ids clamped), decoded in place."""
    from poot.dialects.quant import BY_NAME

    f = BY_NAME[fmt]
    rows, cols = 12, f.block_elems * 2
    nbytes = f.packed_bytes((rows, cols))
    pk = f"!poot.packed<#poot.{fmt}, array<i64: {rows}, {cols}>>"
    body = f"""
  %0 = "poot.dequantize"(%arg0) : ({pk}) -> tensor<{rows}x{cols}xf32>
  %1 = "poot.gather"(%0, %arg1) {{axis = 0 : i64}} : (tensor<{rows}x{cols}xf32>, tensor<1x3xi32>) -> tensor<1x3x{cols}xf32>
  return %1 : tensor<1x3x{cols}xf32>"""
    g = region([pk, "tensor<1x3xi32>"], [f"tensor<1x3x{cols}xf32>"], body)
    rng = np.random.default_rng(5)
    raw = rng.integers(0, 256, size=nbytes, dtype=np.uint8)
    # sane f16 scales: every block's leading halves (d, m) as small normal numbers
    scale = np.frombuffer(np.float16([0.01, 0.02]).tobytes(), np.uint8)
    for b in range(nbytes // f.block_bytes):
        raw[b * f.block_bytes: b * f.block_bytes + 4] = scale
        if fmt == "q6_k":
            raw[b * f.block_bytes + 208: b * f.block_bytes + 210] = scale[:2]
    check(vk, g, {"a0": raw, "a1": np.array([[3, 0, 11]], np.int32)}, rtol=1e-6, atol=1e-6)


def test_gather_large_vectorized_and_clamped(vk):
    """A dense gather with a large result (4 elements per thread); ids out of range clamp."""
    body = """
  %0 = "poot.gather"(%arg0, %arg1) {axis = 1 : i64} : (tensor<4x10x1024xf32>, tensor<5xi64>) -> tensor<4x5x1024xf32>
  return %0 : tensor<4x5x1024xf32>"""
    g = region(["tensor<4x10x1024xf32>", "tensor<5xi64>"], ["tensor<4x5x1024xf32>"], body)
    rng = np.random.default_rng(9)
    check(vk, g, {"a0": rand(rng, (4, 10, 1024), "f32"),
                  "a1": np.array([9, 0, 4, 2, 7], np.int64)})


def test_refuses_reductions_and_matmul():
    """Regions outside the elementwise class are left to other strategies: a reduction of
    more than SCALAR_MAX_REDUCE elements a result (a row reduction's)."""
    from poot.backends.gpu.strategies.emit import SCALAR_MAX_REDUCE
    from poot.backends.gpu.strategies.pointwise import synthesize_pointwise

    x = f"tensor<4x{SCALAR_MAX_REDUCE + 1}xf32>"
    body = f"""
  %0 = "poot.reduce"(%arg0) {{axes = array<i64: 1>, fn = "sum"}} : ({x}) -> tensor<4xf32>
  return %0 : tensor<4xf32>"""
    g = region([x], ["tensor<4xf32>"], body)
    fn = next(o.operation for o in g.module.body.operations
              if "sym_name" in o.operation.attributes and
              str(o.operation.attributes["sym_name"]) == '"d"')
    with g.module.context:
        assert synthesize_pointwise(fn, _caps(32)) is None


# ---- small reductions (a MoE layer's top-k sum) ------------------------------------------------

@pytest.mark.parametrize("dt", ["f32", "bf16"])
@pytest.mark.parametrize("k", [1, 2, 8])
def test_moe_topk_sum_is_one_pointwise_kernel(vk, dt, k):
    """A MoE layer's combine as the tracer spells it: ``residual + sum_j w[j] * y[j, :]``,
    a sum over the middle axis of [1, k, D] (no row reduction): one thread per element folds
    its k terms (j ascending, f32), one launch."""
    D = 1000
    Y, W, R = f"tensor<1x{k}x{D}x{dt}>", f"tensor<1x{k}x1xf32>", f"tensor<1x{D}xf32>"
    body = f"""
  %y = "poot.cast"(%arg0) : ({Y}) -> tensor<1x{k}x{D}xf32>
  %w = "poot.broadcast"(%arg1) {{dims = array<i64: 0, 1, 2>}} : ({W}) -> tensor<1x{k}x{D}xf32>
  %p = "poot.binary"(%y, %w) {{fn = "mul"}} : (tensor<1x{k}x{D}xf32>, tensor<1x{k}x{D}xf32>) -> tensor<1x{k}x{D}xf32>
  %s = "poot.reduce"(%p) {{axes = array<i64: 1>, fn = "sum"}} : (tensor<1x{k}x{D}xf32>) -> {R}
  %o = "poot.binary"(%arg2, %s) {{fn = "add"}} : ({R}, {R}) -> {R}
  return %o : {R}"""
    rng = np.random.default_rng(k)
    g = region([Y, W, R], [R], body)
    check(vk, g, {"a0": rand(rng, (1, k, D), dt), "a1": rand(rng, (1, k, 1), "f32"),
                  "a2": rand(rng, (1, D), "f32")})


@pytest.mark.parametrize("fn", ["max", "min", "sum"])
def test_small_reduction_over_several_axes(vk, fn):
    """i32 max/min/sum folding axes 0 and 2 of [2, 37, 3] (6 terms a result element, in
    row-major order of the folded axes) exactly, and a bf16 result rounded once."""
    X = "tensor<2x37x3xi32>"
    body = f"""
  %0 = "poot.reduce"(%arg0) {{axes = array<i64: 0, 2>, fn = "{fn}"}} : ({X}) -> tensor<37xi32>
  %1 = "poot.reduce"(%arg1) {{axes = array<i64: 0, 2>, fn = "{fn}"}} : (tensor<2x37x3xbf16>) -> tensor<37xbf16>
  return %0, %1 : tensor<37xi32>, tensor<37xbf16>"""
    rng = np.random.default_rng(3)
    g = region([X, "tensor<2x37x3xbf16>"], ["tensor<37xi32>", "tensor<37xbf16>"], body)
    check(vk, g, {"a0": rand(rng, (2, 37, 3), "i32"), "a1": rand(rng, (2, 37, 3), "bf16")},
          rtol=1e-2, atol=1e-2)


def test_small_reduction_limits():
    """A reduction inside a small reduction's operand (its cost would multiply), a boolean
    one, and one past SCALAR_MAX_REDUCE terms are not computed per element."""
    from poot.backends.gpu.strategies.pointwise import synthesize_pointwise

    def refused(args, results, body):
        g = region(args, results, body)
        fn = next(o.operation for o in g.module.body.operations
                  if "sym_name" in o.operation.attributes and
                  str(o.operation.attributes["sym_name"]) == '"d"')
        with g.module.context:
            return synthesize_pointwise(fn, _caps(32)) is None

    X = "tensor<4x2x2xf32>"
    inner = f"""
  %0 = "poot.reduce"(%arg0) {{axes = array<i64: 2>, fn = "sum"}} : ({X}) -> tensor<4x2xf32>"""
    assert not refused([X], ["tensor<4x2xf32>"], inner + "\n  return %0 : tensor<4x2xf32>")
    nested = inner + """
  %1 = "poot.reduce"(%0) {axes = array<i64: 1>, fn = "max"} : (tensor<4x2xf32>) -> tensor<4xf32>
  return %1 : tensor<4xf32>"""
    assert refused([X], ["tensor<4xf32>"], nested)
    boolean = """
  %0 = "poot.reduce"(%arg0) {axes = array<i64: 1>, fn = "max"} : (tensor<4x2xi1>) -> tensor<4xi1>
  return %0 : tensor<4xi1>"""
    assert refused(["tensor<4x2xi1>"], ["tensor<4xi1>"], boolean)


# ---- small contractions (LoRA expands) ---------------------------------------------------------

def lora_swiglu(M: int, N: int, R: int):
    """The LoRA terms of a SwiGLU as the tracer leaves them once the up projection's expand is
    folded into the gate's: ``silu(g + (xa_g * mask) B_g^T) * (u + (xa_u * mask) B_u^T)``,
    g/u [M, N] the base projections, xa [M, R] the shrunk inputs, mask [M, 1, R] per row, B
    bf16 [N, R]: two contractions of R terms per element."""
    X, Y, W = f"tensor<{M}x{R}xf32>", f"tensor<{M}x{N}xf32>", f"tensor<{N}x{R}xbf16>"
    body = [f'  %m = "poot.reshape"(%arg4) : (tensor<{M}x1x{R}xf32>) -> {X}']
    for i, (xa, b) in enumerate((("%arg0", "%arg2"), ("%arg1", "%arg3"))):
        body += [f'  %x{i} = "poot.binary"({xa}, %m) {{fn = "mul"}} : ({X}, {X}) -> {X}',
                 f'  %c{i} = "poot.cast"({b}) : ({W}) -> tensor<{N}x{R}xf32>',
                 f'  %t{i} = "poot.transpose"(%c{i}) {{perm = array<i64: 1, 0>}} : '
                 f'(tensor<{N}x{R}xf32>) -> tensor<{R}x{N}xf32>',
                 f'  %e{i} = "poot.matmul"(%x{i}, %t{i}) {{acc = f32}} : ({X}, '
                 f'tensor<{R}x{N}xf32>) -> {Y}']
    body += [f'  %g = "poot.binary"(%e0, %arg5) {{fn = "add"}} : ({Y}, {Y}) -> {Y}',
             f'  %u = "poot.binary"(%e1, %arg6) {{fn = "add"}} : ({Y}, {Y}) -> {Y}',
             f'  %n = "poot.unary"(%g) {{fn = "neg"}} : ({Y}) -> {Y}',        # silu
             f'  %x = "poot.unary"(%n) {{fn = "exp"}} : ({Y}) -> {Y}',
             f'  %one = "poot.constant"() {{value = dense<1.0> : {Y}}} : () -> {Y}',
             f'  %d = "poot.binary"(%x, %one) {{fn = "add"}} : ({Y}, {Y}) -> {Y}',
             f'  %s = "poot.binary"(%g, %d) {{fn = "div"}} : ({Y}, {Y}) -> {Y}',
             f'  %o = "poot.binary"(%s, %u) {{fn = "mul"}} : ({Y}, {Y}) -> {Y}',
             f"  return %o : {Y}"]
    args = [X, X, W, W, f"tensor<{M}x1x{R}xf32>", Y, Y]
    rng = np.random.default_rng(M * N + R)
    mask = (rng.integers(0, 2, size=(M, 1, R))).astype(np.float32)
    ins = {"a0": rand(rng, (M, R), "f32"), "a1": rand(rng, (M, R), "f32"),
           "a2": rand(rng, (N, R), "bf16", -0.5, 0.5), "a3": rand(rng, (N, R), "bf16", -0.5, 0.5),
           "a4": mask, "a5": rand(rng, (M, N), "f32"), "a6": rand(rng, (M, N), "f32")}
    return region(args, [Y], "\n".join(body)), ins


@pytest.mark.parametrize("M,N,R", [(1, 300, 16), (2, 100, 21), (5, 2048, 64), (3, 520, 128)])
def test_lora_expands_of_a_swiglu_are_one_pointwise_kernel(vk, M, N, R):
    """Two small contractions (R <= SCALAR_MAX_K terms) and the SwiGLU around them: one
    thread per element computes both sums (k ascending, f32); the oracle sums in BLAS order,
    so f32 rounding apart (rtol 1e-5 over sums of 16 to 128 terms of magnitude ~1)."""
    g, ins = lora_swiglu(M, N, R)
    check(vk, g, ins, rtol=1e-5, atol=1e-5)


def test_small_contraction_regions_take_one_element_a_thread():
    """A large result is written four elements a thread, but not when the region holds a
    small contraction: each element's R terms are its own, and four a thread ran four
    contractions in a row in a quarter of the threads (the 1B shape's batch-32 SwiGLU with
    its LoRA expands: 8.5 -> 6.6 us on the H200 with the weight loads hoisted)."""
    M, N = 32, 2048
    g, _ = lora_swiglu(M, N, 16)
    [launch] = [L for L in plan_of(g, _caps(32)).launches if L["op"] == "kernel"]
    threads = launch["grid"][0] * launch["block"][0]
    assert M * N <= threads < M * N + launch["block"][0]
    Y = f"tensor<{M}x{N}xf32>"
    plain = region([Y, Y], [Y], f"""  %0 = "poot.binary"(%arg0, %arg1) {{fn = "mul"}} : ({Y}, {Y}) -> {Y}
  return %0 : {Y}""")
    [launch] = [L for L in plan_of(plain, _caps(32)).launches if L["op"] == "kernel"]
    assert launch["grid"][0] * launch["block"][0] == M * N // 4


def test_small_contraction_limits():
    """A contraction past SCALAR_MAX_K terms, one that is not a low-rank expansion (K more
    than N / LOW_RANK: a toy model's square projection), or one inside another's operand (its
    cost would multiply) is not computed per element: the pointwise strategy refuses."""
    from poot.backends.gpu.strategies.emit import LOW_RANK, SCALAR_MAX_K
    from poot.backends.gpu.strategies.pointwise import synthesize_pointwise

    def refused(g):
        fn = next(o.operation for o in g.module.body.operations
                  if "sym_name" in o.operation.attributes and
                  str(o.operation.attributes["sym_name"]) == '"d"')
        with g.module.context:
            return synthesize_pointwise(fn, _caps(32)) is None

    K = SCALAR_MAX_K
    assert not refused(lora_swiglu(2, LOW_RANK * K, K)[0])
    assert refused(lora_swiglu(2, LOW_RANK * (K + 1), K + 1)[0])
    assert not refused(lora_swiglu(2, LOW_RANK * 16, 16)[0])
    assert refused(lora_swiglu(2, LOW_RANK * 16 - 1, 16)[0])
    A, B1, B2 = "tensor<1x8xf32>", "tensor<8x32xf32>", "tensor<32x128xf32>"
    nested = f"""
  %0 = "poot.matmul"(%arg0, %arg1) {{acc = f32}} : ({A}, {B1}) -> tensor<1x32xf32>
  %1 = "poot.matmul"(%0, %arg2) {{acc = f32}} : (tensor<1x32xf32>, {B2}) -> tensor<1x128xf32>
  return %1 : tensor<1x128xf32>"""
    assert refused(region([A, B1, B2], ["tensor<1x128xf32>"], nested))


def test_ptx_assembles():
    """The same kernels lower through NVVM to PTX that ptxas accepts (when installed)."""
    body = """
  %0 = "poot.iota"() {axis = 1 : i64} : () -> tensor<3x70000xi32>
  %1 = "poot.cast"(%0) : (tensor<3x70000xi32>) -> tensor<3x70000xbf16>
  %2 = "poot.binary"(%1, %arg0) {fn = "add"} : (tensor<3x70000xbf16>, tensor<3x70000xbf16>) -> tensor<3x70000xbf16>
  %3 = "poot.cast"(%2) : (tensor<3x70000xbf16>) -> tensor<3x70000xf16>
  return %3, %2 : tensor<3x70000xf16>, tensor<3x70000xbf16>"""
    g = region(["tensor<3x70000xbf16>"], ["tensor<3x70000xf16>", "tensor<3x70000xbf16>"], body)
    assert strategies_of(g, _caps(32)) == {"pointwise": 1}
    assert ".entry" in ptx_of(g)
