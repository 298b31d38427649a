"""SPIR-V code generation for Vulkan: a fused poot step -> :class:`VulkanArtifact`.

    program = compile_vulkan(graph, vulkan_target(device.capabilities()))
    artifact = program.executable            # SPIR-V per kernel + the plan (JSON-able)
    artifact.save(directory)                 # read back by the runtime without MLIR

Kernel source: the SHARED gpu-dialect kernel generator (:func:`poot.backends.gpu.kernels.
build_dispatch`, also used by CUDA) turns each dispatch function (``poot-fuse-dispatch``'s
``@<fn>_dispatch_N`` lowered to linalg by ``lower_function``) into outlined ``gpu.module``s plus
a launch list. This module only lowers those gpu.modules to SPIR-V and assembles the step plan:

* SPIR-V constraints: structured control flow (``scf`` is converted by ``convert-gpu-to-spirv``
  straight to ``spirv.mlir.loop``/``selection``, never through ``cf``); serial ``scf.parallel``
  left inside a thread become nested ``scf.for`` (``scf-parallel-for-to-nested-fors``); no
  private arrays (every temporary is a scratch storage buffer, hoisted by the generator);
  index math is 32-bit (``use-64bit-index=false``); i64 arithmetic needs ``Int64`` (the
  device's ``shaderInt64``: without it the compile is refused); 8/16-bit storage types are
  used natively only when the device reports the storage features, else emulated on 32-bit
  words; compute stays f32 (the target's compute dtypes make ``poot-legalize`` widen f16/bf16).
* constant tables of a region (e.g. RoPE frequencies) are const buffers of the plan, filled
  once at load (the shared generator hoists them).
* ABI: kernel argument i is storage buffer (set 0, binding i); every kernel gets one more
  argument, the *error word* (``memref<2xi32>``, binding = number of arguments): kernel checks
  store a nonzero code in word 0 and the kernel index + 1 in word 1. The check emitted
  today: a gather whose data-dependent index is clamped (``minsi(maxsi(x, lo), hi)`` feeding a
  load) reports ``x`` out of range (code :data:`ERR_GATHER_INDEX`).
* workgroup size: chosen by the shared generator from the target's subgroup size (a multiple of
  it, never an assumed 32); written into the SPIR-V entry point.

Each kernel's SPIR-V is validated with ``spirv-val --target-env vulkan1.1`` when the tool is on
PATH (``validate=True``).
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import tempfile
from dataclasses import replace
from types import SimpleNamespace

from mlir import ir
from mlir.dialects import arith, memref, scf
from mlir.passmanager import PassManager

from poot.backends.gpu.plan import plan_program
from poot.backends.vulkan.artifact import (ERR_GATHER_INDEX, BufferSpec, Step,
                                           VulkanArtifact, VulkanKernel)
from poot.compiler import CompileOptions
from poot.compiler import compile as compile_graph
from poot.dialects.types import type_from_mlir
from poot.errors import PootError
from poot.progress import Tracker

from poot.backends.vulkan.target import DEFAULT_FEATURES, vulkan_target  # noqa: E402


class SpirvCodegenError(PootError):
    """A kernel the SPIR-V lowering or the validator rejected."""


def _spirv_caps(features) -> tuple[str, str]:
    caps = ["Shader"]
    exts = ["SPV_KHR_storage_buffer_storage_class"]
    f = set(features)
    if "shaderInt64" in f:
        caps.append("Int64")
    if "shaderInt16" in f:
        caps.append("Int16")
    if "shaderInt8" in f:
        caps.append("Int8")
    if "shaderFloat16" in f:
        caps.append("Float16")
    if "storageBuffer16BitAccess" in f:
        caps.append("StorageBuffer16BitAccess")
        exts.append("SPV_KHR_16bit_storage")
    if "storageBuffer8BitAccess" in f:
        caps.append("StorageBuffer8BitAccess")
        exts.append("SPV_KHR_8bit_storage")
    for feat, cap in (("subgroupBasic", "GroupNonUniform"),
                      ("subgroupShuffle", "GroupNonUniformShuffle"),
                      ("subgroupArithmetic", "GroupNonUniformArithmetic")):
        if feat in f:
            caps.append(cap)
    return ", ".join(caps), ", ".join(exts)


def target_env(caps) -> str:
    """The ``#spirv.target_env`` of a target: SPIR-V 1.3 for Vulkan, the capabilities its
    device features allow, and its resource limits (the device's subgroup size: shuffles are
    only legal at that width; shared memory; workgroup invocations)."""
    spv_caps, exts = _spirv_caps(caps.features or DEFAULT_FEATURES)
    limits = [f"max_compute_shared_memory_size = {int(caps.max_shared_bytes or 16384)}"]
    if caps.subgroup_size:
        limits.append(f"subgroup_size = {int(caps.subgroup_size)}")
    return (f"#spirv.target_env<#spirv.vce<v1.3, [{spv_caps}], [{exts}]>, api=Vulkan, "
            f"#spirv.resource_limits<{', '.join(limits)}>>")


# ---- one dispatch ----------------------------------------------------------------------------

def _is_const(v: ir.Value) -> bool:
    o = v.owner
    return not isinstance(o, ir.Block) and o.operation.name == "arith.constant"


def _add_error_word(gfunc: ir.Operation, ordinal: int) -> int:
    """Append the error-word argument to a ``gpu.func`` and emit its checks; returns the
    number of checks emitted."""
    i32 = ir.IntegerType.get_signless(32)
    err_t = ir.MemRefType.get([2], i32)
    block = gfunc.regions[0].blocks[0]
    ft = ir.FunctionType(ir.TypeAttr(gfunc.attributes["function_type"]).value)
    # workgroup attributions (block arguments after the function's own, which
    # convert-gpu-to-spirv does not accept) become workgroup-space memref.allocs, which it
    # lowers to Workgroup variables
    n_in = len(ft.inputs)
    n_wg = ir.IntegerAttr(gfunc.attributes["workgroup_attributions"]).value \
        if "workgroup_attributions" in gfunc.attributes else 0
    for _ in range(n_wg):
        old = block.arguments[n_in]
        t = ir.MemRefType(old.type)
        wg = ir.MemRefType.get(t.shape, t.element_type,
                               memory_space=ir.Attribute.parse("#spirv.storage_class<Workgroup>"))
        with ir.InsertionPoint.at_block_begin(block), gfunc.location:
            old.replace_all_uses_with(memref.AllocOp(wg, [], []).result)
        block.erase_argument(n_in)
    if n_wg:
        del gfunc.attributes["workgroup_attributions"]
    err = block.add_argument(err_t, gfunc.location)
    gfunc.attributes["function_type"] = ir.TypeAttr.get(
        ir.FunctionType.get(list(ft.inputs) + [err_t], list(ft.results)))
    if "arg_attrs" in gfunc.attributes:
        old = list(ir.ArrayAttr(gfunc.attributes["arg_attrs"]))
        gfunc.attributes["arg_attrs"] = ir.ArrayAttr.get(old + [ir.DictAttr.get({})])
    clamps = []

    def visit(op):
        op = op.operation
        if op.name == "arith.minsi" and _is_const(op.operands[1]):
            inner = op.operands[0].owner
            if not isinstance(inner, ir.Block) and inner.operation.name == "arith.maxsi" \
                    and _is_const(inner.operation.operands[1]):
                # feeds a load (gather), not a guarded write (scatter: in-range predicate)
                feeds_load = any(
                    u.owner.name == "arith.index_cast" and any(
                        uu.owner.name == "memref.load" for uu in u.owner.results[0].uses)
                    for u in op.results[0].uses)
                guarded = any(u.owner.name == "arith.cmpi"
                              for u in inner.operation.operands[0].uses)
                if feeds_load and not guarded:   # a guarded clamp is a scatter's drop
                    clamps.append((op, inner.operation.operands[0]))
        return ir.WalkResult.ADVANCE

    gfunc.walk(visit)
    for op, raw in clamps:
        with ir.InsertionPoint.after(op), op.location:
            bad = arith.CmpIOp(arith.CmpIPredicate.ne, raw, op.results[0]).result
            ifop = scf.IfOp(bad)
        with ir.InsertionPoint(ifop.then_block), op.location:
            idx = ir.IndexType.get()
            c0 = arith.ConstantOp(idx, 0).result
            c1 = arith.ConstantOp(idx, 1).result
            memref.StoreOp(arith.ConstantOp(i32, ERR_GATHER_INDEX).result, err, [c0])
            memref.StoreOp(arith.ConstantOp(i32, ordinal + 1).result, err, [c1])
            scf.YieldOp([])
    return len(clamps)


def _spirv_binaries(module: ir.Module, caps, checks_for, blocks: dict
                    ) -> dict[str, tuple[bytes, str]]:
    """Lower every gpu.module of ``module`` to SPIR-V: ``{module name: (binary, entry)}``;
    ``blocks[module name]`` is its launch's workgroup size."""
    env = target_env(caps)
    with module.context, ir.Location.unknown():
        # a memref.copy left inside a kernel (e.g. in a serial scatter loop) becomes loops
        copies = []

        def find_copies(op):
            if op.operation.name == "memref.copy":
                copies.append(op.operation)
            return ir.WalkResult.ADVANCE

        module.operation.walk(find_copies)
        if copies:
            from mlir.dialects import linalg

            for c in copies:
                with ir.InsertionPoint(c), c.location:
                    linalg.copy(c.operands[0], outs=[c.operands[1]])
                c.erase()
            PassManager.parse("builtin.module(gpu.module(convert-linalg-to-loops,"
                              "fold-memref-alias-ops,canonicalize))").run(module.operation)
        for gm in module.body.operations:
            gm = gm.operation
            if gm.name != "gpu.module":
                continue
            for f in gm.regions[0].blocks[0].operations:
                f = f.operation
                if f.name == "gpu.func":
                    gm.attributes["targets"] = ir.ArrayAttr.get([ir.Attribute.parse(env)])
                    checks_for(gm, f)
                    x, y, z = blocks[ir.StringAttr(gm.attributes["sym_name"]).value]
                    f.attributes["spirv.entry_point_abi"] = ir.Attribute.parse(
                        f"#spirv.entry_point_abi<workgroup_size = [{x}, {y}, {z}]>")
        PassManager.parse(
            "builtin.module(gpu.module(scf-parallel-for-to-nested-fors,lower-affine,"
            "arith-int-range-narrowing{int-bitwidths-supported=32},"
            "canonicalize,cse))").run(module.operation)
        feats = caps.features or DEFAULT_FEATURES
        if "shaderFloat16" not in feats:
            half_to_float(module)
        if "shaderInt8" not in feats:
            zero_extend_bytes(module)
            sign_extend_truncated_bytes(module)
        # rounding divisions (the generic mapping's index maps may fold into
        # arith.floordivsi) have no SPIR-V lowering: expanded where present (only there:
        # arith-expand also rewrites maximumf/minimumf)
        rounding = []

        def find_rounding(op):
            if op.operation.name in ("arith.floordivsi", "arith.ceildivsi", "arith.ceildivui"):
                rounding.append(op)
                return ir.WalkResult.INTERRUPT
            return ir.WalkResult.ADVANCE

        module.operation.walk(find_rounding)
        if rounding:
            PassManager.parse("builtin.module(gpu.module(arith-expand))").run(module.operation)
        PassManager.parse(
            "builtin.module(gpu.module(convert-math-to-spirv),"
            "convert-gpu-to-spirv{use-64bit-index=false})").run(module.operation)
        # for Shader targets the spirv.module lands beside its gpu.module: move it inside
        body = module.body
        ops = [o.operation for o in body.operations]
        gmods = {ir.StringAttr(o.attributes["sym_name"]).value: o for o in ops
                 if o.name == "gpu.module"}
        entries = {}
        for o in ops:
            if o.name != "spirv.module":
                continue
            name = ir.StringAttr(o.attributes["sym_name"]).value if "sym_name" in o.attributes \
                else ""
            key = name[len("__spv__"):] if name.startswith("__spv__") else name
            gm = gmods.get(key)
            if gm is None:
                raise SpirvCodegenError(f"spirv.module {name!r} has no gpu.module")
            gblock = gm.regions[0].blocks[0]
            for f in list(gblock.operations):
                f = f.operation
                if f.name == "gpu.func":
                    entries[key] = ir.StringAttr(f.attributes["sym_name"]).value
                    f.erase()
            term = list(gblock.operations)
            if term:
                o.move_before(term[-1].operation) if term[-1].operation.name.endswith(
                    "_end") else gblock.append(o)
            else:
                gblock.append(o)
        finite_constants(module)
        signed_operands(module)
        PassManager.parse("builtin.module(gpu.module(spirv.module(spirv-lower-abi-attrs,"
                          "spirv-update-vce)),gpu-module-to-binary{format=bin})"
                          ).run(module.operation)
        from mlir.dialects import gpu

        out = {}
        for o in module.body.operations:
            o = o.operation
            if o.name != "gpu.binary":
                continue
            name = ir.StringAttr(o.attributes["sym_name"]).value
            objs = list(ir.ArrayAttr(o.attributes["objects"]))
            out[name] = (bytes(gpu.ObjectAttr(objs[0]).object), entries.get(name, name))
        return out


