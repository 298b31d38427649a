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

K is split three ways: ``KW`` warps of a block take consecutive quarters of the block's K
range and add their accumulators through workgroup memory in warp order; grid z cuts K into
``S`` slices whose partials a second kernel sums in slice order (the tiled GEMM's reduction,
:meth:`.gemm._GemmKernel.reduce_kernel`); no atomics, so results do not depend on scheduling.
:func:`decode_tiling` picks ``MT, NT, KW, S`` and the unroll ``U`` (K steps whose loads are
issued together) from M, N, K and the compute units.
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
    kernel_params,
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
#: most n-tiles a warp owns (each K step's x fragments are reused over them)
MAX_NT = 4
#: blocks per compute unit the grid aims for (KW warps each), with the K splits below
BLOCKS_PER_CORE = 4
#: split-K: most slices, fewest K steps per warp
MAX_SPLIT, MIN_WARP_STEPS = 16, 2
#: split-K partials (S x M x N f32, written once and read once, mostly from L2) may take up to
#: half the weight's bytes, or this many (a small weight is latency-bound, not bandwidth-bound)
L2_PARTIALS = 4 << 20


@dataclass(frozen=True)
class DecodeTiling:
    """``MT`` 16-row m-tiles (all of M), ``NT`` 8-column n-tiles per warp, ``KW`` warps per
    block splitting its K range, ``S`` split-K slices (grid z), ``U`` K steps per unrolled
    loop iteration; ``per_warp`` K steps of 32 per warp."""

    MT: int
    NT: int
    KW: int
    S: int
    U: int
    per_warp: int

    @property
    def BN(self) -> int:
        """Columns per block."""
        return 8 * self.NT

    @property
    def T(self) -> int:
        return 32 * self.KW


def _largest_divisor(n: int, at_most: int) -> int:
    return max(d for d in range(1, max(1, at_most) + 1) if n % d == 0)


