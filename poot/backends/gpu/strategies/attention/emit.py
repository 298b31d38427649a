"""Emit: the flash-decoding kernels of a matched region under its plan
(:func:`emit_attention`), as ``gpu.module`` text; within a subgroup every reduction is a
``gpu.shuffle`` butterfly.

1. *split*, grid ``(splits, row groups, batch)``, block ``(W * sg,)``: a block serves ``R``
   query rows of one batch index (for GQA decode all the query heads of a kv head, so K and
   V are read once for them) over one chunk of ``C`` keys. A computed q is evaluated once
   per block into workgroup memory (``R x D`` f32, by all the block's threads, then a
   barrier). Each of its ``W`` subgroups (:func:`~.plan.plan_attention` picks ``W``: 1 for
   split chunks, up to :data:`~.plan.MAX_SUBGROUPS` for the one-launch plan) walks the
   chunk's key batches ``w, w + W, ...`` (interleaved: with a causal mask the visible keys
   spread evenly; a subgroup that may get no batch is guarded by an ``scf.if``, never a
   zero-trip loop) with the online softmax below, then the subgroups merge their
   ``(m, l, acc)`` through workgroup memory after a barrier, each thread of the block
   merging the ``W`` states of some outputs by the combine rule (2.). A subgroup's lanes
   form ``KL`` keys x ``DL`` lanes per key; it walks ``KL`` keys at a time: the mask of each
   lane's key per row (loaded, or computed), then with a non-constant ``i1`` mask a
   subgroup vote skips a key batch that no row sees (exact: its keys have weight 0 and
   leave the running state as it is, see below); each lane takes its share of the ``R``
   dot products of its key (f32; q rows are uniform loads), a butterfly over the key's
   lanes completes them, then scale, soft cap and mask as the op says; a butterfly over the
   keys gives the batch max, the running max/sum are rescaled (online softmax, Milakov &
   Gimelshein 2018, "Online normalizer calculation for softmax"), and the accumulators
   ``acc[r, dv]`` (lanes over ``dv``) take ``sum_t p_t v[s0 + t, dv]`` with ``p_t``
   broadcast from key ``t``'s lanes (``gpu.shuffle idx``). It writes ``(m, l, acc)`` of the
   chunk to a scratch buffer, or the output directly when there is one chunk (no combine
   launch, no scratch).
2. *combine* (Flash-Decoding, Dao et al. 2023, "Flash-Decoding for long-context
   inference"), one thread per output element, merging the chunks (several at a time so
   their loads issue together) by the same online rule: ``M = max_c m_c``,
   ``w_c = exp(m_c - M)``, ``out = sum_c w_c acc_c / sum_c w_c l_c``.

Masking edge cases, exactly as the op: with an ``i1`` mask a masked score is -1e30 and its
weight exactly 0, the denominator is ``max(l, 1)``, so a row with no visible key gives zeros;
with an additive bias a ``-inf`` score has weight 0 without ``exp(-inf - -inf)`` (a chunk or
a whole row of ``-inf`` gives zeros, never NaN). A skipped key batch leaves ``(m, l, acc)``
unchanged where computing it would give ``m = max(m, -1e30)`` with the same ``l`` and
``acc`` (weights 0): the two differ only while ``l = 0, acc = 0`` (``m = -inf`` vs
``-1e30``), where any later rescale multiplies zeros, and a chunk that stays empty has
weight ``exp(-inf - M) = 0`` or ``1`` (all chunks empty) on zeros in the combine (and
likewise a subgroup's state in the in-block merge). So the results are the same for finite
values and scores above the -1e30 sentinel (but the sign of a zero), and a skipped batch's
V rows are not even read (no ``0 * inf``).

The paged op's refinement (a masked key contributes nothing even if a reused block holds
inf/NaN there): a ``-inf`` bias gives the score ``-inf`` whatever ``q . k`` is (never
``inf - inf``), an i1-masked score is the sentinel whatever it is; one subgroup vote per key
batch (an i32 of two bits ORed over the lanes) says whether any (row, key) of the batch is
alive (else the batch is skipped, for either mask kind: exact as above) and whether any is
dead (masked, or past the chunk). A batch with a dead one accumulates ``p * select(p > 0, v,
0)`` per row (a zero weight adds nothing, as the oracle's ``_visible_products``); a full
batch keeps the plain products. Difference from the oracle: only a *visible* key holding a
non-finite value whose weight underflows to exactly 0 (the oracle drops it, the plain
product gives NaN); the sequence's own keys are finite in any real step. Keys past the
sequence's last visible key are skipped by the vote, their K/V rows never read; and where a
block is one subgroup walking a chunk of three batches or more (the split plans: long
tables, large batches), the subgroup first evaluates the mask over the chunk, each lane
over keys ``lane, lane + sg, ...`` with no dependent chain, and walks only the batches from
the first to the last key any row sees (the others would all be skipped: same result), so
decode cost follows the sequence's length (and a sliding window's), not the table width.

q8_0 pools (paged only, :mod:`poot.dialects.kv_quant`): a lane loads its key's (or value's)
i8 elements and their f16 scale from the scales plane, indexed like the pool through the same
staged table entry, and takes ``f32(q) * f32(d)`` as the element (the oracle's numbers); on a
target without 16-bit storage (wgpu) the scales plane binds as ``memref<N/2 x i32>`` and a
scale is its word's half, its bits widened in registers (``AttentionPlan.scale_words``); a
dot-product round's ``V`` consecutive elements (``V | 32``) share one scale load, and come
from one 32-bit word load where they are 4 aligned values (the K pool then binds as
``memref<N/4 x i32>``). Nothing dequantizes the cache beforehand: each step reads 1.0625
bytes a value instead of 2.

Buffers: every argument read is a flat memref (``memref<N x storage>``: f32, f16, i8 for i1
and for q8_0 values, i16 words for bf16; a packed weight as its bytes), a constant the scalar emitter cannot inline
a constant buffer (``("const", k)``); the scratch holds ``acc[B*M, splits, Dv]`` then
``(m, l)[B*M, splits]`` (f32); the in-block merge's workgroup buffer ``acc[W, R, Dv]`` then
``(m, l)[W, R]``; a paged block's staged table entries ``i32[NT]``
(:func:`~.plan.table_entries`).

The split kernel is emitted by :class:`SplitKernel`'s steps, in the order
:meth:`SplitKernel.emit` lists them (each step's SSA names and hoisted constants follow the
previous ones'); the combine kernel by :func:`combine_kernel`.
"""

from __future__ import annotations

from poot.backends.gpu.kernels import WG_ALIGN, Launch
from poot.backends.gpu.strategies.emit import Synthesized
from poot.backends.gpu.strategies.attention.body import (
    F,
    Body,
    FlatArgs,
    PrefixedNames,
    broadcast_strides,
    butterfly,
    denom_div,
    flat_type,
    for_,
    lane_store,
    merge_dims,
    offsets,
    rescale_w,
    yield_,
    yield_open,
)
from poot.backends.gpu.strategies.attention.match import AttentionRegion
from poot.backends.gpu.strategies.attention.plan import (
    MAX_GRID,
    WORD_MAX_THREADS,
    AttentionPlan,
    table_entries,
    unroll,
)
from poot.dialects.kv_quant import Q8_0
from poot.dialects.types import type_from_mlir

