"""Lowering of ``poot.attention`` (:mod:`poot.dialects.ops.attention`): online softmax over
key blocks (flash attention), never materializing the ``[rows, S]`` score matrix.

Keys are visited in blocks of ``BLOCK_KEYS`` (``Bk``): an ``scf.for`` over the ``S // Bk``
full blocks carries, per query row, the running max ``m``, the running sum ``l`` and the
output accumulator ``acc`` (``[batch..., rows..., Dv]``); a last block of ``S % Bk`` keys is
emitted after the loop, and ``S <= Bk`` is one block with no loop. Per block (all tensors
``[batch..., rows..., Bk]`` at most):

    x    = softcap(scale * q . k_blk)            (a contraction over D; masked as the op says)
    m'   = max(m, max_j x)
    p    = exp(x - m')                            (0 where not visible, i1 mask)
    a    = exp(m - m')                            (1 when m == m', so -inf - -inf never occurs)
    l'   = l * a + sum_j p
    acc' = acc * a + p @ v_blk

and finally ``out = acc / l`` (additive bias) or ``acc / max(l, 1)`` (i1 mask: a row with no
visible key has ``l = 0`` and ``acc = 0``, so it yields zeros, as the op's definition says).

Agreement with the oracle: the op's result within 1e-5 relative (f32; the summation order over
keys differs from the oracle's one-shot softmax and BLAS matmuls).

``poot.paged_attention`` (:class:`~poot.dialects.ops.attention.PagedAttention`) runs the same
block update with the KV blocks as the key blocks: a loop over the (sequence, KV head)
pairs (``scf.forall``, threads, when the strategy has cores: decode of one sequence spreads
its KV heads over them), and per pair an ``scf.for`` over its sequence's block-table entries, each iteration reading block ``table[b, w]`` of
the pools in place (``[bs, H, D]``, no gathered copy). With an ``i1`` mask the loop visits
only the blocks from the first to the last visible key of the sequence (found by one pass
over its mask row: a block with no visible key leaves ``(m, l, acc)`` as they are), so decode
cost follows the sequence's length, not the table's width; inside a visited block a masked
key's value is selected away (``p == 0``: nothing is added, whatever a reused block holds
there), as the op's definition says.

A q8_0 pool (int8 values and an f16 scale per 32 of them, :mod:`poot.dialects.kv_quant`) is
read the same way: each visited block is dequantized, where it is loaded, into an f32
``[bs, 1, D]`` tile that the work item carries through its block loop (one buffer, rewritten
in place each block: L1-sized, never a copy of the pool), and the block update reads the tile
as it reads an f32 block. Converting each stored value once per block, rather than once per
query row in the contractions, is what keeps GQA's several rows per KV head cheap.

A backend may take the op with its own kernel first (its strategy's kernels'
``paged_attention``, returning None to leave it here): the CPU's, for q8_0 pools, is
:mod:`poot.backends.cpu.attention` (dequantized in registers, state in registers across the
block loop); float pools and the other backends' generic mapping keep this lowering.
"""

from __future__ import annotations

from poot.dialects.lowering.emit import Emitter, affine_map, identity_map, tt
from poot.dialects.lowering.rules import OpInfo, rule
from poot.dialects.ops.attention import MASKED_SCORE
from poot.dialects.types import DType, TensorType

#: Keys per block of the online softmax.
BLOCK_KEYS = 64


def _fill(em: Emitter, t: TensorType, value: float) -> str:
    c = em.const(value, "f32")
    return em.op(f"linalg.fill ins({c} : f32) outs({em.empty(t)} : {tt(t)}) -> {tt(t)}", "f")


def _keep_maps(r: int, m: TensorType, full: tuple[int, ...]) -> str:
    """The indexing map reading mask ``m`` (broadcastable to ``full``) over ``r`` loop dims."""
    return affine_map(r, ["0" if m.shape[i] == 1 and full[i] != 1 else f"d{i}"
                          for i in range(r)])


def _slice_keys(em: Emitter, x: str, t: TensorType, axis: int, off: str, n: int):
    """``x`` restricted to ``n`` entries from ``off`` on ``axis`` (no-op for the whole axis)."""
    if n == t.shape[axis]:
        return x, t
    shape = list(t.shape)
    shape[axis] = n
    rt = TensorType(tuple(shape), t.dtype)
    offs = ", ".join(off if i == axis else "0" for i in range(t.rank))
    sizes = ", ".join(str(d) for d in shape)
    ones = ", ".join("1" for _ in shape)
    return em.op(f"tensor.extract_slice {x}[{offs}] [{sizes}] [{ones}] : {tt(t)} to {tt(rt)}",
                 "s"), rt


