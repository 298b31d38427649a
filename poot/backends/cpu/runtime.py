"""The CPU device: buffers are numpy arrays, a kernel is the compiled step function of a
:class:`~poot.backends.cpu.codegen.CpuProgram`, a recording is its argument array built once.

Record builds one ranked memref descriptor per bound array and the packed ``void*[]`` of
pointers to them (inputs, weights, outputs: the ``_mlir_ciface_`` convention of
:mod:`poot.backends.cpu`) exactly once. Replay is one ctypes call of the function pointer with
that prebuilt array: no descriptors are rebuilt and no arrays are allocated. Because the
descriptors point at the arrays' memory, the host rewrites a slot buffer in place
(:meth:`CpuDevice.upload` is ``np.copyto``) and the next replay sees the new values.

The recording keeps every bound array, the descriptors and the ExecutionEngine alive (a
descriptor does not keep its array alive, and the function pointer dies with its engine).

State a program updates in place (``CpuProgram.in_place``: a KV pool written by a scatter)
has no out-parameter: its output is listed among the kernel's args (so the engine carries it)
but bound to nothing in the call; :meth:`CpuDevice.in_place_outputs` tells the engine to
bind the input and the output to one buffer, which the call writes.

Recorded copies (``record(..., copies=[(src, dst)])``, e.g. the sampled token fed back into the
token input) are ``np.copyto`` after the call, over views built once. The device is synchronous:
``upload_async`` is :meth:`CpuDevice.upload`, ``download_async`` a finished copy, and
``overlaps`` is False (issuing ahead gains nothing here).
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from poot.compiler import target as host_target
from poot.dialects.types import PootType
from poot.runtime.device import (DeviceError, KernelArg, Ready, host_dtype, host_shape,
                                 row_regions)
from poot import settings


@functools.cache
def _struct(rank: int):
    fields = [("allocated", ctypes.c_void_p), ("aligned", ctypes.c_void_p),
              ("offset", ctypes.c_longlong)]
    if rank:
        fields += [("shape", ctypes.c_longlong * rank), ("strides", ctypes.c_longlong * rank)]
    return type(f"PootMemRef{rank}D", (ctypes.Structure,), {"_fields_": fields})


def descriptor(arr: np.ndarray):
    """A ranked memref descriptor (struct) over ``arr``'s memory (strides in elements);
    ``arr`` must outlive the descriptor. Element types do not matter to the C interface: only
    the pointers, sizes and strides. Shared with :mod:`poot.backends.cpu`."""
    d = _struct(arr.ndim)()
    d.allocated = d.aligned = arr.ctypes.data
    d.offset = 0
    if arr.ndim:
        d.shape = (ctypes.c_longlong * arr.ndim)(*arr.shape)
        d.strides = (ctypes.c_longlong * arr.ndim)(*[s // arr.itemsize for s in arr.strides])
    return d


@dataclass
class CpuKernel:
    """A loaded CPU program: ``args`` (call order, then the in-place outputs, which the call
    does not take), the function pointer and its engine."""

    args: list[KernelArg]
    fn: Any
    engine: Any
    program: Any = None
    in_place: dict = field(default_factory=dict)    # output -> input updated in place


@dataclass
class CpuRecording:
    """A prebuilt call: the packed argument array and everything it points into."""

    kernel: CpuKernel
    packed: Any
    keep: list = field(default_factory=list)
    copies: list = field(default_factory=list)   # (src view, dst) copied after the call


_WARNED_OPENMP: list[int] = []     # the cores of the warning, once it was checked


def warn_no_openmp() -> None:
    """Say once per process, on stderr, when no OpenMP runtime was found and the CPU kernels
    therefore run on one of the host's cores (nothing when there is one core, or
    ``POOT_CPU_OPENMP=0`` asked for one thread). :meth:`CpuDevice.load` calls it: after every
    check of a command's input, so the warning never comes before a one-line user error."""
    import sys

    if _WARNED_OPENMP:
        return
    asked = settings.get_str("POOT_CPU_OPENMP")
    cores = host_target.host_cpu().caps.cores
    _WARNED_OPENMP.append(cores)
    if asked == "0" or cores < 2 or host_target.openmp_runtime() is not None:
        return
    where = (f"POOT_CPU_OPENMP={asked} is not a file" if asked != "1"
             else "no OpenMP runtime found")
    print(f"poot: warning: {where}: the CPU kernels run on 1 of {cores} cores (pip install "
          f"cmeel-libomp, or apt-get install libomp5)", file=sys.stderr)


#: buffers at least this big are carved from a :class:`HugePageArena`
ARENA_MIN_BYTES = 16 << 10


