"""Lowering of ``poot.matmul`` to ``linalg.matmul`` / ``linalg.batch_matmul``.

The accumulator has the ``acc`` type (f32, or i32 for i8 operands): linalg's named ops widen
the operands to the accumulator's element type in their body (``extf`` / ``extsi``). Batch
dims are collapsed into one for ``batch_matmul`` and expanded back. A result dtype other than
the accumulator's is rounded from it in a following ``linalg.generic``.
"""

from __future__ import annotations

from poot.dialects.lowering import gemv
from poot.dialects.lowering.emit import Emitter, tt
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
    kernel = gemv.match(op)
    if kernel is not None:  # a weight read in place by the row-streaming kernel
        r = gemv.emit(em, kernel, op.strategy)
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
