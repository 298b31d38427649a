"""ROCm code generation: the shared GPU plan (:mod:`poot.backends.gpu.plan`) lowered through
ROCDL to AMDGCN code objects (HSACO) for the target's arch and the other arch of its
wavefront size (:func:`same_wave_archs`: gfx90a + gfx942, gfx1100 + gfx1151), packaged as a
:class:`~poot.backends.rocm.artifact.RocmArtifact`.

    artifact = codegen(program)          # what compile()'s _codegen calls (target: rocm_target)

The route (the MLIR wheel's LLVM has no AMDGPU backend, so ``gpu-module-to-binary`` cannot
serialize; see ``docs/toolchain.md``):

1. :data:`rocdl_pipeline`: ``rocdl-attach-target{chip}``, the host-side conversions the NVVM
   path also runs, then inside the ``gpu.module`` ``math-expand-ops`` (tanh and the other
   ops of :data:`EXPANDED` in terms of exp and arith) and ``convert-gpu-to-rocdl`` (bare-pointer
   kernel ABI: one 8-byte pointer per buffer; exp, log and sqrt become LLVM intrinsics the
   AMDGPU backend selects natively).
2. The ``gpu.module``'s body translated to LLVM IR (triple ``amdgcn-amd-amdhsa``).
3. :func:`link_device_library`: the ROCm device libraries (ocml) are not on these machines.
   ``convert-gpu-to-rocdl`` turns ``math.sin`` / ``math.cos`` (RoPE tables) into
   ``__ocml_sin_f32`` / ``__ocml_cos_f32`` calls, so poot defines those two itself (range
   reduction to revolutions in f64, then the hardware's ``v_sin_f32`` / ``v_cos_f32``, which
   take revolutions). Any other ``__ocml_*`` call left is refused by name: the code object
   must have no undefined symbol.
4. llvmlite (LLVM 22, which has the AMDGPU target) optimizes the module at O3 and emits an
   object for ``cpu=<arch>``; ``ld.lld -shared`` links it into the HSACO (the loader wants a
   shared ELF). Kernel ``K``'s descriptor is the symbol ``K.kd``.

What planning gives the kernels: the target (:func:`~poot.backends.rocm.target.rocm_target`)
names no NVIDIA feature (no ``mma.sync``, no sm_90 vector loads); subgroup strategies use the
arch's wavefront (64 on CDNA, 32 on RDNA), and the prefill GEMM its matrix instruction
(``v_mfma_f32_16x16x16_*`` on CDNA, ``v_wmma_f32_16x16x16_*`` on RDNA 3:
:func:`poot.backends.gpu.strategies.gemm.matrix_op`), emitted as ``rocdl`` ops that become
LLVM's ``llvm.amdgcn.mfma.*`` / ``llvm.amdgcn.wmma.*`` intrinsics. :func:`isa` gives the
assembly of a module, to read which instructions a kernel uses.
"""

from __future__ import annotations

import functools
import glob
import math
import os
import re
import shutil
import subprocess
import tempfile
import time

from mlir import ir
from mlir.dialects import llvm as llvm_d
from mlir.passmanager import PassManager

from poot.backends.gpu.kernels import gpu_kernels
from poot.backends.gpu.plan import plan_program
from poot.backends.rocm.artifact import RocmArtifact
from poot.backends.rocm.target import ARCHS
from poot.errors import PootError
from poot import settings
from poot.progress import Tracker

TRIPLE = "amdgcn-amd-amdhsa"


class RocmCodegenError(PootError):
    """A ROCm code object could not be made (a missing tool, a library call poot does not
    define, an object the linker refused); the message says which and what to install."""


#: math ops rewritten into exp/log/arith before the ROCDL conversion (``math-expand-ops``): it
#: would make them LLVM intrinsics the AMDGPU backend has no lowering for (a fatal LLVM error)
EXPANDED = ("tanh", "sinh", "cosh", "asinh", "acosh", "atanh", "powf", "fpowi")
#: LLVM intrinsics that become library calls on AMDGPU (no instruction, no libm on the GPU)
_NO_LOWERING = re.compile(r"@llvm\.(tanh|sinh|cosh|asin|acos|atan2?|pow|powi|exp10)\.")


