"""``poot-flash-attention``: rewrite ``softmax(softcap(Q K^T * scale) (+|masked) mask) V``,
however it is spelled with primitives, into one ``poot.attention``
(:mod:`poot.dialects.ops.attention`), whose lowering runs an online softmax over key blocks
and never materializes the score matrix.

Matching is on semantics, anchored at the ``p @ V`` matmul and walked backwards through
use-def chains (never op order or tracer names):

* ``P @ V``: ``poot.matmul(P, V)`` with ``V`` ``[batch..., S, Dv]``; ``P`` is, through
  reshapes, the softmax result at some shape ``F = batch + rows + [S]`` whose row dims
  multiply to the matmul's ``M`` (GQA's ``[B, Hkv, G, T, S]`` view of ``[B, Hkv, G*T, S]``).
  The key axis is the last axis of ``F``, the one the matmul contracts; the softmax's
  reductions must be over exactly that axis (identified by shape, not position).
* softmax: ``e / bcast(den)`` where ``den`` is a ``reduce sum`` over the key axis of the same
  ``e`` (row value brought back by reshape to keep-dims and/or broadcast, either spelling),
  ``e = exp(y - bcast(reduce max over the key axis of the same y))``.
* masking, two forms (the op's mask dtype):

  - *visible* (i1): ``y = select(vis, x, C)`` with a splat ``C <= -1e30`` (or ``-inf``), the
    numerator zeroed ``select(vis, exp(..), 0)`` with the *same* mask, and
    ``den = max(sum, c)`` with a splat ``0 < c <= 1`` (a row with no visible key gives zeros,
    not NaN). The branches may be swapped against a *masked* condition:
    ``select(m, C, x)`` / ``select(m, 0, e)`` (the op then gets ``not m``).
  - *additive* (f32): ``y = x + bias`` (either operand order; any f32 bias: a -1e30/-inf
    mask, ALiBi, ...), plain softmax; no mask at all is a zero bias.

  The mask/bias operand of the op is the broadcast's source (reshaped to the scores' rank), so
  a ``[B, 1, 1, T, S]`` causal mask stays that size.
* scores ``x``: from ``matmul(Q, R)`` with ``R = [batch..., D, S]`` (``K^T``: k is
  ``transpose(R)``, composed with R's own transpose when R is one), through reshapes and
  elementwise ops with splat constants: multiplies/divides (scale, before or after the
  matmul: a splat multiply directly on Q is folded into ``scale``) and a soft cap
  ``c2 * tanh(x * c1)`` with ``c1 * c2 = 1``; scale factors after the cap are not this op.

Every intermediate value (scores, masked scores, exp, numerator, row values) must have no use
outside the pattern; otherwise the composition's pieces are needed elsewhere and the pass does
not fire. It also does not fire when: the softmax is over another axis than the contracted
key axis, the exp input is not max-subtracted over that same axis of the same tensor, the
max/sum reduce another tensor, the masked form lacks the zeroing select or the ``max(sum, c)``
clamp (fully masked rows would be NaN, the op gives zeros) or its fill is above -1e30, the two
selects use different masks, the shapes do not line up (batch dims differ, a reshape mixes the
key axis or the batch dims), or the operands are not f32.

The op's oracle computes the same f32 operations in the composition's order, so the rewritten
graph equals the original to matmul summation-order rounding.

**Paged KV.** When the attention's keys and values are, through views only, a gather of KV
block pools by a block table, the op becomes ``poot.paged_attention``
(:class:`~poot.dialects.ops.attention.PagedAttention`), which reads the pools in place:

* ``k`` (``[B, H, S, D]``, the attention's batch dims ``[B, H]``) is reached from
  ``poot.gather(k_pool, table, axis = 0)`` (``k_pool [NB, bs, H, D]``, integer
  ``table [B, W]``, result ``[B, W, bs, H, D]``) through ``poot.reshape``, ``poot.transpose``
  and float-to-float ``poot.cast`` only, and those views put element ``(b, h, j, d)`` at
  gather coordinate ``(b, j // bs, j % bs, h, d)``: key j is block ``table[b, j // bs]``,
  offset ``j % bs`` (decided by following which gather axes each dim is made of, not by the
  ops' spelling); ``v`` likewise, through the *same* table with a pool of the same
  ``[NB, bs, H]``.
* A q8_0 pool (:mod:`poot.dialects.kv_quant`) is read as
  ``poot.dequantize_q8_0(gather(values, table), gather(scales, table))``: the dequantize
  takes the place of the cast, its scales gathered through the same table, and the op gets
  the values pool (i8) and the scales pool (a trailing operand), so the lowering
  dequantizes each block where it loads it.
* Anything else (another order of the key axis, a table that differs between k and v, an
  integer cast) keeps ``poot.attention`` over the gathered tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from mlir import ir

from poot.dialects.opdef import attr_to_mlir, dense_to_mlir
from poot.dialects.types import DType, TensorType, type_from_mlir
from poot.passes.analysis import defining_op, functions, has_uses
from poot.passes.canonicalize import splat_value
from poot.passes.dce import dce
from poot.passes.ir_utils import NoMatch, dtype_of, fn_attr, i64s, need, same_value, shape_of
from poot.passes.registry import register_pass

MASK_FILL_MAX = -1e30   # a masked-score fill must be at most this (poot.graph.ops.MASKED_SCORE)


def _n_uses(v: ir.Value) -> int:
    return sum(1 for _ in v.uses)


def _prod(xs) -> int:
    n = 1
    for x in xs:
        n *= int(x)
    return n


def _producer(v: ir.Value, name: str | None = None, fn: str | None = None):
    p = defining_op(v)
    if p is None or (name is not None and p.name != name):
        return None
    if fn is not None and fn_attr(p) != fn:
        return None
    return p


def _only_use(v: ir.Value) -> None:
    need(_n_uses(v) == 1, "an intermediate value has another consumer")


@dataclass
class _Match:
    mm1: ir.Operation
    mm2: ir.Operation
    q: ir.Value
    r: ir.Value                 # K^T [batch..., D, S]
    v: ir.Value
    rows: tuple[int, ...]
    scale: float
    softcap: float
    mode: str                   # "visible" | "bias" | "none"
    mask: ir.Value | None       # at the scores' shape F (possibly a broadcast)
    negate: bool = False
    notes: list = field(default_factory=list)


def _splat_operand(op: ir.Operation):
    """For a binary op with one splat operand: (index of the other operand, splat value)."""
    a, b = op.operands
    cb, ca = splat_value(b), splat_value(a)
    if cb is not None:
        return 0, cb
    if ca is not None:
        return 1, ca
    return None


def _row_reduce(v: ir.Value, full: tuple[int, ...], fn: str):
    """``v`` (shape ``full``) as a row value of a ``reduce fn`` over the last axis brought back
    to ``full`` by keep-dims reshape and/or broadcast, with splat ``max`` clamps on the way.
    Returns (reduce op, [clamp constants]). Every op on the way has one use."""
    n = len(full)
    row, keep = full[:-1], full[:-1] + (1,)
    clamps, level, cur = [], "full", v
    while True:
        p = defining_op(cur)
        need(p is not None, "row value is an argument")
        if p.name == "poot.binary" and fn_attr(p) == "max" and _splat_operand(p):
            i, c = _splat_operand(p)
            clamps.append(float(c))
            _only_use(cur)
            cur = p.operands[i]
            continue
        if p.name == "poot.broadcast" and level == "full":
            src = p.operands[0]
            ss, dims = shape_of(src), i64s(p, "dims")
            need((ss == keep and dims == tuple(range(n))) or
                  (ss == row and dims == tuple(range(n - 1))), "broadcast is not a row map")
            _only_use(cur)
            cur, level = src, "row"
            continue
        if p.name == "poot.reshape" and shape_of(cur) in (row, keep) and \
                shape_of(p.operands[0]) in (row, keep):
            _only_use(cur)
            cur, level = p.operands[0], "row"
            continue
        if p.name == "poot.reduce":
            need(fn_attr(p) == fn, f"expected a reduce {fn}")
            need(shape_of(p.operands[0]) == full and i64s(p, "axes") == (n - 1,),
                  "reduction is not over the key axis of the scores")
            need(shape_of(cur) == row, "reduced value has the wrong shape")
            _only_use(cur)
            return p, clamps
        raise NoMatch(f"unexpected {p.name} in a row value")


def _scores(x: ir.Value, check_first: bool = True):
    """Walk the scores back to their matmul. Returns (mm1, scale, softcap)."""
    items = []   # forward order after reversal: ("f", c) | ("tanh",)
    cur = x
    while True:
        p = defining_op(cur)
        need(p is not None, "scores come from an argument")
        if p.name == "poot.matmul":
            break
        if cur != x or check_first:
            _only_use(cur)
        if p.name == "poot.reshape":
            cur = p.operands[0]
        elif p.name == "poot.binary" and fn_attr(p) in ("mul", "div") and _splat_operand(p):
            i, c = _splat_operand(p)
            if fn_attr(p) == "div":
                need(i == 0 and c != 0, "division of a constant by the scores")
                c = 1.0 / c
            items.append(("f", float(c)))
            cur = p.operands[i]
        elif p.name == "poot.unary" and fn_attr(p) == "tanh":
            items.append(("tanh",))
            cur = p.operands[0]
        else:
            raise NoMatch(f"{p.name} between the scores matmul and the softmax")
    if cur != x or check_first:
        _only_use(cur)
    items.reverse()
    tanhs = [i for i, it in enumerate(items) if it[0] == "tanh"]
    need(len(tanhs) <= 1, "more than one tanh")
    if not tanhs:
        return p, float(np.prod([it[1] for it in items])) if items else 1.0, 0.0
    t = tanhs[0]
    pre, post = [it[1] for it in items[:t]], [it[1] for it in items[t + 1:]]
    need(len(post) == 1 and post[0] > 0, "a soft cap is c * tanh(x / c), nothing after")
    cap = post[0]
    need(len(pre) >= 1, "tanh without the 1/c factor is not a soft cap")
    if abs(pre[-1] * cap - 1.0) <= 1e-6:      # x * (1/c): the cap's own factor
        scale = float(np.prod(pre[:-1]))
    else:
        scale = float(np.prod(pre)) * cap
    return p, scale, cap


def _match(mm2: ir.Operation) -> _Match:
    need(dtype_of(mm2.results[0]) is DType.F32, "result not f32")
    pv, v = mm2.operands
    shp, vs = shape_of(pv), shape_of(v)
    nb = len(shp) - 2
    batch, m_rows, s_len = shp[:nb], shp[-2], shp[-1]
    # P through reshapes to the softmax result
    cur = pv
    while (p := _producer(cur, "poot.reshape")) is not None:
        _only_use(cur)
        cur = p.operands[0]
    _only_use(cur)
    full = shape_of(cur)
    rows = full[nb:-1]
    need(full[:nb] == batch and full[-1] == s_len and len(rows) >= 1 and
          _prod(rows) == m_rows, "softmax shape does not line up with P @ V")
    div = _producer(cur, "poot.binary", "div")
    need(div is not None, "P is not a division")
    num, den = div.operands
    rsum, clamps = _row_reduce(den, full, "sum")
    need(rsum.operands[0] == num, "the sum is not over the numerator")
    need(_n_uses(num) == 2, "numerator has other consumers")
    sel = _producer(num, "poot.select")
    mode, negate, vis = "bias", False, None
    if sel is not None:
        c, a, b = sel.operands
        if splat_value(b) is not None and splat_value(b) == 0:
            e_val, vis = a, c
        elif splat_value(a) is not None and splat_value(a) == 0:
            e_val, vis, negate = b, c, True
        else:
            raise NoMatch("numerator select does not zero the masked entries")
        mode = "visible"
        need(len(clamps) == 1 and 0 < clamps[0] <= 1,
              "masked softmax without the max(sum, c<=1) clamp (fully masked rows)")
        _only_use(e_val)
    else:
        e_val = num
        need(all(0 < c <= 1 for c in clamps), "denominator clamp above 1")
    ex = _producer(e_val, "poot.unary", "exp")
    need(ex is not None, "numerator is not an exp")
    sub = _producer(ex.operands[0], "poot.binary", "sub")
    need(sub is not None, "exp input is not max-subtracted")
    _only_use(ex.operands[0])
    y, mx = sub.operands
    rmax, mclamps = _row_reduce(mx, full, "max")
    need(not mclamps and rmax.operands[0] == y, "max is not over the exp's own input")
    need(_n_uses(y) == 2, "softmax input has other consumers")
    mask = None
    yp = defining_op(y)
    if mode == "visible":
        need(yp is not None and yp.name == "poot.select", "masked scores are not a select")
        c, a, b = yp.operands
        x, fill = (a, b) if not negate else (b, a)
        fv = splat_value(fill)
        need(fv is not None and fv <= MASK_FILL_MAX, "masked-score fill above -1e30")
        need(same_value(c, vis), "the two selects use different masks")
        mask = vis
        mm1, scale, cap = _scores(x)
    else:
        try:
            mm1, scale, cap = _scores(y, check_first=False)
            mode = "none"
        except NoMatch:
            need(yp is not None and yp.name == "poot.binary" and fn_attr(yp) == "add",
                  "softmax input is neither scores nor scores + bias")
            last = None
            for xi in (0, 1):
                try:
                    mm1, scale, cap = _scores(yp.operands[xi])
                    mask = yp.operands[1 - xi]
                    break
                except NoMatch as e:
                    last = e
            else:
                raise last
            need(dtype_of(mask) is DType.F32, "bias is not f32")
    q, r = mm1.operands
    qs, rs = shape_of(q), shape_of(r)
    need(len(qs) == len(shp) and qs[:nb] == batch and rs[:nb] == batch and
          qs[-2] == m_rows and rs[-1] == s_len and vs[-2] == s_len,
          "scores matmul does not line up with P @ V")
    need(dtype_of(mm1.results[0]) is DType.F32, "scores not f32")
    need(dtype_of(q) is DType.F32 and dtype_of(v) is DType.F32, "q/k/v not f32")
    # a splat multiply directly on Q is part of the scale
    qp = _producer(q, "poot.binary", "mul")
    if qp is not None and _splat_operand(qp) and _n_uses(q) == 1:
        i, c = _splat_operand(qp)
        q, scale = qp.operands[i], scale * float(c)
    return _Match(mm1, mm2, q, r, v, rows, scale, cap, mode, mask, negate)


def _create(name, operands, rtype: TensorType, ip, attrs=None) -> ir.Value:
    return ir.Operation.create(name, results=[rtype.mlir()], operands=list(operands),
                               attributes=dict(attrs or {}), ip=ip).results[0]


def _unbroadcast(v: ir.Value, full: tuple[int, ...], ip) -> ir.Value:
    """The source of a broadcast to ``full``, reshaped to ``full``'s rank with size-1 dims."""
    p = _producer(v, "poot.broadcast")
    if p is None:
        return v
    src = p.operands[0]
    ss, dims = shape_of(src), i64s(p, "dims")
    shape = [1] * len(full)
    for j, d in enumerate(dims):
        shape[d] = ss[j]
    if tuple(shape) == ss:
        return src
    t = type_from_mlir(src.type)
    return _create("poot.reshape", [src], TensorType(tuple(shape), t.dtype), ip)


