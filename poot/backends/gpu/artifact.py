"""What the CUDA and ROCm backends share of a compiled step plan, on both sides of the cache:
the artifact's ``plan.json`` (read and written, its fields as properties) and the plan's
buffers as a runtime sees them (host views, loaded kernel arguments, device buffers).

Imports no MLIR (json and numpy only), so that a runtime on a machine without MLIR imports it
(the ``poot.backends.gpu`` package's ``__init__`` imports nothing). It sits in
``poot/backends/gpu`` beside the shared kernel plan that writes these plans because it is
part of that format: a change here changes every GPU backend's compile-cache key, as it
should (their artifacts are what the cache pickles).

The plan's fields (``entry``, ``target``, ``kernels``, ``buffers``, ``launches``,
``dispatches``, ``inputs`` / ``params`` / ``outputs``) are described in
:mod:`poot.backends.cuda.artifact`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import numpy as np


class PlanArtifact:
    """The accessors of an artifact holding a step ``plan`` (a dict): the entry name and the
    plan's inputs, params and outputs (dicts with ``name``, ``buffer``, ``nbytes``...)."""

    plan: dict

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

    def plan_summary(self) -> dict:
        """Counts for reports: kernels, kernel launches, copies, dispatches."""
        launches = self.plan["launches"]
        return {"kernels": len(self.plan["kernels"]),
                "launches": sum(1 for x in launches if x["op"] == "kernel"),
                "copies": sum(1 for x in launches if x["op"] == "copy"),
                "dispatches": len(self.plan["dispatches"])}


def write_plan(folder: str, plan: dict, fmt: str, **fields) -> None:
    """Write ``plan`` as ``folder/plan.json`` (the folder made when missing), tagged with the
    format name ``fmt`` and the extra top-level ``fields`` (``meta``, ``archs``...)."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "plan.json"), "w") as f:
        json.dump({**plan, "format": fmt, **fields}, f)


def read_plan(folder: str, fmt: str) -> dict:
    """The plan :func:`write_plan` wrote into ``folder`` (the format tag removed; the extra
    fields left in). Raises ``ValueError`` for a plan of another format, ``OSError`` when
    there is none."""
    with open(os.path.join(folder, "plan.json")) as f:
        plan = json.load(f)
    if plan.get("format") != fmt:
        raise ValueError(f"{folder}: not a {fmt} program (format {plan.get('format')})")
    plan.pop("format")
    return plan


@dataclass(frozen=True)
class BufType:
    """A buffer's host view: numpy dtype name, shape (bytes of a packed weight: uint8 [n])."""

    dtype: str
    shape: tuple
    nbytes: int


def buf_type(spec: dict) -> BufType:
    """The :class:`BufType` of a plan buffer/input/param/output entry."""
    return BufType(spec.get("dtype", "uint8"), tuple(spec.get("shape", [spec["nbytes"]])),
                   int(spec["nbytes"]))


def host_of(t) -> tuple[np.dtype, tuple, int]:
    """dtype, shape, nbytes of a :class:`BufType` or a poot type (duck-typed, no MLIR)."""
    if isinstance(t, BufType):
        return np.dtype(t.dtype), t.shape, t.nbytes
    if hasattr(t, "format"):                       # PackedType
        return np.dtype(np.uint8), (t.nbytes,), t.nbytes
    dt = t.dtype.value if hasattr(t.dtype, "value") else str(t.dtype)
    np_dt = {"bf16": np.uint16, "f16": np.uint16, "i1": np.uint8}.get(dt)
    np_dt = np.dtype(np_dt) if np_dt else np.dtype(t.dtype.numpy)
    return np_dt, tuple(t.shape), int(np.prod(t.shape, dtype=np.int64)) * np_dt.itemsize


@dataclass
class DeviceBuffer:
    """A device buffer: its device address, size in bytes, and host view (dtype, shape)."""

    ptr: int
    nbytes: int
    dtype: np.dtype
    shape: tuple


