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

import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import replace

from mlir import ir
from mlir.dialects import arith, memref, scf
from mlir.passmanager import PassManager

from poot.backends.vulkan.artifact import (ERR_GATHER_INDEX, BufferSpec, Step,
                                           VulkanArtifact, VulkanKernel)
from poot.errors import PootError

#: what the SPIR-V lowering assumes about a device it was not told about (lavapipe-like)
DEFAULT_FEATURES = frozenset({"shaderInt64", "shaderInt16", "shaderInt8", "shaderFloat16",
                              "storageBuffer8BitAccess", "storageBuffer16BitAccess",
                              "subgroupBasic", "subgroupShuffle", "subgroupArithmetic"})


class SpirvCodegenError(PootError):
    """A kernel the SPIR-V lowering or the validator rejected."""


# ---- targets ---------------------------------------------------------------------------------

def vulkan_target(device_caps: dict | None = None):
    """The compile :class:`~poot.compiler.target.Target` of a Vulkan device, from the runtime's
    :meth:`~poot.backends.vulkan.runtime.VulkanDevice.capabilities` dict (features, subgroup
    size, shared memory). Without one: lavapipe-like defaults, subgroup size unknown (None)."""
    from poot.compiler.target import Capabilities, Target
    from poot.dialects.lowering.packed import DECODERS
    from poot.dialects.types import DType

    caps = dict(device_caps or {})
    feats = frozenset(caps.get("features", DEFAULT_FEATURES))
    storage = {DType.F32, DType.I32, DType.I1, DType.I8}
    if "shaderInt64" in feats:
        storage.add(DType.I64)
    if "storageBuffer16BitAccess" in feats:
        storage |= {DType.F16, DType.BF16}
    compute = {DType.F32, DType.I32, DType.I8, DType.I1}
    if "shaderInt64" in feats:
        compute.add(DType.I64)
    return Target("vulkan", Capabilities(
        storage_dtypes=frozenset(storage), compute_dtypes=frozenset(compute),
        packed_formats=frozenset(DECODERS), cores=int(caps.get("compute_units", 1)),
        vector_bits=128, subgroup_size=caps.get("subgroup_size"),
        max_shared_bytes=int(caps.get("max_shared_bytes", 32768)), features=feats))


