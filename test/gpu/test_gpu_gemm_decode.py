"""The decode GEMM strategy (:mod:`poot.backends.gpu.strategies.gemm_decode`).

Without a GPU: the lanes' k assignment against the PTX ISA's mma.m16n8k16 fragment tables
(an emulation: registers built as the kernel builds them, multiplied as the instruction does,
give x @ w.T); which regions planning gives it (from M and the weight format); its tiling
rules; the PTX it makes for every format and several M (assembled by ptxas when there is
one). On a CUDA device ``bench/gpu_run/gemm_decode_check.py`` holds every element to the
error bound of the tiled GEMM (skipped here: no MLIR there, no GPU here).
"""

from __future__ import annotations

import re
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
pytest.importorskip("mlir.ir", reason="the MLIR wheels (xtc-mlir-python-bindings) are not "
                    "installed here: this module compiles kernels")

from test_gpu_gemm import _cuda_caps, _ptx_a, _ptx_b, _ptx_c  # noqa: E402
from test_gpu_matmul import gemv_region  # noqa: E402


@pytest.mark.parametrize("fmt", ["bf16", "f16", "q4_0", "q4_1", "q8_0"])
def test_lane_k_assignment_is_an_mma_of_the_whole_step(fmt):
    """Registers built as the kernel builds them (lane (g, t): A a0..a3 = x rows g, g+8 at
    the first / last two of its :func:`lane_ks`, B b0 b1 = weight row g at the same k),
    multiplied as ``mma.m16n8k16`` does (PTX tables: virtual k of each register half), over
    the step's two mma's, give x @ w.T of the 32-k step: every k once, A and B agreeing."""
    from poot.backends.gpu.strategies.gemm_decode import KSTEP, lane_ks

    rng = np.random.default_rng(0)
    X = rng.integers(-8, 8, (16, KSTEP)).astype(np.float64)
    W = rng.integers(-8, 8, (8, KSTEP)).astype(np.float64)
    D = np.zeros((16, 8))
    seen = set()
    for s in (0, 1):
        A = np.full((16, 16), np.nan)              # the instruction's view: virtual k
        B = np.full((16, 8), np.nan)
        for lane in range(32):
            g, t = lane >> 2, lane & 3
            ks = lane_ks(fmt, t, s)
            seen.update(ks)
            a = [X[g, ks[0:2]], X[g + 8, ks[0:2]], X[g, ks[2:4]], X[g + 8, ks[2:4]]]
            b = [W[g, ks[0:2]], W[g, ks[2:4]]]
            for i in range(8):
                A[_ptx_a(lane, i)] = a[i // 2][i % 2]
            for i in range(4):
                B[_ptx_b(lane, i)] = b[i // 2][i % 2]
        assert not np.isnan(A).any() and not np.isnan(B).any()
        prod = A @ B
        for lane in range(32):
            for i in range(4):
                D[_ptx_c(lane, i)] += prod[_ptx_c(lane, i)]
    assert seen == set(range(KSTEP))
    np.testing.assert_array_equal(D, X @ W.T)


def _mma_caps(**kw):
    """The sm_90 CUDA target without its sm_90a feature: the mma.sync decode GEMM (on
    sm_90a the wgmma one takes the same regions: test_gpu_gemm_decode_wgmma.py)."""
    caps = _cuda_caps(**kw)
    return replace(caps, features=caps.features - {"sm_90a"})


def _plan(fmt, M, N, K, caps=None):
    from poot.backends.gpu.plan import plan_program

    g, _ = gemv_region(fmt, M, N, K, "residual")
    return plan_program(SimpleNamespace(graph=g, storage=[]), caps or _mma_caps())


@pytest.mark.parametrize("fmt,M,want", [
    ("bf16", 2, "gemv"), ("bf16", 3, "gemm_decode"), ("bf16", 8, "gemm_decode"),
    ("bf16", 9, "gemm_decode"), ("f16", 64, "gemm_decode"), ("f16", 65, "gemm_decode"),
    ("bf16", 128, "gemm_decode"), ("bf16", 129, "gemm"), ("q4_1", 8, "gemv"),
    ("q4_1", 9, "gemm_decode"), ("q4_0", 64, "gemm_decode"), ("q8_0", 128, "gemm_decode"),
    ("q4_0", 256, "gemm"), ("q4_k", 32, "gemm"), ("q6_k", 64, "gemm")])
def test_planning_picks_the_decode_gemm_from_m_and_format(fmt, M, want):
    """M rows the GEMV leaves to a GEMM up to 128, for bf16/f16/Q4_0/Q4_1/Q8_0 weights;
    more rows (prefill) and the K-quants keep the tiled GEMM."""
    plan = _plan(fmt, M, 576, 512)
    assert set(plan.strategies) == {want}


def test_other_targets_and_shapes_keep_the_tiled_gemm():
    """K not a multiple of 32, targets without ``mma.sync`` (Vulkan, sm_75) and the tests'
    emulated mma do not get it."""
    from poot.backends.gpu.strategies import gemm as G
    from poot.backends.vulkan.codegen import vulkan_target

    assert set(_plan("bf16", 128, 100, 100).strategies) == {"gemm"}
    vk = vulkan_target({"subgroup_size": 32, "max_shared_bytes": 49152}).caps
    assert "gemm_decode" not in _plan("bf16", 128, 128, 64, vk).strategies
    assert "gemm_decode" not in _plan("bf16", 128, 128, 64,
                                      _cuda_caps(features=frozenset({"sm_75"}))).strategies
    old = G.EMULATE_MMA
    try:
        G.EMULATE_MMA = G.MMA_SYNC
        assert "gemm_decode" not in _plan("bf16", 128, 128, 64).strategies
    finally:
        G.EMULATE_MMA = old


@pytest.mark.parametrize("M,N,K,wbytes", [
    (64, 2048, 2048, 2048 * 2048 * 2), (64, 512, 2048, 512 * 2048 * 2),
    (64, 8192, 2048, 8192 * 2048 * 2), (64, 2048, 8192, 2048 * 8192 * 2),
    (8, 128256, 2048, 128256 * 2048 * 2), (128, 8192, 2048, 8192 * 2048 * 2),
    (64, 576, 576, 576 * 18 * 20), (33, 1536, 576, 1536 * 18 * 20), (3, 64, 32, 64 * 64)])
def test_decode_tiling(M, N, K, wbytes):
    """All M in the warp's tiles (weights read once), at most 16 accumulator tiles, K steps
    dealt evenly to S slices and chunks of U, a grid of about BLOCKS_PER_CORE / sqrt(MT)
    blocks per compute unit where K allows, partials within their cap, x fragments within
    32 KB."""
    from poot.backends.gpu.strategies import gemm_decode as D

    d = D.decode_tiling(M, N, K, 132, wbytes)
    KT = K // D.KSTEP
    assert 16 * d.MT >= M > 16 * (d.MT - 1) and d.MT * d.NT <= D.MAX_TILES
    assert d.S * d.per_block == KT and d.per_block % d.U == 0 and d.MT * d.U <= 16
    assert 2 * d.entries * 16 <= 32 * 1024
    nb = -(-N // d.BN)
    if d.S > 1:
        assert d.S * M * N * 4 <= max(wbytes, D.L2_PARTIALS)
        assert d.per_block >= D.MIN_BLOCK_STEPS
    # (S divides the steps: at least half the blocks asked, where K's steps allow them)
    assert 2 * nb * d.S >= min(D.BLOCKS_PER_CORE * 132 / d.MT ** 0.5,
                               nb * min(D.MAX_SPLIT, KT // 2))


@pytest.mark.parametrize("M,N,K,bpw,want", [
    (32, 2048, 2048, 2, (1, 8, 8, 2)), (16, 8192, 2048, 2, (1, 8, 4, 2)),
    (64, 2048, 2048, 2, (2, 8, 8, 4)), (64, 8192, 2048, 2, (2, 8, 4, 4)),
    (64, 2048, 8192, 2, (2, 8, 8, 4)), (128, 2048, 8192, 2, (2, 8, 8, 2)),
    (128, 128256, 2048, 2, (2, 8, 1, 2)), (64, 1536, 576, 20 / 32, (2, 4, 9, 2)),
    (128, 49152, 576, 20 / 32, (2, 4, 1, 2))])
def test_decode_tiling_takes_the_swept_tilings(M, N, K, bpw, want):
    """Shapes of the Llama-3.2-1B (bf16) decode step where the H100 sweep's fastest (NT,
    WN, S, U), or one within 3 % of it, is what the rule picks, and SmolLM2's (Q4_1, 20
    bytes a 32-block; K under LONG_K_STEPS steps) gate/up and LM head at the grids its
    decode step's profile measured faster than 8 warps of one n-tile
    (bench/results/decode_gemm.md)."""
    from poot.backends.gpu.strategies import gemm_decode as D

    d = D.decode_tiling(M, N, K, 132, int(N * K * bpw))
    assert (d.NT, d.WN, d.S, d.U) == want


_PTX = [(f, M) for f in ("bf16", "f16", "q4_0", "q4_1", "q8_0") for M in (2, 8, 33, 64, 100, 256)]


@pytest.mark.parametrize("fmt,M", _PTX)
def test_ptx_for_each_format_and_m(fmt, M):
    """Each format at M = 2, 8, 33, 64, 100, 256 plans and assembles; the decode GEMM's
    kernels (M 3..128 dense, 9..128 packed) are mma.sync of the weight's type with no ldmatrix and no
    workgroup tile (only the warps' sums), dense weights read 16 bytes a load, no local
    memory (spills)."""
    from poot.backends.cuda.codegen import ptx_text, ptxas_check

    N, K = 300, 576                                      # N ragged
    plan = _plan(fmt, M, N, K)
    ptx = ptx_text(plan.module)
    dense = fmt in ("bf16", "f16")
    decode = 3 <= M <= 128 if dense else 9 <= M <= 128
    want = "gemm_decode" if decode else ("gemv" if M <= 8 or (dense and M < 3) else "gemm")
    assert set(plan.strategies) == {want}
    if want == "gemm_decode":
        ty = "bf16" if fmt == "bf16" else "f16"
        assert f"mma.sync.aligned.m16n8k16.row.col.f32.{ty}.{ty}.f32" in ptx
        assert "ldmatrix" not in ptx and ".local" not in ptx
        if dense:
            assert re.search(r"ld\.global\.nc\.v4\.(u32|b32)", ptx)
    ptxas_check(ptx)


def test_sibling_decode_gemms_fuse_and_assemble():
    """The q/k/v projections of one x at batch 128 (decode GEMMs with split-K: partials, then
    the reductions) fuse phase by phase into two launches, whose PTX assembles; each
    member's warp sums keep their own workgroup buffer within 48 KiB."""
    from test_gpu_horizontal import _gemm_step, kernel_launches, plan_of

    from poot.backends.cuda.codegen import ptx_text, ptxas_check

    plan = plan_of(_gemm_step(128, 2048, [2048, 512, 512])[0], _mma_caps())
    assert [L["strategy"] for L in kernel_launches(plan)] == ["horizontal", "horizontal"]
    ptx = ptx_text(plan.module)
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in ptx
    assert "ldmatrix" not in ptx
    shared = [int(n) for n in re.findall(r"\.shared \.align \d+ \.b8 \S+\[(\d+)\]", ptx)]
    assert shared and max(shared) <= 48 * 1024
    ptxas_check(ptx)
