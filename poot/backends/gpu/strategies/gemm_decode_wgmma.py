"""Decode GEMM on Hopper's warpgroup MMA (sm_90a ``wgmma.mma_async``): the regions the
``mma.sync`` decode GEMM (:mod:`.gemm_decode`) takes, on targets with the ``sm_90a``
feature, computed as ``y^T = W x^T`` so that the weight's output features are the
instruction's M (64 a warpgroup) and the batch's rows its N (M of the GEMM rounded up to 8:
one ``m64nNk16`` a warpgroup covers every row of x at once).

Why: the ``mma.sync`` kernel spends as long issuing m16n8k16 tiles and reading their A
fragments back from workgroup memory as it does streaming the weight (its ablation in
``bench/results/decode_gemm.md``: 28 us as built, 15 us for the weight stream alone, where
cuBLAS's wgmma kernels take 15). One ``wgmma`` multiplies a warpgroup's 64 weight rows by all
of x's rows from a workgroup-memory descriptor, asynchronously: four warps issue one
instruction a 16-k step instead of ``MT x NT x 4`` per warp, and x's fragments are never
loaded into registers.

Operands (PTX ISA, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate"):

* A (the weight, 64 rows x 16 k) in registers: warp ``w`` of the warpgroup holds rows
  ``16 w ..``, lane ``(g, t)`` registers ``a0 a1 a2 a3`` = rows ``g``, ``g + 8`` at the
  instruction's k ``2t, 2t + 1`` (a0, a1), then ``2t + 8, 2t + 9`` (a2, a3): the m16n8k16 A
  layout, each warp a quarter of M. The lanes load the weight as :mod:`.gemm_decode` does
  (16 bytes of a dense row, a packed block's quant word; :func:`~.gemm_decode.lane_ks`), so
  the instruction's k ``2t + lo`` (``+ 8 hi``) of mma ``s`` of a 32-k step is the step's k
  ``lane_ks(fmt, t, s)[2 hi + lo]``.
* B (x^T, 16 k x N) in workgroup memory, K-major, the canonical layout without swizzling:
  8 x 16-byte core matrices (8 rows of x, 8 k each), the two k halves 128 bytes apart (the
  descriptor's leading byte offset, :data:`LBO`), groups of 8 rows 256 bytes apart (its
  stride byte offset, :data:`SBO`). The block stages x there in the permuted k order above,
  rounded to the mma type (bf16 for bf16 weights, else f16), double-buffered by chunks of
  ``U`` 32-k steps.
* D: ``N / 2`` f32 accumulators a thread: for each 8-row tile ``j`` of x, (weight row ``16 w
  + g``, x rows ``8 j + 2 t``, ``+ 1``), then weight row ``+ 8``.

Each chunk: the lanes' next weight loads and x loads are issued, this chunk's A registers
built from the weight words carried from the iteration before, ``wgmma.fence``, the chunk's
``2 U R`` wgmma's, ``commit_group``; the next chunk's x stored in the other buffer (then
``fence.proxy.async``: the wgmma's read workgroup memory through the async proxy);
``wait_group 0``; a barrier. Registers handed to or taken from the asynchronous instruction
pass through empty ``asm volatile`` statements (as CUTLASS's ``warpgroup_fence_operand``):
LLVM then cannot move their definitions past the fence or their uses before the wait.

Dense weights through a ring (:attr:`WgmmaTiling.stages` > 0, bf16/f16 weights; only under
:data:`FORCE_STAGES`: planning does not take it, measured slower, see
:func:`wgmma_tiling`): the register path above keeps one chunk of weights in flight a block
and waits for it every chunk, so at M = 64-128 it streams the 1B's projections at 1.0-1.4
TB/s where cuBLAS's TMA-fed kernels reach 2.2 (``bench/results/decode_gemm.md``); the ring
was built to keep many chunks in flight instead. Here both operands come from
workgroup memory through matrix descriptors: the block's threads copy each chunk's weight
tiles and x's packed image (16 bytes a ``cp.async.cg``, L1 bypassed) into slot ``c % stages``
of a ring, chunks ``c + 1 .. c + stages - 1`` in flight while chunk ``c``'s wgmma's run.
The weight tile of mma ``s`` of step ``u`` (64 rows x 16 k a warpgroup) has the B tiles'
canonical K-major layout (:func:`a_unit`: core matrices of 8 rows x 16 bytes, k halves
:data:`LBO` apart, 8-row groups :data:`SBO` apart), so its descriptor is a B descriptor at
the tile's address; its k are in natural order, and so are x's (the packing kernel's
``natural`` image, :func:`natural_pair`). A chunk's copies are dealt so that the 8 lanes of
a workgroup-memory phase write one core matrix (8 rows, the same 16 bytes of k): 128
consecutive bytes, no bank conflict; a warp reads 64 consecutive bytes of 8 weight rows.
The first ``stages - 1`` chunks' weight copies are issued before the kernel's grid
dependency wait (the weights are the step's constants), x's after it. Each iteration:
``cp.async.wait_group stages - 2`` (this thread's copies of chunk ``c``
landed), ``fence.proxy.async`` (the wgmma's read through the async proxy), a barrier (every
thread's copies landed; every warpgroup done with chunk ``c - 1``), the copies of chunk
``c + stages - 1`` into the slot chunk ``c - 1`` freed and a ``commit_group`` (empty past
the last chunk: the group count stays uniform), then chunk ``c``'s wgmma's, committed and
waited for.

Split-K, the epilogue and the reduction kernel are :mod:`.gemm_decode`'s (the tiled GEMM's).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from mlir import ir

from poot.backends.gpu.kernels import Launch
from poot.backends.gpu.strategies import gemm as G
from poot.backends.gpu.strategies import gemm_decode as D
from poot.backends.gpu.strategies.emit import ArgsSeenEmitter, ScalarUnsupported, Synthesized
from poot.backends.gpu.strategies.matmul_match import GemvMatch, match

#: the target feature naming sm_90a's arch-specific instructions (``wgmma``, PTX ``.target
#: sm_90a``; :func:`poot.backends.cuda.codegen.cuda_target` gives it on sm_90)
FEATURE = "sm_90a"
#: bytes of one workgroup buffer of x fragments (two are used): U * N * 64 <= this
X_BUF_BYTES = 16 << 10
#: most K steps (of 32) a chunk
MAX_U = 4
#: the B descriptor's byte offsets: between the two k halves of a core-matrix pair (leading
#: dimension, K), between groups of 8 rows of x (stride dimension, N)
LBO, SBO = 128, 256
#: accumulators a thread may keep (R row tiles x N / 2)
MAX_ACCS = 64
#: check hook, never set by product code: :func:`b_descriptor` exchanges its two byte
#: offsets (the staged layout unchanged), so that a device check (the ``swap`` variant of
#: bench/gpu_run/gemm_decode_check.py and decode_gemm_sweep.py) can show the fields matter;
#: those scripts set it around building a case and restore it
SWAP_DESC = False
#: benchmarks: ``(R, WG, S, U)`` to use instead of :func:`wgmma_tiling`'s
FORCE_TILING: tuple[int, int, int, int] | None = None
#: benchmarks: x packed by a first kernel (:attr:`WgmmaTiling.xpack`) or not, instead of the rule's
FORCE_XPACK: bool | None = None
#: threads a block of the packing kernel (one K step of one row of x each)
XPACK_T = 256
#: weights from which x is packed first at Np > 64, 4x that at Np <= 64 (:func:`wgmma_tiling`)
XPACK_MIN_BYTES = 4 << 20
#: split-K partials (S * M * N f32) may take up to the weight's bytes or this many (the
#: mma.sync kernel's 4 MB kept SmolLM2's gate/up at M = 128 to 3 slices, 1.34x slower
#: than 9)
PARTIALS_BYTES = 8 << 20
#: most bytes of the ring of :attr:`WgmmaTiling.stages` chunks: dynamic workgroup memory
#: (``gpu.dynamic_shared_memory``, the launch's :attr:`~poot.backends.gpu.kernels.Launch.shared`),
#: of which sm_90 gives a block up to 227 KB
RING_BYTES = 192 << 10
#: most chunks in the ring
MAX_STAGES = 24
#: benchmarks: the ring's depth instead of the rule's (0: A in registers everywhere)
FORCE_STAGES: int | None = None
#: fewest rows of x this kernel takes: at M = 16 the mma.sync decode GEMM measured faster
#: (1.05-1.1x on the 1B's projections; sweep above), at 64 this one
MIN_M = 33


@dataclass(frozen=True)
class WgmmaTiling:
    """``WG`` warpgroups a block (sharing its x buffers), each owning ``R`` tiles of 64
    weight rows; ``Np`` = M rounded up to 8 (the instruction's N); ``S`` split-K slices of
    ``per_block`` K steps of 32; ``U`` K steps a chunk (one workgroup buffer of x)."""

    Np: int
    R: int
    WG: int
    S: int
    U: int
    per_block: int
    #: x rounded and laid out once by a first kernel (:data:`XPACK_T` threads a block) as
    #: the B tiles of every K step (``Np * 64`` bytes a step, scratch 0), which the blocks
    #: then copy: half the bytes of x's f32 rows, no rounding a block
    xpack: bool = False
    #: dense weights: A from workgroup memory through a ring of this many chunks of the
    #: weight's tiles and x's image (module doc, "Dense weights through a ring"); 0: A in
    #: registers
    stages: int = 0

    @property
    def BN(self) -> int:
        """Weight rows (columns of y) a block."""
        return 64 * self.R * self.WG

    @property
    def T(self) -> int:
        return 128 * self.WG

    @property
    def tile16(self) -> int:
        """16-byte rows of one mma's B tile (16 k x Np, 32 Np bytes)."""
        return 2 * self.Np

    @property
    def rows16(self) -> int:
        """16-byte rows of one chunk's buffer (U steps x 2 mma's)."""
        return 2 * self.U * self.tile16

    @property
    def w_units(self) -> int:
        """16-byte units of one chunk's weight tiles in the ring (U steps x 2 mma's x R WG
        tiles of 64 rows x 16 k)."""
        return 2 * self.U * self.R * self.WG * 128

    @property
    def slot_units(self) -> int:
        """16-byte units of one ring slot: the chunk's weight tiles, then its x image."""
        return self.w_units + self.rows16

    @property
    def ring_bytes(self) -> int:
        """Bytes of the ring (the launch's dynamic workgroup memory); 0 without one."""
        return 16 * self.stages * self.slot_units


def ring_stages(Np: int, R: int, WG: int, U: int) -> int:
    """The deepest ring (chunks, at most :data:`MAX_STAGES`) of a tiling whose slots fit in
    :data:`RING_BYTES`; below 2 no ring fits."""
    slot = WgmmaTiling(Np, R, WG, 1, U, U, True, 1).ring_bytes
    return min(MAX_STAGES, RING_BYTES // slot)


def a_unit(row: int, j: int, R: int, WG: int) -> int:
    """16-byte unit, in a ring slot, of the weight's 8 k ``8 j ..`` (``j`` < 4 U: chunk-local,
    natural order) of the block's row ``row``: the tile of mma ``s = (j >> 1) & 1`` of step
    ``u = j >> 2`` for the row's 64-row tile, then the canonical K-major layout (8-row
    groups :data:`SBO` apart, k halves ``h = j & 1`` :data:`LBO` apart)."""
    return (((j >> 1) * R * WG + row // 64) * 128 + ((row % 64) // 8) * (SBO // 16)
            + (j & 1) * (LBO // 16) + row % 8)


def w_piece(p: int, U: int) -> tuple[int, int]:
    """``(row, j)`` of copy job ``p`` of a chunk's weight tiles: 8 consecutive jobs are 8
    consecutive rows' same 16 bytes (one core matrix: 128 consecutive bytes of the slot),
    the next 8 the next 16 bytes of k, 4 U of them a row's chunk."""
    return (p // (32 * U)) * 8 + p % 8, (p // 8) % (4 * U)


def natural_pair(t: int, s: int, hi: int) -> tuple[int, int]:
    """(4-k group of a 32-k step, element) of the low k of pair ``t`` of k half ``hi`` of
    mma ``s`` when k is in natural order: k = 16 s + 8 hi + 2 t."""
    k = 16 * s + 8 * hi + 2 * t
    return k // 4, k % 4


def wgmma_tiling(M: int, N: int, K: int, cores: int, weight_bytes: int,
                 dense: bool = False) -> WgmmaTiling:
    """The tiling of an [M, K] x [K, N] decode GEMM (``K % 32 == 0``, :data:`MIN_M` <= M <=
    128), fitted to an H100 sweep of every ``(R, WG, S, U, xpack)`` over the Llama-3.2-1B
    (bf16) and SmolLM2 (Q4_1) projections at M = 16, 64, 128 with the weights streamed from
    DRAM (``bench/gpu_run/decode_gemm_sweep.py``, ``bench/results/decode_gemm.md``):

    - Np = M rounded up to 8; R = 1 row tile a warpgroup (two measured no faster, with
      twice the accumulators);
    - WG = 2 warpgroups a block (128 weight rows sharing x) where the weight has at least
      8 such blocks, else 1;
    - x packed by a first kernel (:attr:`WgmmaTiling.xpack`) where the weight has at least
      :data:`XPACK_MIN_BYTES` at Np > 64, 4x that below (1.3-1.4x at M = 128 on the 1B's
      projections, 1.0-1.2x at M = 64 on its 16+ MB ones; on smaller weights the extra
      launch costs more than it saves);
    - U = 2 K steps a chunk with x rounded a block; packed: 1 at Np > 64, else
      :data:`MAX_U`; at most x's buffer's;
    - S split-K slices: the fewest that give the grid about two blocks a compute unit at
      Np <= 64, one above (the sweep's fastest), at most :data:`~.gemm_decode.MAX_SPLIT`, each of at least
      :data:`~.gemm_decode.MIN_BLOCK_STEPS` steps, the partials (S * M * N f32) under the
      weight's bytes or :data:`PARTIALS_BYTES`, dividing the K steps (slices of whole
      chunks preferred); U then divides a slice's steps.

    ``dense`` (16-bit weights stored [N, K]): A stays in registers. The ring
    (:attr:`WgmmaTiling.stages`, module doc) is taken only when :data:`FORCE_STAGES` > 0
    (benchmarks): on an H100 it was 1.0-1.5x slower than A in registers at every 1B
    projection and M in 32..128 but one (the gate/up at M = 128: 27.4 against 32.5 us
    alone), and inside the 1B's decode step even there it made the step slower (B = 128:
    23.9k against 27.2k tok/s; ``bench/results/decode_gemm.md``)."""
    Np = -(-M // 8) * 8
    KT = K // D.KSTEP
    u_max = max(1, min(MAX_U, X_BUF_BYTES // (64 * Np)))
    if FORCE_TILING is not None:
        R, WG, S, U = FORCE_TILING
        st = FORCE_STAGES if dense and FORCE_STAGES else 0
        return WgmmaTiling(Np, R, WG, S, U, KT // S, bool(FORCE_XPACK) or st > 0, st)
    if dense and FORCE_STAGES:          # the sweep's fastest ring shape, FORCE_STAGES deep
        S = _split(M, N, KT, 2, 1, cores, weight_bytes, Np)
        if (KT // S) % 2 == 0:
            return WgmmaTiling(Np, 1, 1, S, 2, KT // S, True, FORCE_STAGES)
    WG = 2 if -(-N // 128) >= 8 else 1
    xpack = weight_bytes >= (XPACK_MIN_BYTES if Np > 64 else 4 * XPACK_MIN_BYTES) \
        if FORCE_XPACK is None else FORCE_XPACK
    U = min(u_max, (1 if Np > 64 else MAX_U) if xpack else 2)
    S = _split(M, N, KT, U, WG, cores, weight_bytes, Np)
    per = KT // S
    return WgmmaTiling(Np, 1, WG, S, D._largest_divisor(per, U), per, xpack)


def _split(M: int, N: int, KT: int, U: int, WG: int, cores: int, weight_bytes: int,
           Np: int) -> int:
    """:func:`wgmma_tiling`'s split-K slices (its doc)."""
    blocks = -(-N // (64 * WG))
    smax = max(1, min(D.MAX_SPLIT, KT // D.MIN_BLOCK_STEPS))
    cap = min(smax, max(weight_bytes, PARTIALS_BYTES) // (4 * M * N),
              G.MAX_SPLIT_SCRATCH // (4 * M * N))
    want = 0.95 * cores * (2 if Np <= 64 else 1)
    S = 1
    if cap >= 2 and blocks < want:
        ok = [s for s in range(1, cap + 1) if KT % s == 0]
        whole = [s for s in ok if (KT // s) % U == 0] or ok
        enough = [s for s in whole if blocks * s >= want]
        S = min(enough) if enough else max(whole)
    return S


def b_offset(Np: int, n: int, k: int) -> int:
    """Byte offset of x row ``n``, instruction k ``k`` (0..15) in one mma's B tile: the
    canonical K-major layout without swizzling (module doc)."""
    return (n // 8) * SBO + (k // 8) * LBO + (n % 8) * 16 + (k % 8) * 2


def b_descriptor(addr: int) -> int:
    """The wgmma matrix descriptor of a B tile at workgroup byte address ``addr`` (PTX ISA,
    "Matrix Descriptor Format": start address >> 4 in bits 0-13, the leading byte offset
    >> 4 in 16-29, the stride byte offset >> 4 in 32-45, no swizzle)."""
    lbo, sbo = (SBO, LBO) if SWAP_DESC else (LBO, SBO)
    return ((addr & 0x3FFFF) >> 4) | ((lbo >> 4) << 16) | ((sbo >> 4) << 32)


def x_quad(fmt: str, t: int, s: int) -> int:
    """Which 4-k group of a 32-k step (x's float4 number) lane ``t``'s k of mma ``s`` are
    (:func:`~.gemm_decode.lane_ks`: four consecutive k)."""
    return D.lane_ks(fmt, t, s)[0] // 4


class _WgmmaKernel(D._DecodeKernel):
    """Emits the kernel of a :class:`WgmmaTiling` (module doc): the weight loads and their
    decoding, x's loads and the epilogue are :class:`~.gemm_decode._DecodeKernel`'s."""

    def __init__(self, m: GemvMatch, d: WgmmaTiling, fn: ir.Operation, fmt: str):
        G._GemmKernel.__init__(self, m, G.Tiling(d.Np, d.BN, 1, 4 * d.WG, D.KSTEP), False, fn,
                               d.S)
        self.d, self.fmt = d, fmt
        self.bf16 = fmt == "bf16"
        self.KT = m.K // D.KSTEP
        self.KTS = self.KT // d.S
        self.wtype = D.weight_type(m, fmt)
        self.xs_t = f"memref<2x{d.rows16}x4xi32, {G._WG}>"
        #: the packed x image (:attr:`WgmmaTiling.xpack`): every K step's two B tiles
        self.xi_t = f"memref<{self.KT * 2 * d.tile16}x4xi32>"
        self.ity = "bf16" if self.bf16 else "f16"

    # -- inline PTX
    def asm(self, text: str) -> None:
        self.e.raw(f'llvm.inline_asm has_side_effects "{text}", "" : () -> ()')

    def pin(self, v: str, ty: str) -> str:
        """``v`` through an empty volatile asm: its definition stays before, its uses after,
        the asm statements around it."""
        c = "f" if ty == "f32" else "r"
        return self.op(f'llvm.inline_asm has_side_effects "", "={c},0" {v} : ({ty}) -> {ty}')

    # -- x through workgroup memory
    def load_chunk(self, chunk: str) -> list:
        """This thread's jobs of chunk ``chunk``. Packed x: 16-byte rows of the chunk's
        image (``("img", row, value)``); else job ``u * Np + n`` loads x row n (clamped to M)
        at K step u, 32 f32 as 8 groups of 4 (``("x", u, n, values)``)."""
        m, d = self.m, self.d
        out = []
        if d.xpack:
            first = self.mul(self.add(self.kfirst, self.mul(chunk, d.U)), 2 * d.tile16)
            for job in self.jobs(d.rows16):
                v = self.op(f"vector.load %xi[{self.add(first, job)}, {self.c(0)}] "
                            f"{{alignment = 16 : i64}} : {self.xi_t}, vector<4xi32>")
                out.append(("img", job, v))
            return out
        for job in self.jobs(d.U * d.Np):
            u = self.op(f"arith.divui {job}, {self.c(d.Np)} : index")
            n = self.op(f"arith.remui {job}, {self.c(d.Np)} : index")
            row = self.minu(n, m.M - 1)
            k0 = self.add(self.first, self.mul(self.add(self.mul(chunk, d.U), u), D.KSTEP))
            out.append(("x", u, n, [self.x_vals(row, self.add(k0, 4 * q)) for q in range(8)]))
        return out

    def stage_row(self, u: str, n: str, v: list, store) -> None:
        """x row ``n`` of K step ``u`` (``v``: its 32 f32 in groups of 4), rounded to the mma
        type, as the four 16-byte rows it has in the B tiles of the step's two mma's (k
        halves 0 and 1): ``store(row16, value)`` each, rows counted from the step's first.
        The k order is the lanes' A registers' (:func:`x_quad`), or natural with the ring
        (:func:`natural_pair`)."""
        d = self.d
        grp = self.op(f"arith.shrui {n}, {self.c(3)} : index")
        r8 = self.op(f"arith.andi {n}, {self.c(7)} : index")
        base = self.add(self.add(self.mul(u, 2 * d.tile16), self.mul(grp, SBO // 16)), r8)
        for s in (0, 1):
            for hi in (0, 1):
                regs = []
                for t in range(4):
                    if d.stages:                    # the ring's A: k in natural order
                        quad, at = natural_pair(t, s, hi)
                        q = v[quad][at:at + 2]
                    else:                           # the lanes' A registers' order
                        q = v[x_quad(self.fmt, t, s)][2 * hi:2 * hi + 2]
                    regs.append(self.bits(self.pack(q[0], q[1])))
                w = self.op(f"vector.from_elements {', '.join(regs)} : vector<4xi32>")
                store(self.add(base, s * d.tile16 + hi * (LBO // 16)), w)

    def store_chunk_frags(self, raw: list, buf: str) -> None:
        """The jobs' x into workgroup buffer ``buf`` (:meth:`stage_row`, or the packed image's
        rows as they are), then the async-proxy fence."""
        def store(at, w):
            self.e.raw(f"vector.store {w}, %xs[{buf}, {at}, {self.c(0)}] "
                       f"{{alignment = 16 : i64}} : {self.xs_t}, vector<4xi32>")
        for job in raw:
            if job[0] == "img":
                store(job[1], job[2])
            else:
                self.stage_row(job[1], job[2], job[3], store)
        self.asm("fence.proxy.async.shared::cta;")

    def pack_kernel(self) -> str:
        """The packing kernel (``gpu.func @gemm_xpack``, :data:`XPACK_T` threads a block, one
        (K step, row of x) a thread): every K step's B tiles into the image ``%xi``, rows
        past M copies of row M - 1 (their products are never stored)."""
        m, d, e = self.m, self.d, self.e
        self.se = ArgsSeenEmitter(self.fn, e.k, [], provide=self._provide)
        job = self.add(self.mul(e.op("gpu.block_id x"), XPACK_T), e.op("gpu.thread_id x"))
        e.raw(f"scf.if {self.op(f'arith.cmpi ult, {job}, {self.c(self.KT * d.Np)} : index')} {{")
        st = self.op(f"arith.divui {job}, {self.c(d.Np)} : index")
        n = self.op(f"arith.remui {job}, {self.c(d.Np)} : index")
        row = self.minu(n, m.M - 1)
        v = [self.x_vals(row, self.add(self.mul(st, D.KSTEP), 4 * q)) for q in range(8)]

        def store(at, w):
            e.raw(f"vector.store {w}, %xi[{at}, {self.c(0)}] {{alignment = 16 : i64}} : "
                  f"{self.xi_t}, vector<4xi32>")
        self.stage_row(st, n, v, store)
        e.raw("}")
        return (f"  gpu.func @gemm_xpack(%x: {self.xtype} {{llvm.noalias, llvm.readonly}}, "
                f"%xi: {self.xi_t}) kernel attributes "
                f"{{known_block_size = array<i32: {XPACK_T}, 1, 1>}} {{\n"
                f"{e.k.text()}\n    gpu.return\n  }}\n")

    def _launch_params(self, x_reads, ro, splits):
        """:meth:`.gemm._GemmKernel._launch_params`, with packed x the image as one more
        parameter (scratch 0; the split-K partials then scratch 1)."""
        params, slots, consts, reduce, rslots = super()._launch_params(x_reads, ro, splits)
        if not self.d.xpack:
            return params, slots, consts, reduce, rslots
        shift = [("scratch", k + 1) if kind == "scratch" else (kind, k) for kind, k in slots]
        rslots = [("scratch", k + 1) if kind == "scratch" else (kind, k) for kind, k in rslots]
        return (params + [("%xi", self.xi_t + ro)], shift + [("scratch", 0)], consts, reduce,
                rslots)

    def descriptor(self, buf: str, u: int, s: int) -> str:
        """The B descriptor of mma ``s`` of step ``u`` in buffer ``buf``."""
        d = self.d
        off = self.add(self.mul(buf, d.rows16), (2 * u + s) * d.tile16)   # 16-byte units
        o64 = self.op(f"arith.index_cast {off} : index to i64")
        return self.op(f"arith.addi {self.desc0}, {o64} : i64")

    # -- the instruction
    def wgmma(self, acc: list, a: list | str, desc: str) -> list:
        """One ``wgmma.mma_async m64n{Np}k16`` (D += A B, B from descriptor ``desc``): A in
        registers (``a`` a list of 4) or from workgroup memory (``a`` its descriptor, K-major
        as B); the new accumulators (valid after :meth:`wait`)."""
        n = len(acc)
        ds = ", ".join(f"${i}" for i in range(n))
        if isinstance(a, str):
            a, a_text, a_cons, tail = [a], f"${n}", ["l"], "1, 1, 1, 0, 0"
        else:
            a_text, a_cons, tail = f"{{${n}, ${n + 1}, ${n + 2}, ${n + 3}}}", ["r"] * 4, \
                "1, 1, 1, 0"
        text = (f"wgmma.mma_async.sync.aligned.m64n{self.d.Np}k16.f32.{self.ity}.{self.ity} "
                f"{{{ds}}}, {a_text}, ${n + len(a)}, {tail};")
        cons = ",".join(["=f"] * n + a_cons + ["l"] + [str(i) for i in range(n)])
        st = f"!llvm.struct<({', '.join(['f32'] * n)})>"
        tys = ", ".join(["i64" if a_cons == ["l"] else "i32"] * len(a) + ["i64"] + ["f32"] * n)
        r = self.op(f'llvm.inline_asm has_side_effects "{text}", "{cons}" '
                    f'{", ".join(a + [desc] + acc)} : ({tys}) -> {st}')
        return [self.op(f"llvm.extractvalue {r}[{i}] : {st}") for i in range(n)]

    def chunk_mma(self, accs: list, raw: list, buf: str) -> list:
        """Issue the chunk's wgmma's: A registers from the weight words ``raw``
        (:meth:`load_chunk_weights`: step-major, then the lane's 2 R rows), B from buffer
        ``buf``; then ``commit_group``. Returns the accumulators, valid after :meth:`wait`."""
        d = self.d
        per = len(self.raw_types())
        nr = 2 * d.R
        W = [[self.weight_regs(raw[(u * nr + j) * per:(u * nr + j + 1) * per])
              for j in range(nr)] for u in range(d.U)]          # [u][row][mma][reg]
        A = {}
        for u in range(d.U):
            for r in range(d.R):
                lo, hi = W[u][2 * r], W[u][2 * r + 1]
                for s in (0, 1):
                    A[u, r, s] = [self.pin(self.bits(x), "i32")
                                  for x in (lo[s][0], hi[s][0], lo[s][1], hi[s][1])]
        self.asm("wgmma.fence.sync.aligned;")
        for u in range(d.U):
            for s in (0, 1):
                desc = self.descriptor(buf, u, s)
                accs = [self.wgmma(accs[r], A[u, r, s], desc) for r in range(d.R)]
        self.asm("wgmma.commit_group.sync.aligned;")
        return accs

    def wait(self, accs: list) -> list:
        """``wait_group 0``; the accumulators, pinned after it."""
        self.asm("wgmma.wait_group.sync.aligned 0;")
        return [[self.pin(v, "f32") for v in acc] for acc in accs]

    def _k_loop(self, nrows: list) -> list:
        """The block's C chunks, software-pipelined one chunk deep
        (:meth:`.gemm_decode._DecodeKernel._pipelined_chunks`); iteration ``c`` issues chunk
        ``c + 1``'s weight and x loads, chunk ``c``'s wgmma's, stores chunk ``c + 1``'s x into
        the other buffer while they run, waits for them, then one barrier. Returns the
        accumulators ``[r]`` (Np / 2 f32 names each)."""
        d = self.d
        na = d.Np // 2

        def rows(flat: list) -> list:
            return [flat[r * na:(r + 1) * na] for r in range(d.R)]

        def body(accs, raw, cur, nxt, kn):
            xraw = self.load_chunk(kn)
            accs = self.chunk_mma(rows(accs), raw, cur)
            self.store_chunk_frags(xraw, nxt)
            accs = self.wait(accs)
            self.e.raw("gpu.barrier")
            return [a for acc in accs for a in acc]
        accs, raw, last = self._pipelined_chunks(nrows, d.R * na, body)
        return self.wait(self.chunk_mma(rows(accs), raw, last))

    def _ptr(self, name: str, ty: str) -> str:
        """Buffer ``name``'s base address as an index."""
        return self.op(f"memref.extract_aligned_pointer_as_index {name} : {ty} -> index")

    def _prologue(self) -> tuple[str, str, str | None]:
        """The lane setup, the lane's first weight row (warpgroup ``warp // 4`` owns R tiles
        of 64 rows, its warp ``warp % 4`` rows ``16 (warp % 4) ..`` of each), the split-K
        slice's first K step, and :attr:`desc0`. Returns ``(wrow, wg, bz)``."""
        m, e, d = self.m, self.e, self.d
        warp, g = self._lane_setup()
        wg = self.op(f"arith.shrui {warp}, {self.c(2)} : index")
        w4 = self.op(f"arith.andi {warp}, {self.c(3)} : index")
        wrow = self.add(self.add(self.add(self.n0, self.mul(wg, 64 * d.R)), self.mul(w4, 16)), g)
        bz = e.op("gpu.block_id z") if d.S > 1 else None
        self.kfirst = self.mul(bz, self.KTS) if bz else self.c(0)     # in K steps
        self.first = self.mul(self.kfirst, D.KSTEP)                    # in k
        #: byte address of %xs (workgroup memory)
        self.xs0 = self._ptr("%xs", self.xs_t)
        b64 = self.op(f"arith.index_cast {self.xs0} : index to i64")
        low = self.op(f"arith.andi {b64}, {self.c(0x3FFFF, 'i64')} : i64")
        start = self.op(f"arith.shrui {low}, {self.c(4, 'i64')} : i64")
        #: the descriptor of byte 0 of %xs; a tile's adds its offset >> 4 (< 2^14)
        self.desc0 = self.op(f"arith.ori {start}, {self.c(b_descriptor(0), 'i64')} : i64")
        return wrow, wg, bz

    def _epilogue(self, accs: list, wrow: str, bz: str | None):
        """Each accumulator to y (or the split-K partials) through the epilogue (the D
        fragment's places, module doc); then the module's text."""
        m, d = self.m, self.d
        x_reads = set(self.se.seen)
        part0 = self.mul(bz, m.M * m.N) if bz else None
        rows2t = self.mul(self.t1, 2)
        for r in range(d.R):
            for i, v in enumerate(accs[r]):
                j, q = divmod(i, 4)
                brow = self.add(rows2t, 8 * j + q % 2)
                fcol = self.add(wrow, 64 * r + 8 * (q // 2))
                self.store_at(v, brow, fcol, part0, 8 * (j + 1) > m.M, bool(m.N % d.BN))
        self.cur_acc = None
        return self._module_text(x_reads)

    def kernel(self) -> tuple[str, list[list], list]:
        m, d = self.m, self.d
        wrow, _, bz = self._prologue()
        nrows = [self.minu(self.add(wrow, 64 * r + 8 * h), m.N - 1)
                 for r in range(d.R) for h in (0, 1)]
        return self._epilogue(self._k_loop(nrows), wrow, bz)


class _WgmmaRingKernel(_WgmmaKernel):
    """Emits the kernel of a :class:`WgmmaTiling` with a ring (module doc, "Dense weights
    through a ring"): one workgroup buffer ``%xs`` of ``stages`` slots, each the chunk's
    weight tiles (:attr:`WgmmaTiling.w_units`) then its x image; copies and the
    instruction's operands are byte addresses in inline PTX. Benchmarks'
    :data:`.gemm_decode.ABLATE` (timing only): ``no_x`` drops x's copies, ``no_mma`` the
    wgmma's, ``stream`` both (the weight's copies alone)."""

    dynamic_xs = True

    def __init__(self, m: GemvMatch, d: WgmmaTiling, fn: ir.Operation, fmt: str):
        super().__init__(m, d, fn, fmt)
        self.xs_t = f"memref<?xi8, {G._WG}>"

    def cp_async(self, smem: str, gmem: str) -> None:
        """One 16-byte ``cp.async.cg`` from global byte address ``gmem`` (index) to
        workgroup byte address ``smem`` (index)."""
        s32 = self.op(f"arith.index_cast {smem} : index to i32")
        g64 = self.op(f"arith.index_cast {gmem} : index to i64")
        self.e.raw(f'llvm.inline_asm has_side_effects "cp.async.cg.shared.global [$0], [$1], '
                   f'16;", "r,l" {s32}, {g64} : (i32, i64) -> ()')

    def _copy_jobs(self) -> None:
        """This thread's copy jobs of a chunk, as (workgroup byte offset in a slot, global
        byte offset of the block's chunk 0) pairs: the weight's in :attr:`wjobs` (job ``p``:
        :func:`w_piece` and :func:`a_unit`, computed in index arithmetic), x's image rows in
        :attr:`xjobs`."""
        m, d = self.m, self.d
        U = d.U
        self.wjobs = []
        for p in self.jobs(d.BN * U * 4):
            r8 = self.op(f"arith.andi {p}, {self.c(7)} : index")
            j = self.op(f"arith.andi {self.op(f'arith.shrui {p}, {self.c(3)} : index')}, "
                        f"{self.c(4 * U - 1)} : index")
            rg = self.op(f"arith.divui {p}, {self.c(32 * U)} : index")
            row = self.add(self.mul(rg, 8), r8)
            grow = self.minu(self.add(self.n0, row), m.N - 1)
            gbyte = self.mul(self.add(self.add(self.mul(grow, m.K), self.first),
                                      self.mul(j, 8)), 2)
            jh = self.op(f"arith.shrui {j}, {self.c(1)} : index")
            tile = self.add(self.mul(jh, d.R * d.WG),
                            self.op(f"arith.shrui {rg}, {self.c(3)} : index"))
            unit = self.add(self.add(self.add(
                self.mul(tile, 128),
                self.mul(self.op(f"arith.andi {rg}, {self.c(7)} : index"), SBO // 16)),
                self.mul(self.op(f"arith.andi {j}, {self.c(1)} : index"), LBO // 16)), r8)
            self.wjobs.append((self.mul(unit, 16), gbyte))
        x0 = self.mul(self.kfirst, 2 * d.tile16)             # the slice's first image row
        self.xjobs = [(self.mul(self.add(idx, d.w_units), 16),
                       self.mul(self.add(x0, idx), 16)) for idx in self.jobs(d.rows16)]

    def copy_chunk(self, chunk: str, slot: str, w: bool = True, x: bool = True) -> None:
        """Issue the thread's copies of chunk ``chunk`` into ring slot ``slot`` (its weight's
        where ``w``, its x's where ``x``)."""
        d = self.d
        sbase = self.add(self.xs0, self.mul(slot, 16 * d.slot_units))
        wbase = self.add(self.wp, self.mul(chunk, 64 * d.U))
        xbase = self.add(self.xip, self.mul(chunk, 16 * d.rows16))
        for so, go in self.wjobs if w else []:
            self.cp_async(self.add(sbase, so), self.add(wbase, go))
        for so, go in [] if D.ABLATE in ("no_x", "stream") or not x else self.xjobs:
            self.cp_async(self.add(sbase, so), self.add(xbase, go))

    def _desc(self, slot: str, unit) -> str:
        """The descriptor of the tile at 16-byte unit ``unit`` of ring slot ``slot``."""
        off = self.add(self.mul(slot, self.d.slot_units), unit)
        o64 = self.op(f"arith.index_cast {off} : index to i64")
        return self.op(f"arith.addi {self.desc0}, {o64} : i64")

    def ring_loop(self, wg: str) -> list:
        """The block's C chunks through the ring (module doc); the accumulators ``[r]``."""
        d, e = self.d, self.e
        C, ST = d.per_block // d.U, d.stages
        na = d.Np // 2
        # the first chunks' weights before the grid dependency wait (the step's constants:
        # launched as a programmatic dependent, their DRAM latency overlaps the predecessor,
        # as codegen.add_grid_dependency_control keeps a top-level wait), x's after it
        for q in range(min(ST - 1, C)):
            self.copy_chunk(self.c(q), self.c(q), x=False)
        e.raw("nvvm.griddepcontrol wait")
        for q in range(ST - 1):
            if q < C:
                self.copy_chunk(self.c(q), self.c(q), w=False)
            self.asm("cp.async.commit_group;")
        zero = self.c(0.0, "f32")
        names = [e.name() for _ in range(d.R * na)]
        res = e.name()
        types = ", ".join(["f32"] * len(names))
        e.raw(f"{res}:{len(names)} = scf.for %kc = {self.c(0)} to {self.c(C)} "
              f"step {self.c(1)} iter_args({', '.join(f'{n} = {zero}' for n in names)}) "
              f"-> ({types}) {{")
        with self.se.scope():
            self.asm(f"cp.async.wait_group {ST - 2};")
            self.asm("fence.proxy.async.shared::cta;")
            e.raw("gpu.barrier")
            if C > ST - 1:
                ahead = self.add("%kc", ST - 1)
                e.raw(f"scf.if {self.op(f'arith.cmpi ult, {ahead}, {self.c(C)} : index')} {{")
                with self.se.scope():
                    self.copy_chunk(ahead, self.op(f"arith.remui {ahead}, {self.c(ST)} : index"))
                e.raw("}")
            self.asm("cp.async.commit_group;")
            slot = self.op(f"arith.remui %kc, {self.c(ST)} : index")
            accs = [names[r * na:(r + 1) * na] for r in range(d.R)]
            self.asm("wgmma.fence.sync.aligned;")
            for u in range(d.U if D.ABLATE not in ("no_mma", "stream") else 0):
                for s in (0, 1):
                    b = self._desc(slot, d.w_units + (2 * u + s) * d.tile16)
                    for r in range(d.R):
                        tile = self.add(self.mul(wg, d.R), (2 * u + s) * d.R * d.WG + r)
                        a = self._desc(slot, self.mul(tile, 128))
                        accs[r] = self.wgmma(accs[r], a, b)
            self.asm("wgmma.commit_group.sync.aligned;")
            accs = self.wait(accs)
            e.raw(f"scf.yield {', '.join(v for acc in accs for v in acc)} : {types}")
        e.raw("}")
        return [[f"{res}#{r * na + i}" for i in range(na)] for r in range(d.R)]

    def kernel(self) -> tuple[str, list[list], list]:
        wrow, wg, bz = self._prologue()
        self.wp = self._ptr("%w", self.wtype)
        self.xip = self._ptr("%xi", self.xi_t)
        self._copy_jobs()
        return self._epilogue(self.ring_loop(wg), wrow, bz)


def takes(m: GemvMatch, caps) -> str | None:
    """The weight format when this strategy takes match ``m`` on ``caps``: what
    :func:`.gemm_decode.takes` takes from :data:`MIN_M` rows, on a target with the
    :data:`FEATURE` feature."""
    if FEATURE not in (getattr(caps, "features", None) or ()) or m.M < MIN_M:
        return None
    return D.takes(m, caps)


def gemm_decode_wgmma(fn: ir.Operation, caps) -> Synthesized | None:
    """Decode GEMM regions on sm_90a (module doc); None for anything else."""
    if FEATURE not in (getattr(caps, "features", None) or ()) or \
            not G._x_without_reductions(fn):
        return None
    m = match(fn, gemv_only=False)
    if m is None:
        return None
    fmt = takes(m, caps)
    if fmt is None:
        return None
    cores = max(1, int(getattr(caps, "cores", 1) or 1))
    # the ring copies x's packed image: an x expression (no x argument) stays in registers
    dense = fmt in ("bf16", "f16") and m.x_arg is not None
    d = wgmma_tiling(m.M, m.N, m.K, cores, m.weight.nbytes, dense)
    if d.xpack and m.x_arg is None:             # an x expression stays the blocks' own
        d = replace(d, xpack=False)
    kind = _WgmmaRingKernel if d.stages else _WgmmaKernel
    try:
        text, slots, consts = kind(m, d, fn, fmt).kernel()
        pack = kind(m, d, fn, fmt).pack_kernel() if d.xpack else ""
    except ScalarUnsupported:
        return None
    launches, scratch = [], []
    if d.xpack:
        head = "gpu.module @poot_gemm {\n"
        text = text.replace(head, head + pack, 1)
        launches.append(Launch("kernel", [("arg", m.x_arg), ("scratch", 0)], "poot_gemm",
                               "gemm_xpack", (-(-m.K // D.KSTEP * d.Np // XPACK_T), 1, 1),
                               (XPACK_T, 1, 1)))
        nbytes = m.K // D.KSTEP * d.Np * 64
        scratch.append((f"memref<{nbytes // 16}x4xi32>", nbytes))
    launches.append(Launch("kernel", slots[0], "poot_gemm", "gemm",
                           (-(-m.N // d.BN), 1, d.S), (d.T, 1, 1), shared=d.ring_bytes))
    if d.S > 1:
        launches.append(Launch("kernel", slots[1], "poot_gemm", "gemm_reduce",
                               (-(-m.M * m.N // G.REDUCE_T), 1, 1), (G.REDUCE_T, 1, 1)))
        scratch.append((f"memref<{d.S * m.M * m.N}xf32>", d.S * m.M * m.N * 4))
    return Synthesized(text, launches, consts=consts, scratch=scratch)


__all__ = ["FEATURE", "LBO", "MIN_M", "SBO", "WgmmaTiling", "a_unit", "b_descriptor",
           "b_offset", "gemm_decode_wgmma", "natural_pair", "ring_stages", "takes", "w_piece",
           "wgmma_tiling", "x_quad"]
