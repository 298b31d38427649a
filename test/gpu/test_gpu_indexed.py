"""The ``indexed_gemv`` GPU strategy (``poot.indexed_matmul``: a MoE layer's selected
experts read in place): one subgroup per output element over the selected slab's row, the
epilogue applied by lane 0. Regions run on a real Vulkan device (lavapipe in CI) against the
numpy oracle; the plan must have taken the strategy (not the generic mapping)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("mlir.ir", reason="the MLIR wheels (xtc-mlir-python-bindings) are not "
                    "installed here: this module compiles kernels")

from test_gpu_matmul import _weight          # noqa: E402
from test_gpu_pointwise import region         # noqa: E402

from poot import oracle                      # noqa: E402

E, O, K, T = 4, 40, 64, 5


def _graph(fmt: str, epilogue: bool, K: int = K):
    rng = np.random.default_rng(hash(fmt) % 2**32)
    wt, wv, _ = _weight(fmt, E * O, K, rng)
    wt = wt.replace(f"{E * O}x{K}", f"{E}x{O}x{K}").replace(f"{E * O}, {K}", f"{E}, {O}, {K}")
    wv = wv.reshape(E, O, K) if fmt in ("f32", "bf16", "f16") else wv
    wf = f"tensor<{E}x{O}x{K}xf32>"
    x, i, y = f"tensor<{T}x{K}xf32>", f"tensor<{T}xi32>", f"tensor<{T}x{O}xf32>"
    body = []
    if fmt == "f32":
        w = "%arg1"
    elif fmt in ("bf16", "f16"):
        body.append(f'%w = "poot.cast"(%arg1) : ({wt}) -> {wf}')
        w = "%w"
    else:
        body.append(f'%w = "poot.dequantize"(%arg1) : ({wt}) -> {wf}')
        w = "%w"
    body.append(f'%y = "poot.indexed_matmul"(%arg0, {w}, %arg2) {{acc = f32}} : '
                f"({x}, {wf}, {i}) -> {y}")
    args, ret = [x, wt, i], "%y"
    if epilogue:                 # tanh(y) * an argument
        args.append(y)
        body += [f'%s = "poot.unary"(%y) {{fn = "tanh"}} : ({y}) -> {y}',
                 f'%z = "poot.binary"(%s, %arg3) {{fn = "mul"}} : ({y}, {y}) -> {y}']
        ret = "%z"
    body.append(f"return {ret} : {y}")
    g = region(args, [y], "\n".join(body))
    inputs = {"a0": rng.standard_normal((T, K)).astype(np.float32), "a1": wv,
              "a2": np.array([3, 0, 3, 1, 2], np.int32)}
    if epilogue:
        inputs["a3"] = rng.standard_normal((T, O)).astype(np.float32)
    return g, inputs


@pytest.mark.parametrize("k", [K, 1024], ids=["k64", "k1024"])
@pytest.mark.parametrize("epilogue", [False, True], ids=["plain", "tanh_mul"])
@pytest.mark.parametrize("fmt", ["f32", "bf16", "q4_0", "q8_0", "q4_1"])
def test_indexed_gemv_matches_oracle(vk_device, vk_target, fmt, epilogue, k):
    """Rows choosing slabs 3, 0, 3, 1, 2 (an index out of range is clamped as the op says,
    and on Vulkan also reported through the error word, as a gather's is: the CPU tests
    cover the clamp). K = 1024 takes the unrolled k loop (UNROLL sums a lane)."""
    from poot.backends.gpu.plan import plan_program
    from poot.backends.vulkan.codegen import codegen_vulkan
    from test_vulkan_kernels import run_artifact

    g, inputs = _graph(fmt, epilogue, k)
    plan = plan_program(SimpleNamespace(graph=g, storage=[]), vk_target.caps)
    assert plan.strategies == {"indexed_gemv": 1}, plan.strategies
    got = run_artifact(vk_device, codegen_vulkan(g, vk_target), inputs)["r0"]
    want = oracle.evaluate(g, inputs)["r0"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize("fmt", ["bf16", "q4_0"])
def test_indexed_gemv_lowers_to_ptx(fmt):
    """The same kernel through NVVM: PTX with the subgroup butterfly (5 shuffles at width
    32) that ptxas assembles (when installed)."""
    from test_gpu_pointwise import _caps, plan_of, ptx_of

    g, _ = _graph(fmt, True)
    assert plan_of(g, _caps(32)).strategies == {"indexed_gemv": 1}
    ptx = ptx_of(g, _caps(32))
    assert ptx.count("shfl.sync.bfly") == 5
