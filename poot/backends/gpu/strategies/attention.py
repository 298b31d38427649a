"""Flash-decoding for a ``poot.attention`` or ``poot.paged_attention`` dispatch region: a
*split* kernel over chunks of
the key axis and a *combine* kernel that merges the chunks (one kernel when one chunk covers
every key: short decode contexts take blocks of several subgroups so that one launch does it
all), synthesized from the shapes and the target's subgroup size and core count.

What it takes (:func:`match_attention`): a dispatch function whose root is ``poot.attention``
(semantics: :class:`poot.dialects.ops.attention.Attention`) with

* k ``[batch..., S, D]`` and v ``[batch..., S, Dv]`` (the KV caches; ``nb = rank(k) - 2``
  batch dims) each reached from an f32, f16 or bf16 function argument through
  ``poot.reshape`` / ``poot.transpose`` / ``poot.broadcast`` / ``poot.slice`` views and
  casts widening to f32 only, read in place in the argument's dtype (a one-block paged
  cache, whose gather canonicalization removed, is such a view of the pool);
* q ``[batch..., rows..., D]`` (any float dtype; GQA groups are rows dims of q) such a view, or
  else *any* elementwise-class expression of the arguments (:data:`~poot.backends.gpu.
  strategies.pointwise.ELEMENTWISE_CLASS`): e.g. RoPE folded in by
  :func:`~poot.backends.gpu.merge.fold_regions`, its cos/sin computed from the positions.
  The matcher takes small contractions too (:func:`~poot.backends.gpu.strategies.
  pointwise.per_element`), but :func:`flash_decode` refuses a q holding one (a LoRA
  expand): every block evaluates its q rows, a split plan's chunks each again, and K terms
  an element are not worth that; the expand keeps a kernel of its own, fused beside the
  KV write;
* the mask (``i1`` visibility or ``f32`` additive bias, broadcastable to
  ``[batch..., rows..., S]``) such a view, a splat ``poot.constant``, ``poot.unary not`` of
  a view, or else any elementwise-class expression (a causal mask ``iota <= position``);
* its result reaching the function's only result through ``poot.reshape`` only (so the
  output is row-major ``[batch, rows, Dv]``), and no other op in the function.

or whose root is ``poot.paged_attention`` (:class:`poot.dialects.ops.attention.PagedAttention`:
q ``[B, H, rows..., D]``, the batch is ``(B, H)``) with the block pools ``[NB, bs, H, D]``
(f32, f16 or bf16, read in their dtype) and the block table ``[B, TW]`` (i32/i64) strided
views of arguments, q and the mask as above. Key ``j`` of sequence ``b`` (``S = TW * bs``
keys, key j is position j) is pool row ``(clamp(table[b, j // bs], 0, NB - 1), j % bs)``:
each block first stages the table entries of its chunk's KV blocks, clamped, in workgroup
memory (at most :data:`TABLE_MAX_ENTRIES`; a longer chunk splits), with the computed q's
loads under one barrier; a lane's key address is then ``entry * stride(NB) + (j % bs) *
stride(bs)`` (the pools are read in place, never gathered).

Each view chain is resolved to a strided index map (:class:`View`: logical coordinates ->
element offset in the argument buffer; NumPy's no-copy reshape rule); a computed q or mask
is evaluated per element by :class:`~poot.backends.gpu.strategies.emit.ScalarEmitter`. A
k or v that is not a strided view, or an expression the scalar emitter does not cover,
makes the region fall back (``None``).

The kernels (:func:`emit`; within a subgroup every reduction is a ``gpu.shuffle``
butterfly):

1. *split*, grid ``(splits, row groups, batch)``, block ``(W * sg,)``: a block serves ``R``
   query rows of one batch index (for GQA decode all the query heads of a kv head, so K and
   V are read once for them) over one chunk of ``C`` keys. A computed q is evaluated once
   per block into workgroup memory (``R x D`` f32, by all the block's threads, then a
   barrier). Each of its ``W`` subgroups (:func:`plan_attention` picks ``W``: 1 for split
   chunks, up to :data:`MAX_SUBGROUPS` for the one-launch plan) walks the chunk's key
   batches ``w, w + W, ...`` (interleaved: with a causal mask the visible keys spread
   evenly; a subgroup that may get no batch is guarded by an ``scf.if``, never a zero-trip
   loop) with the online softmax below, then the subgroups merge their ``(m, l, acc)``
   through workgroup memory after a barrier, each thread of the block merging the ``W``
   states of some outputs by the combine rule (2.). A subgroup's lanes form ``KL``
   keys x ``DL`` lanes per key (:func:`plan_attention` picks ``DL``); it walks ``KL`` keys
   at a time: the mask of each lane's key per row (loaded, or computed), then
   with a non-constant ``i1`` mask a subgroup vote skips a key batch that no row sees
   (exact: its keys have weight 0 and leave the running state as it is, see below); each
   lane takes its share of the ``R`` dot products of its key (f32; q rows are uniform
   loads), a butterfly over the key's lanes completes them, then scale, soft cap and mask
   as the op says; a butterfly over the keys gives the batch max, the running max/sum are
   rescaled (online softmax, Milakov & Gimelshein 2018, "Online normalizer calculation for
   softmax"), and the accumulators ``acc[r, dv]`` (lanes over ``dv``) take
   ``sum_t p_t v[s0 + t, dv]`` with ``p_t`` broadcast from key ``t``'s lanes (``gpu.shuffle
   idx``). It writes ``(m, l, acc)`` of the chunk to a scratch buffer, or the output
   directly when there is one chunk (no combine launch, no scratch).
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

Buffers: every argument read is a flat memref (``memref<N x storage>``: f32, f16, i8 for i1,
i16 words for bf16; a packed weight as its bytes), a constant the scalar emitter cannot inline
a constant buffer (``("const", k)``); the scratch holds ``acc[B*M, splits, Dv]`` then
``(m, l)[B*M, splits]`` (f32); the in-block merge's workgroup buffer ``acc[W, R, Dv]`` then
``(m, l)[W, R]``; a paged block's staged table entries ``i32[NT]`` (:func:`table_entries`).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from mlir import ir

from poot.backends.gpu.kernels import WG_ALIGN, Launch
from poot.backends.gpu.strategies.emit import (
    KernelEmitter,
    ScalarEmitter,
    ScalarUnsupported,
    Synthesized,
    buffer_type,
    small_contraction,
    storage_elem,
)
from poot.backends.gpu.strategies.pointwise import per_element
from poot.dialects.types import DType, TensorType, type_from_mlir

#: the score a masked key takes with an i1 mask (poot.dialects.ops.attention.MASKED_SCORE)
MASKED_SCORE = -1e30
#: register budget of the split kernel: accumulators per lane (rows x Dv / subgroup)
MAX_ACC_PER_LANE = 64
#: query rows one split block serves at most
MAX_ROWS = 16
#: split blocks aimed for per core (fills the GPU for decode, where rows are few)
BLOCKS_PER_CORE = 4
#: grid dimensions this strategy emits at most (Vulkan's guaranteed minimum)
MAX_GRID = 65535
#: subgroups one block of the single-kernel path holds at most
MAX_SUBGROUPS = 16
#: threads per block at most (256 when a lane holds more than MAX_ACC_PER_LANE / 2
#: accumulators: CUDA then keeps up to 255 registers per thread)
MAX_BLOCK_THREADS = 512
#: keys one subgroup walks at most (at the full capacity S) for the single-kernel path; past
#: it the key axis is split over blocks and a combine launch merges them (see plan_attention)
SINGLE_MAX_KEYS = 64
#: key elements (keys x head dim) the busiest subgroup of the single-kernel path may walk at
#: the full capacity S. Measured on an H200 (graph-replayed, bench/gpu_run/attn_bench.py):
#: with D = 128 (8 kv heads: 8 blocks) one launch beat split + combine at S = 512 (32 keys a
#: warp: 5.2-20.7 us over positions 0-511 against a flat 15-16 us) but lost at S = 1024 (64
#: keys: up to 37 us against 17.8); with D = 64, 64 keys a warp (S = 1024) still won on
#: average over the positions
SINGLE_MAX_KEY_ELEMS = 64 * 64
#: query rows per block at most for the single-kernel path (decode: the q heads of a kv head)
SINGLE_MAX_ROWS = 8
#: block-table entries a paged block stages in workgroup memory at most (4 KiB): a chunk
#: spans at most this many KV blocks (longer chunks split)
TABLE_MAX_ENTRIES = 1024


# ---- views -> strided index maps ---------------------------------------------------------------

@dataclass(frozen=True)
class View:
    """A strided view of function argument ``arg``'s buffer (elements, row-major storage):
    element ``[i0, i1, ...]`` of the view is at ``offset + sum(i_k * strides[k])``."""

    arg: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int = 0


def _row_major(shape) -> tuple[int, ...]:
    st, n = [], 1
    for s in reversed(shape):
        st.append(n)
        n *= s
    return tuple(reversed(st))


def reshape_strides(shape, strides, new_shape) -> tuple[int, ...] | None:
    """Strides that give the row-major reshape of a strided view ``(shape, strides)`` to
    ``new_shape`` without a copy, or None when no strides do (NumPy's
    ``_attempt_nocopy_reshape``: dims are matched in groups of equal product, and the old dims
    of a group must be contiguous relative to each other)."""
    old = [(n, s) for n, s in zip(shape, strides) if n != 1]
    new = list(new_shape)
    out = [0] * len(new)
    oi = 0
    nz = [i for i, n in enumerate(new) if n != 1]
    # walk the non-unit dims of both sides in groups of equal product
    k = 0
    while oi < len(old) or k < len(nz):
        if oi >= len(old) or k >= len(nz):
            return None
        op, np_ = old[oi][0], new[nz[k]]
        oj, kj = oi + 1, k + 1
        while op != np_:
            if op < np_:
                if oj >= len(old):
                    return None
                op *= old[oj][0]
                oj += 1
            else:
                if kj >= len(nz):
                    return None
                np_ *= new[nz[kj]]
                kj += 1
        for t in range(oi, oj - 1):
            if old[t][1] != old[t + 1][1] * old[t + 1][0]:
                return None
        st = old[oj - 1][1]
        for t in reversed(range(k, kj)):
            out[nz[t]] = st
            st *= new[nz[t]]
        oi, k = oj, kj
    return tuple(out)


def _owner(v: ir.Value):
    o = v.owner
    return None if isinstance(o, ir.Block) else o.operation


def _widening(op: ir.Operation) -> bool:
    """Whether ``op`` is a ``poot.cast`` from f16/bf16/f32 to f32 (exact: reading the source
    and extending it in the kernel is the cast)."""
    if op.name != "poot.cast":
        return False
    src, dst = (type_from_mlir(x.type).dtype for x in (op.operands[0], op.results[0]))
    return dst is DType.F32 and src in (DType.F32, DType.F16, DType.BF16)


def resolve_view(v: ir.Value, fn_args, widen: bool = False) -> View | None:
    """The strided map of ``v`` onto a function argument through view ops, or None.
    ``widen``: also through casts to f32 of a float argument (:func:`_widening`; the kernel
    reads the argument in its own dtype and extends it)."""
    chain = []
    while True:
        op = _owner(v)
        if op is None:
            break
        if widen and _widening(op):
            v = op.operands[0]              # same shape: the strides do not change
            continue
        if op.name not in ("poot.reshape", "poot.transpose", "poot.broadcast", "poot.slice"):
            return None
        chain.append(op)
        v = op.operands[0]
    idx = next((i for i, a in enumerate(fn_args) if a == v), None)
    if idx is None:
        return None
    t = type_from_mlir(v.type)
    if not isinstance(t, TensorType):
        return None
    shape, strides, off = tuple(t.shape), _row_major(t.shape), 0
    chain.reverse()
    for i, op in enumerate(chain):
        if op.name == "poot.reshape" and i + 1 < len(chain) and \
                chain[i + 1].name == "poot.reshape":
            continue          # reshapes compose: only the last one's shape matters
        rshape = tuple(type_from_mlir(op.results[0].type).shape)
        if op.name == "poot.reshape":
            st = reshape_strides(shape, strides, rshape)
            if st is None:
                return None
            strides = st
        elif op.name == "poot.transpose":
            perm = list(ir.DenseI64ArrayAttr(op.attributes["perm"]))
            strides = tuple(strides[p] for p in perm)
        elif op.name == "poot.broadcast":
            dims = list(ir.DenseI64ArrayAttr(op.attributes["dims"]))
            st = [0] * len(rshape)
            for j, d in enumerate(dims):
                st[d] = strides[j] if shape[j] == rshape[d] else 0
            strides = tuple(st)
        else:  # slice
            start = list(ir.DenseI64ArrayAttr(op.attributes["start"]))
            step = list(ir.DenseI64ArrayAttr(op.attributes["stride"]))
            off += sum(a * s for a, s in zip(start, strides))
            strides = tuple(s * k for s, k in zip(strides, step))
        shape = rshape
    return View(idx, shape, strides, off)


# ---- the region ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class PagedKV:
    """How a ``poot.paged_attention`` region reads its keys: ``table`` the block table's view
    (``[B, TW]``, integer ``table_dtype``), ``NB`` blocks of ``bs`` positions per pool. Key
    ``j`` of sequence ``b`` is pool row ``(clamp(table[b, j // bs], 0, NB - 1), j % bs)``;
    the region's ``k``/``v`` views are then the pools ``[NB, bs, H, D]``."""

    table: View
    table_dtype: str
    NB: int
    bs: int
    TW: int


@dataclass(frozen=True)
class AttentionRegion:
    """A matched region: operand views (q ``[batch..., rows..., D]``, k ``[batch..., S, D]``,
    v ``[batch..., S, Dv]``), the mask (``mask_kind`` ``"i1"``/``"f32"``; ``mask`` a view of
    the mask at its own (broadcastable) shape, or None with ``mask_const`` its splat value),
    ``negate`` (an i1 mask used through ``not``), the op's attributes, and ``arg_types``
    (element type per function argument).

    Computed operands: ``q`` None and ``q_value`` the attention's q operand when q is an
    elementwise-class expression of the arguments (a RoPE'd q), evaluated per element by the
    scalar emitter; likewise ``mask`` None, ``mask_const`` None and ``mask_value`` the mask
    operand (e.g. a causal mask compared from positions). ``fn`` is the dispatch function
    (what the scalar emitter reads)."""

    q: View | None
    k: View
    v: View
    mask: View | None
    mask_kind: str
    mask_const: float | bool | None
    negate: bool
    batch: tuple[int, ...]
    rows: tuple[int, ...]
    S: int
    D: int
    Dv: int
    scale: float
    softcap: float
    arg_types: tuple[tuple[str, int], ...]   # (element type, numel) per argument
    fn: ir.Operation
    q_value: ir.Value | None = None
    mask_value: ir.Value | None = None
    mask_shape: tuple[int, ...] = ()
    paged: "PagedKV | None" = None

    @property
    def B(self) -> int:
        return _prod(self.batch)

    @property
    def M(self) -> int:
        return _prod(self.rows)


def _prod(xs) -> int:
    n = 1
    for x in xs:
        n *= int(x)
    return n


def _slice_ops(vals) -> set:
    """The ops of ``vals``' backward slice inside the function (arguments excluded)."""
    seen: set = set()
    todo = list(vals)
    while todo:
        o = _owner(todo.pop())
        if o is None or o in seen:
            continue
        seen.add(o)
        todo.extend(o.operands)
    return seen


def match_attention(fn: ir.Operation) -> AttentionRegion | None:
    """The attention region of dispatch ``fn`` (poot level), or None when ``fn`` is anything
    else (see the module doc for what is taken)."""
    block = fn.regions[0].blocks[0]
    ops = [o.operation for o in block.operations]
    atts = [o for o in ops if o.name in ("poot.attention", "poot.paged_attention")]
    if len(atts) != 1 or not ops or ops[-1].name != "func.return" or len(ops[-1].operands) != 1:
        return None
    att = atts[0]
    paged = att.name == "poot.paged_attention"
    # the result reaches the return through reshapes only
    chain = {att, ops[-1]}
    r = ops[-1].operands[0]
    while r != att.results[0]:
        o = _owner(r)
        if o is None or o.name != "poot.reshape":
            return None
        chain.add(o)
        r = o.operands[0]
    args = list(block.arguments)
    arg_types = []
    for a in args:
        t = type_from_mlir(a.type)
        arg_types.append((t.dtype.value, _prod(t.shape)) if isinstance(t, TensorType)
                         else ("", 0))
    # k and v: strided views of arguments (the KV caches or block pools: read in place in
    # their dtype, never recomputed; a cast widening a cache to f32 is the load's extension)
    k, v = (resolve_view(att.operands[i], args, widen=True) for i in (1, 2))
    if k is None or v is None:
        return None
    # q: a strided view, else any elementwise-class expression (staged once per block)
    q = resolve_view(att.operands[0], args)
    q_value = None if q is not None else att.operands[0]
    qt, kt, vt = (type_from_mlir(x.type) for x in att.operands[:3])
    mt = type_from_mlir(att.operands[-1].type)
    pkv = None
    floats = (DType.F32, DType.F16, DType.BF16)
    if paged:
        # q [B, H, rows..., D]; pools [NB, bs, H, D] of one float dtype; table [B, TW]
        tt_ = type_from_mlir(att.operands[3].type)
        table = resolve_view(att.operands[3], args)
        if table is None or tt_.dtype not in (DType.I32, DType.I64) or \
                qt.dtype not in floats or kt.dtype not in floats or vt.dtype != kt.dtype:
            return None
        NB, bs, H = kt.shape[:3]
        B_, TW = tt_.shape
        batch, rows = (B_, H), tuple(qt.shape[2:-1])
        S, D, Dv = TW * bs, kt.shape[-1], vt.shape[-1]
        pkv = PagedKV(table, tt_.dtype.value, NB, bs, TW)
    else:
        if any(t.dtype not in floats for t in (qt, kt, vt)) or \
                any(arg_types[x.arg][0] not in ("f32", "f16", "bf16") for x in (k, v)):
            return None
        nb = len(kt.shape) - 2
        batch, rows = tuple(kt.shape[:nb]), tuple(qt.shape[nb:-1])
        S, D, Dv = kt.shape[-2], kt.shape[-1], vt.shape[-1]
    if S < 1 or D < 1 or Dv < 1 or not rows or len(mt.shape) != len(qt.shape):
        return None
    # the mask: a view, a splat constant, or not(view) for i1; else any elementwise-class
    # expression (evaluated per row and key)
    mval, negate = att.operands[-1], False
    mo = _owner(mval)
    if mo is not None and mo.name == "poot.unary" and \
            ir.StringAttr(mo.attributes["fn"]).value == "not":
        mval, negate = mo.operands[0], True
    kind = {DType.I1: "i1", DType.F32: "f32"}.get(mt.dtype)
    if kind is None:
        return None
    mview, mconst, mask_value = None, None, None
    mo = _owner(mval)
    if mo is not None and mo.name == "poot.constant" and \
            ir.DenseElementsAttr(mo.attributes["value"]).is_splat:
        sv = ir.DenseElementsAttr(mo.attributes["value"]).get_splat_value()
        mconst = bool(ir.IntegerAttr(sv).value) if kind == "i1" else \
            float(ir.FloatAttr(sv).value)
        if negate:
            mconst = not mconst
            negate = False
    else:
        mview = resolve_view(mval, args)
        if mview is None:
            mask_value, negate = att.operands[-1], False
    # every op of the region is accounted for: the result's reshapes, k/v (and table) views,
    # and q and the mask (views, or elementwise-class expressions the scalar emitter
    # computes)
    known = chain | _slice_ops(att.operands)
    if any(o not in known for o in ops):
        return None
    computed = [x for x in (q_value, mask_value) if x is not None]
    if not all(per_element(o) for o in _slice_ops(computed)):
        return None
    scale = float(ir.FloatAttr(att.attributes["scale"]).value)
    softcap = float(ir.FloatAttr(att.attributes["softcap"]).value)
    return AttentionRegion(q, k, v, mview, kind, mconst, negate, batch, rows, S, D, Dv,
                           scale, softcap, tuple(arg_types), fn, q_value, mask_value,
                           tuple(mt.shape), pkv)


# ---- planning ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class AttentionPlan:
    """``sg`` lanes per subgroup, ``DL`` lanes per key (``KL = sg // DL`` keys at a time);
    ``R`` rows per block, ``RG`` row groups; ``C`` keys per chunk, ``NS`` chunks (splits);
    ``CT`` threads per combine block; ``W`` subgroups per split block (``TB = W * sg``
    threads), which walk the chunk's key batches interleaved and merge their states through
    workgroup memory."""

    sg: int
    DL: int
    R: int
    RG: int
    C: int
    NS: int
    CT: int
    W: int = 1

    @property
    def KL(self) -> int:
        return self.sg // self.DL

    @property
    def TB(self) -> int:
        return self.W * self.sg


def _pow2_floor(n: int) -> int:
    p = 1
    while 2 * p <= n:
        p *= 2
    return p


def _unroll(D: int, DL: int) -> tuple[int, int, int]:
    """How the split kernel walks a key's ``D`` elements over its ``DL`` lanes: ``V``
    consecutive elements per step, ``J`` steps, ``JU`` of them unrolled (their loads issue
    together)."""
    V = next(x for x in (4, 2, 1) if D % (DL * x) == 0)
    J = D // (DL * V)
    JU = max(1, min(J, 16 // V))
    while J % JU:
        JU -= 1
    return V, J, JU


def batch_rounds(D: int, sg: int, DL: int) -> int:
    """Dependent memory round trips of one key batch in the split kernel: the unrolled rounds
    of K loads (``J / JU``) then the rounds of V loads (``KL / TU``, ``TU = min(KL, 8)``)."""
    _, J, JU = _unroll(D, DL)
    KL = sg // DL
    return J // JU + -(-KL // min(KL, 8))


def table_entries(reg: AttentionRegion, C: int) -> int:
    """Block-table entries a block of a paged region stages for a chunk of ``C`` keys (the
    KV blocks a chunk ``[s, s + C)`` can touch; 0 for a dense region)."""
    pg = reg.paged
    if pg is None:
        return 0
    n = C // pg.bs if C % pg.bs == 0 else (C + pg.bs - 2) // pg.bs + 1
    return max(1, min(pg.TW, n))


def _single_plan(reg: AttentionRegion, caps, sg: int, R: int, RG: int, dl_max: int,
                 CT: int) -> AttentionPlan | None:
    """The one-launch plan (``NS = 1``, ``W`` subgroups per block), or None when a subgroup
    would walk more than :data:`SINGLE_MAX_KEYS` keys or :data:`SINGLE_MAX_KEY_ELEMS` key
    elements (or nothing fits)."""
    ndv = -(-reg.Dv // sg)
    threads = MAX_BLOCK_THREADS if R * ndv <= MAX_ACC_PER_LANE // 2 else MAX_BLOCK_THREADS // 2
    wmax = _pow2_floor(max(1, min(MAX_SUBGROUPS, threads // sg)))
    # workgroup memory: the staged q (R x D) and W partial states (R x (Dv + 2)) per block
    shared = getattr(caps, "max_shared_bytes", 0) or 16384
    qbytes = 4 * R * reg.D if reg.q is None else 0
    # a paged region stages its whole table row (one chunk: every key)
    tbytes = 4 * table_entries(reg, reg.S)
    if tbytes > 4 * TABLE_MAX_ENTRIES:
        return None
    while wmax > 1 and qbytes + tbytes + 4 * wmax * R * (reg.Dv + 2) > shared:
        wmax //= 2
    if qbytes + tbytes + 4 * wmax * R * (reg.Dv + 2) > shared:
        return None
    best = None
    DL = 1
    while DL <= dl_max:
        if reg.D % DL == 0:
            KL = sg // DL
            nb = -(-reg.S // KL)                  # key batches at capacity
            W = 1
            while W <= wmax:
                per = -(-nb // W)                 # batches of the busiest subgroup
                key = (per * batch_rounds(reg.D, sg, DL), W, -DL)
                if best is None or key < best[0]:
                    best = (key, W, DL, per * KL)
                W *= 2
        DL *= 2
    if best is None or best[3] > SINGLE_MAX_KEYS or best[3] * reg.D > SINGLE_MAX_KEY_ELEMS:
        return None
    _, W, DL, _ = best
    KL = sg // DL
    C = -(-reg.S // KL) * KL
    return AttentionPlan(sg, DL, R, RG, C, 1, CT, W)


def plan_attention(reg: AttentionRegion, caps) -> AttentionPlan | None:
    """Block shapes for ``reg`` on a target of ``caps`` (None: not plannable here).

    Rows: all rows of a batch index per block up to the register budget
    (:data:`MAX_ROWS`, :data:`MAX_ACC_PER_LANE`; a computed q's staging buffer within the
    workgroup memory).

    *Split* plan (one subgroup per block): aim for :data:`BLOCKS_PER_CORE` split blocks per
    core, each as short a serial chain as that allows. Lanes per key ``DL``: the fewest (a
    power of two dividing ``D``, at most ``D / 8`` and the subgroup) with which one-batch
    chunks would give enough blocks, so few rows (decode) split each dot product over lanes
    and many rows (prefill) give each lane its own key. Chunk ``C``: whole batches of ``KL``
    keys, as many chunks as the block budget asks; a combine launch merges them.

    *Single-kernel* plan, taken where the split plan needs more than one chunk: ``NS = 1``,
    ``W`` subgroups per block (at most :data:`MAX_SUBGROUPS` and :data:`MAX_BLOCK_THREADS`
    threads, their partial states within the workgroup memory) walking the key batches
    interleaved, merged in the block; no combine launch, no scratch. Among the ``(W, DL)``
    that fit, the one whose busiest subgroup has the fewest dependent memory round trips
    (:func:`batch_rounds` times its batches), ties to fewer subgroups then more lanes per
    key. It is taken when that subgroup walks at most :data:`SINGLE_MAX_KEYS` keys at the
    capacity ``S``, for blocks of at most :data:`SINGLE_MAX_ROWS` rows.

    Why: a decode step is launch-latency bound (a CUDA-graph node costs ~2.5-3.6 us on an
    H200; a global round trip with its shuffles ~0.3-0.5 us), and the split plan's chain is
    already one or two key batches, so one launch wins while a subgroup's chain costs about
    what the extra launch and the combine's loads cost: 64 keys are 16 (D = 64) to 24
    (D = 128) round trips at full capacity, half that at an average position; measured,
    D = 128 needs the tighter :data:`SINGLE_MAX_KEY_ELEMS` (32 keys). Decode with
    S = 256-512 and 8 kv heads or fewer (32 keys a subgroup with W = 16) takes it. The plan is static (``S`` is the cache capacity), but with a causal mask the key
    batches past the position are skipped, so the chain follows the visible keys, and
    interleaving the batches over the subgroups keeps them evenly loaded then. Longer
    contexts (S = 4096: 256 keys a subgroup) keep the split over the whole GPU, and so do
    regions whose row groups already give one chunk and prefill-shaped blocks of more than
    :data:`SINGLE_MAX_ROWS` rows (the same kernels as before: their per-batch shuffles grow
    with the rows, which the round-trip count does not model). The bound is a model's, to
    be calibrated on the device (``bench/gpu_run/attn_bench.py``)."""
    sg = getattr(caps, "subgroup_size", None)
    if not sg or sg & (sg - 1) or sg > 128:
        return None                          # butterflies need a known power-of-two width
    ndv = -(-reg.Dv // sg)
    rmax = max(1, min(MAX_ROWS, MAX_ACC_PER_LANE // ndv))
    shared = getattr(caps, "max_shared_bytes", 0) or 16384   # Vulkan's guaranteed minimum
    # a paged region stages a chunk's block-table entries (at most TABLE_MAX_ENTRIES)
    tbytes = 4 * min(reg.paged.TW, TABLE_MAX_ENTRIES) if reg.paged else 0
    if reg.q is None:
        # a computed q is staged in workgroup memory: R rows x D f32
        rmax = min(rmax, (shared - tbytes) // (4 * reg.D))
        if rmax < 1:
            return None
    elif tbytes > shared:
        return None
    RG = -(-reg.M // rmax)
    R = -(-reg.M // RG)
    want = BLOCKS_PER_CORE * max(1, int(getattr(caps, "cores", 1) or 1))
    groups = reg.B * RG
    dl_max = _pow2_floor(max(1, min(sg, reg.D // 8)))
    while reg.D % dl_max:
        dl_max //= 2
    DL = 1
    while DL < dl_max and groups * -(-reg.S * DL // sg) < want:
        DL *= 2
    KL = sg // DL
    ns = max(1, -(-want // groups))
    C = -(-reg.S // ns)
    C = max(KL, -(-C // KL) * KL)
    while table_entries(reg, C) > TABLE_MAX_ENTRIES:
        C = max(KL, (C // 2) // KL * KL)        # a chunk spans at most that many KV blocks
    NS = -(-reg.S // C)
    CT = max(sg, min(256, 4 * sg))
    if RG > MAX_GRID or reg.B > MAX_GRID or NS > MAX_GRID or \
            -(-reg.B * reg.M * reg.Dv // CT) > MAX_GRID * MAX_GRID:
        return None
    if NS > 1 and R <= SINGLE_MAX_ROWS:
        single = _single_plan(reg, caps, sg, R, RG, dl_max, CT)
        if single is not None:
            return single
    return AttentionPlan(sg, DL, R, RG, C, NS, CT)


# ---- text emission -------------------------------------------------------------------------------

def _f32(x: float) -> str:
    """An exact f32 literal (its bit pattern)."""
    return "0x%08X" % struct.unpack("<I", struct.pack("<f", x))[0]


class _Body:
    """Straight-line SSA text with hoisted constants (a tiny builder for gpu.func bodies)."""

    def __init__(self):
        self.lines: list[str] = []
        self.consts: dict[tuple[str, str], str] = {}
        self.head: list[str] = []
        self.n = 0

    def fresh(self) -> str:
        self.n += 1
        return f"%v{self.n}"

    def __call__(self, expr: str) -> str:
        name = self.fresh()
        self.lines.append(f"{name} = {expr}")
        return name

    def raw(self, line: str) -> None:
        self.lines.append(line)

    def c(self, value, ty: str = "index") -> str:
        lit = _f32(float(value)) if ty == "f32" else str(int(value))
        if ty == "i1":
            lit = "true" if value else "false"
        key = (lit, ty)
        if key not in self.consts:
            name = f"%c{len(self.consts)}"
            self.consts[key] = name
            self.head.append(f"{name} = arith.constant {lit}" + ("" if ty == "i1" else f" : {ty}"))
        return self.consts[key]

    # index arithmetic with constant folding of the trivial cases
    def add(self, a: str, b: str) -> str:
        if a == self.c(0):
            return b
        if b == self.c(0):
            return a
        return self(f"arith.addi {a}, {b} : index")

    def mul(self, a: str, k: int) -> str:
        if k == 0:
            return self.c(0)
        if k == 1:
            return a
        return self(f"arith.muli {a}, {self.c(k)} : index")

    def text(self) -> str:
        return "\n".join(self.head + self.lines)


def _merge_dims(shape, strides_list):
    """Drop size-1 dims and merge adjacent dims that every stride vector walks contiguously:
    the same offsets with fewer div/mod."""
    dims = [(n, [st[i] for st in strides_list]) for i, n in enumerate(shape) if n != 1]
    out: list = []
    for n, sts in dims:
        if out and all(p == s * n for p, s in zip(out[-1][1], sts)):
            out[-1] = (out[-1][0] * n, sts)
        else:
            out.append((n, sts))
    return out


def _offsets(b: _Body, x: str, dims, nvec: int) -> list[str]:
    """Per stride vector (``nvec`` of them): ``sum_k coord_k(x) * stride_k`` for the
    row-major coordinates of the flat index ``x`` over ``dims`` (from :func:`_merge_dims`)."""
    acc = [b.c(0)] * nvec
    rem = x
    for i in reversed(range(len(dims))):
        n, sts = dims[i]
        if i == 0:
            coord = rem
        else:
            coord = b(f"arith.remui {rem}, {b.c(n)} : index")
            rem = b(f"arith.divui {rem}, {b.c(n)} : index")
        for j, s in enumerate(sts):
            acc[j] = b.add(acc[j], b.mul(coord, s))
    return acc


def _bstrides(view: View, full) -> tuple[int, ...]:
    """Strides of ``view`` read at the broadcast shape ``full`` (size-1 dims: stride 0)."""
    return tuple(0 if n == 1 and f != 1 else s for n, f, s in zip(view.shape, full, view.strides))


class _Names(KernelEmitter):
    """The scalar emitter's text builder inside an attention kernel: its SSA names carry a
    prefix of their own (``%x_...``) so they never collide with :class:`_Body`'s, and its lines
    go into the kernel body's list (set by the caller)."""

    def fresh(self, hint: str = "v") -> str:
        self.count += 1
        return f"%x_{hint}{self.count}"


class _FlatArgs(ScalarEmitter):
    """:class:`ScalarEmitter` reading the dispatch's arguments through the attention kernels'
    flat buffers (``memref<N x storage>`` per argument, row-major; a packed weight as its
    bytes) and recording which arguments it reads (``on_use(index)``)."""

    def __init__(self, fn, em, names, types, on_use):
        super().__init__(fn, em, names)
        self.flat = dict(zip(names, types))
        self.on_use = on_use

    def _arg(self, v: ir.Value) -> str:
        name = super()._arg(v)
        self.on_use(self.arg_names.index(name))
        return name

    def load(self, buf, t, idx):
        if buf not in self.flat:
            return super().load(buf, t, idx)
        lin = self.ix(self.linearize(idx, t.shape))
        key = ("load", buf, lin)
        got = self._get(key)
        if got is None:
            x = self.em.op(f"memref.load {buf}[{lin}] : {self.flat[buf]}")
            got = self._put(key, self.from_storage(x, t.dtype))
        return got


def _flat_type(t) -> str:
    """The flat kernel buffer type of an argument of poot type ``t``."""
    if isinstance(t, TensorType):
        return f"memref<{max(1, t.numel)}x{storage_elem(t.dtype)}>"
    return buffer_type(t)


def _lane_store(b: _Body, store: str, dv: str, Dv: int, ragged: bool) -> None:
    """Emit ``store`` of output column ``dv`` (a lane's share of ``Dv``), guarded by
    ``dv < Dv`` when the lane's last round may run past the row (``ragged``)."""
    if ragged:
        b.raw(f"scf.if {b(f'arith.cmpi ult, {dv}, {b.c(Dv)} : index')} {{")
        b.raw(store)
        b.raw("}")
    else:
        b.raw(store)


def emit(reg: AttentionRegion, plan: AttentionPlan) -> Synthesized:
    """The gpu.module text and launches of ``reg`` under ``plan`` (see the module doc)."""
    sg, DL, KL, R, C, NS = plan.sg, plan.DL, plan.KL, plan.R, plan.C, plan.NS
    W, TB = plan.W, plan.TB
    nb, nr = len(reg.batch), len(reg.rows)
    S, D, Dv, M = reg.S, reg.D, reg.Dv, reg.M
    NR = reg.B * M
    ndv = -(-Dv // sg)
    F = "f32"

    # kernel parameters: the arguments read (each once, in argument order), the constant
    # buffers of computed operands, then the output or the scratch
    ftypes = [type_from_mlir(a.type) for a in reg.fn.regions[0].blocks[0].arguments]
    used: set[int] = set()

    def pname(a: int) -> str:
        used.add(a)
        return f"%a{a}"

    def ptype(a: int) -> str:
        return _flat_type(ftypes[a])

    out_t = f"memref<{NR * Dv}xf32>"
    scr_n = NR * NS * (Dv + 2)
    scr_t = f"memref<{scr_n}xf32>"
    ml_base = NR * NS * Dv                  # (m, l) pairs after the accumulators

    def load_f(b: _Body, a: int, idx: str) -> str:
        # a float element in f32: f16 extended, bf16 (i16 words) shifted into f32's high half
        x = b(f"memref.load {pname(a)}[{idx}] : {ptype(a)}")
        et = reg.arg_types[a][0]
        if et == "bf16":
            w = b(f"arith.extui {x} : i16 to i32")
            w = b(f"arith.shli {w}, {b.c(16, 'i32')} : i32")
            return b(f"arith.bitcast {w} : i32 to f32")
        return x if et == F else b(f"arith.extf {x} : {et} to f32")

    def denom_div(b: _Body, acc: str, ll: str) -> str:
        # i1: p = e / max(sum, 1) (zeros for a row that sees no key); bias: 0 when all -inf
        if reg.mask_kind == "i1":
            den = b(f"arith.maximumf {ll}, {b.c(1.0, F)} : f32")
            return b(f"arith.divf {acc}, {den} : f32")
        q = b(f"arith.divf {acc}, {ll} : f32")
        pos = b(f"arith.cmpf ogt, {ll}, {b.c(0.0, F)} : f32")
        return b(f"arith.select {pos}, {q}, {b.c(0.0, F)} : f32")

    def butterfly(b: _Body, x: str, op: str, lo: int, hi: int, ty: str = F) -> str:
        off = lo
        while off < hi:
            s = b.fresh()
            b.raw(f"{s}, {s}_ok = gpu.shuffle xor {x}, {b.c(off, 'i32')}, "
                  f"{b.c(sg, 'i32')} : {ty}")
            x = b(f"arith.{op} {x}, {s} : {ty}")
            off *= 2
        return x

    def rescale_w(b: _Body, m: str, mn: str) -> str:
        # exp(m - mn), exactly 1 where m == mn (also -inf == -inf: no NaN)
        same = b(f"arith.cmpf oeq, {m}, {mn} : f32")
        ex = b(f"math.exp {b(f'arith.subf {m}, {mn} : f32')} : f32")
        return b(f"arith.select {same}, {b.c(1.0, F)}, {ex} : f32")

    def for_(b: _Body, iv: str, lo: str, hi: str, step: str, init: list[str]):
        res = b.fresh()
        its = [f"{res}_i{j}" for j in range(len(init))]
        b.raw(f"{res}:{len(init)} = scf.for {iv} = {lo} to {hi} step {step} iter_args("
              + ", ".join(f"{c} = {i}" for c, i in zip(its, init)) + ") -> ("
              + ", ".join([F] * len(init)) + ") {")
        return res, its

    def yield_(b: _Body, vals: list[str]) -> None:
        b.raw("scf.yield " + ", ".join(vals) + " : " + ", ".join([F] * len(vals)))
        b.raw("}")

    # ---- split kernel
    b = _Body()
    em = _Names()
    em.lines = b.lines                     # one body: _Body's ops and the scalar emitter's
    se = _FlatArgs(reg.fn, em, [f"%a{i}" for i in range(len(ftypes))],
                   [_flat_type(t) for t in ftypes], used.add)
    tid = b("gpu.thread_id x")
    # subgroup sgi of the block, lane within it (subgroups are consecutive thread ids)
    lane = b(f"arith.remui {tid}, {b.c(sg)} : index") if W > 1 else tid
    sgi = b(f"arith.divui {tid}, {b.c(sg)} : index") if W > 1 else b.c(0)
    split = b("gpu.block_id x")
    rg = b("gpu.block_id y")
    bi = b("gpu.block_id z")
    dd = b(f"arith.remui {lane}, {b.c(DL)} : index") if DL > 1 else b.c(0)
    kk = b(f"arith.divui {lane}, {b.c(DL)} : index") if DL > 1 else lane
    q, k, v, mk, pg = reg.q, reg.k, reg.v, reg.mask, reg.paged
    mcomp = reg.mask_value is not None
    full = tuple(reg.batch + reg.rows) + (S,)
    mst = _bstrides(mk, full) if mk else None
    qst = q.strides if q else (0,) * (nb + nr + 1)
    if pg is None:
        kbst, vbst = k.strides[:nb], v.strides[:nb]
    else:
        # pools [NB, bs, H, D]: the batch (b, h) moves by h only; b picks the table row
        kbst, vbst = (0, k.strides[2]), (0, v.strides[2])
    bvecs = [qst[:nb], kbst, vbst] + ([mst[:nb]] if mk else []) + \
        ([(pg.table.strides[0], 0)] if pg else [])
    boffs = _offsets(b, bi, _merge_dims(reg.batch, bvecs), len(bvecs))
    qb, kb, vb = (b.add(o, b.c(x.offset if x else 0)) for o, x in zip(boffs[:3], (q, k, v)))
    mb = b.add(boffs[3], b.c(mk.offset)) if mk else None
    tb = b.add(boffs[-1], b.c(pg.table.offset)) if pg else None
    rvecs = [qst[nb:nb + nr]] + ([mst[nb:nb + nr]] if mk else [])
    rdims = _merge_dims(reg.rows, rvecs)
    # coordinates for the scalar emitter (computed q / mask): batch, and each row's
    bco = se.delinearize(bi, reg.batch)
    rows, qrow, mrow, rco = [], [], [], []
    for j in range(R):
        r = b.add(b.mul(rg, R), b.c(j))
        rc = b(f"arith.minui {r}, {b.c(M - 1)} : index")
        offs = _offsets(b, rc, rdims, len(rvecs))
        rows.append(r)
        qrow.append(b.add(qb, offs[0]))
        mrow.append(b.add(mb, offs[1]) if mk else None)
        rco.append(se.delinearize(rc, reg.rows) if mcomp else None)
    workgroup = []
    s_begin = b.mul(split, C)
    s_end = b(f"arith.minui {b.add(s_begin, b.c(C))}, {b.c(S)} : index")
    if q is None:
        # a computed q (RoPE'd, ...): each block evaluates its R rows once into workgroup
        # memory, its threads together, then a barrier
        qs_t = f"memref<{R * D}xf32, #gpu.address_space<workgroup>>"
        workgroup.append(("%qs", qs_t))
        b.raw(f"scf.for %qi = {tid} to {b.c(R * D)} step {b.c(TB)} {{")
        with se.scope():
            jq = b(f"arith.divui %qi, {b.c(D)} : index")
            rq = b(f"arith.minui {b.add(b.mul(rg, R), jq)}, {b.c(M - 1)} : index")
            dq = b(f"arith.remui %qi, {b.c(D)} : index") if D > 1 else 0
            x = se.value(reg.q_value, list(bco) + se.delinearize(rq, reg.rows) + [dq])
            b.raw(f"memref.store {x}, %qs[%qi] : {qs_t}")
        b.raw("}")
    if pg is not None:
        # paged: the table entries of the chunk's KV blocks (from w0 = s_begin / bs), clamped
        # into [0, NB) once, staged in workgroup memory (with q's loads, one barrier)
        NT = table_entries(reg, C)
        tbl_t = f"memref<{NT}xi32, #gpu.address_space<workgroup>>"
        workgroup.append(("%tbl", tbl_t))
        w0 = b(f"arith.divui {s_begin}, {b.c(pg.bs)} : index") if NS > 1 else b.c(0)
        ti = b.fresh()
        b.raw(f"scf.for {ti} = {tid} to {b.c(NT)} step {b.c(TB)} {{")
        wt = b(f"arith.minui {b.add(w0, ti)}, {b.c(pg.TW - 1)} : index")
        e = b(f"memref.load {pname(pg.table.arg)}[{b.add(tb, b.mul(wt, pg.table.strides[1]))}]"
              f" : {ptype(pg.table.arg)}")
        it = pg.table_dtype
        e = b(f"arith.maxsi {e}, {b.c(0, it)} : {it}")
        e = b(f"arith.minsi {e}, {b.c(pg.NB - 1, it)} : {it}")
        if it != "i32":
            e = b(f"arith.trunci {e} : {it} to i32")
        b.raw(f"memref.store {e}, %tbl[{ti}] : {tbl_t}")
        b.raw("}")
        s_last = b(f"arith.subi {s_end}, {b.c(1)} : index")

        def key_offsets(sk: str, views) -> list[str]:
            """Element offsets of key ``sk`` (in this chunk) in each pool view: its block
            ``tbl[sk / bs - w0]``, its row ``sk % bs``."""
            wi = b(f"arith.subi {b(f'arith.divui {sk}, {b.c(pg.bs)} : index')}, {w0} : index")
            blk = b(f"arith.index_cast {b(f'memref.load %tbl[{wi}] : {tbl_t}')} : i32 to index")
            row = b(f"arith.remui {sk}, {b.c(pg.bs)} : index") if pg.bs > 1 else b.c(0)
            return [b.add(b.mul(blk, x.strides[0]), b.mul(row, x.strides[1])) for x in views]
    if workgroup:
        b.raw("gpu.barrier")
    # this lane's head-dim elements: d = (j * DL + dd) * V + u, j < J, u < V
    V, J, JU = _unroll(D, DL)
    if q is not None:
        qlane = [b.add(qrow[j], b.mul(b.mul(dd, V), q.strides[-1])) for j in range(R)]
    else:
        qlane = [b.add(b.c(j * D), b.mul(dd, V)) for j in range(R)]
    ninf, zero = b.c(float("-inf"), F), b.c(0.0, F)
    state0 = [ninf] * R + [zero] * R + [zero] * (R * ndv)

    def mask_of(j: int, sc: str) -> str | None:
        """Row j's mask at key ``sc``: i1 visibility, or the f32 bias (None: none)."""
        if mcomp:
            ms = reg.mask_shape
            idx = [0 if ms[i] == 1 else bco[i] for i in range(nb)] + \
                [0 if ms[nb + i] == 1 else rco[j][i] for i in range(nr)] + \
                [0 if ms[-1] == 1 else sc]
            return se.value(reg.mask_value, idx)
        if mk is not None:
            mv = b(f"memref.load {pname(mk.arg)}[{b.add(mrow[j], b.mul(sc, mst[-1]))}] "
                   f": {ptype(mk.arg)}")
            if reg.mask_kind == "i1":
                mv = b(f"arith.cmpi {'eq' if reg.negate else 'ne'}, {mv}, {b.c(0, 'i8')} : i8")
            return mv
        if reg.mask_kind == "i1":
            return b.c(bool(reg.mask_const), "i1")
        return b.c(reg.mask_const, F) if reg.mask_const else None

    def alive_of(mv: str | None, valid: str) -> str:
        """Whether a (row, key) may weigh: visible (i1) or a bias above -inf, and in the
        chunk (``valid``)."""
        if reg.mask_kind == "i1":
            return b(f"arith.andi {mv}, {valid} : i1")
        if mv is None:
            return valid
        return b(f"arith.andi {valid}, {b(f'arith.cmpf one, {mv}, {ninf} : f32')} : i1")

    # subgroup sgi walks the chunk's key batches sgi, sgi + W, ...; a subgroup that may get
    # none (a chunk shorter than W batches) is guarded: never a zero-trip loop with iter_args
    # (lavapipe's SPIR-V path got those wrong)
    s_lo = b.add(s_begin, b.mul(sgi, KL))
    s_hi = s_end
    last = S - (NS - 1) * C                  # the shortest chunk: the last
    guard = W > 1 and (W - 1) * KL >= last
    masked = reg.mask_value is not None or reg.mask is not None
    if pg is not None and W == 1 and masked and C >= 3 * KL:
        # paged, one subgroup walking a chunk of several batches: first find the chunk's
        # first and last key any row sees (each lane over keys lane, lane + sg, ...:
        # independent mask evaluations, no vote chain) and walk the batches between only,
        # so a short sequence in a wide table costs its length (the batches left out would
        # all be skipped by the vote below: the result is the same)
        i32 = "i32"
        big = b.c(2 ** 31 - 1, i32)
        fv, pv = b.fresh(), b.fresh()
        b.raw(f"{fv}:2 = scf.for {pv} = {b.c(0)} to {b.c(-(-C // sg))} step {b.c(1)} "
              f"iter_args({fv}_lo = {big}, {fv}_hi = {b.c(-1, i32)}) -> ({i32}, {i32}) {{")
        with se.scope():
            key = b.add(b.add(s_begin, b.mul(pv, sg)), lane)
            kvalid = b(f"arith.cmpi ult, {key}, {s_end} : index")
            ksc = b(f"arith.minui {key}, {b.c(S - 1)} : index")
            seen_k = None
            for j in range(R):
                a_ = alive_of(mask_of(j, ksc), kvalid)
                seen_k = a_ if seen_k is None else b(f"arith.ori {seen_k}, {a_} : i1")
            k32 = b(f"arith.index_cast {key} : index to {i32}")
            lo_ = b(f"arith.select {seen_k}, {k32}, {big} : {i32}")
            hi_ = b(f"arith.select {seen_k}, {k32}, {b.c(-1, i32)} : {i32}")
            lo_ = b(f"arith.minsi {fv}_lo, {lo_} : {i32}")
            hi_ = b(f"arith.maxsi {fv}_hi, {hi_} : {i32}")
            b.raw(f"scf.yield {lo_}, {hi_} : {i32}, {i32}")
        b.raw("}")
        lo_ = butterfly(b, f"{fv}#0", "minsi", 1, sg, i32)
        hi_ = butterfly(b, f"{fv}#1", "maxsi", 1, sg, i32)
        # [first batch start, last seen + 1): the batch grid from s_lo, clipped to the chunk
        first = b(f"arith.index_cast {b(f'arith.minsi {lo_}, {b.c(S, i32)} : {i32}')} : "
                  f"{i32} to index")
        first = b(f"arith.maxui {first}, {s_lo} : index")
        off = b(f"arith.divui {b(f'arith.subi {first}, {s_lo} : index')}, "
                f"{b.c(W * KL)} : index")
        s_lo = b.add(s_lo, b.mul(off, W * KL))
        s_hi = b(f"arith.index_cast {b(f'arith.addi {hi_}, {b.c(1, i32)} : {i32}')} : "
                 f"{i32} to index")
        s_hi = b(f"arith.minui {s_hi}, {s_end} : index")
        guard = True                 # the walk may be empty: never a zero-trip scf.for
    if guard:
        any_ = b(f"arith.cmpi ult, {s_lo}, {s_hi} : index")
        gres = b.fresh()
        b.raw(f"{gres}:{len(state0)} = scf.if {any_} -> ({', '.join([F] * len(state0))}) {{")
    loop, its = for_(b, "%s0", s_lo, s_hi, b.c(W * KL), state0)
    m_in, l_in = its[:R], its[R:2 * R]
    acc_in = [its[2 * R + j * ndv:2 * R + (j + 1) * ndv] for j in range(R)]
    s = b.add("%s0", kk)
    valid = b(f"arith.cmpi ult, {s}, {s_end} : index")
    sc = b(f"arith.minui {s}, {b.c(S - 1)} : index")
    scope = se.scope()              # what the scalar emitter computes per key stays inside
    scope.__enter__()
    # the mask of this lane's key, per row: i1 visibility, or the f32 bias (None: none)
    vis, bias = [], []
    for j in range(R):
        mv = mask_of(j, sc)
        if reg.mask_kind == "i1":
            vis.append(b(f"arith.andi {mv}, {valid} : i1"))
        else:
            bias.append(mv)
    # with an i1 mask the key batch is skipped when no row of the block sees any of its keys
    # (a subgroup vote): its keys would take weight exactly 0 and leave (m, l, acc) as they
    # are, but for m = -inf instead of -1e30 while l = acc = 0 (see the module doc)
    refine = pg is not None
    skip = refine or (reg.mask_kind == "i1" and reg.mask_const is None)
    partial = None
    if refine:
        # paged (the op's refinement: a masked key contributes nothing, whatever a reused
        # block holds): one vote gives both whether any (row, key) of the batch is alive
        # (bit 0: else the batch is skipped, for either mask kind) and whether any is dead
        # (bit 1: a partial batch, whose V rows are selected by weight, see below)
        alive = vis if reg.mask_kind == "i1" else [alive_of(x, valid) for x in bias]
        anyl, deadl = alive[0], None
        for x in alive[1:]:
            anyl = b(f"arith.ori {anyl}, {x} : i1")
        for x in alive:
            nx = b(f"arith.xori {x}, {b.c(True, 'i1')} : i1")
            deadl = nx if deadl is None else b(f"arith.ori {deadl}, {nx} : i1")
        i32 = "i32"
        w_any = b(f"arith.extui {anyl} : i1 to {i32}")
        w_dead = b(f"arith.shli {b(f'arith.extui {deadl} : i1 to {i32}')}, {b.c(1, i32)} : {i32}")
        word = butterfly(b, b(f"arith.ori {w_any}, {w_dead} : {i32}"), "ori", 1, sg, i32)
        seen = b(f"arith.andi {word}, {b.c(1, i32)} : {i32}")
        seen = b(f"arith.cmpi ne, {seen}, {b.c(0, i32)} : {i32}")
        partial = b(f"arith.andi {word}, {b.c(2, i32)} : {i32}")
        partial = b(f"arith.cmpi ne, {partial}, {b.c(0, i32)} : {i32}")
    elif skip:
        seen = vis[0]
        for x in vis[1:]:
            seen = b(f"arith.ori {seen}, {x} : i1")
        seen = b(f"arith.extui {seen} : i1 to i32")
        seen = butterfly(b, seen, "ori", 1, sg, "i32")
        seen = b(f"arith.cmpi ne, {seen}, {b.c(0, 'i32')} : i32")
    if skip:
        state = m_in + l_in + [a for row in acc_in for a in row]
        taken = b.fresh()
        b.raw(f"{taken}:{len(state)} = scf.if {seen} -> ({', '.join([F] * len(state))}) {{")
    if pg is None:
        kkey = b.mul(sc, k.strides[-2])
    else:   # a lane past the chunk reads the chunk's last key (its block is staged)
        kkey = key_offsets(b(f"arith.minui {s}, {s_last} : index"), [k])[0]
    klane = b.add(b.add(kb, kkey), b.mul(b.mul(dd, V), k.strides[-1]))
    # scores: each lane's share of the dot, then a butterfly over the key's DL lanes
    dl_, dots = for_(b, "%j0", b.c(0), b.c(J), b.c(JU), [zero] * R)
    cur = list(dots)
    for ju in range(JU):
        jd = b.mul(b.add("%j0", b.c(ju)), DL * V)       # element offset of round j
        for u in range(V):
            du = b.add(jd, b.c(u))
            kv = load_f(b, k.arg, b.add(klane, b.mul(du, k.strides[-1])))
            for j in range(R):
                if q is not None:
                    qv = load_f(b, q.arg, b.add(qlane[j], b.mul(du, q.strides[-1])))
                else:
                    qv = b(f"memref.load %qs[{b.add(qlane[j], du)}] : {qs_t}")
                pr = b(f"arith.mulf {qv}, {kv} : f32")
                cur[j] = b(f"arith.addf {cur[j]}, {pr} : f32")
    yield_(b, cur)
    m_out, l_out, e_lane, corr = [], [], [], []
    for j in range(R):
        x = butterfly(b, f"{dl_}#{j}", "addf", 1, DL)
        if reg.scale != 1.0:
            x = b(f"arith.mulf {x}, {b.c(reg.scale, F)} : f32")
        if reg.softcap:
            y = b(f"arith.mulf {x}, {b.c(1.0 / reg.softcap, F)} : f32")
            y = b(f"math.tanh {y} : f32")
            x = b(f"arith.mulf {y}, {b.c(reg.softcap, F)} : f32")
        if reg.mask_kind == "i1":
            xm = b(f"arith.select {vis[j]}, {x}, {b.c(MASKED_SCORE, F)} : f32")
            keep = vis[j]
        else:
            xm = b(f"arith.addf {x}, {bias[j]} : f32") if bias[j] is not None else x
            if refine and bias[j] is not None:
                # a -inf bias masks the key whatever its score (inf - inf is no NaN here)
                dead = b(f"arith.cmpf oeq, {bias[j]}, {ninf} : f32")
                xm = b(f"arith.select {dead}, {ninf}, {xm} : f32")
            keep = b(f"arith.cmpf ogt, {xm}, {ninf} : f32")
            keep = b(f"arith.andi {keep}, {valid} : i1")
        xm = b(f"arith.select {valid}, {xm}, {ninf} : f32")
        # batch max and sum over the KL keys (lanes of one key hold the same value)
        mn = b(f"arith.maximumf {m_in[j]}, {butterfly(b, xm, 'maximumf', DL, sg)} : f32")
        cr = rescale_w(b, m_in[j], mn)
        e = b(f"math.exp {b(f'arith.subf {xm}, {mn} : f32')} : f32")
        e = b(f"arith.select {keep}, {e}, {zero} : f32")
        es = butterfly(b, e, "addf", DL, sg)
        m_out.append(mn)
        l_out.append(b(f"arith.addf {b(f'arith.mulf {l_in[j]}, {cr} : f32')}, {es} : f32"))
        e_lane.append(e)
        corr.append(cr)
    # acc = acc * corr + sum_t p_t v[s0 + t] (p_t from the lanes of key t; lanes over dv)
    flat0 = [b(f"arith.mulf {acc_in[j][i]}, {corr[j]} : f32") for j in range(R)
             for i in range(ndv)]
    TU = min(KL, 8)

    def v_loop(safe: bool) -> list[str]:
        """The accumulation over the batch's KL keys; ``safe``: each row's product is
        taken only where its weight is positive (a masked key's value may be inf/NaN)."""
        tv = b.fresh()
        tl, ta = for_(b, tv, b.c(0), b.c(KL), b.c(TU), flat0)
        acc = list(ta)
        for tu in range(TU):
            t = b.add(tv, b.c(tu))
            if pg is None:
                st_ = b(f"arith.minui {b.add('%s0', t)}, {b.c(S - 1)} : index")
                voff = b.add(vb, b.mul(st_, v.strides[-2]))
            else:
                st_ = b(f"arith.minui {b.add('%s0', t)}, {s_last} : index")
                voff = b.add(vb, key_offsets(st_, [v])[0])
            vv = []
            for i in range(ndv):
                dv = b.add(lane, b.c(i * sg))
                if (i + 1) * sg > Dv:
                    dv = b(f"arith.minui {dv}, {b.c(Dv - 1)} : index")
                vv.append(load_f(b, v.arg, b.add(voff, b.mul(dv, v.strides[-1]))))
            src = b(f"arith.index_cast {b.mul(t, DL)} : index to i32")
            for j in range(R):
                p = b.fresh()
                b.raw(f"{p}, {p}_ok = gpu.shuffle idx {e_lane[j]}, {src}, "
                      f"{b.c(sg, 'i32')} : f32")
                live = b(f"arith.cmpf ogt, {p}, {zero} : f32") if safe else None
                for i in range(ndv):
                    x = b(f"arith.select {live}, {vv[i]}, {zero} : f32") if safe else vv[i]
                    pv = b(f"arith.mulf {p}, {x} : f32")
                    acc[j * ndv + i] = b(f"arith.addf {acc[j * ndv + i]}, {pv} : f32")
        yield_(b, acc)
        return [f"{tl}#{i}" for i in range(len(ta))]

    if partial is not None:
        # a batch with a dead (row, key) takes the weighted select; a full one the plain
        # products (its keys are the sequence's own: finite)
        vres = b.fresh()
        b.raw(f"{vres}:{len(flat0)} = scf.if {partial} -> ({', '.join([F] * len(flat0))}) {{")
        got = v_loop(True)
        b.raw("scf.yield " + ", ".join(got) + " : " + ", ".join([F] * len(got)))
        b.raw("} else {")
        yield_(b, v_loop(False))
        accs = [f"{vres}#{i}" for i in range(len(flat0))]
    else:
        accs = v_loop(False)
    new_state = m_out + l_out + accs
    if skip:
        b.raw("scf.yield " + ", ".join(new_state) + " : " + ", ".join([F] * len(state)))
        b.raw("} else {")
        yield_(b, state)
        new_state = [f"{taken}#{i}" for i in range(len(state))]
    scope.__exit__(None, None, None)
    yield_(b, new_state)
    fin = [f"{loop}#{i}" for i in range(len(state0))]
    if guard:
        b.raw("scf.yield " + ", ".join(fin) + " : " + ", ".join([F] * len(fin)))
        b.raw("} else {")
        yield_(b, state0)
        fin = [f"{gres}#{i}" for i in range(len(state0))]
    # write the chunk: scratch (m, l, acc) or, with one chunk, the output
    rowbase = b.mul(bi, M)
    dst, dst_t = ("%out", out_t) if NS == 1 else ("%scr", scr_t)
    is0 = b(f"arith.cmpi eq, {lane}, {b.c(0)} : index")
    if W == 1:
        for j in range(R):
            inr = b(f"arith.cmpi ult, {rows[j]}, {b.c(M)} : index")
            b.raw(f"scf.if {inr} {{")
            grow = b.add(rowbase, rows[j])
            slot = grow if NS == 1 else b.add(b.mul(grow, NS), split)
            lres = fin[R + j]
            for i in range(ndv):
                dv = b.add(lane, b.c(i * sg))
                a = fin[2 * R + j * ndv + i]
                val = denom_div(b, a, lres) if NS == 1 else a
                _lane_store(b, f"memref.store {val}, {dst}[{b.add(b.mul(slot, Dv), dv)}] : "
                            f"{dst_t}", dv, Dv, (i + 1) * sg > Dv)
            if NS > 1:
                b.raw(f"scf.if {is0} {{")
                mi = b.add(b.c(ml_base), b.mul(slot, 2))
                b.raw(f"memref.store {fin[j]}, %scr[{mi}] : {scr_t}")
                b.raw(f"memref.store {lres}, %scr[{b.add(mi, b.c(1))}] : {scr_t}")
                b.raw("}")
            b.raw("}")
    else:
        # W subgroups: each puts its (m, l, acc) in workgroup memory (acc[w, j, dv], then
        # (m, l)[w, j]); after a barrier the block's threads take the R x Dv outputs, each
        # merging the W partial states by the combine kernel's rule
        red_t = f"memref<{W * R * (Dv + 2)}xf32, #gpu.address_space<workgroup>>"
        workgroup.append(("%red", red_t))
        wml = W * R * Dv
        for j in range(R):
            base = b.mul(b.add(b.mul(sgi, R), b.c(j)), Dv)
            for i in range(ndv):
                dv = b.add(lane, b.c(i * sg))
                _lane_store(b, f"memref.store {fin[2 * R + j * ndv + i]}, "
                            f"%red[{b.add(base, dv)}] : {red_t}", dv, Dv, (i + 1) * sg > Dv)
        b.raw(f"scf.if {is0} {{")
        for j in range(R):
            mi = b.add(b.c(wml), b.mul(b.add(b.mul(sgi, R), b.c(j)), 2))
            b.raw(f"memref.store {fin[j]}, %red[{mi}] : {red_t}")
            b.raw(f"memref.store {fin[R + j]}, %red[{b.add(mi, b.c(1))}] : {red_t}")
        b.raw("}")
        b.raw("gpu.barrier")
        # no iter_args: a zero-trip loop (threads past R x Dv) is fine
        b.raw(f"scf.for %e = {tid} to {b.c(R * Dv)} step {b.c(TB)} {{")
        je = b(f"arith.divui %e, {b.c(Dv)} : index")
        de = b(f"arith.remui %e, {b.c(Dv)} : index")
        re = b.add(b.mul(rg, R), je)
        b.raw(f"scf.if {b(f'arith.cmpi ult, {re}, {b.c(M)} : index')} {{")
        ms, ls, os_ = [], [], []
        for w in range(W):
            sl = b.add(b.c(w * R), je)
            mi = b.add(b.c(wml), b.mul(sl, 2))
            ms.append(b(f"memref.load %red[{mi}] : {red_t}"))
            ls.append(b(f"memref.load %red[{b.add(mi, b.c(1))}] : {red_t}"))
            os_.append(b(f"memref.load %red[{b.add(b.mul(sl, Dv), de)}] : {red_t}"))
        mx = ms[0]
        for mu in ms[1:]:
            mx = b(f"arith.maximumf {mx}, {mu} : f32")
        L, O = zero, zero
        for mu, lu, ou in zip(ms, ls, os_):
            wt = rescale_w(b, mu, mx)
            L = b(f"arith.addf {L}, {b(f'arith.mulf {wt}, {lu} : f32')} : f32")
            O = b(f"arith.addf {O}, {b(f'arith.mulf {wt}, {ou} : f32')} : f32")
        grow = b.add(rowbase, re)
        slot = grow if NS == 1 else b.add(b.mul(grow, NS), split)
        val = denom_div(b, O, L) if NS == 1 else O
        b.raw(f"memref.store {val}, {dst}[{b.add(b.mul(slot, Dv), de)}] : {dst_t}")
        if NS > 1:
            b.raw(f"scf.if {b(f'arith.cmpi eq, {de}, {b.c(0)} : index')} {{")
            mi = b.add(b.c(ml_base), b.mul(slot, 2))
            b.raw(f"memref.store {mx}, %scr[{mi}] : {scr_t}")
            b.raw(f"memref.store {L}, %scr[{b.add(mi, b.c(1))}] : {scr_t}")
            b.raw("}")
        b.raw("}")
        b.raw("}")
    b.raw("gpu.return")
    params = sorted(used)
    consts = list(se.consts)
    sig = ", ".join([f"%a{a}: {ptype(a)}" for a in params] +
                    [f"{n}: {c[0]}" for n, c in zip(se.const_names, consts)])
    sig += f", %out: {out_t}" if NS == 1 else f", %scr: {scr_t}"
    wg = f" workgroup({', '.join(f'{n}: {t} {WG_ALIGN}' for n, t in workgroup)})" \
        if workgroup else ""
    body = "\n".join(b.head + em.prologue + b.lines)
    text = ("gpu.module @attention {\n"
            f"gpu.func @split({sig}){wg} kernel {{\n{body}\n}}\n")
    slots = [("arg", a) for a in params] + [("const", i) for i in range(len(consts))]
    launches = [Launch("kernel", slots + ([("out", 0)] if NS == 1 else [("scratch", 0)]),
                       "attention", "split", (NS, plan.RG, reg.B), (TB, 1, 1),
                       strategy="flash_decode")]
    scratch = []
    if NS > 1:
        # ---- combine kernel: one thread per output element, an online merge of the
        # chunks, U at a time (their loads issued together)
        c = _Body()
        tid = c("gpu.thread_id x")
        blk = c("gpu.block_id x")
        nblk = -(-NR * Dv // plan.CT)
        gx = min(nblk, MAX_GRID)            # past MAX_GRID blocks: a 2-D grid of rows of gx
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
        res = denom_div(c, f"{cl}#2", f"{cl}#1")
        c.raw(f"scf.if {ok} {{")
        c.raw(f"memref.store {res}, %out[{itc}] : {out_t}")
        c.raw("}")
        c.raw("gpu.return")
        text += (f"gpu.func @combine(%scr: {scr_t}, %out: {out_t}) kernel {{\n"
                 f"{c.text()}\n}}\n")
        launches.append(Launch("kernel", [("scratch", 0), ("out", 0)], "attention",
                               "combine", (gx, -(-nblk // gx), 1), (plan.CT, 1, 1),
                               strategy="flash_decode"))
        scratch.append((scr_t, scr_n * 4))
    text += "}\n"
    return Synthesized(text, launches, scratch, consts)


def flash_decode(fn: ir.Operation, caps) -> Synthesized | None:
    """The strategy: :func:`match_attention`, :func:`plan_attention`, :func:`emit`."""
    reg = match_attention(fn)
    if reg is None:
        return None
    if reg.q_value is not None and \
            any(small_contraction(o) for o in _slice_ops([reg.q_value])):
        # each block evaluates its q rows, and each chunk of a split plan again: a folded
        # LoRA expand (K terms an element) cost more there (the 1B shape's 32-token prefill
        # chunk: 8 chunks, the attention 27 -> 45 us a layer) than beside the KV write
        return None
    plan = plan_attention(reg, caps)
    if plan is None:
        return None
    try:
        return emit(reg, plan)
    except ScalarUnsupported:
        return None           # a computed q or mask the scalar emitter does not cover


__all__ = ["AttentionPlan", "AttentionRegion", "PagedKV", "View", "emit", "flash_decode",
           "match_attention", "plan_attention", "reshape_strides", "resolve_view",
           "table_entries"]