def rocdl_pipeline(arch: str) -> str:
    """The MLIR pass pipeline from the planned kernel module to LLVM-dialect kernels for
    ``arch`` (module doc, step 1)."""
    return (
        "builtin.module("
        "convert-vector-to-scf,convert-scf-to-cf,expand-strided-metadata,"
        f"rocdl-attach-target{{chip={arch}}},"
        "lower-affine,arith-expand{include-bf16=true},convert-arith-to-llvm,"
        "convert-index-to-llvm{index-bitwidth=64},canonicalize,cse,"
        f"gpu.module(math-expand-ops{{ops={','.join(EXPANDED)}}},"
        f"convert-gpu-to-rocdl{{chipset={arch} index-bitwidth=64 "
        "use-bare-ptr-memref-call-conv=true},"
        "canonicalize,cse,reconcile-unrealized-casts),"
        "reconcile-unrealized-casts)"
    )


#: ocml functions poot defines (module doc, step 3): x radians -> revolutions r = frac(x / 2pi)
#: in f64 (exact enough for any f32 x), then llvm.amdgcn.sin/cos (v_sin_f32 / v_cos_f32 take
#: revolutions, |r| <= 256)
_DEVICE_LIBRARY = {
    fn: f"""define internal float @__ocml_{fn}_f32(float %x) alwaysinline {{
  %d = fpext float %x to double
  %r = fmul double %d, 0x3FC45F306DC9C883
  %k = call double @llvm.floor.f64(double %r)
  %f = fsub double %r, %k
  %t = fptrunc double %f to float
  %y = call float @llvm.amdgcn.{fn}.f32(float %t)
  ret float %y
}}
"""
    for fn in ("sin", "cos")
}
_FLOOR_F64 = "declare double @llvm.floor.f64(double)\n"


def link_device_library(llir: str) -> str:
    """``llir`` (LLVM IR text) with poot's definitions of the ocml functions it calls in
    place of their declarations (module doc, step 3).

    Raises :class:`RocmCodegenError` naming any other external function the kernels call
    (not an LLVM intrinsic), or an LLVM math intrinsic that would become such a call (LLVM
    would abort the process on it): the ROCm device libraries are not available here."""
    out, used = [], []
    for line in llir.splitlines(keepends=True):
        m = re.match(r"declare .*@__ocml_(\w+)_f32\(", line)
        if m and m.group(1) in _DEVICE_LIBRARY:
            used.append(m.group(1))
            continue
        out.append(line)
    text = "".join(out)
    bad = sorted(set(m.group(0)[1:-1] for m in _NO_LOWERING.finditer(text)))
    if bad:
        raise RocmCodegenError(f"kernels use {', '.join(bad)}, which the AMDGPU backend "
                               "cannot lower without the ROCm device libraries")
    left = sorted(set(re.findall(r"^declare [^@]*@([\w.$]+)\(", text, re.M)) -
                  {n for n in re.findall(r"^declare [^@]*@(llvm\.[\w.]+)\(", text, re.M)})
    if left:
        raise RocmCodegenError(f"kernels call {', '.join(left)}, which this build does not "
                               "define (no ROCm device libraries here)")
    for decl in [_FLOOR_F64] * bool(used) + [f"declare float @llvm.amdgcn.{fn}.f32(float)\n"
                                             for fn in used]:
        if decl.split("@")[1].split("(")[0] not in re.findall(r"^declare [^@]*@([\w.]+)\(",
                                                             text, re.M):
            text += decl
    return text + "".join(_DEVICE_LIBRARY[fn] for fn in used)


@functools.cache
def _llvm():
    try:
        import llvmlite.binding as llb
    except ImportError:
        raise RocmCodegenError("ROCm code generation needs llvmlite (LLVM with the AMDGPU "
                               "target): pip install 'poot[rocm]'") from None
    llb.initialize_all_targets()
    llb.initialize_all_asmprinters()
    return llb


@functools.cache
def ld_lld() -> str:
    """Path of an ``ld.lld`` (``$POOT_LD_LLD``, ``ld.lld``, ``ld.lld-NN``, LLVM's own folders).
    Raises :class:`RocmCodegenError` saying what to install when there is none."""
    for cand in (settings.get_str("POOT_LD_LLD"), "ld.lld",
                 *sorted(glob.glob("/usr/bin/ld.lld-*"), reverse=True),
                 *sorted(glob.glob("/usr/lib/llvm-*/bin/ld.lld"), reverse=True)):
        if cand and (shutil.which(cand) or os.access(cand, os.X_OK)):
            return shutil.which(cand) or cand
    raise RocmCodegenError("linking an AMDGPU code object needs ld.lld (Debian: apt-get "
                           "install lld-19, or set POOT_LD_LLD)")