def _rewrite(m: _Match) -> None:
    mm2 = m.mm2
    with mm2.context, mm2.location:
        ip = ir.InsertionPoint(mm2)
        shp = shape_of(mm2.operands[0])
        nb = len(shp) - 2
        batch = shp[:nb]
        full = batch + m.rows + (shp[-1],)
        qt = type_from_mlir(m.q.type)
        q = m.q
        if qt.shape[nb:-1] != m.rows:
            q = _create("poot.reshape", [q], qt.with_shape(batch + m.rows + (qt.shape[-1],)), ip)
        # k = swap of the last two dims of R (composed with R's own transpose)
        rank = len(shp)
        swap = list(range(rank - 2)) + [rank - 1, rank - 2]
        src, perm = m.r, swap
        rp = _producer(m.r, "poot.transpose")
        if rp is not None:
            p0 = i64s(rp, "perm")
            src, perm = rp.operands[0], [p0[s] for s in swap]
        if perm == list(range(rank)):
            k = src
        else:
            st = type_from_mlir(src.type)
            k = _create("poot.transpose", [src],
                        st.with_shape(tuple(st.shape[p] for p in perm)), ip,
                        {"perm": attr_to_mlir("i64s", perm)})
        if m.mode == "none":
            mask = _create("poot.constant", [], TensorType((1,) * len(full), DType.F32), ip,
                           {"value": dense_to_mlir(np.zeros((1,) * len(full), np.float32))})
        else:
            mask, negate = m.mask, m.negate
            notp = _producer(mask, "poot.unary", "not")
            if negate and notp is not None:      # select(not(vis), fill, x): vis itself
                mask, negate = notp.operands[0], False
            mask = _unbroadcast(mask, full, ip)
            if negate:
                mask = _create("poot.unary", [mask], type_from_mlir(mask.type), ip,
                               {"fn": attr_to_mlir("enum", "not")})
        vt = type_from_mlir(m.v.type)
        out_t = TensorType(batch + m.rows + (vt.shape[-1],), DType.F32)
        out = _create("poot.attention", [q, k, m.v, mask], out_t, ip,
                      {"scale": attr_to_mlir("f64", m.scale),
                       "softcap": attr_to_mlir("f64", m.softcap)})
        res_t = type_from_mlir(mm2.results[0].type)
        if res_t.shape != out_t.shape:
            out = _create("poot.reshape", [out], res_t, ip)
    mm2.results[0].replace_all_uses_with(out)