def finite_constants(module: ir.Module) -> int:
    """Legalize non-finite float constants (the ``-inf`` a max reduction starts from, a NaN)
    of the ``spirv.module``s in ``module``: each becomes its integer bit pattern and a
    ``spirv.Bitcast``, the same value computed at run time. Front ends that translate SPIR-V
    into a shading language without infinities (naga, wgpu's: WGSL has no non-finite literal)
    reject the constant; drivers fold the bitcast. Scalars and splats of f16/f32; returns the
    number of constants rewritten."""
    import numpy as np

    bad = []

    def visit(op):
        op = op.operation
        if op.name == "spirv.Constant":
            a = op.attributes["value"]
            if isinstance(a, ir.FloatAttr):
                if not np.isfinite(a.value):
                    bad.append(op)
            elif isinstance(a, ir.DenseFPElementsAttr):
                if a.is_splat and not np.isfinite(a.get_splat_value().value):
                    bad.append(op)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    for op in bad:
        t = op.results[0].type
        shaped = isinstance(t, ir.ShapedType)
        width = (t.element_type if shaped else t).width
        a = op.attributes["value"]
        v = (a.get_splat_value() if shaped else a).value
        bits = int(np.array([v], {16: np.float16, 32: np.float32, 64: np.float64}[width])
                   .view({16: np.int16, 32: np.int32, 64: np.int64}[width])[0])
        it = ir.IntegerType.get_signless(width)
        with ir.InsertionPoint(op), op.location:
            if shaped:
                vt = ir.VectorType.get(t.shape, it)
                attr = ir.DenseElementsAttr.get_splat(vt, ir.IntegerAttr.get(it, bits))
                ct = vt
            else:
                attr, ct = ir.IntegerAttr.get(it, bits), it
            c = ir.Operation.create("spirv.Constant", results=[ct], attributes={"value": attr})
            cast = ir.Operation.create("spirv.Bitcast", results=[t], operands=[c.result])
        op.results[0].replace_all_uses_with(cast.result)
        op.erase()
    return len(bad)


