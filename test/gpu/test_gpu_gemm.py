"""The prefill GEMM strategy (:mod:`poot.backends.gpu.strategies.gemm`).

Without a GPU: the fragment lane maps against numpy matmul (an emulation of ``ldmatrix`` and
``mma.sync`` m16n8k16 from the PTX ISA's tables); which regions it takes (M > 8 on targets
with ``mma.sync``; gemv keeps M <= 8; Vulkan and older targets refuse); the PTX it makes for
every weight format and ragged shapes (``mma.sync`` + ``ldmatrix``, assembled by ptxas when
there is one); and the whole kernel -- tiling, staging, decode, double buffering, epilogue --
run on a Vulkan device (lavapipe) with each mma emulated from workgroup memory
(``EMULATE_MMA``), against the oracle within the strategy's stated error bound.

On a CUDA device: the same regions and a tiny model's prefill step (skipped here, saying
why). ``bench/gpu_run/gemm_check.py`` runs the same checks on a machine without MLIR.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
pytest.importorskip("mlir.ir", reason="the MLIR wheels (xtc-mlir-python-bindings) are not "
                    "installed here: this module compiles kernels")
from mlir import ir

from test_gpu_matmul import _dispatch_fn, gemv_region

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "vulkan"))

from poot import oracle  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _tiled_gemm_only(monkeypatch):
    """These are the tiled GEMM's tests: the decode GEMM, planned ahead of it for up to 128
    rows on mma.sync targets, takes none of their regions (its own tests:
    ``test_gpu_gemm_decode.py``)."""
    from poot.backends.gpu.strategies import gemm_decode

    monkeypatch.setattr(gemm_decode, "MAX_M", 0)


def _cuda_caps(**kw):
    from dataclasses import replace

    from poot.backends.cuda.codegen import cuda_target

    return replace(cuda_target().caps, **kw)


def _gemm(g, caps):
    from poot.backends.gpu.strategies.gemm import gemm

    fn = _dispatch_fn(g)
    with fn.context, ir.Location.unknown():
        return gemm(fn, caps)


# ---- fragment layouts: an emulation of ldmatrix + mma.sync (PTX ISA 9.7.14.5.8/.15) ----------

def _ptx_a(lane, i):
    """PTX ISA table, A of m16n8k16 (.f16/.bf16), element a_i (i = 0..7) of ``lane``."""
    group, tig = lane >> 2, lane % 4
    row = group if (i < 2 or 4 <= i < 6) else group + 8
    col = tig * 2 + (i & 1) + (8 if i >= 4 else 0)
    return row, col


def _ptx_b(lane, i):
    """B (16x8, k x n), element b_i (i = 0..3)."""
    group, tig = lane >> 2, lane % 4
    return tig * 2 + (i & 1) + (8 if i >= 2 else 0), group


def _ptx_c(lane, i):
    """C/D (16x8 f32), element c_i (i = 0..3)."""
    group, tig = lane >> 2, lane % 4
    return group + (8 if i >= 2 else 0), tig * 2 + (i & 1)


def _ldmatrix(mem: np.ndarray, addr, tiles: int):
    """``ldmatrix.sync.aligned.m8n8.x{tiles}.b16`` without .trans: thread ``8 q + r`` gives
    the address (row, col) of row r of matrix q (8 consecutive 16-bit elements); every lane
    gets, in register q, the two elements (row lane / 4, cols 2 (lane % 4), +1) of matrix q.
    Returns regs[lane][q] = (low half, high half)."""
    rows = {}
    for q in range(tiles):
        for r in range(8):
            rr, cc = addr(8 * q + r)
            rows[q, r] = mem[rr, cc:cc + 8]
    return [[(rows[q, lane // 4][2 * (lane % 4)], rows[q, lane // 4][2 * (lane % 4) + 1])
             for q in range(tiles)] for lane in range(32)]


def test_fragment_maps_are_the_ptx_tables():
    from poot.backends.gpu.strategies.gemm import a_fragment, b_fragment, c_fragment

    for lane in range(32):
        for reg in range(4):
            assert a_fragment(lane, reg) == [_ptx_a(lane, 2 * reg), _ptx_a(lane, 2 * reg + 1)]
        for reg in range(2):
            assert b_fragment(lane, reg) == [_ptx_b(lane, 2 * reg), _ptx_b(lane, 2 * reg + 1)]
        for i in range(4):
            assert c_fragment(lane, i) == _ptx_c(lane, i)


def test_ldmatrix_addresses_give_mma_fragments_and_the_product():
    """A 16x16 A tile stored [m][k] and two 8-column B tiles stored [n][k] (how the kernel
    keeps them in workgroup memory, with its padded row stride), read with the kernel's
    ldmatrix lane addresses, are the PTX fragments; mma over them, scattered by the C
    fragment map, is numpy's A @ B."""
    from poot.backends.gpu.strategies.gemm import PAD, a_ldmatrix_row, b_ldmatrix_row

    LDS = 16 + PAD

    rng = np.random.default_rng(0)
    A = rng.integers(-8, 8, (16, 16)).astype(np.float64)
    Bnk = rng.integers(-8, 8, (16, 16)).astype(np.float64)      # [n][k], two n-tiles
    sa = np.full((16, LDS), np.nan)
    sa[:, :16] = A
    sb = np.full((16, LDS), np.nan)
    sb[:, :16] = Bnk
    ra = _ldmatrix(sa, a_ldmatrix_row, 4)
    rb = _ldmatrix(sb, b_ldmatrix_row, 4)
    rb2 = _ldmatrix(sb, b_ldmatrix_row, 2)                      # .x2: the first n-tile
    D = np.zeros((16, 16))
    for nt in range(2):
        # rebuild each operand from the lanes' registers by the PTX tables
        a_seen = np.full((16, 16), np.nan)
        b_seen = np.full((16, 8), np.nan)
        for lane in range(32):
            for reg in range(4):
                for h in range(2):
                    r, c = _ptx_a(lane, 2 * reg + h)
                    a_seen[r, c] = ra[lane][reg][h]
            for reg in range(2):
                for h in range(2):
                    k, n = _ptx_b(lane, 2 * reg + h)
                    b_seen[k, n] = rb[lane][2 * nt + reg][h]
                    if nt == 0:
                        assert rb2[lane][reg][h] == rb[lane][reg][h]
        np.testing.assert_array_equal(a_seen, A)
        np.testing.assert_array_equal(b_seen, Bnk[8 * nt:8 * nt + 8].T)
        prod = a_seen @ b_seen
        for lane in range(32):
            for i in range(4):
                r, c = _ptx_c(lane, i)
                D[r, 8 * nt + c] = prod[r, c]
    np.testing.assert_array_equal(D, A @ Bnk.T)


