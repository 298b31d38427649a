"""``poot.indexed_matmul`` (a MoE layer's selected experts read in place) on the GPU: the GEMV
strategy takes it (:func:`~poot.backends.gpu.strategies.matmul_match.match_indexed`: one row of x a
block row, streaming its own slab as the plain GEMV streams a weight; the SwiGLU gate folded
beside the up projection), and ``indexed_gemv`` (one subgroup per output element, any packed
format the scalar emitter decodes) takes what the GEMV's decoders lack. Regions run on a real
Vulkan device (lavapipe in CI) against the numpy oracle; the plan must have taken the named
strategy (not the generic mapping)."""

from __future__ import annotations

import zlib
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("mlir.ir", reason="the MLIR wheels (xtc-mlir-python-bindings) are not "
                    "installed here: this module compiles kernels")

from test_gpu_matmul import _weight          # noqa: E402
from test_gpu_pointwise import region         # noqa: E402

from poot import oracle                      # noqa: E402

E, O, K = 4, 40, 64
#: the rows' slabs: 3, 0, 3, 1, 2 repeating; one past the slabs (clamped by the op)
IDX = [3, 0, 3, 1, 2]


def _slabs(fmt: str, K: int, rng):
    """(MLIR type, value) of random [E, O, K] weights of ``fmt``."""
    if fmt == "q5_0":                 # (not in test_gpu_matmul's table: the GEMV lacks it)
        nblk = E * O * K // 32
        raw = rng.integers(0, 256, (nblk, 22), dtype=np.uint8)
        raw[:, 0:2] = rng.uniform(0.002, 0.02, nblk).astype(np.float16).view(np.uint8) \
            .reshape(nblk, 2)
        return f"!poot.packed<#poot.q5_0, array<i64: {E}, {O}, {K}>>", raw.reshape(-1)
    wt, wv, _ = _weight(fmt, E * O, K, rng)
    wt = wt.replace(f"{E * O}x{K}", f"{E}x{O}x{K}").replace(f"{E * O}, {K}", f"{E}, {O}, {K}")
    return wt, (wv.reshape(E, O, K) if fmt in ("f32", "bf16", "f16") else wv)


def _graph(fmt: str, epilogue: str, K: int = K, T: int = 5):
    """One region: ``indexed_matmul`` of x [T, K] against ``fmt`` slabs; ``epilogue``:
    ``plain``, ``tanh_mul`` (tanh(y) * an argument) or ``swiglu`` (act(x . gate[idx]) *
    (x . up[idx]), act(g) = g tanh(g): two indexed matmuls of one x and one idx, as the
    region folding leaves a MoE layer's gate and up experts)."""
    rng = np.random.default_rng(zlib.crc32(repr((fmt, K, T)).encode()))   # the same each run
    wt, wv = _slabs(fmt, K, rng)
    wf = f"tensor<{E}x{O}x{K}xf32>"
    x, i, y = f"tensor<{T}x{K}xf32>", f"tensor<{T}xi32>", f"tensor<{T}x{O}xf32>"
    args = [x, wt, i]
    inputs = {"a0": rng.standard_normal((T, K)).astype(np.float32), "a1": wv,
              "a2": np.array([IDX[t % len(IDX)] for t in range(T)], np.int32)}
    body = []

    def mm(arg: int, name: str) -> str:
        if fmt == "f32":
            w = f"%arg{arg}"
        else:
            op = "poot.cast" if fmt in ("bf16", "f16") else "poot.dequantize"
            body.append(f'%w{name} = "{op}"(%arg{arg}) : ({wt}) -> {wf}')
            w = f"%w{name}"
        body.append(f'%{name} = "poot.indexed_matmul"(%arg0, {w}, %arg2) {{acc = f32}} : '
                    f"({x}, {wf}, {i}) -> {y}")
        return f"%{name}"

    ret = mm(1, "y")
    if epilogue == "tanh_mul":
        args.append(y)
        inputs["a3"] = rng.standard_normal((T, O)).astype(np.float32)
        body += [f'%s = "poot.unary"(%y) {{fn = "tanh"}} : ({y}) -> {y}',
                 f'%z = "poot.binary"(%s, %arg3) {{fn = "mul"}} : ({y}, {y}) -> {y}']
        ret = "%z"
    elif epilogue == "swiglu":
        args.append(wt)
        inputs["a3"] = _slabs(fmt, K, rng)[1]
        up = mm(3, "u")
        body += [f'%g = "poot.unary"(%y) {{fn = "tanh"}} : ({y}) -> {y}',
                 f'%s = "poot.binary"(%y, %g) {{fn = "mul"}} : ({y}, {y}) -> {y}',
                 f'%z = "poot.binary"(%s, {up}) {{fn = "mul"}} : ({y}, {y}) -> {y}']
        ret = "%z"
    body.append(f"return {ret} : {y}")
    return region(args, [y], "\n".join(body)), inputs


