"""Lowering of ``poot.matmul`` to ``linalg.matmul`` / ``linalg.batch_matmul``, and of
``poot.indexed_matmul`` (see :func:`lower_indexed_matmul`).

The accumulator has the ``acc`` type (f32, or i32 for i8 operands): linalg's named ops widen
the operands to the accumulator's element type in their body (``extf`` / ``extsi``). Batch
dims are collapsed into one for ``batch_matmul`` and expanded back. A result dtype other than
the accumulator's is rounded from it in a following ``linalg.generic``.
"""

from __future__ import annotations

from poot.dialects.lowering import gemv
from poot.dialects.lowering.emit import HALF, Emitter, affine_map, tt
from poot.dialects.lowering.packed import decode_at
from poot.dialects.lowering.rules import OpInfo, rule
from poot.dialects.lowering.elementwise import convert_scalar
from poot.dialects.lowering.views import reshape_value
from poot.dialects.types import DType, PackedType, TensorType


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


def _clamped_index(em: Emitter, v: str, dtype: DType, n: int) -> str:
    """An integer scalar of ``dtype`` clamped to ``[0, n-1]``, as an index."""
    i = v if dtype.value == "i64" else em.op(f"arith.extsi {v} : {dtype.value} to i64")
    i = em.op(f"arith.maxsi {i}, {em.const(0, 'i64')} : i64")
    i = em.op(f"arith.minsi {i}, {em.const(n - 1, 'i64')} : i64")
    return em.op(f"arith.index_cast {i} : i64 to index")


@rule("indexed_matmul")
def lower_indexed_matmul(em: Emitter, op: OpInfo) -> str:
    """Row t of x against slab ``idx[t]`` of w. With the target's GEMV strategy and a weight
    read in place (dense, or Q4_0/Q4_1/Q8_0 blocks): a loop over the T rows, each running the
    row-streaming kernel (:mod:`.gemv`) over its slab's O rows at the slab's offset, so only
    the selected slabs are read. Otherwise one ``linalg.generic`` over ``(t, o, k)`` whose
    body reads ``w[idx[t], o, k]`` (decoded in place from the packed bytes behind a
    dequantize, :func:`~.packed.decode_at`)."""
    x, _w, idx = op.args
    xt, wt, it = op.types
    T, K = xt.shape
    E, O, _ = wt.shape
    out = op.result
    src = _slab_source(op)
    s = op.strategy
    packed_ok = src is not None and (not isinstance(src[1], PackedType)
                                      or src[1].format.name in gemv.PACKED)
    if s is not None and s.gemv and packed_ok and xt.dtype is DType.F32 and T and O and K:
        return _indexed_gemv(em, op, src)
    zero = em.const(0.0, "f32")
    init = em.op(f"linalg.fill ins({zero} : f32) outs({em.empty(out)} : {tt(out)}) -> "
                 f"{tt(out)}", "acc")
    deq = src[2] if src is not None and src[2] is not None and \
        src[2].name == "dequantize" else None

    def body(a, acc):
        xv = em.ext(a[0], xt.dtype)
        e = _clamped_index(em, a[1], it.dtype, E)
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


def _indexed_gemv(em: Emitter, op: OpInfo, src) -> str:
    x, _w, idx = op.args
    xt, wt, it = op.types
    T, K = xt.shape
    E, O, _ = wt.shape
    w, wtype, _ = src
    if isinstance(wtype, TensorType):           # dense [E, O, K] -> [E * O, K] rows
        flat = TensorType((E * O, K), wtype.dtype)
        w = em.op(f"tensor.collapse_shape {w} [[0, 1], [2]] : {tt(wtype)} into {tt(flat)}")
        wtype = flat
    out_t = tt(op.result)
    init = em.empty(op.result)
    t, res, acc = em.fresh("t"), em.fresh("im"), em.fresh("acc")
    c0, c1, cT = (em.const(v, "index") for v in (0, 1, T))
    em.line(f"{res} = scf.for {t} = {c0} to {cT} step {c1} iter_args({acc} = {init}) -> "
            f"({out_t}) {{")
    em.depth += 1
    raw = em.op(f"tensor.extract {idx}[{t}] : {tt(it)}")
    e = _clamped_index(em, raw, it.dtype, E)
    base = em.op(f"arith.muli {e}, {em.const(O, 'index')} : index")
    row_t = f"tensor<1x{K}xf32>"
    xr = em.op(f"tensor.extract_slice {x}[{t}, 0] [1, {K}] [1, 1] : {tt(xt)} to {row_t}")
    g = gemv.Gemv(xr, w, wtype, 1, K, O, row_base=base, total_rows=E * O)
    y = gemv.emit(em, g, op.strategy)
    nxt = em.op(f"tensor.insert_slice {y} into {acc}[{t}, 0] [1, {O}] [1, 1] : "
                f"tensor<1x{O}xf32> into {out_t}")
    em.line(f"scf.yield {nxt} : {out_t}")
    em.depth -= 1
    em.line("}")
    return res