def zero_extend_bytes(module: ir.Module) -> int:
    """For a target without 8-bit integers (no ``Int8``): MLIR's SPIR-V conversion holds an
    i8 in a 32-bit integer, sign-extended, and lowers ``arith.extui``/``arith.uitofp`` of
    it without masking, so a byte >= 0x80 read as unsigned (a packed weight's scale byte, a
    4-bit pair) keeps the sign bits. Each becomes the sign extension (which that
    representation gets right) masked to its low 8 bits. Returns the number of ops
    rewritten."""
    todo = []

    def visit(op):
        op = op.operation
        if op.name in ("arith.extui", "arith.uitofp") and \
                isinstance(op.operands[0].type, ir.IntegerType) and \
                op.operands[0].type.width == 8:
            todo.append(op)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    i32 = ir.IntegerType.get_signless(32)
    for op in todo:
        dst = op.results[0].type
        wide = dst if op.name == "arith.extui" else i32
        with ir.InsertionPoint(op), op.location:
            x = arith.ExtSIOp(wide, op.operands[0]).result
            x = arith.AndIOp(x, arith.ConstantOp(wide, 0xFF).result).result
            if op.name == "arith.uitofp":
                x = arith.UIToFPOp(dst, x).result
        op.results[0].replace_all_uses_with(x)
        op.erase()
    return len(todo)