def _online_block(em: Emitter, q: str, qt: TensorType, rows: tuple[int, ...], kb: str,
                  kbt: TensorType, k_axes: tuple[int, int, int] | None, vb: str,
                  vbt: TensorType, v_axes: tuple[int, int, int] | None, mb: str,
                  mbt: TensorType, n: int, scale: float, softcap: float, visible: bool, state,
                  inplace: bool, guard: bool = False):
    """One online-softmax step over a block of ``n`` keys (module doc); returns the new
    ``(m, l, acc)``: the block's scores (:func:`_block_scores`), their maximum and
    probabilities (:func:`_block_softmax`), the carried values rescaled and the block's
    values added (:func:`_block_carry`).

    ``q``: ``[batch..., rows..., D]``; the scores' loop dims are ``rows`` (batch and row dims,
    r - 1 of them) then the key j. ``kb``/``vb``: the block's keys and values. With
    ``k_axes``/``v_axes`` None they are ``[batch..., n, D]`` (the dense op's layout);
    otherwise a rank-3 block with one batch dim whose axes are given as (axis of the batch
    dim, axis of the key j, axis of D): the paged pools' ``[bs, H, D]`` is ``(1, 0, 2)``.
    ``mb``: the mask block, broadcastable to ``rows + (n,)``. ``guard`` (paged: a masked key
    of a reused block may hold anything): a ``-inf`` bias gives ``-inf`` whatever the score,
    and nothing is added where ``p == 0``.
    """
    r = len(rows) + 1                # loop dims of a score block: rows..., key
    nb = kbt.rank - 2 if k_axes is None else 1
    sb_t = TensorType(rows + (n,), DType.F32)
    kmap = _kv_map(r, nb, k_axes, f"d{r - 1}", f"d{r}")
    mask = (mb, mbt, _keep_maps(r, mbt, rows + (n,)))
    x = _block_scores(em, q, qt, kb, kbt, kmap, mask, sb_t, scale, softcap, visible, guard)
    bmax, alpha, p, psum = _block_softmax(em, x, sb_t, state[0], mask, visible)
    vmap = _kv_map(r, nb, v_axes, f"d{r - 1}", f"d{r}")
    dv = vbt.shape[-1] if v_axes is None else vbt.shape[v_axes[2]]
    return _block_carry(em, state, sb_t, (bmax, alpha, p, psum), vb, vbt, vmap, dv, inplace,
                        guard)


def _kv_map(r: int, nb: int, axes, key: str, inner: str) -> str:
    """Indexing map of a k/v block over loop dims ``(rows..., key, inner)`` (``r`` score
    dims; ``nb`` batch dims of a ``[batch..., n, inner]`` block, ``axes`` None; else the
    rank-3 block's (batch, key, inner) axes)."""
    if axes is None:                       # [batch..., n, inner]
        return affine_map(r + 1, [f"d{i}" for i in range(nb)] + [key, inner])
    out = [""] * 3
    out[axes[0]], out[axes[1]], out[axes[2]] = "d0", key, inner
    return affine_map(r + 1, out)


