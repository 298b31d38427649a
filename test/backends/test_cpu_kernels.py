"""The CPU backend's matmul kernels (poot/backends/cpu/gemv.py) and its compile of fused
(dispatch-function) steps, against the oracle.

The row-streaming kernel reads the weight in place: dense f32/bf16/f16 or Q4_0/Q4_1/Q8_0 blocks
decoded in registers. Shapes cover N not a multiple of the vector width, K a multiple of 32
(and for dense weights K that is not), batch M = 1..4 and an M-tiled prefill M, on one thread
and with the row loop as scf.forall (OpenMP threads when libomp is installed).
"""

from __future__ import annotations

import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

from poot import oracle
from poot.backends.cpu.codegen import compile_cpu
from poot.backends.cpu.gemv import KERNELS
from poot.dialects.lowering import Strategy
from poot.dialects.quant import Quant
from poot.dialects.types import DType, PackedType, TensorType
from poot.graph.builder import Builder, TraceLimits

LIMITS = TraceLimits(max_values=100_000, max_ops=100_000, max_literal_bytes=1 << 20,
                     max_owned_bytes=1 << 30)
SERIAL = Strategy(kernels=KERNELS, m_tile=2, cores=1)
THREADED = Strategy(kernels=KERNELS, m_tile=2, cores=2, parallel_min_bytes=0)


def _quantized(fmt, n, k, rng):
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    w = rng.normal(size=(n, k)).astype(np.float32)
    return np.asarray(quantize(w, GGMLQuantizationType(fmt.ggml_type)),
                      dtype=np.uint8).reshape(-1)


def _gemv_graph(wtype, m, k, half_order="cast_first"):
    b = Builder(LIMITS)
    x = b.input("x", TensorType((m, k), DType.F32))
    w = b.param("w", wtype)
    if isinstance(wtype, PackedType):
        rhs = b.transpose(b.dequantize(w), (1, 0))
    elif wtype.dtype is DType.F32:
        rhs = b.transpose(w, (1, 0))
    elif half_order == "cast_first":
        rhs = b.transpose(b.cast(w, DType.F32), (1, 0))
    else:
        rhs = b.cast(b.transpose(w, (1, 0)), DType.F32)
    y = b.matmul(x, rhs)
    return b.finish({"y": y, "z": b.unary("exp", y * 0.01)})


def _run(g, strategy, inputs, params):
    prog = compile_cpu(g, strategy=strategy)
    assert "math.fma" in prog.lowered and "linalg.matmul" not in prog.lowered, \
        "the GEMV kernel was not chosen"
    got = prog.run(inputs, params)
    want = oracle.evaluate(g, inputs, params)
    for name in want:
        scale = max(1.0, float(np.abs(want[name]).max()))
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-4 * scale,
                                   err_msg=name)
    return prog


CASES = [  # (weight kind, n, k)
    ("q4_0", 37, 96), ("q4_1", 37, 96), ("q8_0", 37, 96),
    ("f32", 37, 96), ("f32", 13, 70), ("bf16", 21, 64), ("f16", 19, 48),
]


@pytest.mark.parametrize("strategy", [SERIAL, THREADED], ids=["serial", "forall"])
@pytest.mark.parametrize("kind,n,k", CASES, ids=[f"{c[0]}-{c[1]}x{c[2]}" for c in CASES])
@pytest.mark.parametrize("m", [1, 2, 3, 4])
def test_gemv_matches_oracle(kind, n, k, m, strategy):
    rng = np.random.default_rng(zlib.crc32(repr((kind, n, k, m)).encode()))   # the same each run
    if kind.startswith("q"):
        fmt = Quant[kind.upper()].value
        wtype = PackedType(fmt, (n, k))
        wv = _quantized(fmt, n, k, rng)
    else:
        dt = DType(kind)
        wtype = TensorType((n, k), dt)
        wv = rng.normal(size=(n, k)).astype(dt.numpy)
    g = _gemv_graph(wtype, m, k)
    _run(g, strategy, {"x": rng.normal(size=(m, k)).astype(np.float32)}, {"w": wv})


def test_half_weight_cast_after_transpose():
    rng = np.random.default_rng(3)
    g = _gemv_graph(TensorType((9, 40), DType.BF16), 2, 40, half_order="transpose_first")
    import ml_dtypes

    _run(g, SERIAL, {"x": rng.normal(size=(2, 40)).astype(np.float32)},
         {"w": rng.normal(size=(9, 40)).astype(ml_dtypes.bfloat16)})


@pytest.mark.parametrize("m", [7, 12])
def test_prefill_m_tiles(m):
    """A prefill-shaped matmul: M-tiles of m_tile rows against each decoded W row (a loop of
    tiles and a tail tile)."""
    rng = np.random.default_rng(m)
    fmt = Quant.Q4_1.value
    g = _gemv_graph(PackedType(fmt, (24, 64)), m, 64)
    _run(g, THREADED, {"x": rng.normal(size=(m, 64)).astype(np.float32)},
         {"w": _quantized(fmt, 24, 64, rng)})