def _matmuls(fn: ir.Operation) -> list[ir.Operation]:
    out = []
    for block in fn.regions[0].blocks:
        for op in block.operations:
            if op.operation.name == "poot.matmul":
                out.append(op.operation)
    return out


# ---- paged KV: attention over a gather through a block table ------------------------------------

def _kv_gather(v: ir.Value):
    """(gather op, dims, channels) when ``v`` is views of ``poot.gather(pool [NB, bs, H, D],
    table [B, W], axis 0)``: ``dims[i]`` lists, major to minor, the gather-result axes (0: B,
    1: W, 2: bs, 3: H, 4: D; size-1 axes left out) that make up dim i of ``v``; ``channels``
    the ``(start, limit)`` of D that ``v`` reads (a unit-stride ``poot.slice`` of the D axis
    alone may be among the views: values that are the leading channels of a pool of wider
    keys, as multi-head latent attention's). A q8_0 pool's ``poot.dequantize_q8_0`` of the
    gather is read through (its scales: :func:`_scales_gather`). NoMatch otherwise."""
    chain, cur = [], v
    while True:
        p = defining_op(cur)
        need(p is not None, "keys come from an argument, not a gather")
        if p.name == "poot.gather":
            break
        if p.name in DEQUANTIZE_OPS:
            need(_producer(p.operands[0], "poot.gather") is not None,
                 "a KV dequantize of something other than a gather of the pool")
        elif p.name == "poot.cast":
            need(dtype_of(p.operands[0]).is_float and dtype_of(cur).is_float,
                 "a cast between keys and the gather is not float to float")
        else:
            need(p.name in ("poot.reshape", "poot.transpose", "poot.slice"),
                 f"{p.name} between the keys and the gather")
        chain.append(p)
        cur = p.operands[0]
    g = p
    need(int(ir.IntegerAttr(g.attributes["axis"]).value) == 0,
         "gather is not over the pool's block axis")
    pool, table = g.operands
    need(len(shape_of(pool)) == 4 and len(shape_of(table)) == 2 and dtype_of(table).is_int,
         "gather is not of a [NB, bs, H, D] pool by a [B, W] table")
    sizes = list(shape_of(g.results[0]))                 # [B, W, bs, H, D]
    dims = [(a,) if sizes[a] != 1 else () for a in range(5)]
    channels = (0, sizes[4])
    for op in reversed(chain):
        if op.name == "poot.transpose":
            dims = [dims[i] for i in i64s(op, "perm")]
        elif op.name == "poot.slice":
            full = shape_of(op.operands[0])
            start, limit, stride = i64s(op, "start"), i64s(op, "limit"), i64s(op, "stride")
            cut = [i for i, n in enumerate(full) if (start[i], limit[i]) != (0, n)]
            need(all(s == 1 for s in stride) and len(cut) == 1 and dims[cut[0]] == (4,)
                 and channels == (0, sizes[4]),
                 "a slice of the keys other than one range of the pool's channels")
            channels = (start[cut[0]], limit[cut[0]])
            sizes[4] = limit[cut[0]] - start[cut[0]]
        elif op.name == "poot.reshape":
            factors = [a for d in dims for a in d]
            out, k = [], 0
            for n in shape_of(op.results[0]):
                grp, prod = [], 1
                while prod < n and k < len(factors):
                    grp.append(factors[k])
                    prod *= sizes[factors[k]]
                    k += 1
                need(prod == n, "a reshape splits a block-pool axis")
                out.append(tuple(grp))
            need(k == len(factors), "a reshape drops pool axes")
            dims = out
    return g, dims, channels


