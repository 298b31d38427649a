"""wgpu's code generator: the Vulkan SPIR-V code generator run for a wgpu target (the same
kernels, binding ABI and plan; :mod:`poot.backends.wgpu.target` decides what they may use)."""

from __future__ import annotations


def codegen(program, options=None, progress=None):
    """The registry's ``codegen`` hook: a :class:`~poot.backends.vulkan.artifact.
    VulkanArtifact` for ``program`` (compiled for a wgpu target)."""
    from poot.backends.vulkan.codegen import codegen as spirv_codegen  # lazy: MLIR

    return spirv_codegen(program, options, progress)