def _indexed_graph(wtype, t):
    b = Builder(LIMITS)
    e, o, k = wtype.shape
    x = b.input("x", TensorType((t, k), DType.F32))
    idx = b.input("idx", TensorType((t,), DType.I32))
    w = b.param("w", wtype)
    wf = b.dequantize(w) if isinstance(wtype, PackedType) else \
        w if wtype.dtype is DType.F32 else b.cast(w, DType.F32)
    y = b.indexed_matmul(x, wf, idx)
    return b.finish({"y": y, "z": b.unary("exp", y * 0.01)})


@pytest.mark.parametrize("strategy", [SERIAL, THREADED,
                                      Strategy()], ids=["serial", "forall", "portable"])
@pytest.mark.parametrize("kind", ["q4_0", "q4_1", "q8_0", "f32", "bf16", "q5_0"])
def test_indexed_matmul_matches_oracle(kind, strategy):
    """``poot.indexed_matmul`` (a MoE layer's selected experts): 4 slabs of 37 x 64, 5 rows
    choosing slabs 3, 0, 3, 9 (clamped to 3) and -1 (clamped to 0). With the GEMV strategy
    each row's slab streams through the row kernel at its offset (no dequantized or gathered
    copy of the weight); the portable path (and any format without a vector decoder)
    is one linalg.generic decoding ``w[idx[t], o, k]`` in place (Q5_0 here)."""
    rng = np.random.default_rng(5)
    e, o, k, t = 4, 37, 64, 5
    if kind.startswith("q"):
        fmt = Quant[kind.upper()].value
        wtype = PackedType(fmt, (e, o, k))
        wv = _quantized(fmt, e * o, k, rng)
    else:
        dt = DType(kind)
        wtype = TensorType((e, o, k), dt)
        wv = rng.normal(size=(e, o, k)).astype(dt.numpy)
    g = _indexed_graph(wtype, t)
    prog = compile_cpu(g, strategy=strategy)
    in_place = strategy.kernels is not None and kind != "q5_0"
    assert ("math.fma" in prog.lowered) == in_place
    inputs = {"x": rng.normal(size=(t, k)).astype(np.float32),
              "idx": np.array([3, 0, 3, 9, -1], np.int32)}
    got = prog.run(inputs, {"w": wv})
    want = oracle.evaluate(g, inputs, {"w": wv})
    for name in want:
        scale = max(1.0, float(np.abs(want[name]).max()))
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-4 * scale,
                                   err_msg=name)


def test_portable_strategy_keeps_linalg():
    g = _gemv_graph(TensorType((8, 32), DType.F32), 1, 32)
    prog = compile_cpu(g, strategy=Strategy())
    assert "linalg.matmul" in prog.lowered and "math.fma" not in prog.lowered


def test_openmp_lookup_is_graceful(monkeypatch):
    """Without libomp the kernels compile single-threaded (no OpenMP lowering)."""
    from poot.backends.cpu import codegen as cpu

    monkeypatch.setenv("POOT_CPU_OPENMP", "0")
    cpu.openmp_lib.cache_clear()
    try:
        assert cpu.openmp_lib() is None and cpu.cpu_threads() == 1
        rng = np.random.default_rng(5)
        g = _gemv_graph(TensorType((40, 64), DType.F32), 1, 64)
        _run(g, THREADED, {"x": rng.normal(size=(1, 64)).astype(np.float32)},
             {"w": rng.normal(size=(40, 64)).astype(np.float32)})
    finally:
        cpu.openmp_lib.cache_clear()


def test_gather_of_packed_table_decodes_rows():
    """An embedding gather from a dequantized Q8_0 table decodes only the gathered rows
    (no generic over the whole table), exactly like the oracle."""
    rng = np.random.default_rng(7)
    fmt = Quant.Q8_0.value
    b = Builder(LIMITS)
    ids = b.input("ids", TensorType((1, 3), DType.I32))
    table = b.param("emb", PackedType(fmt, (50, 64)))
    g = b.finish({"e": b.gather(b.dequantize(table), ids, 0)})
    from mlir.passmanager import PassManager

    from poot.backends.cpu.codegen import lower_graph

    module, _ = lower_graph(g)
    with module.context:  # the dequantize of the whole table is dead once gathers decode
        PassManager.parse("builtin.module(canonicalize)").run(module.operation)
    assert "tensor<50x64xf32>" not in str(module)
    prog = compile_cpu(g)
    inputs = {"ids": np.array([[3, 49, 0]], np.int32)}
    params = {"emb": _quantized(fmt, 50, 64, rng)}
    np.testing.assert_array_equal(prog.run(inputs, params)["e"],
                                  oracle.evaluate(g, inputs, params)["e"])


# ---- fused steps through poot.compiler.compile ------------------------------------------------