def _scales_gather(v: ir.Value, gather: ir.Operation):
    """The q8_0 scales pool ``[NB, bs, H, D / 32]`` read by the ``poot.dequantize_q8_0`` of
    ``gather`` on the way from ``v`` to it (through the same table, axis 0), or None when the
    pool is not quantized. NoMatch for scales read otherwise."""
    cur = v
    while (p := defining_op(cur)) is not None and p.operation != gather.operation:
        if p.name in DEQUANTIZE_OPS:
            sg = _producer(p.operands[1], "poot.gather")
            need(sg is not None and same_value(sg.operands[1], gather.operands[1])
                 and int(ir.IntegerAttr(sg.attributes["axis"]).value) == 0,
                 "q8_0 scales not gathered through the values' block table")
            return sg.operands[0]
        cur = p.operands[0]
    return None


#: the ops that read a block-quantized KV pool's gathered values with their scales
DEQUANTIZE_OPS = ("poot.dequantize_q8_0", "poot.dequantize_fp8")


def _per_head(scales: ir.Value) -> bool:
    """Whether ``scales`` is an fp8 pool's f32 ``[NB, bs, H, 1]`` plane (one scale a head
    vector: every channel range of the head reads it whole)."""
    return dtype_of(scales) is DType.F32


def _paged_operands(att: ir.Operation):
    """(k_pool, v_pool, table, scales) when ``att`` (a ``poot.attention`` with batch dims
    [B, H]) reads its k and v through one block table (see the module doc); ``scales``: the
    q8_0 scales pool of each i8 pool, k's first. NoMatch otherwise. A pool read through a
    channel range is that range: ``poot.slice`` ops made before ``att``."""
    q, k, v, _ = att.operands
    need(len(shape_of(k)) == 4, "attention is not over [B, H, S, D] keys")
    kg, kd, kc = _kv_gather(k)
    vg, vd, vc = _kv_gather(v)
    need(same_value(kg.operands[1], vg.operands[1]), "k and v use different block tables")
    kp, vp = kg.operands[0], vg.operands[0]
    ks, vs = _scales_gather(k, kg), _scales_gather(v, vg)
    need(shape_of(kp)[:3] == shape_of(vp)[:3], "k and v pools differ in [NB, bs, H]")
    need(dtype_of(kp) == dtype_of(vp) or ks is not None or vs is not None,
         "k and v float pools differ in dtype")
    for sc, (lo, hi) in ((ks, kc), (vs, vc)):
        need(sc is None or _per_head(sc) or (lo % 32 == 0 and hi % 32 == 0),
             "a q8_0 pool read through channels that split its 32-value groups")
    sizes = shape_of(kg.results[0])
    want = [(0,), (3,), (1, 2), (4,)]
    want = [tuple(a for a in d if sizes[a] != 1) for d in want]
    need(kd == want and vd == want, "the views do not make key j block table[b, j // bs], "
         "offset j % bs")
    scales = [sc if _per_head(sc) else _channels(sc, (lo // 32, hi // 32), att)
              for sc, (lo, hi) in ((ks, kc), (vs, vc)) if sc is not None]
    return _channels(kp, kc, att), _channels(vp, vc, att), kg.operands[1], scales


def _channels(pool: ir.Value, channels: tuple[int, int], before: ir.Operation) -> ir.Value:
    """``pool [NB, bs, H, D]`` itself, or its channels ``start:limit`` as a ``poot.slice``
    made before ``before``."""
    shape = shape_of(pool)
    if channels == (0, shape[3]):
        return pool
    start, limit = channels
    t = TensorType(tuple(shape[:3]) + (limit - start,), dtype_of(pool))
    with before.context, before.location:
        return _create("poot.slice", [pool], t, ir.InsertionPoint(before),
                       {"start": attr_to_mlir("i64s", [0, 0, 0, start]),
                        "limit": attr_to_mlir("i64s", list(shape[:3]) + [limit]),
                        "stride": attr_to_mlir("i64s", [1, 1, 1, 1])})


def page_attention(fn: ir.Operation) -> int:
    """Turn each ``poot.attention`` under ``fn`` whose keys and values are a gather through a
    block table into ``poot.paged_attention`` (module doc); returns how many."""
    n = 0
    for block in fn.regions[0].blocks:
        for op in list(block.operations):
            att = op.operation
            if att.name != "poot.attention":
                continue
            try:
                kp, vp, table, scales = _paged_operands(att)
            except NoMatch:
                continue
            q, _, _, mask = att.operands
            with att.context, att.location:
                new = _create("poot.paged_attention", [q, kp, vp, table, mask, *scales],
                              type_from_mlir(att.results[0].type), ir.InsertionPoint(att),
                              {"scale": att.attributes["scale"],
                               "softcap": att.attributes["softcap"]})
            att.results[0].replace_all_uses_with(new)
            n += 1
    if n:
        dce(fn)
    return n


def flash_attention(module, trace: list | None = None) -> int:
    """Rewrite every attention composition under ``module``; returns how many were rewritten.
    ``trace`` (a list), when given, receives one ``(matmul location, reason)`` per candidate
    ``P @ V`` matmul that did not match."""
    root = module.operation if isinstance(module, ir.Module) else module
    total = 0
    for fn in functions(root):
        if not fn.regions[0].blocks:
            continue
        # Sweeps over the matmuls, each rewriting every match it finds (a 30-layer step: 30
        # in one sweep, then one more that finds none), until a sweep rewrites nothing. A
        # rewritten composition is only dead after it (dce between sweeps), so a matmul with
        # no uses left is skipped: it was part of a composition rewritten in this sweep.
        while True:
            failures, rewritten = [], 0
            for mm in _matmuls(fn):
                if not has_uses(mm):
                    continue
                try:
                    m = _match(mm)
                except NoMatch as e:
                    failures.append((str(mm.location), str(e)))
                    continue
                _rewrite(m)
                rewritten += 1
            if not rewritten:
                if trace is not None:
                    trace.extend(failures)
                break
            dce(fn)
            total += rewritten
        page_attention(fn)
    return total


@register_pass("poot-flash-attention",
               "rewrite softmax(softcap(Q K^T scale) + mask) V compositions into poot.attention "
               "(poot.paged_attention when K/V are read through a block table)")
def run(module: ir.Operation) -> None:
    flash_attention(module)
