"""GEMM on matrix instructions (NVIDIA tensor cores, AMD MFMA / WMMA): one kernel (two with split-K) for a dispatch region rooted at a
``poot.matmul`` with M > :data:`~.matmul_match.MAX_M` rows (prompt tokens, batched decode), or from
:data:`~.matmul_match.GEMM_FROM_M` rows with a dense bf16/f16 weight (small decode batches; the
GEMV defers, :func:`.matmul.gemm_defers`), against a weight, its elementwise epilogue fused.
The regions are those the decode GEMV takes (:func:`.matmul_match.match`, here without its M
limit), restricted to::

    x   = reshape*(arg f32 [M, K])                               # an argument
        | expr(args)            # elementwise / views of arguments, no row reductions (e.g.
                                # the attention output's transpose in front of o_proj)
    w   = transpose(dequantize(arg packed [N, K]))                # Q4_0 Q4_1 Q8_0 Q4_K Q6_K
        | transpose(cast?(arg [N, K] bf16|f16))                   # dense, read as stored
    y   = matmul(x, w) {acc = f32}                                # [M, N]
    out = epilogue(y, args...)  # elementwise on the M*N elements, as the GEMV fuses it

Refused (None; the region keeps the generic linalg->GPU mapping): f32 weights, a dense
weight stored [K, N], an x that reads a row reduction (a norm folded in front: the folding
then keeps the norm as its own region), an epilogue that is not elementwise in y, and every
target without a matrix instruction (:func:`matrix_op` on ``caps.features`` and the subgroup
size): :data:`MMA_SYNC` (``mma.sync`` m16n8k16: an ``sm_XY`` feature with XY >= 80, 32
lanes), :data:`MFMA_16X16X16` (``mfma``, 64 lanes: AMD CDNA, gfx90a / gfx942) or
:data:`WMMA_16X16X16` (``wmma``, 32 lanes: AMD RDNA 3, gfx1100 / gfx1151); SPIR-V (Vulkan)
targets have none.

Types: bf16 weights -> ``mma.sync.m16n8k16.row.col.f32.bf16.bf16.f32`` with x rounded to bf16;
f16 and packed weights -> ``...f32.f16.f16.f32`` with x rounded to f16 and each weight
decoded in f32 (ggml's formulas, as the oracle) then rounded to f16. Accumulation is f32.
On AMD the same roundings feed ``v_mfma_f32_16x16x16_{bf16,f16}`` /
``v_wmma_f32_16x16x16_{bf16,f16}``.

Tiling (:func:`choose_tiling`): a block computes a ``BM x BN`` tile of y (BM = 16/32/64/128
by M; BN = 32 narrow, 64 or 128 by width), ``T`` = 128
threads (256 for BM 128) in ``WM x WN`` warps, each warp a ``BM/WM x BN/WN`` sub-tile of
``mt x nt`` mma tiles (16 x 8). K advances ``BK`` (128/64/32: the largest whose two buffers
fit in workgroup memory; for packed weights also dividing K) at a time through workgroup
memory, double-buffered with a register prefetch: each thread issues the global loads of
step ``kt+1``, runs the mma's of step ``kt`` from the other buffer, then converts / decodes
the loaded values to 16-bit and stores them (one ``gpu.barrier`` per K step; a wide BK keeps
many loads in flight per thread: prefill grids have few blocks per compute unit, and the
weight has to stream at memory speed). A dense bf16/f16 weight on NVIDIA with K a multiple
of BK skips the registers: its tiles go global -> workgroup memory by ``cp.async`` (16
bytes, ``.cg``: L1 bypassed) into a ring of ``stages`` buffers (:data:`STAGES`, the deepest
that fits, :func:`with_stages`), steps kt + 1 .. kt + stages - 1 in flight while step kt's
mma's run, ``cp.async.wait_group stages - 2`` before the step's barrier (H200, M = 32:
the 14336 x 4096 projection 51.4 -> 43.5 us, 4096 x 4096 15.8 -> 14.7 us;
``bench/results/pipeline.md``). Workgroup tiles are ``[rows][BK + 8]`` 16-bit
words, k contiguous: x rows as A (``[m][k]``, row-major) and weight rows as B (``[n][k]``,
i.e. the column-major B that ``.row.col`` wants, so a weight is never transposed); the 8
words of padding make every 8-row phase of ``ldmatrix`` hit distinct banks. Fragments
are read with ``ldmatrix.x4`` (``nvgpu.ldmatrix``) and multiplied with ``nvvm.mma.sync``
(``nvgpu.mma.sync`` has no bf16 form in MLIR 22).

Split-K (:func:`choose_split`): when the tile grid gives the compute units fewer than
:data:`SPLIT_BLOCKS_PER_CORE` blocks each (decode-sized M, narrow or short weights), grid z
cuts K into S slices of whole K steps; slice z stores its f32 accumulators as partial
``[z, row, col]`` of a scratch buffer instead of running the epilogue, and a second kernel
(:meth:`_GemmKernel.reduce_kernel`, one thread per element of y) sums the S partials in slice
order and applies the epilogue. No atomics: results do not depend on block scheduling.

Staging units: x and dense weights in *chunks* of 8 consecutive k (two 16-byte loads of x
f32, or an expression x's 8 elements from :mod:`.emit` (scalar loads), rounded in pairs by
``cvt.rn.{bf16,f16}x2.f32``; one 16-byte load of weight words; one
16-byte workgroup store); Q4_0/Q4_1/Q8_0 in half-blocks (the scale and 8 or 16 quant bytes of
one 32-element block per thread, decoded in f32 into two chunks); Q4_K/Q6_K element by
element with the oracle's own decoder (:data:`poot.dialects.lowering.packed.DECODERS` via
:mod:`.emit`, byte loads; correct, not fast). Ragged edges: rows of x past M and weight
rows past N are read clamped (their results are never stored: every output element is
guarded); a K tail (K % BK, dense only) reads clamped addresses and stores zeros; K % 8 != 0
(dense) stages element by element with scalar loads.

AMD (:meth:`_GemmKernel._amd`): the same tiles, staging, decode, split-K and epilogue; tiles
of 16 x 16, so a block's subgroups take at most BN / 16 columns (:func:`tiling`) and a block
has WM x WN x 64 (MFMA) or x 32 (WMMA) threads. Each lane reads its operands from the
workgroup tiles as one vector (row ``lane & 15``, k from ``((lane >> 4) * ka) % 16``: 4
halves for MFMA, 16 for WMMA), no ``ldmatrix``; x is rounded with :meth:`_GemmKernel.
half_bits` (no NVVM conversion). The accumulators are :meth:`MatrixOp.c_fragment`'s.

Fragment layouts: PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"
(warp-level matrix multiply-accumulate, ``mma``) and "Warp-level matrix load instruction:
ldmatrix" (section numbers move between ISA versions); the lane maps are
:func:`a_fragment`, :func:`b_fragment`, :func:`c_fragment`, :func:`a_ldmatrix_row`,
:func:`b_ldmatrix_row`, checked against numpy matmul by an emulation in the tests.

Error against the f32 oracle (``sum_k x[m,k] * w[k,n]`` in f32): inputs are rounded to the
mma type, so per output element::

    |y - y_oracle| <= (u_x + u_w + K * 2^-23) * sum_k |x[m,k]| |w[k,n]|  (+ ~2^-24 abs per term)

with u = 2^-8 (bf16) or 2^-11 (f16) for x, u_w = 0 for bf16/f16 weights (read exactly),
2^-11 for packed weights (decoded values rounded to f16); K * 2^-23 covers f32 summation in
another order (and the tensor cores' internal accumulation); ``error_bound`` computes it and
the tests hold every element to it. It is a worst case (all rounding errors aligned): for
random data it is ~1e-2 (bf16) / ~2e-3 to 1e-2 (f16, packed) of max |y|, while the errors
seen (lavapipe, emulated mma) are ~sqrt(K) smaller: ~2e-3 (bf16), ~2e-4 to 3e-4 (f16,
packed) of max |y|. f16 overflows above 65504: activations larger than that become inf (as
in llama.cpp's f16 GEMM path).

``EMULATE_MMA`` (tests only): a :class:`MatrixOp`; the same kernel -- tiling, staging, decode,
double buffering, epilogue, that instruction's lane layout -- with each instruction replaced
by the 16-term dot products of the lane's own accumulator elements read from workgroup
memory (scalar loads, no nvgpu/nvvm/rocdl op), so the kernel runs and is checked against the
oracle on a SPIR-V device (lavapipe) that has no matrix instruction. For AMD that is all that
runs: no AMD GPU is on these machines (the operand loads are checked against AMD's tables and
the assembly read for the instruction, never executed).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import numpy as np
from mlir import ir

from poot.backends.gpu.kernels import Launch
from poot.backends.gpu.strategies.emit import (
    ArgsSeenEmitter,
    EmitShorthands,
    ScalarEmitter,
    ScalarUnsupported,
    Synthesized,
    arg_number,
    defining_op,
    maybe_poot_type,
)
from poot.backends.gpu.strategies.matmul_match import (
    GEMM_FROM_M,
    GemvMatch,
    gemm_rows,
    kernel_params,
    match,
    region_params,
)
from poot.dialects.types import DType

#: weight ring depths tried, deepest first, where the weight tiles go to workgroup memory by
#: ``cp.async`` (dense 16-bit weights on NVIDIA, K a multiple of BK): K steps kt + 1 ..
#: kt + stages - 1 are in flight while step kt's mma's run
STAGES = (4, 3)
#: K steps (elements per iteration, staged through workgroup memory) tried, largest first:
#: multiples of 32 (whole Q4_0/Q4_1/Q8_0 blocks, K-quant sub-blocks) and of 16 (mma k)
BKS = (128, 64, 32)
#: padding of the workgroup rows, 16-bit words: rows of BK + 8 words are 16-byte aligned
#: (ldmatrix) and their 8-row phases hit distinct banks
PAD = 8
WARP = 32

#: packed formats with a dedicated half-block decoder; others the match takes (Q4_K, Q6_K)
#: decode element by element
FAST_PACKED = ("q4_0", "q4_1", "q8_0")

#: tests: the :class:`MatrixOp` to emulate from workgroup memory on a target without one (see
#: the module doc), e.g. ``MFMA_16X16X16`` on lavapipe
EMULATE_MMA: "MatrixOp | None" = None
#: benchmarks: a ``(BM, BN, BK)`` to use instead of :func:`choose_tiling`'s (bench/gpu_run/
#: gemm_check.py times the variants on the device)
FORCE_TILING: tuple[int, int, int] | None = None
#: split-K (:func:`choose_split`): blocks per compute unit it aims for, fewest K steps per
#: slice, most slices
SPLIT_BLOCKS_PER_CORE, SPLIT_MIN_STEPS, MAX_SPLIT = 2, 2, 16
#: the most bytes of partials a split-K GEMM keeps (S x M x N f32, one scratch buffer per
#: dispatch body): a long prefill chunk gets fewer slices rather than a large buffer
MAX_SPLIT_SCRATCH = 32 << 20
#: benchmarks and tests: a split-K slice count to use instead of :func:`choose_split`'s
FORCE_SPLIT: int | None = None
#: threads per block of the split-K reduction kernel
REDUCE_T = 256

_WG = "#gpu.address_space<workgroup>"


# ---- fragment layouts (PTX ISA 9.7.14.5.8, ldmatrix 9.7.14.5.15) ----------------------------

def a_fragment(lane: int, reg: int) -> list[tuple[int, int]]:
    """(row, k) of the two 16-bit halves (low, high) of A register ``reg`` (0..3) of
    ``lane`` for mma.m16n8k16 (A 16x16, row-major): a0..a7 with row = groupID (+8 for
    a2,a3,a6,a7), col = 2 * threadID_in_group + (i & 1) (+8 for a4..a7)."""
    g, t = lane >> 2, lane & 3
    return [(g + 8 * (reg & 1), 2 * t + h + 8 * (reg >> 1)) for h in (0, 1)]


def b_fragment(lane: int, reg: int) -> list[tuple[int, int]]:
    """(k, n) of the two halves of B register ``reg`` (0..1) of ``lane`` (B 16x8): b0..b3
    with row (k) = 2 * threadID_in_group + (i & 1) (+8 for b2,b3), col (n) = groupID."""
    g, t = lane >> 2, lane & 3
    return [(2 * t + h + 8 * reg, g) for h in (0, 1)]


def c_fragment(lane: int, i: int) -> tuple[int, int]:
    """(row, col) of f32 accumulator ``i`` (0..3) of ``lane`` (C/D 16x8): row = groupID
    (+8 for c2,c3), col = 2 * threadID_in_group + (i & 1)."""
    return (lane >> 2) + 8 * (i >> 1), 2 * (lane & 3) + (i & 1)


def a_ldmatrix_row(lane: int) -> tuple[int, int]:
    """(row, k) of the 8-element row whose address ``lane`` gives to ``ldmatrix.x4`` for a
    16x16 A tile stored [m][k]: matrices 0..3 = (rows 0-7, k 0-7), (rows 8-15, k 0-7),
    (rows 0-7, k 8-15), (rows 8-15, k 8-15): registers a0..a3 of :func:`a_fragment`."""
    return lane & 15, (lane >> 4) * 8


def b_ldmatrix_row(lane: int) -> tuple[int, int]:
    """(n, k) of the row ``lane`` addresses for ``ldmatrix.x4`` over two 8-column B tiles
    stored [n][k] (16 n x 16 k): matrices (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7),
    (n 8-15, k 8-15) = b0, b1 of the first n-tile, b0, b1 of the second. ``.x2`` (one
    n-tile) uses lanes 0-15 of the same map."""
    return (lane & 7) + ((lane >> 4) << 3), ((lane >> 3) & 1) * 8


# ---- matrix instructions ---------------------------------------------------------------------

@dataclass(frozen=True)
class MatrixOp:
    """A subgroup-wide matrix multiply-accumulate ``D[16 x n] = A[16 x 16] B[16 x n] + C``
    (16-bit inputs, f32 accumulators) and where its lanes keep their parts of C/D:
    accumulator ``i`` of lane ``l`` is ``D[row, col]`` with ::

        row = (l >> row_shift) * row_mul + row_off[i]
        col = (l & col_mask) * col_mul + col_off[i]

    ``wave``: lanes taking part; ``n``: tile columns; ``ka``: consecutive k of one A row (B
    column) each lane holds (AMD: row ``l & 15``, k from ``((l >> 4) * ka) % 16``, loaded as
    one vector from workgroup memory); 0 for NVIDIA's, whose fragments ``ldmatrix`` reads
    (:func:`a_ldmatrix_row`)."""

    name: str
    wave: int
    n: int
    ka: int
    row_shift: int
    row_mul: int
    row_off: tuple
    col_mask: int
    col_mul: int
    col_off: tuple

    @property
    def accs(self) -> int:
        """f32 accumulators per lane and tile."""
        return len(self.row_off)

    def c_fragment(self, lane: int, i: int) -> tuple[int, int]:
        """(row, col) of accumulator ``i`` of ``lane``."""
        return ((lane >> self.row_shift) * self.row_mul + self.row_off[i],
                (lane & self.col_mask) * self.col_mul + self.col_off[i])

    def ab_fragment(self, lane: int, i: int) -> tuple[int, int]:
        """(row of A or column of B, k) of element ``i`` (< ``ka``) of ``lane``'s A or B
        operand (AMD instructions)."""
        return lane & 15, ((lane >> 4) * self.ka) % 16 + i


#: NVIDIA ``mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}`` (sm_80+, warp of 32): C rows
#: groupID (+8), columns 2 * threadID_in_group (+1) (PTX ISA, "Matrix Fragments for
#: mma.m16n8k16 with floating point type")
MMA_SYNC = MatrixOp("mma.sync.m16n8k16", 32, 8, 0, 2, 1, (0, 0, 8, 8), 3, 2, (0, 1, 0, 1))
#: AMD CDNA ``v_mfma_f32_16x16x16_f16`` / ``v_mfma_f32_16x16x16_bf16`` (the ``_1k`` form;
#: gfx90a, gfx942; wave64): A[m][k] in lane ``m + 16 * (k // 4)``, element ``k % 4``; B[k][n]
#: in lane ``n + 16 * (k // 4)``; D[m][n] in lane ``n + 16 * (m // 4)``, element ``m % 4``
#: (AMD's CDNA 3 ISA, "Matrix Arithmetic Instructions", and its Matrix Instruction Calculator)
MFMA_16X16X16 = MatrixOp("mfma.f32.16x16x16", 64, 16, 4, 4, 4, (0, 1, 2, 3), 15, 1,
                         (0, 0, 0, 0))
#: AMD RDNA 3 ``v_wmma_f32_16x16x16_f16`` / ``_bf16`` (gfx11: gfx1100, gfx1151; wave32): lane
#: ``l`` holds row ``l & 15`` of A (column of B), all 16 k (lanes 16-31 repeat 0-15); D[m][n]
#: in lane ``n + 16 * (m % 2)``, element ``m // 2`` (AMD's RDNA 3 ISA, "Wave Matrix Multiply
#: Accumulate", and GPUOpen's "How to accelerate AI applications on RDNA 3 using WMMA")
WMMA_16X16X16 = MatrixOp("wmma.f32.16x16x16", 32, 16, 16, 4, 1, tuple(range(0, 16, 2)), 15,
                         1, (0,) * 8)


# ---- capability and tiling ------------------------------------------------------------------

def has_mma(caps) -> bool:
    """Whether the target has warp-level ``mma.sync`` m16n8k16 with f16/bf16 inputs: an
    ``sm_XY`` feature with XY >= 80 (Ampere and later) and 32-lane subgroups."""
    feats = getattr(caps, "features", None) or ()
    sms = [int(m.group(1)) for f in feats if (m := re.fullmatch(r"sm_(\d+)a?", f))]
    return bool(sms) and max(sms) >= 80 and getattr(caps, "subgroup_size", None) == WARP


def matrix_op(caps) -> MatrixOp | None:
    """The matrix instruction the GEMM uses on a target, None where it has none:
    :data:`MMA_SYNC` where :func:`has_mma`; :data:`MFMA_16X16X16` for an ``mfma`` feature
    with 64-lane subgroups (AMD CDNA); :data:`WMMA_16X16X16` for a ``wmma`` feature with
    32-lane subgroups (AMD RDNA 3)."""
    if has_mma(caps):
        return MMA_SYNC
    feats = getattr(caps, "features", None) or ()
    sub = getattr(caps, "subgroup_size", None)
    if "mfma" in feats and sub == MFMA_16X16X16.wave:
        return MFMA_16X16X16
    if "wmma" in feats and sub == WMMA_16X16X16.wave:
        return WMMA_16X16X16
    return None


@dataclass(frozen=True)
class Tiling:
    """Block tile ``BM x BN`` of y, ``WM x WN`` subgroups (warps, wavefronts) each owning
    ``mt x nt`` tiles of the matrix instruction ``op``, K advancing ``BK`` at a time."""

    BM: int
    BN: int
    WM: int
    WN: int
    BK: int = 32
    op: MatrixOp = MMA_SYNC
    stages: int = 2          # weight tiles in flight through workgroup memory (a ring)

    @property
    def LDS(self) -> int:
        """Row stride of the workgroup tiles (16-bit words)."""
        return self.BK + PAD

    @property
    def T(self) -> int:
        return self.WM * self.WN * self.op.wave

    @property
    def WTM(self) -> int:
        return self.BM // self.WM

    @property
    def WTN(self) -> int:
        return self.BN // self.WN

    @property
    def mt(self) -> int:
        return self.WTM // 16

    @property
    def nt(self) -> int:
        return self.WTN // self.op.n

    @property
    def smem_bytes(self) -> int:
        return (2 * self.BM + self.stages * self.BN) * self.LDS * 2


#: warps (rows x columns of the block tile) per BM
WARPS = {16: (1, 4), 32: (1, 4), 64: (2, 2), 128: (4, 2)}


def tiling(BM: int, BN: int, BK: int = 32, op: MatrixOp = MMA_SYNC) -> Tiling:
    """The ``BM x BN`` tile of :data:`WARPS`' subgroups, fewer columns of them where the
    instruction's tiles are wider than a subgroup's share (16-column AMD tiles, BN 32)."""
    WM, WN = WARPS[BM]
    return Tiling(BM, BN, WM, min(WN, max(1, BN // op.n)), BK, op)


def choose_tiling(M: int, N: int, K: int, cores: int, max_shared: int = 48 * 1024,
                  packed: bool = False, op: MatrixOp = MMA_SYNC) -> Tiling:
    """BM: the smallest of 16/32/64/128 holding M (128 beyond); BN: 32 for a narrow weight
    (N <= 32), else 128 where 128-column tiles give half the compute units a block (or BM >
    32), else 64, halved until the tiles fit in ``max_shared`` bytes; BK: the largest of
    :data:`BKS` that fits (and divides K for a packed weight): more bytes in flight per
    thread while the mma's run. Warps (:func:`tiling`): 1 x 4 for BM <= 32,
    2 x 2 for 64, 4 x 2 for 128 (warp tiles 16-32 rows x 8-64 columns). The grid's size is
    split-K's business (:func:`choose_split`), not the tile's. Measured on an H200 (bf16, M =
    32, every BN x BK x split; ``bench/gpu_run/gemm_check.py``, ``bench/results/gemm.md``):
    64 x 64 tiles with split-K were fastest or within 10% of it on the Llama-3.2-1B and -8B
    projections, 32 x 128 on the narrow ones; 128 x 32 at BM 128; but wide weights want
    128 columns (x is re-read by every column tile: the 128256-column LM head at M = 32 went
    147 -> 190 us with 64)."""
    BM = next((b for b in (16, 32, 64) if M <= b), 128)
    BN = 32 if N <= 32 else 128 if BM > 32 or 2 * -(-N // 128) * -(-M // BM) >= cores \
        else 64
    while BN > 32 and tiling(BM, BN, op=op).smem_bytes > max_shared:
        BN //= 2
    return with_bk(tiling(BM, BN, op=op), K, max_shared, packed)


def with_bk(t: Tiling, K: int, max_shared: int, packed: bool) -> Tiling:
    """``t`` with the largest K step of :data:`BKS` that fits (see :func:`choose_tiling`)."""
    for bk in BKS:
        c = replace(t, BK=bk)
        if c.smem_bytes <= max_shared and (not packed or K % bk == 0) and \
                (bk == 32 or bk <= K):
            return c
    return replace(t, BK=32)


def cp_async_weights(op: MatrixOp, emulate: bool, m: GemvMatch, BK: int) -> bool:
    """Whether the weight tiles can go global -> workgroup memory by ``cp.async`` (module
    doc): NVIDIA's instruction (not emulated), a dense 16-bit weight (16-byte words, no
    conversion), K a multiple of the K step (no tail to zero, whole 16-byte chunks)."""
    return op is MMA_SYNC and not emulate and m.weight.layout == "nk" and m.K % BK == 0


def with_stages(t: Tiling, max_shared: int) -> Tiling:
    """``t`` with the deepest weight ring of :data:`STAGES` that fits in ``max_shared``
    bytes (2: the register-staged double buffer). Only where :func:`cp_async_weights` does
    the kernel use more."""
    for n in STAGES:
        c = replace(t, stages=n)
        if c.smem_bytes <= max_shared:
            return c
    return replace(t, stages=2)


def choose_split(t: Tiling, M: int, N: int, K: int, cores: int) -> int:
    """Split-K slices S for tiling ``t``: enough for :data:`SPLIT_BLOCKS_PER_CORE` blocks per
    compute unit, at most :data:`MAX_SPLIT` and at least :data:`SPLIT_MIN_STEPS` K steps each
    (1 when the tile grid alone has the blocks). Why: at M <= 64 (a batched decode step, a
    32-token prefill chunk) a 2048-column weight is 32-64 tiles, each block walking all of K
    alone: a Llama-3.2-1B down projection (2048 x 8192 bf16) read at 0.8 TB/s on an H200
    (132 units), 1.9 TB/s in 8 slices; a rank-16 LoRA shrink (16 x 2048) took 11.7 us as one
    block, 3.2 in 16 slices. More than two blocks per unit measured slower on the wide ones
    (the partials' traffic; ``bench/results/gemm.md``). Slices of K multiply the blocks
    streaming the weight; :meth:`_GemmKernel.reduce_kernel` then sums the S partials of each
    element and applies the epilogue. The count is rounded so that no slice is empty, and capped so that the
    partials fit in :data:`MAX_SPLIT_SCRATCH` bytes."""
    blocks = -(-N // t.BN) * -(-M // t.BM)
    KT = -(-K // t.BK)
    s = min(MAX_SPLIT, -(-SPLIT_BLOCKS_PER_CORE * cores // blocks), KT // SPLIT_MIN_STEPS,
            MAX_SPLIT_SCRATCH // (4 * M * N))
    return _whole_slices(KT, s) if s >= 2 else 1


def _whole_slices(KT: int, s: int) -> int:
    """``s`` slices of ``KT`` K steps, lowered so that every slice gets steps."""
    s = min(s, KT)
    return -(-KT // -(-KT // s))


def error_bound(x: np.ndarray, w: np.ndarray, mma: str) -> np.ndarray:
    """The module doc's bound on ``|y - y_oracle|`` per element of ``y = x @ w.T`` (x [M, K]
    f32, w [N, K] the weight's values as the oracle decodes them; ``mma``: ``"bf16"`` for
    bf16 weights (read exactly, x rounded to bf16), ``"f16"`` for f16 (exact) or ``"f16q"``
    for packed weights (decoded values rounded to f16 too)."""
    x = np.abs(np.asarray(x, np.float64).reshape(-1, w.shape[1]))
    a = np.abs(np.asarray(w, np.float64))
    K = a.shape[1]
    u_x = 2.0 ** -8 if mma == "bf16" else 2.0 ** -11
    u_w = 2.0 ** -11 if mma == "f16q" else 0.0
    bound = (u_x + u_w + K * 2.0 ** -23) * (x @ a.T)
    if mma != "bf16":             # f16 subnormals: absolute error up to 2^-25 per rounding
        bound += 2.0 ** -25 * (x.sum(1)[:, None] + a.sum(1)[None, :])
    return bound + 1e-30


# ---- the kernel -------------------------------------------------------------------------------

class _GemmKernel:
    """Emits the GEMM kernel of a :class:`~.matmul_match.GemvMatch` for tiling ``t``
    (see the module doc)."""

    def __init__(self, m: GemvMatch, t: Tiling, emulate: bool, fn: ir.Operation,
                 split: int = 1):
        self.m, self.t, self.emulate, self.fn, self.S = m, t, emulate, fn, split
        self.nv = t.op is MMA_SYNC                  # ldmatrix + mma.sync, NVVM conversions
        self.e = EmitShorthands()
        w = m.weight
        self.bf16 = w.layout == "nk" and w.dtype is DType.BF16
        self.kind = "dense" if w.layout == "nk" else (w.fmt if w.fmt in FAST_PACKED
                                                      else "generic")
        self.vec = not emulate                      # 16-byte global/workgroup accesses
        self.xtype = f"memref<{m.M * m.K}xf32>"
        if self.kind == "dense":
            self.wtype = f"memref<{m.N * m.K}xi16>"
        elif self.kind == "q4_1":
            self.wtype = f"memref<{w.nbytes // 4}xi32>"
        elif self.kind in ("q4_0", "q8_0"):
            self.wtype = f"memref<{w.nbytes // 2}xi16>"
        else:
            self.wtype = f"memref<{w.nbytes}xi8>"
        self.BK = t.BK
        self.KT = -(-m.K // t.BK)
        self.KTS = -(-self.KT // split)             # K steps per split-K slice
        self.part_t = f"memref<{split * m.M * m.N}xf32>"
        self.ktail = m.K % t.BK != 0                # dense only (packed: K % BK == 0)
        self.k8 = m.K % 8 == 0                      # chunks are whole (16-byte aligned)
        #: the weight tiles go global -> workgroup memory by cp.async through a ring of
        #: ``t.stages`` buffers (no registers, no conversion: dense 16-bit words)
        self.async_w = t.stages > 2 and cp_async_weights(t.op, emulate, m, t.BK)
        self.sa_t = f"memref<2x{t.BM}x{t.LDS}xi16, {_WG}>"
        self.sb_t = f"memref<{t.stages if self.async_w else 2}x{t.BN}x{t.LDS}xi16, {_WG}>"

    # -- small helpers
    def c(self, v, ty="index"):
        return self.e.c(v, ty)

    def op(self, text):
        return self.e.op(text)

    def add(self, a, b):
        if b == 0:
            return a
        return self.e.add(a, b if isinstance(b, str) else self.c(b))

    def mul(self, a, k: int):
        return a if k == 1 else self.e.mul(a, self.c(k))

    def minu(self, a, k: int):
        return self.op(f"arith.minui {a}, {self.c(k)} : index")

    def i32(self, x):
        return self.op(f"arith.extui {x} : i16 to i32")

    def ubits(self, v, shift: int, mask: int):
        """``(v >> shift) & mask`` on i32."""
        return self.e.band(self.e.shr(v, shift), mask)

    def half_bits(self, x: str) -> str:
        """f32 ``x`` rounded to the mma input type, as its i16 bits: f16 (``arith.truncf``,
        round to nearest even) or bf16 (nearest even in integer arithmetic, NaN kept quiet:
        the expansion ``arith-expand{include-bf16}`` makes; no backend needs a bf16 type)."""
        e = self.e
        if not self.bf16:
            h = self.op(f"arith.truncf {x} : f32 to f16")
            return self.op(f"arith.bitcast {h} : f16 to i16")
        b = self.op(f"arith.bitcast {x} : f32 to i32")
        lsb = e.band(e.shr(b, 16), 1)
        r = e.add(b, e.add(lsb, self.c(0x7FFF, "i32"), "i32"), "i32")
        nan = self.op(f"arith.cmpf uno, {x}, {x} : f32")
        r = self.op(f"arith.select {nan}, {self.c(0x7FC00000, 'i32')}, {r} : i32")
        return self.op(f"arith.trunci {e.shr(r, 16)} : i32 to i16")

    def half_to_f32(self, h: str) -> str:
        """An i16 of workgroup memory (mma input type) as f32 (emulation only)."""
        if self.bf16:
            w = self.e.shl(self.i32(h), 16)
            return self.op(f"arith.bitcast {w} : i32 to f32")
        f = self.op(f"arith.bitcast {h} : i16 to f16")
        return self.op(f"arith.extf {f} : f16 to f32")

    def f16_to_f32(self, h16: str) -> str:
        f = self.op(f"arith.bitcast {h16} : i16 to f16")
        return self.op(f"arith.extf {f} : f16 to f32")

    # -- global loads
    def load_f32x8(self, idx: str) -> list:
        """8 consecutive f32 of x from ``idx`` (a multiple of 8 when vectorized): vectors."""
        if self.vec:
            return [self.op(f"vector.load %x[{self.add(idx, i)}] {{alignment = 16 : i64}} : "
                            f"{self.xtype}, vector<4xf32>") for i in (0, 4)]
        return [self.op(f"memref.load %x[{self.add(idx, i)}] : {self.xtype}") for i in range(8)]

    def f32x8(self, raw: list) -> list[str]:
        if self.vec:
            return [self.op(f"vector.extract {v}[{i}] : f32 from vector<4xf32>")
                    for v in raw for i in range(4)]
        return raw

    def load_w(self, idx: str, n: int) -> list[str]:
        """``n`` consecutive words of the weight buffer from word ``idx`` (scalar loads)."""
        return [self.op(f"memref.load %w[{self.add(idx, i)}] : {self.wtype}")
                for i in range(n)]

    # -- workgroup stores / loads
    def store_chunk(self, buf: str, smem: str, st: str, row: str, col, halves: list[str]):
        """8 i16 words into ``smem[buf, row, col:col+8]``."""
        colx = col if isinstance(col, str) else self.c(col)
        if self.vec:
            v = self.op(f"vector.from_elements {', '.join(halves)} : vector<8xi16>")
            self.e.raw(f"vector.store {v}, {smem}[{buf}, {row}, {colx}] "
                       f"{{alignment = 16 : i64}} : {st}, vector<8xi16>")
            return
        for i, h in enumerate(halves):
            self.e.raw(f"memref.store {h}, {smem}[{buf}, {row}, {self.add(colx, i)}] : {st}")

    def store_f32_chunk(self, buf: str, smem: str, st: str, row: str, col, vals: list[str],
                        valid: str | None = None):
        """8 f32 values rounded to the mma input type into ``smem[buf, row, col:col+8]``
        (zeros where ``valid`` is false). On CUDA pairs round with one ``cvt.rn.bf16x2.f32``
        / ``cvt.rn.f16x2.f32`` each (``nvvm.convert.f32x2.to.*``; round to nearest even, as
        :meth:`half_bits`) and the chunk is one 16-byte store; elsewhere each rounds with
        :meth:`half_bits`."""
        if not self.vec or not self.nv:
            zero = self.c(0, "i16")
            hs = [self.half_bits(x) for x in vals]
            if valid is not None:
                hs = [self.op(f"arith.select {valid}, {h}, {zero} : i16") for h in hs]
            self.store_chunk(buf, smem, st, row, col, hs)
            return
        ty = "bf16" if self.bf16 else "f16"
        words = []
        for lo, hi in zip(vals[0::2], vals[1::2]):
            p = self.op(f"nvvm.convert.f32x2.to.{ty}x2 {hi}, {lo} "
                        f"{{rnd = #nvvm.fp_rnd_mode<rn>}} : vector<2x{ty}>")
            w = self.op(f"vector.bitcast {p} : vector<2x{ty}> to vector<1xi32>")
            words.append(self.op(f"vector.extract {w}[0] : i32 from vector<1xi32>"))
        v4 = self.op(f"vector.from_elements {', '.join(words)} : vector<4xi32>")
        v = self.op(f"vector.bitcast {v4} : vector<4xi32> to vector<8xi16>")
        if valid is not None:
            zv = self.op("arith.constant dense<0> : vector<8xi16>")
            v = self.op(f"arith.select {valid}, {v}, {zv} : vector<8xi16>")
        self.store_vec(buf, smem, st, row, col, v)

    def store_vec(self, buf, smem, st, row, col, vec: str):
        colx = col if isinstance(col, str) else self.c(col)
        self.e.raw(f"vector.store {vec}, {smem}[{buf}, {row}, {colx}] "
                   f"{{alignment = 16 : i64}} : {st}, vector<8xi16>")

    # -- staging: per-thread jobs, index parts fixed before the K loop
    def jobs(self, count: int) -> list[str]:
        """The job indices ``tid + q * T`` of this thread over ``count`` jobs (clamped to the
        last: a duplicate job writes the same values to the same place)."""
        T = self.t.T
        out = []
        for q in range(-(-count // T)):
            j = self.add(self.tid, q * T)
            if (q + 1) * T > count:
                j = self.minu(j, count - 1)
            out.append(j)
        return out

    def split(self, j: str, n: int) -> tuple[str, str]:
        """``(j // n, j % n)`` for a power of two ``n``."""
        sh = n.bit_length() - 1
        return (self.op(f"arith.shrui {j}, {self.c(sh)} : index"),
                self.op(f"arith.andi {j}, {self.c(n - 1)} : index"))

    def prepare(self):
        """Per-job base indices (outside the K loop): chunks of 8 k of x rows (and dense
        weight rows), half-blocks of packed weight rows."""
        m, t, cpr = self.m, self.t, self.BK // 8        # chunks per row
        self.a_jobs = []
        for j in self.jobs(t.BM * cpr):
            row, kc = self.split(j, cpr)
            mg = self.minu(self.add(self.m0, row), m.M - 1)
            self.a_jobs.append((row, self.mul(kc, 8),
                                mg if m.x_arg is None else self.mul(mg, m.K)))
        self.b_jobs = []
        if self.kind in FAST_PACKED:
            per = {"q4_0": 9, "q4_1": 5, "q8_0": 17}[self.kind]      # words per block
            hpr = self.BK // 16                                      # half-blocks per row
            for j in self.jobs(t.BN * hpr):
                nl, r = self.split(j, hpr)
                b, h = self.split(r, 2)
                ng = self.minu(self.add(self.n0, nl), m.N - 1)
                base = self.mul(self.add(self.mul(ng, m.K // 32), b), per)
                self.b_jobs.append((nl, h, self.mul(b, 32), base))
        else:
            for j in self.jobs(t.BN * cpr):
                nl, kc = self.split(j, cpr)
                ng = self.minu(self.add(self.n0, nl), m.N - 1)
                self.b_jobs.append((nl, self.mul(kc, 8), ng))

    def k_at(self, kt: str, kc8: str, e: int = 0, exact: bool = False):
        """(valid i1 or None, clamped k) of element ``e`` of a chunk at ``kt * BK + kc8``
        (clamped to the last chunk, or with ``exact`` or K % 8, to the last element)."""
        m = self.m
        k = self.add(self.add(self.mul(kt, self.BK), kc8), e)
        if not self.ktail:
            return None, k
        valid = self.op(f"arith.cmpi ult, {k}, {self.c(m.K)} : index")
        return valid, self.minu(k, m.K - (8 if self.k8 and not exact else 1))

    def load_stage(self, kt: str) -> dict:
        """Issue the global loads of K step ``kt``: raw values, converted later."""
        m = self.m
        raw: dict = {"a": [], "b": []}
        for row, kc8, base in self.a_jobs:
            if self.m.x_arg is None:            # an expression: its loads, element by element
                xs = []
                for e in range(8):
                    valid, k = self.k_at(kt, kc8, e, exact=True)
                    v = self.se.value(self.m.x, (base, k))
                    xs.append(v if valid is None else
                              self.op(f"arith.select {valid}, {v}, {self.c(0.0, 'f32')} : f32"))
                raw["a"].append(xs)
            elif self.k8:
                valid, k = self.k_at(kt, kc8)
                raw["a"].append((valid, self.load_f32x8(self.add(base, k))))
            else:
                els = []
                for e in range(8):
                    valid, k = self.k_at(kt, kc8, e)
                    els.append((valid, self.op(f"memref.load %x[{self.add(base, k)}] : "
                                               f"{self.xtype}")))
                raw["a"].append(els)
        for job in [] if self.async_w else self.b_jobs:
            if self.kind == "dense":
                nl, kc8, ng = job
                base = self.mul(ng, m.K)
                if self.k8:
                    valid, k = self.k_at(kt, kc8)
                    at = self.add(base, k)
                    if self.vec:
                        v = self.op(f"vector.load %w[{at}] {{alignment = 16 : i64}} : "
                                    f"{self.wtype}, vector<8xi16>")
                        raw["b"].append((valid, v))
                    else:
                        raw["b"].append((valid, self.load_w(at, 8)))
                else:
                    els = []
                    for e in range(8):
                        valid, k = self.k_at(kt, kc8, e)
                        els.append((valid, self.load_w(self.add(base, k), 1)[0]))
                    raw["b"].append(els)
            elif self.kind in FAST_PACKED:
                nl, h, _, base = job
                per = {"q4_0": 9, "q4_1": 5, "q8_0": 17}[self.kind]
                blk = self.add(base, self.mul(kt, per * (self.BK // 32)))
                if self.kind == "q4_0":      # d | qs[16]: this half's 8 bytes at 2 + 8h
                    q0 = self.add(self.add(blk, 1), self.mul(h, 4))
                    raw["b"].append(self.load_w(blk, 1) + self.load_w(q0, 4))
                elif self.kind == "q4_1":    # d, m | qs[16] as words: 8 bytes at 4 + 8h
                    q0 = self.add(self.add(blk, 1), self.mul(h, 2))
                    raw["b"].append(self.load_w(blk, 1) + self.load_w(q0, 2))
                else:                        # q8_0: d | qs[32]: 16 bytes at 2 + 16h
                    q0 = self.add(self.add(blk, 1), self.mul(h, 8))
                    raw["b"].append(self.load_w(blk, 1) + self.load_w(q0, 8))
            else:
                raw["b"].append(None)        # generic: decoded at store time
        return raw

    def copy_weights(self, kt: str, slot: str) -> str:
        """Issue the ``cp.async`` copies of K step ``kt``'s weight tile into ring slot
        ``slot`` of the workgroup buffer (16 bytes a job, L1 bypassed) as one group; returns
        the group's token."""
        toks = []
        for nl, kc8, ng in self.b_jobs:
            at = self.add(self.mul(ng, self.m.K), self.add(self.mul(kt, self.BK), kc8))
            toks.append(self.op(f"nvgpu.device_async_copy %w[{at}], %sb[{slot}, {nl}, {kc8}], "
                                f"8 {{bypassL1}} : {self.wtype} to {self.sb_t}"))
        return self.op(f"nvgpu.device_async_create_group {', '.join(toks)}")

    def store_stage(self, raw: dict, kt: str, buf: str):
        """Convert / decode the loaded values of K step ``kt`` into workgroup buffer ``buf``."""
        e = self.e
        zero = self.c(0, "i16")
        fzero = self.c(0.0, "f32")
        for (row, kc8, _), r in zip(self.a_jobs, raw["a"]):
            if self.m.x_arg is None:
                self.store_f32_chunk(buf, "%sa", self.sa_t, row, kc8, r)
            elif self.k8:
                valid, vals = r
                self.store_f32_chunk(buf, "%sa", self.sa_t, row, kc8, self.f32x8(vals), valid)
            else:
                xs = [x if valid is None else self.op(f"arith.select {valid}, {x}, {fzero} : f32")
                      for valid, x in r]
                self.store_f32_chunk(buf, "%sa", self.sa_t, row, kc8, xs)
        for job, r in zip(self.b_jobs, raw["b"]):
            if self.kind == "dense":
                nl, kc8, _ = job
                if self.k8:
                    valid, v = r
                    if self.vec:
                        if valid is not None:
                            zv = self.op("arith.constant dense<0> : vector<8xi16>")
                            v = self.op(f"arith.select {valid}, {v}, {zv} : vector<8xi16>")
                        self.store_vec(buf, "%sb", self.sb_t, nl, kc8, v)
                        continue
                    hs = v if valid is None else \
                        [self.op(f"arith.select {valid}, {h}, {zero} : i16") for h in v]
                else:
                    hs = [h if valid is None else
                          self.op(f"arith.select {valid}, {h}, {zero} : i16") for valid, h in r]
                self.store_chunk(buf, "%sb", self.sb_t, nl, kc8, hs)
            elif self.kind in FAST_PACKED:
                nl, h, kb, _ = job
                getattr(self, "_st_" + self.kind)(r, nl, (h, kb), buf)
            else:
                nl, kc8, ng = job
                with self.wse.scope():
                    vals = [self.wse.value(self.deq, (ng, self.add(self.add(
                        self.mul(kt, self.BK), kc8), i))) for i in range(8)]
                    self.store_f32_chunk(buf, "%sb", self.sb_t, nl, kc8, vals)
        del e

    def _two_chunks(self, lo: list[str], hi: list[str], nl, hkb, buf, step: int):
        """Store decoded f32 values ``lo`` at k = kb + 8h (``step`` 16: Q4 halves) or kb + 16h
        (``step`` 8: Q8_0), ``hi`` ``step`` further; ``hkb`` = (h, kb: the block's first k in
        the tile)."""
        h, kb = hkb
        k0 = self.add(kb, self.mul(h, 8) if step == 16 else self.mul(h, 16))
        self.store_f32_chunk(buf, "%sb", self.sb_t, nl, k0, lo)
        self.store_f32_chunk(buf, "%sb", self.sb_t, nl, self.add(k0, step), hi)

    def _st_q4_0(self, r, nl, h, buf):
        # ggml: x[j] = (qs[j] & 15) - 8, x[j + 16] = (qs[j] >> 4) - 8, times d
        e = self.e
        d = self.f16_to_f32(r[0])
        eight = self.c(8.0, "f32")
        lo, hi = [], []
        for v16 in r[1:]:
            v = self.i32(v16)
            for b in (0, 8):
                for out, s in ((lo, b), (hi, b + 4)):
                    q = e.u2f(self.ubits(v, s, 15))
                    out.append(e.fmul(self.op(f"arith.subf {q}, {eight} : f32"), d))
        self._two_chunks(lo, hi, nl, h, buf, 16)

    def _st_q4_1(self, r, nl, h, buf):
        # ggml: x[j] = (qs[j] & 15) * d + m, x[j + 16] = (qs[j] >> 4) * d + m
        e = self.e
        d, mn = e.half(r[0], False), e.half(r[0], True)
        lo, hi = [], []
        for v in r[1:]:
            for b in (0, 8, 16, 24):
                for out, s in ((lo, b), (hi, b + 4)):
                    q = e.u2f(self.ubits(v, s, 15))
                    out.append(e.fadd(e.fmul(q, d), mn))
        self._two_chunks(lo, hi, nl, h, buf, 16)

    def _st_q8_0(self, r, nl, h, buf):
        # ggml: x[j] = qs[j] * d (qs signed bytes); this half: bytes 16h .. 16h + 15
        e = self.e
        d = self.f16_to_f32(r[0])
        vals = []
        for v16 in r[1:]:
            v = self.i32(v16)
            for s in (0, 8):
                sb = self.op(f"arith.shrsi {e.shl(v, 24 - s)}, {self.c(24, 'i32')} : i32")
                vals.append(e.fmul(e.s2f(sb), d))
        self._two_chunks(vals[:8], vals[8:], nl, h, buf, 8)

    # -- mma
    def fragments_and_mma(self, cur: str, accs: list, bcur: str | None = None) -> list:
        """One K step (BK / 16 mma k-steps) of the warp's ``mt x nt`` tiles from buffer
        ``cur`` (the weight's from ``bcur`` where it differs: the cp.async ring);
        ``accs[i][j]`` = 4 f32 names (:func:`c_fragment` order); returns the new ones."""
        t = self.t
        bcur = cur if bcur is None else bcur
        for ks in range(self.BK // 16):
            if self.emulate:
                accs = self._emulated(cur, ks, accs)
                continue
            if not self.nv:
                accs = self._amd(cur, ks, accs)
                continue
            A = []
            for i in range(t.mt):
                col = self.add(self.a_col, ks * 16)
                v = self.op(f"nvgpu.ldmatrix %sa[{cur}, {self.a_rows[i]}, {col}] "
                            f"{{numTiles = 4 : i32, transpose = false}} : {self.sa_t} -> "
                            "vector<4x2xi16>")
                A.append([self.reg(v, q, 4) for q in range(4)])
            B: list = []
            col = self.add(self.b_col, ks * 16)
            for jj in range(t.nt // 2):
                v = self.op(f"nvgpu.ldmatrix %sb[{bcur}, {self.b_rows[jj]}, {col}] "
                            f"{{numTiles = 4 : i32, transpose = false}} : {self.sb_t} -> "
                            "vector<4x2xi16>")
                regs = [self.reg(v, q, 4) for q in range(4)]
                B += [regs[:2], regs[2:]]
            if t.nt % 2:
                v = self.op(f"nvgpu.ldmatrix %sb[{bcur}, {self.b_rows[-1]}, {col}] "
                            f"{{numTiles = 2 : i32, transpose = false}} : {self.sb_t} -> "
                            "vector<2x2xi16>")
                B.append([self.reg(v, q, 2) for q in range(2)])
            accs = [[self.mma(A[i], B[j], accs[i][j]) for j in range(t.nt)]
                    for i in range(t.mt)]
        return accs

    def reg(self, v: str, q: int, n: int) -> str:
        """Register ``q`` of an ldmatrix result: vector<2xf16> (f16 mma) or i32 (bf16)."""
        r = self.op(f"vector.extract {v}[{q}] : vector<2xi16> from vector<{n}x2xi16>")
        if self.bf16:
            w = self.op(f"vector.bitcast {r} : vector<2xi16> to vector<1xi32>")
            return self.op(f"vector.extract {w}[0] : i32 from vector<1xi32>")
        return self.op(f"vector.bitcast {r} : vector<2xi16> to vector<2xf16>")

    def mma(self, a: list, b: list, c: list) -> list:
        ty = "bf16" if self.bf16 else "f16"
        opnd = "i32" if self.bf16 else "vector<2xf16>"
        types = (f"multiplicandAPtxType = #nvvm.mma_type<{ty}>, "
                 f"multiplicandBPtxType = #nvvm.mma_type<{ty}>, ")
        st = "!llvm.struct<(f32, f32, f32, f32)>"
        d = self.op(f"nvvm.mma.sync A[{', '.join(a)}] B[{', '.join(b)}] C[{', '.join(c)}] "
                    f"{{layoutA = #nvvm.mma_layout<row>, layoutB = #nvvm.mma_layout<col>, "
                    f"{types}shape = #nvvm.shape<m = 16, n = 8, k = 16>}} : "
                    f"({opnd}, {opnd}, f32) -> {st}")
        return [self.op(f"llvm.extractvalue {d}[{i}] : {st}") for i in range(4)]

    def _amd(self, cur: str, ks: int, accs: list) -> list:
        """One mma k-step on AMD: each lane's A row and B column run (``ka`` consecutive k,
        :meth:`MatrixOp.ab_fragment`) as one vector load of workgroup memory, then
        ``v_mfma_f32_16x16x16_{f16,bf16}`` (4 accumulators) or
        ``v_wmma_f32_16x16x16_{f16,bf16}`` (8)."""
        t, op = self.t, self.t.op
        ity = f"vector<{op.ka}xi16>"
        fty = ity if self.bf16 else f"vector<{op.ka}xf16>"   # (the bf16 forms take i16)
        col = self.add(self.ab_k, ks * 16)

        def frag(smem, st, r):
            v = self.op(f"vector.load {smem}[{cur}, {r}, {col}] "
                        f"{{alignment = {min(16, 2 * op.ka)} : i64}} : {st}, {ity}")
            return v if self.bf16 else self.op(f"vector.bitcast {v} : {ity} to {fty}")
        A = [frag("%sa", self.sa_t, r) for r in self.ab_rows_a]
        B = [frag("%sb", self.sb_t, r) for r in self.ab_rows_b]
        n = op.accs
        cty = f"vector<{n}xf32>"
        if op is MFMA_16X16X16:
            name = "mfma.f32.16x16x16bf16.1k" if self.bf16 else "mfma.f32.16x16x16f16"
            z = self.c(0, "i32")                    # cbsz, abid, blgp: no broadcast
            imm, itys = f", {z}, {z}, {z}", ", i32, i32, i32"
        else:
            name = "wmma.f32.16x16x16." + ("bf16" if self.bf16 else "f16")
            imm, itys = "", ""
        out = []
        for i in range(t.mt):
            out.append([])
            for j in range(t.nt):
                c = self.op(f"vector.from_elements {', '.join(accs[i][j])} : {cty}")
                d = self.op(f"rocdl.{name} {A[i]}, {B[j]}, {c}{imm} : "
                            f"({fty}, {fty}, {cty}{itys}) -> {cty}")
                out[-1].append([self.op(f"vector.extract {d}[{q}] : f32 from {cty}")
                                for q in range(n)])
        return out

    def _emulated(self, cur: str, ks: int, accs: list) -> list:
        """The matrix instruction by hand: each of the lane's accumulators (:meth:`MatrixOp.
        c_fragment`: its rows and columns of each tile) plus a 16-term dot product of the
        A row and the B column read from workgroup memory."""
        t, e, op = self.t, self.e, self.t.op

        def row(smem, st, r):
            return [self.half_to_f32(self.op(
                f"memref.load {smem}[{cur}, {r}, {self.c(ks * 16 + k)}] : {st}"))
                for k in range(16)]
        A = [{o: row("%sa", self.sa_t, self.add(self.em_rows[i], o)) for o in set(op.row_off)}
             for i in range(t.mt)]
        B = [{o: row("%sb", self.sb_t, self.add(self.em_cols[j], o)) for o in set(op.col_off)}
             for j in range(t.nt)]
        out = []
        for i in range(t.mt):
            out.append([])
            for j in range(t.nt):
                new = []
                for q in range(op.accs):
                    acc = accs[i][j][q]
                    for a, b in zip(A[i][op.row_off[q]], B[j][op.col_off[q]]):
                        acc = e.fma(a, b, acc)
                    new.append(acc)
                out[-1].append(new)
        return out

    # -- the kernel
    def kernel(self) -> tuple[str, list[list], list]:
        """(gpu.module text, launch slots per kernel: the GEMM's, then the split-K
        reduction's when S > 1, constant buffers)."""
        m, e, fn = self.m, self.e, self.fn
        nargs = len(fn.regions[0].blocks[0].arguments)
        self.cur_acc: str | None = None
        se = self.se = ArgsSeenEmitter(fn, e.k, [f"%e{i}" for i in range(nargs)],
                                       provide=self._provide)
        if self.kind == "generic":
            self.deq = next(o.results[0] for o in (x.operation for x in
                            fn.regions[0].blocks[0].operations)
                            if o.name == "poot.dequantize" and
                            arg_number(o.operands[0]) == m.weight.arg)
            names = [f"%e{i}" for i in range(nargs)]
            names[m.weight.arg] = "%w"
            self.wse = ScalarEmitter(fn, e.k, names)
        self._lane_addresses()
        self.prepare()
        first, end, last, bz = self._k_range()
        res = self._main_loop(first, end, last)
        x_reads = set(se.seen)                      # the arguments an expression x reads
        self._epilogue(res, bz)
        return self._module_text(x_reads)

    def _provide(self, v, idx):
        """The scalar emitter's hook: the accumulator of the epilogue's element as the
        matmul's result."""
        if v == self.m.root:
            if self.cur_acc is None:
                raise ScalarUnsupported("the matmul result read outside the epilogue")
            return self.cur_acc
        return None

    def _lane_addresses(self) -> None:
        """Emit the thread's place: ``tid``, the block's tile origin (``m0``, ``n0``), the
        operand addresses of its lane (ldmatrix rows, AMD operand runs) and its accumulator
        rows and columns (``em_rows``, ``em_cols``: :attr:`MatrixOp.c_fragment`)."""
        t, e = self.t, self.e
        self.tid = e.op("gpu.thread_id x")
        bx = e.op("gpu.block_id x")
        by = e.op("gpu.block_id y")
        op = t.op
        warp = e.op(f"arith.divui {self.tid}, {self.c(op.wave)} : index")
        lane = e.op(f"arith.remui {self.tid}, {self.c(op.wave)} : index")
        wm = e.op(f"arith.divui {warp}, {self.c(t.WN)} : index")
        wn = e.op(f"arith.remui {warp}, {self.c(t.WN)} : index")
        self.m0 = self.mul(by, t.BM)
        self.n0 = self.mul(bx, t.BN)
        wrow = self.mul(wm, t.WTM)                  # the warp's tile in the block
        wcol = self.mul(wn, t.WTN)
        if not self.emulate:        # operand addresses: ldmatrix rows, AMD operand runs
            lo4 = e.op(f"arith.andi {lane}, {self.c(15)} : index")
            hi = e.op(f"arith.shrui {lane}, {self.c(4)} : index")
        if self.nv and not self.emulate:
            # ldmatrix row addresses (a_ldmatrix_row, b_ldmatrix_row)
            self.a_col = self.mul(hi, 8)
            self.a_rows = [self.add(self.add(wrow, i * 16), lo4) for i in range(t.mt)]
            bn = self.add(e.op(f"arith.andi {lane}, {self.c(7)} : index"), self.mul(hi, 8))
            self.b_col = self.mul(e.op(
                f"arith.andi {e.op(f'arith.shrui {lane}, {self.c(3)} : index')}"
                f", {self.c(1)} : index"), 8)
            self.b_rows = [self.add(self.add(wcol, jj * 16), bn) for jj in range(t.nt // 2)]
            if t.nt % 2:
                self.b_rows.append(self.add(self.add(wcol, (t.nt - 1) * 8),
                                            e.op(f"arith.andi {lane}, {self.c(7)} : index")))
        elif not self.emulate:
            # AMD operand runs (MatrixOp.ab_fragment): row / column lane & 15, k from
            # ((lane >> 4) * ka) % 16
            self.ab_k = self.mul(hi, op.ka) if op.ka < 16 else self.c(0)
            self.ab_rows_a = [self.add(self.add(wrow, i * 16), lo4) for i in range(t.mt)]
            self.ab_rows_b = [self.add(self.add(wcol, j * op.n), lo4) for j in range(t.nt)]
        # the lane's accumulator rows and columns (MatrixOp.c_fragment), less row_off/col_off
        rb = self.mul(e.op(f"arith.shrui {lane}, {self.c(op.row_shift)} : index"), op.row_mul)
        cb = self.mul(e.op(f"arith.andi {lane}, {self.c(op.col_mask)} : index"), op.col_mul)
        self.em_rows = [self.add(self.add(wrow, i * 16), rb) for i in range(t.mt)]
        self.em_cols = [self.add(self.add(wcol, j * op.n), cb) for j in range(t.nt)]

    def _k_range(self) -> tuple[str, str, str, str | None]:
        """This block's K steps ``[first, end)`` and its ``last``: all of them, or slice
        ``block_id.z`` (returned too; None without split-K) of S."""
        e = self.e
        if self.S > 1:
            bz = e.op("gpu.block_id z")
            first = self.mul(bz, self.KTS)
            end = self.minu(self.add(first, self.KTS), self.KT)
            last = self.op(f"arith.subi {end}, {self.c(1)} : index")
            return first, end, last, bz
        return self.c(0), self.c(self.KT), self.c(self.KT - 1), None

    def _main_loop(self, first: str, end: str, last: str) -> str:
        """Emit the staged, double-buffered K loop; the name of its results (the
        accumulators, ``res#k``)."""
        t, e, se, op = self.t, self.e, self.se, self.t.op
        # stage the first K step (with cp.async: the first stages - 1 weight tiles in
        # flight, the first one landed), then the loop
        ring = t.stages
        if self.async_w:
            for q in range(ring - 1):
                kq = self.op(f"arith.minui {self.add(first, q)}, {last} : index")
                group = self.copy_weights(kq, self.op(
                    f"arith.remui {self.add(first, q)}, {self.c(ring)} : index"))
        self.store_stage(self.load_stage(first), first,
                         e.op(f"arith.andi {first}, {self.c(1)} : index"))
        if self.async_w:
            e.raw(f"nvgpu.device_async_wait {group} {{numGroups = {ring - 2} : i32}}")
        e.raw("gpu.barrier")
        zero = self.c(0.0, "f32")
        na = t.mt * t.nt * op.accs
        names = [e.name() for _ in range(na)]
        res = e.name()
        f32s = ", ".join(["f32"] * na)
        e.raw(f"{res}:{na} = scf.for %kt = {first} to {end} step {self.c(1)} "
              f"iter_args({', '.join(f'{n} = {zero}' for n in names)}) -> ({f32s}) {{")
        with se.scope():
            cur = e.op(f"arith.andi %kt, {self.c(1)} : index")
            nxt = e.op(f"arith.xori {cur}, {self.c(1)} : index")
            kn = self.op(f"arith.minui {self.add('%kt', 1)}, {last} : index")
            bcur = None
            if self.async_w:    # step kt + stages - 1 into the slot step kt - 1 freed
                bcur = self.op(f"arith.remui %kt, {self.c(ring)} : index")
                ahead = self.add("%kt", ring - 1)
                group = self.copy_weights(
                    self.op(f"arith.minui {ahead}, {last} : index"),
                    self.op(f"arith.remui {ahead}, {self.c(ring)} : index"))
            raw = self.load_stage(kn)
            it = iter(names)
            accs = [[[next(it) for _ in range(op.accs)] for _ in range(t.nt)]
                    for _ in range(t.mt)]
            accs = self.fragments_and_mma(cur, accs, bcur)
            self.store_stage(raw, kn, nxt)
            if self.async_w:    # step kt + 1's tile landed; the later ones may fly on
                e.raw(f"nvgpu.device_async_wait {group} {{numGroups = {ring - 2} : i32}}")
            e.raw("gpu.barrier")
            flat = [a for row in accs for col in row for a in col]
            e.raw(f"scf.yield {', '.join(flat)} : {f32s}")
        e.raw("}")
        return res

    def _epilogue(self, res: str, bz: str | None) -> None:
        """Emit the epilogue: accumulator q of tile (i, j) is y[row, col] (op.c_fragment);
        split-K slices (``bz``: the slice) store it as partial [z, row, col] instead (the
        reduction kernel's input)."""
        m, t, e, se, op = self.m, self.t, self.e, self.se, self.t.op
        part0 = self.mul(bz, m.M * m.N) if self.S > 1 else None
        k = 0
        for i in range(t.mt):
            for j in range(t.nt):
                for q in range(op.accs):
                    row = self.add(self.add(self.m0, self.em_rows[i]), op.row_off[q])
                    col = self.add(self.add(self.n0, self.em_cols[j]), op.col_off[q])
                    conds = []
                    if m.M % t.BM:
                        conds.append(self.op(f"arith.cmpi ult, {row}, {self.c(m.M)} : index"))
                    if m.N % t.BN:
                        conds.append(self.op(f"arith.cmpi ult, {col}, {self.c(m.N)} : index"))
                    if len(conds) == 2:
                        conds = [self.op(f"arith.andi {conds[0]}, {conds[1]} : i1")]
                    if conds:
                        e.raw(f"scf.if {conds[0]} {{")
                    self.cur_acc = f"{res}#{k}"
                    if part0 is not None:
                        at = self.add(part0, self.add(self.mul(row, m.N), col))
                        e.raw(f"memref.store {res}#{k}, %part[{at}] : {self.part_t}")
                    else:
                        with se.scope():
                            for jj, (out, ot) in enumerate(zip(m.outs, m.out_ts)):
                                idx = _coords(se, ot.shape, m.M, m.N, row, col)
                                se.store(se.value(out, idx), f"%o{jj}", ot, idx)
                    if conds:
                        e.raw("}")
                    k += 1
        self.cur_acc = None

    def _module_text(self, x_reads: set[str]) -> tuple[str, list[list], list]:
        """The ``gpu.module`` text around the emitted body (and the split-K reduction
        kernel), the launch slots per kernel and the constant buffers."""
        t, e = self.t, self.e
        if self.kind == "generic" and self.wse.consts:
            raise ScalarUnsupported("constant buffers in the weight decode")
        ro = " {llvm.noalias, llvm.readonly}" if not self.emulate else ""
        params, slots, consts, reduce, rslots = self._launch_params(x_reads, ro, self.S)
        sig = ", ".join(f"{a}: {b}" for a, b in params)
        # 16-byte aligned tiles (ldmatrix rows, 16-byte stores): the default is the element's
        text = (f"gpu.module @poot_gemm {{\n"
                f"  gpu.func @gemm({sig}) workgroup(%sa: {self.sa_t} {{llvm.align = 16 : i64}}, "
                f"%sb: {self.sb_t} {{llvm.align = 16 : i64}}) "
                f"kernel attributes {{known_block_size = array<i32: {t.T}, 1, 1>}} {{\n"
                f"{e.k.text()}\n    gpu.return\n  }}\n{reduce}}}\n")
        return text, [slots] + ([rslots] if reduce else []), consts

    def _launch_params(self, x_reads: set[str], ro: str, splits: int
                       ) -> tuple[list[tuple[str, str]], list[tuple[str, int]], list, str, list]:
        """The kernel's (parameters, launch slots, constant buffers) and, split over
        ``splits`` > 1 K slices, the reduction kernel's (text, launch slots): the kernel then
        writes the partials ``%part`` in place of the results, and the reduction's constant
        buffers follow the kernel's. Without a split the text is empty, the slots []."""
        m, se = self.m, self.se
        params, slots = kernel_params(self.fn, m, se, x_reads, ro, ("%x", self.xtype),
                                      [("%w", self.wtype)])
        consts = list(se.consts)
        reduce, rslots = "", []
        if splits > 1:                              # the partials instead of the results
            n_out = len(m.outs)
            params, slots = params[:-n_out] + [("%part", self.part_t)], \
                slots[:-n_out] + [("scratch", 0)]
            reduce, rslots, rconsts = self.reduce_kernel(len(consts))
            consts += rconsts
        return params, slots, consts, reduce, rslots

    def reduce_kernel(self, const0: int) -> tuple[str, list, list]:
        """The split-K reduction (``gpu.func @gemm_reduce``, :data:`REDUCE_T` threads a block,
        one thread per element of y): ``y[row, col] = sum_z partial[z, row, col]`` in slice
        order, then the region's epilogue, as the one-pass kernel stores it. Returns (its
        text, launch slots, constant buffers; theirs numbered from ``const0``)."""
        m, fn, e = self.m, self.fn, EmitShorthands()
        y: list = [None]
        se = ArgsSeenEmitter(fn, e.k, [f"%e{i}" for i in range(len(fn.regions[0].blocks[0]
                                                               .arguments))],
                       provide=lambda v, idx: y[0] if v == m.root else None)
        tid = e.op("gpu.thread_id x")
        at = e.add(e.mul(e.op("gpu.block_id x"), e.c(REDUCE_T)), tid)
        MN = m.M * m.N
        e.raw(f"scf.if {e.op(f'arith.cmpi ult, {at}, {e.c(MN)} : index')} {{")
        acc = e.op(f"memref.load %part[{at}] : {self.part_t}")
        for z in range(1, self.S):
            acc = e.fadd(acc, e.op(f"memref.load %part[{e.add(at, e.c(z * MN))}] : "
                                   f"{self.part_t}"))
        row = e.op(f"arith.divui {at}, {e.c(m.N)} : index")
        col = e.op(f"arith.remui {at}, {e.c(m.N)} : index")
        y[0] = acc
        with se.scope():
            for jj, (out, ot) in enumerate(zip(m.outs, m.out_ts)):
                idx = _coords(se, ot.shape, m.M, m.N, row, col)
                se.store(se.value(out, idx), f"%o{jj}", ot, idx)
        e.raw("}")
        ro = " {llvm.noalias, llvm.readonly}" if not self.emulate else ""
        params, slots = region_params(fn, m, se, const0=const0)
        params, slots = [("%part", self.part_t + ro)] + params, [("scratch", 0)] + slots
        sig = ", ".join(f"{a}: {b}" for a, b in params)
        text = (f"  gpu.func @gemm_reduce({sig}) kernel attributes "
                f"{{known_block_size = array<i32: {REDUCE_T}, 1, 1>}} {{\n"
                f"{e.k.text()}\n    gpu.return\n  }}\n")
        return text, slots, list(se.consts)


def _coords(se: ScalarEmitter, shape, M: int, N: int, row: str, col: str) -> list:
    """Coordinates of y[row, col] (flat index row * N + col) in an output of ``shape``:
    ``row``/``col`` themselves where the shape is [.., M, N] up to unit dimensions."""
    nonunit = [i for i, d in enumerate(shape) if d != 1]
    if [shape[i] for i in nonunit] == [M, N]:
        idx: list = [0] * len(shape)
        idx[nonunit[0]], idx[nonunit[1]] = row, col
        return idx
    return se.delinearize(se.iadd(se.imul(row, N), col), shape)


def _x_without_reductions(fn: ir.Operation) -> bool:
    """Cheap pre-check: one matmul of GEMM_FROM_M rows or more whose LHS reads no
    ``poot.reduce`` (a norm folded in front, which this strategy refuses; the full match would
    first evaluate it for every row)."""
    mms = [o.operation for o in fn.regions[0].blocks[0].operations
           if o.operation.name == "poot.matmul"]
    if len(mms) != 1:
        return False
    t = maybe_poot_type(mms[0].operands[0])
    if t is None or getattr(t, "rank", 0) != 2 or t.shape[0] < GEMM_FROM_M:
        return False
    todo, seen = [mms[0].operands[0]], set()
    while todo:
        o = defining_op(todo.pop())
        if o is None or o in seen:
            continue
        seen.add(o)
        if o.name == "poot.reduce":
            return False
        todo.extend(o.operands)
    return True


def gemm(fn: ir.Operation, caps) -> Synthesized | None:
    """Prefill GEMM regions (see the module doc); None for anything else."""
    op = matrix_op(caps)
    emulate = op is None and EMULATE_MMA is not None
    op = EMULATE_MMA if emulate else op
    if op is None or not _x_without_reductions(fn):
        return None
    m = match(fn, gemv_only=False)
    if m is None or m.prologue:
        return None
    if not gemm_rows(m):
        return None                 # decode rows: the GEMV's (matmul.GEMM_FROM_M)
    w = m.weight
    if w.layout == "kn" or (w.layout == "nk" and w.dtype not in (DType.BF16, DType.F16)):
        return None                 # f32 weights, [K, N] weights: the generic mapping
    shared = getattr(caps, "max_shared_bytes", 0) or 0
    packed = w.layout == "packed"
    t = choose_tiling(m.M, m.N, m.K, max(1, int(getattr(caps, "cores", 1) or 1)), shared,
                      packed, op)
    if FORCE_TILING is not None:
        BM, BN, BK = FORCE_TILING
        t = tiling(BM, BN, BK, op)
        if packed and m.K % BK:
            return None
    if t.smem_bytes > shared:
        return None
    if cp_async_weights(op, emulate, m, t.BK):
        t = with_stages(t, shared)      # cp.async's weight ring (_GemmKernel.async_w)
    cores = max(1, int(getattr(caps, "cores", 1) or 1))
    split = _whole_slices(-(-m.K // t.BK),
                          FORCE_SPLIT or choose_split(t, m.M, m.N, m.K, cores))
    try:
        text, slots, consts = _GemmKernel(m, t, emulate, fn, split).kernel()
    except ScalarUnsupported:
        return None
    launches = [Launch("kernel", slots[0], "poot_gemm", "gemm",
                       (-(-m.N // t.BN), -(-m.M // t.BM), split), (t.T, 1, 1))]
    if split == 1:
        return Synthesized(text, launches, consts=consts)
    launches.append(Launch("kernel", slots[1], "poot_gemm", "gemm_reduce",
                           (-(-m.M * m.N // REDUCE_T), 1, 1), (REDUCE_T, 1, 1)))
    return Synthesized(text, launches, consts=consts,
                       scratch=[(f"memref<{split * m.M * m.N}xf32>", split * m.M * m.N * 4)])


__all__ = ["BKS", "EMULATE_MMA", "FORCE_SPLIT", "FORCE_TILING", "MAX_SPLIT", "MAX_SPLIT_SCRATCH",
           "MFMA_16X16X16", "MMA_SYNC", "PAD", "REDUCE_T", "SPLIT_BLOCKS_PER_CORE",
           "SPLIT_MIN_STEPS", "STAGES", "WARPS", "WMMA_16X16X16", "MatrixOp", "Tiling",
           "a_fragment", "a_ldmatrix_row", "b_fragment", "b_ldmatrix_row", "c_fragment",
           "choose_split", "choose_tiling", "cp_async_weights", "error_bound", "gemm",
           "has_mma", "matrix_op", "tiling", "with_bk", "with_stages"]