@pytest.mark.parametrize("name", ["llama", "llama_gguf_q4_1"])
def test_fused_tiny_llama_steps(name):
    """poot.compiler.compile with ``precision="exact"`` (dispatch regions outlined into
    functions, func.call in the entry) of a prefill step then a decode step of the tiny Llama fixtures: logits and caches
    match the oracle within 1e-4, caches carried from the compiled program's own outputs."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
    from model_steps import compiled_steps_match_oracle

    from poot.compiler import CompileOptions, compile
    from poot.compiler.target import host_cpu

    def compile_fused(g):
        program = compile(g, host_cpu(), CompileOptions(precision="exact"))
        assert program.dispatches.get("matmul", 0) > 0
        assert "call @" in program.ir_text
        return program.executable

    compiled_steps_match_oracle(name, compile_fused)


def _host_has(*features) -> bool:
    from poot.compiler.target import host_cpu

    return set(features) <= host_cpu().caps.features


DOTS = [pytest.param(False, id="avx2"),
        pytest.param(True, id="vnni", marks=pytest.mark.skipif(
            not (_host_has("avx_vnni") or _host_has("avx512_vnni", "avx512vl")),
            reason="this host has neither AVX-VNNI nor AVX512-VNNI with VL"))]


#: bits of the quantized x -> (instruction the VNNI kernel uses, allowed error relative to the
#: largest |y|: int8 rounding of x, or int16 rounding, 1/256 of it)
DOT_BITS = {8: ("vpdpbusd", 2e-2), 16: ("vpdpwssd", 2e-4)}


@pytest.mark.skipif(not _host_has("avx2"), reason="integer dot products need AVX2")
@pytest.mark.parametrize("bits", [8, 16], ids=["int8", "int16"])
@pytest.mark.parametrize("vnni", DOTS)
@pytest.mark.parametrize("fmt", ["q4_0", "q4_1", "q8_0"])
@pytest.mark.parametrize("m,n", [(1, 37), (1, 40), (3, 36), (5, 38)],
                         ids=["m1-n37", "m1-n40", "m3-n36", "m5-n38"])
@pytest.mark.parametrize("n_tile", [1, 4])
def test_integer_dot_products(fmt, m, n, vnni, n_tile, bits):
    """Integer dot products (x quantized per 32-block to int8 as llama.cpp does, or to
    int16; AVX2 pmaddubsw / pmaddwd or VNNI vpdpbusd / vpdpwssd, psign for Q8_0 at int8), in
    decode W-row tiles of 1 (the default) or 4, 2 and 1 (n_tile 4: n = 40, 36 / 38, 37) and
    x-row tiles with a remainder (m = 5): within the precision of x of the oracle
    (:data:`DOT_BITS`), and the two instruction choices give the same sums."""
    rng = np.random.default_rng(11 + m + n)
    f = Quant[fmt.upper()].value
    k = 96
    g = _gemv_graph(PackedType(f, (n, k)), m, k)
    prog = compile_cpu(g, strategy=Strategy(kernels=KERNELS, cores=2, m_tile=2,
                                            parallel_min_bytes=0, dot_bits=bits, vnni=vnni,
                                            n_tile=n_tile))
    assert "llvm.x86.avx2.pmadd" not in prog.lowered  # stand-ins until after bufferization
    instr, tol = DOT_BITS[bits]
    assert (instr in prog.lowered) == vnni
    x, w = rng.normal(size=(m, k)).astype(np.float32), _quantized(f, n, k, rng)
    got = prog.run({"x": x}, {"w": w})["y"]
    want = oracle.evaluate(g, {"x": x}, {"w": w})["y"]
    assert np.abs(got - want).max() <= tol * np.abs(want).max()
    if vnni:  # exact integer sums either way: bitwise equal results
        other = compile_cpu(g, strategy=Strategy(kernels=KERNELS, cores=1, m_tile=2,
                                                 dot_bits=bits, n_tile=n_tile))
        np.testing.assert_array_equal(other.run({"x": x}, {"w": w})["y"], got)


# ---- thread count from the environment --------------------------------------------------------

@pytest.mark.parametrize("var", ["POOT_CPU_THREADS", "OMP_NUM_THREADS"])
@pytest.mark.parametrize("value", ["abc", "0", "-2", "1.5"])
def test_bad_thread_count_is_a_typed_error(monkeypatch, var, value):
    """A thread count the OpenMP runtime would abort on is refused first, naming the
    variable (host_cpu() runs before anything is compiled or loaded)."""
    from poot.compiler.target import InvalidThreads, host_cpu

    monkeypatch.delenv("POOT_CPU_THREADS", raising=False)
    monkeypatch.setenv(var, value)
    with pytest.raises(InvalidThreads, match=var):
        host_cpu()


def test_thread_count_precedence(monkeypatch):
    """POOT_CPU_THREADS wins over OMP_NUM_THREADS, whose first nesting level counts."""
    from poot.compiler.target import host_cpu

    monkeypatch.delenv("POOT_CPU_THREADS", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "3,2")
    assert host_cpu().caps.cores == 3
    monkeypatch.setenv("POOT_CPU_THREADS", "5")
    assert host_cpu().caps.cores == 5
