"""The Vulkan compile target, from a device's capabilities. Imports no MLIR: a machine that
only runs cached SPIR-V computes its compile-cache keys (and wgpu its target) with it."""

from __future__ import annotations

from poot.compiler.target import Capabilities, Target
from poot.dialects.quant import GGML_NAMES  # every format the kernels decode (no MLIR)
from poot.dialects.types import DType

#: what the SPIR-V lowering assumes about a device it was not told about (lavapipe-like)
DEFAULT_FEATURES = frozenset({"shaderInt64", "shaderInt16", "shaderInt8", "shaderFloat16",
                              "storageBuffer8BitAccess", "storageBuffer16BitAccess",
                              "subgroupBasic", "subgroupShuffle", "subgroupArithmetic"})


def vulkan_target(device_caps: dict | None = None, backend: str = "vulkan"):
    """The compile :class:`~poot.compiler.target.Target` of a Vulkan device, from the runtime's
    :meth:`~poot.backends.vulkan.runtime.VulkanDevice.capabilities` dict (features, subgroup
    size, shared memory). Without one: lavapipe-like defaults, subgroup size unknown (None).
    ``backend``: the target's backend name (``wgpu`` compiles the same SPIR-V for its
    adapter's features)."""
    caps = dict(device_caps or {})
    feats = frozenset(caps.get("features", DEFAULT_FEATURES))
    storage = {DType.F32, DType.I32, DType.I1, DType.I8}
    if "shaderInt64" in feats:
        storage.add(DType.I64)
    if "storageBuffer16BitAccess" in feats:
        storage |= {DType.F16, DType.BF16}
    compute = {DType.F32, DType.I32, DType.I8, DType.I1}
    if "shaderInt64" in feats:
        compute.add(DType.I64)
    return Target(backend, Capabilities(
        storage_dtypes=frozenset(storage), compute_dtypes=frozenset(compute),
        packed_formats=GGML_NAMES, cores=int(caps.get("compute_units", 1)),
        vector_bits=128, subgroup_size=caps.get("subgroup_size"),
        max_shared_bytes=int(caps.get("max_shared_bytes", 32768)), features=feats,
        max_buffer_bytes=caps.get("max_buffer_bytes"),
        max_kernel_buffers=caps.get("max_kernel_buffers"),
        # q8_0 KV: i8 values and f16 scales, dequantized by the flash-decoding strategy
        # where it loads them; without 16-bit storage (wgpu) the kernels move the scales as
        # 32-bit words (wgpu/target.py)
        kv_formats=frozenset({"q8_0"})))


def target(device):
    """The registry's ``target`` hook: :func:`vulkan_target` of an opened
    :class:`~poot.backends.vulkan.runtime.VulkanDevice`."""
    return vulkan_target(device.capabilities())
