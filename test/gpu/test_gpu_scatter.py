"""The ``scatter`` GPU strategy: a scatter region becomes a copy of the destination plus ONE
kernel writing the addressed slices, run on a real Vulkan device (lavapipe in CI) against the
numpy oracle: repeated addresses (the later row wins), out-of-range rows (dropped), updates
computed from the arguments, f32/f16/bf16 storage; the PTX assembles with ``ptxas``."""

from __future__ import annotations

import numpy as np
import pytest
pytest.importorskip("mlir.ir", reason="the MLIR wheels (xtc-mlir-python-bindings) are not "
                    "installed here: this module compiles kernels")
from test_gpu_pointwise import check, ptx_of, rand, region



def _kv_region(dt: str, cap: int, heads: int, d: int, rows: int, scale: bool):
    cache = f"tensor<2x{cap}x{heads}x{d}x{dt}>"
    upd = f"tensor<{rows}x{heads}x{d}x{dt}>"
    body = ""
    u = "%arg2"
    if scale:      # updates computed in the region: 2 * x
        body += (f'  %c = "poot.constant"() {{value = dense<2.0> : {upd}}} : () -> {upd}\n'
                 f'  %u = "poot.binary"(%arg2, %c) {{fn = "mul"}} : ({upd}, {upd}) -> {upd}\n')
        u = "%u"
    body += (f'  %0 = "poot.scatter"(%arg0, %arg1, {u}) : ({cache}, tensor<{rows}x2xi32>, '
             f'{upd}) -> {cache}\n  return %0 : {cache}')
    return region([cache, f"tensor<{rows}x2xi32>", upd], [cache], body)


@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("scale", [False, True])
def test_scatter_rows_repeats_and_out_of_range(vk, dt, scale):
    g = _kv_region(dt, 8, 3, 16, 5, scale)
    rng = np.random.default_rng(3)
    idx = np.array([[0, 2], [1, 7], [0, 2], [2, 1], [1, -1]], np.int32)  # repeat, 2 dropped
    ins = {"a0": rand(rng, (2, 8, 3, 16), dt), "a1": idx, "a2": rand(rng, (5, 3, 16), dt)}
    check(vk, g, ins, rtol=0, atol=0, strategy="scatter", launches=1)


def test_scatter_prefill_rows(vk):
    """A prefill's T rows at consecutive positions of one slot."""
    g = _kv_region("f32", 64, 2, 8, 40, False)
    rng = np.random.default_rng(4)
    idx = np.stack([np.zeros(40, np.int32), np.arange(10, 50, dtype=np.int32)], 1)
    ins = {"a0": rand(rng, (2, 64, 2, 8), "f32"), "a1": idx, "a2": rand(rng, (40, 2, 8), "f32")}
    check(vk, g, ins, rtol=0, atol=0, strategy="scatter", launches=1)


def test_scatter_ptx_assembles():
    ptx = ptx_of(_kv_region("bf16", 256, 3, 64, 1, True))
    assert ".entry" in ptx
