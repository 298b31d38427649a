"""The compiled CUDA program as files: ``plan.json`` + ``kernels.ptx``.

Read and written with json/numpy only (no MLIR): this is what travels to a GPU machine.

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

import json
import os
from dataclasses import dataclass, field

FORMAT = "poot-cuda-1"


@dataclass
class CudaArtifact:
    plan: dict
    ptx: str
    meta: dict = field(default_factory=dict)

    @property
    def entry(self) -> str:
        return self.plan["entry"]

    @property
    def inputs(self) -> list[dict]:
        return self.plan["inputs"]

    @property
    def params(self) -> list[dict]:
        return self.plan["params"]

    @property
    def outputs(self) -> list[dict]:
        return self.plan["outputs"]

    def save(self, folder: str) -> str:
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "plan.json"), "w") as f:
            json.dump({**self.plan, "format": FORMAT, "meta": self.meta}, f)
        with open(os.path.join(folder, "kernels.ptx"), "w") as f:
            f.write(self.ptx)
        return folder

    @staticmethod
    def load(folder: str) -> "CudaArtifact":
        with open(os.path.join(folder, "plan.json")) as f:
            plan = json.load(f)
        if plan.get("format") != FORMAT:
            raise ValueError(f"{folder}: not a {FORMAT} program (format {plan.get('format')})")
        with open(os.path.join(folder, "kernels.ptx")) as f:
            ptx = f.read()
        plan.pop("format")
        return CudaArtifact(plan, ptx, plan.pop("meta", {}))

    def summary(self) -> dict:
        L = self.plan["launches"]
        return {"kernels": len(self.plan["kernels"]),
                "launches": sum(1 for x in L if x["op"] == "kernel"),
                "copies": sum(1 for x in L if x["op"] == "copy"),
                "dispatches": len(self.plan["dispatches"]),
                "ptx_bytes": len(self.ptx)}


def cuda_target(subgroup_size: int = 32, max_shared_bytes: int = 48 * 1024, cores: int = 132):
    """The sm_90 compile target (f32/f16/bf16 storage, f32 compute, every packed format),
    built without MLIR: a machine that only runs cached programs computes its compile-cache
    keys with it. Must equal :func:`poot.backends.cuda.codegen.cuda_target` (a test checks
    that their keys agree)."""
    from poot.compiler.target import Capabilities, Target
    from poot.dialects.quant import BY_NAME

    return Target("cuda", Capabilities(packed_formats=frozenset(BY_NAME), cores=cores,
                                       subgroup_size=subgroup_size,
                                       max_shared_bytes=max_shared_bytes,
                                       features=frozenset({"sm_90", "workgroup_view"})))


def kernel_nodes(plan: dict) -> dict[str, int]:
    """Graph nodes one step launches: ``kernels`` (kernel launches) and ``copies``
    (device-to-device copies) of the plan."""
    L = plan["launches"]
    return {"kernels": sum(1 for x in L if x["op"] == "kernel"),
            "copies": sum(1 for x in L if x["op"] == "copy")}


__all__ = ["CudaArtifact", "FORMAT", "cuda_target", "kernel_nodes"]
