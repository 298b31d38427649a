"""The compiled Vulkan program: SPIR-V per kernel plus a JSON plan. Imports no MLIR.

On disk (``artifact.save(dir)`` / ``VulkanArtifact.load(dir)``)::

    plan.json     {"format": "poot-vulkan/1", "name", "inputs", "params", "outputs",
                   "aliases", "buffers", "kernels", "steps", "dispatches", ...}
    k<i>.spv      the SPIR-V binary of kernel i (one entry point)

Plan semantics:

* ``buffers[b]``: ``{"kind": input|param|output|temp|const, "name", "index", "nbytes"}``;
  inputs, params and outputs are bound by the engine (``index`` = position in ``inputs``/
  ``params``/``outputs``); temps are allocated by the runtime once per loaded program; a
  const buffer (a dispatch region's constant table, e.g. RoPE frequencies) also carries
  ``"data"`` (hex bytes), uploaded once at load.
* ``kernels[k]``: ``{"name", "entry", "spirv": file, "workgroup": [x, y, z], "bindings": n}``;
  binding i < n-1 is ``args[i]`` of the dispatching step, binding n-1 the error word.
* ``steps``: in order, ``{"op": "dispatch", "kernel", "args": [buffer...], "groups": [x,y,z]}``
  or ``{"op": "copy", "src", "dst", "nbytes"}``; each step sees every earlier step's writes
  (a runtime orders them with barriers or usage scopes; no step runs beside another that
  touches one of its buffers, params and consts aside). A copy whose source and destination are bound to one
  device buffer is no copy (the runtime records nothing for it).
* ``in_place``: output name -> input name for state the kernels write over the input's own
  buffer (a KV pool updated by a scatter): the plan ends with a copy of the input into the
  output, so binding the two to one buffer (what the engine does: no copy, one buffer) and
  binding them apart (a ping-ponging caller: the input is updated, then copied) both give
  the output.
* the error word: two u32, word 0 the error code (:data:`ERR_GATHER_INDEX`...), word 1 the
  kernel index + 1 (``kernels[i]`` and ``kernel_users[i]``, the dispatch functions that use
  it, name it); zero means no fault.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

FORMAT = "poot-vulkan/1"

#: error-word codes a kernel check writes
ERR_GATHER_INDEX = 1
ERROR_NAMES = {ERR_GATHER_INDEX: "gather index out of range"}


@dataclass(frozen=True)
class BufferSpec:
    """The type of a step buffer, without MLIR: element type spelling (``f32``, ``bf16``,
    ``i1``, ``u8`` for packed bytes), shape, byte size, packed format name (or None)."""

    dtype: str
    shape: tuple
    nbytes: int
    packed: str | None = None

    def to_json(self):
        return {"dtype": self.dtype, "shape": list(self.shape), "nbytes": self.nbytes,
                "packed": self.packed}

    @staticmethod
    def from_json(d) -> "BufferSpec":
        return BufferSpec(d["dtype"], tuple(d["shape"]), int(d["nbytes"]), d.get("packed"))


@dataclass
class VulkanKernel:
    name: str
    entry: str
    spirv: bytes
    workgroup: list
    bindings: int


@dataclass
class Step:
    op: str                     # "dispatch" | "copy"
    kernel: int = -1
    args: list = field(default_factory=list)
    groups: list = field(default_factory=lambda: [1, 1, 1])
    src: int = -1
    dst: int = -1
    nbytes: int = 0
    dispatch: int = -1          # ordinal of the dispatch region (-1: the step's own copies)

    def to_json(self):
        if self.op == "copy":
            return {"op": "copy", "src": self.src, "dst": self.dst, "nbytes": self.nbytes,
                    "dispatch": self.dispatch}
        return {"op": "dispatch", "kernel": self.kernel, "args": list(self.args),
                "groups": list(self.groups), "dispatch": self.dispatch}

    @staticmethod
    def from_json(d) -> "Step":
        if d["op"] == "copy":
            return Step("copy", src=d["src"], dst=d["dst"], nbytes=d["nbytes"],
                        dispatch=d.get("dispatch", -1))
        return Step("dispatch", kernel=d["kernel"], args=list(d["args"]),
                    groups=list(d["groups"]), dispatch=d.get("dispatch", -1))


@dataclass
class VulkanArtifact:
    """A compiled step for the Vulkan runtime (see the module doc for the plan)."""

    name: str = "step"
    inputs: list = field(default_factory=list)     # [(name, BufferSpec)]
    params: list = field(default_factory=list)
    outputs: list = field(default_factory=list)
    aliases: dict = field(default_factory=dict)    # output name -> input name (KV writes)
    in_place: dict = field(default_factory=dict)   # output name -> input it is written over
    buffers: list = field(default_factory=list)
    kernels: list = field(default_factory=list)    # [VulkanKernel]
    steps: list = field(default_factory=list)      # [Step]
    dispatches: list = field(default_factory=list)  # [{"name", "kind"}] in step order
    kernel_users: list = field(default_factory=list)  # kernel i -> dispatch functions using it
    checks: dict = field(default_factory=dict)      # kernel name -> kernel checks emitted
    subgroup_size: int | None = None
    features: list = field(default_factory=list)

    @property
    def dispatch_count(self) -> int:
        return sum(1 for s in self.steps if s.op == "dispatch")

    def arguments(self) -> list[tuple[str, str, BufferSpec]]:
        """The step's arguments in binding order: ``(role, name, spec)`` for the inputs,
        params, then outputs."""
        return ([("input", n, sp) for n, sp in self.inputs]
                + [("param", n, sp) for n, sp in self.params]
                + [("output", n, sp) for n, sp in self.outputs])

    def buffer_of(self, i: int, bindings: list, temps: dict):
        """The runtime buffer of plan buffer ``i``: one of ``bindings`` (the step's
        arguments, in :meth:`arguments` order) for an input/param/output, else ``temps[i]``
        (a temp or const buffer the runtime made at load)."""
        d = self.buffers[i]
        k = d["kind"]
        if k == "input":
            return bindings[d["index"]]
        if k == "param":
            return bindings[len(self.inputs) + d["index"]]
        if k == "output":
            return bindings[len(self.inputs) + len(self.params) + d["index"]]
        return temps[i]

    def faulting_kernel(self, word1: int) -> str | None:
        """The kernel an error word's second word names (kernel index + 1), with the
        dispatch functions that use it; None for 0 or an index past the kernels."""
        if not 0 < word1 <= len(self.kernels):
            return None
        users = self.kernel_users[word1 - 1] if word1 <= len(self.kernel_users) else []
        return self.kernels[word1 - 1].name + (f" ({', '.join(users)})" if users else "")

    def plan(self) -> dict:
        return {
            "format": FORMAT, "name": self.name,
            "inputs": [[n, s.to_json()] for n, s in self.inputs],
            "params": [[n, s.to_json()] for n, s in self.params],
            "outputs": [[n, s.to_json()] for n, s in self.outputs],
            "aliases": dict(self.aliases), "in_place": dict(self.in_place),
            "buffers": list(self.buffers),
            "kernels": [{"name": k.name, "entry": k.entry, "spirv": f"k{i}.spv",
                         "workgroup": list(k.workgroup), "bindings": k.bindings}
                        for i, k in enumerate(self.kernels)],
            "steps": [s.to_json() for s in self.steps],
            "dispatches": list(self.dispatches), "kernel_users": list(self.kernel_users),
            "checks": dict(self.checks), "subgroup_size": self.subgroup_size,
            "features": list(self.features),
        }

    def save(self, directory: str | os.PathLike) -> Path:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        for i, k in enumerate(self.kernels):
            (d / f"k{i}.spv").write_bytes(k.spirv)
        (d / "plan.json").write_text(json.dumps(self.plan(), indent=1))
        return d

    @staticmethod
    def from_plan(plan: dict, spirv: list[bytes]) -> "VulkanArtifact":
        if plan.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} plan: {plan.get('format')!r}")
        art = VulkanArtifact(
            name=plan["name"],
            inputs=[(n, BufferSpec.from_json(s)) for n, s in plan["inputs"]],
            params=[(n, BufferSpec.from_json(s)) for n, s in plan["params"]],
            outputs=[(n, BufferSpec.from_json(s)) for n, s in plan["outputs"]],
            aliases=dict(plan.get("aliases", {})), in_place=dict(plan.get("in_place", {})),
            buffers=list(plan["buffers"]),
            kernels=[VulkanKernel(k["name"], k["entry"], spirv[i], list(k["workgroup"]),
                                  int(k["bindings"])) for i, k in enumerate(plan["kernels"])],
            steps=[Step.from_json(s) for s in plan["steps"]],
            dispatches=list(plan.get("dispatches", [])),
            kernel_users=list(plan.get("kernel_users", [])), checks=dict(plan.get("checks", {})),
            subgroup_size=plan.get("subgroup_size"), features=list(plan.get("features", [])))
        return art

    @staticmethod
    def load(directory: str | os.PathLike) -> "VulkanArtifact":
        d = Path(directory)
        plan = json.loads((d / "plan.json").read_text())
        spv = [(d / k["spirv"]).read_bytes() for k in plan["kernels"]]
        return VulkanArtifact.from_plan(plan, spv)


__all__ = ["BufferSpec", "ERR_GATHER_INDEX", "ERROR_NAMES", "FORMAT", "Step", "VulkanArtifact",
           "VulkanKernel"]
