"""The CPU matmul kernels for M >= 2 rows of x (batched decode, prefill) against the oracle
(dequantize, then an f32 matmul), for every weight format the kernels read in place and M in
2..256, ragged M (not a multiple of the x-row tile) included, next to M = 1.

Packed weights at int16 / int8 x take the lane-interleaved GEMM tile
(:meth:`poot.backends.cpu.gemv._K.tile_gemm`) where N is a multiple of 8 (16 W rows a tile
with 512-bit VNNI and N = 48 here, else 8), the row-streaming tiles otherwise (N = 44); dense
weights the f32 row-streaming kernel. One compile per
(format, precision, instruction set) holds a matmul for each M, all against the same weight,
the x of each M the first M rows of one x: each row's result is also bitwise the same in
every M, M = 1 included (a row alone, in a batch of any size, or in any tile position gets
the same sums: the engine's batch invariance). Where the GEMM tile takes M >= 2, M = 1 takes
the lane-order GEMV (:meth:`poot.backends.cpu.gemv._K.tile_lanes`), which applies the block
scales in the GEMM's order.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from poot import oracle
from poot.backends.cpu.codegen import compile_cpu
from poot.backends.cpu.gemv import GEMM_N_TILE, KERNELS, Gemv, dense_group, gemm_fits
from poot.dialects.lowering import Strategy
from poot.dialects.quant import Quant
from poot.dialects.types import DType, PackedType, TensorType
from poot.graph.builder import Builder, TraceLimits

LIMITS = TraceLimits(max_values=100_000, max_ops=100_000, max_literal_bytes=1 << 20,
                     max_owned_bytes=1 << 30)
MS = (1, 2, 3, 5, 8, 17, 33, 100, 256)
K = 96
NS = (48, 40, 44)  # multiples of the GEMM's 16 (512-bit VNNI) and 8 W rows, and neither
#: bits of x -> allowed error relative to the largest |y| (as test_cpu_kernels.DOT_BITS)
TOL = {16: 2e-4, 8: 2e-2, 0: 1e-5}


def _host_has(*features) -> bool:
    from poot.compiler.target import host_cpu

    return set(features) <= host_cpu().caps.features


HAS_VNNI = _host_has("avx_vnni") or _host_has("avx512_vnni", "avx512vl")


def _weight(kind: str, n: int, rng) -> tuple[object, np.ndarray]:
    """(type, stored array) of an [n, K] weight of ``kind``."""
    w = rng.normal(size=(n, K)).astype(np.float32)
    if kind in ("f32", "f16", "bf16"):
        dt = DType(kind)
        return TensorType((n, K), dt), w.astype(dt.numpy)
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    f = Quant[kind.upper()].value
    raw = np.asarray(quantize(w, GGMLQuantizationType(f.ggml_type)), dtype=np.uint8)
    return PackedType(f, (n, K)), raw.reshape(-1)


def _graph(types: dict):
    """``y_<m>_<n> = x_<m> @ dequantize(w_<n>)^T`` for every M in :data:`MS`, N in :data:`NS`."""
    b = Builder(LIMITS)
    ws = {}
    for n, wt in types.items():
        w = b.param(f"w{n}", wt)
        if isinstance(wt, PackedType):
            w = b.dequantize(w)
        elif wt.dtype is not DType.F32:
            w = b.cast(w, DType.F32)
        ws[n] = b.transpose(w, (1, 0))
    outs = {}
    for m in MS:
        x = b.input(f"x{m}", TensorType((m, K), DType.F32))
        for n, wt in ws.items():
            outs[f"y{m}_{n}"] = b.matmul(x, wt)
    return b.finish(outs)


def _check(kind: str, bits: int, vnni: bool, cores: int = 2, amx: bool = False):
    rng = np.random.default_rng(zlib.crc32(repr((kind, bits)).encode()))   # the same each run
    types, params = {}, {}
    for n in NS:
        types[n], params[f"w{n}"] = _weight(kind, n, rng)
    g = _graph(types)
    strategy = Strategy(kernels=KERNELS, cores=cores, m_tile=4, parallel_min_bytes=0,
                        dot_bits=bits, vnni=vnni, amx=amx)
    prog = compile_cpu(g, strategy=strategy)
    assert "linalg.matmul" not in prog.lowered, "a matmul fell back to linalg"
    assert ("amx.tile_muli" in prog.lowered) == amx, "AMX tiles where not asked, or none"
    if bits and gemm_fits(Gemv("x", "w", types[NS[0]], 2, K, NS[0]), strategy):
        # the GEMM tile's vector of the 8 W rows' block scales
        assert f"vector<{GEMM_N_TILE}xf16>" in prog.lowered, "the GEMM tile was not chosen"
    x = rng.normal(size=(max(MS), K)).astype(np.float32)
    x[7] = 0.0  # a row of zeros: a zero x scale
    inputs = {f"x{m}": x[:m].copy() for m in MS}
    got = prog.run(inputs, params)
    want = oracle.evaluate(g, inputs, params)
    for name, w in want.items():
        err = float(np.abs(got[name] - w).max())
        assert err <= TOL[bits] * float(np.abs(w).max()), f"{name}: max error {err}"
    for m in MS:  # a row's result does not depend on the batch it is in, alone (M = 1) or not
        for n in NS:
            np.testing.assert_array_equal(got[f"y{m}_{n}"], got[f"y{max(MS)}_{n}"][:m],
                                          err_msg=f"M = {m}, N = {n}")
    return got


@pytest.mark.parametrize("bits", [16, 8], ids=["int16", "int8"])
@pytest.mark.parametrize("kind", ["q4_0", "q4_1", "q8_0"])
def test_packed_gemm_matches_oracle(kind, bits):
    """Packed weights at int16 and int8 x, every M (VNNI where the host has it, else AVX2)."""
    _check(kind, bits, HAS_VNNI)


@pytest.mark.skipif(not HAS_VNNI, reason="this host has neither AVX-VNNI nor AVX512-VNNI "
                    "with VL: no VNNI result to compare the AVX2 one with")
@pytest.mark.parametrize("bits", [16, 8], ids=["int16", "int8"])
def test_avx2_and_vnni_gemm_agree(bits):
    """Without VNNI (pmaddwd / pmaddubsw + pmaddwd and adds) the integer sums are the same
    exact integers: bitwise equal results, on one thread and on two."""
    want = _check("q4_1", bits, True, cores=1)
    got = _check("q4_1", bits, False)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def _amx_permitted() -> bool:
    from poot.compiler.target import amx_permitted

    return amx_permitted()


@pytest.mark.skipif(not _amx_permitted(), reason="AMX tiles need a CPU with AMX-TILE and "
                    "AMX-INT8 (Sapphire Rapids or newer) and Linux's grant of the tile state; "
                    "this host or process has not both")
@pytest.mark.parametrize("kind,bits", [("q4_0", 16), ("q4_1", 16), ("q8_0", 16), ("q4_0", 8),
                                       ("q4_1", 8)])
def test_amx_and_vnni_gemm_agree(kind, bits):
    """The AMX tile (:mod:`poot.backends.cpu.amx`; N = 48 here, the other N keep the VNNI
    tile) gives the VNNI kernels' results bit for bit, within the oracle's bound (checked
    by ``_check``), for every M: ragged x-row tiles (17, 33, 100) on AMX, M < 9 on the
    VNNI tile and M = 1 on the lane-order GEMV, on two threads and on one (the AMX
    buffers then hoisted out of the W-row loop). int8 x meets Q8_0 in the VNNI kernel's sign trick only, not on AMX."""
    want = _check(kind, bits, True)
    for cores in (2, 1):
        got = _check(kind, bits, True, cores=cores, amx=True)
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=f"{name}, {cores}")


