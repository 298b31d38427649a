"""The ROCm compile target of an AMD GPU architecture. Imports no MLIR: a machine that only
runs cached code objects computes its compile-cache keys with it."""

from __future__ import annotations

from poot.compiler.target import Capabilities, Target
from poot.dialects.quant import GGML_NAMES
from poot.errors import PootError

#: per architecture: (wavefront size, compute units of the part it is named for, LDS bytes
#: per workgroup). gfx90a: MI210/MI250 (CDNA 2), gfx942: MI300X (CDNA 3), gfx1100: Radeon RX
#: 7900 XTX (RDNA 3), gfx1151: Ryzen AI Max "Strix Halo" (RDNA 3.5, an APU). Sources: AMD's
#: ISA manuals (wave64 on CDNA, wave32 the default on RDNA) and LLVM's AMDGPUUsage ("Processors").
ARCHS: dict[str, tuple[int, int, int]] = {
    "gfx90a": (64, 104, 64 * 1024),
    "gfx942": (64, 304, 64 * 1024),
    "gfx1100": (32, 96, 64 * 1024),
    "gfx1151": (32, 40, 64 * 1024),
}
DEFAULT_ARCH = "gfx942"
#: the matrix-instruction feature of each wavefront size's archs (CDNA: MFMA; RDNA 3: WMMA)
MATRIX = {64: "mfma", 32: "wmma"}


class UnknownArch(PootError):
    """An AMD GPU architecture this build has no target for."""


def rocm_target(arch: str = DEFAULT_ARCH):
    """The :class:`~poot.compiler.target.Target` of AMD GPU ``arch`` (a key of :data:`ARCHS`;
    a feature suffix such as ``gfx942:sramecc+:xnack-`` is dropped): f32/f16/bf16 storage,
    f32 compute, every packed format decoded in registers, the wavefront size as the subgroup
    size, 64 KiB of LDS, q8_0 KV pools (read by the flash-decoding strategy). Its features name the arch, ``workgroup_view`` (the LLVM lowering
    takes views of workgroup memory) and the arch's matrix instructions: ``mfma`` on CDNA
    (gfx90a, gfx942: ``v_mfma_f32_16x16x16_{f16,bf16}``), ``wmma`` on RDNA 3 (gfx1100,
    gfx1151: ``v_wmma_f32_16x16x16_{f16,bf16}``), which the prefill GEMM uses
    (:func:`poot.backends.gpu.strategies.gemm.matrix_op`). Both archs of one wavefront size
    have the same one, so one plan serves both. No NVIDIA feature is named: no ``mma.sync``,
    no sm_90 vector loads.

    Raises :class:`UnknownArch` naming the known archs."""
    arch = str(arch).split(":")[0]
    if arch not in ARCHS:
        raise UnknownArch(f"no ROCm target for arch {arch!r} (known: {', '.join(ARCHS)})")
    wave, cus, lds = ARCHS[arch]
    return Target("rocm", Capabilities(packed_formats=GGML_NAMES, cores=cus,
                                       subgroup_size=wave, max_shared_bytes=lds,
                                       features=frozenset({arch, "workgroup_view",
                                                           MATRIX[wave]}),
                                       # the flash-decoding kernels dequantize q8_0 KV
                                       # where they load it
                                       kv_formats=frozenset({"q8_0"})))


def target(device):
    """The registry's ``target`` hook: :func:`rocm_target` of an opened
    :class:`~poot.backends.rocm.runtime.RocmDevice` (its agent's arch), or of the ``arch`` in
    capabilities read elsewhere (``poot devices --json``); :data:`DEFAULT_ARCH` when they name
    none (compile-only)."""
    caps = device.capabilities() if device is not None else {}
    gfx = [f for f in caps.get("features", ()) if str(f).startswith("gfx")]
    return rocm_target(caps.get("arch") or (gfx[0] if gfx else DEFAULT_ARCH))


__all__ = ["ARCHS", "DEFAULT_ARCH", "UnknownArch", "rocm_target", "target"]
