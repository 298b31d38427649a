"""The compiled ROCm program as files: ``plan.json`` + one HSA code object per arch.

Read and written with json only (no MLIR): this is what travels to a machine with an AMD GPU.

``plan.json`` (format ``poot-rocm-1``) has the CUDA plan's fields (see
:mod:`poot.backends.cuda.artifact`: ``entry``, ``target``, ``kernels``, ``buffers``,
``launches`` with grid in workgroups and block in work-items, ``dispatches``, ``inputs`` /
``params`` / ``outputs``) plus ``kernel_info`` (per kernel: the explicit kernarg bytes, the
LDS bytes the plan gives it, its workgroup size). ``<arch>.hsaco`` is the ELF code object
(``ld.lld -shared`` output) of each arch the artifact was built for; kernel ``K`` is its
symbol ``K.kd`` (the kernel descriptor).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from poot.backends.gpu.artifact import PlanArtifact, read_plan, write_plan

FORMAT = "poot-rocm-1"


@dataclass
class RocmArtifact(PlanArtifact):
    """``plan`` (module doc), ``code_objects`` (arch name such as ``"gfx942"`` -> HSACO
    bytes), ``meta`` (timings, strategy counts: informational)."""

    plan: dict
    code_objects: dict[str, bytes]
    meta: dict = field(default_factory=dict)

    def save(self, folder: str) -> str:
        """Write ``plan.json`` and ``<arch>.hsaco`` files into ``folder``; returns it."""
        write_plan(folder, self.plan, FORMAT, meta=self.meta, archs=sorted(self.code_objects))
        for arch, data in self.code_objects.items():
            with open(os.path.join(folder, f"{arch}.hsaco"), "wb") as f:
                f.write(data)
        return folder

    @staticmethod
    def load(folder: str) -> "RocmArtifact":
        """Read what :meth:`save` wrote. Raises ``ValueError`` for another format."""
        plan = read_plan(folder, FORMAT)
        code = {}
        for arch in plan.pop("archs"):
            with open(os.path.join(folder, f"{arch}.hsaco"), "rb") as f:
                code[arch] = f.read()
        return RocmArtifact(plan, code, plan.pop("meta", {}))

    def summary(self) -> dict:
        return {**self.plan_summary(), "archs": sorted(self.code_objects),
                "hsaco_bytes": {a: len(b) for a, b in self.code_objects.items()}}


__all__ = ["FORMAT", "RocmArtifact"]