def _block_scores(em: Emitter, q: str, qt: TensorType, kb: str, kbt: TensorType, kmap: str,
                  mask, sb_t: TensorType, scale: float, softcap: float, visible: bool,
                  guard: bool) -> str:
    """f32 ``[rows..., n]`` scores of a key block: ``q . k`` scaled, soft-capped, then masked
    (``visible``: an i1 mask selecting ``MASKED_SCORE``; else an additive bias, ``guard``
    keeping a ``-inf`` bias ``-inf``). ``mask``: ``(value, type, indexing map)``."""
    r = sb_t.rank
    # scores: x[rows.., j] = sum_d q[rows.., d] * k[.., j, d]   (loop dims: rows.., j, d)
    qmap = affine_map(r + 1, [f"d{i}" for i in range(r - 1)] + [f"d{r}"])

    def dot(a, o):
        # reassoc: the D-loop reduction may be vectorized (LLVM's loop vectorizer needs it)
        prod = em.op(f"arith.mulf {em.ext(a[0], qt.dtype)}, {em.ext(a[1], kbt.dtype)} : f32")
        return em.op(f"arith.addf {o}, {prod} fastmath<reassoc> : f32")

    sc = em.generic(sb_t, [(q, qt, qmap), (kb, kbt, kmap)], dot,
                    iterators=["parallel"] * r + ["reduction"],
                    out_map=affine_map(r + 1, [f"d{i}" for i in range(r)]),
                    init=_fill(em, sb_t, 0.0), loop_rank=r + 1, reads_out=True)

    def scores(a, _o):
        x = a[0]
        if scale != 1.0:
            x = em.op(f"arith.mulf {x}, {em.const(scale, 'f32')} : f32")
        if softcap:
            x = em.op(f"arith.mulf {x}, {em.const(1.0 / softcap, 'f32')} : f32")
            x = em.op(f"math.tanh {x} : f32")
            x = em.op(f"arith.mulf {x}, {em.const(softcap, 'f32')} : f32")
        if visible:
            return em.op(f"arith.select {a[1]}, {x}, "
                         f"{em.const(float(MASKED_SCORE), 'f32')} : f32")
        y = em.op(f"arith.addf {x}, {a[1]} : f32")
        if guard:
            ninf = em.const(float("-inf"), "f32")
            dead = em.op(f"arith.cmpf oeq, {a[1]}, {ninf} : f32")
            y = em.op(f"arith.select {dead}, {ninf}, {y} : f32")
        return y

    return em.generic(sb_t, [(sc, sb_t, identity_map(r)), mask], scores)


def _max2(em: Emitter, a) -> str:
    return em.op(f"arith.maximumf {a[0]}, {a[1]} : f32")


def _block_softmax(em: Emitter, x: str, sb_t: TensorType, m: str, mask, visible: bool):
    """The block's row maxima ``bmax``, the factor ``alpha = exp(m - max(m, bmax))`` the
    carried values are rescaled by (1 where the maximum is unchanged), the probabilities
    ``p = exp(x - max(m, bmax))`` (0 for a ``-inf`` maximum, and where ``visible``'s mask
    hides the key) and their row sums: ``(bmax, alpha, p, psum)``."""
    r = sb_t.rank
    row_t = TensorType(sb_t.shape[:-1], DType.F32)
    drop_last = affine_map(r, [f"d{i}" for i in range(r - 1)])
    bmax = em.generic(row_t, [(x, sb_t, identity_map(r))],
                      lambda a, o: em.op(f"arith.maximumf {o}, {a[0]} : f32"),
                      iterators=["parallel"] * (r - 1) + ["reduction"], out_map=drop_last,
                      init=_fill(em, row_t, float("-inf")), loop_rank=r, reads_out=True)
    # Carried values are rewritten in place (the final op of each writes into its loop
    # argument: one-shot bufferization wants yields equivalent to the iter_args), so
    # everything reading the old m is computed first.
    m_new = em.pointwise(row_t, [(m, row_t), (bmax, row_t)], lambda a: _max2(em, a))

    def alpha_fn(a):
        mn = _max2(em, a)
        same = em.op(f"arith.cmpf oeq, {a[0]}, {mn} : f32")
        d = em.op(f"arith.subf {a[0]}, {mn} : f32")
        e = em.op(f"math.exp {d} : f32")
        return em.op(f"arith.select {same}, {em.const(1.0, 'f32')}, {e} : f32")

    alpha = em.pointwise(row_t, [(m, row_t), (bmax, row_t)], alpha_fn)

    def prob(a, _o):
        ninf = em.const(float("-inf"), "f32")
        d = em.op(f"arith.subf {a[0]}, {a[1]} : f32")
        e = em.op(f"math.exp {d} : f32")
        dead = em.op(f"arith.cmpf oeq, {a[1]}, {ninf} : f32")
        e = em.op(f"arith.select {dead}, {em.const(0.0, 'f32')}, {e} : f32")
        if visible:
            e = em.op(f"arith.select {a[2]}, {e}, {em.const(0.0, 'f32')} : f32")
        return e

    ins = [(x, sb_t, identity_map(r)), (m_new, row_t, drop_last)]
    if visible:
        ins.append(mask)
    p = em.generic(sb_t, ins, prob)
    psum = em.generic(row_t, [(p, sb_t, identity_map(r))],
                      lambda a, o: em.op(f"arith.addf {o}, {a[0]} : f32"),
                      iterators=["parallel"] * (r - 1) + ["reduction"], out_map=drop_last,
                      init=_fill(em, row_t, 0.0), loop_rank=r, reads_out=True)
    return bmax, alpha, p, psum