def target(device):
    """The registry's ``target`` hook: :func:`vulkan_target` of an opened
    :class:`~poot.backends.vulkan.runtime.VulkanDevice`."""
    return vulkan_target(device.capabilities())


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
    """
    from types import SimpleNamespace

    from poot.backends.gpu.plan import plan_program
    from poot.progress import Tracker

    track = Tracker.of(progress)
    caps = target.caps
    features = caps.features or DEFAULT_FEATURES
    plan = plan_program(SimpleNamespace(graph=g, storage=list(storage)), caps, progress=track)
    kmod = plan.module
    users: dict[int, list[str]] = {}
    for d in plan.dispatches:
        for L in plan.launches[d["first"]:d["first"] + d["count"]]:
            if L["op"] == "kernel":
                users.setdefault(L["kernel"], [])
                if d["callee"] not in users[L["kernel"]]:
                    users[L["kernel"]].append(d["callee"])
    blocks = {}
    for L in plan.launches:
        if L["op"] == "kernel":
            name = plan.kernels[L["kernel"]]
            if blocks.setdefault(name, tuple(L["block"])) != tuple(L["block"]):
                raise SpirvCodegenError(f"kernel {name} launched with two block sizes")
    # one gpu.module per kernel: one SPIR-V binary, one entry point, its own bindings
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
    index = {n: i for i, n in enumerate(plan.kernels)}
    n_checks: dict[int, int] = {}

    def checks_for(gm, f):
        k = index[_sym(f)]
        n_checks[k] = _add_error_word(f, k)

    validating = validate and shutil.which("spirv-val") is not None
    track.add(1 + (len(plan.kernels) if validating else 0))
    track("SPIR-V lowering")
    bins = _spirv_binaries(kmod, caps, checks_for, blocks)

    def spec(d) -> BufferSpec:
        poot_t = d.get("poot", "")
        if poot_t.startswith("packed:"):
            return BufferSpec("u8", (d["nbytes"],), d["nbytes"], poot_t.split(":")[1])
        return BufferSpec(poot_t, tuple(d["shape"]), d["nbytes"])

    art = VulkanArtifact(name=g.name)
    ids = {}
    written_over = []          # (input's art buffer, output's art buffer) of in-place state
    for role, items in (("input", plan.inputs), ("param", plan.params),
                        ("output", plan.outputs)):
        for i, d in enumerate(items):
            getattr(art, role + "s").append((d["name"], spec(d)))
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
            import base64

            entry["data"] = base64.b64decode(b["data"]).hex()
        art.buffers.append(entry)
    for i, name in enumerate(plan.kernels):
        spv, entry = bins[name]
        if validating:
            track("spirv-val")
            spirv_val(spv, f"kernel {name} ({', '.join(users.get(i, []))})")
        nargs = next(len(L["args"]) for L in plan.launches
                     if L["op"] == "kernel" and L["kernel"] == i)
        art.kernels.append(VulkanKernel(name, entry, spv, list(blocks[name]), nargs + 1))
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
    art.dispatches = [{"name": d["callee"], "kind": d["kind"]} for d in plan.dispatches]
    art.kernel_users = [users.get(i, []) for i in range(len(plan.kernels))]
    art.checks = {plan.kernels[k]: n for k, n in n_checks.items() if n}
    art.subgroup_size = caps.subgroup_size
    art.features = sorted(features)
    return art


def _nbytes(t: ir.Type) -> int:
    from poot.dialects.types import type_from_mlir

    return type_from_mlir(t).nbytes


def compile_vulkan(graph, target=None, options=None):
    """Compile a traced step for Vulkan: the compiler's front half (optimization, legalization
    for the target's compute dtypes, planning, dispatch fusion) then :func:`codegen_vulkan`.

    Returns a :class:`~poot.compiler.compile.Program` whose ``executable`` is the
    :class:`VulkanArtifact`. (Once ``poot.compiler.compile._codegen`` routes ``vulkan`` to
    :func:`compile_program`, ``poot.compiler.compile(graph, target, CompileOptions(fuse=True))``
    is the entry and this wrapper goes.)
    """
    from poot.compiler.compile import (CompileOptions, Program, _clone, _optimization_pipeline,
                                       _run_pass)
    from poot.compiler.planning import check_module, plan_storage
    from poot.passes.analysis import dispatch_count, dispatch_report
    from poot.passes.registry import load_all_passes

    target = target or vulkan_target()
    options = options or CompileOptions()
    if not options.fuse:
        options = replace(options, fuse=True)   # one dispatch region = one kernel sequence
    load_all_passes()
    g = _clone(graph)
    seconds: dict[str, float] = {}
    with g.context, ir.Location.unknown():
        for name in _optimization_pipeline(options):
            _run_pass(name, g.module, {}, options, seconds)
        compute = ",".join(sorted(d.value for d in target.caps.compute_dtypes))
        _run_pass("poot-legalize", g.module, {"compute": compute}, options, seconds)
        check_module(g.module.operation, target)
        storage = plan_storage(g.func, g.inputs, g.outputs, g.params)
        before = dispatch_count(g.module.operation)
        _run_pass("poot-fuse-dispatch", g.module,
                  {"max-region-ops": min(256, options.limits.max_kernel_ops)}, options, seconds)
        report = dispatch_report(g.module.operation)
        text = str(g.module)
    program = Program(g, target, text, report, before, storage,
                      {"matmul_accumulation": "f32", "reduction_accumulation": "f32",
                       "tolerance_vs_oracle": {"f32": 1e-4, "f16": 1e-2, "bf16": 2e-2}},
                      seconds)
    t0 = time.perf_counter()
    program.executable = compile_program(program)
    seconds["codegen"] = time.perf_counter() - t0
    return program


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