def sign_extend_truncated_bytes(module: ir.Module) -> int:
    """For a target without 8-bit integers (no ``Int8``): MLIR's SPIR-V conversion holds an
    i8 in a 32-bit integer but lowers ``arith.trunci`` of an i32 to i8 as a mask to the low
    byte, so a signed use of the byte (``arith.sitofp``/``arith.extsi``: a q8_0 value taken
    from a 32-bit word of four) reads a negative byte as 128..255. Each such use of a
    truncation becomes the same use of the i32 shifted left then arithmetically right by 24
    (the byte sign-extended in 32 bits). Returns the number of uses rewritten."""
    todo = []

    def visit(op):
        op = op.operation
        if op.name in ("arith.sitofp", "arith.extsi") and \
                isinstance(op.operands[0].type, ir.IntegerType) and \
                op.operands[0].type.width == 8:
            src = op.operands[0].owner
            if not isinstance(src, ir.Block) and src.operation.name == "arith.trunci" and \
                    src.operation.operands[0].type.width == 32:
                todo.append((op, src.operation))
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    i32 = ir.IntegerType.get_signless(32)
    for op, trunc in todo:
        dst = op.results[0].type
        with ir.InsertionPoint(op), op.location:
            k = arith.ConstantOp(i32, 24).result
            x = arith.ShLIOp(trunc.operands[0], k).result
            x = arith.ShRSIOp(x, k).result
            if op.name == "arith.sitofp":
                x = arith.SIToFPOp(dst, x).result
            elif dst != i32:
                x = arith.ExtSIOp(dst, x).result
        op.results[0].replace_all_uses_with(x)
        op.erase()
        if not list(trunc.results[0].uses):
            trunc.erase()
    return len(todo)