def _block_carry(em: Emitter, state, sb_t: TensorType, soft, vb: str, vbt: TensorType,
                 vmap: str, dv: int, inplace: bool, guard: bool):
    """The carried ``(m, l, acc)`` after a block (``soft``: :func:`_block_softmax`'s
    ``(bmax, alpha, p, psum)``): ``m = max(m, bmax)``, ``l = l * alpha + psum``,
    ``acc = acc * alpha + p . v`` (``dv`` values a row; ``guard``: a ``p == 0`` adds nothing,
    whatever v holds).
    ``inplace``: inside the loop, each is written into its loop argument."""
    m, lsum, acc = state
    bmax, alpha, p, psum = soft
    r = sb_t.rank
    rows = sb_t.shape[:-1]
    row_t = TensorType(rows, DType.F32)
    acc_t = TensorType(rows + (dv,), DType.F32)
    drop_last = affine_map(r, [f"d{i}" for i in range(r - 1)])
    idr = identity_map(r - 1)

    def update(t: TensorType, old: str, ins, fn):
        """``fn(ins, old)`` per element. In the loop it writes into ``old`` (one-shot
        bufferization wants yields equivalent to the iter_args); after the loop it reads
        ``old`` as an input into a fresh tensor: linalg-fuse-elementwise-ops fuses a
        read-modify-write of an out into a consumer with more loops and then applies it
        once per extra iteration (seen with MLIR 22)."""
        if inplace:
            return em.generic(t, ins, fn, init=old, reads_out=True)
        return em.generic(t, [(old, t, identity_map(t.rank))] + list(ins),
                          lambda a, _o: fn(a[1:], a[0]))

    # m is written last: every read of the old m (alpha, p) precedes it.
    m_out = update(row_t, m, [(bmax, row_t, idr)], lambda a, o: _max2(em, [o, a[0]]))

    def lsum_fn(a, o):
        t = em.op(f"arith.mulf {o}, {a[0]} : f32")
        return em.op(f"arith.addf {t}, {a[1]} : f32")

    l_new = update(row_t, lsum, [(alpha, row_t, idr), (psum, row_t, idr)], lsum_fn)
    scaled = update(acc_t, acc, [(alpha, row_t, drop_last)],
                    lambda a, o: em.op(f"arith.mulf {o}, {a[0]} : f32"))
    # acc[rows.., e] += sum_j p[rows.., j] * v[.., j, e]   (loop dims: rows.., j, e: the
    # innermost loop walks e, contiguous in v and acc, with no reduction in it)
    pmap = affine_map(r + 1, [f"d{i}" for i in range(r - 1)] + [f"d{r - 1}"])

    def pv(a, o):
        prod = em.op(f"arith.mulf {a[0]}, {em.ext(a[1], vbt.dtype)} : f32")
        if guard:
            zero = em.const(0.0, "f32")
            live = em.op(f"arith.cmpf une, {a[0]}, {zero} : f32")
            prod = em.op(f"arith.select {live}, {prod}, {zero} : f32")
        return em.op(f"arith.addf {o}, {prod} : f32")

    acc_new = em.generic(acc_t, [(p, sb_t, pmap), (vb, vbt, vmap)], pv,
                         iterators=["parallel"] * (r - 1) + ["reduction", "parallel"],
                         out_map=affine_map(r + 1, [f"d{i}" for i in range(r - 1)]
                                            + [f"d{r}"]),
                         init=scaled, loop_rank=r + 1, reads_out=True)
    return m_out, l_new, acc_new


def _finish(em: Emitter, rows: tuple[int, ...], dv: int, acc: str, lsum: str,
            visible: bool) -> str:
    """``acc / l`` (additive bias) or ``acc / max(l, 1)`` (i1 mask)."""
    r = len(rows) + 1
    acc_t = TensorType(rows + (dv,), DType.F32)

    def fn(a, _o):
        den = a[1]
        if visible:
            den = em.op(f"arith.maximumf {den}, {em.const(1.0, 'f32')} : f32")
        return em.op(f"arith.divf {a[0]}, {den} : f32")

    return em.generic(acc_t, [(acc, acc_t, identity_map(r)),
                              (lsum, TensorType(rows, DType.F32),
                               affine_map(r, [f"d{i}" for i in range(r - 1)]))], fn)