def _optimized(llir: str, arch: str, opt: int):
    """(target machine, module): LLVM IR text ``llir`` parsed for ``arch``, optimized at
    ``opt``."""
    llb = _llvm()
    mod = llb.parse_assembly(llir)
    mod.triple = TRIPLE
    mod.verify()
    tm = llb.Target.from_triple(TRIPLE).create_target_machine(cpu=arch, opt=opt, reloc="pic")
    if opt:
        pto = llb.create_pipeline_tuning_options(speed_level=opt)
        pb = llb.create_pass_builder(tm, pto)
        pb.getModulePassManager().run(mod, pb)
    return tm, mod


def isa(llir: str, arch: str, opt: int = 3) -> str:
    """The AMDGCN assembly of LLVM IR text ``llir`` for ``arch`` (what :func:`code_object`
    assembles, from the same optimization), for reading which instructions a kernel uses:
    e.g. ``v_mfma_f32_16x16x16_f16`` or ``v_wmma_f32_16x16x16_bf16`` in a prefill GEMM."""
    tm, mod = _optimized(llir, arch, opt)
    return tm.emit_assembly(mod)


def tools_missing() -> str | None:
    """Why ROCm code objects cannot be made here (llvmlite with the AMDGPU target, or
    ``ld.lld``, missing: the message says what to install), or None when they can."""
    try:
        _llvm(), ld_lld()
    except RocmCodegenError as e:
        return str(e)
    return None


def code_object(llir: str, arch: str, opt: int = 3) -> bytes:
    """The HSACO of LLVM IR text ``llir`` for ``arch``: optimized at ``opt``, emitted by
    llvmlite, linked by ``ld.lld -shared``. Raises :class:`RocmCodegenError`."""
    tm, mod = _optimized(llir, arch, opt)
    obj = tm.emit_object(mod)
    with tempfile.TemporaryDirectory() as d:
        src, dst = os.path.join(d, "k.o"), os.path.join(d, "k.hsaco")
        with open(src, "wb") as f:
            f.write(obj)
        r = subprocess.run([ld_lld(), "-shared", "--no-undefined", src, "-o", dst],
                           capture_output=True, text=True)
        if r.returncode:
            raise RocmCodegenError(f"ld.lld refused the {arch} object: {r.stderr[-2000:]}")
        with open(dst, "rb") as f:
            return f.read()


def kernel_info(module: ir.Module) -> dict[str, dict]:
    """Per kernel of the planned module (before lowering): ``args`` (explicit kernel
    arguments: one 8-byte pointer per buffer, bare-pointer ABI), ``lds_bytes`` and
    ``lds_buffers`` (the bytes and count of its workgroup-memory attributions, which LLVM
    places in LDS, each aligned to 16 bytes)."""
    out = {}
    for f in gpu_kernels(module):
        ftype = ir.FunctionType(ir.TypeAttr(f.attributes["function_type"]).value)
        n_args = len(ftype.inputs)
        n_wg = ir.IntegerAttr(f.attributes["workgroup_attributions"]).value \
            if "workgroup_attributions" in f.attributes else 0
        lds, bufs = 0, 0
        for a in list(f.regions[0].blocks[0].arguments)[n_args:n_args + n_wg]:
            bufs += 1
            mt = ir.MemRefType(a.type)
            et = mt.element_type
            bits = int(re.fullmatch(r"[a-z]+(\d+)", str(et)).group(1))
            lds += math.prod(mt.shape) * bits // 8
        name = ir.StringAttr(f.attributes["sym_name"]).value
        out[name] = {"args": n_args, "kernarg_bytes": 8 * n_args, "lds_bytes": lds,
                     "lds_buffers": bufs}
    return out


