"""The ``scatter`` GPU strategy: a scatter region becomes a copy of the destination plus ONE
kernel writing the addressed slices, run on a real Vulkan device (lavapipe in CI) against the
numpy oracle: repeated addresses (the later row wins), out-of-range rows (dropped), updates
computed from the arguments, f32/f16/bf16 storage, a paged step's write into a block pool
(block and offset computed from flat slots in the kernel); the PTX assembles with ``ptxas``."""

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


def _paged_write_region(dt: str, nb: int, bs: int, heads: int, d: int, n: int):
    """A paged step's K/V write as folding leaves it: the pool ``[nb, bs, heads, d]`` (dt),
    the flat slots ``[n]`` i32 turned into ``(slot / bs, slot - slot / bs * bs)`` in the region
    (C division: -1 gives an offset of -1), the f32 rows ``[n, heads * d]`` reshaped and cast
    to the pool's dtype."""
    pool, rows = f"tensor<{nb}x{bs}x{heads}x{d}x{dt}>", f"tensor<{n}x{heads * d}xf32>"
    v, col = f"tensor<{n}xi32>", f"tensor<{n}x1xi32>"
    r3, c3 = f"tensor<{n}x{heads}x{d}xf32>", f"tensor<{n}x{heads}x{d}x{dt}>"
    body = f"""
  %bs = "poot.constant"() {{value = dense<{bs}> : {v}}} : () -> {v}
  %blk = "poot.binary"(%arg1, %bs) {{fn = "div"}} : ({v}, {v}) -> {v}
  %m = "poot.binary"(%blk, %bs) {{fn = "mul"}} : ({v}, {v}) -> {v}
  %off = "poot.binary"(%arg1, %m) {{fn = "sub"}} : ({v}, {v}) -> {v}
  %b2 = "poot.reshape"(%blk) : ({v}) -> {col}
  %o2 = "poot.reshape"(%off) : ({v}) -> {col}
  %idx = "poot.concat"(%b2, %o2) {{axis = 1 : i64}} : ({col}, {col}) -> tensor<{n}x2xi32>
  %r = "poot.reshape"(%arg2) : ({rows}) -> {r3}
  %c = "poot.cast"(%r) : ({r3}) -> {c3}
  %0 = "poot.scatter"(%arg0, %idx, %c) : ({pool}, tensor<{n}x2xi32>, {c3}) -> {pool}
  return %0 : {pool}"""
    return region([pool, v, rows], [pool], body)


@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
def test_paged_kv_write(vk, dt):
    """A batch's rows written into a block pool at flat slots (block = slot / bs, offset =
    slot % bs, computed in the kernel from the step's slot_mapping) in the pool's dtype
    (rounded as the oracle's cast): padding rows (slot -1) and slots past the pool are
    dropped, a repeated slot takes the later row, every other pool row stays; exact."""
    nb, bs = 6, 4
    g = _paged_write_region(dt, nb, bs, 2, 16, 7)
    rng = np.random.default_rng(5)
    slots = np.array([5, -1, 3 * bs + 2, nb * bs + 1, 5, 0, 2 * bs + 3], np.int32)
    ins = {"a0": rand(rng, (nb, bs, 2, 16), dt), "a1": slots,
           "a2": rand(rng, (7, 32), "f32")}
    got = check(vk, g, ins, rtol=0, atol=0, strategy="scatter", launches=1)["r0"]
    if dt == "f32":
        changed = (got.reshape(nb * bs, -1) != ins["a0"].reshape(nb * bs, -1)).any(axis=1)
        assert sorted(np.nonzero(changed)[0]) == [0, 5, 11, 14]   # -1 and 25 dropped


def test_paged_kv_write_ptx_assembles():
    ptx = ptx_of(_paged_write_region("bf16", 64, 16, 8, 128, 4))
    assert ".entry" in ptx
