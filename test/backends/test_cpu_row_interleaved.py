"""Row-interleaved weights (``q4_0_r16`` / ``q4_1_r16`` / ``q8_0_r16``,
:mod:`poot.dialects.quant_layout`):
the layout against gguf's own decoding, the storage rule that picks it, the upload that
repacks, the generic in-place decoder (any CPU), and the row-interleaved kernel
(:meth:`poot.backends.cpu.gemv._K.tile_r16`, AMX's B tiles) against the ggml-layout kernels
bit for bit and against the oracle, for M in 1..256 (hosts with 512-bit VNNI / AMX)."""

from __future__ import annotations

import numpy as np
import pytest

from poot import oracle
from poot.backends.cpu.codegen import compile_cpu
from poot.backends.cpu.gemv import KERNELS
from poot.compiler.planning import storage_type
from poot.compiler.target import REPACK_FEATURES, Capabilities, amx_permitted, host_cpu
from poot.dialects import quant_layout, quant_ref
from poot.dialects.lowering import Strategy
from poot.dialects.quant import BY_NAME
from poot.dialects.types import DType, PackedType, TensorType
from poot.graph.builder import Builder, TraceLimits
from poot.runtime.session import Session
from poot.backends.cpu.runtime import CpuDevice

gguf = pytest.importorskip("gguf")
from gguf.quants import dequantize as gguf_dequantize, quantize  # noqa: E402

LIMITS = TraceLimits(max_values=100_000, max_ops=100_000, max_literal_bytes=1 << 20,
                     max_owned_bytes=1 << 30)
MS = (1, 2, 3, 5, 8, 9, 17, 33, 100, 256)
K = 96
N = 48
HAS_R16 = REPACK_FEATURES <= host_cpu().caps.features
NO_R16 = "this host lacks AVX-512 VNNI (avx512f, avx512bw, avx512_vnni): the row-interleaved " \
    "kernel cannot run here"
#: bits of x -> allowed error relative to the largest |y| (as test_cpu_gemm_batched.TOL)
TOL = {16: 2e-4, 8: 2e-2}


def _ggml(kind: str, n: int, k: int, seed: int = 0) -> np.ndarray:
    w = np.random.default_rng(seed).normal(size=(n, k)).astype(np.float32)
    return np.asarray(quantize(w, gguf.GGMLQuantizationType[kind.upper()]),
                      np.uint8).reshape(-1)