@pytest.mark.parametrize("kind", ["f32", "f16", "bf16"])
def test_dense_matmul_matches_oracle(kind):
    """Dense weights (f32 x, f32 accumulation), every M."""
    _check(kind, 0, False)


def _dense_graph(k: int, n: int, ms):
    b = Builder(LIMITS)
    w = b.transpose(b.cast(b.param("w", TensorType((n, k), DType.F16)), DType.F32), (1, 0))
    return b.finish({f"y{m}": b.matmul(b.input(f"x{m}", TensorType((m, k), DType.F32)), w)
                     for m in ms})


def test_dense_results_do_not_depend_on_the_register_block():
    """The dense kernel's register blocks (4 x rows x 4 W rows with m-tile 4, one W row with
    m-tile 2) and its threads' items (2 threads, or one) change which outputs are computed
    together, never an output's operations: bitwise equal results at every M, with K = 100
    (three full 32-element chunks and a masked one of 4), within the oracle's f32 bound."""
    k, n, ms = 100, 48, (1, 3, 4, 5, 9, 64, 130)
    g = _dense_graph(k, n, ms)
    rng = np.random.default_rng(11)
    params = {"w": rng.normal(size=(n, k)).astype(np.float16)}
    x = rng.normal(size=(max(ms), k)).astype(np.float32)
    inputs = {f"x{m}": x[:m].copy() for m in ms}
    want = oracle.evaluate(g, inputs, params)
    runs = {}
    for m_tile, cores in ((4, 2), (2, 2), (4, 1)):
        prog = compile_cpu(g, strategy=Strategy(kernels=KERNELS, cores=cores, m_tile=m_tile,
                                                parallel_min_bytes=0))
        runs[m_tile, cores] = got = prog.run(inputs, params)
        for name, w in want.items():
            err = float(np.abs(got[name] - w).max())
            assert err <= TOL[0] * float(np.abs(w).max()), f"{name}: max error {err}"
        for m in ms:
            np.testing.assert_array_equal(got[f"y{m}"], got[f"y{max(ms)}"][:m],
                                          err_msg=f"M = {m}, m-tile {m_tile}, {cores} cores")
    first = runs[4, 2]
    for key, got in runs.items():
        for name in got:
            np.testing.assert_array_equal(got[name], first[name], err_msg=f"{name}, {key}")


