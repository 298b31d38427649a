"""``poot-legalize``: rewrite arithmetic a target cannot compute into arithmetic it can.

Float compute in a dtype outside the target's compute set (bf16/f16 on most CPUs and on
Vulkan devices without 16-bit arithmetic) becomes f32 compute between casts: operands are
widened, the op runs in f32, and the result is narrowed back to its declared dtype, so storage
(and memory traffic) keeps the declared dtype. The dispatch-fusion pass later puts the casts
inside the consuming kernel, so no widened copy is stored.

Option ``compute``: comma-separated dtypes the target computes in (default the CPU set).
"""

from __future__ import annotations

from poot.lazy import lazy_module
ir = lazy_module("mlir.ir")

from poot.dialects.types import DType, TensorType, type_from_mlir
from poot.passes.registry import PassFailure, register_pass

# Ops that compute on their operands' element type (views and data movement only copy).
COMPUTE_OPS = ("poot.unary", "poot.binary", "poot.ternary", "poot.compare", "poot.reduce",
               "poot.matmul")


def _cast(value: ir.Value, t: TensorType) -> ir.Value:
    return ir.Operation.create("poot.cast", results=[t.mlir()], operands=[value]).result


def _widen(op: ir.Operation) -> None:
    f32 = DType.F32
    rtype = type_from_mlir(op.results[0].type)
    args = [_cast(v, type_from_mlir(v.type).with_dtype(f32)) for v in op.operands]
    wide_r = rtype if rtype.dtype in (DType.I1, f32) else rtype.with_dtype(f32)
    attrs = {op.attributes[i].name: op.attributes[i].attr for i in range(len(op.attributes))}
    new = ir.Operation.create(op.name, results=[wide_r.mlir()], operands=args,
                              attributes=attrs, loc=op.location)
    out = new.result if wide_r == rtype else _cast(new.result, rtype)
    op.results[0].replace_all_uses_with(out)


@register_pass("poot-legalize", "compute unsupported float dtypes in f32 between casts",
               {"compute": (str, "f32,i64,i32,i8,i1", "dtypes the target computes in")})
def run(module: ir.Operation, compute: str = "f32,i64,i32,i8,i1") -> None:
    try:
        allowed = {DType(x.strip()) for x in compute.split(",") if x.strip()}
    except ValueError as e:
        raise PassFailure(f"poot-legalize: bad compute dtype list '{compute}': {e}") from None
    todo: list[ir.Operation] = []

    def visit(op):
        op = op.operation
        if op.name in COMPUTE_OPS and op.operands:
            t = type_from_mlir(op.operands[0].type)
            if isinstance(t, TensorType) and t.dtype.is_float and t.dtype not in allowed:
                todo.append(op)
        return ir.WalkResult.ADVANCE

    module.walk(visit)
    if todo and DType.F32 not in allowed:
        raise PassFailure(f"poot-legalize: '{todo[0].name}' computes in "
                          f"{type_from_mlir(todo[0].operands[0].type).dtype} and the target "
                          "has no f32 compute to widen to")
    for op in todo:
        with ir.InsertionPoint(op), op.location:
            _widen(op)
        op.erase()
