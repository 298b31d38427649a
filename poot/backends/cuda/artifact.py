"""The compiled CUDA program as files: ``plan.json`` + ``kernels.ptx``.

Read and written with json/numpy only (no MLIR): this is what travels to a GPU machine. The
plan's reading and writing is shared with ROCm (:mod:`poot.backends.gpu.artifact`, loaded by
path when this file is loaded on its own, see :mod:`poot.backends.cuda.devcheck`).

``plan.json`` (format ``poot-cuda-1``): ``entry``, ``target`` (arch, subgroup size),
``kernels`` (entry names in the PTX, launch order independent), ``buffers`` (every device
buffer: ``role`` input/param/output/value/scratch/const, ``name``, ``nbytes``, ``dtype``/
``shape`` where it is a step value, ``data`` (base64) for constants), ``launches`` (step order:
kernel launches with grid/block and buffer ids per argument, device-to-device copies),
``dispatches`` (per dispatch call: callee, kind, argument/result buffers, its launch range),
``inputs``/``params``/``outputs`` (name -> buffer; an output names the input it ``aliases``
and whether it is written ``in_place``).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

if __package__:
    from poot.backends.gpu import artifact as plan_io
else:   # a plain file (devcheck.py where the poot package is not installed): load it by path
    import importlib.util

    _spec = importlib.util.spec_from_file_location("poot_gpu_artifact", os.path.join(
        os.path.dirname(os.path.abspath(__file__)), os.pardir, "gpu", "artifact.py"))
    plan_io = sys.modules["poot_gpu_artifact"] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(plan_io)
PlanArtifact, read_plan, write_plan = plan_io.PlanArtifact, plan_io.read_plan, plan_io.write_plan

FORMAT = "poot-cuda-1"


@dataclass
class CudaArtifact(PlanArtifact):
    """``plan`` (module doc), ``ptx`` (the kernels' PTX text), ``meta`` (timings, strategy
    counts: informational)."""

    plan: dict
    ptx: str
    meta: dict = field(default_factory=dict)

    def save(self, folder: str) -> str:
        """Write ``plan.json`` and ``kernels.ptx`` into ``folder``; returns it."""
        write_plan(folder, self.plan, FORMAT, meta=self.meta)
        with open(os.path.join(folder, "kernels.ptx"), "w") as f:
            f.write(self.ptx)
        return folder

    @staticmethod
    def load(folder: str) -> "CudaArtifact":
        """Read what :meth:`save` wrote. Raises ``ValueError`` for another format."""
        plan = read_plan(folder, FORMAT)
        with open(os.path.join(folder, "kernels.ptx")) as f:
            ptx = f.read()
        return CudaArtifact(plan, ptx, plan.pop("meta", {}))

    def summary(self) -> dict:
        return {**self.plan_summary(), "ptx_bytes": len(self.ptx)}


def cuda_target(subgroup_size: int = 32, max_shared_bytes: int = 48 * 1024, cores: int = 132,
                sm: int = 90):
    """The ``sm_{sm}`` compile target (f32/f16/bf16 storage, f32 compute, every packed
    format, q8_0 KV pools, fp8 KV pools from sm_89: :func:`kv_formats_of`), built without
    MLIR: a machine that only runs cached programs computes its compile-cache keys with it
    (:mod:`poot.backends.cuda.codegen` re-exports it). On sm_90 (H100, H200) it also names
    ``sm_90a`` unless ``POOT_CUDA_WGMMA=0``: the PTX then targets sm_90a and the decode
    GEMM uses its warpgroup MMA (:mod:`~poot.backends.gpu.strategies.gemm_decode_wgmma`)."""
    # lazy: this file also loads alone, without the poot package (devcheck on a GPU machine)
    from poot import settings
    # lazy: this file also loads alone, without the poot package (devcheck on a GPU machine)
    from poot.compiler.target import Capabilities, Target
    # lazy: this file also loads alone, without the poot package (devcheck on a GPU machine)
    from poot.dialects.quant import GGML_NAMES

    wgmma = sm == 90 and settings.get_flag("POOT_CUDA_WGMMA")
    feats = {f"sm_{sm}", "workgroup_view"} | ({"sm_90a"} if wgmma else set())
    return Target("cuda", Capabilities(packed_formats=GGML_NAMES, cores=cores,
                                       subgroup_size=subgroup_size,
                                       max_shared_bytes=max_shared_bytes,
                                       features=frozenset(feats),
                                       # the flash-decoding kernels dequantize q8_0 KV
                                       # where they load it, and fp8 KV with the e4m3
                                       # conversions of sm_89 and newer
                                       kv_formats=kv_formats_of(sm)))


def kv_formats_of(sm: int) -> frozenset[str]:
    """The block-quantized KV formats the flash-decoding kernels read on ``sm_{sm}``:
    ``q8_0`` everywhere, ``fp8`` where the device converts e4m3 in hardware (sm_89: Ada,
    sm_90: Hopper, and newer; PTX ``cvt.rn.f16x2.e4m3x2``)."""
    return frozenset({"q8_0", "fp8"} if sm >= 89 else {"q8_0"})


def kernel_nodes(plan: dict) -> dict[str, int]:
    """Graph nodes one step launches: ``kernels`` (kernel launches) and ``copies``
    (device-to-device copies) of the plan."""
    L = plan["launches"]
    return {"kernels": sum(1 for x in L if x["op"] == "kernel"),
            "copies": sum(1 for x in L if x["op"] == "copy")}


__all__ = ["CudaArtifact", "FORMAT", "cuda_target", "kernel_nodes", "kv_formats_of"]
