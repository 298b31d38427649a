"""``poot.backends.cuda.codegen.dynamic_shared_extern``: MLIR's ``gpu.dynamic_shared_memory``
as the PTX ISA's dynamic shared memory (no GPU, no MLIR needed)."""

from __future__ import annotations

from poot.backends.cuda.codegen import dynamic_shared_extern

_DEMOTED = """.version 8.4
.target sm_90a
.address_size 64

\t// .globl\tk1
// __dynamic_shmem__0 has been demoted

.visible .entry k1(
\t.param .u64 k1_param_0
)
{
\t.shared .align 16 .b8 __dynamic_shmem__0;
\t.reg .b64 \t%rd<3>;
\tmov.b64 \t%rd1, __dynamic_shmem__0;
\tret;
}
"""


def test_demoted_one_byte_variable_becomes_a_module_extern_array():
    """The one-byte variable the NVPTX printer moved into the kernel is gone; one ``.extern
    .shared`` array of no size with its alignment stands at module scope, before the
    kernel; its uses are unchanged."""
    out = dynamic_shared_extern(_DEMOTED)
    assert "\t.shared .align 16 .b8 __dynamic_shmem__0;" not in out
    decl = ".extern .shared .align 16 .b8 __dynamic_shmem__0[];"
    assert out.count(decl) == 1
    assert out.index(".address_size 64") < out.index(decl) < out.index(".visible .entry k1(")
    assert "mov.b64 \t%rd1, __dynamic_shmem__0;" in out


def test_ptx_without_dynamic_shared_memory_is_unchanged():
    """Static workgroup buffers (``.shared`` arrays with a size) are left as they are."""
    ptx = _DEMOTED.replace("\t.shared .align 16 .b8 __dynamic_shmem__0;",
                           "\t.shared .align 16 .b8 k1_xs[4096];")
    assert dynamic_shared_extern(ptx) == ptx


def _plan(shared: int) -> dict:
    return {"kernels": ["k_gemm"], "launches": [
        {"op": "kernel", "kernel": 0, "grid": [1, 1, 1], "block": [128, 1, 1], "args": []},
        {"op": "kernel", "kernel": 0, "grid": [4, 1, 1], "block": [128, 1, 1], "args": [],
         "shared": shared}]}


def test_runtime_allows_a_kernel_its_dynamic_workgroup_memory(monkeypatch):
    """A launch past 48 KB of dynamic workgroup memory (the plan's ``shared``) gets its
    kernel allowed that much before any launch; a kernel at or under 48 KB is left alone; a
    device that cannot give the amount is a CudaError naming the kernel and the bytes."""
    import pytest
    from fake_cuda import FakeDriver

    from poot.backends.cuda import runtime
    from poot.backends.cuda.runtime import CudaError, _check_block_sizes

    drv = FakeDriver()
    monkeypatch.setattr(runtime, "_cu", drv)
    _check_block_sizes(_plan(64 << 10), ["f0"])
    assert drv.dynamic_shared == {"f0": 64 << 10}
    drv.dynamic_shared.clear()
    _check_block_sizes(_plan(48 << 10), ["f0"])
    assert drv.dynamic_shared == {}
    with pytest.raises(CudaError, match=r"k_gemm needs 245760 bytes of workgroup memory"):
        _check_block_sizes(_plan(240 << 10), ["f0"])