# ---- which regions, which targets --------------------------------------------------------------

def test_capability_decides():
    from poot.backends.gpu.strategies.gemm import has_mma

    assert has_mma(_cuda_caps())
    assert has_mma(_cuda_caps(features=frozenset({"sm_80"})))
    assert not has_mma(_cuda_caps(features=frozenset({"sm_75"})))
    assert not has_mma(_cuda_caps(features=frozenset()))
    assert not has_mma(_cuda_caps(subgroup_size=64))


def test_vulkan_and_older_targets_refuse():
    from poot.backends.vulkan.codegen import vulkan_target

    g, _ = gemv_region("bf16", 32, 128, 64)
    assert _gemm(g, _cuda_caps()) is not None
    assert _gemm(g, vulkan_target({"subgroup_size": 32, "max_shared_bytes": 49152}).caps) \
        is None
    assert _gemm(g, _cuda_caps(features=frozenset({"sm_75"}))) is None
    assert _gemm(g, _cuda_caps(max_shared_bytes=0)) is None


@pytest.mark.parametrize("M,want", [(1, "gemv"), (8, "gemv"), (9, "gemm"), (32, "gemm")])
def test_gemv_keeps_decode_and_gemm_takes_prefill(M, want):
    from poot.backends.gpu.plan import plan_program

    g, _ = gemv_region("q4_1", M, 128, 256, "residual")
    plan = plan_program(SimpleNamespace(graph=g, storage=[]), _cuda_caps())
    assert set(plan.strategies) == {want}          # (a split-K GEMM is two launches)


@pytest.mark.parametrize("fmt,layout,norm", [("f32", "nk", None), ("bf16", "kn", None),
                                             ("bf16", "nk", "rmsnorm")])
