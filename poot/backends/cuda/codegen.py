"""CUDA code generation: the shared GPU plan (:mod:`poot.backends.gpu.plan`) lowered through
NVVM to PTX for sm_90 (bare-pointer kernel ABI), packaged as a
:class:`~poot.backends.cuda.artifact.CudaArtifact`.

    artifact = compile_cuda(graph, target, options)   # what compile()'s _codegen calls
    artifact = compile_program(program)               # from a Program compiled to dispatches

The target-specific part is only :data:`NVVM_PIPELINE` and :func:`ptx_text`.
"""

from __future__ import annotations

import functools
import glob
import os
import re
import shutil
import subprocess
import tempfile
import time

from mlir import ir
from mlir.dialects import gpu as gpu_d
from mlir.passmanager import PassManager

from poot.backends.cuda.artifact import CudaArtifact, cuda_target
from poot.backends.cuda.hoist_constant_loads import hoist_constant_loads
from poot.backends.gpu.kernels import gpu_kernels
from poot.backends.gpu.plan import plan_program
from poot.errors import PootError
from poot import settings
from poot.progress import Tracker


class CudaCodegenError(PootError):
    """PTX generation or validation failed."""


@functools.cache
def libdevice() -> str | None:
    """libdevice.10.bc of a local CUDA toolkit (math functions: expf, logf, ...)."""
    for pat in (settings.get_str("POOT_LIBDEVICE"),
                "/usr/local/cuda*/nvvm/libdevice/libdevice.10.bc",
                "/usr/lib/nvidia-cuda-toolkit/libdevice/libdevice.10.bc"):
        if pat:
            hits = sorted(glob.glob(pat))
            if hits:
                return hits[-1]
    return None


def ptx_features(chip: str) -> str:
    """The PTX version ``chip`` is compiled for: 8.0 (sm_90's ``griddepcontrol``), 8.1 on
    sm_89 (LLVM's NVPTX selects the e4m3 conversions there from PTX 8.1)."""
    return "+ptx81" if 89 <= sm_version(chip) < 90 else "+ptx80"


def nvvm_pipeline(chip: str = "sm_90", features: str | None = None, opt: int = 3) -> str:
    features = features or ptx_features(chip)
    link = f" l={libdevice()}" if libdevice() else ""
    return (
        "builtin.module("
        "convert-vector-to-scf,convert-scf-to-cf,convert-nvvm-to-llvm,"
        "expand-strided-metadata,"
        f"nvvm-attach-target{{chip={chip} features={features} O={opt}{link}}},"
        "lower-affine,arith-expand{include-bf16=true},convert-arith-to-llvm,"
        "convert-index-to-llvm{index-bitwidth=64},canonicalize,cse,"
        # nvgpu (ldmatrix, of the tensor-core GEMM) first: convert-gpu-to-nvvm leaves it
        "gpu.module(convert-nvgpu-to-nvvm,"
        "convert-gpu-to-nvvm{index-bitwidth=64 use-bare-ptr-memref-call-conv=true},"
        "canonicalize,cse,reconcile-unrealized-casts),"
        "reconcile-unrealized-casts,gpu-module-to-binary{format=isa})"
    )


def ptx_text(module: ir.Module, chip: str = "sm_90a") -> str:
    """Lower every ``gpu.module`` of ``module`` (in place) and return the PTX text."""
    with module.context:
        PassManager.parse(nvvm_pipeline(chip)).run(module.operation)
        out = []
        for op in module.body.operations:
            if op.operation.name == "gpu.binary":
                for a in ir.ArrayAttr(op.operation.attributes["objects"]):
                    obj = gpu_d.ObjectAttr(a).object
                    out.append(obj.decode() if isinstance(obj, bytes) else str(obj))
    if len(out) != 1:
        raise CudaCodegenError(f"expected one PTX object, got {len(out)}")
    return dynamic_shared_extern(out[0].rstrip("\x00"))


