"""Lowering of ``poot.matmul`` to ``linalg.matmul`` / ``linalg.batch_matmul``, and of
``poot.indexed_matmul`` (see :func:`lower_indexed_matmul`).

The accumulator has the ``acc`` type (f32, or i32 for i8 operands): linalg's named ops widen
the operands to the accumulator's element type in their body (``extf`` / ``extsi``). Batch
dims are collapsed into one for ``batch_matmul`` and expanded back. A result dtype other than
the accumulator's is rounded from it in a following ``linalg.generic``.
"""

from __future__ import annotations

from poot.dialects.lowering.emit import HALF, Emitter, affine_map, tt
from poot.dialects.lowering.packed import decode_at
from poot.dialects.lowering.rules import OpInfo, rule
from poot.dialects.lowering.elementwise import convert_scalar
from poot.dialects.lowering.views import reshape_value
from poot.dialects.types import DType, TensorType


@rule("matmul")
def lower_matmul(em: Emitter, op: OpInfo) -> str:
    a, b = op.args
    at, bt = op.types
    acc = op.attrs["acc"]
    out = op.result
    batch = at.shape[:-2]
    nb = 1
    for d in batch:
        nb *= d
    m, k, n = at.shape[-2], at.shape[-1], bt.shape[-1]
    if batch:
        at3, bt3 = TensorType((nb, m, k), at.dtype), TensorType((nb, k, n), bt.dtype)
        a, b = reshape_value(em, a, at, at3), reshape_value(em, b, bt, bt3)
        acc_t = TensorType((nb, m, n), acc)
        at, bt, name = at3, bt3, "linalg.batch_matmul"
    else:
        acc_t, name = TensorType((m, n), acc), "linalg.matmul"
    kernels = op.strategy.kernels if op.strategy is not None else None
    r = kernels.matmul(em, op) if kernels is not None else None
    if r is not None:  # a weight read in place by the target's own kernel
        return _finish(em, op, r, acc_t)
    zero = em.const(0.0 if acc is DType.F32 else 0, acc.value)
    init = em.op(f"linalg.fill ins({zero} : {acc.value}) outs({em.empty(acc_t)} : {tt(acc_t)})"
                 f" -> {tt(acc_t)}", "acc")
    r = em.op(f"{name} ins({a}, {b} : {tt(at)}, {tt(bt)}) outs({init} : {tt(acc_t)}) -> "
              f"{tt(acc_t)}", "mm")
    return _finish(em, op, r, acc_t)


def _finish(em: Emitter, op: OpInfo, r: str, acc_t: TensorType) -> str:
    """The accumulator rounded to the result dtype and reshaped to the result's shape."""
    acc, out = op.attrs["acc"], op.result
    if out.dtype is not acc:
        cast_t = acc_t.with_dtype(out.dtype)
        r = em.pointwise(cast_t, [(r, acc_t)],
                         lambda x: convert_scalar(em, x[0], acc, out.dtype))
        acc_t = cast_t
    return reshape_value(em, r, acc_t, out)


def _slab_source(op: OpInfo) -> tuple[str, object, OpInfo | None] | None:
    """(ssa, type, producer) of the weight behind ``indexed_matmul``'s w when it can be read
    in place: a dense f32/f16/bf16 weight, a dequantize of a packed weight (any format with
    an in-kernel decoder) or a widening cast of a half weight; None otherwise."""
    src, wt = op.producer(1), op.types[1]
    if src is None:
        return (op.args[1], wt, None) if wt.dtype is DType.F32 or wt.dtype in HALF else None
    if src.producer(0) is not None:
        return None
    if src.name == "dequantize" and src.result.dtype is DType.F32:
        return src.args[0], src.types[0], src
    if src.name == "cast" and src.result.dtype is DType.F32 and src.types[0].dtype in HALF:
        return src.args[0], src.types[0], src
    return None


def clamped_index(em: Emitter, v: str, dtype: DType, n: int) -> str:
    """An integer scalar of ``dtype`` clamped to ``[0, n-1]``, as an index."""
    i = v if dtype.value == "i64" else em.op(f"arith.extsi {v} : {dtype.value} to i64")
    i = em.op(f"arith.maxsi {i}, {em.const(0, 'i64')} : i64")
    i = em.op(f"arith.minsi {i}, {em.const(n - 1, 'i64')} : i64")
    return em.op(f"arith.index_cast {i} : i64 to index")


@rule("indexed_matmul")
def lower_indexed_matmul(em: Emitter, op: OpInfo) -> str:
    """Row t of x against slab ``idx[t]`` of w: the target's own kernel when its strategy has
    one that takes a weight read in place (the CPU's: a loop over the T rows, each running
    the row-streaming GEMV over its slab's rows, so only the selected slabs are read).
    Otherwise one ``linalg.generic`` over ``(t, o, k)`` whose body reads ``w[idx[t], o, k]``
    (decoded in place from the packed bytes behind a dequantize, :func:`~.packed.decode_at`)."""
    x, _w, idx = op.args
    xt, wt, it = op.types
    E = wt.shape[0]
    out = op.result
    src = _slab_source(op)
    kernels = op.strategy.kernels if op.strategy is not None else None
    r = kernels.indexed_matmul(em, op, src) if kernels is not None and src else None
    if r is not None:   # the selected slabs read in place by the target's own kernel
        return r
    zero = em.const(0.0, "f32")
    init = em.op(f"linalg.fill ins({zero} : f32) outs({em.empty(out)} : {tt(out)}) -> "
                 f"{tt(out)}", "acc")
    deq = src[2] if src is not None and src[2] is not None and \
        src[2].name == "dequantize" else None

    def body(a, acc):
        xv = em.ext(a[0], xt.dtype)
        e = clamped_index(em, a[1], it.dtype, E)
        o = em.op("linalg.index 1 : index")
        k = em.op("linalg.index 2 : index")
        if deq is not None:
            wv = decode_at(em, deq, [e, o, k])
        else:
            wv = em.op(f"tensor.extract {_w}[{e}, {o}, {k}] : {tt(wt)}")
            wv = em.ext(wv, wt.dtype)
        return em.op(f"arith.addf {acc}, {em.op(f'arith.mulf {xv}, {wv} : f32')} : f32")

    return em.generic(out, [(x, xt, affine_map(3, ["d0", "d2"])),
                            (idx, it, affine_map(3, ["d0"]))], body,
                      iterators=["parallel", "parallel", "reduction"],
                      out_map=affine_map(3, ["d0", "d1"]), init=init, loop_rank=3,
                      reads_out=True)