@pytest.mark.parametrize("n,nr,cores,want", [
    (576, 4, 2, 48),     # 64 rows would make 9 items: one thread idle a ninth of the time
    (1536, 4, 2, 64), (192, 4, 2, 48), (192, 4, 4, 48), (192, 4, 8, 24), (49152, 4, 2, 64), (64, 4, 1, 64),
    (44, 4, 2, 4),       # 44 (one item) and 4 (11 items) do not split evenly: 11 >= 8
    (5, 1, 2, 1)])
def test_dense_group_sizes(n, nr, cores, want):
    """A thread's item of the dense kernel: the most W rows (a multiple of the block's, at
    most 64) that split N evenly over the threads, else the most leaving 4 items a thread."""
    assert dense_group(n, nr, cores) == want


def test_dense_group_refuses_a_block_that_does_not_divide_n():
    with pytest.raises(ValueError, match="N = 6"):
        dense_group(6, 4, 2)


@pytest.mark.parametrize("kind", ["q4_1", "q8_0"])
def test_indexed_slabs_take_the_lane_order_gemv(kind):
    """``poot.indexed_matmul`` (a MoE layer's experts): each row runs the M = 1 kernel on
    its slab at the slab's first W row; with 48-row slabs that is the lane-order GEMV, whose
    rows, scales and prefetches are offset by the slab. Within the int16 bound of the oracle;
    each row equals the same row of a plain matmul against its slab, bitwise."""
    rng = np.random.default_rng(3)
    e, o, t = 3, NS[0], 5
    wt2, raw = _weight(kind, e * o, rng)
    wt = PackedType(wt2.format, (e, o, K))
    b = Builder(LIMITS)
    x = b.input("x", TensorType((t, K), DType.F32))
    idx = b.input("idx", TensorType((t,), DType.I32))
    w2 = b.transpose(b.dequantize(b.param("w2", wt2)), (1, 0))
    outs = {"y": b.indexed_matmul(x, b.dequantize(b.param("w", wt)), idx),
            "full": b.matmul(x, w2)}
    g = b.finish(outs)
    strategy = Strategy(kernels=KERNELS, cores=2, m_tile=4, parallel_min_bytes=0, dot_bits=16,
                        vnni=HAS_VNNI)
    prog = compile_cpu(g, strategy=strategy)
    inputs = {"x": rng.normal(size=(t, K)).astype(np.float32),
              "idx": np.array([2, 0, 2, 1, 0], np.int32)}
    params = {"w": raw, "w2": raw}
    got = prog.run(inputs, params)
    want = oracle.evaluate(g, inputs, params)
    assert np.abs(got["y"] - want["y"]).max() <= TOL[16] * np.abs(want["y"]).max()
    for r, s in enumerate(inputs["idx"]):
        np.testing.assert_array_equal(got["y"][r], got["full"][r, s * o:(s + 1) * o],
                                      err_msg=f"row {r}")
