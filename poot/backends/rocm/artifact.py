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

import json
import os
from dataclasses import dataclass, field

FORMAT = "poot-rocm-1"


@dataclass
class RocmArtifact:
    """``plan`` (module doc), ``code_objects`` (arch name such as ``"gfx942"`` -> HSACO
    bytes), ``meta`` (timings, strategy counts: informational)."""

    plan: dict
    code_objects: dict[str, bytes]
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
        """Write ``plan.json`` and ``<arch>.hsaco`` files into ``folder``; returns it."""
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "plan.json"), "w") as f:
            json.dump({**self.plan, "format": FORMAT, "meta": self.meta,
                       "archs": sorted(self.code_objects)}, f)
        for arch, data in self.code_objects.items():
            with open(os.path.join(folder, f"{arch}.hsaco"), "wb") as f:
                f.write(data)
        return folder

    @staticmethod
    def load(folder: str) -> "RocmArtifact":
        """Read what :meth:`save` wrote. Raises ``ValueError`` for another format."""
        with open(os.path.join(folder, "plan.json")) as f:
            plan = json.load(f)
        if plan.get("format") != FORMAT:
            raise ValueError(f"{folder}: not a {FORMAT} program (format {plan.get('format')})")
        plan.pop("format")
        code = {}
        for arch in plan.pop("archs"):
            with open(os.path.join(folder, f"{arch}.hsaco"), "rb") as f:
                code[arch] = f.read()
        return RocmArtifact(plan, code, plan.pop("meta", {}))

    def summary(self) -> dict:
        L = self.plan["launches"]
        return {"kernels": len(self.plan["kernels"]),
                "launches": sum(1 for x in L if x["op"] == "kernel"),
                "copies": sum(1 for x in L if x["op"] == "copy"),
                "dispatches": len(self.plan["dispatches"]),
                "archs": sorted(self.code_objects),
                "hsaco_bytes": {a: len(b) for a, b in self.code_objects.items()}}


__all__ = ["FORMAT", "RocmArtifact"]
