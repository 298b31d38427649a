"""Decode GEMM on NVIDIA tensor cores: the matmul regions of a batched decode step (M = 3..128
rows of x for dense bf16/f16 weights, 9..128 for packed Q4_0/Q4_1/Q8_0 ones; the GEMV keeps
fewer) streamed so that every weight element is read once per step, from DRAM straight into
the ``mma.sync`` B registers: no workgroup tiles, no ``ldmatrix``. The regions are those the
prefill GEMM (:mod:`.gemm`) takes, restricted to K a multiple of 32 and one of these formats.

Why another kernel: the tiled GEMM stages weight tiles through 48 KB of workgroup memory, so
at decode M a block keeps few bytes in flight and the grid few blocks; on an H200 it streamed
a 1B-shape's projections at 0.5-2.2 TB/s at M = 32-128 (``bench/results/gemm.md``), where a
decode step is bound by the weights' bytes. Here a warp owns ``8 * NT`` output columns and all
``16 * MT`` (padded) rows: its lanes load the weight rows with 16-byte (dense) or block-sized
(packed) loads, many K steps in flight per lane, and the A fragments from x (f32, L1/L2
resident: the same rows for every column) rounded to the mma type in registers.

The k order inside an mma is free as long as A and B agree: lane ``(g, t)`` (``g = lane >>
2``, ``t = lane & 3``) holds, for the weight row ``n0 + 8 j + g`` of its n-tile ``j``, the
eight k of :func:`lane_ks` in one K step of 32, as B registers ``b0 b1`` of two mma's (the
low k of each pair in the low half), and the same k of x rows ``g`` and ``g + 8`` of each
m-tile as A registers ``a0..a3``: dense and Q8_0 weights give lane ``t`` the 16 bytes of k
``8t .. 8t+7`` (consecutive: one 16-byte load of a bf16 row), Q4_0/Q4_1 the quant word ``t``
of the block (its low nibbles are k ``4t .. 4t+3``, its high nibbles ``16 + 4t ..``).
Packed weights are decoded in f32 with ggml's formulas (as the oracle) and rounded to f16
pairs, x to the mma's type (bf16 for bf16 weights, else f16), accumulation f32: the error
bound is the tiled GEMM's (:func:`.gemm.error_bound`).

A block is ``WN`` warps side by side over N that share x: each chunk of ``U`` K steps, its
threads load x's f32 rows once, round them to the mma type and store them as the lanes' A
registers (16 bytes a lane and mma) in workgroup memory, double-buffered (one barrier a
chunk). The loop is software-pipelined one chunk deep: a chunk's weight loads are issued a
chunk ahead, carried in registers, and the next chunk's x loads before this chunk's mma's.
Why: every warp reading its own x from L2 re-read it ``N / (8 NT)`` times, 4x the weight's
bytes at M = 64 (measured on an H200: the 1B gate projection took 21 us at M = 64 against 8 at
M = 8). Grid z cuts K into ``S`` slices whose partials a second kernel sums in slice order
(the tiled GEMM's reduction, :meth:`.gemm._GemmKernel.reduce_kernel`); no atomics, so results
do not depend on scheduling. :func:`decode_tiling` picks ``MT, NT, WN, S, U`` from M, N, K
and the compute units.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlir import ir

from poot.backends.gpu.kernels import WG_ALIGN, Launch
from poot.backends.gpu.strategies import gemm as G
from poot.backends.gpu.strategies.emit import (
    ArgsSeenEmitter,
    EmitShorthands,
    ScalarUnsupported,
    Synthesized,
)
from poot.backends.gpu.strategies.matmul_match import (
    GemvMatch,
    gemm_rows,
    match,
)
from poot.dialects.types import DType

#: most rows (M) this kernel takes; more (prefill) go to the tiled GEMM, whose block tiles
#: reuse each weight tile over 128 rows (here every warp re-reads all M rows of x per K step:
#: ``M / (4 NT)`` bytes of x per weight byte through L1, 16 at M = 128)
MAX_M = 128
#: formats: dense 16-bit weights stored [N, K], and the packed ones with a lane decoder
FORMATS = ("bf16", "f16", "q4_0", "q4_1", "q8_0")
#: k per K step (one 32-element block of a packed format; two mma k-steps)
KSTEP = 32
#: accumulators' tiles a warp keeps (MT x NT 16 x 8 tiles, 4 f32 each): 64 registers
MAX_TILES = 16
#: blocks per compute unit the grid aims for at MT = 1 (over sqrt(MT) at more rows), with the
#: K splits below
BLOCKS_PER_CORE = 3
#: split-K: most slices, fewest K steps per slice
MAX_SPLIT, MIN_BLOCK_STEPS = 16, 2
#: split-K partials (S x M x N f32, written once and read once, mostly from L2) may take up to
#: the weight's bytes, or this many (a small weight is latency-bound, not bandwidth-bound)
L2_PARTIALS = 4 << 20
#: K steps (of 32) from which :func:`decode_tiling`'s fitted rule applies; a shorter K takes
#: :func:`short_k_tiling`
LONG_K_STEPS = 64
#: benchmarks: ``(NT, WN, S, U)`` to use instead of :func:`decode_tiling`'s (bench/gpu_run/
#: decode_gemm_sweep.py times the variants on the device)
FORCE_TILING: tuple[int, int, int, int] | None = None
#: benchmarks (wrong results, timing only): "no_x" drops the loop's x staging (every chunk
#: multiplies chunk 0's fragments), "no_mma" replaces the mma's by one add a weight register,
#: "stream" both (the weight stream alone)
ABLATE: str | None = None


@dataclass(frozen=True)
class DecodeTiling:
    """``MT`` 16-row m-tiles (all of M), ``NT`` 8-column n-tiles per warp, ``WN`` warps per
    block (side by side over N, sharing the block's x fragments), ``S`` split-K slices (grid
    z) of ``per_block`` K steps of 32, ``U`` K steps per chunk (one workgroup buffer of x
    fragments, double-buffered)."""

    MT: int
    NT: int
    WN: int
    S: int
    U: int
    per_block: int

    @property
    def BN(self) -> int:
        """Columns per block."""
        return 8 * self.NT * self.WN

    @property
    def T(self) -> int:
        return 32 * self.WN

    @property
    def entries(self) -> int:
        """x fragments (4 registers of one lane, one mma) in a chunk."""
        return self.U * self.MT * 2 * 32


def _largest_divisor(n: int, at_most: int) -> int:
    return max(d for d in range(1, max(1, at_most) + 1) if n % d == 0)


def decode_tiling(M: int, N: int, K: int, cores: int, weight_bytes: int) -> DecodeTiling:
    """The tiling of an [M, K] x [K, N] decode GEMM whose weight is ``weight_bytes`` bytes,
    ``K % 32 == 0``, fitted to H100 sweeps of every ``(NT, WN, S, U)`` over the
    Llama-3.2-1B (bf16) and SmolLM2 (Q4_1) projections and the 1B's LM head at M = 16..128,
    the weights streamed from DRAM (``bench/gpu_run/decode_gemm_sweep.py``,
    ``bench/results/decode_gemm.md``: within 7 % of each 1B shape's fastest, geometric
    mean):

    - MT = ceil(M / 16); NT = 2 n-tiles a warp where MT > 2 and the weight has at least
      16 blocks of 128 columns, else 1 (fewer accumulators a warp, more warps: a small
      weight is latency-bound);
    - WN = 8 warps a block sharing x's fragments (x re-read from L2 once per block of
      ``64 NT`` columns; a narrow weight alone, k/v, measured up to 1.26x faster at 4, but
      a step's k/v fuse with q (:mod:`~poot.backends.gpu.horizontal`), which merges
      members with barriers only at one block size);
    - S split-K slices so that the grid has about ``BLOCKS_PER_CORE / sqrt(MT)`` blocks a
      compute unit (more rows, more work a block), at most :data:`MAX_SPLIT`, each slice
      keeping :data:`MIN_BLOCK_STEPS` K steps, the partials (S * M * N f32) under the
      weight's bytes or :data:`L2_PARTIALS` and :data:`~.gemm.MAX_SPLIT_SCRATCH`; S divides
      the K steps, preferring slices of a whole number of chunks of U;
    - U = K steps a chunk: 4 at MT = 3..4, else 2 (MT * U <= 16: 32 KB of double-buffered
      x fragments), or the most below that dividing a slice's steps.

    A short K (under :data:`LONG_K_STEPS` steps: SmolLM2's 576 and 1536) keeps the wider
    warps of :func:`short_k_tiling`, which measured 1-25 % faster there inside the decode
    step (the same grids with 8 warps of one n-tile were slower)."""
    MT = -(-M // 16)
    KT = K // KSTEP
    if FORCE_TILING is not None:
        NT, WN, S, U = FORCE_TILING
        return DecodeTiling(MT, NT, WN, S, U, KT // S)
    smax = max(1, min(MAX_SPLIT, KT // MIN_BLOCK_STEPS))
    cap = min(smax, max(weight_bytes, L2_PARTIALS) // (4 * M * N),
              G.MAX_SPLIT_SCRATCH // (4 * M * N))
    if KT < LONG_K_STEPS:
        return short_k_tiling(MT, N, KT, cores, smax, cap)
    NT = 2 if MT > 2 and -(-N // 128) >= 16 else 1
    WN = 8
    blocks = -(-N // (8 * NT * WN))
    want = -(-int(BLOCKS_PER_CORE * cores / MT ** 0.5) // blocks)
    u_want = 4 if 3 <= MT <= 4 else 2
    S = 1
    if cap >= 2 and want >= 2:
        lim = min(want, cap)
        whole = [s for s in range(1, lim + 1) if KT % s == 0 and (KT // s) % u_want == 0]
        S = max(whole) if whole else _largest_divisor(KT, lim)
    per = KT // S
    return DecodeTiling(MT, NT, WN, S, _largest_divisor(per, u_want), per)


def short_k_tiling(MT: int, N: int, KT: int, cores: int, smax: int, cap: int
                   ) -> DecodeTiling:
    """:func:`decode_tiling` where K has fewer than :data:`LONG_K_STEPS` steps of 32: WN = 4
    warps a block, each as many n-tiles (<= 4) as keep MT * NT <= 16 accumulator tiles,
    halved while even ``smax`` slices would not give every compute unit a block; S slices
    (at most ``cap``, the split-K cap) so that the grid has 4 blocks a compute unit,
    dividing the K steps; U = the most K steps (<= 4, MT * U <= 16) dividing a slice's."""
    WN = 4
    NT = max(1, min(4, MAX_TILES // MT, -(-N // (8 * WN))))
    while NT > 1 and -(-N // (8 * NT * WN)) * smax < cores:
        NT //= 2
    want = -(-4 * cores // -(-N // (8 * NT * WN)))
    S = _largest_divisor(KT, min(want, cap)) if cap >= 2 and want >= 2 else 1
    per = KT // S
    return DecodeTiling(MT, NT, WN, S, _largest_divisor(per, min(4, MAX_TILES // MT)), per)


def lane_ks(fmt: str, t: int, s: int) -> list[int]:
    """The four k (within a K step of 32) that lane ``t`` (``lane & 3``) holds for mma ``s``
    (0, 1) of the step, in register order: ``b0`` = the first two (low half first), ``b1`` =
    the last two; A registers ``a0``/``a1`` (rows g, g + 8) the first two, ``a2``/``a3`` the
    last two."""
    base = 16 * s + 4 * t if fmt in ("q4_0", "q4_1") else 8 * t + 4 * s
    return [base + i for i in range(4)]


def fmt_of(m: GemvMatch) -> str | None:
    """The weight's format name of :data:`FORMATS` (None for others)."""
    w = m.weight
    if w.layout == "nk":
        return {DType.BF16: "bf16", DType.F16: "f16"}.get(w.dtype)
    if w.layout == "packed" and w.fmt in FORMATS:
        return w.fmt
    return None


def weight_type(m: GemvMatch, fmt: str) -> str:
    """The weight buffer's memref type as the kernels read it: 16-bit words (dense, Q4_0,
    Q8_0) or 32-bit ones (Q4_1, whose 20-byte blocks are whole words)."""
    if fmt in ("bf16", "f16"):
        return f"memref<{m.N * m.K}xi16>"
    if fmt == "q4_1":
        return f"memref<{m.weight.nbytes // 4}xi32>"
    return f"memref<{m.weight.nbytes // 2}xi16>"


class _DecodeKernel(G._GemmKernel):
    """Emits the kernel of a :class:`DecodeTiling` (module doc); the tiled GEMM's helpers
    (thread jobs, split-K partials and reduction kernel)."""

    #: ``%xs`` in dynamic workgroup memory (the launch's ``shared`` bytes) instead of a
    #: workgroup attribution of the kernel
    dynamic_xs = False

    def __init__(self, m: GemvMatch, d: DecodeTiling, fn: ir.Operation, fmt: str):
        t = G.Tiling(16 * d.MT, d.BN, 1, d.WN, KSTEP)
        super().__init__(m, t, False, fn, d.S)
        self.d, self.fmt = d, fmt
        self.bf16 = fmt == "bf16"
        self.KT = m.K // KSTEP
        self.KTS = self.KT // d.S
        self.wtype = weight_type(m, fmt)
        self.xs_t = f"memref<2x{d.entries}x4xi32, {G._WG}>"

    # -- operands
    def pack(self, lo: str, hi: str) -> str:
        """f32 ``lo``, ``hi`` rounded to the mma type as one operand register (``lo`` in the
        low half): i32 (bf16) or vector<2xf16>."""
        ty = "bf16" if self.bf16 else "f16"
        p = self.op(f"nvvm.convert.f32x2.to.{ty}x2 {hi}, {lo} "
                    f"{{rnd = #nvvm.fp_rnd_mode<rn>}} : vector<2x{ty}>")
        if not self.bf16:
            return p
        w = self.op(f"vector.bitcast {p} : vector<2xbf16> to vector<1xi32>")
        return self.op(f"vector.extract {w}[0] : i32 from vector<1xi32>")

    def word_operand(self, w: str) -> str:
        """A weight word of two 16-bit values as an operand register."""
        if self.bf16:
            return w
        v = self.op(f"vector.from_elements {w} : vector<1xi32>")
        return self.op(f"vector.bitcast {v} : vector<1xi32> to vector<2xf16>")

    def load_weight(self, nrow: str, step: str) -> list:
        """Issue lane ``t``'s loads of K step ``step`` of weight row ``nrow``: raw values for
        :meth:`weight_regs`."""
        K = self.m.K
        if self.fmt in ("bf16", "f16"):
            at = self.add(self.add(self.mul(nrow, K), self.mul(step, KSTEP)), self.t8)
            v = self.op(f"vector.load %w[{at}] {{alignment = 16 : i64}} : {self.wtype}, "
                        "vector<8xi16>")
            return [self.op(f"vector.bitcast {v} : vector<8xi16> to vector<4xi32>")]
        blk = self.add(self.mul(nrow, K // 32), step)
        if self.fmt == "q4_1":
            base = self.mul(blk, 5)
            return [self.op(f"memref.load %w[{i}] : {self.wtype}")
                    for i in (base, self.add(self.add(base, 1), self.t1))]
        if self.fmt == "q4_0":
            base = self.mul(blk, 9)
            q = self.add(self.add(base, 1), self.mul(self.t1, 2))
            idx = [base, q, self.add(q, 1)]
        else:                                           # q8_0: d, then 4 x 2 int8
            base = self.mul(blk, 17)
            q = self.add(self.add(base, 1), self.mul(self.t1, 4))
            idx = [base] + [self.add(q, i) for i in range(4)]
        return [self.op(f"memref.load %w[{i}] : {self.wtype}") for i in idx]

    def weight_regs(self, raw: list) -> list[list[str]]:
        """The B registers ``[[b0, b1] of mma 0, [b0, b1] of mma 1]`` from :meth:`load_weight`'s
        raw values (packed: decoded in f32, rounded to f16 pairs)."""
        e = self.e
        if self.fmt in ("bf16", "f16"):
            ws = [self.op(f"vector.extract {raw[0]}[{i}] : i32 from vector<4xi32>")
                  for i in range(4)]
            ws = [self.word_operand(w) for w in ws]
            return [ws[0:2], ws[2:4]]
        if self.fmt == "q4_1":
            dm, q = raw
            d, mn = e.half(dm, False), e.half(dm, True)
            lo = [e.fma(e.u2f(self.ubits(q, 8 * i, 0xF)), d, mn) for i in range(4)]
            hi = [e.fma(e.u2f(self.ubits(q, 8 * i + 4, 0xF)), d, mn) for i in range(4)]
            vals = [lo, hi]
        elif self.fmt == "q4_0":
            d = self.f16_to_f32(raw[0])
            q = [self.i32(r) for r in raw[1:]]              # bytes (b0 b1), (b2 b3)
            byts = [self.ubits(q[i // 2], 8 * (i % 2), 0xFF) for i in range(4)]
            eight = self.c(8, "i32")

            def val(b):
                return e.fmul(e.s2f(self.op(f"arith.subi {b}, {eight} : i32")), d)
            vals = [[val(e.band(b, 0xF)) for b in byts], [val(e.shr(b, 4)) for b in byts]]
        else:                                               # q8_0
            d = self.f16_to_f32(raw[0])
            vs = []
            for r in raw[1:]:
                v = self.i32(r)
                for s in (0, 8):
                    sb = self.op(f"arith.shrsi {e.shl(v, 24 - s)}, {self.c(24, 'i32')} : i32")
                    vs.append(e.fmul(e.s2f(sb), d))
            vals = [vs[0:4], vs[4:8]]
        return [[self.pack(v[0], v[1]), self.pack(v[2], v[3])] for v in vals]

    def x_vals(self, row: str, k0: str) -> list[str]:
        """x[row, k0 .. k0 + 3] (k0 a multiple of 4) as f32 scalars."""
        m = self.m
        if m.x_arg is None:                     # an expression: element by element
            return [self.se.value(m.x, (row, self.add(k0, i))) for i in range(4)]
        at = self.add(self.mul(row, m.K), k0)
        v = self.op(f"vector.load %x[{at}] {{alignment = 16 : i64}} : {self.xtype}, "
                    "vector<4xf32>")
        return [self.op(f"vector.extract {v}[{i}] : f32 from vector<4xf32>") for i in range(4)]

    def bits(self, r: str) -> str:
        """An operand register as i32 bits."""
        if self.bf16:
            return r
        w = self.op(f"vector.bitcast {r} : vector<2xf16> to vector<1xi32>")
        return self.op(f"vector.extract {w}[0] : i32 from vector<1xi32>")

    # -- x fragments through workgroup memory
    def load_chunk(self, chunk: str) -> list:
        """This thread's share of chunk ``chunk``'s x fragments (entry ``e = ((u * MT + i) * 2
        + q) * 32 + l``: lane l's A registers of mma q of m-tile i in K step u): the f32
        loads, rows clamped to M."""
        m, d = self.m, self.d
        out = []
        for e in self.jobs(d.entries):
            l5 = self.op(f"arith.andi {e}, {self.c(31)} : index")
            q = self.op(f"arith.andi {self.op(f'arith.shrui {e}, {self.c(5)} : index')}, "
                        f"{self.c(1)} : index")
            iu = self.op(f"arith.shrui {e}, {self.c(6)} : index")
            i = self.op(f"arith.remui {iu}, {self.c(d.MT)} : index")
            u = self.op(f"arith.divui {iu}, {self.c(d.MT)} : index")
            g = self.op(f"arith.shrui {l5}, {self.c(2)} : index")
            t = self.op(f"arith.andi {l5}, {self.c(3)} : index")
            if self.fmt in ("q4_0", "q4_1"):             # 16 q + 4 t
                koff = self.add(self.mul(q, 16), self.mul(t, 4))
            else:                                        # 8 t + 4 q
                koff = self.add(self.mul(t, 8), self.mul(q, 4))
            step = self.add(self.mul(chunk, d.U), u)
            k0 = self.add(self.add(self.first, self.mul(step, KSTEP)), koff)
            r0 = self.minu(self.add(self.mul(i, 16), g), m.M - 1)
            r1 = self.minu(self.add(self.add(self.mul(i, 16), g), 8), m.M - 1)
            out.append((e, self.x_vals(r0, k0), self.x_vals(r1, k0)))
        return out

    def store_chunk_frags(self, raw: list, buf: str) -> None:
        """Round the loaded x values to the mma type and store each entry's 4 registers
        (a0 a1 a2 a3: rows g, g + 8 of the first two k, then of the last two) as one 16-byte
        workgroup store."""
        for e, top, bot in raw:
            regs = [self.bits(self.pack(top[0], top[1])), self.bits(self.pack(bot[0], bot[1])),
                    self.bits(self.pack(top[2], top[3])), self.bits(self.pack(bot[2], bot[3]))]
            v = self.op(f"vector.from_elements {', '.join(regs)} : vector<4xi32>")
            self.e.raw(f"vector.store {v}, %xs[{buf}, {e}, {self.c(0)}] "
                       f"{{alignment = 16 : i64}} : {self.xs_t}, vector<4xi32>")

    def a_regs(self, buf: str, u: int, i: int, q: int) -> list[str]:
        """The lane's A registers of mma q of m-tile i in K step u of the chunk in ``buf``."""
        e = self.add(self.lane, ((u * self.d.MT + i) * 2 + q) * 32)
        v = self.op(f"vector.load %xs[{buf}, {e}, {self.c(0)}] {{alignment = 16 : i64}} : "
                    f"{self.xs_t}, vector<4xi32>")
        return [self.word_operand(self.op(f"vector.extract {v}[{r}] : i32 from vector<4xi32>"))
                for r in range(4)]

    # -- the kernel
    def _lane_setup(self) -> tuple[str, str]:
        """The prologue both decode kernels start with: the scalar emitter over the
        function's arguments (:attr:`se`), then the thread's id :attr:`tid`, its warp
        (``tid / 32``) and lane :attr:`lane` (``tid % 32``), ``g = lane >> 2``, ``t = lane &
        3`` (:attr:`t1`) and ``8 t`` (:attr:`t8`), and the block's first column :attr:`n0`
        (``block_id.x * BN``). Returns ``(warp, g)``."""
        e, fn = self.e, self.fn
        nargs = len(fn.regions[0].blocks[0].arguments)
        self.cur_acc = None
        self.se = ArgsSeenEmitter(fn, e.k, [f"%e{i}" for i in range(nargs)],
                                  provide=self._provide)
        self.tid = tid = e.op("gpu.thread_id x")
        warp = e.op(f"arith.divui {tid}, {self.c(32)} : index")
        self.lane = lane = e.op(f"arith.remui {tid}, {self.c(32)} : index")
        g = e.op(f"arith.shrui {lane}, {self.c(2)} : index")
        self.t1 = e.op(f"arith.andi {lane}, {self.c(3)} : index")
        self.t8 = self.mul(self.t1, 8)
        self.n0 = self.mul(e.op("gpu.block_id x"), self.d.BN)
        return warp, g

    def kernel(self) -> tuple[str, list[list], list]:
        m, e, d = self.m, self.e, self.d
        warp, g = self._lane_setup()
        wcol = self.mul(warp, 8 * d.NT)
        nrows = [self.minu(self.add(self.add(self.add(self.n0, wcol), 8 * j), g), m.N - 1)
                 for j in range(d.NT)]
        bz = e.op("gpu.block_id z") if d.S > 1 else None
        self.kfirst = self.mul(bz, self.KTS) if bz else self.c(0)     # in K steps
        self.first = self.mul(self.kfirst, KSTEP)                      # in k
        accs = self._k_loop(nrows)
        x_reads = set(self.se.seen)
        # accumulator rows and columns (mma C fragment: row g (+8), column 2t (+1))
        self.em_rows = [self.add(g, 16 * i) for i in range(d.MT)]
        self.em_cols = [self.add(self.add(wcol, self.mul(self.t1, 2)), 8 * j)
                        for j in range(d.NT)]
        self._store(accs, bz)
        return self._module_text(x_reads)

    def raw_types(self) -> list[str]:
        """The types of one :meth:`load_weight` result, in order."""
        return {"bf16": ["vector<4xi32>"], "f16": ["vector<4xi32>"], "q4_1": ["i32"] * 2,
                "q4_0": ["i16"] * 3, "q8_0": ["i16"] * 5}[self.fmt]

    def load_chunk_weights(self, chunk: str, nrows: list) -> list:
        """Issue the lane's weight loads of chunk ``chunk`` (U K steps x NT rows): a flat
        list of raw values, step-major (:meth:`chunk_mma` takes them)."""
        d = self.d
        steps = [self.add(self.kfirst, self.add(self.mul(chunk, d.U), u)) for u in range(d.U)]
        return [v for s in steps for n in nrows for v in self.load_weight(n, s)]

    def chunk_mma(self, accs: list, raw: list, buf: str) -> list:
        """The chunk's mma's: weight registers from ``raw`` (:meth:`load_chunk_weights`), x
        fragments from workgroup buffer ``buf``; returns the new accumulators ``[i][j]``."""
        d = self.d
        per = len(self.raw_types())
        # every step's weight registers first, then the mma's (the order version 2's
        # kernels compiled to; 1-2 % on SmolLM2's step)
        Bs = [[self.weight_regs(raw[(u * d.NT + j) * per:(u * d.NT + j + 1) * per])
               for j in range(d.NT)] for u in range(d.U)]    # [u][j][mma][reg]
        for u in range(d.U):
            B = Bs[u]
            for i in range(d.MT):
                for q in (0, 1):
                    A = self.a_regs(buf, u, i, q)
                    if ABLATE in ("no_mma", "stream"):
                        accs[i] = [[self.e.fadd(accs[i][j][0], self.op(
                            f"arith.bitcast {self.bits(B[j][q][0])} : i32 to f32"))]
                            + accs[i][j][1:] for j in range(d.NT)]
                        continue
                    accs[i] = [self.mma(A, B[j][q], accs[i][j]) for j in range(d.NT)]
        return accs

    def _pipelined_chunks(self, nrows: list, na: int, body) -> tuple[list, list, str]:
        """The k loop of both decode kernels over the block's C = ``per_block / U`` chunks,
        software-pipelined one chunk deep, up to the last chunk's mma's (the caller's).
        Emits: chunk 0's x into workgroup buffer 0, a barrier, chunk 0's weight loads
        (:meth:`load_chunk_weights` of rows ``nrows``); where C > 1, an ``scf.for`` over
        ``c`` = 0 .. C - 2 whose iter_args are ``na`` f32 accumulators (zero at first) and
        the weight values of chunk ``c``. Each iteration issues chunk ``c + 1``'s weight
        loads, then ``body(accs, raw, cur, nxt, kn)`` emits the rest: chunk ``c``'s mma's
        (accumulators ``accs``, weight values ``raw``, x from buffer ``cur`` = ``c & 1``)
        and chunk ``kn`` = ``c + 1``'s x into buffer ``nxt``; it returns the new
        accumulators, yielded with the next weights. Accumulators are flat lists of f32
        names. Returns ``(accs, raw, buf)``: the accumulators and the last chunk's weight
        values after the loop, and the last chunk's x buffer (``(C - 1) & 1``)."""
        d, e = self.d, self.e
        C = d.per_block // d.U
        zero = self.c(0.0, "f32")
        with self.se.scope():
            self.store_chunk_frags(self.load_chunk(self.c(0)), self.c(0))
        e.raw("gpu.barrier")
        raw = self.load_chunk_weights(self.c(0), nrows)
        accs = [zero] * na
        if C > 1:
            rtypes = self.raw_types() * (d.U * len(nrows))
            names = [e.name() for _ in range(na + len(raw))]
            res = e.name()
            types = ", ".join(["f32"] * na + rtypes)
            inits = accs + raw
            e.raw(f"{res}:{len(names)} = scf.for %kc = {self.c(0)} to {self.c(C - 1)} "
                  f"step {self.c(1)} iter_args("
                  f"{', '.join(f'{n} = {v}' for n, v in zip(names, inits))}) -> ({types}) {{")
            with self.se.scope():
                cur = self.op(f"arith.andi %kc, {self.c(1)} : index")
                nxt = self.op(f"arith.xori {cur}, {self.c(1)} : index")
                kn = self.add("%kc", 1)
                raw_next = self.load_chunk_weights(kn, nrows)
                accs = body(names[:na], names[na:], cur, nxt, kn)
                e.raw(f"scf.yield {', '.join(accs + raw_next)} : {types}")
            e.raw("}")
            out = [f"{res}#{i}" for i in range(len(names))]
            accs, raw = out[:na], out[na:]
        return accs, raw, self.c((C - 1) & 1)

    def _k_loop(self, nrows: list) -> list:
        """The block's C chunks of U K steps (:meth:`_pipelined_chunks`): chunk 0's x
        fragments go to workgroup buffer 0 and its weight loads are issued before the loop;
        iteration ``c`` (of C - 1) issues chunk ``c + 1``'s weight loads and x loads, runs
        chunk ``c``'s mma's (weights carried in registers from the iteration before, x
        fragments from buffer ``c & 1``), stores chunk ``c + 1``'s fragments into the other
        buffer, then one barrier; the last chunk's mma's follow the loop, then one more
        barrier before the stores. So a chunk's weight loads are in flight during the
        previous chunk's mma's. Returns the accumulators ``[i][j]`` (4 f32 names each)."""
        d, e = self.d, self.e

        def nest(flat: list) -> list:
            it = iter(flat)
            return [[[next(it) for _ in range(4)] for _ in range(d.NT)] for _ in range(d.MT)]

        def body(accs, raw, cur, nxt, kn):
            if ABLATE in ("no_x", "stream"):
                accs = self.chunk_mma(nest(accs), raw, self.c(0))
            else:
                xraw = self.load_chunk(kn)
                accs = self.chunk_mma(nest(accs), raw, cur)
                self.store_chunk_frags(xraw, nxt)
                e.raw("gpu.barrier")
            return [a for r in accs for c in r for a in c]
        accs, raw, last = self._pipelined_chunks(nrows, d.MT * d.NT * 4, body)
        accs = self.chunk_mma(nest(accs), raw, last)
        # one barrier before the stores: without it ptxas interleaves the first tiles'
        # stores with the last mma's, 5-17 % slower on SmolLM2's one-chunk slices (H100)
        e.raw("gpu.barrier")
        return accs

    def _store(self, accs: list, bz: str | None) -> None:
        """Each accumulator to its element of y through the epilogue (split-K: to the
        partials), guarded by row < M and column < N."""
        m, d = self.m, self.d
        op = G.MMA_SYNC
        part0 = self.mul(bz, m.M * m.N) if bz else None
        for i in range(d.MT):
            for j in range(d.NT):
                for q in range(4):
                    row = self.add(self.em_rows[i], op.row_off[q])
                    col = self.add(self.add(self.n0, self.em_cols[j]), op.col_off[q])
                    self.store_at(accs[i][j][q], row, col, part0,
                                  bool(m.M % 16 or 16 * (i + 1) > m.M), bool(m.N % d.BN))
        self.cur_acc = None

    def store_at(self, v: str, row: str, col: str, part0: str | None, check_row: bool,
                 check_col: bool) -> None:
        """Accumulator ``v`` as y[row, col] through the epilogue, or into the split-K
        partials of slice ``part0`` (its first element) when there is one; guarded by
        row < M where ``check_row`` and col < N where ``check_col``."""
        m, e, se = self.m, self.e, self.se
        conds = []
        if check_row:
            conds.append(self.op(f"arith.cmpi ult, {row}, {self.c(m.M)} : index"))
        if check_col:
            conds.append(self.op(f"arith.cmpi ult, {col}, {self.c(m.N)} : index"))
        if len(conds) == 2:
            conds = [self.op(f"arith.andi {conds[0]}, {conds[1]} : i1")]
        if conds:
            e.raw(f"scf.if {conds[0]} {{")
        if part0 is not None:
            at = self.add(part0, self.add(self.mul(row, m.N), col))
            e.raw(f"memref.store {v}, %part[{at}] : {self.part_t}")
        else:
            self.cur_acc = v
            with se.scope():
                for jj, (out, ot) in enumerate(zip(m.outs, m.out_ts)):
                    idx = G._coords(se, ot.shape, m.M, m.N, row, col)
                    se.store(se.value(out, idx), f"%o{jj}", ot, idx)
        if conds:
            e.raw("}")

    def _module_text(self, x_reads: set[str]) -> tuple[str, list[list], list]:
        e, d = self.e, self.d
        params, slots, consts, reduce, rslots = self._launch_params(
            x_reads, " {llvm.noalias, llvm.readonly}", d.S)
        sig = ", ".join(f"{a}: {b}" for a, b in params)
        # %xs: a workgroup attribution, or dynamic workgroup memory (its launch's shared)
        dyn = self.dynamic_xs
        wg = "" if dyn else f" workgroup(%xs: {self.xs_t} {WG_ALIGN})"
        pre = f"    %xs = gpu.dynamic_shared_memory : {self.xs_t}\n" if dyn else ""
        text = (f"gpu.module @poot_gemm {{\n"
                f"  gpu.func @gemm({sig}){wg} "
                f"kernel attributes {{known_block_size = array<i32: {d.T}, 1, 1>}} {{\n"
                f"{pre}{e.k.text()}\n    gpu.return\n  }}\n{reduce}}}\n")
        return text, [slots] + ([rslots] if reduce else []), consts


def takes(m: GemvMatch, caps) -> str | None:
    """The weight format when this strategy takes match ``m`` on ``caps`` (rows the GEMV
    leaves to a GEMM, :func:`~.matmul_match.gemm_rows`, up to :data:`MAX_M`; one weight of
    :data:`FORMATS`; K a multiple of 32; no folded norm; ``mma.sync``), else None."""
    if G.matrix_op(caps) is not G.MMA_SYNC or G.EMULATE_MMA is not None:
        return None
    if m.prologue or len(m.weights) != 1 or m.idx is not None or m.M > MAX_M or \
            m.K % KSTEP or not gemm_rows(m):
        return None
    return fmt_of(m)


def gemm_decode(fn: ir.Operation, caps) -> Synthesized | None:
    """Decode GEMM regions (see the module doc); None for anything else."""
    if not G._x_without_reductions(fn):
        return None
    m = match(fn, gemv_only=False)
    if m is None:
        return None
    fmt = takes(m, caps)
    if fmt is None:
        return None
    cores = max(1, int(getattr(caps, "cores", 1) or 1))
    d = decode_tiling(m.M, m.N, m.K, cores, m.weight.nbytes)
    try:
        text, slots, consts = _DecodeKernel(m, d, fn, fmt).kernel()
    except ScalarUnsupported:
        return None
    launches = [Launch("kernel", slots[0], "poot_gemm", "gemm",
                       (-(-m.N // d.BN), 1, d.S), (d.T, 1, 1))]
    if d.S == 1:
        return Synthesized(text, launches, consts=consts)
    launches.append(Launch("kernel", slots[1], "poot_gemm", "gemm_reduce",
                           (-(-m.M * m.N // G.REDUCE_T), 1, 1), (G.REDUCE_T, 1, 1)))
    return Synthesized(text, launches, consts=consts,
                       scratch=[(f"memref<{d.S * m.M * m.N}xf32>", d.S * m.M * m.N * 4)])


__all__ = ["BLOCKS_PER_CORE", "FORMATS", "KSTEP", "MAX_M", "DecodeTiling", "decode_tiling",
           "fmt_of", "gemm_decode", "lane_ks", "takes", "weight_type"]
