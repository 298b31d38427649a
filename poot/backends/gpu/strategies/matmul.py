"""Decode GEMV: one kernel for a dispatch region rooted at a small-M ``poot.matmul`` against a
weight, with its elementwise epilogue fused.

Matched region (poot level, static shapes)::

    x   = reshape*(arg f32, M*K elements)                          # M <= MAX_M (decode)
        | expr(args, reduce_k(expr(args)), ...)                     # a folded norm (below)
    w   = transpose(dequantize(arg packed [N, K]))                 # Q4_0 Q4_1 Q8_0 Q4_K Q6_K
        | transpose(cast?(arg [N, K] f32|bf16|f16))                # dense, read as stored
        | cast?(arg [K, N] f32|bf16|f16)
    y   = matmul(x, w) {acc = f32}                                 # [M, N]
    out = epilogue(y, args...)    # reshapes and elementwise ops on the M*N elements (residual
                                  # add, SiLU(gate) * up, ...); args read at the same flat index

Kernel (after llama.cpp's ``mul_mat_vec`` / ``mul_mat_vec_q`` CUDA kernels): output column ``n``
is one subgroup (warp); ``W`` warps per block. The K axis is cut into *units* spread over the
lanes (lane-strided, so neighbouring lanes read neighbouring memory): 8 weights for
Q4_0/Q4_1/Q8_0 (a quarter block: :data:`BLOCK_PARTS`), 32 for Q4_K/Q6_K (one 32-element
sub-block of a super-block), 16 bytes for dense weights (one ``ld.global.v4`` on CUDA). Each
lane decodes its unit in registers (the ggml block layouts of :mod:`poot.dialects.quant_ref`),
multiplies it with the matching elements of each of the M rows of ``x`` and accumulates in
f32 (M accumulators); a ``gpu.shuffle xor`` butterfly sums the lanes and lane 0 applies the
epilogue to the M results and stores them. Packed bytes are read as 32-bit words; blocks that are only 2-byte aligned
(18, 34, 210 bytes) are realigned with a funnel shift chosen by the block's address.

x may also be an elementwise expression (:mod:`.emit`) of arguments and of last-axis row
reductions (``poot.reduce``, each read at a row fixed by the row of x: RMSNorm
``h * rsqrt(mean_k(h^2) + eps) * w``, LayerNorm's mean and variance), as
:func:`~poot.backends.gpu.merge.fold_regions` leaves it when it folds a norm region into its
consumer GEMVs. Then each warp first computes the reductions its M rows read itself (lanes
strided over the row, a shuffle-xor butterfly: :func:`~.rowreduce.row_total`), in an order
where a reduction comes after those its operand reads (LayerNorm's variance reads its mean);
the main loop evaluates x's elements from their arguments with the scalar emitter, the reduced
values supplied by its ``provide`` hook. The rows are tiny (L1/L2 resident), so recomputing them
in every warp costs less than the norm's own launch (a few us in a decode step). A plain ``x``
argument keeps the vector loads below.

Indexed regions (``poot.indexed_matmul``, a MoE layer's selected experts:
:func:`~.matmul_match.match_indexed`): row m of x against slab ``idx[m]`` of [E, N, K] weights is a GEMV of
its own, so each block computes one row (grid y = the rows, any number) for its columns, and
its lanes stream row ``idx[m] * N + n`` of the weights viewed as [E * N, K] with the same unit
decoders and wide loads: only the selected experts' bytes are read, at the plain GEMV's
bandwidth. The gate and up experts of one x and one idx fold into one kernel as the plain
SwiGLU's do. No weight prefetch there (the slab is known only after the wait: idx is the
predecessor's result).

Summation order differs from the oracle's (per-lane partial sums, a scaled sum per block:
``d * sum(q * x) + m * sum(x)``), so results agree to f32 rounding, not bitwise.

Vector (128-bit) loads, and read-only ``noalias`` pointers for ``x`` and the weight (PTX
``ld.global.nc``), are emitted only for targets whose features name ``sm_90`` (CUDA); SPIR-V
targets get the same kernel with 32-bit scalar loads.
"""

from __future__ import annotations


from mlir import ir

from poot import settings
from poot.backends.gpu.kernels import WG_ALIGN, Launch
from poot.backends.gpu.strategies import gemm as G
from poot.backends.gpu.strategies.emit import (
    ArgsSeenEmitter,
    EmitShorthands,
    ScalarUnsupported,
    Synthesized,
    buffer_type,
    defining_op,
    maybe_poot_type,
)
from poot.backends.gpu.strategies.matmul_match import (
    MAX_M,
    SMALL_N,
    SMALL_N_MAX_M,
    GemvMatch,
    dense16,
    factor_at,
    gemm_rows,
    kernel_params,
    match,
    match_indexed,
)
from poot.backends.gpu.strategies.rowreduce import per_element_reduction, row_total
from poot.dialects.types import DType, TensorType


#: packed formats whose 32-weight blocks :data:`BLOCK_PARTS` lanes share (:meth:`_Kernel.parts`)
PART_FORMATS = ("q4_0", "q4_1", "q8_0")
#: lanes sharing one block of :data:`PART_FORMATS` (a unit of 8 weights). Why: a lane reading a
#: whole block reads its 32 x values (128 bytes) as eight 16-byte loads, and the warp's lanes,
#: 128 bytes apart, touch 32 cache lines per load, so the L1 (about one line a cycle) limits
#: the GEMV, not DRAM: SmolLM2's Q8_0 LM head (49152 x 576) streamed 0.8 TB/s. With quarter
#: blocks, neighbouring lanes read neighbouring 32-byte pieces of x (8 lines a load).
BLOCK_PARTS = 4

# ---- cost rules of a folded norm (the match is :mod:`.matmul_match`'s) ------------------------

#: A folded norm is recomputed by every warp (one per output column): its row reductions and
#: the expression x read about 2 x K more f32 values per column (~8K bytes) from L1/L2. Folding
#: saves one launch (~3 us in a CUDA graph, the time an H200's L2 moves ~30 MB in), so a norm
#: is folded into a GEMV only while those extra reads, N * K * 8 bytes (per weight), stay
#: under this: the latency-bound small projections of small models, not an LM head or the
#: bandwidth-bound projections of large models (measured: Llama-3.2-1B's q, 2048 x 2048, lost
#: with the norm folded, 6.4 + 1.7 -> 8.5 us; SmolLM2's K = 576 projections gained).
PROLOGUE_MAX_EXTRA_BYTES = 16 << 20
#: A prologue that is not deferred (:func:`~.matmul_match._defer` refused it: LayerNorm, or a norm of a sum
#: that reads another norm, as Gemma 2's attention norm of the residual after its post-FFN
#: norm) is a loop over K per row and reduction, emitted one after another in every warp
#: before its dot. At most this many such loops (a batch of :data:`~.matmul_match.MAX_M` rows through two
#: chained norms); past it the fold is refused and the norm stays its own region. Why: the
#: narrow-matmul rows (up to :data:`~.matmul_match.SMALL_N_MAX_M`) made a 32-token prefill chunk of a tiny
#: Gemma 2 fold 64 loops into each of its q/k/v GEMVs (192 in the fused kernel, 562 KB of
#: SPIR-V that lavapipe's LLVM took 170 s to compile at first dispatch), each warp redoing 64
#: passes over a row that the norm's own region computes once.
PROLOGUE_MAX_LOOPS = 16


