"""The sm_90a decode GEMM strategy (:mod:`poot.backends.gpu.strategies.gemm_decode_wgmma`).

Without a GPU: its operands against the PTX ISA's definition of ``wgmma.mma_async`` (an
emulation: A registers built from the lanes' weight k as the kernel builds them, x staged
in workgroup memory at the kernel's offsets, read back through the matrix descriptor's
fields as the canonical K-major layout without swizzling defines, multiplied, and the D
fragment's elements placed as the PTX table places them, give x @ w.T); which regions
planning gives it; its tiling rule; the PTX it makes for every format and several M,
assembled by ptxas for sm_90a when there is one (no spills). On a CUDA device
``bench/gpu_run/gemm_decode_check.py`` holds every element to the error bound of the tiled
GEMM (skipped here: no MLIR there, no GPU here).
"""

from __future__ import annotations

import re
import subprocess
import shutil
import tempfile
from dataclasses import replace

import numpy as np
import pytest
pytest.importorskip("mlir.ir", reason="the MLIR wheels (xtc-mlir-python-bindings) are not "
                    "installed here: this module compiles kernels")

from test_gpu_gemm import _cuda_caps, _ptx_a  # noqa: E402
from test_gpu_gemm_decode import _plan  # noqa: E402


def _wgmma_d(lane: int, warp: int, i: int) -> tuple[int, int]:
    """PTX ISA table, D of ``wgmma .m64nNk16`` with f32 accumulators: (row of M, column of
    N) of register ``d_i`` of ``lane`` in warp ``warp`` of the warpgroup."""
    g, t = lane >> 2, lane & 3
    return 16 * warp + g + 8 * ((i % 4) // 2), 8 * (i // 4) + 2 * t + (i % 2)


def _descriptor_fields(desc: int) -> tuple[int, int, int, int]:
    """(start address, leading byte offset, stride byte offset, swizzle mode) of a wgmma
    matrix descriptor (PTX ISA "Matrix Descriptor Format": 14-bit fields of 16-byte units at
    bits 0, 16, 32; the layout type at bits 62-63)."""
    f = (1 << 14) - 1
    return (desc & f) << 4, ((desc >> 16) & f) << 4, ((desc >> 32) & f) << 4, desc >> 62


@pytest.mark.parametrize("fmt,M", [("bf16", 64), ("bf16", 3), ("f16", 24), ("q4_0", 40),
                                   ("q4_1", 128), ("q8_0", 16)])
def test_wgmma_operands_give_x_times_w(fmt, M):
    """One 32-k step of a warpgroup's 64 weight rows: each mma ``s``'s A registers (lane
    ``(g, t)`` of warp ``w``: rows 16w + g, + 8 at its :func:`lane_ks`, placed as the m16n8k16
    A table places register halves), its B read from the staged x through the descriptor
    (element (k, n) at start + (n // 8) SBO + (k // 8) LBO + (n % 8) 16 + (k % 8) 2 bytes,
    the canonical K-major layout without swizzling), the products summed into D as the D
    table places them: W @ x.T, every k once."""
    from poot.backends.gpu.strategies.gemm_decode import KSTEP, lane_ks
    from poot.backends.gpu.strategies.gemm_decode_wgmma import (
        b_descriptor,
        b_offset,
        wgmma_tiling,
        x_quad,
    )

    Np = wgmma_tiling(M, 64, 1024, 132, 64 * 1024 * 2).Np
    assert Np % 8 == 0 and Np - 8 < M <= Np
    rng = np.random.default_rng(1)
    X = rng.integers(-8, 8, (Np, KSTEP)).astype(np.float64)
    W = rng.integers(-8, 8, (64, KSTEP)).astype(np.float64)
    D = np.zeros((64, Np))
    for s in (0, 1):
        # staging, as the kernel stores a job's row: 16-byte rows (k halves hi = 0, 1) of
        # four lanes' pairs, element 2 t + lo of half hi = x k 4 x_quad(t, s) + 2 hi + lo
        tile = 32 * Np                                    # bytes of one mma's B tile
        base = 4096 * s                                   # any 16-byte aligned address
        smem = np.full((base + tile) // 2, np.nan)        # 16-bit elements
        for n in range(Np):
            for hi in (0, 1):
                for t in range(4):
                    for lo in (0, 1):
                        at = base + b_offset(Np, n, 8 * hi + 2 * t + lo)
                        smem[at // 2] = X[n, 4 * x_quad(fmt, t, s) + 2 * hi + lo]
        start, lbo, sbo, swizzle = _descriptor_fields(b_descriptor(base))
        assert (start, swizzle) == (base, 0)
        B = np.array([[smem[(start + (n // 8) * sbo + (k // 8) * lbo + (n % 8) * 16
                             + (k % 8) * 2) // 2] for n in range(Np)] for k in range(16)])
        A = np.full((64, 16), np.nan)
        for w in range(4):
            for lane in range(32):
                g, t = lane >> 2, lane & 3
                ks = lane_ks(fmt, t, s)
                regs = [W[16 * w + g, ks[0:2]], W[16 * w + g + 8, ks[0:2]],
                        W[16 * w + g, ks[2:4]], W[16 * w + g + 8, ks[2:4]]]
                for i in range(8):
                    r, k = _ptx_a(lane, i)
                    A[16 * w + r, k] = regs[i // 2][i % 2]
        assert not np.isnan(A).any() and not np.isnan(B).any()
        prod = A @ B
        for w in range(4):
            for lane in range(32):
                for i in range(Np // 2):
                    D[_wgmma_d(lane, w, i)] += prod[_wgmma_d(lane, w, i)]
    np.testing.assert_array_equal(D, W @ X.T)


@pytest.mark.parametrize("Np,R,WG,U", [(64, 1, 2, 1), (40, 1, 1, 2), (128, 2, 1, 1),
                                        (72, 1, 2, 4)])
def test_ring_operands_give_x_times_w(Np, R, WG, U):
    """The ring (both operands from workgroup memory): one chunk's slot filled as the
    kernel's copy jobs fill it (job p: the weight's 16 bytes :func:`w_piece` to unit
    :func:`a_unit`; x's packed image in natural k order, :func:`natural_pair`, after the
    weight's :attr:`w_units`), then each warpgroup's A and the B of every mma read through
    the descriptor fields at the tile addresses the kernel gives them, multiplied and summed:
    the block's W @ x.T over the chunk's k. Also: the copy jobs cover every unit of the
    weight tiles once, and 8 consecutive jobs write 128 consecutive bytes."""
    from poot.backends.gpu.strategies.gemm_decode_wgmma import (
        WgmmaTiling,
        a_unit,
        b_descriptor,
        b_offset,
        natural_pair,
        w_piece,
    )

    d = WgmmaTiling(Np, R, WG, 1, U, U, True, 2)
    rng = np.random.default_rng(2)
    KC = 32 * U                                           # k of one chunk
    X = rng.integers(-8, 8, (Np, KC)).astype(np.float64)
    W = rng.integers(-8, 8, (d.BN, KC)).astype(np.float64)
    slot = np.full(d.slot_units * 8, np.nan)              # 16-bit elements
    units = []
    for p in range(d.BN * U * 4):
        row, j = w_piece(p, U)
        u = a_unit(row, j, R, WG)
        units.append(u)
        slot[8 * u:8 * u + 8] = W[row, 8 * j:8 * j + 8]
    assert sorted(units) == list(range(d.w_units))
    for p in range(0, len(units), 8):
        assert units[p:p + 8] == list(range(units[p], units[p] + 8))
    for u in range(U):                                    # x's image, as stage_row stores it
        for s in (0, 1):
            tile = 16 * (d.w_units + (2 * u + s) * d.tile16)
            for n in range(Np):
                for hi in (0, 1):
                    for t in range(4):
                        quad, at = natural_pair(t, s, hi)
                        for lo in (0, 1):
                            k = 32 * u + 4 * quad + at + lo
                            slot[(tile + b_offset(Np, n, 8 * hi + 2 * t + lo)) // 2] = X[n, k]

    def read(desc, rows):
        start, lbo, sbo, swizzle = _descriptor_fields(desc)
        assert swizzle == 0
        return np.array([[slot[(start + (r // 8) * sbo + (k // 8) * lbo + (r % 8) * 16
                                + (k % 8) * 2) // 2] for k in range(16)] for r in range(rows)])
    D = np.zeros((d.BN, Np))
    for wg in range(WG):
        for r in range(R):
            for u in range(U):
                for s in (0, 1):
                    tile = wg * R + (2 * u + s) * R * WG + r        # as ring_loop
                    A = read(b_descriptor(16 * 128 * tile), 64)
                    B = read(b_descriptor(16 * (d.w_units + (2 * u + s) * d.tile16)), Np)
                    assert not np.isnan(A).any() and not np.isnan(B).any()
                    rows = slice(64 * (wg * R + r), 64 * (wg * R + r) + 64)
                    D[rows] += A @ B.T
    np.testing.assert_array_equal(D, W @ X.T)


def test_planning_gives_sm_90a_the_wgmma_decode_gemm():
    """The sm_90 CUDA target names sm_90a, its PTX targets sm_90a, and its decode regions
    from MIN_M (33) to 128 rows take the wgmma kernel; fewer rows, or the target without
    the feature, the mma.sync one; prefill rows the tiled GEMM."""
    from poot.backends.cuda.codegen import cuda_target, target_chip

    caps = cuda_target().caps
    assert "sm_90a" in caps.features and target_chip(caps) == "sm_90a"
    assert target_chip(cuda_target(sm=89).caps) == "sm_89"
    assert set(_plan("bf16", 64, 576, 512, caps).strategies) == {"gemm_decode_wgmma"}
    assert set(_plan("q4_1", 33, 576, 512, caps).strategies) == {"gemm_decode_wgmma"}
    assert set(_plan("q4_1", 32, 576, 512, caps).strategies) == {"gemm_decode"}
    assert set(_plan("bf16", 129, 576, 512, caps).strategies) == {"gemm"}
    mma = replace(caps, features=caps.features - {"sm_90a"})
    assert set(_plan("bf16", 64, 576, 512, mma).strategies) == {"gemm_decode"}


@pytest.mark.parametrize("M,N,K,wbytes", [
    (64, 2048, 2048, 2048 * 2048 * 2), (128, 8192, 2048, 8192 * 2048 * 2),
    (64, 2048, 8192, 2048 * 8192 * 2), (16, 128256, 2048, 128256 * 2048 * 2),
    (64, 576, 576, 576 * 18 * 20), (3, 64, 32, 64 * 64), (100, 300, 2048, 300 * 64 * 20)])
def test_wgmma_tiling(M, N, K, wbytes):
    """Np covers M in whole 8-row tiles; the accumulators within MAX_ACCS; K steps dealt
    evenly to S slices and chunks of U; x's chunk within its buffer; partials within their
    cap; a grid of about a block a compute unit or more where K's steps allow."""
    from poot.backends.gpu.strategies import gemm_decode as D
    from poot.backends.gpu.strategies import gemm_decode_wgmma as W

    d = W.wgmma_tiling(M, N, K, 132, wbytes)
    KT = K // D.KSTEP
    assert d.Np % 8 == 0 and d.Np - 8 < M <= d.Np and d.R * d.Np // 2 <= W.MAX_ACCS
    assert d.S * d.per_block == KT and d.per_block % d.U == 0
    assert d.U * d.Np * 64 <= W.X_BUF_BYTES
    nb = -(-N // d.BN)
    if d.S > 1:
        assert d.S * M * N * 4 <= max(wbytes, D.L2_PARTIALS)
        assert d.per_block >= D.MIN_BLOCK_STEPS
    assert nb * d.S >= min(0.95 * 132, nb * min(D.MAX_SPLIT, KT // D.MIN_BLOCK_STEPS))


@pytest.mark.parametrize("M,N,K", [(128, 8192, 2048), (72, 4096, 1024), (64, 8192, 2048),
                                   (128, 2048, 2048), (100, 300, 576)])
def test_ring_tiling(M, N, K):
    """Planning never takes the ring (measured slower, :func:`wgmma_tiling`'s doc): the
    register kernel's tiling, whose x buffer rule holds. FORCE_STAGES > 0 gives a dense
    tiling the ring: one warpgroup, U = 2, x packed, that many slots within RING_BYTES,
    chunks dealt evenly to the slices; packed weights never."""
    from poot.backends.gpu.strategies import gemm_decode_wgmma as W

    wbytes = N * K * 2
    d = W.wgmma_tiling(M, N, K, 132, wbytes, dense=True)
    assert d.stages == 0 and d.U * d.Np * 64 <= W.X_BUF_BYTES
    old = W.FORCE_STAGES
    try:
        W.FORCE_STAGES = 4
        r = W.wgmma_tiling(M, N, K, 132, wbytes, dense=True)
        assert W.wgmma_tiling(M, N, K, 132, wbytes).stages == 0
    finally:
        W.FORCE_STAGES = old
    assert (r.stages, r.WG, r.U, r.xpack) == (4, 1, 2, True)
    assert 16 * r.stages * r.slot_units <= W.RING_BYTES
    assert r.S * r.per_block == K // 32 and r.per_block % r.U == 0


def _ptxas_verbose(ptx: str) -> str | None:
    exe = shutil.which("ptxas")
    if exe is None:
        return None
    with tempfile.TemporaryDirectory() as d:
        with open(f"{d}/k.ptx", "w") as f:
            f.write(ptx)
        r = subprocess.run([exe, "-arch=sm_90a", "-v", f"{d}/k.ptx", "-o", f"{d}/k.cubin"],
                           capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stderr


def test_packed_x_kernel_and_launches():
    """With x packed by a first kernel: three launches (pack: one thread per K step and row
    of x; the GEMM; the split-K sums), the image scratch 0 (Np * 64 bytes a K step) and the
    partials scratch 1; the GEMM copies 16-byte rows of the image instead of rounding x;
    ptxas assembles every kernel without spills."""
    from poot.backends.cuda.codegen import ptx_text
    from poot.backends.gpu.strategies import gemm_decode_wgmma as W

    old = W.FORCE_XPACK
    try:
        W.FORCE_XPACK = True
        plan = _plan("bf16", 64, 1024, 1024, _cuda_caps())
    finally:
        W.FORCE_XPACK = old
    ks = [L for L in plan.launches if L["op"] == "kernel"]
    assert len(ks) == 3 and plan.strategies == {"gemm_decode_wgmma": 3}
    assert ks[0]["grid"] == [1024 // 32 * 64 // W.XPACK_T, 1, 1]
    scratch = [i for i, b in enumerate(plan.buffers) if b["role"] == "scratch"]
    assert len(scratch) == 2 and plan.buffers[scratch[0]]["nbytes"] == 1024 // 32 * 64 * 64
    assert ks[0]["args"][-1] == scratch[0] and scratch[0] in ks[1]["args"]
    assert scratch[1] in ks[1]["args"] and scratch[1] in ks[2]["args"]
    ptx = ptx_text(plan.module)
    gemm = ptx[ptx.index(".entry k1_"):]
    assert "cvt.rn.bf16x2.f32" not in gemm[:gemm.find(".entry", 10)]
    log = _ptxas_verbose(ptx)
    if log is not None:
        assert not re.search(r"[1-9]\d* bytes spill", log), log


@pytest.mark.parametrize("fmt,M,N,K", [(f, M, 300, 576)
                                       for f in ("bf16", "f16", "q4_0", "q4_1", "q8_0")
                                       for M in (33, 64, 100, 128)]
                         + [("bf16", 128, 2304, 576), ("f16", 72, 2304, 576)])
def test_ptx_for_each_format_and_m(fmt, M, N, K, monkeypatch):
    """The kernel is ``wgmma.mma_async m64n{Np}k16`` of the weight's mma type, fenced,
    committed and waited for, with A in registers (4 of them) and x's stores fenced for the
    async proxy; dense weights with the ring forced (4 slots): A and B descriptors,
    ``cp.async.cg`` copies waited for with ``stages - 2`` groups in flight, then fenced; no
    mma.sync, no ldmatrix; ptxas (when installed) assembles it for sm_90a with no spills and
    without serializing the wgmma's, the ring within 48 KB of workgroup memory."""
    from poot.backends.cuda.codegen import ptx_text

    from poot.backends.gpu.strategies import gemm_decode_wgmma as W
    ring = N > 300                                           # N = 300: ragged
    if ring:                                                 # the ring, as benchmarks force it
        monkeypatch.setattr(W, "FORCE_STAGES", 4)
    plan = _plan(fmt, M, N, K, _cuda_caps())
    assert set(plan.strategies) == {"gemm_decode_wgmma"}
    ptx = ptx_text(plan.module)
    assert ".target sm_90a" in ptx
    ty = "bf16" if fmt == "bf16" else "f16"
    Np = -(-M // 8) * 8
    head = rf"wgmma\.mma_async\.sync\.aligned\.m64n{Np}k16\.f32\.{ty}\.{ty} \{{[^}}]*\}}, "
    if ring:
        assert re.findall(head + r"%rd\d+, %rd\d+, 1, 1, 1, 0, 0;", ptx)
        assert "cp.async.cg.shared.global" in ptx and "cp.async.commit_group;" in ptx
        assert "cp.async.wait_group 2;" in ptx
        d = W.wgmma_tiling(M, N, K, _cuda_caps().cores, N * K * 2, dense=True)
        shared = [L.get("shared", 0) for L in plan.launches if L["op"] == "kernel"]
        assert 16 * d.stages * d.slot_units in shared
        assert max(shared) <= W.RING_BYTES
        # the ring is the block's dynamic shared memory, declared once at module scope
        assert re.search(r"^\.extern \.shared \.align 16 \.b8 __dynamic_shmem__\d+\[\];$", ptx,
                         re.M)
        # the first chunks' weight copies come before the grid dependency wait
        entry = ptx[ptx.index(".entry k1_"):]
        assert entry.index("cp.async.cg") < entry.index("griddepcontrol.wait;")
    else:
        assert re.findall(head + r"\{(%r\d+, ){3}%r\d+\}, %rd\d+, 1, 1, 1, 0;", ptx)
    for s in ("wgmma.fence.sync.aligned;", "wgmma.commit_group.sync.aligned;",
              "wgmma.wait_group.sync.aligned 0;", "fence.proxy.async.shared::cta;"):
        assert s in ptx
    assert "mma.sync" not in ptx and "ldmatrix" not in ptx
    log = _ptxas_verbose(ptx)
    if log is not None:
        assert "spill stores" in log
        assert not re.search(r"[1-9]\d* bytes spill", log), log
        assert "serialized" not in log, log
        assert all(int(b) <= 48 << 10 for b in re.findall(r"(\d+) bytes smem", log)), log
