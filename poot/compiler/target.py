"""Targets: a backend plus the capabilities planning decides with.

Capabilities are measured from the device where possible (:func:`host_cpu` reads the host's
cores and ISA flags); a target that lacks something is described by a smaller
:class:`Capabilities`, never by a support list of models or ops.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field, replace

from poot.dialects.types import DType
from poot.errors import PootError
from poot import settings

ALL_DTYPES = frozenset(DType)


@dataclass(frozen=True)
class Capabilities:
    """What a target can run.

    Attributes:
        storage_dtypes: dtypes a buffer may hold (a graph touching another dtype is refused).
        compute_dtypes: dtypes arithmetic may run in; others are legalized to f32 compute
            when f32 is available (storage stays as declared).
        packed_formats: packed weight formats the kernels can decode in place.
        cores: CPU cores (host) or compute units (GPU) available to one step.
        vector_bits: native SIMD width in bits (CPU) for tiling decisions.
        subgroup_size: threads per subgroup/warp (GPU), or None on the CPU.
        max_shared_bytes: on-chip shared memory per workgroup (GPU), 0 on the CPU.
        features: ISA features the codegen may use (e.g. ``avx2``, ``fma``, ``f16c``).
        max_buffer_bytes: the largest buffer a kernel may bind (a WebGPU adapter's
            ``max-storage-buffer-binding-size``), None for no limit.
        max_kernel_buffers: the most buffers one kernel may bind as its arguments, None for
            no limit (horizontal fusion stops short of it; a region past it is refused).
        kv_formats: block-quantized KV cache formats (``q8_0``, ``fp8``) the attention kernels
            read in place (:mod:`poot.dialects.kv_quant`); a KV pool in another is refused.
        packed_layouts: row-interleaved packed formats (``q4_0_r16``, ``q4_1_r16``, ``q8_0_r16``:
            :mod:`poot.dialects.quant_layout`) the target stores 2-D weights of their ggml
            format in, repacked at load time (the storage rule,
            :func:`poot.compiler.planning.storage_type`).
    """

    storage_dtypes: frozenset[DType] = ALL_DTYPES
    compute_dtypes: frozenset[DType] = frozenset({DType.F32, DType.I64, DType.I32, DType.I8,
                                                  DType.I1})
    packed_formats: frozenset[str] = frozenset()
    cores: int = 1
    vector_bits: int = 128
    subgroup_size: int | None = None
    max_shared_bytes: int = 0
    features: frozenset[str] = field(default_factory=frozenset)
    max_buffer_bytes: int | None = None
    max_kernel_buffers: int | None = None
    kv_formats: frozenset[str] = frozenset()
    packed_layouts: frozenset[str] = frozenset()

    def without_dtype(self, dtype: DType) -> "Capabilities":
        """These capabilities less one dtype (storage and compute); for tests and planning."""
        return replace(self, storage_dtypes=self.storage_dtypes - {dtype},
                       compute_dtypes=self.compute_dtypes - {dtype})


@dataclass(frozen=True)
class Target:
    """A backend (``cpu``, ``cuda``, ``vulkan``, ``rocm``) and its capabilities."""

    backend: str
    caps: Capabilities

    def key(self) -> str:
        """A stable text identity, used in compile-cache keys."""
        c = self.caps
        return (f"{self.backend};st={sorted(d.value for d in c.storage_dtypes)};"
                f"co={sorted(d.value for d in c.compute_dtypes)};pk={sorted(c.packed_formats)};"
                f"cores={c.cores};vb={c.vector_bits};sg={c.subgroup_size};"
                f"sh={c.max_shared_bytes};f={sorted(c.features)}"
                + (f";mb={c.max_buffer_bytes}" if c.max_buffer_bytes is not None else "")
                + (f";mk={c.max_kernel_buffers}" if c.max_kernel_buffers is not None else "")
                + (f";kv={sorted(c.kv_formats)}" if c.kv_formats else "")
                + (f";pl={sorted(c.packed_layouts)}" if c.packed_layouts else ""))


def _cpu_flags() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


#: Linux's ``arch_prctl`` codes for asking to use AMX's tile registers
#: (``ARCH_REQ_XCOMP_PERM`` for ``XFEATURE_XTILEDATA``; Documentation/arch/x86/xstate.rst)
_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA = 158, 0x1023, 18


@functools.cache
def amx_permitted() -> bool:
    """Whether this process may run AMX tile instructions: the CPU has AMX-TILE and
    AMX-INT8, ``POOT_CPU_AMX`` is not 0, and Linux granted the tile data state
    (``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``; Linux 5.16 and newer. Without
    the grant the first tile instruction raises SIGILL). Asked once per process; the grant
    covers all its threads, so it is asked here, before any program runs (the host target
    is probed before a program compiles or loads from the cache)."""
    import ctypes
    import platform

    if settings.get_str("POOT_CPU_AMX") == "0" or platform.machine() != "x86_64" or \
            not {"amx_tile", "amx_int8"} <= _cpu_flags():
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) == 0
    except (OSError, AttributeError):
        return False


#: the PyPI wheel that brings LLVM's OpenMP runtime (a dependency of poot)
OPENMP_WHEEL = "cmeel-libomp"

#: file names of an OpenMP runtime with LLVM's ``__kmpc_*`` entry points (LLVM's libomp,
#: Intel's libiomp5); GNU libgomp lacks them
OPENMP_NAMES = ("libomp.so.5", "libomp.so", "libomp.dylib", "libiomp5.so")

#: where a system's OpenMP runtime is looked for (Debian's ``libomp5``: ``libomp.so.5``)
SYSTEM_LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64",
                   "/usr/lib", "/usr/local/lib")


def openmp_runtime() -> str | None:
    """The path of the OpenMP runtime the CPU kernels' parallel loops call (``__kmpc_*``), or
    None (then they run on one thread). Looked for in order: the file ``POOT_CPU_OPENMP``
    names (only that one: a file that is not there means none), the ``cmeel-libomp`` wheel
    that ``pip install`` brings (LLVM's libomp), then a system's (Debian ``libomp5``).
    ``POOT_CPU_OPENMP=0`` says None. Looks for the file only (once per process): loads
    nothing and needs no MLIR."""
    asked = settings.get_str("POOT_CPU_OPENMP")
    if asked == "0":
        return None
    if asked != "1":
        return asked if os.path.isfile(asked) else None
    return _find_openmp()


@functools.cache
def _find_openmp() -> str | None:
    import ctypes.util

    names = _wheel_openmp() + [os.path.join(d, n) for d in SYSTEM_LIB_DIRS
                               for n in OPENMP_NAMES]
    found = next((n for n in names if os.path.exists(n)), None)
    if found is None:                    # the linker's search (runs ldconfig: slower)
        found = ctypes.util.find_library("omp")
    return found if found and os.path.isabs(found) else None


def _wheel_openmp() -> list[str]:
    """Where the :data:`OPENMP_WHEEL` wheel puts the runtime: ``cmeel.prefix/lib/`` of a
    ``sys.path`` folder (cmeel wheels install a prefix beside the packages), in
    :data:`OPENMP_NAMES` order."""
    import sys

    return [os.path.join(d, "cmeel.prefix", "lib", n) for d in sys.path if d
            for n in OPENMP_NAMES]


class InvalidThreads(PootError):
    """``POOT_CPU_THREADS`` or ``OMP_NUM_THREADS`` is set to something other than a positive
    integer (the OpenMP runtime itself would abort on it)."""


def requested_threads() -> int | None:
    """Threads asked for by the environment: ``POOT_CPU_THREADS``, else ``OMP_NUM_THREADS``
    (its first nesting level, ``"4,2"`` -> 4); None when neither is set. Raises
    :class:`InvalidThreads` naming the variable when its value is not a positive integer."""
    for var in ("POOT_CPU_THREADS", "OMP_NUM_THREADS"):
        raw = settings.get_str(var) if var in settings.SETTINGS else os.environ.get(var)
        if raw is None or not raw.strip():
            continue
        first = raw.split(",")[0].strip()
        if not first.isdigit() or int(first) < 1:
            raise InvalidThreads(f"{var}={raw!r}: the CPU kernels' thread count must be a "
                                 f"positive integer")
        return int(first)
    return None


def host_cpu() -> Target:
    """The host CPU as measured here: cores available to this process (``POOT_CPU_THREADS``,
    else ``OMP_NUM_THREADS``, overrides), its SIMD width and ISA features, and ``openmp`` among
    the features when an OpenMP runtime is found (:func:`openmp_runtime`; kernels compiled
    with and without it differ, so their compile-cache keys do too); ``amx_tile`` and
    ``amx_int8`` only where this process may use them (:func:`amx_permitted`)."""
    # lazy: MLIR
    from poot.dialects.lowering.packed import DECODERS  # what the CPU kernels can decode

    flags = _cpu_flags()
    wanted = {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
              "avx_vnni"}
    bits = 512 if "avx512f" in flags else 256 if "avx2" in flags else 128
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    cores = requested_threads() or cores
    features = flags & wanted | ({"openmp"} if openmp_runtime() else set())
    if amx_permitted():                  # tile matmuls (:mod:`poot.backends.cpu.amx`)
        features |= {"amx_tile", "amx_int8"}
    return Target("cpu", Capabilities(packed_formats=frozenset(DECODERS), cores=cores,
                                      vector_bits=bits, features=frozenset(features),
                                      kv_formats=frozenset({"q8_0"}),
                                      packed_layouts=cpu_packed_layouts(features)))


#: the ISA the row-interleaved kernel needs (512-bit ``vpdpbusd``:
#: :meth:`poot.backends.cpu.gemv._K.tile_r16`)
REPACK_FEATURES = frozenset({"avx512f", "avx512bw", "avx512_vnni"})


def cpu_packed_layouts(features) -> frozenset[str]:
    """The row-interleaved layouts (:mod:`poot.dialects.quant_layout`) a CPU with ISA
    ``features`` stores Q4_0 / Q4_1 / Q8_0 weights in: all where its integer kernels read them
    (:data:`REPACK_FEATURES`) and neither ``POOT_CPU_REPACK=0`` nor ``POOT_CPU_INT8=0`` (f32
    activations: no integer kernels) asks otherwise, else none (ggml's layout)."""
    if settings.get_str("POOT_CPU_REPACK") == "0" or settings.get_str("POOT_CPU_INT8") == "0" \
            or not REPACK_FEATURES <= set(features):
        return frozenset()
    return frozenset({"q4_0_r16", "q4_1_r16", "q8_0_r16"})
