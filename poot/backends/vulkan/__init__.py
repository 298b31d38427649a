"""The Vulkan backend: SPIR-V code generation (:mod:`.codegen`, needs MLIR) and the Vulkan
device runtime (:mod:`.runtime`, PyPI ``vulkan``; imports no MLIR). Nothing is imported here,
so the runtime loads on a machine without the MLIR stack."""