#: the score a masked key takes with an i1 mask (poot.dialects.ops.attention.MASKED_SCORE)
MASKED_SCORE = -1e30
#: read a q8_0 K pool as 32-bit words, four values a load (see :meth:`SplitKernel.k_words`);
#: False: one byte load a value (bench/gpu_run/attn_bench.py times both)
Q8_WORDS = True


class SplitKernel:
    """The split kernel (``gpu.func @split``) of ``reg`` under ``plan`` (see the module doc),
    its text built in one :class:`~.body.Body` by the steps :meth:`emit` runs in order. The
    steps share the kernel's SSA values as attributes (``tid``, ``lane``, the operands' base
    offsets, the walk's bounds and running state ...)."""

    def __init__(self, reg: AttentionRegion, plan: AttentionPlan):
        self.reg, self.plan = reg, plan
        self.sg, self.DL, self.KL, self.R = plan.sg, plan.DL, plan.KL, plan.R
        self.C, self.NS, self.W, self.TB = plan.C, plan.NS, plan.W, plan.TB
        self.S, self.D, self.Dv, self.M = reg.S, reg.D, reg.Dv, reg.M
        self.nb, self.nr = len(reg.batch), len(reg.rows)
        self.NR = reg.B * reg.M
        self.ndv = -(-reg.Dv // plan.sg)
        # kernel parameters: the arguments read (each once, in argument order), the
        # constant buffers of computed operands, then the output or the scratch
        self.ftypes = [type_from_mlir(a.type) for a in reg.fn.regions[0].blocks[0].arguments]
        self.used: set[int] = set()
        self.out_t = f"memref<{self.NR * self.Dv}xf32>"
        self.scr_n = self.NR * self.NS * (self.Dv + 2)
        self.scr_t = f"memref<{self.scr_n}xf32>"
        self.ml_base = self.NR * self.NS * self.Dv     # (m, l) pairs after the accumulators
        self.b = Body()
        self.em = PrefixedNames()
        self.em.lines = self.b.lines       # one body: Body's ops and the scalar emitter's
        self.se = FlatArgs(reg.fn, self.em, [f"%a{i}" for i in range(len(self.ftypes))],
                           [flat_type(t) for t in self.ftypes], self.used.add)
        self.workgroup: list[tuple[str, str]] = []     # (name, memref type) per buffer
        self.qs_t = None
        self.words = {reg.k.arg} if self.k_words() else set()
        # fp8 pools (e4m3fn bits, one f32 scale a head vector): decoded by the hardware
        self.fp8 = {x.arg for x, sc in ((reg.k, reg.paged.k_scale), (reg.v, reg.paged.v_scale))
                    if self.per_head(sc)} if reg.paged is not None else set()
        # q8_0 scales planes read as i32 words of two f16s (a target without 16-bit storage)
        self.half_words = {x.arg for x in (reg.paged.k_scale, reg.paged.v_scale) if x} \
            if plan.scale_words else set()

    def emit(self) -> tuple[str, list[Launch], list]:
        """The ``gpu.module @attention`` text up to the split kernel's end (the caller adds
        the combine kernel and the closing brace), its launch, and the constant buffers."""
        self.thread_ids()
        self.operand_bases()
        self.row_offsets()
        self.chunk_bounds()
        if self.reg.q is None:
            self.stage_q()
        if self.reg.paged is not None:
            self.stage_table()
        if self.workgroup:
            self.b.raw("gpu.barrier")
        self.lane_setup()
        self.walk_bounds()
        self.open_walk()
        with self.se.scope():          # what the scalar emitter computes per key stays inside
            state = self.key_batch()
        fin = self.close_walk(state)
        self.write_chunk(fin)
        self.b.raw("gpu.return")
        return self.module_text()

    # ---- operands

    def pname(self, a: int) -> str:
        """Kernel parameter name of argument ``a`` (marking it read)."""
        self.used.add(a)
        return f"%a{a}"

    def ptype(self, a: int) -> str:
        if a in self.words:        # a q8_0 K pool's bytes as i32 words
            return f"memref<{self.ftypes[a].numel // 4}xi32>"
        if a in self.half_words:   # a q8_0 scales plane's f16s as i32 words
            return f"memref<{self.ftypes[a].numel // 2}xi32>"
        return flat_type(self.ftypes[a])

    def k_words(self) -> bool:
        """Whether the K pool is q8_0 values read as little-endian i32 words, the four values
        of a lane's round (``V = 4`` consecutive elements from a multiple of 4) from one load
        (a byte load a value makes four L1 requests where one does): when :data:`Q8_WORDS`,
        every element offset of a lane's round is a multiple of 4 (unit head-dim stride, the
        other strides and the offset multiples of 4), no other operand reads the pool
        (multi-head latent attention's V is a slice of it: byte loads there), and a block is
        at most :data:`~.plan.WORD_MAX_THREADS` threads (the split plans: long contexts,
        large batches, where the bytes a step reads decide its time; the one-launch plans of
        16 subgroups run at 64 registers a thread, which word loads overran at D = 128 where
        byte loads fit)."""
        reg = self.reg
        k = reg.k
        if not Q8_WORDS or reg.paged is None or reg.paged.k_scale is None or \
                reg.v.arg == k.arg or unroll(reg.D, self.DL)[0] != 4 or \
                self.TB > WORD_MAX_THREADS:
            return False
        return k.strides[-1] == 1 and k.offset % 4 == 0 and \
            all(st % 4 == 0 for st in k.strides[:-1])

    def word(self, a: int, idx: str) -> str:
        """Word ``idx // 4`` of word-read argument ``a`` (``idx`` a multiple of 4)."""
        b = self.b
        return b(f"memref.load {self.pname(a)}[{b(f'arith.divui {idx}, {b.c(4)} : index')}]"
                 f" : {self.ptype(a)}")

    def word_value(self, w: str, u: int) -> str:
        """Byte ``u`` (from the lowest address) of i32 word ``w`` as a signed value in f32
        (shifted down, truncated, converted), emitted where the value is used; an fp8 K
        pool's byte decoded as e4m3 (:meth:`fp8_pair`)."""
        b = self.b
        if self.reg.k.arg in self.fp8:
            x = b(f"arith.shrui {w}, {b.c(16 * (u // 2), 'i32')} : i32") if u > 1 else w
            return self.fp8_pair(b(f"arith.trunci {x} : i32 to i16"), u % 2)
        x = b(f"arith.shrui {w}, {b.c(8 * u, 'i32')} : i32") if u else w
        x = b(f"arith.trunci {x} : i32 to i8")
        return b(f"arith.sitofp {x} : i8 to f32")

    def load_f(self, a: int, idx: str) -> str:
        """Element ``idx`` of argument ``a`` in f32: f16 extended, bf16 (i16 words) shifted
        into f32's high half."""
        b = self.b
        x = b(f"memref.load {self.pname(a)}[{idx}] : {self.ptype(a)}")
        et = self.reg.arg_types[a][0]
        if et == "bf16":
            w = b(f"arith.extui {x} : i16 to i32")
            w = b(f"arith.shli {w}, {b.c(16, 'i32')} : i32")
            return b(f"arith.bitcast {w} : i32 to f32")
        if et == "i8" and a in self.fp8:
            return self.fp8_pair(b(f"arith.extui {x} : i8 to i16"), 0)
        if et == "i8":
            return b(f"arith.sitofp {x} : i8 to f32")
        return x if et == F else b(f"arith.extf {x} : {et} to f32")

    def fp8_pair(self, h: str, u: int) -> str:
        """Value ``u`` (0: the low byte) of the two e4m3fn values in i16 ``h``, in f32: one
        ``cvt.rn.f16x2.e4m3x2`` (``nvvm.convert.f8x2.to.f16x2``, sm_89+) for the pair, exact
        (every e4m3 value is an f16), then widened."""
        b = self.b
        v = b(f"llvm.bitcast {h} : i16 to vector<2xi8>")
        f = b(f"nvvm.convert.f8x2.to.f16x2 {v} : vector<2xi8> (f8E4M3FN) -> vector<2xf16>")
        return b(f"arith.extf {b(f'vector.extract {f}[{u}] : f16 from vector<2xf16>')} "
                 f": f16 to f32")

    def per_head(self, view) -> bool:
        """Whether ``view`` (a scales plane, or None) holds fp8's one f32 scale a head
        vector (q8_0's are f16, one per 32 values)."""
        return view is not None and self.reg.arg_types[view.arg][0] == F

    def scale_of(self, view, base: str, key: str, d: str) -> str:
        """The f32 q8_0 scale of element ``d`` (index) of a q8_0 pool's row: ``view`` its
        scales plane, ``base`` the block's batch offset into it, ``key`` the key's
        ``(block, row)`` offset (:meth:`key_offsets`)."""
        b = self.b
        if self.per_head(view):          # fp8: the head vector's one scale
            return self.load_f(view.arg, b.add(base, key))
        g = b(f"arith.divui {d}, {b.c(Q8_0.group)} : index")
        idx = b.add(b.add(base, key), b.mul(g, view.strides[-1]))
        if view.arg in self.half_words:
            return self.half_of_word(view.arg, idx)
        return self.load_f(view.arg, idx)

    def half_of_word(self, a: int, idx: str) -> str:
        """f16 element ``idx`` of argument ``a`` read as i32 words (:attr:`half_words`):
        half ``idx % 2`` (little-endian: the low half first) of word ``idx // 2``, its bits
        widened to f32 (``arith.extf`` of the bits, which a target without 16-bit floats
        rewrites into exact integer arithmetic, :func:`poot.backends.vulkan.codegen.
        half_to_float`)."""
        b = self.b
        w = b(f"memref.load {self.pname(a)}[{b(f'arith.divui {idx}, {b.c(2)} : index')}] : "
              f"{self.ptype(a)}")
        odd = b(f"arith.index_cast {b(f'arith.remui {idx}, {b.c(2)} : index')} : index to i32")
        sh = b(f"arith.muli {odd}, {b.c(16, 'i32')} : i32")
        w = b(f"arith.shrui {w}, {sh} : i32")
        h = b(f"arith.bitcast {b(f'arith.trunci {w} : i32 to i16')} : i16 to f16")
        return b(f"arith.extf {h} : f16 to f32")

    def bfly(self, x: str, op: str, lo: int, hi: int, ty: str = F) -> str:
        return butterfly(self.b, x, op, lo, hi, self.sg, ty)

    # ---- steps, in emit order

    def thread_ids(self) -> None:
        """Thread and block ids: subgroup ``sgi`` of the block and ``lane`` within it
        (subgroups are consecutive thread ids), the lane's key ``kk`` and its share ``dd``
        of the key's ``DL`` lanes."""
        b, sg, DL = self.b, self.sg, self.DL
        self.tid = tid = b("gpu.thread_id x")
        self.lane = lane = b(f"arith.remui {tid}, {b.c(sg)} : index") if self.W > 1 else tid
        self.sgi = b(f"arith.divui {tid}, {b.c(sg)} : index") if self.W > 1 else b.c(0)
        self.split = b("gpu.block_id x")
        self.rg = b("gpu.block_id y")
        self.bi = b("gpu.block_id z")
        self.dd = b(f"arith.remui {lane}, {b.c(DL)} : index") if DL > 1 else b.c(0)
        self.kk = b(f"arith.divui {lane}, {b.c(DL)} : index") if DL > 1 else lane

    def operand_bases(self) -> None:
        """The block's batch index ``bi`` as element offsets into q, k, v, the mask and the
        block table (``qb``, ``kb``, ``vb``, ``mb``, ``tb``)."""
        reg, b, nb, nr = self.reg, self.b, self.nb, self.nr
        q, k, v, mk, pg = reg.q, reg.k, reg.v, reg.mask, reg.paged
        full = tuple(reg.batch + reg.rows) + (self.S,)
        self.mst = mst = broadcast_strides(mk, full) if mk else None
        self.qst = qst = q.strides if q else (0,) * (nb + nr + 1)
        # q8_0 pools' scales planes [NB, bs, H, D / 32] (paged only): indexed like the pools
        self.scales = [x for x in ((pg.k_scale, pg.v_scale) if pg else ()) if x is not None]
        if pg is None:
            kbst, vbst = k.strides[:nb], v.strides[:nb]
        else:
            # pools [NB, bs, H, D]: the batch (b, h) moves by h only; b picks the table row
            kbst, vbst = (0, k.strides[2]), (0, v.strides[2])
        bvecs = [qst[:nb], kbst, vbst] + [(0, x.strides[2]) for x in self.scales] + \
            ([mst[:nb]] if mk else []) + ([(pg.table.strides[0], 0)] if pg else [])
        boffs = offsets(b, self.bi, merge_dims(reg.batch, bvecs), len(bvecs))
        self.qb, self.kb, self.vb = (b.add(o, b.c(x.offset if x else 0))
                                     for o, x in zip(boffs[:3], (q, k, v)))
        sb = [b.add(o, b.c(x.offset)) for o, x in zip(boffs[3:], self.scales)]
        # the bases of k's and v's scales (None: a float pool); k's come first
        self.ksb = sb.pop(0) if pg and pg.k_scale else None
        self.vsb = sb.pop(0) if pg and pg.v_scale else None
        self.mb = b.add(boffs[3 + len(self.scales)], b.c(mk.offset)) if mk else None
        self.tb = b.add(boffs[-1], b.c(pg.table.offset)) if pg else None

    def row_offsets(self) -> None:
        """Per query row ``j`` of the block: its index ``rows[j]`` and its q and mask row
        offsets; the coordinates the scalar emitter reads for a computed q or mask (batch
        ``bco``, rows ``rco[j]``)."""
        reg, b, se, nb, nr, R, M = self.reg, self.b, self.se, self.nb, self.nr, self.R, self.M
        mk, mst = reg.mask, self.mst
        rvecs = [self.qst[nb:nb + nr]] + ([mst[nb:nb + nr]] if mk else [])
        rdims = merge_dims(reg.rows, rvecs)
        self.bco = se.delinearize(self.bi, reg.batch)
        self.rows, self.qrow, self.mrow, self.rco = [], [], [], []
        for j in range(R):
            r = b.add(b.mul(self.rg, R), b.c(j))
            rc = b(f"arith.minui {r}, {b.c(M - 1)} : index")
            offs = offsets(b, rc, rdims, len(rvecs))
            self.rows.append(r)
            self.qrow.append(b.add(self.qb, offs[0]))
            self.mrow.append(b.add(self.mb, offs[1]) if mk else None)
            self.rco.append(se.delinearize(rc, reg.rows) if reg.mask_value is not None
                            else None)

    def chunk_bounds(self) -> None:
        """The block's chunk of keys ``[s_begin, s_end)``."""
        b = self.b
        self.s_begin = b.mul(self.split, self.C)
        self.s_end = b(f"arith.minui {b.add(self.s_begin, b.c(self.C))}, {b.c(self.S)} : index")

    def stage_q(self) -> None:
        """A computed q (RoPE'd, ...): each block evaluates its R rows once into workgroup
        memory ``%qs``, its threads together (the barrier follows the staging)."""
        reg, b, se, R, D = self.reg, self.b, self.se, self.R, self.D
        self.qs_t = qs_t = f"memref<{R * D}xf32, #gpu.address_space<workgroup>>"
        self.workgroup.append(("%qs", qs_t))
        b.raw(f"scf.for %qi = {self.tid} to {b.c(R * D)} step {b.c(self.TB)} {{")
        with se.scope():
            jq = b(f"arith.divui %qi, {b.c(D)} : index")
            rq = b(f"arith.minui {b.add(b.mul(self.rg, R), jq)}, {b.c(self.M - 1)} : index")
            dq = b(f"arith.remui %qi, {b.c(D)} : index") if D > 1 else 0
            x = se.value(reg.q_value, list(self.bco) + se.delinearize(rq, reg.rows) + [dq])
            b.raw(f"memref.store {x}, %qs[%qi] : {qs_t}")
        b.raw("}")

    def stage_table(self) -> None:
        """Paged: the table entries of the chunk's KV blocks (from ``w0 = s_begin / bs``),
        clamped into ``[0, NB)`` once, staged in workgroup memory ``%tbl`` (with q's loads,
        one barrier)."""
        b, pg = self.b, self.reg.paged
        NT = table_entries(self.reg, self.C)
        self.tbl_t = tbl_t = f"memref<{NT}xi32, #gpu.address_space<workgroup>>"
        self.workgroup.append(("%tbl", tbl_t))
        self.w0 = b(f"arith.divui {self.s_begin}, {b.c(pg.bs)} : index") if self.NS > 1 \
            else b.c(0)
        ti = b.fresh()
        b.raw(f"scf.for {ti} = {self.tid} to {b.c(NT)} step {b.c(self.TB)} {{")
        wt = b(f"arith.minui {b.add(self.w0, ti)}, {b.c(pg.TW - 1)} : index")
        a = pg.table.arg
        e = b(f"memref.load {self.pname(a)}[{b.add(self.tb, b.mul(wt, pg.table.strides[1]))}]"
              f" : {self.ptype(a)}")
        it = pg.table_dtype
        e = b(f"arith.maxsi {e}, {b.c(0, it)} : {it}")
        e = b(f"arith.minsi {e}, {b.c(pg.NB - 1, it)} : {it}")
        if it != "i32":
            e = b(f"arith.trunci {e} : {it} to i32")
        b.raw(f"memref.store {e}, %tbl[{ti}] : {tbl_t}")
        b.raw("}")
        self.s_last = b(f"arith.subi {self.s_end}, {b.c(1)} : index")

    def key_offsets(self, sk: str, views) -> list[str]:
        """Paged: element offsets of key ``sk`` (in this chunk) in each pool view: its block
        ``tbl[sk / bs - w0]``, its row ``sk % bs``."""
        b, pg = self.b, self.reg.paged
        wi = b(f"arith.subi {b(f'arith.divui {sk}, {b.c(pg.bs)} : index')}, {self.w0} : index")
        blk = b(f"arith.index_cast {b(f'memref.load %tbl[{wi}] : {self.tbl_t}')} : i32 to index")
        row = b(f"arith.remui {sk}, {b.c(pg.bs)} : index") if pg.bs > 1 else b.c(0)
        return [b.add(b.mul(blk, x.strides[0]), b.mul(row, x.strides[1])) for x in views]

    def lane_setup(self) -> None:
        """This lane's head-dim elements (``d = (j * DL + dd) * V + u``, ``j < J``,
        ``u < V``: ``qlane[r]`` per row) and the walk's initial state ``(m, l, acc)``."""
        b, q, R, D = self.b, self.reg.q, self.R, self.D
        self.V, self.J, self.JU = unroll(D, self.DL)
        if q is not None:
            self.qlane = [b.add(self.qrow[j], b.mul(b.mul(self.dd, self.V), q.strides[-1]))
                          for j in range(R)]
        else:
            self.qlane = [b.add(b.c(j * D), b.mul(self.dd, self.V)) for j in range(R)]
        self.ninf, self.zero = b.c(float("-inf"), F), b.c(0.0, F)
        self.state0 = [self.ninf] * R + [self.zero] * R + [self.zero] * (R * self.ndv)

    def mask_of(self, j: int, sc: str) -> str | None:
        """Row j's mask at key ``sc``: i1 visibility, or the f32 bias (None: none)."""
        reg, b, nb, nr = self.reg, self.b, self.nb, self.nr
        if reg.mask_value is not None:
            ms = reg.mask_shape
            idx = [0 if ms[i] == 1 else self.bco[i] for i in range(nb)] + \
                [0 if ms[nb + i] == 1 else self.rco[j][i] for i in range(nr)] + \
                [0 if ms[-1] == 1 else sc]
            return self.se.value(reg.mask_value, idx)
        mk = reg.mask
        if mk is not None:
            idx = b.add(self.mrow[j], b.mul(sc, self.mst[-1]))
            mv = b(f"memref.load {self.pname(mk.arg)}[{idx}] : {self.ptype(mk.arg)}")
            if reg.mask_kind == "i1":
                mv = b(f"arith.cmpi {'eq' if reg.negate else 'ne'}, {mv}, {b.c(0, 'i8')} : i8")
            return mv
        if reg.mask_kind == "i1":
            return b.c(bool(reg.mask_const), "i1")
        return b.c(reg.mask_const, F) if reg.mask_const else None

    def alive_of(self, mv: str | None, valid: str) -> str:
        """Whether a (row, key) may weigh: visible (i1) or a bias above -inf, and in the
        chunk (``valid``)."""
        b = self.b
        if self.reg.mask_kind == "i1":
            return b(f"arith.andi {mv}, {valid} : i1")
        if mv is None:
            return valid
        return b(f"arith.andi {valid}, {b(f'arith.cmpf one, {mv}, {self.ninf} : f32')} : i1")

    def walk_bounds(self) -> None:
        """Subgroup ``sgi`` walks the chunk's key batches ``sgi, sgi + W, ...`` over
        ``[s_lo, s_hi)``; a subgroup that may get none (a chunk shorter than W batches) is
        guarded (``guard``): never a zero-trip loop with iter_args (lavapipe's SPIR-V path
        got those wrong)."""
        reg, b, KL, W = self.reg, self.b, self.KL, self.W
        self.s_lo = b.add(self.s_begin, b.mul(self.sgi, KL))
        self.s_hi = self.s_end
        last = self.S - (self.NS - 1) * self.C            # the shortest chunk: the last
        self.guard = W > 1 and (W - 1) * KL >= last
        masked = reg.mask_value is not None or reg.mask is not None
        if reg.paged is not None and W == 1 and masked and self.C >= 3 * KL:
            self.visible_span()
            self.guard = True          # the walk may be empty: never a zero-trip scf.for

    def visible_span(self) -> None:
        """Paged, one subgroup walking a chunk of several batches: first find the chunk's
        first and last key any row sees (each lane over keys lane, lane + sg, ...:
        independent mask evaluations, no vote chain) and narrow ``[s_lo, s_hi)`` to the
        batches between, so a short sequence in a wide table costs its length (the batches
        left out would all be skipped by the vote: the result is the same)."""
        b, se, sg, S, R = self.b, self.se, self.sg, self.S, self.R
        i32 = "i32"
        big = b.c(2 ** 31 - 1, i32)
        fv, pv = b.fresh(), b.fresh()
        b.raw(f"{fv}:2 = scf.for {pv} = {b.c(0)} to {b.c(-(-self.C // sg))} step {b.c(1)} "
              f"iter_args({fv}_lo = {big}, {fv}_hi = {b.c(-1, i32)}) -> ({i32}, {i32}) {{")
        with se.scope():
            key = b.add(b.add(self.s_begin, b.mul(pv, sg)), self.lane)
            kvalid = b(f"arith.cmpi ult, {key}, {self.s_end} : index")
            ksc = b(f"arith.minui {key}, {b.c(S - 1)} : index")
            seen_k = None
            for j in range(R):
                a_ = self.alive_of(self.mask_of(j, ksc), kvalid)
                seen_k = a_ if seen_k is None else b(f"arith.ori {seen_k}, {a_} : i1")
            k32 = b(f"arith.index_cast {key} : index to {i32}")
            lo_ = b(f"arith.select {seen_k}, {k32}, {big} : {i32}")
            hi_ = b(f"arith.select {seen_k}, {k32}, {b.c(-1, i32)} : {i32}")
            lo_ = b(f"arith.minsi {fv}_lo, {lo_} : {i32}")
            hi_ = b(f"arith.maxsi {fv}_hi, {hi_} : {i32}")
            b.raw(f"scf.yield {lo_}, {hi_} : {i32}, {i32}")
        b.raw("}")
        lo_ = self.bfly(f"{fv}#0", "minsi", 1, sg, i32)
        hi_ = self.bfly(f"{fv}#1", "maxsi", 1, sg, i32)
        # [first batch start, last seen + 1): the batch grid from s_lo, clipped to the chunk
        first = b(f"arith.index_cast {b(f'arith.minsi {lo_}, {b.c(S, i32)} : {i32}')} : "
                  f"{i32} to index")
        first = b(f"arith.maxui {first}, {self.s_lo} : index")
        off = b(f"arith.divui {b(f'arith.subi {first}, {self.s_lo} : index')}, "
                f"{b.c(self.W * self.KL)} : index")
        self.s_lo = b.add(self.s_lo, b.mul(off, self.W * self.KL))
        s_hi = b(f"arith.index_cast {b(f'arith.addi {hi_}, {b.c(1, i32)} : {i32}')} : "
                 f"{i32} to index")
        self.s_hi = b(f"arith.minui {s_hi}, {self.s_end} : index")

    def open_walk(self) -> None:
        """Open the (guarded) ``scf.for`` over the key batches carrying ``(m, l, acc)``
        (``m_in``, ``l_in``, ``acc_in``), and this lane's key ``s`` (``valid``: inside the
        chunk; ``sc``: clamped into the keys)."""
        b, R, ndv = self.b, self.R, self.ndv
        if self.guard:
            any_ = b(f"arith.cmpi ult, {self.s_lo}, {self.s_hi} : index")
            self.gres = b.fresh()
            b.raw(f"{self.gres}:{len(self.state0)} = scf.if {any_} -> "
                  f"({', '.join([F] * len(self.state0))}) {{")
        self.loop, its = for_(b, "%s0", self.s_lo, self.s_hi, b.c(self.W * self.KL),
                              self.state0)
        self.m_in, self.l_in = its[:R], its[R:2 * R]
        self.acc_in = [its[2 * R + j * ndv:2 * R + (j + 1) * ndv] for j in range(R)]
        self.s = b.add("%s0", self.kk)
        self.valid = b(f"arith.cmpi ult, {self.s}, {self.s_end} : index")
        self.sc = b(f"arith.minui {self.s}, {b.c(self.S - 1)} : index")

    def key_batch(self) -> list[str]:
        """The loop body over one batch of ``KL`` keys: the masks, the vote that may skip
        the batch, the scores, the online-softmax update and the accumulation; returns the
        batch's new ``(m, l, acc)``."""
        b = self.b
        self.key_masks()
        seen, partial = self.batch_vote()
        if seen is not None:
            state = self.m_in + self.l_in + [a for row in self.acc_in for a in row]
            taken = b.fresh()
            b.raw(f"{taken}:{len(state)} = scf.if {seen} -> ({', '.join([F] * len(state))}) {{")
        dots = self.scores()
        self.softmax_update(dots)
        new_state = self.m_out + self.l_out + self.accumulate(partial)
        if seen is not None:
            yield_open(b, new_state)
            yield_(b, state)
            new_state = [f"{taken}#{i}" for i in range(len(state))]
        return new_state

    def key_masks(self) -> None:
        """The mask of this lane's key, per row: i1 visibility ``vis`` (in the chunk), or
        the f32 bias ``bias`` (None: none)."""
        self.vis, self.bias = [], []
        for j in range(self.R):
            mv = self.mask_of(j, self.sc)
            if self.reg.mask_kind == "i1":
                self.vis.append(self.b(f"arith.andi {mv}, {self.valid} : i1"))
            else:
                self.bias.append(mv)

    def batch_vote(self) -> tuple[str | None, str | None]:
        """The subgroup's vote on the batch: ``(seen, partial)``, ``seen`` (None: no vote)
        whether any row sees any of its keys (else the batch is skipped: its keys would take
        weight exactly 0 and leave ``(m, l, acc)`` as they are, but for ``m = -inf`` instead
        of -1e30 while ``l = acc = 0``, see the module doc), ``partial`` (paged only) whether
        any (row, key) is dead. Votes with an i1 mask that is not constant, and paged."""
        reg, b, sg = self.reg, self.b, self.sg
        self.refine = reg.paged is not None
        if self.refine:
            return self.paged_vote()
        if not (reg.mask_kind == "i1" and reg.mask_const is None):
            return None, None
        seen = self.vis[0]
        for x in self.vis[1:]:
            seen = b(f"arith.ori {seen}, {x} : i1")
        seen = b(f"arith.extui {seen} : i1 to i32")
        seen = self.bfly(seen, "ori", 1, sg, "i32")
        return b(f"arith.cmpi ne, {seen}, {b.c(0, 'i32')} : i32"), None

    def paged_vote(self) -> tuple[str, str]:
        """Paged (the op's refinement: a masked key contributes nothing, whatever a reused
        block holds): one vote gives both whether any (row, key) of the batch is alive (bit
        0: else the batch is skipped, for either mask kind) and whether any is dead (bit 1:
        a partial batch, whose V rows are selected by weight)."""
        b = self.b
        alive = self.vis if self.reg.mask_kind == "i1" else \
            [self.alive_of(x, self.valid) for x in self.bias]
        anyl, deadl = alive[0], None
        for x in alive[1:]:
            anyl = b(f"arith.ori {anyl}, {x} : i1")
        for x in alive:
            nx = b(f"arith.xori {x}, {b.c(True, 'i1')} : i1")
            deadl = nx if deadl is None else b(f"arith.ori {deadl}, {nx} : i1")
        i32 = "i32"
        w_any = b(f"arith.extui {anyl} : i1 to {i32}")
        w_dead = b(f"arith.shli {b(f'arith.extui {deadl} : i1 to {i32}')}, {b.c(1, i32)} : {i32}")
        word = self.bfly(b(f"arith.ori {w_any}, {w_dead} : {i32}"), "ori", 1, self.sg, i32)
        seen = b(f"arith.andi {word}, {b.c(1, i32)} : {i32}")
        seen = b(f"arith.cmpi ne, {seen}, {b.c(0, i32)} : {i32}")
        partial = b(f"arith.andi {word}, {b.c(2, i32)} : {i32}")
        partial = b(f"arith.cmpi ne, {partial}, {b.c(0, i32)} : {i32}")
        return seen, partial

    def scores(self) -> str:
        """Each lane's share of its key's ``R`` dot products (``J`` rounds of ``V``
        elements, ``JU`` unrolled): the ``scf.for`` result holding them."""
        reg, b, R, DL, V = self.reg, self.b, self.R, self.DL, self.V
        q, k = reg.q, reg.k
        ks = reg.paged.k_scale if reg.paged is not None else None
        if reg.paged is None:
            kkey = b.mul(self.sc, k.strides[-2])
        else:   # a lane past the chunk reads the chunk's last key (its block is staged)
            sk = b(f"arith.minui {self.s}, {self.s_last} : index")
            kkey, *skey = self.key_offsets(sk, [k] + ([ks] if ks else []))
        klane = b.add(b.add(self.kb, kkey), b.mul(b.mul(self.dd, V), k.strides[-1]))
        dl_, dots = for_(b, "%j0", b.c(0), b.c(self.J), b.c(self.JU), [self.zero] * R)
        cur = list(dots)
        for ju in range(self.JU):
            jd = b.mul(b.add("%j0", b.c(ju)), DL * V)       # element offset of round j
            # q8_0: the round's V elements (from a multiple of V, V | 32) share one scale
            ksc = self.scale_of(ks, self.ksb, skey[0], b.add(jd, b.mul(self.dd, V))) \
                if ks else None
            kw = self.word(k.arg, b.add(klane, jd)) if k.arg in self.words else None
            for u in range(V):
                du = b.add(jd, b.c(u))
                kv = self.word_value(kw, u) if kw else \
                    self.load_f(k.arg, b.add(klane, b.mul(du, k.strides[-1])))
                if ksc is not None:
                    kv = b(f"arith.mulf {kv}, {ksc} : f32")
                for j in range(R):
                    if q is not None:
                        qv = self.load_f(q.arg, b.add(self.qlane[j], b.mul(du, q.strides[-1])))
                    else:
                        qv = b(f"memref.load %qs[{b.add(self.qlane[j], du)}] : {self.qs_t}")
                    pr = b(f"arith.mulf {qv}, {kv} : f32")
                    cur[j] = b(f"arith.addf {cur[j]}, {pr} : f32")
        yield_(b, cur)
        return dl_

    def softmax_update(self, dots: str) -> None:
        """Per row: the dot product completed over the key's lanes, scaled, soft-capped and
        masked as the op says; the batch max and the rescaled running max/sum (``m_out``,
        ``l_out``), this lane's weight ``e_lane`` and the accumulators' factor ``corr``."""
        reg, b, DL, sg, ninf, zero = self.reg, self.b, self.DL, self.sg, self.ninf, self.zero
        self.m_out, self.l_out, self.e_lane, self.corr = [], [], [], []
        for j in range(self.R):
            x = self.bfly(f"{dots}#{j}", "addf", 1, DL)
            if reg.scale != 1.0:
                x = b(f"arith.mulf {x}, {b.c(reg.scale, F)} : f32")
            if reg.softcap:
                y = b(f"arith.mulf {x}, {b.c(1.0 / reg.softcap, F)} : f32")
                y = b(f"math.tanh {y} : f32")
                x = b(f"arith.mulf {y}, {b.c(reg.softcap, F)} : f32")
            xm, keep = self.masked_score(j, x)
            xm = b(f"arith.select {self.valid}, {xm}, {ninf} : f32")
            # batch max and sum over the KL keys (lanes of one key hold the same value)
            mn = b(f"arith.maximumf {self.m_in[j]}, {self.bfly(xm, 'maximumf', DL, sg)} : f32")
            cr = rescale_w(b, self.m_in[j], mn)
            e = b(f"math.exp {b(f'arith.subf {xm}, {mn} : f32')} : f32")
            e = b(f"arith.select {keep}, {e}, {zero} : f32")
            es = self.bfly(e, "addf", DL, sg)
            self.m_out.append(mn)
            self.l_out.append(b(f"arith.addf {b(f'arith.mulf {self.l_in[j]}, {cr} : f32')}, "
                                f"{es} : f32"))
            self.e_lane.append(e)
            self.corr.append(cr)

    def masked_score(self, j: int, x: str) -> tuple[str, str]:
        """Row ``j``'s score ``x`` masked (the i1 sentinel, or the bias added) and whether
        its key keeps a weight."""
        b, ninf = self.b, self.ninf
        if self.reg.mask_kind == "i1":
            return b(f"arith.select {self.vis[j]}, {x}, {b.c(MASKED_SCORE, F)} : f32"), \
                self.vis[j]
        bias = self.bias[j]
        xm = b(f"arith.addf {x}, {bias} : f32") if bias is not None else x
        if self.refine and bias is not None:
            # a -inf bias masks the key whatever its score (inf - inf is no NaN here)
            dead = b(f"arith.cmpf oeq, {bias}, {ninf} : f32")
            xm = b(f"arith.select {dead}, {ninf}, {xm} : f32")
        keep = b(f"arith.cmpf ogt, {xm}, {ninf} : f32")
        return xm, b(f"arith.andi {keep}, {self.valid} : i1")

    def accumulate(self, partial: str | None) -> list[str]:
        """``acc = acc * corr + sum_t p_t v[s0 + t]`` (``p_t`` from the lanes of key ``t``;
        lanes over dv). With ``partial``, a batch with a dead (row, key) takes the weighted
        select, a full one the plain products (its keys are the sequence's own: finite)."""
        b, R, ndv = self.b, self.R, self.ndv
        flat0 = [b(f"arith.mulf {self.acc_in[j][i]}, {self.corr[j]} : f32") for j in range(R)
                 for i in range(ndv)]
        if partial is None:
            return self.v_loop(flat0, False)
        vres = b.fresh()
        b.raw(f"{vres}:{len(flat0)} = scf.if {partial} -> ({', '.join([F] * len(flat0))}) {{")
        yield_open(b, self.v_loop(flat0, True))
        yield_(b, self.v_loop(flat0, False))
        return [f"{vres}#{i}" for i in range(len(flat0))]

    def v_loop(self, flat0: list[str], safe: bool) -> list[str]:
        """The accumulation over the batch's KL keys (``TU`` unrolled); ``safe``: each
        row's product is taken only where its weight is positive (a masked key's value may
        be inf/NaN)."""
        reg, b, sg, Dv, ndv, zero = self.reg, self.b, self.sg, self.Dv, self.ndv, self.zero
        v, KL = reg.v, self.KL
        vs = reg.paged.v_scale if reg.paged is not None else None
        TU = min(KL, 8)
        tv = b.fresh()
        tl, ta = for_(b, tv, b.c(0), b.c(KL), b.c(TU), flat0)
        acc = list(ta)
        for tu in range(TU):
            t = b.add(tv, b.c(tu))
            if reg.paged is None:
                st_ = b(f"arith.minui {b.add('%s0', t)}, {b.c(self.S - 1)} : index")
                voff = b.add(self.vb, b.mul(st_, v.strides[-2]))
            else:
                st_ = b(f"arith.minui {b.add('%s0', t)}, {self.s_last} : index")
                vkey, *skey = self.key_offsets(st_, [v] + ([vs] if vs else []))
                voff = b.add(self.vb, vkey)
            vv = []
            for i in range(ndv):
                dv = b.add(self.lane, b.c(i * sg))
                if (i + 1) * sg > Dv:
                    dv = b(f"arith.minui {dv}, {b.c(Dv - 1)} : index")
                x = self.load_f(v.arg, b.add(voff, b.mul(dv, v.strides[-1])))
                if vs is not None:       # q8_0: dequantized as it is loaded
                    x = b(f"arith.mulf {x}, {self.scale_of(vs, self.vsb, skey[0], dv)} : f32")
                vv.append(x)
            src = b(f"arith.index_cast {b.mul(t, self.DL)} : index to i32")
            for j in range(self.R):
                p = b.fresh()
                b.raw(f"{p}, {p}_ok = gpu.shuffle idx {self.e_lane[j]}, {src}, "
                      f"{b.c(sg, 'i32')} : f32")
                live = b(f"arith.cmpf ogt, {p}, {zero} : f32") if safe else None
                for i in range(ndv):
                    x = b(f"arith.select {live}, {vv[i]}, {zero} : f32") if safe else vv[i]
                    pv = b(f"arith.mulf {p}, {x} : f32")
                    acc[j * ndv + i] = b(f"arith.addf {acc[j * ndv + i]}, {pv} : f32")
        yield_(b, acc)
        return [f"{tl}#{i}" for i in range(len(ta))]

    def close_walk(self, state: list[str]) -> list[str]:
        """Close the key loop (and its guard): the subgroup's final ``(m, l, acc)``."""
        b = self.b
        yield_(b, state)
        fin = [f"{self.loop}#{i}" for i in range(len(self.state0))]
        if self.guard:
            yield_open(b, fin)
            yield_(b, self.state0)
            fin = [f"{self.gres}#{i}" for i in range(len(self.state0))]
        return fin

    def write_chunk(self, fin: list[str]) -> None:
        """Write the chunk: ``(m, l, acc)`` to the scratch or, with one chunk, the output;
        a block of several subgroups merges their states first."""
        b = self.b
        self.rowbase = b.mul(self.bi, self.M)
        self.dst, self.dst_t = ("%out", self.out_t) if self.NS == 1 else ("%scr", self.scr_t)
        self.is0 = b(f"arith.cmpi eq, {self.lane}, {b.c(0)} : index")
        if self.W == 1:
            self.write_rows(fin)
        else:
            self.stash_states(fin)
            self.merge_states()

    def out_slot(self, row: str) -> str:
        """The output row (one chunk) or scratch slot (row, split) of block row ``row``."""
        b = self.b
        grow = b.add(self.rowbase, row)
        return grow if self.NS == 1 else b.add(b.mul(grow, self.NS), self.split)

    def write_rows(self, fin: list[str]) -> None:
        """One subgroup a block: each lane stores its accumulators of each row (divided by
        the sum with one chunk), lane 0 the scratch's ``(m, l)``."""
        reg, b, R, sg, Dv, NS = self.reg, self.b, self.R, self.sg, self.Dv, self.NS
        for j in range(R):
            inr = b(f"arith.cmpi ult, {self.rows[j]}, {b.c(self.M)} : index")
            b.raw(f"scf.if {inr} {{")
            slot = self.out_slot(self.rows[j])
            lres = fin[R + j]
            for i in range(self.ndv):
                dv = b.add(self.lane, b.c(i * sg))
                a = fin[2 * R + j * self.ndv + i]
                val = denom_div(b, a, lres, reg.mask_kind) if NS == 1 else a
                lane_store(b, f"memref.store {val}, {self.dst}[{b.add(b.mul(slot, Dv), dv)}] : "
                           f"{self.dst_t}", dv, Dv, (i + 1) * sg > Dv)
            if NS > 1:
                b.raw(f"scf.if {self.is0} {{")
                self.store_ml(slot, fin[j], lres)
                b.raw("}")
            b.raw("}")

    def store_ml(self, slot: str, m: str, ll: str) -> None:
        """``(m, l)`` of scratch slot ``slot``."""
        b = self.b
        mi = b.add(b.c(self.ml_base), b.mul(slot, 2))
        b.raw(f"memref.store {m}, %scr[{mi}] : {self.scr_t}")
        b.raw(f"memref.store {ll}, %scr[{b.add(mi, b.c(1))}] : {self.scr_t}")

    def stash_states(self, fin: list[str]) -> None:
        """W subgroups: each puts its ``(m, l, acc)`` in workgroup memory ``%red``
        (``acc[w, j, dv]``, then ``(m, l)[w, j]``), then a barrier."""
        b, R, sg, Dv, sgi = self.b, self.R, self.sg, self.Dv, self.sgi
        self.red_t = red_t = f"memref<{self.W * R * (Dv + 2)}xf32, #gpu.address_space<workgroup>>"
        self.workgroup.append(("%red", red_t))
        self.wml = self.W * R * Dv
        for j in range(R):
            base = b.mul(b.add(b.mul(sgi, R), b.c(j)), Dv)
            for i in range(self.ndv):
                dv = b.add(self.lane, b.c(i * sg))
                lane_store(b, f"memref.store {fin[2 * R + j * self.ndv + i]}, "
                           f"%red[{b.add(base, dv)}] : {red_t}", dv, Dv, (i + 1) * sg > Dv)
        b.raw(f"scf.if {self.is0} {{")
        for j in range(R):
            mi = b.add(b.c(self.wml), b.mul(b.add(b.mul(sgi, R), b.c(j)), 2))
            b.raw(f"memref.store {fin[j]}, %red[{mi}] : {red_t}")
            b.raw(f"memref.store {fin[R + j]}, %red[{b.add(mi, b.c(1))}] : {red_t}")
        b.raw("}")
        b.raw("gpu.barrier")

    def merge_states(self) -> None:
        """The block's threads take the ``R x Dv`` outputs, each merging the W subgroups'
        states by the combine kernel's rule, and store them (or the chunk's merged state)."""
        b, R, Dv, red_t, wml = self.b, self.R, self.Dv, self.red_t, self.wml
        # no iter_args: a zero-trip loop (threads past R x Dv) is fine
        b.raw(f"scf.for %e = {self.tid} to {b.c(R * Dv)} step {b.c(self.TB)} {{")
        je = b(f"arith.divui %e, {b.c(Dv)} : index")
        de = b(f"arith.remui %e, {b.c(Dv)} : index")
        re = b.add(b.mul(self.rg, R), je)
        b.raw(f"scf.if {b(f'arith.cmpi ult, {re}, {b.c(self.M)} : index')} {{")
        ms, ls, os_ = [], [], []
        for w in range(self.W):
            sl = b.add(b.c(w * R), je)
            mi = b.add(b.c(wml), b.mul(sl, 2))
            ms.append(b(f"memref.load %red[{mi}] : {red_t}"))
            ls.append(b(f"memref.load %red[{b.add(mi, b.c(1))}] : {red_t}"))
            os_.append(b(f"memref.load %red[{b.add(b.mul(sl, Dv), de)}] : {red_t}"))
        mx = ms[0]
        for mu in ms[1:]:
            mx = b(f"arith.maximumf {mx}, {mu} : f32")
        L, O = self.zero, self.zero
        for mu, lu, ou in zip(ms, ls, os_):
            wt = rescale_w(b, mu, mx)
            L = b(f"arith.addf {L}, {b(f'arith.mulf {wt}, {lu} : f32')} : f32")
            O = b(f"arith.addf {O}, {b(f'arith.mulf {wt}, {ou} : f32')} : f32")
        slot = self.out_slot(re)
        val = denom_div(b, O, L, self.reg.mask_kind) if self.NS == 1 else O
        b.raw(f"memref.store {val}, {self.dst}[{b.add(b.mul(slot, Dv), de)}] : {self.dst_t}")
        if self.NS > 1:
            b.raw(f"scf.if {b(f'arith.cmpi eq, {de}, {b.c(0)} : index')} {{")
            self.store_ml(slot, mx, L)
            b.raw("}")
        b.raw("}")
        b.raw("}")

    def module_text(self) -> tuple[str, list[Launch], list]:
        """The module's opening and the split kernel's signature and body; its launch."""
        params = sorted(self.used)
        consts = list(self.se.consts)
        sig = ", ".join([f"%a{a}: {self.ptype(a)}" for a in params] +
                        [f"{n}: {c[0]}" for n, c in zip(self.se.const_names, consts)])
        sig += f", %out: {self.out_t}" if self.NS == 1 else f", %scr: {self.scr_t}"
        wg = f" workgroup({', '.join(f'{n}: {t} {WG_ALIGN}' for n, t in self.workgroup)})" \
            if self.workgroup else ""
        body = "\n".join(self.b.head + self.em.prologue + self.b.lines)
        text = ("gpu.module @attention {\n"
                f"gpu.func @split({sig}){wg} kernel {{\n{body}\n}}\n")
        slots = [("arg", a) for a in params] + [("const", i) for i in range(len(consts))]
        launch = Launch("kernel", slots + ([("out", 0)] if self.NS == 1 else [("scratch", 0)]),
                        "attention", "split", (self.NS, self.plan.RG, self.reg.B),
                        (self.TB, 1, 1), strategy="flash_decode")
        return text, [launch], consts


def combine_kernel(reg: AttentionRegion, plan: AttentionPlan, scr_t: str, out_t: str,
                   ml_base: int) -> tuple[str, Launch]:
    """The combine kernel (``gpu.func @combine``) and its launch: one thread per output
    element, an online merge of the ``NS`` chunks' ``(m, l, acc)`` in the scratch, ``U`` at
    a time (their loads issued together); past :data:`~.plan.MAX_GRID` blocks a 2-D grid of
    rows of ``MAX_GRID``."""
    NR, Dv, NS = reg.B * reg.M, reg.Dv, plan.NS
    c = Body()
    tid = c("gpu.thread_id x")
    blk = c("gpu.block_id x")
    nblk = -(-NR * Dv // plan.CT)
    gx = min(nblk, MAX_GRID)
    if nblk > gx:
        blk = c.add(blk, c.mul(c("gpu.block_id y"), gx))
    item = c.add(c.mul(blk, plan.CT), tid)
    ok = c(f"arith.cmpi ult, {item}, {c.c(NR * Dv)} : index")
    itc = c(f"arith.minui {item}, {c.c(NR * Dv - 1)} : index")
    row = c(f"arith.divui {itc}, {c.c(Dv)} : index")
    dv = c(f"arith.remui {itc}, {c.c(Dv)} : index")
    slot0 = c.mul(row, NS)
    U = min(NS, 16)
    ninf, z = c.c(float("-inf"), F), c.c(0.0, F)
    cl, (Mi, Li, Oi) = for_(c, "%w0", c.c(0), c.c(NS), c.c(U), [ninf, z, z])
    ms, ls, accs, oks = [], [], [], []
    for u in range(U):
        w = c.add("%w0", c.c(u))
        okw = None
        if NS % U:
            okw = c(f"arith.cmpi ult, {w}, {c.c(NS)} : index")
            w = c(f"arith.minui {w}, {c.c(NS - 1)} : index")
        sl = c.add(slot0, w)
        mi = c.add(c.c(ml_base), c.mul(sl, 2))
        mu = c(f"memref.load %scr[{mi}] : {scr_t}")
        ls.append(c(f"memref.load %scr[{c.add(mi, c.c(1))}] : {scr_t}"))
        accs.append(c(f"memref.load %scr[{c.add(c.mul(sl, Dv), dv)}] : {scr_t}"))
        if okw is not None:
            mu = c(f"arith.select {okw}, {mu}, {ninf} : f32")
        ms.append(mu)
        oks.append(okw)
    mn = Mi
    for mu in ms:
        mn = c(f"arith.maximumf {mn}, {mu} : f32")
    cr = rescale_w(c, Mi, mn)
    L = c(f"arith.mulf {Li}, {cr} : f32")
    O = c(f"arith.mulf {Oi}, {cr} : f32")
    for mu, lu, au, okw in zip(ms, ls, accs, oks):
        w = rescale_w(c, mu, mn)
        if okw is not None:
            w = c(f"arith.select {okw}, {w}, {z} : f32")
        L = c(f"arith.addf {L}, {c(f'arith.mulf {w}, {lu} : f32')} : f32")
        O = c(f"arith.addf {O}, {c(f'arith.mulf {w}, {au} : f32')} : f32")
    yield_(c, [mn, L, O])
    res = denom_div(c, f"{cl}#2", f"{cl}#1", reg.mask_kind)
    c.raw(f"scf.if {ok} {{")
    c.raw(f"memref.store {res}, %out[{itc}] : {out_t}")
    c.raw("}")
    c.raw("gpu.return")
    text = f"gpu.func @combine(%scr: {scr_t}, %out: {out_t}) kernel {{\n{c.text()}\n}}\n"
    launch = Launch("kernel", [("scratch", 0), ("out", 0)], "attention", "combine",
                    (gx, -(-nblk // gx), 1), (plan.CT, 1, 1), strategy="flash_decode")
    return text, launch


def emit_attention(reg: AttentionRegion, plan: AttentionPlan) -> Synthesized:
    """The ``gpu.module @attention`` text and launches of ``reg`` under ``plan``: the split
    kernel, then (``NS > 1``) the combine kernel and the scratch it reads. Raises
    :class:`~poot.backends.gpu.strategies.emit.ScalarUnsupported` for a computed q or mask
    the scalar emitter does not cover."""
    split = SplitKernel(reg, plan)
    text, launches, consts = split.emit()
    scratch = []
    if plan.NS > 1:
        ctext, launch = combine_kernel(reg, plan, split.scr_t, split.out_t, split.ml_base)
        text += ctext
        launches.append(launch)
        scratch.append((split.scr_t, split.scr_n * 4))
    text += "}\n"
    return Synthesized(text, launches, scratch, consts)


__all__ = ["MASKED_SCORE", "SplitKernel", "combine_kernel", "emit_attention"]