def half_to_float(module: ir.Module) -> int:
    """For a target without 16-bit floats (no ``Float16``): rewrite each f16 -> f32 widening
    of 16 bits (``arith.extf (arith.bitcast %h : i16 to f16)``, how packed weights' scales
    and f16 words are read) into 32-bit integer arithmetic on the bits: MLIR's SPIR-V
    conversion would otherwise widen the f16 to an f32 *type* and bitcast 16 bits as 32.
    Exact for every f16 (IEEE 754 binary16 -> binary32: normals rebias the exponent by
    112, subnormals are ``m * 2^-24``, inf/NaN keep their payload). Returns the number of
    conversions rewritten."""
    todo = []

    def visit(op):
        op = op.operation
        if op.name == "arith.extf" and isinstance(op.operands[0].type, ir.F16Type):
            src = op.operands[0].owner
            if not isinstance(src, ir.Block) and src.operation.name == "arith.bitcast":
                todo.append((op, src.operation))
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    i32, f32 = ir.IntegerType.get_signless(32), ir.F32Type.get()
    for ext, cast in todo:
        with ir.InsertionPoint(ext), ext.location:
            c = lambda v: arith.ConstantOp(i32, v).result  # noqa: E731
            h = arith.ExtUIOp(i32, cast.operands[0]).result
            sign = arith.ShLIOp(arith.AndIOp(h, c(0x8000)).result, c(16)).result
            e = arith.AndIOp(arith.ShRUIOp(h, c(10)).result, c(0x1F)).result
            m = arith.AndIOp(h, c(0x3FF)).result
            mant = arith.ShLIOp(m, c(13)).result
            normal = arith.OrIOp(arith.ShLIOp(arith.AddIOp(e, c(112)).result, c(23)).result,
                                 mant).result
            special = arith.OrIOp(c(0x7F800000), mant).result
            is_max = arith.CmpIOp(arith.CmpIPredicate.eq, e, c(31)).result
            bits = arith.OrIOp(sign, arith.SelectOp(is_max, special, normal).result).result
            value = arith.BitcastOp(f32, bits).result
            tiny = arith.MulFOp(arith.UIToFPOp(f32, m).result,
                                arith.ConstantOp(f32, 2.0 ** -24).result).result
            neg = arith.CmpIOp(arith.CmpIPredicate.ne, sign, c(0)).result
            tiny = arith.SelectOp(neg, arith.NegFOp(tiny).result, tiny).result
            is_sub = arith.CmpIOp(arith.CmpIPredicate.eq, e, c(0)).result
            out = arith.SelectOp(is_sub, tiny, value).result
        ext.results[0].replace_all_uses_with(out)
        ext.erase()
        if not list(cast.results[0].uses):
            cast.erase()
    return len(todo)