def scf_for(em: Emitter, lo: str, hi: str, step: str | None, state: list[str],
            types: list[str], body) -> list[str]:
    """``scf.for iv = lo to hi step step`` (index SSA names; ``step`` None: 1) carrying
    ``state`` (SSA names of MLIR types ``types``); ``body(iv, state) -> new state``. Returns
    the loop's results. Shared by this lowering and the CPU kernels
    (:mod:`poot.backends.cpu.attention`)."""
    loop, iv = em.fresh("loop"), em.fresh("iv")
    names = [em.fresh("s") for _ in state]
    ts = ", ".join(types)
    step = step or em.const(1, "index")
    em.line(f"{loop}:{len(state)} = scf.for {iv} = {lo} to {hi} step {step} iter_args("
            f"{', '.join(f'{n} = {s}' for n, s in zip(names, state))}) -> ({ts}) {{")
    em.depth += 1
    new = body(iv, names)
    em.line(f"scf.yield {', '.join(new)} : {ts}")
    em.depth -= 1
    em.line("}")
    return [f"{loop}#{i}" for i in range(len(state))]


@rule("attention")
def lower_attention(em: Emitter, op: OpInfo) -> str:
    q, k, v, mask = op.args
    qt, kt, vt, mt = op.types
    scale, softcap = float(op.attrs["scale"]), float(op.attrs["softcap"])
    visible = mt.dtype is DType.I1
    nb = kt.rank - 2
    s_len, dv = kt.shape[-2], vt.shape[-1]
    rows = qt.shape[:-1]             # batch + rows
    row_t = TensorType(rows, DType.F32)
    acc_t = TensorType(rows + (dv,), DType.F32)
    r = qt.rank

    def block(off: str, n: int, state, inplace: bool):
        kb, kbt = _slice_keys(em, k, kt, nb, off, n)
        vb, vbt = _slice_keys(em, v, vt, nb, off, n)
        mb, mbt = mask, mt
        if mt.shape[-1] != 1 or s_len == 1:
            mb, mbt = _slice_keys(em, mask, mt, r - 1, off, n)
        return _online_block(em, q, qt, rows, kb, kbt, None, vb, vbt, None, mb, mbt, n,
                             scale, softcap, visible, state, inplace)

    state = [_fill(em, row_t, float("-inf")), _fill(em, row_t, 0.0), _fill(em, acc_t, 0.0)]
    bk = BLOCK_KEYS
    n_full, tail = divmod(s_len, bk)
    if s_len <= bk:
        n_full, tail = 0, s_len
    if n_full:
        c0, cend, cstep = (em.const(v_, "index") for v_ in (0, n_full * bk, bk))
        state = scf_for(em, c0, cend, cstep, state, [tt(t) for t in (row_t, row_t, acc_t)],
                        lambda iv, st: block(iv, bk, st, True))
    if tail:
        state = block(em.const(n_full * bk, "index"), tail, state, False)
    if op.result.shape != acc_t.shape or op.result.dtype is not DType.F32:
        op.refuse(f"result type {op.result} is not {acc_t}")
    return _finish(em, rows, dv, state[2], state[1], visible)


def _visible_range(em: Emitter, mb: str, mbt: TensorType) -> tuple[str, str]:
    """(first, last) visible key index (index values) of a sequence's mask ``mb`` (i1 stored
    as i8, key axis last); ``(S, -1)`` when no key is visible."""
    r = mbt.rank
    s = mbt.shape[-1]
    i32 = "i32"
    red = ["reduction"] * r
    scalar = TensorType((), DType.I32)
    out_map = f"affine_map<({', '.join(f'd{i}' for i in range(r))}) -> ()>"

    def pick(fn: str, init: int):
        def body(a, o):
            j = em.op(f"linalg.index {r - 1} : index")
            ji = em.op(f"arith.index_cast {j} : index to {i32}")
            cand = em.op(f"arith.select {a[0]}, {ji}, {em.const(init, i32)} : {i32}")
            return em.op(f"arith.{fn} {o}, {cand} : {i32}")
        init_t = em.op(f"linalg.fill ins({em.const(init, i32)} : {i32}) outs("
                       f"{em.empty(scalar)} : {tt(scalar)}) -> {tt(scalar)}", "f")
        res = em.generic(scalar, [(mb, mbt, identity_map(r))], body, iterators=red,
                         out_map=out_map, init=init_t, loop_rank=r, reads_out=True)
        x = em.op(f"tensor.extract {res}[] : {tt(scalar)}")
        return em.op(f"arith.index_cast {x} : {i32} to index")

    return pick("minsi", s), pick("maxsi", -1)


