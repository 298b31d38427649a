"""wgpu: the portable GPU backend. The Vulkan code generator's SPIR-V, compiled for the
adapter's features (:mod:`.target`), run by :class:`.runtime.WgpuDevice` through wgpu-native."""