#: SPIR-V ops whose integer semantics are signed, with the operand positions that are read
#: as signed (a shift's amount is not)
_SIGNED_OPS = {
    "spirv.ShiftRightArithmetic": (0,), "spirv.SDiv": (0, 1), "spirv.SRem": (0, 1),
    "spirv.SMod": (0, 1), "spirv.SNegate": (0,), "spirv.SLessThan": (0, 1),
    "spirv.SLessThanEqual": (0, 1), "spirv.SGreaterThan": (0, 1),
    "spirv.SGreaterThanEqual": (0, 1), "spirv.ConvertSToF": (0,), "spirv.SConvert": (0,),
    "spirv.GL.SMax": (0, 1), "spirv.GL.SMin": (0, 1), "spirv.GL.SAbs": (0,),
    "spirv.GL.SSign": (0,), "spirv.GL.SClamp": (0, 1, 2), "spirv.GL.FindSMsb": (0,),
    # a float -> signed integer conversion: its result (naga converts to an unsigned-typed
    # result as to u32, a negative value becoming 0)
    "spirv.ConvertFToS": (),
}


def _signed(t: ir.Type) -> ir.Type | None:
    """``t`` (an integer or a vector of them) with signed integers; None if not an integer
    type or already signed."""
    if isinstance(t, ir.VectorType):
        e = _signed(t.element_type)
        return None if e is None else ir.VectorType.get(t.shape, e)
    if isinstance(t, ir.IntegerType) and not t.is_signed and t.width > 1:
        return ir.IntegerType.get_signed(t.width)
    return None


def signed_operands(module: ir.Module) -> int:
    """Give every signed-semantics integer op (:data:`_SIGNED_OPS`) of the ``spirv.module``s
    in ``module`` signed operand and result types, through ``spirv.Bitcast``s from and back
    to the signless types MLIR emits. The same program for a Vulkan driver (SPIR-V's
    signedness lives in the opcode); but naga, wgpu's SPIR-V front end, reads signedness from
    the *type* for some ops (an ``OpShiftRightArithmetic`` or ``SMax`` of an unsigned-typed
    value comes out logical / unsigned), so this makes the two agree. Returns the number of
    ops rewritten."""
    todo = []

    def visit(op):
        op = op.operation
        if op.name in _SIGNED_OPS:
            todo.append(op)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    n = 0
    for op in todo:
        positions = _SIGNED_OPS[op.name]
        if not any(_signed(op.operands[i].type) is not None for i in positions) and \
                (positions or _signed(op.results[0].type) is None):
            continue
        with ir.InsertionPoint(op), op.location:
            operands = []
            for i, v in enumerate(op.operands):
                st = _signed(v.type) if i in positions else None
                operands.append(v if st is None else ir.Operation.create(
                    "spirv.Bitcast", results=[st], operands=[v]).result)
            res_types, back = [], []
            for r in op.results:
                # an integer result of the op's own signed arithmetic (not a bool, not f32)
                st = _signed(r.type) if op.name not in ("spirv.ConvertSToF",) else None
                res_types.append(st or r.type)
                back.append(st is not None)
            attrs = {a.name: a.attr for a in op.attributes}
            new = ir.Operation.create(op.name, results=res_types, operands=operands,
                                      attributes=attrs)
        with ir.InsertionPoint.after(new), op.location:
            for r, nr, b in zip(op.results, new.results, back):
                r.replace_all_uses_with(ir.Operation.create(
                    "spirv.Bitcast", results=[r.type], operands=[nr]).result if b else nr)
        op.erase()
        n += 1
    return n


def spirv_val(binary: bytes, what: str = "kernel") -> None:
    """Validate with ``spirv-val --target-env vulkan1.1`` (a no-op without the tool)."""
    tool = shutil.which("spirv-val")
    if tool is None:
        return
    with tempfile.NamedTemporaryFile(suffix=".spv", delete=False) as f:
        f.write(binary)
        path = f.name
    try:
        r = subprocess.run([tool, "--target-env", "vulkan1.1", path], capture_output=True,
                           text=True, timeout=60)
    finally:
        os.unlink(path)
    if r.returncode != 0:
        raise SpirvCodegenError(f"spirv-val rejected {what}: {(r.stdout + r.stderr).strip()}")


# ---- the step ----------------------------------------------------------------------------------

def _sym(op: ir.Operation) -> str:
    return ir.StringAttr(op.attributes["sym_name"]).value


