"""Strategy ``pointwise``: a region of elementwise-class ops becomes ONE kernel.

Elementwise class: views (reshape, transpose, broadcast, strided slice, concat), sources
(iota, constant), unary/binary/ternary/compare/select/cast, gather and dequantize: every
result element is a function of a few operand elements at computable coordinates
(:mod:`poot.backends.gpu.strategies.emit`), so nothing is materialized in between. Small
contractions (:func:`~.emit.small_contraction`: a matmul over at most
:data:`~.emit.SCALAR_MAX_K` terms, a LoRA expand) are computed per element too
(:func:`per_element`), so the LoRA terms of the SwiGLU's gate and up are one kernel with it;
so are small reductions (:func:`~.emit.small_reduction`: at most
:data:`~.emit.SCALAR_MAX_REDUCE` terms a result element, a MoE layer's weighted sum over
its top-k experts' rows with the residual add).

Mapping: one thread per *work item* of the largest result. A work item is ``vec`` consecutive
elements along the innermost dimension (``vec`` = 4 when the result is large and its innermost
dimension divides by 4, else 1: the row-dependent part of the computation, e.g. a broadcast
scale, is then computed once for four elements). Results are grouped by shape; each group is
evaluated under its own bounds guard at its own coordinates, so a region with results of
different shapes (the RoPE cos/sin tables: ``[1,1,H,D]`` and ``[1,1,KVH,D]``) is still one
launch, and results of one shape share their common subexpressions.

Regions with a larger reduction, a larger matmul, attention or scatter are refused
(``None``).
"""

from __future__ import annotations

from mlir import ir

from poot.backends.gpu.kernels import Launch, block_size
from poot.backends.gpu.strategies.emit import (
    KernelEmitter,
    ScalarEmitter,
    ScalarUnsupported,
    Synthesized,
    buffer_type,
    one_kernel_module,
    poot_type,
    small_contraction,
    small_reduction,
)
from poot.dialects.types import TensorType

#: ops whose elements the scalar emitter computes (views, sources, elementwise, indexing)
ELEMENTWISE_CLASS = frozenset(
    f"poot.{n}" for n in ("reshape", "transpose", "broadcast", "slice", "concat", "iota",
                          "constant", "unary", "binary", "ternary", "compare", "select",
                          "cast", "gather", "dequantize", "quantize_fp8"))

def per_element(op: ir.Operation) -> bool:
    """Whether the scalar emitter computes ``op``'s elements one at a time: the elementwise
    class, a small contraction or a small reduction."""
    return op.name in ELEMENTWISE_CLASS or small_contraction(op) or small_reduction(op)


#: elements per thread for large results (innermost dim divisible by it)
VEC = 4
#: a result at least this large is written VEC elements per thread
VEC_MIN = 1 << 14


def body_ops(fn: ir.Operation) -> list[ir.Operation]:
    """The ops of a dispatch function's body, without its ``func.return``."""
    return [o.operation for o in fn.regions[0].blocks[0].operations
            if o.operation.name != "func.return"]


def results(fn: ir.Operation) -> list[ir.Value]:
    """The values a dispatch function returns (its ``("out", j)`` slots, in order)."""
    ret = list(fn.regions[0].blocks[0].operations)[-1].operation
    return list(ret.operands)


def work_items(t: TensorType, vec: int) -> int:
    return t.numel // vec


def vec_for(t: TensorType, contracts: bool = False) -> int:
    """Elements a work item: :data:`VEC` for a large result whose innermost dimension divides
    by it, else 1; 1 as well when the region holds a small contraction (``contracts``): each
    element then costs K terms of its own, nothing is shared between neighbours, and four
    elements a thread would run four contractions one after another in a quarter of the
    threads (the 1B shape's batch-32 SwiGLU with its LoRA expands: 128 weight loads a
    thread)."""
    if contracts:
        return 1
    return VEC if t.numel >= VEC_MIN and t.shape and t.shape[-1] % VEC == 0 else 1


def synthesize_pointwise(fn: ir.Operation, caps, name: str = "pointwise"):
    """The one-kernel form of an elementwise-class region, or None (see the module doc)."""
    if not all(per_element(o) for o in body_ops(fn)):
        return None
    outs = results(fn)
    if not outs:
        return None
    types = [poot_type(v) for v in outs]
    if any(not isinstance(t, TensorType) for t in types):
        return None
    big = max(types, key=lambda t: t.numel)
    vec = vec_for(big, any(small_contraction(o) for o in body_ops(fn)))
    n = work_items(big, vec)
    if n == 0:
        return None
    em = KernelEmitter()
    se = ScalarEmitter(fn, em)
    out_names = [f"%out{j}" for j in range(len(outs))]
    em.line("%tid = gpu.thread_id x")
    em.line("%bid = gpu.block_id x")
    t = block_size(n, caps)
    groups: dict[tuple, list[int]] = {}
    for j, ty in enumerate(types):
        groups.setdefault(ty.shape, []).append(j)
    try:
        lin = se.iadd(se.imul("%bid", t), "%tid")
        for shape, js in groups.items():
            ty = types[js[0]]
            v = vec if shape == big.shape else 1
            items = ty.numel // v
            if items == 0:
                continue
            guard = se.op(f"arith.cmpi ult, {se.ix(lin)}, {se.ix(items)} : index")
            em.line(f"scf.if {guard} {{")
            em.depth += 1
            with se.scope():
                base = se.delinearize(lin, shape[:-1] + (shape[-1] // v,)) if shape else []
                for u in range(v):
                    idx = list(base)
                    if shape:
                        idx[-1] = se.iadd(se.imul(base[-1], v), u)
                    for j in js:
                        x = se.value(outs[j], idx)
                        se.store(x, out_names[j], types[j], idx)
            em.depth -= 1
            em.line("}")
    except ScalarUnsupported:
        return None
    text, slots = one_kernel_module(name, se, [(o, buffer_type(ty))
                                               for o, ty in zip(out_names, types)])
    grid = (n + t - 1) // t
    launch = Launch("kernel", slots, name, "k", (grid, 1, 1), (t, 1, 1), strategy=name)
    return Synthesized(text, [launch], consts=list(se.consts))


def pointwise(fn: ir.Operation, caps):
    return synthesize_pointwise(fn, caps)


__all__ = ["ELEMENTWISE_CLASS", "body_ops", "per_element", "results", "synthesize_pointwise"]
