"""The row-streaming matmul kernel: ``y[m, n] = sum_k x[m, k] * W[n, k]`` with ``W`` a weight
stored ``[N, K]`` row-major (the ``matmul(x, transpose(W))`` of every linear layer), read in
place -- dense (f32, or f16/bf16 widened in registers) or packed (Q4_0, Q4_1, Q8_0 blocks
decoded in registers from their stored bytes; no dequantized copy of the weight).

The CPU backend's :class:`~poot.dialects.lowering.rules.MatmulKernels` (:data:`KERNELS`, put
in the :class:`~poot.dialects.lowering.rules.Strategy` by
:func:`poot.backends.cpu.codegen.strategy_for`): the contraction rules try it first and it
takes the ops :func:`match` fits. With f32 x (dense weights; packed ones at precision
``exact``) the kernel is, on tensors (one-shot bufferization makes it in place):

* rows ``n`` of W: ``scf.forall`` over items of up to :data:`DENSE_GROUP_MAX` rows (threads,
  when the weight is big enough to pay for a fork/join; :func:`dense_group`) or ``scf.for``;
* inside an item, tiles of ``m_tile`` rows of x (decode M = 1: one tile; prefill: a loop of
  tiles), each meeting the item's W rows in register blocks of :data:`DENSE_N_BLOCK` rows
  (:meth:`_K.tile_dense`) while it stays in L1: one accumulator per (x row, W row), so each
  x vector read feeds 4 W rows and each W vector 4 x rows;
* the K loop walks 32-element chunks (one quant block): the chunk's 32 weights are read as
  two ``vector<16xf32>`` (f16/bf16 widened with ``extf``; packed blocks decoded: f16 scales
  through ``vector.bitcast`` + ``extf``, nibbles with ``andi``/``shrui``), multiplied into the
  accumulator with ``math.fma``, low half then high. A dense K that is not a multiple of 32
  finishes with one masked chunk (padding 0);
* the accumulators' lanes are summed by :meth:`_K.fold` (a halving tree per output, shuffled
  across up to 16 outputs at once) and each x row's results written as one vector; a dense
  weight's bytes :data:`DENSE_PREFETCH_BYTES` past the block are prefetched as one stream.

An output's operations do not depend on the block or item it is in: a row's results are the
same at every M.

Packed weights with x quantized (:attr:`~poot.dialects.lowering.rules.Strategy.dot_bits`) and
M >= 2 rows of x (batched decode, prefill) take the GEMM tile instead (:func:`gemm_fits`,
:meth:`_K.tile_gemm`): threads over tiles of L = 8 W rows (16 with 512-bit VNNI), each block's
L rows decoded once (once per tile when M spans several x-row tiles: a small pack of the
interleaved weights and row scales) and transposed so that i32 lane j of a dot product is W
row j; each x row's block words are broadcast to all lanes (one ``vpdpwssd`` / ``vpdpbusd``
per word with a broadcast memory operand), scaled per block by the vector of the L rows'
scales, the Q4 min term likewise: one vector<L x f32> accumulator per x row, up to
:data:`GEMM_M_TILE` x rows a tile; each tile row is prefetched :data:`PREFETCH_BYTES` ahead.
Decode (M = 1) with the same formats and N takes the lane-order GEMV (:func:`lane_order`,
:meth:`_K.tile_lanes`): x stays in registers, each W row's integer dot products (two Q4 rows
a 512-bit ``vpdpwssd`` / ``vpdpbusd`` with VNNI, x repeated in both halves) are summed
across lanes by shuffles and adds (:meth:`_K.hsum`: exact, integers) into one vector whose
lane j is W row j's block sum, which meets the rows' scale vectors in the GEMM tile's two
FMAs; the tiles ahead are prefetched as one forward stream. So a row's result is bitwise the
same at every M, alone or in a batch of any size (the engine's batch invariance): the integer
sums are exact, and the f32 operations per (x row, W row) and their order are the same.

Weights stored row-interleaved (``q4_0_r16`` / ``q4_1_r16`` / ``q8_0_r16``,
:mod:`poot.dialects.quant_layout`: what a CPU with 512-bit VNNI stores them in, repacked at
load time) take the row-interleaved tile (:meth:`_K.tile_r16`) at every M below the AMX
tile's (:data:`~poot.backends.cpu.amx.MIN_ROWS`): a Q4 tile block's 4 x 64 bytes are, after
one ``and`` and one shift each, the 8 interleaved weight vectors the GEMM tile builds by
transposes (lane j: row j's 4 elements of one x word; Q8_0's 8 x 64 bytes are those vectors
as stored), so each x row's block costs its 8 (int8 x) or 16 (int16 x: ``x = 256 h + l``
split into bytes, ``256 sum(w h) + sum(w l)``) ``vpdpbusd`` with broadcast x words. Q8_0's
weights are signed: where they meet signed x bytes they enter as ``w + 128`` and ``128``
times the x bytes' sum (:meth:`_K.quantize_x`) is subtracted. AMX reads the same vectors as
its B tiles. The integer block sums are exact, and the f32 operations are
:meth:`_K._scale_fma`'s: bitwise the results of the ggml-layout kernels wherever those sum
in lane order (int16 x).

Results agree with the oracle (dequantize, then an f32 matmul) up to f32 summation order
(up to the rounding of x with integer dot products).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from poot.backends.cpu import amx
from poot.backends.cpu.attention import paged_attention as cpu_paged_attention
from poot.dialects.lowering.contraction import clamped_index
from poot.dialects.lowering.emit import Emitter, tt
from poot.dialects.lowering.rules import OpInfo, Strategy
from poot.dialects.lowering.views import concat_generic
from poot.dialects.types import DType, PackedType, TensorType

#: declared functions standing for LLVM intrinsics: name -> (intrinsic, function type)
INTRINSIC_PREFIX = "__poot_intr_"
INTRINSICS: dict[str, tuple[str, str]] = {}


def intrinsic_declarations(text: str) -> str:
    """``func.func private`` declarations of the intrinsic stand-ins that ``text`` calls."""
    out = []
    for fn, (_, sig) in INTRINSICS.items():
        if f"@{fn}(" in text:
            out.append(f"func.func private @{fn}{sig.replace(') ->', ') -> ', 1)}")
    return "\n".join(out)


#: fewest x rows whose quantization (:meth:`_K.quantize_x`) is spread over the threads: a
#: row is 9-48 blocks here, a few microseconds, about one fork/join of 2 threads
QUANTIZE_PARALLEL_ROWS = 8
#: packed formats with a vector decoder here (others keep the portable lowering)
PACKED = ("q4_0", "q4_1", "q8_0")
#: W rows of one :meth:`_K.tile_gemm` tile: the 8 i32 lanes of a 256-bit dot product
GEMM_N_TILE = 8
#: x rows of one :meth:`_K.tile_gemm` tile with AVX-512's 32 vector registers (half with 16)
GEMM_M_TILE = 8
#: independent integer accumulators per x row in a block (their dot-product chains overlap)
GEMM_CHAINS = 2
#: W rows of one register block of the dense kernel (:meth:`_K.tile_dense`) with AVX-512's
#: 32 vector registers: 4 x rows x 4 W rows = 16 accumulators, the 4 rows' 8 widened W
#: vectors and an x pair live at once (one W row with 16 registers)
DENSE_N_BLOCK = 4
#: most W rows a thread's item of the dense kernel takes (:func:`dense_group`): a block of
#: x rows is read once per item, and the item's W rows (64 x K halves: 72 KiB at K = 576)
#: stay in L2 while every x-row tile meets them
DENSE_GROUP_MAX = 64
#: how far past its register block's first byte the dense kernel prefetches W (measured on a
#: Zen 4, 2 threads, f16 weights, ms: 49152 x 576 at M = 1 no prefetch 2.24, 2 KiB 1.41,
#: 8 KiB 1.07, 16 KiB 1.04, one W row a block 1.05; 8192 x 2048 at M = 4 1.16 / 1.13 / 1.10 /
#: 1.01, one row a block 2.06; at M >= 32 no change)
DENSE_PREFETCH_BYTES = 16 << 10
#: W rows of one :meth:`_K.tile_lanes` tile (M = 1): one i32 lane of a 256-bit vector each
GEMV_LANES = 8
#: bytes ahead :meth:`_K.r16_block` prefetches a row-interleaved W (one forward stream a
#: thread; measured on a 2-core Xeon VM, SmolLM2's 210 Q4_1 layer matmuls at M = 1 from
#: 2 MiB pages, median of 25: no prefetch 4.4 ms, 2.5 KiB ahead 3.3, 11.5 KiB 3.0-3.2,
#: 20 KiB 2.9-3.3, 30 KiB 3.5; the ggml-layout GEMV 3.5-3.7)
R16_PREFETCH_BYTES = 16 << 10
#: how many tiles ahead :meth:`_K.tile_lanes` prefetches W (measured on a Zen 4, a 35 MB
#: Q4_1 GEMV on one thread: 1 tile 13.7 GB/s, 2 14.4, 4 14.2; the row-streaming tile 13.8)
GEMV_PREFETCH_TILES = 2
#: how far ahead of the block being decoded the GEMM tile prefetches each W row (measured on
#: a Zen 4: SmolLM2's 49152 x 576 Q8_0 head at M = 8, 1.3x faster than no prefetch; 64 and
#: 192-512 bytes gained less)
PREFETCH_BYTES = 128
CHUNK = 32  # K elements per step: one quant block
HALF_DTYPES = (DType.F16, DType.BF16)


@dataclass
class Gemv:
    """One matched ``x[M, K] @ W[N, K]^T``.

    Attributes:
        x: SSA name of x (tensor<MxKxf32>); w: SSA name of W (dense tensor, or the packed
        bytes ``tensor<NBYTESxi8>``); wtype: W's type (TensorType or PackedType); m, k, n: sizes.
    """

    x: str
    w: str
    wtype: object
    m: int
    k: int
    n: int
    #: an index SSA name added to every W row (rows ``row_base .. row_base + n`` of a
    #: weight holding ``total_rows``: one slab of :func:`emit_indexed`), or None
    row_base: str | None = None
    total_rows: int | None = None

    @property
    def packed(self) -> bool:
        return isinstance(self.wtype, PackedType)

    @property
    def weight_bytes(self) -> int:
        """Bytes of W this kernel streams (one slab's, for a slab)."""
        if self.packed:
            return self.wtype.nbytes * self.n // (self.total_rows or self.n)
        return self.n * self.k * self.wtype.dtype.itemsize


def lane_order(g: "Gemv", s: Strategy) -> bool:
    """Whether ``g`` is summed in lane order, one i32 / f32 vector lane a W row: packed Q4_0 /
    Q4_1 (int8 or int16 x) or Q8_0 (int16 x) weights, x quantized (``s.dot_bits``), N a
    multiple of :data:`GEMM_N_TILE`. At M >= 2 the GEMM tile (:meth:`_K.tile_gemm`), at
    M = 1 the lane-order GEMV (:meth:`_K.tile_lanes`): the same f32 operations per
    (x row, W row), so a row's result does not depend on M."""
    if not g.packed or not s.dot_bits or g.n % GEMM_N_TILE:
        return False
    fmt = g.wtype.format.name
    return fmt in ("q4_0", "q4_1") or (fmt == "q8_0" and s.dot_bits == 16)


def gemm_fits(g: "Gemv", s: Strategy) -> bool:
    """Whether the lane-interleaved integer GEMM (:meth:`_K.tile_gemm`) takes ``g``: M >= 2
    rows of x summed in :func:`lane_order`. Decode (M = 1) takes the lane-order GEMV."""
    return g.m >= 2 and lane_order(g, s)


def dense_group(n: int, nr: int, cores: int) -> int:
    """W rows of one item of the dense kernel's row loop (``scf.forall`` over the threads):
    the largest multiple of ``nr`` (the register block's W rows) up to
    :data:`DENSE_GROUP_MAX` dividing ``n`` into a multiple of ``cores`` items (2 threads
    over 9 items would leave one idle a ninth of the time), else the largest dividing ``n``
    into at least 4 items a thread, else ``nr``. Raises ValueError where ``nr`` does not
    divide ``n``."""
    if n % nr:
        raise ValueError(f"a dense block of {nr} W rows does not divide N = {n}")
    sizes = [g for g in range(DENSE_GROUP_MAX, nr - 1, -1) if g % nr == 0 and n % g == 0]
    for g in sizes:
        if n // g >= cores and (n // g) % cores == 0:
            return g
    return next((g for g in sizes if n // g >= 4 * cores), nr)


def fold_masks(w: int) -> tuple[list[int], list[int]]:
    """The (lo, hi) ``vector.shuffle`` masks of one stage of :meth:`_K.fold` on two
    vector<16xf32> holding outputs in blocks of ``w`` lanes: lo takes the first half of every
    block of the first vector, then of the second, hi the second halves, so ``lo + hi`` holds
    both vectors' outputs in blocks of ``w / 2`` lanes, lane e of a block the sum of lanes e
    and e + w / 2 of the block it came from."""
    lo = [src + blk * w + e for src in (0, 16) for blk in range(16 // w) for e in range(w // 2)]
    return lo, [i + w // 2 for i in lo]


def _unpack_mask(n: int, unit: int, hi: bool) -> list[int]:
    """``vector.shuffle`` mask interleaving the low (or high) halves of two n-element vectors
    in runs of ``unit`` elements (x86 ``punpckl*`` / ``punpckh*`` on one 128-bit lane)."""
    units, h = n // unit, (n // unit) // 2 if hi else 0
    return [src + (h + i) * unit + e for i in range(units // 2) for src in (0, n)
            for e in range(unit)]


def _transpose_order(n: int) -> list[int]:
    """Which column each vector :meth:`_K.transpose` returns holds (its stages leave the
    columns in bit-reversed order), found by running the same shuffles on indices."""
    import numpy as np

    cur = [np.arange(n * r, n * r + n) for r in range(n)]
    unit = 1
    while unit < n:
        pairs = [(np.concatenate([cur[2 * k], cur[2 * k + 1]])) for k in range(n // 2)]
        cur = [p[_unpack_mask(n, unit, False)] for p in pairs] + \
            [p[_unpack_mask(n, unit, True)] for p in pairs]
        unit *= 2
    return [int(c[0]) for c in cur]


def _hsum_masks(count: int, width: int) -> list[tuple[list[int], list[int]]]:
    """The (lo, hi) ``vector.shuffle`` masks of each stage of :meth:`_K.hsum` on ``count``
    vectors of ``width`` i32 lanes: the first two stages in-lane (each 128-bit lane of the
    result: the evens, then the odds, of that lane of the pair's two vectors), the rest
    across 128-bit lanes (the evens, then the odds, of the pair's 128-bit lanes)."""
    out, chunks = [], width // 4
    for stage in range(count.bit_length() - 1):
        if stage < 2:
            lo = [v * width + 4 * c + e for c in range(chunks) for v in (0, 1) for e in (0, 2)]
            hi = [i + 1 for i in lo]
        else:
            lo = [v * width + 4 * c + e for v in (0, 1) for c in range(0, chunks, 2)
                  for e in range(4)]
            hi = [i + 4 for i in lo]
        out.append((lo, hi))
    return out


def _hsum_rows(count: int, width: int, rows: int) -> list[int]:
    """Which row each output lane of :meth:`_K.hsum` sums, on ``count`` vectors of ``width``
    lanes with ``rows`` rows a vector (row ``rows * v + i`` in lanes ``i * width / rows``
    onwards of vector v), found by running its stages on row numbers; raises AssertionError
    where an output lane would mix rows or miss lanes."""
    per = width // rows
    vecs = [[[(rows * v + lane // per, v, lane)] for lane in range(width)]
            for v in range(count)]
    for lo, hi in _hsum_masks(count, width):
        vecs = [[(a + b)[i] + (a + b)[j] for i, j in zip(lo, hi)]
                for a, b in zip(vecs[::2], vecs[1::2])]
    (out,) = vecs
    got = [{r for r, _, _ in lane} for lane in out]
    assert all(len(g) == 1 for g in got) and all(len(lane) == per for lane in out), \
        "hsum mixes rows"
    return [next(iter(g)) for g in got]


def _weight_source(t: OpInfo | None) -> tuple[str, object] | None:
    """(ssa, type) of the [N, K] weight behind ``transpose(W)``, looking through a dequantize
    of a supported format or a widening cast of a dense half tensor; None when not a weight
    read in place."""
    if t is None or t.name != "transpose" or tuple(t.attrs["perm"]) != (1, 0):
        return None
    src = t.producer(0)
    wt = t.types[0]
    if src is None:
        if isinstance(wt, TensorType) and (wt.dtype is DType.F32 or wt.dtype in HALF_DTYPES):
            return t.args[0], wt
        return None
    if src.name == "dequantize" and src.result.dtype is DType.F32:
        pt = src.types[0]
        if (pt.format.name in PACKED or pt.format.rows > 1) and src.producer(0) is None:
            return src.args[0], pt
        return None
    if src.name == "cast" and src.producer(0) is None and src.result.dtype is DType.F32 and \
            src.types[0].dtype in HALF_DTYPES:
        return src.args[0], src.types[0]
    return None


def match(op: OpInfo) -> Gemv | None:
    """The kernel for a ``poot.matmul`` whose operands fit: 2-D, f32 x, f32 accumulation,
    rhs = transpose of a weight read in place."""
    at, bt = op.types
    if at.rank != 2 or bt.rank != 2 or at.dtype is not DType.F32 or op.attrs["acc"] is not DType.F32:
        return None
    rhs = op.producer(1)
    if rhs is not None and rhs.name == "cast" and rhs.result.dtype is DType.F32 and \
            rhs.types[0].dtype in HALF_DTYPES:
        # cast(transpose(W)): the same weight, widened after the view
        t = rhs.producer(0)
        src = _weight_source(t) if t is not None and t.producer(0) is None else None
    else:
        src = _weight_source(rhs)
    if src is None:
        return None
    m, k = at.shape
    n = bt.shape[1]
    if m == 0 or n == 0 or k == 0:
        return None
    if isinstance(src[1], PackedType) and src[1].format.rows > 1 and not r16_fits(op.strategy):
        return None             # the generic lowering decodes it (packed.py)
    return Gemv(op.args[0], src[0], src[1], m, k, n)


def r16_fits(s: Strategy) -> bool:
    """Whether the strategy runs the row-interleaved tile (:meth:`_K.tile_r16`): x quantized
    (``dot_bits``) and 512-bit VNNI (``vnni`` with AVX-512's ``m_tile``)."""
    return bool(s.dot_bits) and s.vnni and s.m_tile >= 4


class _K:
    """Emission helpers for one kernel."""

    def __init__(self, em: Emitter, g: Gemv, s: Strategy):
        self.em, self.g, self.s = em, g, s
        self.vw = 16
        self.vf = f"vector<{self.vw}xf32>"
        #: bits of the quantized x (8 or 16) of the integer dot-product kernel, 0: f32 x
        self.bits = s.dot_bits if g.packed else 0
        self.quant = self.bits > 0
        # x rows x W rows per tile: the integer kernel keeps an accumulator per pair, at most
        # 8 pairs (16 registers with their scalar partners); decode (M = 1) takes n_tile W
        # rows, prefill m_tile x rows times what is left. The f32 kernel: one W row.
        self.mt = max(1, min(s.m_tile, g.m))
        nt = 1
        #: the lane-interleaved GEMM tile (:meth:`tile_gemm`) for M >= 2
        self.gemm = gemm_fits(g, s)
        #: the lane-order GEMV (:meth:`tile_lanes`) for M = 1, rounding as the GEMM tile
        self.lane_gemv = g.m == 1 and lane_order(g, s)
        if self.gemm:
            self.mt = min(g.m, GEMM_M_TILE if s.m_tile >= 4 else GEMM_M_TILE // 2)
            #: W rows a tile, one an i32 lane: 16 with 512-bit VNNI, else 8
            self.lanes = 2 * GEMM_N_TILE if s.vnni and s.m_tile >= 4 and \
                g.n % (2 * GEMM_N_TILE) == 0 else GEMM_N_TILE
            nt = self.lanes
        elif g.m == 1 and lane_order(g, s):
            #: W rows a tile, one a lane: 16 for Q4 with 512-bit VNNI, else 8
            self.lanes = nt = 2 * GEMV_LANES if s.vnni and s.m_tile >= 4 and \
                g.n % (2 * GEMV_LANES) == 0 and g.wtype.format.name != "q8_0" else GEMV_LANES
        elif self.quant:
            want = s.n_tile if g.m == 1 else max(1, 8 // self.mt)
            nt = next(t for t in (want, 4, 2, 1) if t <= want and g.n % t == 0)
        #: the register-blocked f32 kernel (:meth:`tile_dense`) for dense weights and packed
        #: ones with f32 x: ``nr`` W rows a register block, items of ``nt`` W rows
        #: (:func:`dense_group`)
        self.dense_block = not self.quant
        if self.dense_block:
            self.nr = DENSE_N_BLOCK if s.m_tile >= 4 and g.n % DENSE_N_BLOCK == 0 else 1
            nt = dense_group(g.n, self.nr, max(1, s.cores))
        #: the row-interleaved tile (:meth:`tile_r16`) for a ``q4_*_r16`` weight
        self.r16 = g.packed and g.wtype.format.rows > 1
        #: a ``q8_0_r16`` weight: signed weight bytes (their dot products need a correction)
        self.r16_q8 = self.r16 and g.wtype.format.base == "q8_0"
        if self.r16:
            self.lanes = nt = g.wtype.format.rows
            self.mt = min(g.m, GEMM_M_TILE)
        #: the GEMM on AMX tiles (:mod:`poot.backends.cpu.amx`): same results as tile_gemm
        self.amx = amx.AmxTile(self) if (self.gemm or self.r16) and amx.fits(self) else None
        if self.amx is not None:
            self.lanes = nt = amx.N_TILE
            self.mt = min(g.m, amx.M_TILE)
        self.nt = nt
        self._consts: dict = {}

    def c(self, v: int) -> str:
        return self.em.const(v, "index")

    def block_offsets(self, row0: str, b: str, n: int) -> list[str]:
        """Byte offsets in W of block ``b`` of the ``n`` kernel rows from ``row0``."""
        fmt = self.g.wtype.format
        row_bytes = self.g.k // CHUNK * fmt.block_bytes
        boff = self.mul(b, fmt.block_bytes)
        return [self.add(self.mul(self.wrow(self.add(row0, j)), row_bytes), boff)
                for j in range(n)]

    def wrow(self, row: str) -> str:
        """The stored W row of kernel row ``row`` (offset by the slab's first row)."""
        b = self.g.row_base
        return row if b is None else self.idx(f"arith.addi {row}, {b}")

    def idx(self, expr: str) -> str:
        return self.em.op(expr + " : index")

    def add(self, a: str, b) -> str:
        if isinstance(b, int):
            if b == 0:
                return a
            b = self.c(b)
        return self.idx(f"arith.addi {a}, {b}")

    def mul(self, a: str, b: int) -> str:
        return self.idx(f"arith.muli {a}, {self.c(b)}")

    def splat(self, v, ty: str, n: int | None = None) -> str:
        n = n or self.vw
        return self.em.op(f"arith.constant dense<{v}> : vector<{n}x{ty}>", "cv")

    # ---- reads ----
    def read_x(self, row: str, k: str, masked: bool) -> str:
        g, em = self.g, self.em
        pad = em.const(0.0, "f32")
        ib = "false" if masked else "true"
        return em.op(f"vector.transfer_read {g.x}[{row}, {k}], {pad} {{in_bounds = [{ib}]}} : "
                     f"tensor<{g.m}x{g.k}xf32>, {self.vf}")

    def read_bytes(self, off: str, n: int) -> str:
        g, em = self.g, self.em
        pad = em.const(0, "i8")
        return em.op(f"vector.transfer_read {g.w}[{off}], {pad} {{in_bounds = [true]}} : "
                     f"tensor<{g.wtype.nbytes}xi8>, vector<{n}xi8>")

    def scales(self, off: str, count: int) -> list[str]:
        """``count`` consecutive little-endian f16 at byte ``off``, as f32 splats."""
        em = self.em
        raw = self.read_bytes(off, 2 * count)
        h = em.op(f"vector.bitcast {raw} : vector<{2 * count}xi8> to vector<{count}xf16>")
        f = em.op(f"arith.extf {h} : vector<{count}xf16> to vector<{count}xf32>")
        out = []
        for i in range(count):
            x = em.op(f"vector.extract {f}[{i}] : f32 from vector<{count}xf32>")
            out.append(em.op(f"vector.broadcast {x} : f32 to {self.vf}"))
        return out

    def decode(self, row: str, b: str) -> tuple[str, str]:
        """Weights ``W[row, 32b : 32b + 32]`` as two vector<16xf32> (elements 0-15, 16-31)."""
        g, em, vf = self.g, self.em, self.vf
        if not g.packed:
            return self.dense(row, self.mul(b, CHUNK), False)
        fmt = g.wtype.format
        row_bytes = g.k // fmt.block_elems * fmt.block_bytes
        off = self.add(self.mul(self.wrow(row), row_bytes), self.mul(b, fmt.block_bytes))
        v16i8 = "vector<16xi8>"
        if fmt.name == "q8_0":
            (d,) = self.scales(off, 1)
            out = []
            for h in (0, 16):
                q = self.read_bytes(self.add(off, 2 + h), 16)
                qf = em.op(f"arith.sitofp {q} : {v16i8} to {vf}")
                out.append(em.op(f"arith.mulf {qf}, {d} : {vf}"))
            return out[0], out[1]
        qs_off = 2 if fmt.name == "q4_0" else 4
        sc = self.scales(off, 1 if fmt.name == "q4_0" else 2)
        q = self.read_bytes(self.add(off, qs_off), 16)
        lo = em.op(f"arith.andi {q}, {self.splat(15, 'i8', 16)} : {v16i8}")
        hi = em.op(f"arith.shrui {q}, {self.splat(4, 'i8', 16)} : {v16i8}")
        out = []
        for nib in (lo, hi):
            if fmt.name == "q4_0":
                qi = em.op(f"arith.subi {nib}, {self.splat(8, 'i8', 16)} : {v16i8}")
                qf = em.op(f"arith.sitofp {qi} : {v16i8} to {vf}")
                out.append(em.op(f"arith.mulf {qf}, {sc[0]} : {vf}"))
            else:
                qf = em.op(f"arith.uitofp {nib} : {v16i8} to {vf}")
                out.append(em.op(f"math.fma {qf}, {sc[0]}, {sc[1]} : {vf}"))
        return out[0], out[1]

    def dense(self, row: str, k: str, masked: bool) -> tuple[str, str | None]:
        """Dense ``W[row, k : k + 32]`` (masked: padded with 0 past K; the upper half is None
        when it lies wholly past K)."""
        g, em, vf = self.g, self.em, self.vf
        wt: TensorType = g.wtype
        ty = wt.dtype.value
        pad = em.const(0.0, ty)
        ib = "false" if masked else "true"
        out = []
        for h in (0, 16):
            if masked and h and self.tail <= 16:
                out.append(None)
                continue
            kk = self.add(k, h)
            v = em.op(f"vector.transfer_read {g.w}[{self.wrow(row)}, {kk}], {pad} "
                      f"{{in_bounds = [{ib}]}} : "
                      f"{tt(wt)}, vector<{self.vw}x{ty}>")
            if wt.dtype is not DType.F32:
                v = em.op(f"arith.extf {v} : vector<{self.vw}x{ty}> to {vf}")
            out.append(v)
        return out[0], out[1]

    # ---- the kernel ----
    def tile_dense(self, row0: str, m0: str, rows: int, dest: str, dest_t: str,
                   col0: str) -> str:
        """Rows ``m0 .. m0 + rows`` of f32 x against the item's ``self.nt`` W rows (dense, or
        packed blocks decoded by :meth:`decode`) from ``row0``, in register blocks of
        ``self.nr`` W rows (:meth:`dense_block_rows`): the x tile stays in L1 while it meets
        every block. Writes ``dest[m0 + i, col0 + j]``."""
        em, nr = self.em, self.nr
        blocks = self.nt // nr
        if blocks == 1:
            return self.dense_block_rows(row0, m0, rows, dest, dest_t, col0)
        j, res, acc = em.fresh("j"), em.fresh("wb"), em.fresh("d")
        em.line(f"{res} = scf.for {j} = {self.c(0)} to {self.c(blocks)} step {self.c(1)} "
                f"iter_args({acc} = {dest}) -> ({dest_t}) {{")
        em.depth += 1
        off = self.mul(j, nr)
        d = self.dense_block_rows(self.add(row0, off), m0, rows, acc, dest_t,
                                  self.add(col0, off))
        em.line(f"scf.yield {d} : {dest_t}")
        em.depth -= 1
        em.line("}")
        return res

    def dense_block_rows(self, row0: str, m0: str, rows: int, dest: str, dest_t: str,
                         col0: str) -> str:
        """One register block: x rows ``m0 .. m0 + rows`` against W rows ``row0 .. row0 + nr``,
        one vector<16xf32> accumulator per (x row, W row): per 32-element chunk the nr rows'
        two W vectors (widened, or decoded: :meth:`decode`) meet each x row's two
        (``math.fma``, low half then high, so lane l sums the k = l mod 16 products in k
        order; a K that is not a multiple of 32 ends with one masked chunk), then
        :meth:`fold` sums each accumulator's lanes (a halving tree) and each x row's nr
        results are written as one vector. Every output's operations and their order are
        the same whatever the block's size, so a row's results do not depend on M (the
        engine's batch invariance)."""
        g, em, vf, nr = self.g, self.em, self.vf, self.nr
        assert rows * nr <= 16, "a register block holds at most 16 accumulators"
        nb = g.k // CHUNK
        self.tail = g.k % CHUNK
        zero = em.op(f"arith.constant dense<0.0> : {vf}", "cv")
        xrows = [self.add(m0, i) for i in range(rows)]
        wrows = [self.add(row0, r) for r in range(nr)]
        accs = [zero] * (rows * nr)

        def step(ws, xs, accs):
            out = list(accs)
            for i, (xlo, xhi) in enumerate(xs):
                for r, (wlo, whi) in enumerate(ws):
                    a = em.op(f"math.fma {wlo}, {xlo}, {out[i * nr + r]} : {vf}")
                    if whi is not None:
                        a = em.op(f"math.fma {whi}, {xhi}, {a} : {vf}")
                    out[i * nr + r] = a
            return out

        if nb:
            b = em.fresh("b")
            iters = [em.fresh("acc") for _ in accs]
            res = em.fresh("kl")
            em.line(f"{res}:{len(accs)} = scf.for {b} = {self.c(0)} to {self.c(nb)} step "
                    f"{self.c(1)} iter_args("
                    + ", ".join(f"{a} = {z}" for a, z in zip(iters, accs))
                    + f") -> ({', '.join([vf] * len(accs))}) {{")
            em.depth += 1
            k = self.mul(b, CHUNK)
            k16 = self.add(k, 16)
            if self.wmem is not None:
                self._prefetch_dense(row0, b)
            ws = [self.decode(wr, b) for wr in wrows]
            xs = [(self.read_x(xr, k, False), self.read_x(xr, k16, False)) for xr in xrows]
            new = step(ws, xs, iters)
            em.line(f"scf.yield {', '.join(new)} : {', '.join([vf] * len(new))}")
            em.depth -= 1
            em.line("}")
            accs = [f"{res}#{i}" for i in range(len(accs))]
        if self.tail:  # one masked chunk
            k = self.c(nb * CHUNK)
            ws = [self.dense(wr, k, True) for wr in wrows]
            hi = ws[0][1] is not None
            xs = [(self.read_x(xr, k, True),
                   self.read_x(xr, self.add(k, 16), True) if hi else None) for xr in xrows]
            accs = step(ws, xs, accs)
        sums = self.fold(accs)
        vr = f"vector<{nr}xf32>"
        for i, xr in enumerate(xrows):
            part = em.op(f"vector.extract_strided_slice {sums} {{offsets = [{i * nr}], "
                         f"sizes = [{nr}], strides = [1]}} : {vf} to {vr}")
            dest = em.op(f"vector.transfer_write {part}, {dest}[{xr}, {col0}] "
                         f"{{in_bounds = [true]}} : {vr}, {dest_t}")
        return dest

    def _prefetch_dense(self, row0: str, b: str) -> None:
        """Software prefetch, at chunk ``b`` of the register block of W rows from ``row0``,
        of the chunk's share of the bytes :data:`DENSE_PREFETCH_BYTES` past the block's
        start (clamped to W). The block reads its ``nr`` rows as ``nr`` interleaved streams,
        which the hardware prefetchers follow poorly; the rows' bytes are one contiguous
        run, so the prefetches are one forward stream."""
        g, em = self.g, self.em
        size = g.wtype.dtype.itemsize
        per_line = 64 // size
        lines = max(1, self.nr * CHUNK // per_line)
        base = self.add(self.mul(self.wrow(row0), g.k), DENSE_PREFETCH_BYTES // size)
        base = self.add(base, self.mul(b, lines * per_line))
        self._prefetch_at([self.add(base, i * per_line) for i in range(lines)])

    def fold(self, vecs: list[str]) -> str:
        """The lanes of each of ``vecs`` (vector<16xf32>, at most 16) summed, as one
        vector<16xf32> whose lane j is the sum of ``vecs[j]`` (the rest 0): stages of two
        shuffles and an add on pairs of vectors (:func:`fold_masks`; a zero vector pairs
        with an odd one out), each halving every output's lanes, so each output's sum is the
        same halving tree (lanes e and e + 8, then e and e + 4, ...) however many outputs
        are folded with it."""
        em, vf = self.em, self.vf
        assert 1 <= len(vecs) <= 16, "fold takes 1 to 16 vectors"
        zero = em.op(f"arith.constant dense<0.0> : {vf}", "cv")
        cur, w = list(vecs), 16
        while w > 1:
            if len(cur) % 2:
                cur.append(zero)
            lo, hi = fold_masks(w)
            cur = [em.op(f"arith.addf {self.shuffle(a, b, lo, vf)}, "
                         f"{self.shuffle(a, b, hi, vf)} : {vf}")
                   for a, b in zip(cur[::2], cur[1::2])]
            w //= 2
        return cur[0]

    def rows(self, wrows: list[str], dest: str, dest_t: str, cols: list[str]) -> str:
        """All rows of x against the W rows ``wrows`` (the item's), in tiles of ``m_tile`` x
        rows; results go to ``dest[:, cols[j]]``."""
        em, g = self.em, self.g
        mt = self.mt

        def tile(m0: str, rows: int, d: str) -> str:
            if self.amx is not None:
                return self.amx.tile(m0, rows, d, dest_t, cols[0])
            if self.r16:
                return self.tile_r16(wrows[0], m0, rows, d, dest_t, cols[0])
            if self.gemm:
                return self.tile_gemm(wrows[0], m0, rows, d, dest_t, cols[0])
            if self.lane_gemv:
                return self.tile_lanes(wrows[0], d, dest_t, cols[0])
            if self.quant:
                return self.tile_int(wrows, m0, rows, d, dest_t, cols)
            return self.tile_dense(wrows[0], m0, rows, d, dest_t, cols[0])

        self.pack = None
        if self.amx is not None:    # B tiles in memory, decoded once for all x-row tiles
            if not self.amx_hoisted:
                self.amx.alloc()
            self.amx.pack(wrows[0])
        elif self.gemm and g.m > mt:  # several x-row tiles: decode the W rows once for all
            self.pack = self.pack_tile(wrows[0])
        full, rest = divmod(g.m, mt)
        if full == 1:
            dest = tile(self.c(0), mt, dest)
        elif full > 1:
            t, acc, res = em.fresh("t"), em.fresh("d"), em.fresh("ml")
            em.line(f"{res} = scf.for {t} = {self.c(0)} to {self.c(full)} step {self.c(1)} "
                    f"iter_args({acc} = {dest}) -> ({dest_t}) {{")
            em.depth += 1
            em.line(f"scf.yield {tile(self.mul(t, mt), mt, acc)} : {dest_t}")
            em.depth -= 1
            em.line("}")
            dest = res
        if rest:
            dest = tile(self.c(full * mt), rest, dest)
        return dest

    # ---- integer dot products (x quantized per 32-block to int8, as llama.cpp, or int16) ----
    def quantize_x(self) -> None:
        """x quantized per 32-element block to ``self.bits`` signed bits: ``xq``
        (tensor<MxKxi8> or tensor<MxKxi16>), the block scales ``xd`` (amax / qmax, qmax =
        127 or 32767) and ``xs`` (scale * sum of the block's integers), tensor<MxNBxf32>;
        for a ``q8_0_r16`` weight also ``xc`` (tensor<MxNBxi32>): per block, the sum of the
        signed x bytes that meet its weights offset by 128 (int16: the high bytes ``h``;
        int8: the block's bytes), which :meth:`tile_r16` subtracts 128 times."""
        em, g, vf = self.em, self.g, self.vf
        nb = g.k // CHUNK
        qt = f"i{self.bits}"
        tq, tf = f"tensor<{g.m}x{g.k}x{qt}>", f"tensor<{g.m}x{nb}xf32>"
        per = CHUNK * self.bits // 32  # i32 words of x per block (the GEMM's layout)
        if self.amx is not None:    # the A tiles' bytes (module doc of amx)
            tq = f"tensor<{self.amx.mpad}x{self.amx.xbytes}xi8>"
        elif self.r16:              # the same bytes as i32 words (tile_r16's broadcasts)
            tq = f"tensor<{g.m}x{g.k * self.bits // 32}xi32>"
        elif self.gemm:
            tq = f"tensor<{g.m}x{nb * per}xi32>"
        # the row-interleaved Q8_0 tile's correction: per block, the sum of the x bytes that
        # meet the weights offset by 128 (int16: the high bytes; int8: the block), i32
        tc = f"tensor<{g.m}x{nb}xi32>"
        types = [tq, tf, tf] + ([tc] if self.r16_q8 else [])
        tys = ", ".join(types)
        inits = [em.op(f"tensor.empty() : {t}", "e") for t in types]
        m, res = em.fresh("qm"), em.fresh("xq")
        its = [em.fresh("qi") for _ in inits]
        full = (tq, tf, tc)     # the whole tensors' types (the loop below writes rows)
        # rows over the threads (each row's blocks in a slice of one row), or one loop
        par = self.s.cores > 1 and g.m >= QUANTIZE_PARALLEL_ROWS
        if par:
            em.line(f"{res}:{len(types)} = scf.forall ({m}) in ({g.m}) shared_outs("
                    f"{', '.join(f'{a} = {b}' for a, b in zip(its, inits))}) -> ({tys}) {{")
            em.depth += 1
            rtypes = [re.sub(r"^tensor<\d+x", "tensor<1x", t) for t in types]
            cols = [re.match(r"tensor<\d+x(\d+)x", t).group(1) for t in types]
            rows = [em.op(f"tensor.extract_slice {o}[{m}, 0] [1, {c}] [1, 1] : {t} to {r}")
                    for o, c, t, r in zip(its, cols, types, rtypes)]
            row = self.c(0)
        else:
            em.line(f"{res}:{len(types)} = scf.for {m} = {self.c(0)} to {self.c(g.m)} step "
                    f"{self.c(1)} iter_args({', '.join(f'{a} = {b}' for a, b in zip(its, inits))})"
                    f" -> ({tys}) {{")
            em.depth += 1
            rtypes, rows, row = types, its, m
        tq, tf = rtypes[0], rtypes[1]
        tc = rtypes[3] if self.r16_q8 else tc
        rtys = ", ".join(rtypes)
        b, res2 = em.fresh("qb"), em.fresh("xqb")
        its2 = [em.fresh("qj") for _ in inits]
        em.line(f"{res2}:{len(types)} = scf.for {b} = {self.c(0)} to {self.c(nb)} step "
                f"{self.c(1)} iter_args({', '.join(f'{a} = {b_}' for a, b_ in zip(its2, rows))})"
                f" -> ({rtys}) {{")
        em.depth += 1
        k = self.mul(b, CHUNK)
        v = [self.read_x(m, k, False), self.read_x(m, self.add(k, 16), False)]
        a = [em.op(f"math.absf {x} : {vf}") for x in v]
        mx = em.op(f"arith.maximumf {a[0]}, {a[1]} : {vf}")
        amax = em.op(f"vector.reduction <maximumf>, {mx} : {vf} into f32")
        cmax = em.const(float((1 << (self.bits - 1)) - 1), "f32")
        dx = em.op(f"arith.divf {amax}, {cmax} : f32")
        nz = em.op(f"arith.cmpf ogt, {amax}, {em.const(0.0, 'f32')} : f32")
        inv = em.op(f"arith.select {nz}, {em.op(f'arith.divf {cmax}, {amax} : f32')}, "
                    f"{em.const(0.0, 'f32')} : f32")
        invv = em.op(f"vector.broadcast {inv} : f32 to {vf}")
        q = []
        for x in v:
            r = em.op(f"math.roundeven {em.op(f'arith.mulf {x}, {invv} : {vf}')} : {vf}")
            q.append(em.op(f"arith.fptosi {r} : {vf} to vector<16x{qt}>"))
        idx = ", ".join(str(i) for i in range(32))
        qq = em.op(f"vector.shuffle {q[0]}, {q[1]} [{idx}] : vector<16x{qt}>, vector<16x{qt}>")
        wide = em.op(f"arith.extsi {qq} : vector<32x{qt}> to vector<32xi32>")
        qsum = em.op(f"vector.reduction <add>, {wide} : vector<32xi32> into i32")
        xs = em.op(f"arith.mulf {em.op(f'arith.sitofp {qsum} : i32 to f32')}, {dx} : f32")
        if self.amx is not None or self.r16:  # int8: the block; int16: high bytes, low bytes
            if self.bits == 8:
                parts = [qq]
            else:
                v32, v8 = "vector<32xi16>", "vector<32xi8>"
                sh = em.op(f"arith.shrsi {qq}, {em.op(f'arith.constant dense<8> : {v32}', 'cv')}"
                           f" : {v32}")
                parts = [em.op(f"arith.trunci {v} : {v32} to {v8}") for v in (sh, qq)]
            n0 = its2[0]
            for j, v in enumerate(parts):
                if self.amx is None:    # as i32 words
                    col = self.add(self.mul(b, 8 * len(parts)), 8 * j)
                    w = em.op(f"vector.bitcast {v} : vector<32xi8> to vector<8xi32>")
                    n0 = em.op(f"vector.transfer_write {w}, {n0}[{row}, {col}] "
                               f"{{in_bounds = [true]}} : vector<8xi32>, {tq}")
                    continue
                col = self.add(self.mul(b, 32 * len(parts)), 32 * j)
                n0 = em.op(f"vector.transfer_write {v}, {n0}[{row}, {col}] {{in_bounds = [true]}} "
                           f": vector<32xi8>, {tq}")
        elif self.gemm:  # as i32 words, each broadcast to all lanes of a dot product
            words = em.op(f"vector.bitcast {qq} : vector<32x{qt}> to vector<{per}xi32>")
            n0 = em.op(f"vector.transfer_write {words}, {its2[0]}[{row}, {self.mul(b, per)}] "
                       f"{{in_bounds = [true]}} : vector<{per}xi32>, {tq}")
        else:
            n0 = em.op(f"vector.transfer_write {qq}, {its2[0]}[{row}, {k}] {{in_bounds = [true]}} : "
                       f"vector<32x{qt}>, {tq}")
        new = [n0, em.op(f"tensor.insert {dx} into {its2[1]}[{row}, {b}] : {tf}"),
               em.op(f"tensor.insert {xs} into {its2[2]}[{row}, {b}] : {tf}")]
        if self.r16_q8:
            csum = qsum
            if self.bits == 16:
                hw = em.op(f"arith.extsi {sh} : vector<32xi16> to vector<32xi32>")
                csum = em.op(f"vector.reduction <add>, {hw} : vector<32xi32> into i32")
            new.append(em.op(f"tensor.insert {csum} into {its2[3]}[{row}, {b}] : {tc}"))
        em.line(f"scf.yield {', '.join(new)} : {rtys}")
        em.depth -= 1
        em.line("}")
        if par:
            em.line("scf.forall.in_parallel {")
            for i, (o, c, t, r) in enumerate(zip(its, cols, types, rtypes)):
                em.line(f"  tensor.parallel_insert_slice {res2}#{i} into {o}[{m}, 0] [1, {c}] "
                        f"[1, 1] : {r} into {t}")
            em.line("}")
        else:
            em.line(f"scf.yield {', '.join(f'{res2}#{i}' for i in range(len(types)))} : {tys}")
        em.depth -= 1
        em.line("}")
        self.xq, self.xd, self.xs = f"{res}#0", f"{res}#1", f"{res}#2"
        self.xc = f"{res}#3" if self.r16_q8 else None
        self.tq, self.tf, self.tc = full

    def _intr(self, name: str, args: list[str], ins: str, out: str) -> str:
        """An LLVM intrinsic, spelled as a call of a declared function ``@__poot_intr_<name>``
        (bufferization refuses ``llvm.call_intrinsic``, whose memory effects it cannot see);
        the backend turns the calls into intrinsics after bufferization
        (:func:`intrinsic_declarations`, :data:`INTRINSIC_PREFIX`)."""
        fn = INTRINSIC_PREFIX + name.replace(".", "_")
        INTRINSICS[fn] = (name, f"({ins}) -> {out}")
        return self.em.op(f"func.call @{fn}({', '.join(args)}) : ({ins}) -> {out}")

    def _dot_i8(self, wu: str, xq: str) -> str:
        """``sum(wu[4l:4l+4] * xq[4l:4l+4])`` per i32 lane ``l`` (vector<8xi32>): unsigned
        weight bytes times signed x bytes; AVX-VNNI / AVX512-VNNI ``vpdpbusd`` in one
        instruction, else AVX2 ``pmaddubsw`` (pairs to i16) and ``pmaddwd`` by ones (to i32).
        The i16 pairs cannot saturate: weights are at most 15 (4-bit) or 127 (|q8|)."""
        em, v32i8 = self.em, "vector<32xi8>"
        if self.s.vnni:
            zero = em.op("arith.constant dense<0> : vector<8xi32>", "cv")
            return self._intr("llvm.x86.avx512.vpdpbusd.256", [zero, wu, xq],
                              f"vector<8xi32>, {v32i8}, {v32i8}", "vector<8xi32>")
        p16 = self._intr("llvm.x86.avx2.pmadd.ub.sw", [wu, xq], f"{v32i8}, {v32i8}",
                         "vector<16xi16>")
        return self._intr("llvm.x86.avx2.pmadd.wd", [p16, self.splat(1, "i16", 16)],
                          "vector<16xi16>, vector<16xi16>", "vector<8xi32>")

    def _dot_i16(self, w: tuple[str, ...], x: tuple[str, ...]) -> str:
        """``sum(w[h][2l:2l+2] * x[h][2l:2l+2])`` over both halves ``h`` per i32 lane ``l``
        (vector<8xi32>) of two vector<16xi16> pairs: AVX-VNNI / AVX512-VNNI ``vpdpwssd``
        (the second accumulating onto the first), else AVX2 ``pmaddwd`` twice and an add.
        Exact: |w| <= 127 and |x| <= 32767, so a block's sum stays below 2^28.

        Measured against two alternatives on a Zen 4 (single Q4_1 GEMVs, 1536x576 and
        576x1536, thread CPU time): one 512-bit ``vpdpwssd`` per block (16-lane
        accumulators) took 1.2x the time of this; splitting x = 256 h + l into bytes and
        taking two ``vpdpbusd`` on the unwidened nibbles (``(q.h << 8) + l.q``) 1.06x."""
        em, v16 = self.em, "vector<16xi16>"
        if self.s.vnni:
            acc = em.op("arith.constant dense<0> : vector<8xi32>", "cv")
            for wh, xh in zip(w, x):
                acc = self._intr("llvm.x86.avx512.vpdpwssd.256", [acc, wh, xh],
                                 f"vector<8xi32>, {v16}, {v16}", "vector<8xi32>")
            return acc
        p = [self._intr("llvm.x86.avx2.pmadd.wd", [wh, xh], f"{v16}, {v16}", "vector<8xi32>")
             for wh, xh in zip(w, x)]
        return em.op(f"arith.addi {p[0]}, {p[1]} : vector<8xi32>")

    def _weights_int(self, off: str) -> tuple[str, str | None, object]:
        """The block of one W row at byte ``off`` for the integer kernel: (scale d, the
        scalar term's weight m or None, integer weights). The weights: for int8 x, (unsigned
        bytes, signed bytes or None) as vector<32xi8> (Q8_0: |w| and w for the sign trick);
        for int16 x, two vector<16xi16> halves (zero- or sign-extended). Q4_0's ``q - 8``
        goes to the scalar side as m = -8 d (times the block's scale * sum of x)."""
        em, fmt = self.em, self.g.wtype.format
        nsc = 2 if fmt.name == "q4_1" else 1
        raw = self.read_bytes(off, 2 * nsc)
        h = em.op(f"vector.bitcast {raw} : vector<{2 * nsc}xi8> to vector<{nsc}xf16>")
        f = em.op(f"arith.extf {h} : vector<{nsc}xf16> to vector<{nsc}xf32>")
        dw = em.op(f"vector.extract {f}[0] : f32 from vector<{nsc}xf32>")
        mw = em.op(f"vector.extract {f}[1] : f32 from vector<{nsc}xf32>") if nsc == 2 else None
        v16i8, v16i16, v32i8 = "vector<16xi8>", "vector<16xi16>", "vector<32xi8>"
        if fmt.name == "q8_0":
            if self.bits == 16:
                halves = [self.read_bytes(self.add(off, 2 + h), 16) for h in (0, 16)]
                return dw, None, tuple(em.op(f"arith.extsi {q} : {v16i8} to {v16i16}")
                                       for q in halves)
            w = self.read_bytes(self.add(off, 2), 32)
            return dw, None, (em.op(f"math.absi {w} : {v32i8}"), w)
        q = self.read_bytes(self.add(off, 2 if fmt.name == "q4_0" else 4), 16)
        lo = em.op(f"arith.andi {q}, {self.splat(15, 'i8', 16)} : {v16i8}")
        hi = em.op(f"arith.shrui {q}, {self.splat(4, 'i8', 16)} : {v16i8}")
        if mw is None:
            mw = em.op(f"arith.mulf {dw}, {em.const(-8.0, 'f32')} : f32")
        if self.bits == 16:
            return dw, mw, tuple(em.op(f"arith.extui {n} : {v16i8} to {v16i16}")
                                 for n in (lo, hi))
        idx = ", ".join(str(i) for i in range(32))
        wu = em.op(f"vector.shuffle {lo}, {hi} [{idx}] : {v16i8}, {v16i8}")
        return dw, mw, (wu, None)

    def _x_int(self, xr: str, b: str):
        """Row ``xr``'s quantized block ``b``: vector<32xi8> (int8 x) or two vector<16xi16>
        halves (int16 x)."""
        em, pad = self.em, self.em.const(0, f"i{self.bits}")
        k = self.mul(b, CHUNK)
        if self.bits == 8:
            return em.op(f"vector.transfer_read {self.xq}[{xr}, {k}], {pad} "
                         f"{{in_bounds = [true]}} : {self.tq}, vector<32xi8>")
        return tuple(em.op(f"vector.transfer_read {self.xq}[{xr}, {self.add(k, h)}], {pad} "
                           f"{{in_bounds = [true]}} : {self.tq}, vector<16xi16>")
                     for h in (0, 16))

    def _dot(self, w, xq) -> str:
        """One block's integer dot product per i32 lane (vector<8xi32>) of the decoded
        weights ``w`` (:meth:`_weights_int`) and the x block ``xq`` (:meth:`_x_int`)."""
        if self.bits == 16:
            return self._dot_i16(w, xq)
        wu, wsigned = w
        if wsigned is not None:  # q8_0: |w| * (x * sign(w))
            v32i8 = "vector<32xi8>"
            xq = self._intr("llvm.x86.avx2.psign.b", [xq, wsigned], f"{v32i8}, {v32i8}", v32i8)
        return self._dot_i8(wu, xq)

    def tile_int(self, wrows: list[str], m0: str, rows: int, dest: str, dest_t: str,
                  cols: list[str]) -> str:
        """Rows ``m0 .. m0 + rows`` of the quantized x against the W rows ``wrows``: one K
        loop whose body decodes each W row's block once and reads each x row's block once,
        with an independent accumulator per (x row, W row) pair (the FMA chains overlap);
        inserts the sums into ``dest`` at ``[m0 + i, cols[j]]``."""
        g, em = self.g, self.em
        fmt = g.wtype.format
        nb = g.k // CHUNK
        v8, vi = "vector<8xf32>", "vector<8xi32>"
        row_bytes = nb * fmt.block_bytes
        xrows = [self.add(m0, i) for i in range(rows)]
        pairs = [(i, j) for i in range(rows) for j in range(len(wrows))]
        zero_v = em.op(f"arith.constant dense<0.0> : {v8}", "cv")
        zero_s = em.const(0.0, "f32")
        inits = [zero_v, zero_s] * len(pairs)
        types = [v8, "f32"] * len(pairs)
        b, res = em.fresh("b"), em.fresh("kl")
        its = [em.fresh("acc") for _ in inits]
        em.line(f"{res}:{len(its)} = scf.for {b} = {self.c(0)} to {self.c(nb)} step {self.c(1)} "
                f"iter_args({', '.join(f'{a} = {z}' for a, z in zip(its, inits))}) -> "
                f"({', '.join(types)}) {{")
        em.depth += 1
        boff = self.mul(b, fmt.block_bytes)
        ws = [self._weights_int(self.add(self.mul(self.wrow(wr), row_bytes), boff))
              for wr in wrows]
        xs = []  # per x row: (quantized block, scale, scale * sum of the block)
        for xr in xrows:
            dx = em.op(f"tensor.extract {self.xd}[{xr}, {b}] : {self.tf}")
            sx = None if fmt.name == "q8_0" else \
                em.op(f"tensor.extract {self.xs}[{xr}, {b}] : {self.tf}")
            xs.append((self._x_int(xr, b), dx, sx))
        new = []
        for p, (i, j) in enumerate(pairs):
            dw, mw, w = ws[j]
            xq, dx, sx = xs[i]
            fd = em.op(f"arith.sitofp {self._dot(w, xq)} : {vi} to {v8}")
            sc = em.op(f"vector.broadcast {em.op(f'arith.mulf {dw}, {dx} : f32')} : f32 to {v8}")
            new.append(em.op(f"math.fma {fd}, {sc}, {its[2 * p]} : {v8}"))
            acc_s = its[2 * p + 1]
            if mw is not None:
                acc_s = em.op(f"math.fma {mw}, {sx}, {acc_s} : f32")
            new.append(acc_s)
        em.line(f"scf.yield {', '.join(new)} : {', '.join(types)}")
        em.depth -= 1
        em.line("}")
        for p, (i, j) in enumerate(pairs):
            r = em.op(f"vector.reduction <add>, {res}#{2 * p} : {v8} into f32")
            r = em.op(f"arith.addf {r}, {res}#{2 * p + 1} : f32")
            dest = em.op(f"tensor.insert {r} into {dest}[{xrows[i]}, {cols[j]}] : {dest_t}")
        return dest

    # ---- the lane-interleaved GEMM tile (M >= 2): lane j of a dot product is W row j ----
    def shuffle(self, a: str, b: str, mask: list[int], ty: str) -> str:
        return self.em.op(f"vector.shuffle {a}, {b} [{', '.join(map(str, mask))}] : {ty}, {ty}")

    def transpose(self, rows: list[str], ty: str) -> list[str]:
        """The columns of the square matrix whose rows are ``rows`` (n vectors ``ty`` of n
        elements): log2(n) stages of ``punpckl/h`` shuffles in doubling runs."""
        n, cur, unit = len(rows), rows, 1
        while unit < n:
            pairs = [(cur[2 * k], cur[2 * k + 1]) for k in range(n // 2)]
            cur = [self.shuffle(a, b, _unpack_mask(n, unit, hi), ty)
                   for hi in (False, True) for a, b in pairs]
            unit *= 2
        out = [""] * n
        for v, col in zip(cur, _transpose_order(n)):
            out[col] = v
        return out

    def _gathered_scales(self, off0: str, n: int) -> list[str] | None:
        """The f16 scales of ``n`` consecutive W rows' blocks, the first block at byte
        ``off0``, as vector<n x f16>: Q4_1's (d, m), else d. One 32-bit gather
        (``vpgatherdd``) of the words that hold them: Q4_1's 20-byte blocks start on a word,
        its pair split into evens and odds; Q4_0's and Q8_0's 18- and 34-byte blocks start
        on an even byte, so each lane's d is the low or high half of its word, shifted per
        lane. None where W has no buffer view or is 2 GiB or more."""
        g, em, fmt = self.g, self.em, self.g.wtype.format
        row_bytes = g.k // CHUNK * fmt.block_bytes
        if self.wmem is None or fmt.block_bytes % 2 or not 4 <= g.wtype.nbytes < 1 << 31:
            return None                       # (byte offsets are i32 lanes)
        words = g.wtype.nbytes // 4
        if self.wmem32 is None:
            self.wmem32 = em.op(f"memref.view {self.wmem}[{self.c(0)}][] : "
                                f"memref<{g.wtype.nbytes}xi8> to memref<{words}xi32>")
        vi = f"vector<{n}xi32>"
        first = em.op(f"arith.index_cast {off0} : index to i32")
        step = em.op(f"arith.constant dense<[{', '.join(str(j * row_bytes) for j in range(n))}]>"
                     f" : {vi}", "cv")
        offs = em.op(f"arith.addi {em.op(f'vector.broadcast {first} : i32 to {vi}')}, {step} : "
                     f"{vi}")
        idx = em.op(f"arith.shrui {offs}, {self.splat(2, 'i32', n)} : {vi}")
        mask = em.op(f"arith.constant dense<true> : vector<{n}xi1>", "cv")
        pad = em.op(f"arith.constant dense<0> : {vi}", "cv")
        got = em.op(f"vector.gather {self.wmem32}[{self.c(0)}] [{idx}], {mask}, {pad} : "
                    f"memref<{words}xi32>, {vi}, vector<{n}xi1>, {vi} into {vi}")
        if fmt.name == "q4_1":                # 20-byte blocks: every pair is one word
            h = em.op(f"vector.bitcast {got} : {vi} to vector<{2 * n}xf16>")
            return [self.shuffle(h, h, list(range(i, 2 * n, 2)), f"vector<{2 * n}xf16>")
                    for i in (0, 1)]
        three, eight = self.splat(3, "i32", n), self.splat(8, "i32", n)
        byte = em.op(f"arith.andi {offs}, {three} : {vi}")     # 0 or 2: d's byte in its word
        bits = em.op(f"arith.muli {byte}, {eight} : {vi}")
        low = em.op(f"arith.trunci {em.op(f'arith.shrui {got}, {bits} : {vi}')} : {vi} to "
                    f"vector<{n}xi16>")
        return [em.op(f"vector.bitcast {low} : vector<{n}xi16> to vector<{n}xf16>")]

    def _tile_scales(self, offs: list[str]) -> tuple[str, str | None]:
        """The tile's W rows' block scales at byte offsets ``offs`` (consecutive rows: ``offs[j]
        = offs[0] + j * row_bytes``) as vector<L x f32>: (d, m) with m the Q4_1 min, ``-8 d``
        for Q4_0, None for Q8_0."""
        em, fmt, n = self.em, self.g.wtype.format, len(offs)
        gathered = self._gathered_scales(offs[0], n)
        nsc = 2 if fmt.name == "q4_1" else 1
        parts: list[list[str]] = [[] for _ in range(nsc)]
        for off in offs if gathered is None else []:
            raw = self.read_bytes(off, 2 * nsc)
            h = em.op(f"vector.bitcast {raw} : vector<{2 * nsc}xi8> to vector<{nsc}xf16>")
            for i in range(nsc):
                parts[i].append(em.op(f"vector.extract {h}[{i}] : f16 from vector<{nsc}xf16>"))
        vecs = []
        for h in gathered or [em.op(f"vector.from_elements {', '.join(p)} : vector<{n}xf16>")
                              for p in parts]:
            vecs.append(em.op(f"arith.extf {h} : vector<{n}xf16> to vector<{n}xf32>"))
        if fmt.name == "q4_0":
            vecs.append(em.op(f"arith.mulf {vecs[0]}, {self.splat(-8.0, 'f32', n)} : "
                              f"vector<{n}xf32>"))
        return vecs[0], vecs[1] if len(vecs) > 1 else None

    def _scale_fma(self, fd: str, dw: str, mw: str | None, xr: str, b: str, acc: str,
                   vty: str) -> str:
        """``acc + fd * (dw * xd[xr, b]) (+ mw * xs[xr, b])``: one block's integer dot products
        ``fd`` (as f32, a ``vty`` vector, one lane a W row) scaled by the W rows' block scale
        ``dw`` and x row ``xr``'s block ``b`` scale, plus the W min ``mw`` (None for Q8_0) times
        x's block sum; two FMAs in that order, so every kernel rounds alike."""
        em = self.em
        dx = em.op(f"tensor.extract {self.xd}[{xr}, {b}] : {self.tf}")
        sc = em.op(f"arith.mulf {dw}, {em.op(f'vector.broadcast {dx} : f32 to {vty}')} : {vty}")
        acc = em.op(f"math.fma {fd}, {sc}, {acc} : {vty}")
        if mw is not None:
            sx = em.op(f"tensor.extract {self.xs}[{xr}, {b}] : {self.tf}")
            sxv = em.op(f"vector.broadcast {sx} : f32 to {vty}")
            acc = em.op(f"math.fma {mw}, {sxv}, {acc} : {vty}")
        return acc

    def concat(self, vs: list[str], n: int, ety: str) -> str:
        """The vectors ``vs`` (each ``n`` elements of ``ety``) end to end, by shuffles."""
        while len(vs) > 1:
            ty = f"vector<{n}x{ety}>"
            vs = [self.shuffle(vs[i], vs[i + 1], list(range(2 * n)), ty)
                  for i in range(0, len(vs), 2)]
            n *= 2
        return vs[0]

    def _tile_weights(self, offs: list[str]) -> list[tuple[int, str]]:
        """The tile's W rows' (one a lane, L = ``len(offs)``) integer weights of one block,
        interleaved by row: (i32 word w of the x block, vector) pairs whose lane j holds row
        j's weights of that word's x elements (int16 x: two, as vector<2L x i16>; int8 x:
        four, as vector<4L x i8>). Transposed in groups of 8 rows (int16: 8 x 8 16-bit
        words) or 4 (int8: 4 x 4 32-bit words), the groups' columns then concatenated."""
        em, fmt, lanes = self.em, self.g.wtype.format, len(offs)
        v16i8 = "vector<16xi8>"
        qs = 2 if fmt.name in ("q4_0", "q8_0") else 4
        out = []
        if self.bits == 16:
            nb = 2 * lanes  # bytes of a column: 2 a row
            for h in (0, 16) if fmt.name == "q8_0" else (0,):
                rows = [em.op(f"vector.bitcast {self.read_bytes(self.add(o, qs + h), 16)} : "
                              f"{v16i8} to vector<8xi16>") for o in offs]
                groups = [self.transpose(rows[i:i + 8], "vector<8xi16>")
                          for i in range(0, lanes, 8)]
                for p in range(8):
                    col = self.concat([gr[p] for gr in groups], 8, "i16")
                    b = em.op(f"vector.bitcast {col} : vector<{lanes}xi16> to vector<{nb}xi8>")
                    if fmt.name == "q8_0":
                        out.append((h // 2 + p, em.op(f"arith.extsi {b} : vector<{nb}xi8> to "
                                                      f"vector<{nb}xi16>")))
                        continue
                    for w, nib in ((p, self._lo(b, nb)), (8 + p, self._hi(b, nb))):
                        out.append((w, em.op(f"arith.extui {nib} : vector<{nb}xi8> to "
                                             f"vector<{nb}xi16>")))
            return out
        return self.quad_words(offs)     # int8 x (Q4 only)

    def quad_words(self, offs: list[str]) -> list[tuple[int, str]]:
        """The block's weights of the W rows at byte offsets ``offs`` (one a lane, L of them)
        as bytes, four consecutive K elements a lane: (x word w, vector<4L x i8> whose bytes
        ``4 j .. 4 j + 3`` are row j's elements ``4 w .. 4 w + 3``), for the 8 words of the
        block. Q4: 4 words of 4 nibble pairs per row, transposed in groups of 4 rows, low
        nibbles words 0-3, high nibbles 4-7; Q8_0: its two 16-byte halves the same way."""
        em, fmt, lanes = self.em, self.g.wtype.format, len(offs)
        q8 = fmt.name == "q8_0"
        qs = 2 if fmt.name in ("q4_0", "q8_0") else 4
        out = []
        for h in (0, 16) if q8 else (0,):
            rows = [em.op(f"vector.bitcast {self.read_bytes(self.add(o, qs + h), 16)} : "
                          f"vector<16xi8> to vector<4xi32>") for o in offs]
            groups = [self.transpose(rows[i:i + 4], "vector<4xi32>")
                      for i in range(0, lanes, 4)]
            for q in range(4):
                col = self.concat([gr[q] for gr in groups], 4, "i32")
                b = em.op(f"vector.bitcast {col} : vector<{lanes}xi32> to "
                          f"vector<{4 * lanes}xi8>")
                if q8:
                    out.append((h // 4 + q, b))
                else:
                    out += [(q, self._lo(b, 4 * lanes)), (4 + q, self._hi(b, 4 * lanes))]
        return out

    def _lo(self, v: str, n: int) -> str:
        return self.em.op(f"arith.andi {v}, {self.splat(15, 'i8', n)} : vector<{n}xi8>")

    def _hi(self, v: str, n: int) -> str:
        return self.em.op(f"arith.shrui {v}, {self.splat(4, 'i8', n)} : vector<{n}xi8>")

    def _wtype(self) -> str:
        """The type of one interleaved weight vector of the GEMM tile."""
        n = self.lanes
        return f"vector<{2 * n}xi16>" if self.bits == 16 else f"vector<{4 * n}xi8>"

    def _dot_acc(self, acc: str, w: str, xw: str) -> str:
        """``acc + `` the dot products of the interleaved weights ``w`` with the x word
        ``xw`` (i32) broadcast to every lane (vector<L x i32>, L = 8: 256-bit instructions,
        16: 512-bit, VNNI only)."""
        em, n = self.em, self.lanes
        vi, ty = f"vector<{n}xi32>", self._wtype()
        xb = em.op(f"vector.broadcast {xw} : i32 to {vi}")
        x = em.op(f"vector.bitcast {xb} : {vi} to {ty}")
        if self.s.vnni:
            name = "vpdpwssd" if self.bits == 16 else "vpdpbusd"
            return self._intr(f"llvm.x86.avx512.{name}.{32 * n}", [acc, w, x],
                              f"{vi}, {ty}, {ty}", vi)
        if self.bits == 16:
            p = self._intr("llvm.x86.avx2.pmadd.wd", [w, x], f"{ty}, {ty}", vi)
        else:
            p16 = self._intr("llvm.x86.avx2.pmadd.ub.sw", [w, x], f"{ty}, {ty}", "vector<16xi16>")
            p = self._intr("llvm.x86.avx2.pmadd.wd", [p16, self.splat(1, "i16", 16)],
                           "vector<16xi16>, vector<16xi16>", vi)
        return em.op(f"arith.addi {acc}, {p} : {vi}")

    def _tile_block(self, row0: str, b: str) -> tuple[str, str | None, list[tuple[int, str]]]:
        """Block ``b`` of the 8 W rows from ``row0``: (scales d, min term m or None, the
        interleaved weights as (x word, vector) pairs), decoded here or read from the tile's
        pack (:meth:`pack_tile`)."""
        g, em = self.g, self.em
        if self.pack is None:
            offs = self.block_offsets(row0, b, self.lanes)
            self._prefetch(offs)
            dw, mw = self._tile_scales(offs)
            return dw, mw, self._tile_weights(offs)
        wp, words, scales = self.pack
        n, ty = self.lanes, self._wtype()
        pad_i, pad_f = em.const(0, "i32"), em.const(0.0, "f32")
        sc = [em.op(f"vector.transfer_read {t}[{b}, {self.c(0)}], {pad_f} {{in_bounds = [true]}}"
                    f" : tensor<{g.k // CHUNK}x{n}xf32>, vector<{n}xf32>") for t in scales]
        base = self.mul(b, len(words))
        ws = []
        for t, word in enumerate(words):
            v = em.op(f"vector.transfer_read {wp}[{self.add(base, t)}, {self.c(0)}], {pad_i} "
                      f"{{in_bounds = [true]}} : {self.pack_t}, vector<{n}xi32>")
            ws.append((word, em.op(f"vector.bitcast {v} : vector<{n}xi32> to {ty}")))
        return sc[0], sc[1] if len(sc) > 1 else None, ws

    def _prefetch(self, offs: list[str]) -> None:
        """Software prefetch of each tile row ``PREFETCH_BYTES`` ahead of the block being
        decoded (byte offsets ``offs``, clamped to W): the L rows are L interleaved streams,
        more than the hardware prefetcher follows, so a weight read from DRAM would stall
        every block."""
        if self.wmem is None:
            return
        g, em = self.g, self.em
        last = self.c(g.wtype.nbytes - 1)
        for off in offs:
            p = self.idx(f"arith.minui {self.add(off, PREFETCH_BYTES)}, {last}")
            em.line(f"memref.prefetch {self.wmem}[{p}], read, locality<3>, data : "
                    f"memref<{g.wtype.nbytes}xi8>")

    def _block_loop(self, names: tuple[str, str, str], nb: int, inits: list[str],
                    types: list[str]) -> tuple[str, str, list[str]]:
        """Open ``scf.for`` over the ``nb`` blocks carrying one value per ``inits`` (of
        ``types``), its names fresh from ``names`` (induction variable, results, carried
        values); returns those three. The caller writes the body and closes it."""
        em = self.em
        b, res = em.fresh(names[0]), em.fresh(names[1])
        its = [em.fresh(names[2]) for _ in inits]
        em.line(f"{res}:{len(its)} = scf.for {b} = {self.c(0)} to {self.c(nb)} step {self.c(1)} "
                f"iter_args({', '.join(f'{a} = {z}' for a, z in zip(its, inits))}) -> "
                f"({', '.join(types)}) {{")
        em.depth += 1
        return b, res, its

    def pack_tile(self, row0: str) -> tuple[str, list[int], list[str]]:
        """The 8 W rows from ``row0`` decoded once, for all x-row tiles: (interleaved
        weights tensor<(NB * words)x8xi32>, the x word of each, the scale tensors
        tensor<NBx8xf32> (d, and the min term's m unless Q8_0))."""
        g, em = self.g, self.em
        nb, n = g.k // CHUNK, self.lanes
        self.pack = None
        words = 16 if self.bits == 16 else 8  # interleaved vectors per block
        self.pack_t = f"tensor<{nb * words}x{n}xi32>"
        st = f"tensor<{nb}x{n}xf32>"
        nsc = 1 if g.wtype.format.name == "q8_0" else 2
        types = [self.pack_t] + [st] * nsc
        inits = [em.op(f"tensor.empty() : {t}", "e") for t in types]
        b, res, its = self._block_loop(("pb", "pack", "pk"), nb, inits, types)
        dw, mw, ws = self._tile_block(row0, b)
        base = self.mul(b, words)
        new = its[0]
        for t, (_, w) in enumerate(ws):
            v = em.op(f"vector.bitcast {w} : {self._wtype()} to vector<{n}xi32>")
            new = em.op(f"vector.transfer_write {v}, {new}[{self.add(base, t)}, {self.c(0)}] "
                        f"{{in_bounds = [true]}} : vector<{n}xi32>, {self.pack_t}")
        out = [new] + [em.op(f"vector.transfer_write {v}, {it}[{b}, {self.c(0)}] "
                             f"{{in_bounds = [true]}} : vector<{n}xf32>, {st}")
                       for v, it in zip([dw, mw][:nsc], its[1:])]
        em.line(f"scf.yield {', '.join(out)} : {', '.join(types)}")
        em.depth -= 1
        em.line("}")
        return f"{res}#0", [w for w, _ in ws], [f"{res}#{i + 1}" for i in range(nsc)]

    def tile_gemm(self, row0: str, m0: str, rows: int, dest: str, dest_t: str,
                  col0: str) -> str:
        """Rows ``m0 .. m0 + rows`` of the quantized x against the L = ``self.lanes`` W rows
        from ``row0``: per block, the L rows' weights (decoded here, or read from the tile's
        pack) are interleaved so that lane j of an integer dot product is W row j, and each
        x row's words are broadcast to all lanes: one accumulator vector<L x f32> per x row
        (its integer sums split over :data:`GEMM_CHAINS` chains that overlap), the scales
        applied per block as vectors of the L rows' scales (the Q4 min term the same way).
        Writes the sums to ``dest[m0 + i, col0 : col0 + L]``."""
        g, em = self.g, self.em
        nb = g.k // CHUNK
        v8, vi = f"vector<{self.lanes}xf32>", f"vector<{self.lanes}xi32>"
        per = CHUNK * self.bits // 32
        xrows = [self.add(m0, i) for i in range(rows)]
        zero = em.op(f"arith.constant dense<0.0> : {v8}", "cv")
        zero_i = em.op(f"arith.constant dense<0> : {vi}", "cv")
        b, res, its = self._block_loop(("b", "kl", "acc"), nb, [zero] * rows, [v8] * rows)
        dw, mw, ws = self._tile_block(row0, b)
        chains = GEMM_CHAINS
        dots = [[zero_i] * chains for _ in range(rows)]
        xbase = self.mul(b, per)
        for t, (word, w) in enumerate(ws):
            col = self.add(xbase, word)
            for i, xr in enumerate(xrows):
                xw = em.op(f"tensor.extract {self.xq}[{xr}, {col}] : {self.tq}")
                dots[i][t % chains] = self._dot_acc(dots[i][t % chains], w, xw)
        new = []
        for i, xr in enumerate(xrows):
            d = dots[i][0]
            for e in dots[i][1:]:
                d = em.op(f"arith.addi {d}, {e} : {vi}")
            new.append(em.op(f"arith.sitofp {d} : {vi} to {v8}"))
        return self.scale_rows(new, dw, mw, (b, res, its), xrows, dest, dest_t, col0)

    def scale_rows(self, sums: list[str], dw: str, mw: str | None, loop: tuple, xrows: list[str],
                   dest: str, dest_t: str, col0: str) -> str:
        """The end of a GEMM tile's block loop (``loop``: :meth:`_block_loop`'s induction
        variable, results and carried accumulators, one vector<L x f32> per x row): each x
        row's block sums ``sums`` (as f32) scaled into its accumulator
        (:meth:`_scale_fma`), the loop closed, and each row's accumulator written to
        ``dest[xrows[i], col0 : col0 + L]``; returns the new ``dest``."""
        em = self.em
        b, res, its = loop
        vty = f"vector<{self.lanes}xf32>"
        new = [self._scale_fma(fd, dw, mw, xr, b, acc, vty)
               for fd, xr, acc in zip(sums, xrows, its)]
        em.line(f"scf.yield {', '.join(new)} : {', '.join([vty] * len(new))}")
        em.depth -= 1
        em.line("}")
        for i, xr in enumerate(xrows):
            dest = em.op(f"vector.transfer_write {res}#{i}, {dest}[{xr}, {col0}] "
                         f"{{in_bounds = [true]}} : {vty}, {dest_t}")
        return dest

    # ---- the row-interleaved tile (q4_*_r16 weights, every M below AMX's) ----
    def r16_block(self, row0: str, b: str) -> tuple[str, str | None, list[tuple[int, str]]]:
        """Block ``b`` of the 16 W rows from ``row0`` (a multiple of 16) of a row-interleaved
        weight (:mod:`poot.dialects.quant_layout`): (scales d, the min term's m, the 8
        interleaved weight vectors as (x word, vector<64xi8>) pairs: lane j's 4 bytes are
        row j's elements of x word w, low nibbles words 0-3, high 4-7), :meth:`quad_words`'s
        and :meth:`_tile_scales`' values read from one contiguous tile block; the bytes
        :data:`R16_PREFETCH_BYTES` ahead are prefetched (the tile blocks of a thread's tiles
        are one forward stream)."""
        g, em, fmt = self.g, self.em, self.g.wtype.format
        n = fmt.rows
        nb = g.k // CHUNK
        base = self.mul(self.add(self.mul(row0, nb), self.mul(b, n)), fmt.block_bytes)
        if self.wmem is not None and R16_PREFETCH_BYTES:
            tile_block = n * fmt.block_bytes
            ahead = self.add(base, -(-R16_PREFETCH_BYTES // tile_block) * tile_block)
            self._prefetch_at([self.add(ahead, 64 * i)
                               for i in range(-(-n * fmt.block_bytes // 64))])
        nsc = 2 if fmt.base == "q4_1" else 1
        vecs = []
        for i in range(nsc):
            raw = self.read_bytes(self.add(base, 2 * n * i), 2 * n)
            h = em.op(f"vector.bitcast {raw} : vector<{2 * n}xi8> to vector<{n}xf16>")
            vecs.append(em.op(f"arith.extf {h} : vector<{n}xf16> to vector<{n}xf32>"))
        if fmt.base == "q4_0":
            vecs.append(em.op(f"arith.mulf {vecs[0]}, {self.splat(-8.0, 'f32', n)} : "
                              f"vector<{n}xf32>"))
        qs = self.add(base, 2 * n * nsc)
        if fmt.base == "q8_0":      # 8 chunks of signed bytes, no min term
            return vecs[0], None, [(c, self.read_bytes(self.add(qs, 4 * n * c), 4 * n))
                                   for c in range(8)]
        ws = []
        for c in range(4):
            q = self.read_bytes(self.add(qs, 4 * n * c), 4 * n)
            ws += [(c, self._lo(q, 4 * n)), (4 + c, self._hi(q, 4 * n))]
        return vecs[0], vecs[1], sorted(ws)

    def tile_r16(self, row0: str, m0: str, rows: int, dest: str, dest_t: str,
                 col0: str) -> str:
        """Rows ``m0 .. m0 + rows`` of the quantized x against the 16 W rows from ``row0`` of
        a row-interleaved weight: per block, the tile block's 8 weight vectors
        (:meth:`r16_block`) against each x row's words broadcast to every lane, ``vpdpbusd``
        (int8 x: unsigned weights times signed x; int16 x: ``h`` signed times the weights,
        then the weights signed times ``l`` unsigned, summed as ``256 C_h + C_l``: exact),
        two chains each (Q8_0's signed weights: ``w + 128`` meets the signed x bytes, minus
        ``128 xc``); then :meth:`scale_rows`. Writes ``dest[m0 + i, col0 : col0 + 16]``."""
        g, em = self.g, self.em
        n, nb = self.lanes, g.k // CHUNK
        vf, vi, v8 = f"vector<{n}xf32>", f"vector<{n}xi32>", f"vector<{4 * n}xi8>"
        per = CHUNK * self.bits // 32          # x words a block: 8 (int8), 16 (h then l)
        xrows = [self.add(m0, i) for i in range(rows)]
        zero = em.op(f"arith.constant dense<0.0> : {vf}", "cv")
        zero_i = em.op(f"arith.constant dense<0> : {vi}", "cv")
        b, res, its = self._block_loop(("b", "kl", "acc"), nb, [zero] * rows, [vf] * rows)
        dw, mw, ws = self.r16_block(row0, b)
        xbase = self.mul(b, per)
        parts = 2 if self.bits == 16 else 1
        if self.r16_q8:     # signed weights: w + 128 (unsigned) meets the signed x bytes
            flip = em.op(f"arith.constant dense<-128> : {v8}", "cv")
            wu = [em.op(f"arith.xori {w}, {flip} : {v8}") for _, w in ws]

        def dot(acc: str, a: str, w: str) -> str:
            return self._intr(f"llvm.x86.avx512.vpdpbusd.{32 * n}", [acc, a, w],
                              f"{vi}, {v8}, {v8}", vi)

        sums = []
        for xr in xrows:
            chains = [[zero_i, zero_i] for _ in range(parts)]
            for t, (word, w) in enumerate(ws):
                for p in range(parts):
                    xw = em.op(f"tensor.extract {self.xq}[{xr}, "
                               f"{self.add(xbase, 8 * p + word)}] : {self.tq}")
                    xb = em.op(f"vector.bitcast "
                               f"{em.op(f'vector.broadcast {xw} : i32 to {vi}')} : {vi} to {v8}")
                    # unsigned operand first: the weights (Q8_0: + 128) against h / int8 x,
                    # l against them
                    first = wu[t] if self.r16_q8 else w
                    a, wv = (first, xb) if p == 0 else (xb, w)
                    chains[p][t % 2] = dot(chains[p][t % 2], a, wv)
            d = [em.op(f"arith.addi {c0}, {c1} : {vi}") for c0, c1 in chains]
            if self.r16_q8:  # sum((w + 128) x) - 128 sum(x) over the signed x bytes
                cx = em.op(f"tensor.extract {self.xc}[{xr}, {b}] : {self.tc}")
                c128 = em.op(f"arith.muli {cx}, {em.const(128, 'i32')} : i32")
                d[0] = em.op(f"arith.subi {d[0]}, "
                             f"{em.op(f'vector.broadcast {c128} : i32 to {vi}')} : {vi}")
            if parts == 2:
                eight = em.op(f"arith.constant dense<8> : {vi}", "cv")
                d = [em.op(f"arith.addi {em.op(f'arith.shli {d[0]}, {eight} : {vi}')}, "
                           f"{d[1]} : {vi}")]
            sums.append(em.op(f"arith.sitofp {d[0]} : {vi} to {vf}"))
        return self.scale_rows(sums, dw, mw, (b, res, its), xrows, dest, dest_t, col0)

    # ---- the lane-order GEMV (M = 1): the GEMM tile's f32 operations, x in registers ----
    def hsum(self, parts: list[str], width: int) -> str:
        """The lanes of ``parts`` (vector<width x i32> each, a power of two of them) summed
        pairwise, stage by stage, into one vector<width x i32>: two stages of in-lane sums
        (evens plus odds of each 128-bit lane of a pair, ``vphaddd``'s order), then stages
        across 128-bit lanes (evens plus odds of the pair's 128-bit lanes). Which row each
        output lane sums: :func:`_hsum_rows`. Exact (integers)."""
        vi = f"vector<{width}xi32>"
        for lo, hi in _hsum_masks(len(parts), width):
            parts = [self.em.op(f"arith.addi {self.shuffle(a, b, lo, vi)}, "
                                f"{self.shuffle(a, b, hi, vi)} : {vi}")
                     for a, b in zip(parts[::2], parts[1::2])]
        return parts[0]

    def _lane_layout(self) -> tuple[int, int]:
        """(i32 lanes, W rows) of one vector of :meth:`_lane_parts`."""
        return (8, 1) if self.lanes == 8 else (16, 2)

    def _lane_parts(self, offs: list[str], xq) -> list[str]:
        """Each W row's (block at byte ``offs[r]``) integer dot products with the x block
        ``xq`` (:meth:`_x_int`), as vectors for :meth:`hsum` (:meth:`_lane_layout`: vector
        v holds row ``rows * v + i`` in lanes ``i * width / rows`` onwards): 256-bit (8
        lanes, one row each: :meth:`_dot`) unless 16 lanes (Q4): then 512-bit dot products
        (VNNI), two rows a vector (their nibbles side by side, x repeated)."""
        em, fmt = self.em, self.g.wtype.format
        if self.lanes == 8:
            return [self._dot(self._weights_int(o)[2], xq) for o in offs]
        v32, zero = "vector<32xi8>", em.op("arith.constant dense<0> : vector<16xi32>", "cv")
        twice = list(range(32)) * 2 if self.bits == 8 else list(range(16)) * 2
        qs = 2 if fmt.name == "q4_0" else 4
        if self.bits == 16:
            xs = [self.shuffle(h, h, twice, "vector<16xi16>") for h in xq]
        else:
            xs = [self.shuffle(xq, xq, twice, v32)]
        out = []
        for o0, o1 in zip(offs[::2], offs[1::2]):
            q = self.shuffle(self.read_bytes(self.add(o0, qs), 16),
                             self.read_bytes(self.add(o1, qs), 16), list(range(32)),
                             "vector<16xi8>")
            nibs = [self._lo(q, 32), self._hi(q, 32)]
            acc = zero
            if self.bits == 16:
                for nib, x in zip(nibs, xs):
                    w = em.op(f"arith.extui {nib} : {v32} to vector<32xi16>")
                    acc = self._intr("llvm.x86.avx512.vpdpwssd.512", [acc, w, x],
                                     "vector<16xi32>, vector<32xi16>, vector<32xi16>",
                                     "vector<16xi32>")
            else:  # row 0's low and high nibbles, then row 1's: x's order, twice
                w = self.shuffle(nibs[0], nibs[1], [*range(16), *range(32, 48), *range(16, 32),
                                                    *range(48, 64)], v32)
                acc = self._intr("llvm.x86.avx512.vpdpbusd.512", [acc, w, xs[0]],
                                 "vector<16xi32>, vector<64xi8>, vector<64xi8>",
                                 "vector<16xi32>")
            out.append(acc)
        return out

    def _prefetch_rows(self, row0: str) -> None:
        """Software prefetch of the first 64-byte line of each of the tile's W rows, before
        its K loop: the first tiles a thread takes were not prefetched ahead
        (:meth:`_prefetch_ahead`), and their L interleaved streams would each stall on
        their first line (SmolLM2's decode step, one thread: 9.0 -> 8.8 ms)."""
        g, fmt = self.g, self.g.wtype.format
        row_bytes = g.k // CHUNK * fmt.block_bytes
        self._prefetch_at([self.mul(self.wrow(self.add(row0, j)), row_bytes)
                           for j in range(self.lanes)])

    def _prefetch_at(self, offs: list[str]) -> None:
        """``memref.prefetch`` of W at ``offs`` (clamped to W): byte offsets, or element
        offsets where W's buffer is a dense weight's elements (:attr:`wmem_t`)."""
        em = self.em
        last = self.c(self.wmem_len - 1)
        for off in offs:
            p = self.idx(f"arith.minui {off}, {last}")
            em.line(f"memref.prefetch {self.wmem}[{p}], read, locality<3>, data : "
                    f"{self.wmem_t}")

    def _prefetch_ahead(self, row0: str, b: str) -> None:
        """Software prefetch, at block ``b`` of the tile of W rows from ``row0``, of the
        block's share of the tile :data:`GEMV_PREFETCH_TILES` ahead (its bytes are one
        contiguous run: the tile's L rows), in 64-byte lines, clamped to W: one forward
        stream, where the tile itself reads L interleaved ones."""
        g, em, fmt = self.g, self.em, self.g.wtype.format
        nb = g.k // CHUNK
        row_bytes = nb * fmt.block_bytes
        tile_bytes = self.lanes * row_bytes
        lines = -(-tile_bytes // (nb * 64))
        base = self.add(self.mul(self.wrow(row0), row_bytes), tile_bytes * GEMV_PREFETCH_TILES)
        base = self.add(base, self.mul(b, 64 * lines))
        self._prefetch_at([self.add(base, 64 * i) for i in range(lines)])

    def tile_lanes(self, row0: str, dest: str, dest_t: str, col0: str) -> str:
        """The one x row against the L = ``self.lanes`` W rows from ``row0`` (M = 1), in the
        GEMM tile's lane order: per block, each W row's integer dot products with x in
        registers (:meth:`_lane_parts`), summed across lanes into one vector<L x i32> (lane
        j: W row j's block sum, :meth:`hsum`), then the same f32 operations as
        :meth:`tile_gemm` on the vectors of the rows' scales (so each (x row, W row) result
        rounds as in the GEMM tile: the same at every M). W is prefetched
        :data:`GEMV_PREFETCH_TILES` tiles ahead (:meth:`_prefetch_ahead`), each row's first
        line before the K loop (:meth:`_prefetch_rows`). Writes
        ``dest[0, col0 : col0 + L]``."""
        g, em = self.g, self.em
        nb, n = g.k // CHUNK, self.lanes
        vf, vi = f"vector<{n}xf32>", f"vector<{n}xi32>"
        zero = em.op(f"arith.constant dense<0.0> : {vf}", "cv")
        x0 = self.c(0)
        self._prefetch_rows(row0)
        b, res, acc = em.fresh("b"), em.fresh("kl"), em.fresh("acc")
        em.line(f"{res} = scf.for {b} = {self.c(0)} to {self.c(nb)} step {self.c(1)} "
                f"iter_args({acc} = {zero}) -> ({vf}) {{")
        em.depth += 1
        offs = self.block_offsets(row0, b, n)
        self._prefetch_ahead(row0, b)
        dw, mw = self._tile_scales(offs)
        xq = self._x_int(x0, b)
        # the rows go into the dot products in the order that makes hsum's lane j row j
        width, rows = self._lane_layout()
        order = _hsum_rows(n // rows, width, rows)
        parts = self._lane_parts([offs[order.index(r)] for r in range(n)], xq)
        fd = em.op(f"arith.sitofp {self.hsum(parts, width)} : {vi} to {vf}")
        new = self._scale_fma(fd, dw, mw, x0, b, acc, vf)
        em.line(f"scf.yield {new} : {vf}")
        em.depth -= 1
        em.line("}")
        return em.op(f"vector.transfer_write {res}, {dest}[{x0}, {col0}] {{in_bounds = [true]}} "
                     f": {vf}, {dest_t}")

    def emit(self) -> str:
        em, g = self.em, self.g
        if self.quant:
            self.quantize_x()
        if self.amx is not None:
            self.amx.x_buffer()
        self.wmem = self.wmem32 = None
        #: W's flat buffer (:meth:`_prefetch_at`): its length, its type (bytes, or a dense
        #: W's elements)
        self.wmem_len = g.wtype.nbytes
        self.wmem_t = f"memref<{g.wtype.nbytes}xi8>"
        if self.gemm or self.lane_gemv or self.r16:  # W as a buffer, for the prefetches
            nbytes = g.wtype.nbytes
            self.wmem = em.op(f"bufferization.to_buffer {g.w} read_only : tensor<{nbytes}xi8> "
                              f"to {self.wmem_t}")
        elif self.dense_block and not g.packed and self.nr > 1 and DENSE_PREFETCH_BYTES:
            rows, ty = g.total_rows or g.n, g.wtype.dtype.value
            m2 = em.op(f"bufferization.to_buffer {g.w} read_only : {tt(g.wtype)} to "
                       f"memref<{rows}x{g.k}x{ty}>")
            self.wmem_len = rows * g.k
            self.wmem_t = f"memref<{self.wmem_len}x{ty}>"
            self.wmem = em.op(f"memref.collapse_shape {m2} [[0, 1]] : memref<{rows}x{g.k}x{ty}> "
                              f"into {self.wmem_t}")
        nt = self.nt
        out_t = f"tensor<{g.m}x{g.n}xf32>"
        init = em.op(f"tensor.empty() : {out_t}", "e")
        n, res = em.fresh("n"), em.fresh("gemv")
        o = em.fresh("o")
        parallel = self.s.cores > 1 and g.n > nt and g.weight_bytes >= self.s.parallel_min_bytes
        # AMX's stack buffers: in a parallel body (the OpenMP lowering scopes its allocas),
        # else once before the sequential loop (an alloca in a loop would grow the stack)
        self.amx_hoisted = self.amx is not None and not parallel
        if self.amx_hoisted:
            self.amx.alloc()
        if parallel:
            em.line(f"{res} = scf.forall ({n}) in ({g.n // nt}) shared_outs({o} = {init}) -> "
                    f"({out_t}) {{")
            em.depth += 1
            base = self.mul(n, nt)
            col_t = f"tensor<{g.m}x{nt}xf32>"
            sl = em.op(f"tensor.extract_slice {o}[0, {base}] [{g.m}, {nt}] [1, 1] : {out_t} to "
                       f"{col_t}")
            sl = self.rows([self.add(base, j) for j in range(nt)], sl, col_t,
                           [self.c(j) for j in range(nt)])
            em.line("scf.forall.in_parallel {")
            em.line(f"  tensor.parallel_insert_slice {sl} into {o}[0, {base}] [{g.m}, {nt}] "
                    f"[1, 1] : {col_t} into {out_t}")
            em.line("}")
            em.depth -= 1
            em.line("}")
        else:
            em.line(f"{res} = scf.for {n} = {self.c(0)} to {self.c(g.n // nt)} step {self.c(1)} "
                    f"iter_args({o} = {init}) -> ({out_t}) {{")
            em.depth += 1
            base = self.mul(n, nt)
            wrows = [self.add(base, j) for j in range(nt)]
            em.line(f"scf.yield {self.rows(wrows, o, out_t, wrows)} : {out_t}")
            em.depth -= 1
            em.line("}")
        return res


def emit(em: Emitter, g: Gemv, strategy: Strategy) -> str:
    """Emit the kernel; returns the SSA name of its ``tensor<MxNxf32>`` result."""
    return _K(em, g, strategy).emit()


def emit_indexed(em: Emitter, op: OpInfo, src: tuple) -> str | None:
    """``poot.indexed_matmul`` (row t of x against slab ``idx[t]`` of w, w read in place as
    ``src`` = (ssa, type, producer)): a loop over the T rows, each running the kernel over its
    slab's O rows at the slab's offset, so only the selected slabs are read. None, emitting
    nothing, for a packed format without a decoder here, a non-f32 x or an empty shape."""
    x, _w, idx = op.args
    xt, wt, it = op.types
    T, K = xt.shape
    E, O, _ = wt.shape
    w, wtype, _ = src
    if isinstance(wtype, PackedType) and wtype.format.name not in PACKED or \
            xt.dtype is not DType.F32 or not (T and O and K):
        return None
    if isinstance(wtype, TensorType):           # dense [E, O, K] -> [E * O, K] rows
        flat = TensorType((E * O, K), wtype.dtype)
        w = em.op(f"tensor.collapse_shape {w} [[0, 1], [2]] : {tt(wtype)} into {tt(flat)}")
        wtype = flat
    out_t = tt(op.result)
    init = em.empty(op.result)
    t, res, acc = em.fresh("t"), em.fresh("im"), em.fresh("acc")
    c0, c1, cT = (em.const(v, "index") for v in (0, 1, T))
    em.line(f"{res} = scf.for {t} = {c0} to {cT} step {c1} iter_args({acc} = {init}) -> "
            f"({out_t}) {{")
    em.depth += 1
    raw = em.op(f"tensor.extract {idx}[{t}] : {tt(it)}")
    e = clamped_index(em, raw, it.dtype, E)
    base = em.op(f"arith.muli {e}, {em.const(O, 'index')} : index")
    row_t = f"tensor<1x{K}xf32>"
    xr = em.op(f"tensor.extract_slice {x}[{t}, 0] [1, {K}] [1, 1] : {tt(xt)} to {row_t}")
    g = Gemv(xr, w, wtype, 1, K, O, row_base=base, total_rows=E * O)
    y = emit(em, g, op.strategy)
    nxt = em.op(f"tensor.insert_slice {y} into {acc}[{t}, 0] [1, {O}] [1, 1] : "
                f"tensor<1x{O}xf32> into {out_t}")
    em.line(f"scf.yield {nxt} : {out_t}")
    em.depth -= 1
    em.line("}")
    return res


class GemvKernels:
    """The row-streaming kernels as the lowering's
    :class:`~poot.dialects.lowering.rules.MatmulKernels`."""

    def matmul(self, em: Emitter, op: OpInfo) -> str | None:
        kernel = match(op)
        return emit(em, kernel, op.strategy) if kernel is not None else None

    def indexed_matmul(self, em: Emitter, op: OpInfo, weight: tuple) -> str | None:
        return emit_indexed(em, op, weight)

    def paged_attention(self, em: Emitter, op: OpInfo) -> str | None:
        """``poot.paged_attention`` as explicit vector code (:mod:`poot.backends.cpu.attention`),
        or None for the generic lowering."""
        return cpu_paged_attention(em, op)

    def concat(self, em: Emitter, op: OpInfo) -> str | None:
        """``poot.concat`` of unit-wide pieces as one fusable, threadable generic
        (:func:`~poot.dialects.lowering.views.concat_generic`), or None for the
        insert-slice chain."""
        return concat_generic(em, op)

    def declarations(self, text: str) -> str:
        return intrinsic_declarations(text)


#: what the CPU backend's strategies carry (:func:`poot.backends.cpu.codegen.strategy_for`)
KERNELS = GemvKernels()


__all__ = ["GEMM_M_TILE", "GEMM_N_TILE", "GEMV_LANES", "Gemv", "GemvKernels", "INTRINSICS",
           "INTRINSIC_PREFIX", "KERNELS", "PACKED", "emit", "emit_indexed", "gemm_fits",
           "intrinsic_declarations", "lane_order", "match"]
