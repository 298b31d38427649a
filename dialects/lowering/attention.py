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


@rule("attention")
def lower_attention(em: Emitter, op: OpInfo) -> str:
    q, k, v, mask = op.args
    qt, kt, vt, mt = op.types
    scale, softcap = float(op.attrs["scale"]), float(op.attrs["softcap"])
    visible = mt.dtype is DType.I1
    r = qt.rank                      # loop dims of a score block: batch..., rows..., key
    nb = kt.rank - 2
    s_len, dv = kt.shape[-2], vt.shape[-1]
    rows = qt.shape[:-1]             # batch + rows
    row_t = TensorType(rows, DType.F32)
    acc_t = TensorType(rows + (dv,), DType.F32)
    drop_last = affine_map(r, [f"d{i}" for i in range(r - 1)])
    full = rows + (s_len,)

    def ext(x: str, d: DType) -> str:
        return em.ext(x, d)

    idr = identity_map(r - 1)

    def block(off: str, n: int, m: str, lsum: str, acc: str, inplace: bool):
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
        kb, kbt = _slice_keys(em, k, kt, nb, off, n)
        vb, vbt = _slice_keys(em, v, vt, nb, off, n)
        mb, mbt = mask, mt
        if mt.shape[-1] != 1 or s_len == 1:
            mb, mbt = _slice_keys(em, mask, mt, r - 1, off, n)
        sb_t = TensorType(rows + (n,), DType.F32)
        # scores: x[b.., r.., j] = sum_d q[b.., r.., d] * k[b.., j, d]
        qmap = affine_map(r + 1, [f"d{i}" for i in range(r - 1)] + [f"d{r}"])
        kmap = affine_map(r + 1, [f"d{i}" for i in range(nb)] + [f"d{r - 1}", f"d{r}"])

        def dot(a, o):
            prod = em.op(f"arith.mulf {ext(a[0], qt.dtype)}, {ext(a[1], kt.dtype)} : f32")
            return em.op(f"arith.addf {o}, {prod} : f32")

        sc = em.generic(sb_t, [(q, qt, qmap), (kb, kbt, kmap)], dot,
                        iterators=["parallel"] * r + ["reduction"],
                        out_map=affine_map(r + 1, [f"d{i}" for i in range(r)]),
                        init=_fill(em, sb_t, 0.0), loop_rank=r + 1, reads_out=True)
        mexprs = ["0" if mbt.shape[i] == 1 and full[i] != 1 else f"d{i}" for i in range(r)]
        mmap = affine_map(r, mexprs)

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
            return em.op(f"arith.addf {x}, {a[1]} : f32")

        x = em.generic(sb_t, [(sc, sb_t, identity_map(r)), (mb, mbt, mmap)], scores)
        bmax = em.generic(row_t, [(x, sb_t, identity_map(r))],
                          lambda a, o: em.op(f"arith.maximumf {o}, {a[0]} : f32"),
                          iterators=["parallel"] * (r - 1) + ["reduction"], out_map=drop_last,
                          init=_fill(em, row_t, float("-inf")), loop_rank=r, reads_out=True)
        # Carried values are rewritten in place (the final op of each writes into its loop
        # argument: one-shot bufferization wants yields equivalent to the iter_args), so
        # everything reading the old m is computed first.
        max2 = lambda a: em.op(f"arith.maximumf {a[0]}, {a[1]} : f32")  # noqa: E731
        m_new = em.pointwise(row_t, [(m, row_t), (bmax, row_t)], max2)

        def alpha_fn(a):
            mn = max2(a)
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
            ins.append((mb, mbt, mmap))
        p = em.generic(sb_t, ins, prob)
        psum = em.generic(row_t, [(p, sb_t, identity_map(r))],
                          lambda a, o: em.op(f"arith.addf {o}, {a[0]} : f32"),
                          iterators=["parallel"] * (r - 1) + ["reduction"], out_map=drop_last,
                          init=_fill(em, row_t, 0.0), loop_rank=r, reads_out=True)

        # m is written last: every read of the old m (alpha, p) precedes it.
        m_out = update(row_t, m, [(bmax, row_t, idr)], lambda a, o: max2([o, a[0]]))

        def lsum_fn(a, o):
            t = em.op(f"arith.mulf {o}, {a[0]} : f32")
            return em.op(f"arith.addf {t}, {a[1]} : f32")

        l_new = update(row_t, lsum, [(alpha, row_t, idr), (psum, row_t, idr)], lsum_fn)
        scaled = update(acc_t, acc, [(alpha, row_t, drop_last)],
                        lambda a, o: em.op(f"arith.mulf {o}, {a[0]} : f32"))
        # acc[b.., r.., e] += sum_j p[b.., r.., j] * v[b.., j, e]   (loop dims: ..., e, j)
        pmap = affine_map(r + 1, [f"d{i}" for i in range(r - 1)] + [f"d{r}"])
        vmap = affine_map(r + 1, [f"d{i}" for i in range(nb)] + [f"d{r}", f"d{r - 1}"])

        def pv(a, o):
            prod = em.op(f"arith.mulf {a[0]}, {ext(a[1], vt.dtype)} : f32")
            return em.op(f"arith.addf {o}, {prod} : f32")

        acc_new = em.generic(acc_t, [(p, sb_t, pmap), (vb, vbt, vmap)], pv,
                             iterators=["parallel"] * r + ["reduction"],
                             out_map=affine_map(r + 1, [f"d{i}" for i in range(r)]),
                             init=scaled, loop_rank=r + 1, reads_out=True)
        m_new = m_out
        return m_new, l_new, acc_new

    m = _fill(em, row_t, float("-inf"))
    lsum = _fill(em, row_t, 0.0)
    acc = _fill(em, acc_t, 0.0)
    bk = BLOCK_KEYS
    n_full, tail = divmod(s_len, bk)
    if s_len <= bk:
        n_full, tail = 0, s_len
    if n_full:
        c0, cend, cstep = (em.const(v_, "index") for v_ in (0, n_full * bk, bk))
        loop, iv = em.fresh("loop"), em.fresh("iv")
        mi, li, ai = em.fresh("m"), em.fresh("l"), em.fresh("acc")
        em.line(f"{loop}:3 = scf.for {iv} = {c0} to {cend} step {cstep} iter_args({mi} = {m}, "
                f"{li} = {lsum}, {ai} = {acc}) -> ({tt(row_t)}, {tt(row_t)}, {tt(acc_t)}) {{")
        em.depth += 1
        m2, l2, a2 = block(iv, bk, mi, li, ai, True)
        em.line(f"scf.yield {m2}, {l2}, {a2} : {tt(row_t)}, {tt(row_t)}, {tt(acc_t)}")
        em.depth -= 1
        em.line("}")
        m, lsum, acc = f"{loop}#0", f"{loop}#1", f"{loop}#2"
    if tail:
        off = em.const(n_full * bk, "index")
        m, lsum, acc = block(off, tail, m, lsum, acc, False)

    def finish(a, _o):
        den = a[1]
        if visible:
            den = em.op(f"arith.maximumf {den}, {em.const(1.0, 'f32')} : f32")
        return em.op(f"arith.divf {a[0]}, {den} : f32")

    out = em.generic(acc_t, [(acc, acc_t, identity_map(r)), (lsum, row_t, drop_last)], finish)
    if op.result.shape != acc_t.shape or op.result.dtype is not DType.F32:
        op.refuse(f"result type {op.result} is not {acc_t}")
    return out
