"""Lowering of the sources: constants and iota. (``poot.param``/``poot.packed_param`` become
function arguments; :func:`poot.dialects.lowering.function.lower_function` does that.)"""

from __future__ import annotations

import numpy as np

from poot.dialects.lowering.emit import Emitter
from poot.dialects.lowering.elementwise import convert_scalar
from poot.dialects.lowering.rules import OpInfo, rule
from poot.dialects.opdef import dense_to_mlir
from poot.dialects.types import DType


@rule("constant")
def lower_constant(em: Emitter, op: OpInfo) -> str:
    value = op.attrs["value"]
    if value.dtype == np.bool_:  # stored as i8 0/1 (emit.storage)
        value = value.astype(np.int8)
    return em.op(f"arith.constant {dense_to_mlir(value)}", "cst")


@rule("iota")
def lower_iota(em: Emitter, op: OpInfo) -> str:
    axis, dt = op.attrs["axis"], op.result.dtype

    def body(_args, _out):
        i = em.op(f"linalg.index {axis} : index")
        i64 = em.op(f"arith.index_cast {i} : index to i64")
        return convert_scalar(em, i64, DType.I64, dt)

    return em.generic(op.result, [], body)
