"""``poot-legalize``: rewrite arithmetic a target cannot compute into arithmetic it can.

Float compute in a dtype outside the target's compute set (bf16/f16 on most CPUs and on
Vulkan devices without 16-bit arithmetic) becomes f32 compute between casts: operands are
widened, the op runs in f32, and the result is narrowed back to its declared dtype, so storage
(and memory traffic) keeps the declared dtype. The dispatch-fusion pass later puts the casts
inside the consuming kernel, so no widened copy is stored.

Option ``compute``: comma-separated dtypes the target computes in (default the CPU set).

Option ``storage``: comma-separated dtypes the target stores (empty: not checked). A 16-bit
float dtype outside it, where f32 is inside, is *stored* as f32: every value of that dtype
(function arguments, op results, constants) becomes f32, so the graph computes and stores in
f32 and casts to the 16-bit dtype keep no rounding -- but a q8_0 KV cache's f16 scales planes,
part of that storage format, which keep their type (:func:`kv_scale_planes`); the rule is
:func:`poot.compiler.planning.storage_type`, which the executor also allocates weights by
(a bf16 checkpoint on a wgpu adapter is uploaded as f32).

Option ``layouts``: comma-separated row-interleaved packed formats the target stores (empty:
none; :mod:`poot.dialects.quant_layout`): a 2-D packed weight whose ggml format has its
layout there takes it (``q4_1`` -> ``q4_1_r16``, ``q8_0`` -> ``q8_0_r16``); the same bytes, repacked at load time, so
every op reading it reads the new type (the in-place decoders know both layouts).
"""

from __future__ import annotations

from poot.dialects.opdef import dense_from_mlir, dense_to_mlir
from poot.lazy import lazy_module
ir = lazy_module("mlir.ir")

from poot.dialects.quant import BY_NAME
from poot.dialects.quant_layout import stored_layout
from poot.dialects.types import DType, PackedType, TensorType, type_from_mlir
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


#: float dtypes stored as f32 on a target that cannot store them but stores f32
WIDENED = frozenset({DType.F16, DType.BF16})


def stored_type(t, storage, layouts=frozenset()):
    """The type a value of poot type ``t`` is stored in on a target that stores the dtypes
    ``storage`` and the row-interleaved packed formats ``layouts``: ``t`` itself, or for an
    f16/bf16 tensor the target cannot store while it stores f32, the same shape in f32, or
    for a 2-D packed weight whose format has a layout in ``layouts`` that layout
    (:func:`poot.dialects.quant_layout.stored_layout`). The one rule behind the ``storage``
    and ``layouts`` options and :func:`poot.compiler.planning.storage_type`; other types are
    kept."""
    if isinstance(t, TensorType) and t.dtype in WIDENED and t.dtype not in storage and \
            DType.F32 in storage:
        return t.with_dtype(DType.F32)
    if layouts and isinstance(t, PackedType):
        fmt = stored_layout(t.format, t.shape, layouts)
        if fmt is not None:
            return PackedType(fmt, t.shape)
    return t


def _dtypes(text: str, what: str) -> set[DType]:
    try:
        return {DType(x.strip()) for x in text.split(",") if x.strip()}
    except ValueError as e:
        raise PassFailure(f"poot-legalize: bad {what} dtype list '{text}': {e}") from None


#: ops that move a q8_0 scales plane without computing on it (:func:`kv_scale_planes`)
_PLANE_MOVES = ("poot.reshape", "poot.scatter", "poot.gather", "poot.slice")


