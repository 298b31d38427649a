"""Match: what the flash-decoding strategy takes (:func:`match_attention`), as an
:class:`AttentionRegion` of strided operand views.

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
  pointwise.per_element`), but :func:`~poot.backends.gpu.strategies.attention.
  flash_decode` refuses a q holding one (a LoRA
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
(f32, f16 or bf16, read in their dtype; or q8_0: the ``i8`` values plane and its f16 scales
plane ``[NB, bs, H, D / 32]``, the op's trailing ``scales`` operands, dequantized where a
lane loads its key's or value's elements) and the block table ``[B, TW]`` (i32/i64) strided
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

"""

from __future__ import annotations

from dataclasses import dataclass

from mlir import ir

from poot.backends.gpu.strategies.pointwise import per_element
from poot.dialects.kv_quant import Q8_0
from poot.dialects.types import DType, TensorType, type_from_mlir

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
    the region's ``k``/``v`` views are then the pools ``[NB, bs, H, D]``. A q8_0 pool
    (:mod:`poot.dialects.kv_quant`: the region's view is its ``i8`` values plane) has its
    f16 scales plane ``[NB, bs, H, D / 32]`` as ``k_scale`` / ``v_scale`` (None: a float
    pool)."""

    table: View
    table_dtype: str
    NB: int
    bs: int
    TW: int
    k_scale: View | None = None
    v_scale: View | None = None


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


def slice_ops(vals) -> set:
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
    root = _root(ops)
    if root is None:
        return None
    att, chain = root
    args = list(block.arguments)
    arg_types = tuple(_arg_type(a) for a in args)
    # k and v: strided views of arguments (the KV caches or block pools: read in place in
    # their dtype, never recomputed; a cast widening a cache to f32 is the load's extension)
    k, v = (resolve_view(att.operands[i], args, widen=True) for i in (1, 2))
    if k is None or v is None:
        return None
    # q: a strided view, else any elementwise-class expression (staged once per block)
    q = resolve_view(att.operands[0], args)
    q_value = None if q is not None else att.operands[0]
    shapes = _shapes(att, args, arg_types, k, v)
    if shapes is None:
        return None
    batch, rows, S, D, Dv, pkv = shapes
    mask = _mask(att, args)
    if mask is None:
        return None
    kind, mview, mconst, negate, mask_value = mask
    # every op of the region is accounted for: the result's reshapes, k/v (and table) views,
    # and q and the mask (views, or elementwise-class expressions the scalar emitter
    # computes)
    known = chain | slice_ops(att.operands)
    if any(o not in known for o in ops):
        return None
    computed = [x for x in (q_value, mask_value) if x is not None]
    if not all(per_element(o) for o in slice_ops(computed)):
        return None
    scale = float(ir.FloatAttr(att.attributes["scale"]).value)
    softcap = float(ir.FloatAttr(att.attributes["softcap"]).value)
    mt = type_from_mlir(mask_operand(att).type)
    return AttentionRegion(q, k, v, mview, kind, mconst, negate, batch, rows, S, D, Dv,
                           scale, softcap, arg_types, fn, q_value, mask_value,
                           tuple(mt.shape), pkv)


def mask_operand(att: ir.Operation) -> ir.Value:
    """The ``mask`` operand of a ``poot.attention`` (operand 3) or ``poot.paged_attention``
    (operand 4, before its variadic q8_0 ``scales``) op."""
    return att.operands[4 if att.name == "poot.paged_attention" else 3]


def _root(ops: list) -> tuple[ir.Operation, set] | None:
    """The region's one ``poot.attention`` / ``poot.paged_attention`` op and the ops from it
    to the return (reshapes only), or None."""
    atts = [o for o in ops if o.name in ("poot.attention", "poot.paged_attention")]
    if len(atts) != 1 or not ops or ops[-1].name != "func.return" or len(ops[-1].operands) != 1:
        return None
    att = atts[0]
    chain = {att, ops[-1]}
    r = ops[-1].operands[0]
    while r != att.results[0]:
        o = _owner(r)
        if o is None or o.name != "poot.reshape":
            return None
        chain.add(o)
        r = o.operands[0]
    return att, chain


def _arg_type(a: ir.Value) -> tuple[str, int]:
    """(element type, numel) of a function argument; ``("", 0)`` for a packed one."""
    t = type_from_mlir(a.type)
    return (t.dtype.value, _prod(t.shape)) if isinstance(t, TensorType) else ("", 0)


_FLOATS = (DType.F32, DType.F16, DType.BF16)


def _shapes(att: ir.Operation, args, arg_types, k: View, v: View):
    """``(batch, rows, S, D, Dv, paged)`` of the attention op (``paged``: its
    :class:`PagedKV`, None for a dense op), or None where the dtypes or shapes are not
    taken."""
    qt, kt, vt = (type_from_mlir(x.type) for x in att.operands[:3])
    mt = type_from_mlir(mask_operand(att).type)
    pkv = None
    if att.name == "poot.paged_attention":
        # q [B, H, rows..., D]; pools [NB, bs, H, D] of one float dtype; table [B, TW]
        tt_ = type_from_mlir(att.operands[3].type)
        table = resolve_view(att.operands[3], args)
        scales = _scale_views(att, args, kt, vt)
        if table is None or tt_.dtype not in (DType.I32, DType.I64) or \
                qt.dtype not in _FLOATS or scales is None:
            return None
        NB, bs, H = kt.shape[:3]
        B_, TW = tt_.shape
        batch, rows = (B_, H), tuple(qt.shape[2:-1])
        S, D, Dv = TW * bs, kt.shape[-1], vt.shape[-1]
        pkv = PagedKV(table, tt_.dtype.value, NB, bs, TW, *scales)
    else:
        if any(t.dtype not in _FLOATS for t in (qt, kt, vt)) or \
                any(arg_types[x.arg][0] not in ("f32", "f16", "bf16") for x in (k, v)):
            return None
        nb = len(kt.shape) - 2
        batch, rows = tuple(kt.shape[:nb]), tuple(qt.shape[nb:-1])
        S, D, Dv = kt.shape[-2], kt.shape[-1], vt.shape[-1]
    if S < 1 or D < 1 or Dv < 1 or not rows or len(mt.shape) != len(qt.shape):
        return None
    return batch, rows, S, D, Dv, pkv


def _scale_views(att: ir.Operation, args, kt: TensorType, vt: TensorType):
    """``(k_scale, v_scale)`` of a ``poot.paged_attention``: the views of its q8_0 (f16) or
    fp8 (f32, one a head vector) scales operands (k's first, one per ``i8`` pool; None for a float pool), or None where the pools
    are neither one float dtype nor q8_0 values, or a scales operand is not a view of an
    argument."""
    scales = list(att.operands[5:])
    if kt.dtype in _FLOATS and vt.dtype in _FLOATS:
        return (None, None) if vt.dtype == kt.dtype and not scales else None
    out = []
    for t in (kt, vt):
        if t.dtype in _FLOATS:
            out.append(None)
            continue
        if t.dtype is not DType.I8 or not scales:
            return None
        fp8 = type_from_mlir(scales[0].type).dtype is DType.F32    # one scale a head vector
        if not fp8 and t.shape[-1] % Q8_0.group:
            return None
        view = resolve_view(scales.pop(0), args)
        if view is None:
            return None
        out.append(view)
    return None if scales else tuple(out)


def _mask(att: ir.Operation, args):
    """The mask operand: ``(kind, view, const, negate, value)``: ``kind`` ``"i1"``/``"f32"``;
    a view (``not`` of one for i1: ``negate``), a splat constant, or else the operand itself
    (``value``: any elementwise-class expression, evaluated per row and key); None for
    another mask dtype."""
    mt = type_from_mlir(mask_operand(att).type)
    mval, negate = mask_operand(att), False
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
            mask_value, negate = mask_operand(att), False
    return kind, mview, mconst, negate, mask_value


__all__ = ["AttentionRegion", "PagedKV", "View", "match_attention", "reshape_strides",
           "resolve_view", "slice_ops"]