def _check(vk_device, vk_target, g, inputs, strategy: str) -> None:
    from poot.backends.gpu.plan import plan_program
    from poot.backends.vulkan.codegen import codegen_vulkan
    from test_vulkan_kernels import run_artifact

    plan = plan_program(SimpleNamespace(graph=g, storage=[]), vk_target.caps)
    assert plan.strategies == {strategy: 1}, plan.strategies
    got = run_artifact(vk_device, codegen_vulkan(g, vk_target), inputs)["r0"]
    want = oracle.evaluate(g, inputs)["r0"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize("k", [K, 1024], ids=["k64", "k1024"])
@pytest.mark.parametrize("epilogue", ["plain", "tanh_mul", "swiglu"])
@pytest.mark.parametrize("fmt", ["f32", "bf16", "f16", "q4_0", "q8_0", "q4_1", "q4_k",
                                 "q6_k"])
def test_indexed_gemv_matches_oracle(vk_device, vk_target, fmt, epilogue, k):
    """The GEMV on indexed regions: rows choosing slabs 3, 0, 3, 1, 2, every format the
    GEMV decodes (the k-quants' 256-element super-blocks need K = 1024), one and two
    matmuls (the SwiGLU) a kernel."""
    if fmt in ("q4_k", "q6_k") and k % 256:
        pytest.skip("k-quant rows are whole 256-element super-blocks")
    g, inputs = _graph(fmt, epilogue, k)
    _check(vk_device, vk_target, g, inputs, "gemv")


def test_indexed_gemv_many_rows(vk_device, vk_target):
    """More rows than the plain GEMV's MAX_M (a batch of 20 decoding sequences, top-2: 40
    rows): one row a block row, so any number."""
    g, inputs = _graph("bf16", "swiglu", 256, T=40)
    _check(vk_device, vk_target, g, inputs, "gemv")


@pytest.mark.parametrize("k", [K, 1024], ids=["k64", "k1024"])
def test_indexed_scalar_fallback_matches_oracle(vk_device, vk_target, k):
    """A packed format the GEMV does not decode (Q5_0) falls back to ``indexed_gemv``
    (K = 1024: its unrolled k loop, UNROLL sums a lane)."""
    g, inputs = _graph("q5_0", "tanh_mul", k)
    _check(vk_device, vk_target, g, inputs, "indexed_gemv")


def test_indexed_index_clamped(vk_device, vk_target):
    """An index past the slabs reads the last slab, as the op defines (the oracle clamps):
    row 1's index is E + 3."""
    g, inputs = _graph("bf16", "plain")
    inputs["a2"][1] = E + 3
    _check(vk_device, vk_target, g, inputs, "gemv")


@pytest.mark.parametrize("fmt,strategy", [("bf16", "gemv"), ("q4_0", "gemv"),
                                          ("q5_0", "indexed_gemv")])
def test_indexed_lowers_to_ptx(fmt, strategy):
    """The same kernels through NVVM: PTX with the subgroup butterfly (5 shuffles at width
    32, one a matmul) that ptxas assembles (when installed)."""
    from test_gpu_pointwise import _caps, plan_of, ptx_of

    g, _ = _graph(fmt, "swiglu" if strategy == "gemv" else "tanh_mul", 1024)
    assert plan_of(g, _caps(32)).strategies == {strategy: 1}
    ptx = ptx_of(g, _caps(32))
    assert ptx.count("shfl.sync.bfly") == (10 if strategy == "gemv" else 5)