def decode_tiling(M: int, N: int, K: int, cores: int, weight_bytes: int) -> DecodeTiling:
    """The tiling of an [M, K] x [K, N] decode GEMM whose weight is ``weight_bytes`` bytes,
    ``K % 32 == 0``: MT = ceil(M / 16); NT as many n-tiles (<= 4) as keep MT * NT <= 16
    accumulator tiles (x's fragments serve NT weight rows), halved while the column blocks
    would not give half the compute units one; KW = 4 warps per block over K
    (2 or 1 when K has too few steps); S split-K slices so that the grid has
    :data:`BLOCKS_PER_CORE` blocks per compute unit (at most :data:`MAX_SPLIT`, each warp
    keeping :data:`MIN_WARP_STEPS` K steps, and the partials, S * M * N f32, under half the
    weight's bytes or :data:`L2_PARTIALS`, and :data:`~.gemm.MAX_SPLIT_SCRATCH`), dividing the steps evenly; U = 4
    K steps a loop iteration (2 with more than 8 tiles: registers)."""
    MT = -(-M // 16)
    NT = max(1, min(MAX_NT, MAX_TILES // MT, -(-N // 8)))
    while NT > 1 and -(-N // (8 * NT)) < cores // 2:
        NT //= 2                # a narrow weight: more blocks rather than fewer x reads
    KT = K // KSTEP
    KW = next((kw for kw in (4, 2) if KT % kw == 0 and KT // kw >= MIN_WARP_STEPS), 1)
    blocks = -(-N // (8 * NT))
    want = -(-BLOCKS_PER_CORE * cores // blocks)
    cap = min(MAX_SPLIT, KT // (KW * MIN_WARP_STEPS),
              max(weight_bytes // 2, L2_PARTIALS) // (4 * M * N),
              G.MAX_SPLIT_SCRATCH // (4 * M * N))
    S = _largest_divisor(KT // KW, min(want, cap)) if cap >= 2 and want >= 2 else 1
    per = KT // (KW * S)
    U = min(per, 4 if MT * NT <= 8 else 2)
    return DecodeTiling(MT, NT, KW, S, U, per)


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


class _DecodeKernel(G._GemmKernel):
    """Emits the kernel of a :class:`DecodeTiling` (module doc); the tiled GEMM's helpers,
    split-K partials and reduction kernel."""

    def __init__(self, m: GemvMatch, d: DecodeTiling, fn: ir.Operation, fmt: str):
        t = G.Tiling(16 * d.MT, d.BN, 1, 1, KSTEP)
        super().__init__(m, t, False, fn, d.S)
        self.d, self.fmt = d, fmt
        self.bf16 = fmt == "bf16"
        self.KT = m.K // KSTEP
        self.KTS = self.KT // d.S
        w = m.weight
        if fmt in ("bf16", "f16"):
            self.wtype = f"memref<{m.N * m.K}xi16>"
        elif fmt == "q4_1":
            self.wtype = f"memref<{w.nbytes // 4}xi32>"
        else:
            self.wtype = f"memref<{w.nbytes // 2}xi16>"
        self.red_t = f"memref<{d.KW}x{d.MT * d.NT * 4}x32xf32, {G._WG}>"

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

    def x_vals(self, row: str, step: str) -> list[list[str]]:
        """x[row, k] at the lane's k of K step ``step``: ``[mma 0's four, mma 1's four]``
        (:func:`lane_ks`)."""
        m = self.m
        kb = self.mul(step, KSTEP)
        out = []
        for s in (0, 1):
            k0 = self.add(kb, self.xoff[s])
            if m.x_arg is None:                 # an expression: element by element
                out.append([self.se.value(m.x, (row, self.add(k0, i))) for i in range(4)])
                continue
            at = self.add(self.mul(row, m.K), k0)
            v = self.op(f"vector.load %x[{at}] {{alignment = 16 : i64}} : {self.xtype}, "
                        "vector<4xf32>")
            out.append([self.op(f"vector.extract {v}[{i}] : f32 from vector<4xf32>")
                        for i in range(4)])
        return out

    # -- the kernel
    def kernel(self) -> tuple[str, list[list], list]:
        m, e, fn, d = self.m, self.e, self.fn, self.d
        nargs = len(fn.regions[0].blocks[0].arguments)
        self.cur_acc = None
        self.se = ArgsSeenEmitter(fn, e.k, [f"%e{i}" for i in range(nargs)],
                                  provide=self._provide)
        tid = e.op("gpu.thread_id x")
        warp = e.op(f"arith.divui {tid}, {self.c(32)} : index")
        lane = e.op(f"arith.remui {tid}, {self.c(32)} : index")
        g = e.op(f"arith.shrui {lane}, {self.c(2)} : index")
        self.t1 = e.op(f"arith.andi {lane}, {self.c(3)} : index")
        self.t8 = self.mul(self.t1, 8)
        q4 = self.fmt in ("q4_0", "q4_1")
        self.xoff = [self.mul(self.t1, 4), self.add(self.mul(self.t1, 4), 16)] if q4 else \
            [self.t8, self.add(self.t8, 4)]
        self.m0 = self.c(0)
        self.n0 = self.mul(e.op("gpu.block_id x"), d.BN)
        nrows = [self.minu(self.add(self.add(self.n0, 8 * j), g), m.N - 1)
                 for j in range(d.NT)]
        xrows = [self.minu(self.add(g, 16 * i + h), m.M - 1)
                 for i in range(d.MT) for h in (0, 8)]
        bz = e.op("gpu.block_id z") if d.S > 1 else None
        first = self.add(self.mul(bz, self.KTS) if bz else self.c(0), self.mul(warp, d.per_warp))
        accs = self._k_loop(first, nrows, xrows)
        x_reads = set(self.se.seen)
        accs = self._warp_sum(accs, warp, lane)
        # accumulator rows and columns (mma C fragment: row g (+8), column 2t (+1))
        self.em_rows = [self.add(g, 16 * i) for i in range(d.MT)]
        self.em_cols = [self.add(self.mul(self.t1, 2), 8 * j) for j in range(d.NT)]
        if d.KW > 1:
            is0 = e.op(f"arith.cmpi eq, {warp}, {self.c(0)} : index")
            e.raw(f"scf.if {is0} {{")
        self._store(accs, bz)
        if d.KW > 1:
            e.raw("}")
        return self._module_text(x_reads)

    def _k_loop(self, first: str, nrows: list, xrows: list) -> list:
        """The warp's K steps ``first .. first + per_warp``: U steps an iteration (every
        weight load of them issued first), the rest after the loop; the accumulators
        ``[i][j]`` (4 f32 names each)."""
        d, e = self.d, self.e
        na = d.MT * d.NT * 4
        zero = self.c(0.0, "f32")
        main = d.per_warp - d.per_warp % d.U
        accs = [[[zero] * 4 for _ in range(d.NT)] for _ in range(d.MT)]
        if main:
            names = [e.name() for _ in range(na)]
            res = e.name()
            f32s = ", ".join(["f32"] * na)
            e.raw(f"{res}:{na} = scf.for %ks = {self.c(0)} to {self.c(main)} step "
                  f"{self.c(d.U)} iter_args({', '.join(f'{n} = {zero}' for n in names)}) "
                  f"-> ({f32s}) {{")
            with self.se.scope():
                it = iter(names)
                accs = [[[next(it) for _ in range(4)] for _ in range(d.NT)]
                        for _ in range(d.MT)]
                steps = [self.add(self.add(first, "%ks"), u) for u in range(d.U)]
                accs = self._steps(steps, nrows, xrows, accs)
                flat = [a for r in accs for c in r for a in c]
                e.raw(f"scf.yield {', '.join(flat)} : {f32s}")
            e.raw("}")
            it = iter(range(na))
            accs = [[[f"{res}#{next(it)}" for _ in range(4)] for _ in range(d.NT)]
                    for _ in range(d.MT)]
        rest = [self.add(first, s) for s in range(main, d.per_warp)]
        if rest:
            with self.se.scope():
                accs = self._steps(rest, nrows, xrows, accs)
        return accs

    def _steps(self, steps: list, nrows: list, xrows: list, accs: list) -> list:
        """K steps ``steps``: the weight loads of all of them, then per step the x
        fragments of each m-tile and the 2 x MT x NT mma's."""
        raws = [[self.load_weight(n, s) for n in nrows] for s in steps]
        for s, raw in zip(steps, raws):
            B = [self.weight_regs(r) for r in raw]          # [j][mma][reg]
            for i in range(self.d.MT):
                top = self.x_vals(xrows[2 * i], s)
                bot = self.x_vals(xrows[2 * i + 1], s)
                for q in (0, 1):
                    A = [self.pack(top[q][0], top[q][1]), self.pack(bot[q][0], bot[q][1]),
                         self.pack(top[q][2], top[q][3]), self.pack(bot[q][2], bot[q][3])]
                    accs[i] = [self.mma(A, B[j][q], accs[i][j]) for j in range(self.d.NT)]
        return accs

    def _warp_sum(self, accs: list, warp: str, lane: str) -> list:
        """The KW warps' accumulators added in warp order (through workgroup memory);
        warp 0's result (every warp computes it; only warp 0 stores)."""
        d, e = self.d, self.e
        if d.KW == 1:
            return accs
        flat = [a for r in accs for c in r for a in c]
        notfirst = e.op(f"arith.cmpi ne, {warp}, {self.c(0)} : index")
        e.raw(f"scf.if {notfirst} {{")
        for a, v in enumerate(flat):
            e.raw(f"memref.store {v}, %red[{warp}, {self.c(a)}, {lane}] : {self.red_t}")
        e.raw("}")
        e.raw("gpu.barrier")
        out = []
        for a, v in enumerate(flat):
            for w in range(1, d.KW):
                v = e.fadd(v, self.op(f"memref.load %red[{self.c(w)}, {self.c(a)}, {lane}] : "
                                      f"{self.red_t}"))
            out.append(v)
        it = iter(out)
        return [[[next(it) for _ in range(4)] for _ in range(d.NT)] for _ in range(d.MT)]

    def _store(self, accs: list, bz: str | None) -> None:
        """Each accumulator to its element of y through the epilogue (split-K: to the
        partials), guarded by row < M and column < N."""
        m, e, se, d = self.m, self.e, self.se, self.d
        op = G.MMA_SYNC
        part0 = self.mul(bz, m.M * m.N) if bz else None
        for i in range(d.MT):
            for j in range(d.NT):
                for q in range(4):
                    row = self.add(self.em_rows[i], op.row_off[q])
                    col = self.add(self.add(self.n0, self.em_cols[j]), op.col_off[q])
                    conds = []
                    if m.M % 16 or 16 * (i + 1) > m.M:
                        conds.append(self.op(f"arith.cmpi ult, {row}, {self.c(m.M)} : index"))
                    if m.N % d.BN:
                        conds.append(self.op(f"arith.cmpi ult, {col}, {self.c(m.N)} : index"))
                    if len(conds) == 2:
                        conds = [self.op(f"arith.andi {conds[0]}, {conds[1]} : i1")]
                    if conds:
                        e.raw(f"scf.if {conds[0]} {{")
                    v = accs[i][j][q]
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
        self.cur_acc = None

    def _module_text(self, x_reads: set[str]) -> tuple[str, list[list], list]:
        m, e, se, d = self.m, self.e, self.se, self.d
        ro = " {llvm.noalias, llvm.readonly}"
        params, slots = kernel_params(self.fn, m, se, x_reads, ro, ("%x", self.xtype),
                                      [("%w", self.wtype)])
        consts = list(se.consts)
        reduce = ""
        if d.S > 1:                                 # the partials instead of the results
            n_out = len(m.outs)
            params, slots = params[:-n_out] + [("%part", self.part_t)], \
                slots[:-n_out] + [("scratch", 0)]
            reduce, rslots, rconsts = self.reduce_kernel(len(consts))
            consts += rconsts
        sig = ", ".join(f"{a}: {b}" for a, b in params)
        wg = f" workgroup(%red: {self.red_t} {WG_ALIGN})" if d.KW > 1 else ""
        text = (f"gpu.module @poot_gemm {{\n"
                f"  gpu.func @gemm({sig}){wg} "
                f"kernel attributes {{known_block_size = array<i32: {d.T}, 1, 1>}} {{\n"
                f"{e.k.text()}\n    gpu.return\n  }}\n{reduce}}}\n")
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
           "fmt_of", "gemm_decode", "lane_ks", "takes"]