def dynamic_shared_extern(ptx: str) -> str:
    """``ptx`` with each ``gpu.dynamic_shared_memory`` buffer declared as CUDA's dynamic
    shared memory. MLIR lowers the op to an internal zero-length array in address space 3,
    which LLVM's NVPTX printer writes as a one-byte ``.shared`` variable (moved into the one
    function that uses it: "demoted"); an ``.extern .shared`` array of no size at module
    scope is what the PTX ISA gives the block's dynamic shared memory (its size set at
    launch)."""
    pat = re.compile(r"^\s*\.shared (\.align \d+ )?\.b8 (__dynamic_shmem__\d+);\n", re.M)
    decls = {m.group(2): f".extern .shared {m.group(1) or ''}.b8 {m.group(2)}[];\n"
             for m in pat.finditer(ptx)}
    if not decls:
        return ptx
    ptx = pat.sub("", ptx)
    at = re.search(r"^\.address_size \d+\n", ptx, re.M)
    cut = at.end() if at else 0
    return ptx[:cut] + "\n" + "".join(decls.values()) + ptx[cut:]


def ptx_target(ptx: str) -> str:
    """The ``sm_XY[a]`` of a PTX text's ``.target`` directive (sm_90 when it has none)."""
    m = re.search(r"^\.target\s+(sm_\w+)", ptx, re.M)
    return m.group(1) if m else "sm_90"


def ptxas_check(ptx: str, arch: str | None = None) -> str | None:
    """Assemble ``ptx`` with ``ptxas`` (for ``arch``, by default the PTX's own ``.target``)
    when one is installed; None if there is no ptxas. Raises :class:`CudaCodegenError` with
    ptxas's message when it rejects the PTX."""
    exe = shutil.which("ptxas")
    if exe is None:
        return None
    arch = arch or ptx_target(ptx)
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        r = subprocess.run([exe, f"-arch={arch}", src, "-o", os.path.join(d, "k.cubin")],
                           capture_output=True, text=True)
        if r.returncode:
            raise CudaCodegenError(f"ptxas rejected the PTX: {r.stderr[-2000:]}")
    return exe


def sm_version(chip: str) -> int:
    """The compute capability number of ``sm_XY[a|f]`` (``sm_90a`` -> 90, ``sm_120f`` -> 120);
    0 for a name of another form."""
    m = re.fullmatch(r"sm_(\d+)[a-z]?", chip)
    return int(m.group(1)) if m else 0


#: top-level ops of a kernel that touch no memory (index arithmetic): a kernel whose top level
#: is only these and ``scf.if`` branches can wait inside each branch instead of at its top
_NO_MEMORY_TOP = ("gpu.block_id", "gpu.thread_id", "gpu.grid_dim", "gpu.block_dim",
                  "gpu.lane_id", "gpu.subgroup_id", "gpu.return", "scf.if")


def _wait_at(ops: list, wait) -> int | None:
    """Index of the first ``griddepcontrol.wait`` among ``ops`` (one block's), or None."""
    return next((i for i, o in enumerate(ops) if o.name == "nvvm.griddepcontrol"
                 and o.attributes["kind"] == wait), None)


def _open_block(block, wait, trigger) -> None:
    """Make ``block`` wait before any memory access and trigger right after: keep a wait it
    already has at its top level (after a prefetch of constants), else add one first."""
    ops = [o.operation for o in block.operations]
    own = _wait_at(ops, wait)
    if own is not None:
        ip = ir.InsertionPoint(ops[own + 1]) if own + 1 < len(ops) else \
            ir.InsertionPoint(block)
        kinds = (trigger,)
    else:
        ip = ir.InsertionPoint(ops[0]) if ops else ir.InsertionPoint(block)
        kinds = (wait, trigger)
    for kind in kinds:
        ir.Operation.create("nvvm.griddepcontrol", attributes={"kind": kind}, ip=ip)