def codegen_vulkan(g, target, validate: bool = True, storage=(), progress=None
                   ) -> VulkanArtifact:
    """The backend code generator: an optimized, dispatch-fused graph (what
    ``poot.compiler.compile._codegen`` receives) -> :class:`VulkanArtifact`.

    The step plan and the kernels come from the shared :func:`poot.backends.gpu.plan.
    plan_program` (identical dispatch bodies, e.g. the layers, are compiled once); each kernel
    is split into its own gpu.module and lowered to SPIR-V here. ``storage`` (the program's
    planned buffers, :attr:`~poot.compiler.compile.Program.storage`): an output aliasing an
    input (a KV pool written by a scatter) is written over the input's own buffer where the
    plan can (``artifact.in_place``; the plan ends with a copy into the output, no copy at
    all when the two are bound to one buffer); without it every output has its own buffer
    (the executor ping-pongs carried state). ``progress``: a
    :class:`~poot.progress.Tracker` (per dispatch region, the SPIR-V lowering, then
    spirv-val per kernel).
    Raises :class:`SpirvCodegenError` where a kernel does not lower or validate.
    """
    track = Tracker.of(progress)
    caps = target.caps
    features = caps.features or DEFAULT_FEATURES
    plan = plan_program(SimpleNamespace(graph=g, storage=list(storage)), caps, progress=track)
    kmod = plan.module
    users = _kernel_users(plan)
    blocks = _block_sizes(plan)
    _one_module_per_kernel(kmod)
    index = {n: i for i, n in enumerate(plan.kernels)}
    n_checks: dict[int, int] = {}

    def checks_for(gm, f):
        k = index[_sym(f)]
        n_checks[k] = _add_error_word(f, k)

    validating = validate and shutil.which("spirv-val") is not None
    track.add(1 + (len(plan.kernels) if validating else 0))
    track("SPIR-V lowering")
    bins = _spirv_binaries(kmod, caps, checks_for, blocks)
    art = VulkanArtifact(name=g.name)
    ids, written_over = _artifact_buffers(art, plan)
    for i, name in enumerate(plan.kernels):
        spv, entry = bins[name]
        if validating:
            track("spirv-val")
            spirv_val(spv, f"kernel {name} ({', '.join(users.get(i, []))})")
        nargs = next(len(L["args"]) for L in plan.launches
                     if L["op"] == "kernel" and L["kernel"] == i)
        art.kernels.append(VulkanKernel(name, entry, spv, list(blocks[name]), nargs + 1))
    _artifact_steps(art, plan, ids, written_over)
    art.dispatches = [{"name": d["callee"], "kind": d["kind"]} for d in plan.dispatches]
    art.kernel_users = [users.get(i, []) for i in range(len(plan.kernels))]
    art.checks = {plan.kernels[k]: n for k, n in n_checks.items() if n}
    art.subgroup_size = caps.subgroup_size
    art.features = sorted(features)
    return art


def _kernel_users(plan) -> dict[int, list[str]]:
    """Per kernel index of ``plan``, the dispatch functions (callees) launching it, in order."""
    users: dict[int, list[str]] = {}
    for d in plan.dispatches:
        for L in plan.launches[d["first"]:d["first"] + d["count"]]:
            if L["op"] == "kernel":
                users.setdefault(L["kernel"], [])
                if d["callee"] not in users[L["kernel"]]:
                    users[L["kernel"]].append(d["callee"])
    return users


def _block_sizes(plan) -> dict[str, tuple]:
    """The block size each kernel of ``plan`` is launched with, by kernel name; raises
    :class:`SpirvCodegenError` for a kernel launched with two."""
    blocks = {}
    for L in plan.launches:
        if L["op"] == "kernel":
            name = plan.kernels[L["kernel"]]
            if blocks.setdefault(name, tuple(L["block"])) != tuple(L["block"]):
                raise SpirvCodegenError(f"kernel {name} launched with two block sizes")
    return blocks


def _one_module_per_kernel(kmod: ir.Module) -> None:
    """Split ``kmod``'s gpu.modules into one gpu.module per kernel (named after it): one
    SPIR-V binary, one entry point, its own bindings."""
    with kmod.context, ir.Location.unknown():
        for gm in [o.operation for o in kmod.body.operations]:
            if gm.name != "gpu.module":
                continue
            for f in [o.operation for o in gm.regions[0].blocks[0].operations]:
                if f.name != "gpu.func":
                    continue
                name = _sym(f)
                with ir.InsertionPoint(kmod.body):
                    new = ir.Operation.create("gpu.module", attributes={
                        "sym_name": ir.StringAttr.get(name)}, regions=1)
                    new.regions[0].blocks.append()
                f.detach_from_parent()
                ir.InsertionPoint(new.regions[0].blocks[0]).insert(f)
            gm.erase()