def lower_to_llvm_ir(module: ir.Module, arch: str) -> str:
    """Lower the planned kernel module (in place) for ``arch`` and return its ``gpu.module``
    as LLVM IR text (module doc, steps 1-2)."""
    with module.context, ir.Location.unknown():
        try:
            PassManager.parse(rocdl_pipeline(arch)).run(module.operation)
        except ir.MLIRError as e:
            raise RocmCodegenError(f"the ROCDL lowering for {arch} failed: "
                                   f"{' '.join(str(e).split())[:2000]}") from None
        gms = [op for op in module.body.operations if op.operation.name == "gpu.module"]
        if len(gms) != 1:
            raise RocmCodegenError(f"expected one gpu.module, got {len(gms)}")
        dev = ir.Module.create()
        with ir.InsertionPoint(dev.body):
            for op in gms[0].operation.regions[0].blocks[0].operations:
                op.operation.clone()
        dev.operation.attributes["llvm.target_triple"] = ir.StringAttr.get(TRIPLE)
        dl = gms[0].operation.attributes["llvm.data_layout"] \
            if "llvm.data_layout" in gms[0].operation.attributes else None
        if dl is not None:
            dev.operation.attributes["llvm.data_layout"] = dl
        return llvm_d.translate_module_to_llvmir(dev.operation)


def target_arch(caps) -> str:
    """The gfx arch a ROCm target's features name. Raises :class:`RocmCodegenError` when
    they name none (a target not made by :func:`~poot.backends.rocm.target.rocm_target`)."""
    archs = sorted(f for f in (caps.features or ()) if re.fullmatch(r"gfx[0-9a-f]+", f))
    if len(archs) != 1:
        raise RocmCodegenError(f"a ROCm target names one gfx arch in its features, got "
                               f"{archs or 'none'}")
    return archs[0]


def same_wave_archs(arch: str) -> list[str]:
    """The archs of :data:`~poot.backends.rocm.target.ARCHS` with ``arch``'s wavefront size
    (gfx90a and gfx942: 64; gfx1100 and gfx1151: 32), sorted. The plan depends on the
    wavefront size only (subgroup strategies), so one plan serves all of them."""
    return sorted(a for a, v in ARCHS.items() if v[0] == ARCHS[arch][0])


def compile_program(program, strategy: str = "auto", progress=None,
                    archs: list[str] | None = None) -> RocmArtifact:
    """Kernels + launch plan of a compiled :class:`~poot.compiler.Program` as a
    :class:`RocmArtifact` (module doc) with one HSACO per arch of ``archs`` (default:
    :func:`same_wave_archs` of the target's arch: the plan is made once and lowered for each).
    ``progress``: a :class:`~poot.progress.Tracker`. Raises :class:`RocmCodegenError`, also
    for an arch whose wavefront size is not the target's (its plan would differ: compile
    with ``rocm_target(arch)``)."""
    track = Tracker.of(progress)
    caps = program.target.caps
    arch = target_arch(caps)
    archs = sorted(archs) if archs is not None else same_wave_archs(arch)
    bad = [a for a in archs if a not in ARCHS or ARCHS[a][0] != caps.subgroup_size]
    if bad or not archs:
        raise RocmCodegenError(f"archs {bad or archs} cannot share this plan (wavefront "
                               f"{caps.subgroup_size}: {', '.join(same_wave_archs(arch))})")
    _llvm(), ld_lld()            # the tools, before any work
    t0 = time.perf_counter()
    plan = plan_program(program, caps, strategy, progress=track)
    info = kernel_info(plan.module)
    for L in plan.launches:
        if L["op"] == "kernel":
            k = plan.kernels[L["kernel"]]
            info[k]["block"] = list(L["block"])
    t1 = time.perf_counter()
    track.add(1)
    text = str(plan.module)
    hsaco = {}
    for a in archs:
        track(f"ROCDL to {a} code object")
        module = ir.Module.parse(text, context=plan.module.context)
        hsaco[a] = code_object(link_device_library(lower_to_llvm_ir(module, a)), a)
    t2 = time.perf_counter()
    p = {**plan.launch_plan(),
         "target": {"arch": arch, "wavefront_size": caps.subgroup_size}, "kernel_info": info}
    meta = {"strategy": strategy, "plan_s": round(t1 - t0, 3), "hsaco_s": round(t2 - t1, 3),
            "strategies": plan.strategies, "dispatch_kinds": dict(program.dispatches)}
    return RocmArtifact(p, hsaco, meta)


def codegen(program, options=None, progress=None) -> RocmArtifact:
    """``poot.compiler.compile``'s code generator for ``rocm`` (:func:`compile_program`: the
    target's arch and the other arch of its wavefront size)."""
    return compile_program(program, progress=progress)


__all__ = ["RocmCodegenError", "code_object", "codegen", "compile_program", "isa", "kernel_info",
           "ld_lld", "link_device_library", "lower_to_llvm_ir", "rocdl_pipeline",
           "same_wave_archs", "target_arch", "tools_missing"]