# ---- emission --------------------------------------------------------------------------------


class _Kernel:
    """Emits the GEMV kernel of a :class:`~.matmul_match.GemvMatch` (see the module doc)."""

    def __init__(self, m: GemvMatch, sg: int, warps: int, vec: bool, unroll: int = 4,
                 ksplit: int = 1):
        self.m, self.sg, self.warps, self.vec, self.unroll = m, sg, warps, vec, unroll
        #: warps per column (split-K inside a block): ``warps // ksplit`` columns per block
        self.ksplit = ksplit
        #: lanes per column (a power of two dividing ``sg``): ``sg // lanes`` columns a warp
        self.lanes = sg
        #: prefetch the weights before waiting on the predecessor grid (sm_90 targets:
        #: :meth:`prefetch_weights`)
        self.prefetch = vec and PREFETCH and m.idx is None and \
            sum(w.nbytes for w in m.weights) <= PREFETCH_MAX_BYTES
        #: the rows of x this kernel's columns compute: every row (an int each), or, for an
        #: indexed region, the block's own row (an index SSA name, set by :meth:`kernel`)
        self.rows: list = list(range(m.M))
        self.e = EmitShorthands()
        self.x = "%x"
        #: one parameter per weight (same storage format and shape); :attr:`w` is the one the
        #: loads read while a unit of it is emitted
        self.wnames = [f"%w{j}" for j in range(len(m.weights))]
        self.w = self.wnames[0]
        #: x's elements (and sums) of the unit being emitted, shared by the weights' dots
        self.xmemo: dict | None = None
        self.xtype = f"memref<{m.M * m.K}xf32>"
        self.wwords = (m.weight.nbytes + 3) // 4
        self.wtype = f"memref<{self.wwords}xi32>"
        #: k coordinate names of an expression x's elements -> (base, i): k = base + i, base a
        #: multiple of 4 (see :meth:`vec_arg`)
        self.kvec: dict[str, tuple[str, int]] = {}

    # -- loads
    def vec4_loads(self, buf: str, btype: str, elem: str, start: str, n: int) -> list[str]:
        """The ``n`` (a multiple of 4) elements of memref ``buf`` (of type ``btype``, element
        ``elem``) from ``start`` on, read as 16-byte ``vector.load``s (``start`` a multiple of
        4)."""
        e, out = self.e, []
        for i in range(0, n, 4):
            j = e.add(start, e.c(i)) if i else start
            v = e.op(f"vector.load {buf}[{j}] {{alignment = 16 : i64}} : "
                     f"{btype}, vector<4x{elem}>")
            out += [e.op(f"vector.extract {v}[{t}] : {elem} from vector<4x{elem}>")
                    for t in range(4)]
        return out

    def word(self, idx: str) -> str:
        return self.e.op(f"memref.load {self.w}[{idx}] : {self.wtype}")

    def words(self, idx: str, n: int, aligned16: bool = False) -> list[str]:
        """``n`` consecutive i32 words from word index ``idx``; ``aligned16``: the caller
        guarantees ``idx`` is a multiple of 4 (then 128-bit loads where the target has them)."""
        e = self.e
        if self.vec and aligned16 and n % 4 == 0:
            return self.vec4_loads(self.w, self.wtype, "i32", idx, n)
        return [self.word(e.add(idx, e.c(i)) if i else idx) for i in range(n)]

    def words16(self, byte: str, nbytes: int) -> list[str]:
        """The ``nbytes`` bytes at (2-byte aligned) byte offset ``byte`` as little-endian i32
        words, realigned: loads from the enclosing 4-byte word and, when ``byte`` is 2 mod 4,
        joins neighbouring words' halves (the last word's high half may be garbage when
        ``nbytes % 4 == 2``)."""
        e = self.e
        nw = (nbytes + 3) // 4
        w0 = e.op(f"arith.shrui {byte}, {e.c(2)} : index")
        odd = e.op(f"arith.cmpi ne, {e.op(f'arith.andi {byte}, {e.c(2)} : index')}, "
                   f"{e.c(0)} : index")
        raw = self.words(w0, nw)
        # bytes past the enclosing words are needed only when realigning a full last word
        if nbytes % 4 == 0:
            last = e.op(f"arith.minui {e.add(w0, e.c(nw))}, {e.c(self.wwords - 1)} : index")
            raw.append(self.word(last))
        out = []
        for j in range(nw):
            lo = e.shr(raw[j], 16)
            fun = e.op(f"arith.ori {lo}, {e.shl(raw[j + 1], 16)} : i32") if j + 1 < len(raw) \
                else lo
            out.append(e.op(f"arith.select {odd}, {fun}, {raw[j]} : i32"))
        return out

    def xs(self, m: int, base: str, n: int) -> list[str]:
        """``x[m, base:base+n]`` as f32 scalars (``base`` a multiple of 4 when vectorized),
        emitted once per unit (:attr:`xmemo`) however many weights read them."""
        if self.xmemo is None:
            return self._xs(m, base, n)
        # within one unit every read is of the unit's own elements (each weight's decoder
        # names its base afresh): keyed by row and length only
        key = ("x", m, n)
        if key not in self.xmemo:
            self.xmemo[key] = self._xs(m, base, n)
        return self.xmemo[key]

    def _xs(self, m: int, base: str, n: int) -> list[str]:
        e = self.e
        K = self.m.K
        if self.m.x_arg is None:        # an expression (a folded norm): the scalar emitter
            se = self.se
            ks = [se.iadd(base, i) for i in range(n)]
            if self.vec and n % 4 == 0:
                self.kvec.update((k, (base, i)) for i, k in enumerate(ks))
            if self.xmemo is not None:
                self.xmemo.setdefault(("ks", n), ks)
            if self.m.deferred:            # the k factors only: the row scale comes last
                out = []
                for k in ks:
                    fs = [se.value(f, factor_at(se, f, m, k)) for f in self.m.deferred[0]]
                    v = fs[0]
                    for f in fs[1:]:
                        v = se.op(f"arith.mulf {v}, {f} : f32")
                    out.append(v)
                return out
            return [se.value(self.m.x, (m, k)) for k in ks]
        if isinstance(m, str):          # an indexed region's row: the block's
            start = e.add(base, e.mul(m, e.c(K)))
        else:
            start = e.add(base, e.c(m * K)) if m else base
        if self.vec and n % 4 == 0:
            return self.vec4_loads(self.x, self.xtype, "f32", start, n)
        return [e.op(f"memref.load {self.x}[{e.add(start, e.c(i)) if i else start}] : "
                     f"{self.xtype}") for i in range(n)]

    def vec_arg(self, v: ir.Value, idx: tuple) -> str | None:
        """An f32 argument's element read by an expression x at ``idx`` whose last coordinate
        is ``base + i`` (:attr:`kvec`), as lane ``i % 4`` of one 16-byte load (each lane's
        elements of x are consecutive, and so are the norm's inputs along k); None (a scalar
        load) for anything else."""
        if not idx or not isinstance(idx[-1], str) or idx[-1] not in self.kvec:
            return None
        t = maybe_poot_type(v)
        if not isinstance(t, TensorType) or t.dtype is not DType.F32 or t.shape[-1] % 4:
            return None
        se = self.se
        base, i = self.kvec[idx[-1]]
        at = ", ".join(se.ix(c) for c in idx[:-1] + (se.iadd(base, i - i % 4),))
        mt = buffer_type(t)
        vec = se.op(f"vector.load {se._arg(v)}[{at}] {{alignment = 16 : i64}} : {mt}, "
                    "vector<4xf32>")
        return se.op(f"vector.extract {vec}[{i % 4}] : f32 from vector<4xf32>")

    @staticmethod
    def byte(V: list[str], k: int, e: EmitShorthands, signed: bool = False) -> str:
        """Byte ``k`` of little-endian words ``V``: zero-extended (or sign-extended) i32."""
        w = V[k // 4]
        s = 8 * (k % 4)
        if signed:
            t = e.shl(w, 24 - s)
            return e.op(f"arith.shrsi {t}, {e.c(24, 'i32')} : i32")
        return e.band(e.shr(w, s), 0xFF)

    # -- dot products of one unit: returns per-m partial sums
    def _chains(self, terms: list[tuple[str, str | None]]) -> str:
        """``sum a * b`` (``b`` None: ``sum a``) in up to 4 interleaved chains, so a lane has
        independent FMAs in flight, then a pairwise combine."""
        e = self.e
        chains: list[str] = []
        for i, (a, b) in enumerate(terms):
            if i < 4:
                chains.append(a if b is None else e.fmul(a, b))
            else:
                c = chains[i % 4]
                chains[i % 4] = e.fadd(c, a) if b is None else e.fma(a, b, c)
        while len(chains) > 1:
            chains = [e.fadd(chains[i], chains[i + 1]) if i + 1 < len(chains) else chains[i]
                      for i in range(0, len(chains), 2)]
        return chains[0]

    def dot(self, qs: list[str], u_x0: str) -> list[str]:
        """``sum_l qs[l] * x[m, u_x0 + l]`` per m (``qs`` f32 weights or decoded values)."""
        return [self._chains(list(zip(qs, self.xs(m, u_x0, len(qs))))) for m in self.rows]

    def xsum(self, x0: str, n: int) -> list[str]:
        key = ("sum", n)
        if self.xmemo is not None and key in self.xmemo:
            return self.xmemo[key]
        got = [self._chains([(x, None) for x in self.xs(m, x0, n)]) for m in self.rows]
        if self.xmemo is not None:
            self.xmemo[key] = got
        return got

    def unit(self, n: str, u: str) -> list[str]:
        """Per-m contribution of unit ``u`` of column ``n`` (see :meth:`units`)."""
        e, m, w = self.e, self.m, self.m.weight
        if w.layout == "nk":
            per = 16 if (m.K * w.dtype.itemsize) % 16 == 0 else 4
            nw = per // 4
            row = e.mul(n, e.c(m.K * w.dtype.itemsize // 4))
            W = self.words(e.add(row, e.mul(u, e.c(nw))), nw, aligned16=True)
            vals = self.dense_vals(W, w.dtype)
            return self.dot(vals, e.mul(u, e.c(len(vals))))
        if w.layout == "kn":                    # element (k = u, n): one strided read
            idx = e.add(e.mul(u, e.c(m.N)), n)
            if w.dtype is DType.F32:
                val = e.op(f"arith.bitcast {self.word(idx)} : i32 to f32")
            else:
                wd = self.word(e.op(f"arith.shrui {idx}, {e.c(1)} : index"))
                odd = e.op(f"arith.cmpi ne, {e.op(f'arith.andi {idx}, {e.c(1)} : index')}, "
                           f"{e.c(0)} : index")
                wd = e.op(f"arith.select {odd}, {e.shr(wd, 16)}, {wd} : i32")
                val = self.dense_vals([wd], w.dtype)[0]
            return self.dot([val], u)
        return getattr(self, "_" + w.fmt)(n, u)

    def dense_vals(self, W: list[str], dt: DType) -> list[str]:
        e = self.e
        out = []
        for wd in W:
            if dt is DType.F32:
                out.append(e.op(f"arith.bitcast {wd} : i32 to f32"))
            elif dt is DType.BF16:           # bf16 = the high half of an f32
                out.append(e.op(f"arith.bitcast {e.shl(wd, 16)} : i32 to f32"))
                out.append(e.op(f"arith.bitcast {e.band(wd, 0xFFFF0000 - (1 << 32))} : "
                                "i32 to f32"))
            else:
                out += [e.half(wd, False), e.half(wd, True)]
        return out

    def _blk(self, n: str, u: str, per_row: int, bb: int) -> str:
        """Byte offset of block ``u`` of row ``n`` (``per_row`` blocks of ``bb`` bytes)."""
        e = self.e
        return e.mul(e.add(e.mul(n, e.c(per_row)), u), e.c(bb))

    def parts(self) -> int:
        """Lanes sharing one 32-weight block (units of ``32 / parts`` weights):
        :data:`BLOCK_PARTS` for :data:`PART_FORMATS`, else 1."""
        w = self.m.weight
        if w.layout != "packed" or w.fmt not in PART_FORMATS:
            return 1
        return TUNING["parts"] or BLOCK_PARTS

    def _part(self, n: str, u: str, bb: int) -> tuple[str, str, int, str]:
        """(byte offset of the block, part index, weights per part ``E``, first x element) of
        unit ``u`` of row ``n``: part ``u % parts`` of ``bb``-byte block ``u // parts``."""
        e, P = self.e, self.parts()
        blk = e.op(f"arith.divui {u}, {e.c(P)} : index") if P > 1 else u
        p = e.op(f"arith.remui {u}, {e.c(P)} : index") if P > 1 else e.c(0)
        return self._blk(n, blk, self.m.K // 32, bb), p, 32 // P, e.mul(u, e.c(32 // P))

    def _q4(self, qs: str, p: str, E: int, words) -> list[str]:
        """The ``E`` 4-bit values of part ``p`` of a Q4_0/Q4_1 block whose 16 quant bytes start
        at ``qs`` (elements ``i`` and ``i + 16`` are byte ``i``'s low and high nibbles):
        ``words(at, n)`` loads ``n`` words from byte offset ``at``."""
        e = self.e
        if E == 32:
            return self._nibbles(words(qs, 4))
        # part p's elements p*E.. are the low (first half) or high nibbles of E bytes
        first = e.mul(p, e.c(E))
        at = e.add(qs, e.op(f"arith.remui {first}, {e.c(16)} : index"))
        hi = e.op(f"arith.index_cast {e.op(f'arith.divui {first}, {e.c(16)} : index')} : "
                  "index to i32")
        return self._nibbles(words(at, E // 4),
                             e.op(f"arith.muli {hi}, {e.c(4, 'i32')} : i32"))

    def _q4_1(self, n, u):
        e = self.e
        B, p, E, x0 = self._part(n, u, 20)
        w0 = e.op(f"arith.shrui {B}, {e.c(2)} : index")
        V0 = self.word(w0)
        d, mn = e.half(V0, False), e.half(V0, True)
        q = self._q4(e.add(B, e.c(4)), p, E, lambda at, k: self.words(
            e.op(f"arith.shrui {at}, {e.c(2)} : index"), k))
        s, sx = self.dot(q, x0), self.xsum(x0, E)
        return [e.fma(d, a, e.fmul(mn, b)) for a, b in zip(s, sx)]

    def _q4_0(self, n, u):
        e = self.e
        B, p, E, x0 = self._part(n, u, 18)
        d = e.half(self.words16(B, 2)[0], False)
        q = self._q4(e.add(B, e.c(2)), p, E, lambda at, k: self.words16(at, 4 * k))
        s, sx = self.dot(q, x0), self.xsum(x0, E)
        # (q - 8) * d summed: d * (sum q x - 8 sum x)
        return [e.fmul(d, e.fma(e.c(-8.0, "f32"), b, a)) for a, b in zip(s, sx)]

    def _q8_0(self, n, u):
        e = self.e
        B, p, E, x0 = self._part(n, u, 34)
        d = e.half(self.words16(B, 2)[0], False)
        V = self.words16(e.add(B, e.add(e.c(2), e.mul(p, e.c(E)))), E)
        q = [e.s2f(self.byte(V, k, e, signed=True)) for k in range(E)]
        return [e.fmul(d, a) for a in self.dot(q, x0)]

    def _nibbles(self, W: list[str], shift: str | None = None) -> list[str]:
        """32 4-bit values of 16 bytes (4 words): low nibbles, then high nibbles; with
        ``shift`` (i32 SSA 0 or 4): one nibble of each byte of ``W``."""
        e = self.e
        if shift is None:
            lo = [e.u2f(e.band(e.shr(w, 8 * t), 15)) for w in W for t in range(4)]
            hi = [e.u2f(e.band(e.shr(w, 8 * t + 4), 15)) for w in W for t in range(4)]
            return lo + hi
        out = []
        for w in W:
            ws = e.op(f"arith.shrui {w}, {shift} : i32")
            out += [e.u2f(e.band(e.shr(ws, 8 * t), 15)) for t in range(4)]
        return out

    def _q4_k(self, n, u):
        # unit = sub-block j (32 elements) of super-block s; ggml dequantize_row_q4_K
        e, K = self.e, self.m.K
        s = e.op(f"arith.divui {u}, {e.c(8)} : index")
        j = e.op(f"arith.remui {u}, {e.c(8)} : index")
        B = self._blk(n, s, K // 256, 144)
        w0 = e.op(f"arith.shrui {B}, {e.c(2)} : index")
        hdr = self.words(w0, 4, aligned16=True)                      # d, dmin, scales[12]
        d, dmin = e.half(hdr[0], False), e.half(hdr[0], True)
        j32 = e.op(f"arith.index_cast {j} : index to i32")
        jl = e.op(f"arith.andi {j32}, {e.c(3, 'i32')} : i32")
        sh = e.op(f"arith.muli {jl}, {e.c(8, 'i32')} : i32")

        def b(word):            # byte jl of a scale word
            return e.band(e.op(f"arith.shrui {word}, {sh} : i32"), 0xFF)
        A, Bb, C = b(hdr[1]), b(hdr[2]), b(hdr[3])
        low = e.op(f"arith.cmpi ult, {j32}, {e.c(4, 'i32')} : i32")
        sc_hi = e.op(f"arith.ori {e.band(C, 15)}, {e.shl(e.shr(A, 6), 4)} : i32")
        mn_hi = e.op(f"arith.ori {e.shr(C, 4)}, {e.shl(e.shr(Bb, 6), 4)} : i32")
        sc = e.op(f"arith.select {low}, {e.band(A, 63)}, {sc_hi} : i32")
        mn = e.op(f"arith.select {low}, {e.band(Bb, 63)}, {mn_hi} : i32")
        d1 = e.fmul(d, e.u2f(sc))
        m1 = e.fmul(dmin, e.u2f(mn))
        # 64-element chunk j/2: low nibbles of qs[32c:32c+32] then high nibbles
        c = e.op(f"arith.shrui {j}, {e.c(1)} : index")
        W = self.words(e.add(w0, e.add(e.c(4), e.mul(c, e.c(8)))), 8, aligned16=True)
        odd = e.band(j32, 1)
        shift = e.op(f"arith.muli {odd}, {e.c(4, 'i32')} : i32")
        q = self._nibbles(W, shift)
        x0 = e.mul(u, e.c(32))
        sq, sx = self.dot(q, x0), self.xsum(x0, 32)
        return [e.op(f"arith.subf {e.fmul(d1, a)}, {e.fmul(m1, bx)} : f32")
                for a, bx in zip(sq, sx)]

    def _q6_k(self, n, u):
        # unit = group g of half h (32 elements, two 16-element scales); ggml
        # dequantize_row_q6_K
        e, K = self.e, self.m.K
        s = e.op(f"arith.divui {u}, {e.c(8)} : index")
        j = e.op(f"arith.remui {u}, {e.c(8)} : index")
        h = e.op(f"arith.shrui {j}, {e.c(2)} : index")
        g = e.op(f"arith.andi {j}, {e.c(3)} : index")
        B = self._blk(n, s, K // 256, 210)
        g1 = e.op(f"arith.andi {g}, {e.c(1)} : index")
        ql_off = e.add(B, e.add(e.mul(h, e.c(64)), e.mul(g1, e.c(32))))
        qh_off = e.add(B, e.add(e.c(128), e.mul(h, e.c(32))))
        QL = self.words16(ql_off, 32)
        QH = self.words16(qh_off, 32)
        sc_off = e.add(B, e.add(e.c(192), e.add(e.mul(h, e.c(8)), e.mul(g, e.c(2)))))
        SC = self.words16(sc_off, 2)[0]
        D = self.words16(e.add(B, e.c(208)), 2)[0]
        d = e.half(D, False)
        sca = e.s2f(self.byte([SC], 0, e, signed=True))
        scb = e.s2f(self.byte([SC], 1, e, signed=True))
        g32 = e.op(f"arith.index_cast {g} : index to i32")
        lo_sh = e.op(f"arith.muli {e.shr(g32, 1)}, {e.c(4, 'i32')} : i32")
        hi_sh = e.op(f"arith.muli {g32}, {e.c(2, 'i32')} : i32")
        q = []
        for i in range(8):
            a = e.op(f"arith.shrui {QL[i]}, {lo_sh} : i32")
            b = e.op(f"arith.shrui {QH[i]}, {hi_sh} : i32")
            for t in range(4):
                lo = e.band(e.shr(a, 8 * t), 15)
                hi = e.shl(e.band(e.shr(b, 8 * t), 3), 4)
                v = e.op(f"arith.ori {lo}, {hi} : i32")
                q.append(e.s2f(e.op(f"arith.subi {v}, {e.c(32, 'i32')} : i32")))
        x0 = e.mul(u, e.c(32))
        lo_s, hi_s = [], []
        for mm in self.rows:
            xv = self.xs(mm, x0, 32)
            lo_s.append(self._chains(list(zip(q[:16], xv[:16]))))
            hi_s.append(self._chains(list(zip(q[16:], xv[16:]))))
        return [e.fmul(d, e.fma(sca, a, e.fmul(scb, b))) for a, b in zip(lo_s, hi_s)]

    # -- the kernel
    def units(self) -> int:
        m, w = self.m, self.m.weight
        if w.layout == "nk":
            per = 16 if (m.K * w.dtype.itemsize) % 16 == 0 else 4
            return m.K * w.dtype.itemsize // per
        if w.layout == "kn":
            return m.K
        return m.K // 32 * self.parts()

    def dot_rows(self, n: str, lane: str, part: str | None = None) -> list[list[str]]:
        """``sum_k x[m, k] * w[k, n]`` per weight and row m (``[weight][m]``), in every one
        of the :attr:`lanes` lanes of column ``n``: the lane-strided walk over units, then a
        shuffle-xor butterfly within the lane group. ``part`` (split-K): only the units of
        slice ``part`` of :attr:`ksplit` equal slices. A deferred norm (``m.deferred``)
        adds one more list: the partial sums of the prologue's reductions over the same k.

        A lane with at most :attr:`unroll` units runs them straight-line, a unit past the
        end clamped in range and its contribution dropped: all its loads are in flight at
        once (a loop whose trip count differs between lanes waits on each load in turn, and
        is not unrolled). More units run in a loop of ``U`` units an iteration (the most up
        to :attr:`unroll` that one iteration's lanes fill), and the units past its last whole
        iteration straight-line as above. Why the tail: a loop that had to divide the units
        evenly took one unit an iteration for a K of 3584 bf16 (448 units = 3.5 x 128), one
        load in flight a lane, and streamed 2.1 TB/s on an H200 (a MoE expert's down
        projection)."""
        e, L, M, J = self.e, self.lanes, len(self.rows), len(self.wnames)
        red = self.m.prologue if self.m.deferred else []
        R = len(red)
        epu = self.m.K // self.units()          # k elements per unit
        units = self.units() // self.ksplit
        base = e.mul(part, e.c(units)) if part is not None else None
        rounds = -(-units // L)
        zero = e.c(0.0, "f32")

        def step(ui: str, acc: list[str], valid: str | None = None) -> list[str]:
            # one unit of every weight, x's elements emitted once for all of them
            with self.se.scope():
                self.xmemo = {}
                for j, wname in enumerate(self.wnames):
                    self.w = wname
                    parts = self.unit(n, ui)
                    if valid is not None:
                        parts = [e.op(f"arith.select {valid}, {p}, {zero} : f32")
                                 for p in parts]
                    acc[j * M:(j + 1) * M] = [p if a is None else e.fadd(a, p) for a, p in
                                              zip(acc[j * M:(j + 1) * M], parts)]
                for t, (r, row) in enumerate(red):
                    p = self.reduce_part(r, row, ui, epu)
                    if valid is not None:
                        p = e.op(f"arith.select {valid}, {p}, {zero} : f32")
                    a = acc[M * J + t]
                    acc[M * J + t] = p if a is None else e.fadd(a, p)
                self.xmemo = None
            return acc

        def straight(acc: list, first: int) -> list:
            # units first + lane, first + lane + L, ... < units: one round each
            for r in range(-(-(units - first) // L)):
                u = e.add(lane, e.c(first + r * L)) if first + r * L else lane
                valid = None
                if first + (r + 1) * L > units:      # lanes past the end: clamped, dropped
                    valid = e.op(f"arith.cmpi ult, {u}, {e.c(units)} : index")
                    u = e.op(f"arith.minui {u}, {e.c(units - 1)} : index")
                acc = step(e.add(base, u) if base else u, acc, valid)
            return acc

        if rounds <= self.unroll:
            vals = straight([None] * (M * J + R), 0)
        else:
            accs = [e.name() for _ in range(M * J + R)]
            res = e.name()
            f32s = ", ".join(["f32"] * (M * J + R))
            U = next(u for u in (8, 4, 2, 1) if u <= self.unroll and units >= L * u)
            main = units // (L * U) * (L * U)      # the units of whole iterations
            lo, hi = lane, e.c(main)
            if base:
                lo, hi = e.add(base, lane), e.add(base, e.c(main))
            e.raw(f"{res}:{M * J + R} = scf.for %u = {lo} to {hi} step {e.c(L * U)} "
                  f"iter_args({', '.join(f'{a} = {zero}' for a in accs)}) -> ({f32s}) {{")
            new = list(accs)
            for i in range(U):
                new = step("%u" if i == 0 else e.add("%u", e.c(i * L)), new)
            e.raw(f"scf.yield {', '.join(new)} : {f32s}")
            e.raw("}")
            vals = straight([f"{res}#{i}" for i in range(M * J + R)], main)
        width = e.c(self.sg, "i32")
        sums = []
        for v in vals:
            off = L // 2
            while off:
                sh = e.name()
                e.raw(f"{sh}:2 = gpu.shuffle xor {v}, {e.c(off, 'i32')}, {width} : f32")
                v = e.fadd(v, f"{sh}#0")
                off //= 2
            sums.append(v)
        return [sums[j * M:(j + 1) * M] for j in range(J)] + ([sums[M * J:]] if R else [])

    def reduce_part(self, r, row: tuple, u: str, epu: int) -> str:
        """Unit ``u``'s share of the sum ``r`` (a deferred norm's reduction at ``row``): its
        operand over the unit's ``epu`` elements of k (the same elements the unit's dot
        reads, so x's inputs are loaded once)."""
        se = self.se
        ks = (self.xmemo or {}).get(("ks", epu))   # the k names the unit's x reads used
        if ks is None:
            kb = se.imul(u, epu)
            ks = [se.iadd(kb, i) for i in range(epu)]
            if self.vec and epu % 4 == 0:
                self.kvec.update((k, (kb, i)) for i, k in enumerate(ks))
        return self._chains([(se.value(r.operands[0], list(row) + [k]), None) for k in ks])

    #: bytes of one L2 line a prefetch warms
    LINE = 128

    def prefetch_weights(self, n: str, lane: str, part: str | None) -> None:
        """Warm L2 with the weight bytes this lane group's first pass of the unit loop reads,
        then wait for the grids this kernel depends on (``griddepcontrol.wait``, sm_90; a
        no-op unless launched as a programmatic dependent, see :func:`~poot.backends.cuda.
        codegen.add_grid_dependency_control`).

        Why: the weights are the step's constants, written by no kernel, so they may be read
        before the wait; launched as a dependent, this kernel's blocks are resident while its
        predecessor still runs, and the DRAM latency of their first loads overlaps that
        instead of following it (a small decode GEMV is a DRAM round trip or two). Only the
        first pass (each lane's first ``U`` units, a few KB per column): prefetching whole
        slabs of a bandwidth-bound GEMV overflowed L2 on an H200 (Llama-3-8B's down
        projection 29 -> 47 us), while the rest of a column streams behind the first pass
        anyway. Column ``n``'s weights are row ``n`` of a [N, K] weight (bytes
        ``[n * row, (n + 1) * row)``), its K slice ``part`` a contiguous part of that; one
        ``prefetch.global.L2`` per 128-byte line, over the group's lanes. x (the
        predecessor's result) is read only after the wait."""
        e, m, L = self.e, self.m, self.lanes
        if m.weight.layout != "kn":
            row = m.weight.nbytes // (m.N * m.E)          # bytes of one column's weights
            units = self.units()
            per_part = row // self.ksplit
            first = min(per_part, -(-row * self.unroll * L // units))
            lines = -(-first // self.LINE) + 1            # + 1: the window's misalignment
            start = e.mul(n, e.c(row))
            if part is not None:
                start = e.add(start, e.mul(part, e.c(per_part)))
            head = e.op(f"arith.andi {start}, {e.c(-self.LINE)} : index")
            for wname in self.wnames:
                base = e.op(f"memref.extract_aligned_pointer_as_index {wname} : "
                            f"{self.wtype} -> index")
                for r in range(-(-lines // L)):
                    i = e.add(lane, e.c(r * L)) if r else lane
                    off = e.add(head, e.mul(i, e.c(self.LINE)))
                    lim = e.op(f"arith.minui {e.add(start, e.c(first))}, "
                               f"{e.c(m.weight.nbytes)} : index")
                    e.raw(f"scf.if {e.op(f'arith.cmpi ult, {off}, {lim} : index')} {{")
                    a = e.op(f"arith.index_cast {e.add(base, off)} : index to i64")
                    e.raw(f'llvm.inline_asm has_side_effects "prefetch.global.L2 [$0];", '
                          f'"l" {a} : (i64) -> ()')
                    e.raw("}")
        e.raw("nvvm.griddepcontrol wait")

    def kernel(self, fn: ir.Operation) -> tuple[str, list[tuple[str, int]], list]:
        """(gpu.module text, launch argument slots, constant buffers) of the kernel."""
        m, e, sg = self.m, self.e, self.sg
        self.M, self.J = len(self.rows), len(m.weights)
        nargs = len(fn.regions[0].blocks[0].arguments)
        # one scalar emitter for the expression x and the epilogue: the hook supplies the
        # row reductions of x (computed before the main loop) and the GEMV's sums
        self.sums: list[list[str]] = []
        self.row_now: int | None = None
        self.reduced: dict = {}
        se = self.se = ArgsSeenEmitter(fn, e.k, [f"%e{i}" for i in range(nargs)],
                                       provide=self._provide)
        self._column()
        if self.prefetch:
            self.prefetch_weights(self.wn, self.lane, self.part)
        is0 = e.op(f"arith.cmpi eq, {self.lane}, {e.c(0)} : index")
        wg_mem: list[tuple[str, str]] = []
        self.x_reads: set[str] = set()
        S, cols, part, col, inb = self.ksplit, self.cols, self.part, self.col, self.inb
        V = self.M * self.J + (len(m.prologue) if m.deferred is not None else 0)  # per column
        smt = f"memref<{S * cols * V}xf32, #gpu.address_space<workgroup>>"
        with se.scope():         # what the warp computes dominates nothing after it
            if m.deferred is None:
                for r, row in m.prologue:
                    wg: list = []
                    # the whole warp computes its row's reduction (every column group reads it)
                    self.reduced[(r.results[0], row)] = row_total(se, r, list(row), self.wlane,
                                                                  sg, sg, 0, wg)
                    assert not wg                # one subgroup per row: shuffles only
            flat = [v for per in self.dot_rows(self.wn, self.lane, part) for v in per]
            if S == 1:
                e.raw(f"scf.if {e.op(f'arith.andi {inb}, {is0} : i1')} {{")
                self._epilogue(flat)
            else:
                # split-K: each group's partial totals go to workgroup memory [part, col, v]
                at = e.mul(e.add(e.mul(part, e.c(cols)), col), e.c(V))
                e.raw(f"scf.if {is0} {{")
                for i, v in enumerate(flat):
                    e.raw(f"memref.store {v}, %ksum[{e.add(at, e.c(i))}] : {smt}")
            e.raw("}")
        if S > 1:
            wg_mem.append(("%ksum", smt))
            self._sum_slices(is0, V, smt)
        return self._module_text(fn, wg_mem), self.slots, se.consts

    def _provide(self, v, idx):
        """The scalar emitter's hook: the GEMV's sums in the epilogue, the prologue's row
        reductions, x's elements read as vectors."""
        m = self.m
        if v in m.roots:
            if self.row_now is None:
                raise ScalarUnsupported("the matmul result read outside the epilogue")
            return self.sums[m.roots.index(v)][self.row_now]
        o = defining_op(v)
        if o is not None and o.name == "poot.reduce" and not per_element_reduction(o):
            got = self.reduced.get((v, tuple(idx)))
            if got is None:
                raise ScalarUnsupported("a row reduction the prologue did not compute")
            return got
        if isinstance(v.owner, ir.Block):
            return self.vec_arg(v, tuple(idx))
        return None

    def _column(self) -> None:
        """Emit which column this thread's lane group computes: sets ``wlane`` (lane in the
        warp), ``lane`` (in its column group), ``part`` (its K slice, None without split-K),
        ``col`` (column in the block), ``cols`` (columns per block), ``inb`` (column < N),
        ``n`` (the column, clamped), ``wn`` (the weight's row of it: a slab's row for an
        indexed region, whose block row ``t`` is then the one row)."""
        m, e, sg, L = self.m, self.e, self.sg, self.lanes
        tid = e.op("gpu.thread_id x")
        bid = e.op("gpu.block_id x")
        warp = e.op(f"arith.divui {tid}, {e.c(sg)} : index")
        self.wlane = wlane = e.op(f"arith.remui {tid}, {e.c(sg)} : index")
        # a warp holds sg / L columns of L lanes each: group g = wlane / L, lane = wlane % L
        cpw = sg // L
        lane, grp = wlane, None
        if cpw > 1:
            lane = e.op(f"arith.remui {wlane}, {e.c(L)} : index")
            grp = e.op(f"arith.divui {wlane}, {e.c(L)} : index")
        S = self.ksplit
        wcols = self.warps // S              # warps of one K slice
        cols = wcols * cpw                   # columns per block
        wcol, part = warp, None
        if S > 1:                # warp = part * wcols + wcol
            wcol = e.op(f"arith.remui {warp}, {e.c(wcols)} : index")
            part = e.op(f"arith.divui {warp}, {e.c(wcols)} : index")
        col = e.add(e.mul(wcol, e.c(cpw)), grp) if grp else wcol
        n_raw = e.add(e.mul(bid, e.c(cols)), col)
        self.inb = e.op(f"arith.cmpi ult, {n_raw}, {e.c(m.N)} : index")
        # shuffles need whole warps: a column past N computes column N - 1 and stores nothing
        n = e.op(f"arith.minui {n_raw}, {e.c(m.N - 1)} : index") if m.N % cols else n_raw
        wn = n                   # the weight's row of column n
        if m.idx is not None:
            # an indexed region: block row t computes row t of x against slab idx[t]
            # (clamped to the E slabs, as the oracle's gather clamps), row e * N + n
            t = e.op("gpu.block_id y")
            self.rows = [t]
            self.M = 1
            with self.se.scope():
                raw = self.se.value(m.idx, [t])
            it = maybe_poot_type(m.idx).dtype.value
            i64 = raw if it == "i64" else e.op(f"arith.extsi {raw} : {it} to i64")
            lo = e.op(f"arith.maxsi {i64}, {e.c(0, 'i64')} : i64")
            hi = e.op(f"arith.minsi {lo}, {e.c(m.E - 1, 'i64')} : i64")
            slab = e.op(f"arith.index_cast {hi} : i64 to index")
            wn = e.add(e.mul(slab, e.c(m.N)), n)
        self.lane, self.part, self.col, self.cols, self.n, self.wn = lane, part, col, cols, n, wn

    def _epilogue(self, flat: list[str]) -> None:
        """Emit output element (row, n) from the column's totals ``flat``, in lane 0; a
        deferred norm's row scale (its reductions' totals now known) multiplies the dots
        first."""
        m, e, se, M, J, n = self.m, self.e, self.se, self.M, self.J, self.n
        self.x_reads.update(se.seen)
        self.sums[:] = [flat[j * M:(j + 1) * M] for j in range(J)]
        if m.deferred is not None:
            for (r, row), tot in zip(m.prologue, flat[M * J:]):
                self.reduced[(r.results[0], row)] = tot
            for i in range(M):
                with se.scope():
                    sc = [se.value(f, factor_at(se, f, i, 0)) for f in m.deferred[1]]
                for f in sc:
                    for j in range(J):
                        self.sums[j][i] = e.fmul(self.sums[j][i], f)
        for i, row in enumerate(self.rows):
            self.row_now = i
            with se.scope():
                for j, (out, ot) in enumerate(zip(m.outs, m.out_ts)):
                    lin = se.iadd(se.imul(row, m.N), n) if isinstance(row, str) else \
                        se.iadd(i * m.N, n)
                    idx = se.delinearize(lin, ot.shape)
                    se.store(se.value(out, idx), f"%o{j}", ot, idx)

    def _sum_slices(self, is0: str, V: int, smt: str) -> None:
        """Split-K: every thread reaches the barrier; then lane 0 of part 0 adds a column's
        S slices from workgroup memory and runs the epilogue."""
        e, S, cols, col = self.e, self.ksplit, self.cols, self.col
        e.raw("gpu.barrier")
        p0 = e.op(f"arith.cmpi eq, {self.part}, {e.c(0)} : index")
        first = e.op(f"arith.andi {e.op(f'arith.andi {self.inb}, {p0} : i1')}, {is0} : i1")
        e.raw(f"scf.if {first} {{")
        flat = []
        for i in range(V):
            tot = None
            for q in range(S):
                at = e.add(e.mul(e.add(e.c(q * cols), col), e.c(V)), e.c(i))
                v = e.op(f"memref.load %ksum[{at}] : {smt}")
                tot = v if tot is None else e.fadd(tot, v)
            flat.append(tot)
        with self.se.scope():
            self._epilogue(flat)
        e.raw("}")

    def _module_text(self, fn: ir.Operation, wg_mem: list[tuple[str, str]]) -> str:
        """The ``gpu.module`` text around the emitted body; sets :attr:`slots`."""
        m, e = self.m, self.e
        # x (or the arguments of an expression x) and the weight are only read, and no buffer
        # of the kernel overlaps them (the plan gives each value its own buffer): on CUDA that
        # lets loads take the read-only path (ld.global.nc)
        ro = " {llvm.noalias, llvm.readonly}" if self.vec else ""
        params, self.slots = kernel_params(fn, m, self.se, self.x_reads, ro,
                                           (self.x, self.xtype),
                                           [(w, self.wtype) for w in self.wnames])
        t = self.warps * self.sg
        sig = ", ".join(f"{a}: {b}" for a, b in params)
        wgt = f" workgroup({', '.join(f'{a}: {b} {WG_ALIGN}' for a, b in wg_mem)})" \
            if wg_mem else ""
        return (f"gpu.module @poot_gemv {{\n"
                f"  gpu.func @gemv({sig}){wgt} kernel attributes "
                f"{{known_block_size = array<i32: {t}, 1, 1>}} {{\n{e.k.text()}\n"
                f"    gpu.return\n  }}\n}}\n")


def _warps(N: int, caps) -> int:
    """Warps per block for ``N`` warp-columns: as many as keep every compute unit busy,
    1..8."""
    cores = max(1, int(getattr(caps, "cores", 1) or 1))
    for w in (8, 4, 2):
        if -(-N // w) >= cores:
            return w
    return 1


#: split-K aims for at least this many warps per compute unit over the whole GEMV
SPLIT_WARPS_PER_CORE = 32
#: at most this many warps share one column
MAX_KSPLIT = 8


def ksplit_for(N: int, units: int, sg: int, caps, rows: int = 1) -> int:
    """Warps per output column (split-K inside a block, a power of two): the fewest that give
    the GEMV :data:`SPLIT_WARPS_PER_CORE` warps per compute unit, while each warp keeps at
    least two lane rounds of 16-byte units (``units`` per column; one round when x has more
    than :data:`~.matmul_match.MAX_M` ``rows``: a narrow matmul's unit is then ``rows`` times the work) and
    slices stay whole lane rounds. Why: one warp per column leaves a narrow projection with
    few warps per SM and few bytes in flight; measured on an H200 (bf16 weights, graph-replayed,
    ``bench/gpu_run/gemv_sweep.py``): N x K = 1024 x 4096 went from 6.8 to 3.7-3.9 us with
    4-8 warps per column, 4096 x 14336 from 34.1 to 29.0 us with 2, 2048 x 2048 from 4.7 to
    3.5 us with 4; wide projections (N = 8192 and more) gain nothing."""
    cores = max(1, int(getattr(caps, "cores", 1) or 1))
    r = 1 if rows > MAX_M else 2                       # lane rounds a warp keeps
    ks = 1
    while ks < MAX_KSPLIT and N * ks < SPLIT_WARPS_PER_CORE * cores and \
            units % (2 * ks * sg) == 0 and units // (2 * ks) >= r * sg:
        ks *= 2
    return ks


#: weights prefetched before the grid-dependency wait on sm_90 targets
#: (:meth:`_Kernel.prefetch_weights`); ``POOT_GPU_PREFETCH=0`` turns it off (to compare)
PREFETCH = settings.get_flag("POOT_GPU_PREFETCH")
#: ... for GEMVs whose weights are at most this many bytes. Measured on an H200 (graph
#: replay, bench/results/cuda_decode.md, session 12): the latency-bound GEMVs gain (SmolLM2's step 681 -> 655 us,
#: Llama-3.2-1B's q/k/v 6.4 -> 6.2 us) while the bandwidth-bound ones lose, their prefetches
#: taking bandwidth from the predecessor still streaming (1B gate/up 18.8 -> 20.5 us, down
#: 10.4 -> 11.5 us). Prefetching only a 512-byte window of each column of the larger ones
#: (one load a lane) did not gain either: with it (and fused GEMVs' prefetch kept, which
#: SmolLM2 gained from: 526.6 -> 522.4 us) the 1B step went 905.4 -> 908.2 us (same-GPU A/B,
#: bench/results/cuda_decode.md).
PREFETCH_MAX_BYTES = 16 << 20
#: most matmuls of one x a GEMV kernel computes together (see :class:`~.matmul_match.GemvMatch`)
MAX_MATMULS = 4
#: tuning knobs (None: the rules above); set by the GEMV sweep benchmark, not by planning
TUNING: dict[str, int | None] = {"warps": None, "unroll": None, "ksplit": None,
                                 "lanes": None, "parts": None}


def gemm_defers(fn: ir.Operation, m: GemvMatch, caps) -> bool:
    """Whether the GEMV leaves region ``fn`` (matched as ``m``) to the tensor-core GEMM: a
    narrow one past :data:`~.matmul_match.MAX_M` rows, or one of dense bf16/f16 weights from
    :data:`~.matmul_match.GEMM_FROM_M` rows, where the GEMM takes it (its strategy decides: a target with
    mma, one matmul, no folded norm). The dense 16-bit regions only region folding makes (a
    norm folded in front, the gate and up matmuls of one x) are refused outright on an mma
    target: the fold is then not taken, the norm stays its own region and the GEMM takes
    each matmul."""
    if not gemm_rows(m) or (G.matrix_op(caps) is None and G.EMULATE_MMA is None):
        return False
    if dense16(m) and (m.prologue or len(m.weights) > 1):
        return True
    return G.gemm(fn, caps) is not None


def gemv(fn: ir.Operation, caps) -> Synthesized | None:
    """Decode GEMV regions (see the module doc); None for anything else."""
    sg = getattr(caps, "subgroup_size", None)
    if not sg:
        return None                 # shuffles need the device's real subgroup width
    m = match(fn, max_matmuls=MAX_MATMULS) or match_indexed(fn, max_matmuls=MAX_MATMULS)
    if m is None:
        return None
    rows = 1 if m.idx is not None else m.M         # rows a block computes
    if rows * len(m.weights) > max(2 * MAX_M, SMALL_N_MAX_M if m.N <= SMALL_N else 0):
        return None                 # accumulators per lane: registers
    if m.idx is None and gemm_defers(fn, m, caps):
        return None
    vec = "sm_90" in (getattr(caps, "features", None) or ())
    kern = _Kernel(m, sg, 1, vec, TUNING["unroll"] or 4)
    # (an indexed region's M rows are M GEMVs of N columns side by side: grid y)
    ksplit = TUNING["ksplit"] or ksplit_for(m.N * (m.M // rows), kern.units(), sg, caps, rows)
    if kern.units() % (ksplit * sg):
        ksplit = 1                   # slices of whole lane rounds only
    # lanes per column: a whole warp by default. Several columns a warp (8 lanes each for the
    # 18 units of a K = 576 4-bit row) measured no faster on an H200 for a 49152-column LM head
    # (34.6 vs 35.6 us) and slower for 576-column projections (2.7 vs 2.2 us, one-warp
    # blocks); the knob stays for the sweep (bench/results/cuda_decode.md, session 12)
    lanes = TUNING["lanes"] or sg
    if lanes > sg or sg % lanes:
        return None
    warps = TUNING["warps"] or (8 if ksplit > 1 else
                                _warps(-(-m.N * (m.M // rows) // (sg // lanes)), caps))
    if warps % ksplit:
        ksplit = 1
    if m.prologue and (m.N * m.K * len(m.weights) * 8 > PROLOGUE_MAX_EXTRA_BYTES or
                       (not m.deferred and (ksplit > 1 or
                                            len(m.prologue) > PROLOGUE_MAX_LOOPS))):
        # cost rules: see PROLOGUE_MAX_EXTRA_BYTES (a deferred norm too: reading the norm's
        # weight next to h and accumulating h^2 made bandwidth-bound GEMVs issue-bound on an
        # H200: Llama-3.2-1B's LM head 124 -> 218 us, its q/k/v 6.4 + 1.7 -> 8.5 us, while
        # SmolLM2's K = 576 projections gained); and a GEMV that wants split-K is
        # bandwidth-starved, so a per-warp norm would cost more than the norm's own launch;
        # PROLOGUE_MAX_LOOPS bounds the loops a warp runs before its dot
        return None
    kern.warps, kern.ksplit, kern.lanes = warps, ksplit, lanes
    try:
        text, slots, consts = kern.kernel(fn)
    except ScalarUnsupported:
        return None
    grid = (-(-m.N // (warps // ksplit * (sg // lanes))), m.M // rows, 1)
    return Synthesized(text, [Launch("kernel", slots, "poot_gemv", "gemv", grid,
                                     (warps * sg, 1, 1))], consts=consts)


__all__ = ["BLOCK_PARTS", "MAX_MATMULS", "PART_FORMATS", "PROLOGUE_MAX_EXTRA_BYTES",
           "PROLOGUE_MAX_LOOPS", "TUNING", "gemm_defers", "gemv", "ksplit_for"]