def _buffer_spec(d: dict) -> BufferSpec:
    """The artifact's :class:`BufferSpec` of a plan input, param or output ``d``."""
    poot_t = d.get("poot", "")
    if poot_t.startswith("packed:"):
        return BufferSpec("u8", (d["nbytes"],), d["nbytes"], poot_t.split(":")[1])
    return BufferSpec(poot_t, tuple(d["shape"]), d["nbytes"])


def _artifact_buffers(art: VulkanArtifact, plan) -> tuple[dict[int, int], list]:
    """Fill ``art``'s inputs, params, outputs and buffers from ``plan``: (plan buffer id ->
    artifact buffer, ``(input's buffer, output's buffer, nbytes)`` of each output written in
    place over its input)."""
    ids = {}
    written_over = []          # (input's art buffer, output's art buffer) of in-place state
    for role, items in (("input", plan.inputs), ("param", plan.params),
                        ("output", plan.outputs)):
        for i, d in enumerate(items):
            getattr(art, role + "s").append((d["name"], _buffer_spec(d)))
            if role == "output" and d.get("in_place"):
                # the kernels write the input's buffer; the output is a copy of it at the end
                written_over.append((ids[d["buffer"]], len(art.buffers), d["nbytes"]))
                art.in_place[d["name"]] = d["aliases"]
            else:
                ids[d["buffer"]] = len(art.buffers)
            art.buffers.append({"kind": role, "name": d["name"], "index": i,
                                "nbytes": d["nbytes"]})
    for b in plan.buffers:
        if b["id"] in ids:
            continue
        ids[b["id"]] = len(art.buffers)
        entry = {"kind": "const" if b["role"] == "const" else "temp", "name": b["name"],
                 "index": -1, "nbytes": int(b["nbytes"])}
        if b["role"] == "const":
            entry["data"] = base64.b64decode(b["data"]).hex()
        art.buffers.append(entry)
    return ids, written_over


def _artifact_steps(art: VulkanArtifact, plan, ids: dict[int, int], written_over: list
                    ) -> None:
    """``art``'s steps: the plan's launches and copies (each with its dispatch's ordinal),
    then the copies of in-place state into its outputs."""
    ordinal = {}
    for j, d in enumerate(plan.dispatches):
        for L in plan.launches[d["first"]:d["first"] + d["count"]]:
            ordinal[id(L)] = j
    for L in plan.launches:
        if L["op"] == "copy":
            art.steps.append(Step("copy", src=ids[L["src"]], dst=ids[L["dst"]],
                                  nbytes=int(L["nbytes"]), dispatch=ordinal.get(id(L), -1)))
        else:
            art.steps.append(Step("dispatch", kernel=L["kernel"],
                                  args=[ids[a] for a in L["args"]], groups=list(L["grid"]),
                                  dispatch=ordinal.get(id(L), -1)))
    for src, dst, nbytes in written_over:
        art.steps.append(Step("copy", src=src, dst=dst, nbytes=int(nbytes)))


def _nbytes(t: ir.Type) -> int:
    return type_from_mlir(t).nbytes


def compile_vulkan(graph, target=None, options=None):
    """Compile a traced step for a SPIR-V target (:func:`vulkan_target` by default): the one
    compiler entry, :func:`poot.compiler.compile.compile`, with dispatch fusion on (one
    dispatch region = one kernel sequence). Returns its
    :class:`~poot.compiler.compile.Program`, whose ``executable`` is the
    :class:`VulkanArtifact`."""
    options = options or CompileOptions()
    return compile_graph(graph, target or vulkan_target(), replace(options, fuse=True))


def codegen(program, options=None, progress=None) -> VulkanArtifact:
    """``poot.compiler.compile``'s code generator for ``vulkan`` (:func:`compile_program`)."""
    return compile_program(program, progress)


def compile_program(program, progress=None) -> VulkanArtifact:
    """``poot.compiler.compile._codegen``'s entry for ``vulkan`` (same shape as CUDA's):
    the fused Program (graph, target, storage planned before fusion) -> VulkanArtifact."""
    art = codegen_vulkan(program.graph, program.target, storage=program.storage,
                         progress=progress)
    art.aliases = {b.name: b.aliases for b in program.storage
                   if b.role == "output" and b.aliases}
    return art


__all__ = ["SpirvCodegenError", "codegen", "codegen_vulkan", "compile_program", "compile_vulkan",
           "spirv_val",
           "vulkan_target"]
