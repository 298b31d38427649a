"""Strategy ``indexed_gemv``: a region rooted at ``poot.indexed_matmul`` (a MoE layer's
selected experts, :func:`poot.graph.ops.moe`'s sparse spelling) as ONE kernel that reads
only the selected slabs of the weight. The decode GEMV (:func:`.matmul.match_indexed`) takes
such regions first, streaming each row's slab with its unit decoders and wide loads; this
strategy takes what it refuses: packed formats it has no unit decoder for (Q5_0, Q5_1,
Q5_K: the scalar emitter decodes every format), an x with a folded norm.

Region::

    x   = expr(args)                       # [T, K], elementwise class (the token rows)
    w   = arg [E, O, K] | cast(arg) | dequantize(arg packed)
    y   = indexed_matmul(x, w, idx)        # [T, O]
    out = epilogue(y, args...)             # elementwise on the T * O elements

Mapping: one subgroup per output element ``(t, o)`` (grid ``(ceil(O / WARPS), T)``,
:data:`WARPS` subgroups a block): the subgroup clamps ``idx[t]`` to the E slabs, its lanes
walk k with the subgroup's stride (neighbouring lanes read neighbouring elements of the
slab's row ``o``: coalesced; :data:`UNROLL` independent sums a lane), a ``gpu.shuffle xor``
butterfly sums them, and lane 0 applies
the epilogue at ``(t, o)`` (:mod:`.emit` computes every other value per element: a
packed weight's element decoded from its block). The generic linalg mapping this replaces
ran one thread per output element, each reading a whole row alone.

Refused (None): a region with another anchor or a reduction, an epilogue that reorders y
(checked at sample coordinates, as the GEMV checks its epilogue), targets without a known
subgroup size.
"""

from __future__ import annotations

from mlir import ir

from poot.backends.gpu.kernels import Launch
from poot.backends.gpu.strategies.emit import (
    KernelEmitter,
    ScalarEmitter,
    ScalarUnsupported,
    Synthesized,
    buffer_type,
    one_kernel_module,
    poot_type,
)
from poot.backends.gpu.strategies.pointwise import body_ops, per_element, results
from poot.dialects.types import TensorType

#: subgroups (one output element each) per block
WARPS = 8
#: k elements a lane has in flight per step (independent accumulators), when K allows
UNROLL = 4


