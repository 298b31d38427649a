"""Which wgpu adapter poot takes: one of a compute backend (Vulkan, Metal, D3D12), never an
OpenGL one (wgpu's GL backend cannot run the SPIR-V kernels: no 64-bit integers), and a clear
refusal naming the adapters when only OpenGL ones exist (Mesa's llvmpipe on a machine
without a Vulkan driver). Fake adapters: no wgpu needed."""

from __future__ import annotations

from types import SimpleNamespace

from poot.backends.wgpu.runtime import _pick, _refusal


def _adapter(backend: str, kind: str = "CPU", device: str = "dev"):
    return SimpleNamespace(info={"backend_type": backend, "adapter_type": kind,
                                 "device": device})


def test_opengl_adapters_are_never_picked():
    gl = _adapter("OpenGL", device="llvmpipe (LLVM 15.0.6, 256 bits)")
    assert _pick([gl]) is None
    why = _refusal([gl])
    assert "llvmpipe (LLVM 15.0.6, 256 bits) (OpenGL)" in why and "Vulkan driver" in why


def test_a_compute_backend_wins_over_opengl():
    vk = _adapter("Vulkan", "CPU", "lavapipe")
    gl = _adapter("OpenGL", "DiscreteGPU", "gl")
    assert _pick([gl, vk]) is vk
    assert _pick([_adapter("Vulkan", "CPU"), _adapter("Vulkan", "DiscreteGPU", "gpu")]) \
        .info["device"] == "gpu"


def test_no_adapter_at_all_says_so():
    assert "no adapter" in _refusal([])
