"""GPU kernel generation shared by the gpu-dialect backends (CUDA now; Vulkan and ROCm use the
same gpu.modules with their own lowering): :mod:`.kernels` compiles one dispatch region to
kernels + launches, :mod:`.plan` plans a whole step (buffers, launch order)."""