def _match(fn: ir.Operation):
    """(the indexed_matmul op, its result, the region's outputs and their types), or None."""
    ops = body_ops(fn)
    mms = [o for o in ops if o.name == "poot.indexed_matmul"]
    if len(mms) != 1 or not all(o is mms[0] or per_element(o) for o in ops):
        return None
    mm = mms[0]
    T, O = poot_type(mm.results[0]).shape
    outs = results(fn)
    types = [poot_type(v) for v in outs]
    if not outs or any(not isinstance(t, TensorType) or t.numel != T * O for t in types):
        return None
    # the epilogue reads y at its own element only (sample coordinates fold to integers)
    for t in sorted({0, T // 2, T - 1}):
        for o in sorted({0, 1 % O, O // 2, O - 1}):
            def provide(v, idx, want=(t, o)):
                if v == mm.results[0]:
                    if tuple(idx) != want:
                        raise ScalarUnsupported("the epilogue reorders the indexed matmul")
                    return "%acc"
                return None
            se = ScalarEmitter(fn, KernelEmitter(), provide=provide)
            try:
                for v, ty in zip(outs, types):
                    se.value(v, se.delinearize(t * O + o, ty.shape))
            except ScalarUnsupported:
                return None
    return mm, outs, types


def indexed_gemv(fn: ir.Operation, caps) -> Synthesized | None:
    """Indexed-matmul regions (see the module doc); None for anything else."""
    sg = getattr(caps, "subgroup_size", None)
    if not sg or not any(o.name == "poot.indexed_matmul" for o in body_ops(fn)):
        return None
    m = _match(fn)
    if m is None:
        return None
    mm, outs, types = m
    x_v, w_v, i_v = mm.operands
    T, K = poot_type(x_v).shape
    E, O, _ = poot_type(w_v).shape
    it = poot_type(i_v)
    root = mm.results[0]

    em = KernelEmitter()
    se = ScalarEmitter(fn, em, provide=lambda v, idx: "%acc" if v == root else None)
    out_names = [f"%out{j}" for j in range(len(outs))]
    em.line("%tid = gpu.thread_id x")
    em.line("%bx = gpu.block_id x")
    em.line("%t = gpu.block_id y")
    try:
        warp = se.idiv("%tid", sg)
        lane = se.irem("%tid", sg)
        o = se.iadd(se.imul("%bx", WARPS), warp)
        inb = se.op(f"arith.cmpi ult, {o}, {se.ix(O)} : index")
        em.line(f"scf.if {inb} {{")
        em.depth += 1
        raw = se.value(i_v, ["%t"])
        i64 = raw if it.dtype.value == "i64" else em.op(f"arith.extsi {raw} : "
                                                        f"{it.dtype.value} to i64")
        lo = em.op(f"arith.maxsi {i64}, {em.const(0, 'i64')} : i64")
        hi = em.op(f"arith.minsi {lo}, {em.const(E - 1, 'i64')} : i64")
        e = em.op(f"arith.index_cast {hi} : i64 to index")
        u = UNROLL if K % (UNROLL * sg) == 0 else 1
        k, part = em.fresh("k"), em.fresh("part")
        accs = [em.fresh("a") for _ in range(u)]
        zero = em.const(0.0, "f32")
        em.line(f"{part}:{u} = scf.for {k} = {lane} to {se.ix(K)} step {se.ix(u * sg)} "
                f"iter_args({', '.join(f'{a} = {zero}' for a in accs)}) -> "
                f"({', '.join(['f32'] * u)}) {{")
        em.depth += 1
        with se.scope():
            sums = []
            for j, a in enumerate(accs):        # u independent chains: loads in flight
                kj = se.iadd(k, j * sg)
                xv = se.value(x_v, ["%t", kj])
                wv = se.value(w_v, [e, o, kj])
                sums.append(em.op(f"math.fma {xv}, {wv}, {a} : f32"))
            em.line(f"scf.yield {', '.join(sums)} : {', '.join(['f32'] * u)}")
        em.depth -= 1
        em.line("}")
        total = f"{part}#0"
        for j in range(1, u):
            total = em.op(f"arith.addf {total}, {part}#{j} : f32")
        off = 1
        while off < sg:
            sh = em.fresh("sh")
            em.line(f"{sh}, {sh}_ok = gpu.shuffle xor {total}, {em.const(off, 'i32')}, "
                    f"{em.const(sg, 'i32')} : f32")
            total = em.op(f"arith.addf {total}, {sh} : f32")
            off *= 2
        em.line(f"%acc = arith.addf {total}, {em.const(0.0, 'f32')} : f32")
        first = se.op(f"arith.cmpi eq, {se.ix(lane)}, {se.ix(0)} : index")
        em.line(f"scf.if {first} {{")
        em.depth += 1
        with se.scope():
            lin = se.iadd(se.imul("%t", O), o)
            for v, ty, name in zip(outs, types, out_names):
                idx = se.delinearize(lin, ty.shape)
                se.store(se.value(v, idx), name, ty, idx)
        em.depth -= 1
        em.line("}")
        em.depth -= 1
        em.line("}")
    except ScalarUnsupported:
        return None
    text, slots = one_kernel_module("indexed_gemv", se, [(n, buffer_type(ty)) for n, ty
                                                         in zip(out_names, types)])
    launch = Launch("kernel", slots, "indexed_gemv", "k", (-(-O // WARPS), T, 1),
                    (WARPS * sg, 1, 1), strategy="indexed_gemv")
    return Synthesized(text, [launch], consts=list(se.consts))


__all__ = ["UNROLL", "WARPS", "indexed_gemv"]