@pytest.mark.parametrize("kind", ["q4_0", "q4_1", "q8_0"])
def test_layout_decodes_to_ggml_values_and_places_bytes_as_documented(kind):
    """Interleaved bytes decode to exactly gguf's values; deinterleaving gives the file's
    bytes back; and bytes sit where the module doc says (row 17 = tile 1 row 1, block 2)."""
    n, k = 48, 96
    raw = _ggml(kind, n, k)
    fmt, r16 = BY_NAME[kind], BY_NAME[f"{kind}_r16"]
    packed = quant_layout.interleave(fmt, raw, (n, k))
    assert packed.size == raw.size
    want = gguf_dequantize(raw.reshape(n, -1), gguf.GGMLQuantizationType[kind.upper()])
    np.testing.assert_array_equal(quant_ref.dequantize(r16, packed, (n, k)), want)
    np.testing.assert_array_equal(quant_layout.deinterleave(r16, packed, (n, k)), raw)
    bb = fmt.block_bytes
    s = 4 if kind == "q4_1" else 2                # scale bytes: d (and q4_1's m)
    block = raw.reshape(n, k // 32, bb)[17, 2]
    tile_block = (1 * (k // 32) + 2) * 16 * bb    # tile 1, block 2
    assert packed[tile_block + 2:tile_block + 4].tobytes() == block[0:2].tobytes()   # d
    if s == 4:
        assert packed[tile_block + 32 + 2:tile_block + 36].tobytes() == block[2:4].tobytes()
    for p in (0, 5, bb - s - 1):  # weight byte p of ggml's block: chunk p // 4, lane 1, p % 4
        assert packed[tile_block + 16 * s + 64 * (p // 4) + 4 + p % 4] == block[s + p]


def test_layout_refuses_shapes_and_formats_it_does_not_take():
    with pytest.raises(ValueError, match="multiple of 16"):
        quant_layout.interleave(BY_NAME["q4_1"], _ggml("q4_1", 8, 64), (8, 64))
    with pytest.raises(ValueError, match="no row-interleaved layout of q6_k"):
        quant_layout.interleave(BY_NAME["q6_k"], np.zeros(210 * 16, np.uint8), (16, 256))


def test_storage_rule_picks_the_layout_only_where_listed_and_the_shape_fits():
    caps = Capabilities(packed_layouts=frozenset({"q4_0_r16", "q4_1_r16"}))
    q41, q80 = BY_NAME["q4_1"], BY_NAME["q6_k"]
    assert storage_type(PackedType(q41, (32, 64)), caps) == \
        PackedType(BY_NAME["q4_1_r16"], (32, 64))
    assert storage_type(PackedType(q41, (40, 64)), caps) == PackedType(q41, (40, 64))
    assert storage_type(PackedType(q41, (2, 32, 64)), caps) == PackedType(q41, (2, 32, 64))
    assert storage_type(PackedType(q80, (32, 256)), caps) == PackedType(q80, (32, 256))
    assert storage_type(PackedType(q41, (32, 64)), Capabilities()) == \
        PackedType(q41, (32, 64))


def test_session_repacks_on_upload():
    """A weight stored row-interleaved is uploaded as the layout's bytes; others unchanged."""
    caps = Capabilities(packed_layouts=frozenset({"q4_1_r16"}))
    s = Session(CpuDevice(), storage_type=lambda t: storage_type(t, caps))
    raw, other = _ggml("q4_1", 32, 64), _ggml("q4_1", 8, 64, seed=1)
    t, t8 = PackedType(BY_NAME["q4_1"], (32, 64)), PackedType(BY_NAME["q4_1"], (8, 64))
    s.load_weights({"w": raw, "v": other}, {"w": t, "v": t8})
    np.testing.assert_array_equal(s._weights["w"].reshape(-1),
                                  quant_layout.interleave(BY_NAME["q4_1"], raw, (32, 64)))
    np.testing.assert_array_equal(s._weights["v"].reshape(-1), other)


def _graph(fmt, ms=MS, gather: bool = False):
    b = Builder(LIMITS)
    w = b.dequantize(b.param("w", PackedType(fmt, (N, K))))
    wt = b.transpose(w, (1, 0))
    outs = {f"y{m}": b.matmul(b.input(f"x{m}", TensorType((m, K), DType.F32)), wt)
            for m in ms}
    if gather:
        outs["rows"] = b.gather(w, b.input("ids", TensorType((3,), DType.I32)), 0)
    return b.finish(outs)


def _run(kind: str, layout: bool, strategy: Strategy, ms=MS, gather: bool = False):
    fmt = BY_NAME[f"{kind}_r16" if layout else kind]
    raw = _ggml(kind, N, K, seed=7)
    params = {"w": quant_layout.interleave(BY_NAME[kind], raw, (N, K)) if layout else raw}
    g = _graph(fmt, ms, gather)
    x = np.random.default_rng(1).normal(size=(max(ms), K)).astype(np.float32)
    x[4] = 0.0                                   # a zero x scale
    inputs = {f"x{m}": x[:m].copy() for m in ms}
    if gather:
        inputs["ids"] = np.array([17, 0, 47], np.int32)
    prog = compile_cpu(g, strategy=strategy)
    return prog, prog.run(inputs, params), oracle.evaluate(g, inputs, params)


@pytest.mark.parametrize("kind", ["q4_0", "q4_1", "q8_0"])
def test_generic_decoder_reads_the_layout(kind):
    """Without the kernel (f32 x: no integer dot products) the in-place decoder of the
    generic lowering reads the interleaved bytes: the oracle's values (a matmul within f32
    rounding, a gather of rows exactly), on any CPU."""
    s = Strategy(kernels=KERNELS, cores=2, m_tile=4, parallel_min_bytes=0, dot_bits=0)
    _, got, want = _run(kind, True, s, ms=(1, 5), gather=True)
    np.testing.assert_array_equal(got["rows"], want["rows"])
    for m in (1, 5):
        np.testing.assert_allclose(got[f"y{m}"], want[f"y{m}"], rtol=1e-5, atol=1e-4)


@pytest.mark.skipif(not HAS_R16, reason=NO_R16)
@pytest.mark.parametrize("bits", [16, 8], ids=["int16", "int8"])
@pytest.mark.parametrize("kind", ["q4_0", "q4_1", "q8_0"])
def test_row_interleaved_kernel_equals_the_ggml_layout_kernels(kind, bits):
    """The row-interleaved tile, on 2 threads and 1, at every M: within the oracle's bound;
    each row the same bits in every M (batch invariance); bit for bit the ggml-layout
    kernels' results (lane-order GEMV at M = 1, GEMM tile above) where those sum in lane
    order (all but int8 x with Q8_0, which the ggml layout sums per row pair); and it is the
    kernel that ran (512-bit ``vpdpbusd``, no transposes)."""
    for cores in (2, 1):
        s = Strategy(kernels=KERNELS, cores=cores, m_tile=4, parallel_min_bytes=0,
                     dot_bits=bits, vnni=True)
        prog, got, want = _run(kind, True, s)
        _, base, _ = _run(kind, False, s)
        assert "vpdpbusd_512" in prog.lowered and "vpdpwssd" not in prog.lowered
        assert "vector<8xi16>" not in prog.lowered, "a ggml-layout transpose was emitted"
        for name in want:
            if not (kind == "q8_0" and bits == 8):
                np.testing.assert_array_equal(got[name], base[name], err_msg=f"{name}, {cores}")
            err = float(np.abs(got[name] - want[name]).max())
            assert err <= TOL[bits] * float(np.abs(want[name]).max()), name
        for m in MS:
            np.testing.assert_array_equal(got[f"y{m}"], got[f"y{max(MS)}"][:m],
                                          err_msg=f"M = {m}, {cores}")


@pytest.mark.skipif(not (HAS_R16 and amx_permitted()), reason="AMX tiles need a CPU with "
                    "AMX-TILE and AMX-INT8 and Linux's grant of the tile state, and the "
                    "row-interleaved kernel AVX-512 VNNI; this host or process lacks one")
@pytest.mark.parametrize("kind", ["q4_0", "q4_1", "q8_0"])
def test_amx_reads_the_layout_as_its_b_tiles(kind):
    """With AMX (M >= 9) the tile blocks' vectors are the B tiles: results equal the
    ggml-layout AMX kernel's bit for bit, M < 9 the row-interleaved VNNI tile's."""
    s = Strategy(kernels=KERNELS, cores=2, m_tile=4, parallel_min_bytes=0, dot_bits=16,
                 vnni=True, amx=True)
    prog, got, _ = _run(kind, True, s)
    _, base, _ = _run(kind, False, s)
    assert "amx.tile_muli" in prog.lowered
    for name in got:
        np.testing.assert_array_equal(got[name], base[name], err_msg=name)