def add_grid_dependency_control(module: ir.Module) -> int:
    """Open every kernel of ``module`` with ``griddepcontrol.wait`` then
    ``griddepcontrol.launch_dependents`` (PTX ISA 8.0, sm_90: programmatic dependent launch);
    returns the number of kernels changed.

    Why: a decode step is a chain of small kernels, and each one's launch (block scheduling,
    parameter setup) otherwise starts only when the previous one has finished. Launched with
    programmatic stream serialization (the runtime does, when the plan says ``pdl``), a
    kernel's blocks become resident while its predecessor runs its last blocks, and wait at
    the top until the predecessor has completed and its writes are visible. The wait comes
    first, so nothing is read early, and the trigger comes after it, so a kernel's own
    dependents launch only once every earlier grid in the chain has completed: at most two
    grids are resident at a time, and memory ordering is the same as serial launches. A
    kernel launched without the attribute (or on an older GPU) treats both as no-ops.

    A kernel that already waits at the top level of its body (a strategy read only the
    step's constants before it: the GEMV's weight prefetch) keeps its wait, and the trigger
    goes right after it. A kernel whose top level is only index arithmetic and ``scf.if``
    branches (a horizontally fused kernel: one branch per member) waits in each branch
    instead, keeping a member's own wait (so a fused GEMV's prefetch still precedes it) and
    adding one first to a branch without; its threads touch memory only inside a branch.
    Any other kernel gets its wait at the top, even with waits nested in it."""
    wait = ir.Attribute.parse("#nvvm<grid_dep_action wait>", module.context)
    trigger = ir.Attribute.parse("#nvvm<grid_dep_action launch_dependents>", module.context)
    n = 0
    with module.context, ir.Location.unknown():
        for f in gpu_kernels(module):
            block = f.regions[0].blocks[0]
            ops = [o.operation for o in block.operations]
            branchy = _wait_at(ops, wait) is None and \
                any(o.name == "scf.if" for o in ops) and \
                all(o.name.startswith("arith.") or o.name in _NO_MEMORY_TOP for o in ops)
            if branchy:
                for o in ops:
                    if o.name == "scf.if":
                        for region in o.regions:
                            for blk in region.blocks:
                                _open_block(blk, wait, trigger)
            else:
                _open_block(block, wait, trigger)
            n += 1
    return n


def constant_args(plan) -> dict[str, set[int]]:
    """Per kernel of ``plan`` (a :class:`~poot.backends.gpu.plan.GpuPlan`), the positions of
    its arguments bound to a weight or a constant buffer in every launch: memory no kernel
    of the step writes (what :func:`~poot.backends.cuda.hoist_constant_loads.
    hoist_constant_loads` may read before the grid dependency wait)."""
    role = [b["role"] for b in plan.buffers]
    out: dict[str, set[int]] = {}
    for L in plan.launches:
        if L["op"] != "kernel":
            continue
        name = plan.kernels[L["kernel"]]
        mine = {i for i, b in enumerate(L["args"]) if role[b] in ("param", "const")}
        out[name] = out[name] & mine if name in out else mine
    return out


def compile_program(program, chip: str = "sm_90", strategy: str = "auto",
                    progress=None) -> CudaArtifact:
    """Kernels + launch plan of a compiled :class:`~poot.compiler.Program` as an artifact.
    On sm_90 every kernel takes part in programmatic dependent launch
    (:func:`add_grid_dependency_control`; the plan's ``pdl`` tells the runtime).
    ``progress``: a :class:`~poot.progress.Tracker` (per dispatch region, then PTX)."""
    track = Tracker.of(progress)
    caps = program.target.caps
    t0 = time.perf_counter()
    plan = plan_program(program, caps, strategy, progress=track)
    pdl = sm_version(chip) >= 90 and settings.get_flag("POOT_CUDA_PDL")
    if pdl:
        add_grid_dependency_control(plan.module)
        hoist_constant_loads(plan.module, constant_args(plan))
    t1 = time.perf_counter()
    track.add(1)
    track("NVVM to PTX")
    ptx = ptx_text(plan.module, chip)
    t2 = time.perf_counter()
    p = {**plan.launch_plan(),
         "target": {"arch": chip, "subgroup_size": caps.subgroup_size or 32}, "pdl": pdl}
    meta = {"strategy": strategy, "plan_s": round(t1 - t0, 3), "ptx_s": round(t2 - t1, 3),
            "strategies": plan.strategies, "dispatch_kinds": dict(program.dispatches)}
    return CudaArtifact(p, ptx, meta)


def target_chip(caps) -> str:
    """The ``sm_XY[a]`` a CUDA target's features name (sm_90 when none does): the newest,
    and of one number the arch-specific ``a`` variant (``sm_90a``: wgmma) where named."""
    chips = [f for f in caps.features or () if sm_version(f)]
    return max(chips, key=lambda f: (sm_version(f), f.endswith("a")), default="sm_90")


def codegen(program, options=None, progress=None) -> CudaArtifact:
    """``poot.compiler.compile``'s code generator for ``cuda`` (:func:`compile_program`, for
    the chip the target names)."""
    return compile_program(program, chip=target_chip(program.target.caps), progress=progress)


__all__ = ["CudaCodegenError", "codegen", "compile_program", "cuda_target",
           "nvvm_pipeline", "ptx_target", "ptx_text", "ptxas_check"]
