"""The backends this build knows: one registration each, the only table that names them.

A backend is three hooks, each a ``"module:function"`` string so that nothing is imported
until it is used (a GPU machine runs cached programs without MLIR; a machine without a GPU
package never imports its runtime):

* ``codegen(program, options, progress)``: the compiled step's runnable artifact
  (:func:`poot.compiler.compile._codegen` calls it; ``None``: this build has no code
  generator, and :class:`~poot.compiler.compile.NoCodeGenerator` refuses the backend before
  anything is traced).
* ``open_device()``: the process's executor :class:`~poot.runtime.device.Device`; a missing
  runtime package, driver or device raises :class:`~poot.backends.cpu.runtime.DeviceError`, one line
  saying what to install (``None``: no runtime here).
* ``target(device)``: the compile :class:`~poot.compiler.target.Target`. With
  ``target_from_device`` the target is read from the opened device (its subgroup size,
  storage features and limits), so compiling needs the device; otherwise ``device`` is None
  and the target is fixed (the CPU measures its host; CUDA plans per kernel).

Two more hooks keep a backend's compiled programs in the compile cache
(:mod:`poot.compiler.cache`) when its executable is not a plain picklable artifact:

* ``cache_entry(program, files, options, progress)``: the entry fields of a compiled program
  (a dict, pickled; ``None``: nothing to keep), its files written through ``files`` (a
  :class:`~poot.compiler.cache.EntryFiles`; ``object``: the name of the file it runs from).
* ``load_entry(entry, folder)``: the executable of such an entry (its files verified, in
  ``folder``), or ``None`` (stale: compiled again).

Without them the cache pickles the executable itself (CUDA's, Vulkan's, ROCm's artifacts).
``passes``: modules registering the backend's own poot passes (``poot-opt`` imports them).

``shared_gpu``: code generation goes through the shared gpu-dialect plan
(``poot/backends/gpu``), whose sources are then part of the backend's compile-cache key;
``sources`` names other folders it runs (wgpu compiles through the Vulkan code generator).

A new backend is a folder under ``poot/backends`` plus one :data:`BACKENDS` entry.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Backend:
    """One backend's registration (module doc)."""

    name: str
    codegen: str | None
    open_device: str | None
    target: str | None = None
    target_from_device: bool = False
    shared_gpu: bool = False
    #: decode bucket limit by default (sequences decoding at once)
    default_max_batch: int = 64
    #: other ``poot/`` source folders its code generation runs (part of its cache key)
    sources: tuple[str, ...] = ()
    cache_entry: str | None = None
    load_entry: str | None = None
    #: modules registering the backend's own poot passes (for ``poot-opt``)
    passes: tuple[str, ...] = ()


BACKENDS: dict[str, Backend] = {b.name: b for b in (
    Backend("cpu", "poot.backends.cpu.codegen:codegen", "poot.backends.cpu.runtime:open_device",
            "poot.compiler.target:host_cpu", default_max_batch=8,
            cache_entry="poot.backends.cpu.link:cache_entry",
            load_entry="poot.backends.cpu.link:load_entry",
            passes=("poot.backends.cpu.lower_to_cpu_kernels",)),
    Backend("vulkan", "poot.backends.vulkan.codegen:codegen",
            "poot.backends.vulkan.runtime:open_device", "poot.backends.vulkan.target:target",
            target_from_device=True, shared_gpu=True),
    Backend("wgpu", "poot.backends.wgpu.codegen:codegen",
            "poot.backends.wgpu.runtime:open_device", "poot.backends.wgpu.target:target",
            target_from_device=True, shared_gpu=True, sources=("backends/vulkan",)),
    Backend("cuda", "poot.backends.cuda.codegen:codegen",
            "poot.backends.cuda.runtime:open_device", "poot.backends.cuda.artifact:cuda_target",
            shared_gpu=True),
    Backend("rocm", "poot.backends.rocm.codegen:codegen",
            "poot.backends.rocm.runtime:open_device", "poot.backends.rocm.target:target",
            target_from_device=True, shared_gpu=True),
)}


def backend(name: str) -> Backend:
    """The registration of ``name``; ``KeyError`` naming the known ones if there is none
    (callers facing a user turn it into their own typed error first)."""
    try:
        return BACKENDS[name]
    except KeyError:
        raise KeyError(f"unknown backend '{name}' (known: {', '.join(BACKENDS)})") from None


def load_backend_passes() -> None:
    """Import every backend's pass modules (:attr:`Backend.passes`: their poot passes
    register with :mod:`poot.passes.registry` at import), for ``poot-opt``."""
    for reg in BACKENDS.values():
        for module in reg.passes:
            importlib.import_module(module)


def hook(spec: str):
    """The function a ``"module:function"`` hook names (imported now)."""
    module, name = spec.split(":")
    return getattr(importlib.import_module(module), name)