def test_refused_regions(fmt, layout, norm):
    """f32 weights, [K, N] weights and an expression x (a folded norm) stay generic."""
    g, _ = gemv_region(fmt, 32, 128, 64, layout=layout, norm=norm)
    assert _gemm(g, _cuda_caps()) is None


def test_tiling():
    from poot.backends.gpu.strategies.gemm import choose_tiling

    t = choose_tiling(32, 4096, 4096, 132)
    assert (t.BM, t.BN, t.BK, t.T) == (32, 64, 64, 128) and t.smem_bytes <= 48 * 1024
    assert (choose_tiling(32, 16, 2048, 132).BN, choose_tiling(32, 16, 2048, 132).BK) == \
        (32, 128)                                         # narrow: one 32-column tile
    assert choose_tiling(32, 128256, 2048, 132).BN == 128   # wide (an LM head): x re-read less
    t = choose_tiling(128, 14336, 4096, 132)
    assert (t.BM, t.BN, t.BK, t.T) == (128, 128, 32, 256) and t.smem_bytes <= 48 * 1024
    assert choose_tiling(1000, 64, 64, 1).BM == 128
    t = choose_tiling(128, 1000, 512, 1, 32 * 1024)       # lavapipe: BN halved to fit
    assert t.smem_bytes <= 32 * 1024 and t.BN == 64
    assert choose_tiling(32, 4096, 576, 132, packed=True).BK == 64      # 576 = 9 x 64
    assert choose_tiling(32, 4096, 36, 132).BK == 32                    # no wider than K