def _dequant_tile(em: Emitter, x: str, xt: TensorType, s: str, st: TensorType,
                  into: str | None = None) -> tuple[str, TensorType]:
    """``(ssa, type)``: the q8_0 values ``x`` i8 ``[..., C]`` with their scales ``s`` f16
    ``[..., C / 32]`` as f32 ``[..., C]`` (``f32(q) * f32(d)``), through ``[..., C/32, 32]``
    views so that no index is divided; written into ``into`` (an f32 ``[..., C]`` tensor)
    when given, else into a new one."""
    *lead, c = xt.shape
    r = len(lead)
    grouped = tuple(lead) + (c // 32, 32)
    assoc = ", ".join([f"[{i}]" for i in range(r)] + [f"[{r}, {r + 1}]"])
    dims = ", ".join(map(str, grouped))
    x4t, y4t = TensorType(grouped, xt.dtype), TensorType(grouped, DType.F32)
    yt = TensorType(xt.shape, DType.F32)
    x4 = em.op(f"tensor.expand_shape {x} [{assoc}] output_shape [{dims}] : {tt(xt)} into "
               f"{tt(x4t)}")
    init = None if into is None else em.op(
        f"tensor.expand_shape {into} [{assoc}] output_shape [{dims}] : {tt(yt)} into "
        f"{tt(y4t)}")

    def value(a, _o):
        v = em.op(f"arith.sitofp {a[0]} : {xt.dtype.value} to f32")
        return em.op(f"arith.mulf {v}, {em.ext(a[1], st.dtype)} : f32")

    y4 = em.generic(y4t, [(x4, x4t, identity_map(r + 2)),
                          (s, st, affine_map(r + 2, [f"d{i}" for i in range(r + 1)]))],
                    value, init=init)
    return em.op(f"tensor.collapse_shape {y4} [{assoc}] : {tt(y4t)} into {tt(yt)}"), yt


def _pool_block(em: Emitter, pool, blk: str, hh: str, bs: int, hs: int):
    """``(ssa, type)`` of block ``blk``, heads ``hh:hh+hs``, of ``pool`` (``(ssa, [NB, bs, H,
    C] type)``) as ``[bs, hs, C]``."""
    x, t = pool
    c = t.shape[-1]
    bt = TensorType((bs, hs, c), t.dtype)
    return em.op(f"tensor.extract_slice {x}[{blk}, 0, {hh}, 0] [1, {bs}, {hs}, {c}] "
                 f"[1, 1, 1, 1] : {tt(t)} to {tt(bt)}"), bt


def item_blocks(em: Emitter, op: OpInfo, b: str, hh: str) -> tuple[str, str, str]:
    """``(mask, w_lo, w_hi)`` of the work item (sequence ``b``, KV head ``hh``) of
    ``poot.paged_attention`` ``op``: its mask rows (``[1, rows..., S]``, a slice of the op's
    mask) and the block-table entries it visits, ``w_lo .. w_hi`` (with a per-key i1 mask, from
    the block of the first to that of the last visible key; else the whole table)."""
    mask, mt, (bsz, w), bs = op.args[4], op.types[4], op.types[3].shape, op.types[1].shape[1]
    h = op.types[1].shape[2]
    c0 = em.const(0, "index")
    mbt = TensorType((1,) + mt.shape[2:], mt.dtype)
    mrow = b if mt.shape[0] != 1 else c0
    moffs = ", ".join([mrow, hh if mt.shape[1] == h and h != 1 else "0"]
                      + ["0"] * (mt.rank - 2))
    mb = em.op(f"tensor.extract_slice {mask}[{moffs}] [1, "
               f"{', '.join(str(x) for x in mbt.shape)}] [{', '.join(['1'] * mt.rank)}] "
               f": {tt(mt)} to {tt(mbt)}")
    if mt.dtype is not DType.I1 or mt.shape[-1] == 1:
        return mb, c0, em.const(w, "index")
    first, last = _visible_range(em, mb, mbt)
    cbs = em.const(bs, "index")
    w_lo = em.op(f"arith.divui {first}, {cbs} : index")
    # (last + bs) / bs: last = -1 (nothing visible) gives 0 blocks
    w_hi = em.op(f"arith.divui {em.op(f'arith.addi {last}, {cbs} : index')}, {cbs} : index")
    return mb, w_lo, w_hi


def table_block(em: Emitter, op: OpInfo, b: str, wv: str) -> str:
    """The pool block (an index, clamped to the pool) of entry ``wv`` of sequence ``b``'s row
    of ``op``'s block table."""
    table, tbt, nblocks = op.args[3], op.types[3], op.types[1].shape[0]
    ti = em.op(f"tensor.extract {table}[{b}, {wv}] : {tt(tbt)}")
    if tbt.dtype.value != "i64":
        ti = em.op(f"arith.extsi {ti} : {tbt.dtype.value} to i64")
    lo, hi = em.const(0, "i64"), em.const(nblocks - 1, "i64")
    ti = em.op(f"arith.minsi {em.op(f'arith.maxsi {ti}, {lo} : i64')}, {hi} : i64")
    return em.op(f"arith.index_cast {ti} : i64 to index")


@rule("paged_attention")
def lower_paged_attention(em: Emitter, op: OpInfo) -> str:
    kernels = op.strategy.kernels if op.strategy is not None else None
    own = getattr(kernels, "paged_attention", None)     # a backend's kernel (CPU: q8_0 pools)
    if own is not None and (res := own(em, op)) is not None:
        return res
    q, kp, vp, _table, _mask, *sargs = op.args
    qt, kpt, vpt, _tbt, mt, *stypes = op.types
    scale, softcap = float(op.attrs["scale"]), float(op.attrs["softcap"])
    visible = mt.dtype is DType.I1
    _, bs, h, d = kpt.shape
    # the q8_0 scales of an i8 pool, k's first: (ssa, [NB, bs, H, D/32] type) or None
    scales = [None, None]
    for i, pt in enumerate((kpt, vpt)):
        if pt.dtype is DType.I8:
            scales[i] = (sargs.pop(0), stypes.pop(0))
            if scales[i][1].dtype is DType.F32:      # fp8: read by backend kernels only
                op.refuse("an attention kernel reading fp8 KV pools")
    dv = vpt.shape[-1]
    out_t = TensorType(qt.shape[:-1] + (dv,), DType.F32)
    if op.result != out_t:
        op.refuse(f"result type {op.result} is not {out_t}")
    # One work item is one (sequence, KV head) pair: its query rows [1, rows...] (the heads
    # of the group, the step's tokens) against that head of each visited block. Items are
    # independent, so with threads they are an scf.forall (decode of one sequence still
    # spreads its KV heads over the cores).
    hs = 1                                         # KV heads per work item
    qbt = TensorType((hs,) + qt.shape[2:], qt.dtype)
    rows = qbt.shape[:-1]
    row_t = TensorType(rows, DType.F32)
    acc_t = TensorType(rows + (dv,), DType.F32)
    kbt = TensorType((bs, hs, d), kpt.dtype)
    vbt = TensorType((bs, hs, dv), vpt.dtype)
    mbt = TensorType((1,) + mt.shape[2:], mt.dtype)
    per_key = mt.shape[-1] != 1

    def one_item(b: str, hh: str) -> str:
        tail = ", ".join(["0"] * (qt.rank - 2))
        qb = em.op(f"tensor.extract_slice {q}[{b}, {hh}, {tail}] [1, "
                   f"{', '.join(str(x) for x in qbt.shape)}] [{', '.join(['1'] * qt.rank)}] "
                   f": {tt(qt)} to {tt(qbt)}")
        mb, w_lo, w_hi = item_blocks(em, op, b, hh)

        def block(wv: str, st):
            blk = table_block(em, op, b, wv)
            kb = em.op(f"tensor.extract_slice {kp}[{blk}, 0, {hh}, 0] [1, {bs}, {hs}, {d}] "
                       f"[1, 1, 1, 1] : {tt(kpt)} to {tt(kbt)}")
            vb = em.op(f"tensor.extract_slice {vp}[{blk}, 0, {hh}, 0] [1, {bs}, {hs}, {dv}] "
                       f"[1, 1, 1, 1] : {tt(vpt)} to {tt(vbt)}")
            # a q8_0 block: dequantized into the item's carried f32 tile (module doc)
            tiles, new_tiles, kt_, vt_ = list(st[3:]), [], kbt, vbt
            if scales[0] is not None:
                kb, kt_ = _dequant_tile(em, kb, kbt, *_pool_block(em, scales[0], blk, hh, bs,
                                                                  hs), into=tiles.pop(0))
                new_tiles.append(kb)
            if scales[1] is not None:
                vb, vt_ = _dequant_tile(em, vb, vbt, *_pool_block(em, scales[1], blk, hh, bs,
                                                                  hs), into=tiles.pop(0))
                new_tiles.append(vb)
            mk, mkt = mb, mbt
            if per_key:
                off = em.op(f"arith.muli {wv}, {em.const(bs, 'index')} : index")
                mk, mkt = _slice_keys(em, mb, mbt, mbt.rank - 1, off, bs)
            # kb [bs, H, D]: batch dim h is axis 1, key j axis 0, D axis 2
            return list(_online_block(em, qb, qbt, rows, kb, kt_, (1, 0, 2), vb, vt_,
                                      (1, 0, 2), mk, mkt, bs, scale, softcap, visible,
                                      st[:3], True, guard=True)) + new_tiles

        state = [_fill(em, row_t, float("-inf")), _fill(em, row_t, 0.0),
                 _fill(em, acc_t, 0.0)]
        types = [row_t, row_t, acc_t]
        for pool, c in ((scales[0], d), (scales[1], dv)):
            if pool is not None:         # the q8_0 block's f32 tile, carried (module doc)
                types.append(TensorType((bs, hs, c), DType.F32))
                state.append(em.empty(types[-1]))
        state = scf_for(em, w_lo, w_hi, None, state, [tt(t) for t in types], block)
        return _finish(em, rows, dv, state[2], state[1], visible)

    return paged_items(em, op, acc_t, one_item)


def paged_items(em: Emitter, op: OpInfo, acc_t: TensorType, one_item) -> str:
    """The result of ``poot.paged_attention`` ``op`` from its work items, one per (sequence,
    KV head) pair: ``one_item(b, hh)`` emits one and returns its ``acc_t`` (``[1, rows...,
    Dv]``) result. With threads (the strategy's cores) the items are an ``scf.forall``, else
    an ``scf.for`` over the sequences with the heads unrolled."""
    out_t = op.result
    bsz, nh = op.types[3].shape[0], op.types[1].shape[2]
    c0, c1 = em.const(0, "index"), em.const(1, "index")
    init = em.empty(out_t)
    sizes = ", ".join(["1"] + [str(x) for x in acc_t.shape])
    ones = ", ".join(["1"] * out_t.rank)
    tail = ", ".join(["0"] * (acc_t.rank - 1))
    strategy = op.strategy
    res, o, b, hh = em.fresh("pa"), em.fresh("o"), em.fresh("b"), em.fresh("hh")
    if strategy is not None and strategy.cores > 1 and bsz * nh > 1:
        em.line(f"{res} = scf.forall ({b}, {hh}) in ({bsz}, {nh}) shared_outs({o} = {init}) "
                f"-> ({tt(out_t)}) {{")
        em.depth += 1
        item = one_item(b, hh if nh > 1 else c0)
        em.line("scf.forall.in_parallel {")
        em.line(f"  tensor.parallel_insert_slice {item} into {o}[{b}, {hh}, {tail}] [{sizes}] "
                f"[{ones}] : {tt(acc_t)} into {tt(out_t)}")
        em.line("}")
        em.depth -= 1
        em.line("}")
        return res
    em.line(f"{res} = scf.for {b} = {c0} to {em.const(bsz, 'index')} step {c1} "
            f"iter_args({o} = {init}) -> ({tt(out_t)}) {{")
    em.depth += 1
    cur = o
    for i in range(nh):
        ci = em.const(i, "index")
        item = one_item(b, ci)
        cur = em.op(f"tensor.insert_slice {item} into {cur}[{b}, {ci}, {tail}] [{sizes}] "
                    f"[{ones}] : {tt(acc_t)} into {tt(out_t)}")
    em.line(f"scf.yield {cur} : {tt(out_t)}")
    em.depth -= 1
    em.line("}")
    return res


@rule("dequantize_q8_0")
def lower_dequantize_q8_0(em: Emitter, op: OpInfo) -> str:
    """``f32(values) * f32(scales[..., c / 32])``, elementwise over the result."""
    (vals, scales), (vt, st) = op.args, op.types
    return _dequant_tile(em, vals, vt, scales, st)[0]