def host_bytes(buffer: DeviceBuffer, array, error: type[Exception]) -> np.ndarray:
    """``array`` as contiguous host bytes of ``buffer``'s dtype and size, ready to copy to the
    device: 16-bit floats as their ``uint16`` words, booleans as bytes. Raises ``error`` when
    the sizes differ."""
    a = np.asarray(array)
    if a.dtype.itemsize == 2 and buffer.dtype == np.uint16:
        a = a.view(np.uint16)
    if a.dtype == np.bool_:
        a = a.astype(np.uint8)
    a = np.ascontiguousarray(a.astype(buffer.dtype, copy=False))
    if a.nbytes != buffer.nbytes:
        raise error(f"cannot write {a.nbytes} bytes into a buffer of {buffer.nbytes}")
    return a


@dataclass
class Arg:
    """A loaded step's argument: role, name, :class:`BufType`, plan buffer id."""

    role: str
    name: str
    type: Any
    buffer: int


def kernel_args(plan: dict) -> list[Arg]:
    """A loaded step's arguments: inputs, params (weights), outputs, in the plan's order."""
    return ([Arg("input", x["name"], buf_type(x), x["buffer"]) for x in plan["inputs"]]
            + [Arg("param", x["name"], buf_type(x), x["buffer"]) for x in plan["params"]]
            + [Arg("output", x["name"], buf_type(x), x["buffer"]) for x in plan["outputs"]])


def check_bindings(args, bindings, buffer_cls: type, error: type[Exception]) -> None:
    """Raise ``error`` unless ``bindings`` hold one ``buffer_cls`` buffer of each argument's
    byte size per argument of ``args`` (:class:`Arg`)."""
    if len(bindings) != len(args):
        raise error(f"{len(bindings)} buffers bound to {len(args)} arguments")
    for a, b in zip(args, bindings):
        if not isinstance(b, buffer_cls) or b.nbytes != a.type.nbytes:
            raise error(f"{a.role} '{a.name}' needs a {a.type.nbytes}-byte buffer")


def check_copies(copies, buffer_cls: type, error: type[Exception]) -> None:
    """Raise ``error`` unless every recorded copy ``(src, dst)`` joins two ``buffer_cls``
    buffers of one byte size."""
    for src, dst in copies:
        if not (isinstance(src, buffer_cls) and isinstance(dst, buffer_cls)) \
                or src.nbytes != dst.nbytes:
            raise error("a recorded copy needs two device buffers of equal size")


def bind_pointers(args, private: dict, bindings, error: type[Exception]
                  ) -> tuple[dict[int, int], list[tuple[int, int, int]]]:
    """Plan buffer id -> device address for a step recorded over ``bindings`` (one
    :class:`DeviceBuffer` per argument of ``args``; ``private``: the step's own buffers by
    id), and the copies ``(src, dst, nbytes)`` to run first: an output the plan writes in
    place over an input, bound to another buffer than that input's, starts from the input.
    Raises ``error`` for a count or byte-size mismatch."""
    if len(bindings) != len(args):
        raise error(f"{len(bindings)} buffers bound to {len(args)} arguments")
    ptrs = {i: b.ptr for i, b in private.items()}
    pre = []
    for a, b in zip(args, bindings):
        if b.nbytes != a.type.nbytes:
            raise error(f"{a.role} '{a.name}' needs {a.type.nbytes} bytes, bound {b.nbytes}")
        if a.role == "output" and a.buffer in ptrs and ptrs[a.buffer] != b.ptr:
            pre.append((ptrs[a.buffer], b.ptr, b.nbytes))
        ptrs[a.buffer] = b.ptr
    return ptrs, pre


__all__ = ["Arg", "BufType", "DeviceBuffer", "PlanArtifact", "bind_pointers", "buf_type",
           "check_bindings", "check_copies", "host_of",
           "kernel_args", "read_plan", "write_plan"]