def test_split_k(monkeypatch):
    """Split-K only when the tile grid has fewer than SPLIT_BLOCKS_PER_CORE blocks per unit;
    slices of at least SPLIT_MIN_STEPS K steps, at most MAX_SPLIT, none empty."""
    from poot.backends.gpu.strategies.gemm import (MAX_SPLIT, SPLIT_BLOCKS_PER_CORE,
                                                   SPLIT_MIN_STEPS, choose_split,
                                                   choose_tiling)

    for M, N, K in ((32, 2048, 8192), (32, 8192, 2048), (32, 16, 2048), (32, 512, 2048)):
        t = choose_tiling(M, N, K, 132)                   # batch-32 decode projections
        blocks = -(-N // t.BN)
        s = choose_split(t, M, N, K, 132)
        KT = -(-K // t.BK)
        kts = -(-KT // s)
        assert 2 <= s <= MAX_SPLIT and kts >= SPLIT_MIN_STEPS and (s - 1) * kts < KT
        assert blocks * s >= min(SPLIT_BLOCKS_PER_CORE * 132, blocks * MAX_SPLIT,
                                 blocks * (KT // SPLIT_MIN_STEPS)) * 0.5
    big = choose_tiling(2048, 8192, 4096, 132)              # 1024 blocks of 128 x 128
    assert choose_split(big, 2048, 8192, 4096, 132) == 1
    t = choose_tiling(32, 2048, 96, 132)                    # K too short to slice
    assert choose_split(t, 32, 2048, 96, 132) == 1
    from poot.backends.gpu.strategies import gemm as G

    t = choose_tiling(32, 2048, 8192, 132)                  # partials capped: fewer slices
    monkeypatch.setattr(G, "MAX_SPLIT_SCRATCH", 3 * 32 * 2048 * 4)
    assert choose_split(t, 32, 2048, 8192, 132) == 3


# ---- PTX (no device) ---------------------------------------------------------------------------

_PTX_CASES = [("bf16", 32, 1000, 576), ("f16", 32, 576, 1536), ("q4_0", 32, 1000, 576),
              ("q4_1", 128, 576, 256), ("q8_0", 77, 300, 128), ("q4_k", 40, 192, 512),
              ("q6_k", 64, 100, 256), ("bf16", 9, 7, 40), ("f16", 300, 130, 36),
              ("bf16", 77, 100, 100)]


@pytest.mark.parametrize("fmt,M,N,K", _PTX_CASES)
def test_ptx_has_tensor_core_mma(fmt, M, N, K):
    from poot.backends.cuda.codegen import ptx_text, ptxas_check
    from poot.backends.gpu.plan import plan_program

    g, _ = gemv_region(fmt, M, N, K, "residual")
    plan = plan_program(SimpleNamespace(graph=g, storage=[]), _cuda_caps())
    kernels = [L for L in plan.launches if L["op"] == "kernel"]
    assert plan.strategies == {"gemm": len(kernels)}
    ptx = ptx_text(plan.module)
    if len(kernels) == 2:                  # split-K (a short grid): slices, then the reduction
        assert kernels[0]["grid"][2] > 1 and ptx.count(".entry ") == 2
    ty = "bf16" if fmt == "bf16" else "f16"
    assert f"mma.sync.aligned.m16n8k16.row.col.f32.{ty}.{ty}.f32" in ptx
    assert "ldmatrix.sync.aligned.m8n8.x" in ptx and "bar.sync" in ptx
    shared = re.findall(r"\.shared \.align (\d+) ", ptx)
    assert len(shared) == 2 and set(shared) == {"16"}      # 16-byte rows: ldmatrix, st.v4
    if K % 8 == 0:         # x staged 16 bytes at a time, workgroup stores 16 bytes
        assert re.search(r"ld\.global\.nc\.v4", ptx) and "st.shared.v4" in ptx
    ptxas_check(ptx)


@pytest.mark.parametrize("fmt,M,N,K,ring", [("bf16", 32, 1000, 576, True),
                                             ("f16", 32, 576, 1536, True),
                                             ("bf16", 77, 100, 100, False),   # K tail
                                             ("q4_0", 32, 1000, 576, False)])  # packed
def test_dense_16bit_weights_stream_through_a_cp_async_ring(fmt, M, N, K, ring):
    """A dense bf16/f16 weight with K a multiple of the K step goes global -> workgroup
    memory by ``cp.async`` (16 bytes, L1 bypassed) into a ring of ``stages`` (3-4) tiles
    that fits the shared-memory budget, K steps kt + 1 .. kt + stages - 1 in flight while
    step kt's mma's run; a K tail or a packed weight keeps the register-staged double
    buffer."""
    from poot.backends.cuda.codegen import ptx_text, ptxas_check
    from poot.backends.gpu.plan import plan_program
    from poot.backends.gpu.strategies.gemm import STAGES, choose_tiling, with_stages

    caps = _cuda_caps()
    g, _ = gemv_region(fmt, M, N, K, "residual")
    plan = plan_program(SimpleNamespace(graph=g, storage=[]), caps)
    ptx = ptx_text(plan.module)
    assert ("cp.async.cg.shared.global" in ptx) == ring
    if ring:
        t = with_stages(choose_tiling(M, N, K, caps.cores, caps.max_shared_bytes),
                        caps.max_shared_bytes)
        assert t.stages in STAGES and t.smem_bytes <= caps.max_shared_bytes
        assert re.search(r"cp\.async\.cg\.shared\.global \[[^]]+\], \[[^]]+\], 16;", ptx)
        assert re.search(rf"cp\.async\.wait_group\s+{t.stages - 2};", ptx)
        sizes = sorted(int(n) for n in re.findall(r"\.shared \.align 16 \.b8 [^[]+\[(\d+)\]",
                                                   ptx))
        assert t.stages * t.BN * t.LDS * 2 in sizes        # the weight ring, whole
    ptxas_check(ptx)


# ---- the whole kernel on a Vulkan device, mma emulated -----------------------------------------

def _decoded(fmt, w, N, K):
    if fmt in ("bf16", "f16", "f32"):
        return np.asarray(w).astype(np.float32)
    from poot.dialects.quant import BY_NAME
    from poot.dialects.quant_ref import dequantize

    return dequantize(BY_NAME[fmt], np.asarray(w), (N, K))


def _bound(fmt, M, N, K, epilogue, inputs):
    from poot.backends.gpu.strategies.gemm import error_bound

    mma = "bf16" if fmt == "bf16" else "f16" if fmt == "f16" else "f16q"
    b = error_bound(inputs["a0"].reshape(M, K), _decoded(fmt, inputs["a1"], N, K), mma)
    if epilogue == "silu_up":                 # |d/dy silu(y) * up| <= 1.1 |up|
        b = b * 1.1 * np.abs(inputs["a2"].reshape(M, N))
    return b


#: (format, M, N, K, epilogue, forced (BM, BN, BK) or None: the strategy's own for lavapipe's
#: 32 KiB of workgroup memory, BK 32)
_EMU_CASES = [("bf16", 77, 100, 100, "residual", None),       # BM 128, 8 warps, all ragged
              ("bf16", 19, 40, 36, "silu_up", None),          # K % 8: scalar staging
              ("f16", 9, 72, 40, "residual", None), ("q4_0", 33, 100, 576, "silu_up", None),
              ("q8_0", 100, 72, 128, "none", None), ("q4_k", 20, 48, 512, "none", None),
              ("q6_k", 17, 40, 256, "residual", None),
              # K steps of 64 and 128: tails, several blocks per row and K step
              ("bf16", 40, 70, 200, "residual", (64, 32, 64)),
              ("f16", 12, 40, 300, "none", (16, 32, 128)),
              ("q4_0", 20, 40, 512, "none", (32, 32, 64)),
              ("q4_1", 16, 64, 384, "none", (16, 32, 128)),
              ("q8_0", 50, 40, 256, "residual", (64, 32, 64)),
              ("q6_k", 9, 40, 512, "none", (16, 32, 128))]


def _within_bound(dev, target, g, inputs, fmt, M, N, K, epilogue):
    """Run region ``g`` on the Vulkan device; every element within the strategy's bound of
    the f32 oracle."""
    from poot.backends.vulkan.codegen import codegen_vulkan
    from test_vulkan_kernels import run_artifact

    want = oracle.evaluate(g, inputs)["r0"].reshape(M, N)
    got = run_artifact(dev, codegen_vulkan(g, target), inputs)["r0"].reshape(M, N)
    err = np.abs(got.astype(np.float64) - want)
    bound = _bound(fmt, M, N, K, epilogue, inputs) + 1e-6 * np.abs(want)
    assert np.isfinite(got).all()
    assert (err <= bound).all(), f"worst err/bound {(err / bound).max():.3g}"


@pytest.mark.parametrize("fmt,M,N,K,epilogue,tile", _EMU_CASES)
def test_emulated_kernel_matches_oracle(vk, monkeypatch, fmt, M, N, K, epilogue, tile):
    """Every part of the kernel but the two tensor-core instructions, on lavapipe: within
    the stated bound of the f32 oracle."""
    from poot.backends.gpu.plan import plan_program
    from poot.backends.gpu.strategies import gemm as G

    dev, target = vk
    monkeypatch.setattr(G, "EMULATE_MMA", G.MMA_SYNC)
    monkeypatch.setattr(G, "FORCE_TILING", tile)
    g, inputs = gemv_region(fmt, M, N, K, epilogue, seed=M + N + K)
    plan = plan_program(SimpleNamespace(graph=g, storage=[]), target.caps)
    assert set(plan.strategies) == {"gemm"}         # (split-K: two launches)
    _within_bound(dev, target, g, inputs, fmt, M, N, K, epilogue)


#: (format, M, N, K, epilogue, forced tile, forced split): uneven slices, a K tail in the last
#: slice, packed decode per slice, an epilogue reading an argument in the reduction kernel
_SPLIT_CASES = [("bf16", 40, 70, 520, "residual", (32, 32, 64), 3),
                ("q4_0", 20, 40, 512, "silu_up", (32, 32, 64), 4),
                ("f16", 12, 40, 300, "none", (16, 32, 128), 2),
                ("q8_0", 50, 40, 256, "residual", (64, 32, 32), 3)]


@pytest.mark.parametrize("fmt,M,norm,want", [("bf16", 2, None, "gemv"), ("bf16", 4, None, "gemm"),
                                             ("f16", 8, None, "gemm"), ("q4_1", 8, None, "gemv"),
                                             ("bf16", 4, "rmsnorm", None)])
def test_decode_rows_of_dense_16bit_weights_take_the_gemm(fmt, M, norm, want):
    """From GEMM_FROM_M rows a dense bf16/f16 matmul is the split-K GEMM's on a tensor-core
    target (measured faster than the GEMV from 2 rows); packed weights keep the GEMV up to
    MAX_M; a folded norm in front is refused by both (the fold is then not taken)."""
    from poot.backends.gpu.strategies.matmul import gemv
    from poot.backends.gpu.strategies.matmul_match import GEMM_FROM_M

    assert GEMM_FROM_M == 3
    g, _ = gemv_region(fmt, M, 256, 512, "residual", norm=norm)
    fn = _dispatch_fn(g)
    with fn.context, ir.Location.unknown():
        from poot.backends.gpu.strategies.gemm import gemm

        got = "gemm" if gemm(fn, _cuda_caps()) is not None else \
            "gemv" if gemv(fn, _cuda_caps()) is not None else None
    assert got == want


@pytest.mark.parametrize("fmt,want", [("bf16", "gemm"), ("q8_0", "gemm"), ("f32", "gemv")])
def test_narrow_matmuls_past_max_m_take_the_split_gemm(fmt, want):
    """A rank-16 LoRA shrink at batch 32 ([32, 2048] x [2048, 16]) on a tensor-core target: the
    GEMM, K in slices (the GEMV would re-read all of x for each column); f32 weights, which
    the GEMM refuses, stay the GEMV's."""
    from poot.backends.gpu.plan import plan_program

    g, _ = gemv_region(fmt, 32, 16, 2048, "residual")
    plan = plan_program(SimpleNamespace(graph=g, storage=[]), _cuda_caps())
    assert set(plan.strategies) == {want}
    if want == "gemm":
        assert [L["grid"][2] > 1 for L in plan.launches if L["op"] == "kernel"] == [True, False]


@pytest.mark.parametrize("fmt,M,N,K,epilogue,tile,split", _SPLIT_CASES)
def test_emulated_split_k_matches_oracle(vk, monkeypatch, fmt, M, N, K, epilogue, tile,
                                         split):
    """Split-K (slices of K on grid z, partials summed by a second kernel that applies the
    epilogue) on lavapipe: two launches, within the same bound of the f32 oracle."""
    from poot.backends.gpu.plan import plan_program
    from poot.backends.gpu.strategies import gemm as G

    dev, target = vk
    monkeypatch.setattr(G, "EMULATE_MMA", G.MMA_SYNC)
    monkeypatch.setattr(G, "FORCE_TILING", tile)
    monkeypatch.setattr(G, "FORCE_SPLIT", split)
    g, inputs = gemv_region(fmt, M, N, K, epilogue, seed=M + N + K)
    plan = plan_program(SimpleNamespace(graph=g, storage=[]), target.caps)
    kernels = [L for L in plan.launches if L["op"] == "kernel"]
    assert [L["grid"][2] for L in kernels] == [split, 1]
    _within_bound(dev, target, g, inputs, fmt, M, N, K, epilogue)


def _attn_out_region(H, T, D, N, seed=0):
    """``o_proj(attention output)`` as the tracer leaves it: x is a transposed view
    ([1, H, T, D] -> [T, H * D]) of the argument, then a Q4_1 weight and a residual add."""
    from poot.dialects import make_context
    from poot.dialects.quant import BY_NAME
    from poot.graph.builder import Graph

    rng = np.random.default_rng(seed)
    K = H * D
    q = BY_NAME["q4_1"]
    raw = rng.integers(0, 256, (N * K // 32, q.block_bytes), dtype=np.uint8)
    raw[:, 0:2] = rng.uniform(0.002, 0.02, len(raw)).astype(np.float16).view(np.uint8) \
        .reshape(-1, 2)
    raw[:, 2:4] = (-rng.uniform(0.01, 0.1, len(raw))).astype(np.float16).view(np.uint8) \
        .reshape(-1, 2)
    a = rng.standard_normal((1, H, T, D)).astype(np.float32)
    r = rng.standard_normal((1, T, N)).astype(np.float32)
    at, wt = f"tensor<1x{H}x{T}x{D}xf32>", f"!poot.packed<#poot.q4_1, array<i64: {N}, {K}>>"
    ot = f"tensor<1x{T}x{N}xf32>"
    body = [f'%t = "poot.transpose"(%a0) {{perm = array<i64: 0, 2, 1, 3>}} : ({at}) -> '
            f'tensor<1x{T}x{H}x{D}xf32>',
            f'%x = "poot.reshape"(%t) : (tensor<1x{T}x{H}x{D}xf32>) -> tensor<{T}x{K}xf32>',
            f'%wd = "poot.dequantize"(%a1) : ({wt}) -> tensor<{N}x{K}xf32>',
            f'%w = "poot.transpose"(%wd) {{perm = array<i64: 1, 0>}} : (tensor<{N}x{K}xf32>) '
            f'-> tensor<{K}x{N}xf32>',
            f'%y = "poot.matmul"(%x, %w) {{acc = f32}} : (tensor<{T}x{K}xf32>, '
            f'tensor<{K}x{N}xf32>) -> tensor<{T}x{N}xf32>',
            f'%y3 = "poot.reshape"(%y) : (tensor<{T}x{N}xf32>) -> {ot}',
            f'%o = "poot.binary"(%a2, %y3) {{fn = "add"}} : ({ot}, {ot}) -> {ot}']
    text = (f'func.func @region(%b0: {at} {{poot.name = "a0"}}, %b1: {wt} {{poot.name = "a1"}},'
            f' %b2: {ot} {{poot.name = "a2"}}) -> ({ot} {{poot.name = "r0"}}) {{\n'
            f"  %r = func.call @gemv_dispatch(%b0, %b1, %b2) : ({at}, {wt}, {ot}) -> {ot}\n"
            f"  return %r : {ot}\n}}\n"
            f"func.func private @gemv_dispatch(%a0: {at}, %a1: {wt}, %a2: {ot}) -> {ot} "
            f'attributes {{poot.dispatch = {{kind = "matmul", ops = {len(body)} : i64}}}} {{\n  '
            + "\n  ".join(body) + f"\n  return %o : {ot}\n}}\n")
    with make_context(), ir.Location.unknown():
        g = Graph.from_module(ir.Module.parse(text))
    x = a.transpose(0, 2, 1, 3).reshape(T, K)
    return g, {"a0": a, "a1": raw.reshape(-1), "a2": r}, x


def test_expression_x_is_taken():
    """x a view of an argument (the attention output's transpose) is staged element by
    element through the scalar emitter; a folded norm (row reductions) is refused."""
    g, _, _ = _attn_out_region(4, 32, 16, 64)
    assert _gemm(g, _cuda_caps()) is not None


@pytest.mark.parametrize("tile", [None, (32, 32, 64)])
def test_emulated_expression_x_matches_oracle(vk, monkeypatch, tile):
    from poot.backends.gpu.plan import plan_program
    from poot.backends.gpu.strategies import gemm as G
    from poot.backends.vulkan.codegen import codegen_vulkan
    from test_vulkan_kernels import run_artifact

    dev, target = vk
    monkeypatch.setattr(G, "EMULATE_MMA", G.MMA_SYNC)
    monkeypatch.setattr(G, "FORCE_TILING", tile)
    H, T, D, N = 4, 40, 16, 96
    g, inputs, x = _attn_out_region(H, T, D, N, seed=2)
    plan = plan_program(SimpleNamespace(graph=g, storage=[]), target.caps)
    assert set(plan.strategies) == {"gemm"}         # (split-K: two launches)
    want = oracle.evaluate(g, inputs)["r0"].reshape(T, N)
    got = run_artifact(dev, codegen_vulkan(g, target), inputs)["r0"].reshape(T, N)
    bound = _bound("q4_1", T, N, H * D, "residual", {"a0": x, "a1": inputs["a1"]}) \
        + 1e-6 * np.abs(want)
    err = np.abs(got.astype(np.float64) - want)
    assert (err <= bound).all(), f"worst err/bound {(err / bound).max():.3g}"


#: the tiny Q4_1 Llama's prefill logits through the emulated GEMM vs the oracle's (relative
#: to max(1, max |logits|)): f16 inputs over two layers
PREFILL_RTOL = 5e-3


def test_emulated_tiny_prefill_step_matches_oracle(vk_device, vk_target, monkeypatch):
    """A whole 32-token prefill of the tiny Q4_1 Llama (every projection through the GEMM,
    mma emulated) on lavapipe, through the executor Session, against the oracle."""
    from poot.backends.gpu.strategies import gemm as G
    from poot.backends.vulkan.codegen import compile_vulkan
    from poot.runtime import Session
    from poot.models import StepSpec, load_model
    from model_steps import empty_caches, step_feed

    monkeypatch.setattr(G, "EMULATE_MMA", G.MMA_SYNC)
    made = []
    kernel = G._GemmKernel.kernel
    monkeypatch.setattr(G._GemmKernel, "kernel", lambda self: made.append(self.m.K) or
                        kernel(self))
    model, weights = load_model(str(ROOT / "test" / "fixtures" / "tiny" / "llama_gguf_q4_1"))
    T = 32
    pre = model.trace(StepSpec.prefill(T, kv_capacity=64, kv_slots=1), weights.types)
    prog = compile_vulkan(pre, vk_target)
    assert len(made) >= 7 and 128 in made, made      # q, k, v, o, gate, up, down (layers share)
    eng = Session(vk_device)
    eng.load_weights(weights.arrays, weights.types)
    entry = eng.add_entry(prog)
    rng = np.random.default_rng(0)
    inputs = step_feed(pre, rng.integers(3, 250, (1, T)), np.arange(T)[None], [0])
    got = eng.step(entry, inputs)["logits"]
    want = oracle.evaluate(pre, {**inputs, **empty_caches(pre)}, weights)["logits"]
    err = np.abs(np.asarray(got, np.float64) - want).max()
    print(f"prefill logits: max err {err:.3g}, max |logits| {np.abs(want).max():.3g}")
    assert err <= PREFILL_RTOL * max(1.0, np.abs(want).max()), err


def test_error_bound_is_not_vacuous():
    """The bound is tight enough to catch a wrong element: bf16 about 4e-3 and f16 about
    5e-4 of max |y| for random data."""
    from poot.backends.gpu.strategies.gemm import error_bound

    rng = np.random.default_rng(1)
    x = rng.standard_normal((32, 576)).astype(np.float32)
    w = (rng.standard_normal((100, 576)) / 24).astype(np.float32)
    y = np.abs(x @ w.T).max()
    assert error_bound(x, w, "bf16").max() / y < 2e-2
    assert error_bound(x, w, "f16").max() / y < 3e-3


# ---- on a CUDA device --------------------------------------------------------------------------

def _cuda():
    from poot.backends.cuda.runtime import device_available

    ok, why = device_available()
    if not ok:
        pytest.skip(f"{why} (bench/gpu_run/gemm_check.py --check runs these "
                    "on a GPU machine)")


@pytest.mark.parametrize("case", range(11))
def test_cuda_gemm_matches_oracle(tmp_path, case):
    _cuda()
    sys.path.insert(0, str(ROOT / "bench" / "gpu_run"))
    import gemm_check
    from poot.backends.cuda.codegen import cuda_target
    from poot.backends.cuda.runtime import CudaDevice

    fmt, M, N, K, epi = gemm_check.CASES[case]
    gemm_check.build_case(tmp_path, fmt, M, N, K, epi, cuda_target().caps, seed=case)
    r = gemm_check.check_case(CudaDevice(), tmp_path)
    assert r["ok"], r


def test_cuda_tiny_prefill_matches_oracle(tmp_path):
    _cuda()
    sys.path.insert(0, str(ROOT / "bench" / "gpu_run"))
    import gemm_check

    info = gemm_check.build_prefill(tmp_path)
    assert info["strategies"].get("gemm")
    r = gemm_check.check_prefill(tmp_path)
    assert r["ok"], r


def test_tiny_prefill_plans_its_matmuls_as_gemm():
    """No device: a 32-token prefill of the tiny Q4_1 Llama takes the GEMM for its
    projections (and the PTX assembles)."""
    from poot.backends.cuda.codegen import cuda_target, ptxas_check
    from poot.compiler.compile import compile as compile_step
    from poot.models import StepSpec, load_model

    model, weights = load_model(str(ROOT / "test" / "fixtures" / "tiny" / "llama_gguf_q4_1"))
    g = model.trace(StepSpec.prefill(32, kv_capacity=64, kv_slots=1), weights.types)
    art = compile_step(g, cuda_target()).executable
    assert art.meta["strategies"].get("gemm", 0) >= 4, art.meta["strategies"]
    assert "mma.sync.aligned.m16n8k16" in art.ptx
    ptxas_check(art.ptx)