class HugePageArena:
    """Zeroed host memory handed out in 64-byte aligned pieces from anonymous mappings
    advised ``MADV_HUGEPAGE`` (Linux transparent huge pages; elsewhere, or when the kernel
    says no, ordinary pages: the advice is a hint). Chunks of :attr:`CHUNK` bytes (or one
    piece's size, rounded up to 2 MiB) live as long as a buffer cut from them.

    Why: a decode step streams every weight once; on 4 KiB pages the L2 streamer stops at
    each page boundary and the weight set spans tens of thousands of TLB entries."""

    CHUNK = 64 << 20
    HUGE = 2 << 20

    def __init__(self):
        self._chunk: np.ndarray | None = None
        self._used = 0

    def _new_chunk(self, nbytes: int) -> None:
        import mmap

        size = max(self.CHUNK, -(-nbytes // self.HUGE) * self.HUGE)
        m = mmap.mmap(-1, size + self.HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if hasattr(mmap, "MADV_HUGEPAGE"):
            try:
                m.madvise(mmap.MADV_HUGEPAGE)
            except OSError:
                pass
        raw = np.frombuffer(m, np.uint8)
        start = (-raw.ctypes.data) % self.HUGE      # the chunk starts on a 2 MiB boundary
        self._chunk, self._used = raw[start:start + size], 0

    def take(self, nbytes: int) -> np.ndarray:
        """``nbytes`` zeroed bytes (uint8), 64-byte aligned."""
        if self._chunk is None or self._used + nbytes > self._chunk.size:
            self._new_chunk(nbytes)
        out = self._chunk[self._used:self._used + nbytes]
        self._used += -(-nbytes // 64) * 64
        return out


class CpuDevice:
    """The host CPU as an executor device (synchronous). Loading a program warns once when
    no OpenMP runtime was found and more than one core could run the kernels
    (:func:`warn_no_openmp`)."""

    name = "cpu"
    overlaps = False

    def __init__(self):
        self._arena: HugePageArena | None = None
        self.records = 0    # recordings built (argument arrays constructed)
        self.replays = 0    # calls made through a recording

    # ---- buffers -----------------------------------------------------------------------
    def alloc(self, type_: PootType) -> np.ndarray:
        """A zeroed host buffer for ``type_``. Buffers of :data:`ARENA_MIN_BYTES` and up come
        from :class:`HugePageArena` chunks (weights and KV pools are streamed every step:
        on 2 MiB pages the hardware prefetchers are not stopped at every 4 KiB boundary and
        the TLB covers them: SmolLM2 Q4_1 decode measured 1.22x faster on 2 cores, 1.32x on
        one)."""
        shape, dtype = host_shape(type_), host_dtype(type_)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if nbytes < ARENA_MIN_BYTES:
            return np.zeros(shape, dtype)
        if self._arena is None:
            self._arena = HugePageArena()
        return self._arena.take(nbytes).view(dtype).reshape(shape)

    def upload(self, buffer: np.ndarray, array) -> None:
        a = np.asarray(array)
        if a.dtype != buffer.dtype:
            if buffer.dtype == np.uint16 and a.dtype.itemsize == 2:
                a = a.view(np.uint16)          # bf16/f16 as their words
            elif not np.can_cast(a.dtype, buffer.dtype, "same_kind"):
                raise DeviceError(f"cannot write {a.dtype} data into a {buffer.dtype} buffer")
        if a.size != buffer.size:
            raise DeviceError(f"cannot write {list(a.shape)} into a buffer of "
                              f"{list(buffer.shape)}")
        np.copyto(buffer, a.reshape(buffer.shape), casting="same_kind")

    def upload_rows(self, buffer: np.ndarray, start: int, array) -> None:
        """Write ``array`` over rows ``start..`` (first axis) of ``buffer`` in place."""
        a = np.asarray(array)
        if a.dtype != buffer.dtype and buffer.dtype == np.uint16 and a.dtype.itemsize == 2:
            a = a.view(np.uint16)
        buffer[start:start + a.shape[0]] = a

    def download(self, buffer: np.ndarray) -> np.ndarray:
        return buffer.copy()

    def upload_async(self, buffer: np.ndarray, array) -> None:
        self.upload(buffer, array)

    def copy_rows_async(self, src: np.ndarray, dst: np.ndarray,
                        runs: Sequence[tuple[int, int, int]]) -> None:
        """Copy rows of ``src`` into ``dst`` now (:meth:`Device.copy_rows_async
        <poot.runtime.device.Device.copy_rows_async>`)."""
        s, d = src.reshape(-1).view(np.uint8), dst.reshape(-1).view(np.uint8)
        for so, do, n in row_regions(src, dst, runs):
            d[do:do + n] = s[so:so + n]

    def download_async(self, buffer: np.ndarray) -> Ready:
        return Ready(buffer.copy())

    def synchronize(self) -> None:
        pass

    # ---- programs ----------------------------------------------------------------------
    def load(self, program) -> CpuKernel:
        """``program`` (a compiled CPU program, or a cached one holding it) ready to record
        calls of; :class:`DeviceError` when it is not one."""
        warn_no_openmp()
        exe = getattr(program, "executable", program)
        fn = getattr(exe, "_fn", None)
        if fn is None or not hasattr(exe, "inputs"):
            raise DeviceError(f"{type(exe).__name__} is not a compiled CPU program")
        in_place = dict(getattr(exe, "in_place", None) or {})
        types = dict(exe.inputs)
        args = ([KernelArg("input", n, t) for n, t in exe.inputs]
                + [KernelArg("param", n, t) for n, t in exe.params]
                + [KernelArg("output", n, t) for n, t in exe.outputs]
                + [KernelArg("output", o, types[i]) for o, i in in_place.items()])
        return CpuKernel(args, fn, exe.engine, program, in_place)

    def in_place_outputs(self, kernel: CpuKernel) -> set[str]:
        """Outputs the program writes over their input's own buffer (no out-parameter)."""
        return set(kernel.in_place)

    def record(self, kernel: CpuKernel, bindings: Sequence[np.ndarray],
               copies: Sequence[tuple[np.ndarray, np.ndarray]] = ()) -> CpuRecording:
        if len(bindings) != len(kernel.args):
            raise DeviceError(f"{len(bindings)} buffers bound to {len(kernel.args)} arguments")
        for a, buf in zip(kernel.args, bindings):
            if not isinstance(buf, np.ndarray) or not buf.flags.c_contiguous \
                    or buf.shape != host_shape(a.type) or buf.dtype != host_dtype(a.type):
                raise DeviceError(f"{a.role} '{a.name}' needs a contiguous "
                                  f"{list(host_shape(a.type))} x {host_dtype(a.type)} buffer")
        # the step writes its outputs while it still reads its inputs (its entry computes
        # results in their out-parameters, results_in_place.py): no output may overlap
        # another argument
        for i, (a, buf) in enumerate(zip(kernel.args, bindings)):
            if a.role != "output" or a.name in kernel.in_place:
                continue
            for j, (b, other) in enumerate(zip(kernel.args, bindings)):
                if j != i and np.may_share_memory(buf, other) and \
                        not (b.role == "output" and b.name in kernel.in_place):
                    raise DeviceError(f"output '{a.name}' is bound to memory that "
                                      f"{b.role} '{b.name}' also uses")
        descs = [descriptor(b) for a, b in zip(kernel.args, bindings)
                 if not (a.role == "output" and a.name in kernel.in_place)]
        ptrs = [ctypes.pointer(d) for d in descs]
        packed = (ctypes.c_void_p * len(ptrs))(
            *[ctypes.cast(ctypes.pointer(p), ctypes.c_void_p) for p in ptrs])
        self.records += 1
        return CpuRecording(kernel, packed, [list(bindings), descs, ptrs, kernel.engine],
                            copy_views(copies))

    def replay(self, recording: CpuRecording) -> None:
        recording.kernel.fn(recording.packed)
        for src, dst in recording.copies:
            np.copyto(dst, src)
        self.replays += 1


def copy_views(copies) -> list[tuple[np.ndarray, np.ndarray]]:
    """``(src, dst)`` host buffers as ``(src viewed with dst's shape and dtype, dst)``, checked
    once: whole buffers of equal byte size (a recorded device-to-device copy)."""
    out = []
    for src, dst in copies:
        if not (isinstance(src, np.ndarray) and isinstance(dst, np.ndarray)):
            raise DeviceError("a recorded copy needs two device buffers")
        if src.nbytes != dst.nbytes or not src.flags.c_contiguous:
            raise DeviceError(f"cannot copy a {list(src.shape)} x {src.dtype} buffer into "
                              f"a {list(dst.shape)} x {dst.dtype} one")
        out.append((src.view(dst.dtype).reshape(dst.shape), dst))
    return out


__all__ = ["CpuDevice", "CpuKernel", "CpuRecording", "DeviceError", "copy_views", "descriptor"]


def open_device() -> "CpuDevice":
    """The host CPU's device (the registry's ``open_device`` hook of ``cpu``)."""
    return CpuDevice()
