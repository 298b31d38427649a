"""The wgpu compile target: a SPIR-V target decided by the adapter's features and limits.

wgpu takes SPIR-V through naga, which accepts less than a Vulkan driver; the target declares
only what both the adapter and naga take, so planning and the kernel generator legalize the
rest (they already do for a Vulkan device lacking the feature):

* 8-bit storage never (naga has no ``StorageBuffer8BitAccess``): packed bytes are read as
  32-bit words; no ``Int8`` arithmetic either.
* no 16-bit storage or 16-bit integers (naga has no 16-bit integer type, and MLIR's SPIR-V
  conversion emulates 16-bit storage through them): f16/bf16 tensors are stored as f32
  (:func:`poot.compiler.planning.storage_type`: a bf16 checkpoint is uploaded as f32, at
  twice the bytes), the KV cache defaults to f32 (:func:`poot.models.default_kv_dtype`),
  packed weights decode their f16 scales from 32-bit words; compute is f32.
* the q8_0 KV cache (``Capabilities.kv_formats``): its values plane is read and written
  through the same 32-bit word emulation as any 8-bit storage; its f16 scales plane keeps its
  f16 bytes (``poot-legalize`` widens no q8_0 scales plane,
  :func:`poot.passes.legalize.kv_scale_planes`) and the kernels move it as 32-bit words, two
  scales a word: the flash-decoding kernel decodes a word's half in registers
  (:func:`poot.backends.gpu.strategies.attention.plan.scale_words`), the KV write rounds to
  f16 bits in integer arithmetic and gives each word one thread
  (:mod:`poot.backends.gpu.strategies.scatter`).
* ``Int64`` with ``shader-int64``.
* subgroup operations only with ``subgroup`` *and* a known subgroup size: the generator's
  shuffles are legal at one width only, and adapters report a range, so the device probes
  the size its compute pipelines run with
  (:meth:`~poot.backends.wgpu.runtime.WgpuDevice.capabilities`).
* shared memory: ``max-compute-workgroup-storage-size``; buffers at most
  ``max-storage-buffer-binding-size`` (a larger tensor is refused by planning, naming it);
  kernels bind at most ``max-storage-buffers-per-shader-stage`` buffers, the error word
  included (horizontal fusion stops short of it).

Needs no MLIR: a machine that only runs cached programs computes its compile-cache keys.
"""

from __future__ import annotations

from poot.backends.vulkan.target import vulkan_target


def _subgroup_size(caps: dict) -> int | None:
    """The one subgroup size kernels run with: the probed one, else the adapter's range when
    it is a single value; None when unknown."""
    if caps.get("subgroup_size"):
        return int(caps["subgroup_size"])
    lo, hi = caps.get("subgroup_min_size"), caps.get("subgroup_max_size")
    return int(lo) if lo and lo == hi else None


def wgpu_features(caps: dict) -> frozenset[str]:
    """The Vulkan-style feature names (what :func:`poot.backends.vulkan.codegen.
    vulkan_target` reads) a wgpu adapter's capabilities allow (module doc)."""
    have = set(caps.get("features", ()))
    out = set()
    if "shader-int64" in have:
        out.add("shaderInt64")
    if "subgroup" in have and _subgroup_size(caps):
        out |= {"subgroupBasic", "subgroupShuffle", "subgroupArithmetic"}
    return frozenset(out)


def wgpu_target(caps: dict | None = None):
    """The :class:`~poot.compiler.target.Target` of a wgpu adapter, from
    :meth:`~poot.backends.wgpu.runtime.WgpuDevice.capabilities` (module doc). Without one: the
    WebGPU baseline (no optional feature, 16 KiB shared memory)."""
    caps = dict(caps or {})
    limits = caps.get("limits", {})
    feats = wgpu_features(caps)
    return vulkan_target({
        "features": sorted(feats),
        "subgroup_size": _subgroup_size(caps) if "subgroupBasic" in feats else None,
        "max_shared_bytes": int(limits.get("max-compute-workgroup-storage-size", 16384)),
        # the error word takes one binding of every kernel (the Vulkan ABI)
        "max_kernel_buffers": int(limits.get("max-storage-buffers-per-shader-stage", 8)) - 1,
        "max_buffer_bytes": min(int(limits.get("max-storage-buffer-binding-size", 1 << 27)),
                                int(limits.get("max-buffer-size", 1 << 28))),
    }, backend="wgpu")


def target(device):
    """The registry's ``target`` hook: :func:`wgpu_target` of an opened
    :class:`~poot.backends.wgpu.runtime.WgpuDevice`."""
    return wgpu_target(device.capabilities())