def kv_scale_planes(module: ir.Operation) -> list:
    """The f16 values that are q8_0 KV scales planes (:mod:`poot.dialects.kv_quant`): the
    ``scales`` operands of ``poot.paged_attention`` / ``poot.dequantize_q8_0`` and every value
    they reach through data movement (reshape, scatter, gather, slice) back to the step's
    inputs and outputs and the ``poot.cast`` that rounds a new scale to f16. They are part of
    the q8_0 storage format, never widened: a target listing q8_0 in
    ``Capabilities.kv_formats`` reads and writes their f16 bits itself (wgpu: as 32-bit
    words), one that does not refuses q8_0 by planning."""
    seeds = []

    def visit(op):
        op = op.operation
        if op.name == "poot.paged_attention":
            seeds.extend(list(op.operands)[5:])
        elif op.name == "poot.dequantize_q8_0":
            seeds.append(op.operands[1])
        return ir.WalkResult.ADVANCE

    module.walk(visit)
    kept: list = []
    while seeds:
        v = seeds.pop()
        if v in kept or not isinstance(v.type, ir.RankedTensorType) or \
                not isinstance(v.type.element_type, ir.F16Type):
            continue
        kept.append(v)
        owner = v.owner
        if not isinstance(owner, ir.Block) and owner.operation.name in _PLANE_MOVES:
            seeds.extend(owner.operation.operands)
        for use in v.uses:
            user = use.owner
            if user.name in _PLANE_MOVES:
                seeds.extend(user.results)
    return kept


def widen_storage(module: ir.Operation, storage: set[DType],
                  layouts: frozenset[str] = frozenset()) -> int:
    """Store every f16/bf16 value the target cannot store as f32 (module doc), but q8_0 KV
    scales planes (:func:`kv_scale_planes`), and every packed weight with a layout in
    ``layouts`` in that layout; returns the number of values retyped."""
    if not layouts and \
            all(stored_type(TensorType((1,), d), storage).dtype == d for d in WIDENED):
        return 0                            # this target retypes nothing: no walk
    with module.context:
        kept = kv_scale_planes(module)

    def wide(t: ir.Type) -> ir.Type | None:
        try:
            pt = type_from_mlir(t)
        except TypeError:
            return None
        st = stored_type(pt, storage, layouts)
        return st.mlir() if st is not pt else None

    n = 0
    funcs: list[ir.Operation] = []

    def visit(op):
        nonlocal n
        op = op.operation
        if op.name == "func.func":
            funcs.append(op)
        if op.name == "poot.constant":
            t = wide(op.results[0].type)
            if t is not None:
                value = dense_from_mlir(op.attributes["value"]).astype("float32")
                op.attributes["value"] = dense_to_mlir(value)
        for r in op.results:
            t = None if r in kept else wide(r.type)
            if t is not None:
                r.set_type(t)
                n += 1
        for region in op.regions:
            for block in region.blocks:
                for a in block.arguments:
                    t = None if a in kept else wide(a.type)
                    if t is not None:
                        a.set_type(t)
                        n += 1
        return ir.WalkResult.ADVANCE

    with module.context, ir.Location.unknown():
        module.walk(visit)
        for f in funcs:
            ft = ir.FunctionType(ir.TypeAttr(f.attributes["function_type"]).value)
            ins, outs = [wide(t) or t for t in ft.inputs], [wide(t) or t for t in ft.results]
            if len(f.regions[0].blocks):
                # a body: the signature follows its arguments and returned values as
                # widened (a kept scales plane stays f16)
                block = f.regions[0].blocks[0]
                ins = [a.type for a in block.arguments]
                outs = [v.type for v in list(block.operations)[-1].operation.operands]
            f.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(ins, outs))
    return n


@register_pass("poot-legalize", "compute unsupported float dtypes in f32 between casts; "
               "store 16-bit floats a target cannot store in f32",
               {"compute": (str, "f32,i64,i32,i8,i1", "dtypes the target computes in"),
                "storage": (str, "", "dtypes the target stores (empty: unchecked)"),
                "layouts": (str, "", "row-interleaved packed formats the target stores")})
def run(module: ir.Operation, compute: str = "f32,i64,i32,i8,i1", storage: str = "",
        layouts: str = "") -> None:
    allowed = _dtypes(compute, "compute")
    names = frozenset(x.strip() for x in layouts.split(",") if x.strip())
    for name in names:
        if name not in BY_NAME or BY_NAME[name].rows == 1:
            raise PassFailure(f"poot-legalize: '{name}' is not a row-interleaved packed format")
    if storage or names:
        widen_storage(module, _dtypes(storage, "storage") if storage else set(DType), names)
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
