"""The ROCm device: runs a ROCm artifact (``plan`` + ``code_objects``) on an AMD GPU through
the HSA runtime (:mod:`poot.backends.rocm.hsa`) and AQL packets (:mod:`poot.backends.rocm.aql`).
Imports no MLIR (a GPU machine runs cached programs without it).

    dev = RocmDevice()
    kernel = dev.load(artifact)            # the HSACO for this GPU's gfx arch, loaded once
    rec = dev.record(kernel, bindings)     # the step as AQL packets + kernarg blocks, ONCE
    dev.replay(rec)                        # copy the packets into the queue ring, doorbell

:class:`RocmDevice` follows the executor's Device protocol (:mod:`poot.runtime.device`)
structurally, like :class:`poot.backends.cuda.runtime.CudaDevice`. The artifact interface it
relies on: ``artifact.plan`` with the CUDA plan's keys (``kernels``: kernel names, each the
symbol ``<name>.kd`` in the code object; ``buffers``; ``launches``: ``{"op": "kernel",
"kernel", "grid", "block", "args"}`` with ``grid`` in WORKGROUPS and ``block`` in work-items
per workgroup, as for CUDA, or ``{"op": "copy", "src", "dst", "nbytes"}``; ``inputs``/
``params``/``outputs``) and ``artifact.code_objects``: ``{gfx arch: HSACO bytes}``. A kernel's
explicit arguments are its buffers' device addresses, 8 bytes each, in ``args`` order from
kernarg offset 0 (bare pointers); the rest of the kernarg segment (hidden arguments) is zero.

Device choice: the first GPU agent. Buffers live in its coarse-grained global pool; host
transfers stage through a fine-grained system pool of a CPU agent (the kernarg pool when it
is the only one), made accessible to the GPU; kernarg blocks come from the CPU agent's
kernarg pool (``KERNARG_INIT``), also made accessible to the GPU.

Recording and replay: :meth:`RocmDevice.record` encodes every launch of the step as a
64-byte kernel dispatch packet (barrier bit set: in order; system-scope acquire on the first,
system-scope release on the last, agent scope between) with a kernarg block filled with the
bound buffers' addresses — once. A device-to-device copy of the plan (or of ``copies``)
splits the step into packet segments; a copy runs between them with ``hsa_memory_copy``
after the segment before it completed. :meth:`RocmDevice.replay` copies a segment's
recorded packets into the queue ring at the reserved write index (wrapping modulo the queue
size; when the ring is full it rings the doorbell for what it wrote and waits, bounded, for
the packet processor to free slots), writing each packet's bytes 4..63 first and its 32-bit
header word last with a release store, then rings the doorbell with the index of the last
packet written.

Ring placement: ``hsa_queue_create`` places the ring; ROCr puts it in system memory, where
x86-64 stores are ordered (TSO) and the header store is a release store. A ring in device
memory (``ring="device"``, or ``POOT_ROCM_RING=device``: a ROCr configured so) is mapped
write-combined over PCIe, where stores can drain out of order: then every body is written,
a store fence (:meth:`poot.backends.rocm.hsa.Hsa.store_fence`), the headers, another store
fence, and only then the doorbell. An integrated GPU (APU) has no device memory apart from
system memory: asking it for a device-memory ring raises :class:`RingPlacementError`.

Completion: the last packet of each segment decrements the device's completion signal,
which the host raised by one before submitting; :meth:`RocmDevice.synchronize` waits for 0
at most ``timeout_s`` (default 60, ``POOT_ROCM_TIMEOUT_S``). A timeout, or a queue error
reported by the runtime's queue callback, POISONS the device: that call raises, and every
later call raises :class:`DevicePoisoned` saying why.

Queued transfers: ``upload_async``/``download_async`` wait for the queue and copy at once
(correct, not overlapped): the AQL queue has no copy packets, copies go through
``hsa_memory_copy``.
"""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from poot.backends.gpu.artifact import (Arg, DeviceBuffer, bind_pointers, check_copies, host_bytes,
                                        host_of, kernel_args)
from poot.backends.rocm import aql
from poot.backends.rocm.hsa import (AMD_MEMORY_POOL_GLOBAL_FLAG_COARSE_GRAINED,
                                    AMD_MEMORY_POOL_GLOBAL_FLAG_FINE_GRAINED,
                                    AMD_MEMORY_POOL_GLOBAL_FLAG_KERNARG_INIT,
                                    AMD_SEGMENT_GLOBAL, DEVICE_TYPE_CPU, DEVICE_TYPE_GPU, Hsa,
                                    HsaTimeout, host_supports_release_store)
from poot.runtime.device import DeviceError, row_regions
from poot.runtime.device import Ready
from poot import settings


class RocmError(DeviceError):
    """The ROCm device cannot do what was asked (the message says what and why)."""


class DevicePoisoned(RocmError):
    """The device hit a timeout or a queue error earlier; nothing more runs on it."""


class ArchMismatch(RocmError):
    """The program has no code object for this GPU's architecture."""


class RingPlacementError(RocmError):
    """A queue ring placement this GPU cannot use (a device-memory ring on an APU)."""


#: the most work-items per workgroup an AMD GPU runs
MAX_WORKGROUP = 1024
#: host staging chunk for uploads/downloads, bytes
STAGING_BYTES = 64 << 20


@dataclass
class RocmKernel:
    """A loaded artifact: ``args``, the executable, per plan kernel its symbol info
    (``kernel_object``, ``kernarg_size``, ``kernarg_align``, ``group_size``,
    ``private_size``), the step's private buffers."""

    args: list[Arg]
    artifact: Any
    executable: int
    symbols: list[dict]
    private: dict[int, DeviceBuffer]
    load_s: float = 0.0


@dataclass
class Segment:
    """Part of a recording: AQL ``packets`` (64 bytes each) or one copy ``(dst, src, n)``."""

    packets: list[bytes] = field(default_factory=list)
    copy: tuple | None = None


@dataclass
class RocmRecording:
    """A recorded step: its segments, the kernarg allocation behind its packets, the
    buffer addresses it was recorded over."""

    kernel: RocmKernel
    segments: list[Segment]
    kernargs: int
    pointers: dict[int, int]
    packets: int = 0


class RocmDevice:
    """The first GPU agent of the HSA runtime, with one single-producer AQL queue.

    ``hsa``: an :class:`~poot.backends.rocm.hsa.Hsa` (default: the real library, loaded now);
    ``ring``: ``"system"`` or ``"device"`` (see the module doc; default ``POOT_ROCM_RING`` or
    system); ``timeout_s``: bound of every wait (default ``POOT_ROCM_TIMEOUT_S`` or 60);
    ``queue_packets``: requested queue size (a power of two, capped by the agent's maximum).
    Raises :class:`RocmError` (no GPU agent, no usable pool), :class:`RingPlacementError`,
    :class:`~poot.backends.rocm.hsa.HsaError`, :class:`~poot.backends.rocm.hsa.NoRocmRuntime`.
    """

    name = "rocm"
    overlaps = True          # replay returns once the doorbell is rung

    def __init__(self, hsa: Hsa | None = None, ring: str | None = None,
                 timeout_s: float | None = None, queue_packets: int = 1024):
        if not host_supports_release_store():
            raise RocmError("the ROCm runtime publishes AQL packets with plain aligned stores, "
                            "which are release stores only on x86-64 hosts")
        self.hsa = hsa if hsa is not None else Hsa()
        raw = timeout_s if timeout_s is not None else settings.get_str("POOT_ROCM_TIMEOUT_S")
        try:
            self.timeout_s = float(raw)
        except (TypeError, ValueError):
            self.timeout_s = float("nan")
        if not 0 < self.timeout_s < float("inf"):
            raise RocmError(f"the wait bound (POOT_ROCM_TIMEOUT_S / timeout_s) must be a "
                            f"positive number of seconds, got {raw!r}")
        ring = ring or settings.get_str("POOT_ROCM_RING")
        if ring not in ("system", "device"):
            raise RocmError(f"queue ring placement must be 'system' or 'device', got {ring!r}")
        self._poisoned: str | None = None
        self._queue_error: str | None = None
        h = self.hsa
        agents = h.agents()
        gpus = [a for a in agents if h.agent_device_type(a) == DEVICE_TYPE_GPU]
        if not gpus:
            raise RocmError("no GPU agent: the HSA runtime lists no AMD GPU")
        self.agent = gpus[0]
        self.arch = h.agent_name(self.agent)
        self.device_name = self.arch
        self.wavefront_size = h.agent_wavefront_size(self.agent)
        self.is_apu = h.agent_is_apu(self.agent)
        if ring == "device" and self.is_apu:
            raise RingPlacementError(
                f"{self.arch} is an integrated GPU (APU): it has no device memory apart from "
                f"system memory, so a device-memory queue ring is refused (use ring='system')")
        self.ring = ring
        self._find_pools(agents)
        size = min(int(queue_packets), h.agent_queue_max_size(self.agent))
        if size < 1 or size & (size - 1):
            raise RocmError(f"queue size {size} is not a power of two")
        self.queue = h.queue_create(self.agent, size, self._on_queue_error)
        q = h.queue_struct(self.queue)
        self.ring_base, self.ring_size = int(q.base_address), int(q.size)
        self.doorbell = int(q.doorbell_signal)
        self.done = h.signal_create(0)
        self._staging = 0
        self._staging_bytes = 0
        self._zeros: bytes = b""
        self._executables: dict[int, int] = {}
        self.records = self.replays = self.doorbells = 0
        self.allocated = 0

    # ---- state -------------------------------------------------------------------------
    def capabilities(self) -> dict:
        """What compiling for this GPU needs (``poot devices --json``; the registry's target
        hook reads ``arch``): the agent's gfx ``arch`` (also its one ``features`` entry), its
        wavefront size, whether it is an APU."""
        return {"name": self.device_name, "arch": self.arch, "features": [self.arch],
                "wavefront_size": self.wavefront_size, "apu": bool(self.is_apu)}

    def _on_queue_error(self, status: int, message: str) -> None:
        self._queue_error = f"queue error {status:#x}: {message}"

    def _guard(self) -> None:
        """Raise :class:`DevicePoisoned` if a timeout or queue error poisoned the device."""
        if self._queue_error and not self._poisoned:
            self._poisoned = self._queue_error
        if self._poisoned:
            raise DevicePoisoned(f"the ROCm device ({self.arch}) is poisoned: "
                                 f"{self._poisoned}; nothing more runs on it")

    def _poison(self, why: str) -> None:
        if not self._poisoned:
            self._poisoned = why

    @property
    def poisoned(self) -> str | None:
        """Why the device is poisoned, or None."""
        if self._queue_error and not self._poisoned:
            self._poisoned = self._queue_error
        return self._poisoned

    def _find_pools(self, agents: list[int]) -> None:
        h = self.hsa
        self.device_pool = self.kernarg_pool = self.host_pool = None
        for p in h.pools(self.agent):
            i = h.pool_info(p)
            if i["segment"] == AMD_SEGMENT_GLOBAL and i["alloc"] and \
                    i["flags"] & AMD_MEMORY_POOL_GLOBAL_FLAG_COARSE_GRAINED and \
                    self.device_pool is None:
                self.device_pool = p
        for a in agents:
            if h.agent_device_type(a) != DEVICE_TYPE_CPU:
                continue
            for p in h.pools(a):
                i = h.pool_info(p)
                if i["segment"] != AMD_SEGMENT_GLOBAL or not i["alloc"]:
                    continue
                if i["flags"] & AMD_MEMORY_POOL_GLOBAL_FLAG_KERNARG_INIT:
                    self.kernarg_pool = self.kernarg_pool or p
                elif i["flags"] & AMD_MEMORY_POOL_GLOBAL_FLAG_FINE_GRAINED:
                    self.host_pool = self.host_pool or p
        # ROCr's CPU agent often has one fine-grained pool, the kernarg pool: stage there
        self.host_pool = self.host_pool or self.kernarg_pool
        missing = [n for n, p in (("coarse-grained device", self.device_pool),
                                  ("kernarg", self.kernarg_pool),
                                  ("fine-grained system", self.host_pool)) if p is None]
        if missing:
            raise RocmError(f"{self.arch}: no {' / '.join(missing)} memory pool to allocate "
                            f"from")

    # ---- waits -------------------------------------------------------------------------
    def _wait_idle(self, what: str) -> None:
        """Wait (bounded) until every submitted segment completed; a timeout or queue error
        poisons the device and raises."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            self._guard()
            left = deadline - time.monotonic()
            try:
                self.hsa.signal_wait_eq(self.done, 0, max(0.0, min(left, 0.05)), what)
                return
            except HsaTimeout:
                if time.monotonic() >= deadline:
                    self._poison(f"timed out after {self.timeout_s:g} s waiting for {what}")
                    raise HsaTimeout(f"the ROCm device ({self.arch}) timed out after "
                                     f"{self.timeout_s:g} s waiting for {what}; the device is "
                                     f"now poisoned") from None

    def synchronize(self) -> None:
        """Wait (bounded by ``timeout_s``) for every replay issued so far."""
        self._guard()
        self._wait_idle("the queued work to complete")

    # ---- buffers -----------------------------------------------------------------------
    def _stage(self, nbytes: int) -> int:
        n = min(max(int(nbytes), 4096), STAGING_BYTES)
        if self._staging_bytes < n:
            if self._staging:
                self.hsa.pool_free(self._staging)
            self._staging = self.hsa.pool_allocate(self.host_pool, n)
            self.hsa.allow_access([self.agent], self._staging)
            self._staging_bytes = n
        return self._staging

    def _write_device(self, dst: int, data: memoryview) -> None:
        """Host bytes -> device, through the fine-grained staging buffer, in chunks."""
        n = len(data)
        stage = self._stage(n)
        for off in range(0, n, self._staging_bytes):
            k = min(self._staging_bytes, n - off)
            self.hsa.memory.write(stage, bytes(data[off:off + k]))
            self.hsa.copy(dst + off, stage, k)

    def _read_device(self, src: int, out: np.ndarray) -> None:
        flat = out.reshape(-1).view(np.uint8)
        n = flat.nbytes
        stage = self._stage(n)
        for off in range(0, n, self._staging_bytes):
            k = min(self._staging_bytes, n - off)
            self.hsa.copy(stage, src + off, k)
            flat[off:off + k] = np.frombuffer(self.hsa.memory.read(stage, k), np.uint8)

    def _alloc_bytes(self, nbytes: int) -> int:
        n = max(16, int(nbytes))
        p = self.hsa.pool_allocate(self.device_pool, n)
        if len(self._zeros) < min(n, STAGING_BYTES):
            self._zeros = bytes(min(n, STAGING_BYTES))
        for off in range(0, n, len(self._zeros)):
            k = min(len(self._zeros), n - off)
            self._write_device(p + off, memoryview(self._zeros)[:k])
        self.allocated += n
        return p

    def alloc(self, type_) -> DeviceBuffer:
        """A zero-filled device buffer of ``type_`` (a poot type or
        :class:`~poot.backends.gpu.artifact.BufType`)."""
        self._guard()
        dt, shape, n = host_of(type_)
        return DeviceBuffer(self._alloc_bytes(n), n, dt, shape)

    @staticmethod
    def _host_array(buffer: DeviceBuffer, array) -> np.ndarray:
        """``array`` as contiguous host bytes of ``buffer``'s dtype and size."""
        return host_bytes(buffer, array, RocmError)

    def upload(self, buffer: DeviceBuffer, array) -> None:
        """Write ``array`` into ``buffer`` (after the queued work finished)."""
        self._guard()
        a = self._host_array(buffer, np.asarray(array))
        self._wait_idle("the queued work before an upload")
        self._write_device(buffer.ptr, memoryview(a.reshape(-1).view(np.uint8)))

    def upload_rows(self, buffer: DeviceBuffer, start: int, array) -> None:
        """Write ``array`` over rows ``start..`` (first axis) of ``buffer`` (after the queued
        work finished): one sequence's row of carried state, without the rest."""
        self._guard()
        a = np.asarray(array)
        if a.dtype.itemsize == 2 and buffer.dtype == np.uint16:
            a = a.view(np.uint16)
        a = np.ascontiguousarray(a.astype(buffer.dtype, copy=False))
        row = int(np.prod(buffer.shape[1:], dtype=np.int64)) * buffer.dtype.itemsize
        if a.nbytes % row or start < 0 or start * row + a.nbytes > buffer.nbytes:
            raise RocmError(f"cannot write {list(a.shape)} at row {start} of a buffer of "
                            f"{list(buffer.shape)}")
        self._wait_idle("the queued work before an upload")
        self._write_device(buffer.ptr + start * row, memoryview(a.reshape(-1).view(np.uint8)))

    def upload_async(self, buffer: DeviceBuffer, array) -> None:
        """:meth:`upload` (waits for the queue, then copies: not overlapped)."""
        self.upload(buffer, array)

    def copy_rows_async(self, src: DeviceBuffer, dst: DeviceBuffer,
                        runs: Sequence[tuple[int, int, int]]) -> None:
        """Copy rows of ``src`` into ``dst`` once the queued work finished (``hsa_memory_copy``
        a run of consecutive rows: correct, not overlapped; :meth:`Device.copy_rows_async
        <poot.runtime.device.Device.copy_rows_async>`)."""
        self._guard()
        regions = row_regions(src, dst, runs)
        if regions:
            self._wait_idle("the queued work before a row copy")
        for so, do, n in regions:
            self.hsa.copy(dst.ptr + do, src.ptr + so, n)

    def download(self, buffer: DeviceBuffer) -> np.ndarray:
        """A host copy of ``buffer`` after the queued work finished."""
        self._guard()
        self._wait_idle("the queued work before a download")
        out = np.empty(buffer.shape, buffer.dtype)
        self._read_device(buffer.ptr, out)
        return out

    def download_async(self, buffer: DeviceBuffer) -> Ready:
        """:meth:`download` now, as a ready readback (not overlapped)."""
        return Ready(self.download(buffer))

    # ---- programs ----------------------------------------------------------------------
    def code_object(self, artifact) -> bytes:
        """The artifact's HSACO for this GPU's arch (``gfx942`` also matches a key with
        target features, ``gfx942:sramecc+:xnack-``). Raises :class:`ArchMismatch`."""
        objs = getattr(artifact, "code_objects", None) or {}
        if self.arch in objs:
            return objs[self.arch]
        for k, v in objs.items():
            if k.split(":")[0] == self.arch:
                return v
        raise ArchMismatch(f"this GPU is {self.arch} but the program has code objects only "
                           f"for {sorted(objs) or 'no architecture'}: recompile it for "
                           f"{self.arch}")

    def load(self, program) -> RocmKernel:
        """Load an artifact (or a Program whose ``executable`` is one): its code object for
        this GPU (an executable per distinct HSACO, cached), every plan kernel's symbol,
        the step's private buffers (values, scratch, constants)."""
        self._guard()
        art = getattr(program, "executable", program)
        if not hasattr(art, "plan") or not hasattr(art, "code_objects"):
            raise RocmError(f"{type(art).__name__} is not a compiled ROCm program")
        t0 = time.perf_counter()
        code = self.code_object(art)
        key = hash(bytes(code))
        exe = self._executables.get(key)
        if exe is None:
            exe, _reader = self.hsa.load_code_object(self.agent, bytes(code))
            self._executables[key] = exe
        plan = art.plan
        symbols = [self.hsa.kernel_symbol(exe, self.agent, k) for k in plan["kernels"]]
        for L in plan["launches"]:
            if L["op"] == "kernel":
                b = int(np.prod(L["block"]))
                if b > MAX_WORKGROUP:
                    raise RocmError(f"kernel {plan['kernels'][L['kernel']]} is launched with "
                                    f"{b} work-items per workgroup; AMD GPUs run at most "
                                    f"{MAX_WORKGROUP}")
        private = {}
        for b in plan["buffers"]:
            if b["role"] in ("value", "scratch", "const"):
                buf = DeviceBuffer(self._alloc_bytes(b["nbytes"]), b["nbytes"],
                                 np.dtype(b.get("dtype", "uint8")),
                                 tuple(b.get("shape", [b["nbytes"]])))
                if b["role"] == "const":
                    self._write_device(buf.ptr, memoryview(base64.b64decode(b["data"])))
                private[b["id"]] = buf
        return RocmKernel(kernel_args(plan), art, exe, symbols, private,
                          time.perf_counter() - t0)

    def in_place_outputs(self, kernel: RocmKernel) -> set[str]:
        """Outputs written over their aliased input's own buffer (the plan's ``in_place``)."""
        return {o["name"] for o in kernel.artifact.plan["outputs"] if o.get("in_place")}

    def _pointers(self, kernel: RocmKernel, bindings: Sequence[DeviceBuffer]):
        """(plan buffer id -> address, the copies ``(dst, src, n)`` to run first)."""
        ptrs, pre = bind_pointers(kernel.args, kernel.private, bindings, RocmError)
        return ptrs, [(dst, src, n) for src, dst, n in pre]

    def record(self, kernel: RocmKernel, bindings: Sequence[DeviceBuffer],
               copies: Sequence[tuple[DeviceBuffer, DeviceBuffer]] = ()) -> RocmRecording:
        """Encode the step over ``bindings`` as AQL packets with filled kernarg blocks (once),
        followed by the device-to-device ``copies`` ``(src, dst)`` (equal byte sizes)."""
        self._guard()
        plan = kernel.artifact.plan
        ptrs, pre = self._pointers(kernel, bindings)
        check_copies(copies, DeviceBuffer, RocmError)
        post = [(dst.ptr, src.ptr, src.nbytes) for src, dst in copies]
        steps: list = [("copy", c) for c in pre]
        blocks = []                                 # (offset, bytes) of each kernarg block
        off = 0
        for L in plan["launches"]:
            if L["op"] == "copy":
                steps.append(("copy", (ptrs[L["dst"]], ptrs[L["src"]], int(L["nbytes"]))))
                continue
            sym = kernel.symbols[L["kernel"]]
            args = np.array([ptrs[b] for b in L["args"]], dtype=np.uint64).tobytes()
            size = max(sym["kernarg_size"], len(args), 8)
            align = max(16, sym["kernarg_align"])
            off = -(-off // align) * align
            blocks.append((off, args + bytes(size - len(args))))
            steps.append(("kernel", L, sym, off))
            off += size
        steps += [("copy", c) for c in post]
        base = self.hsa.pool_allocate(self.kernarg_pool, max(off, 64)) if blocks else 0
        if blocks:
            self.hsa.allow_access([self.agent], base)
            for o, data in blocks:
                self.hsa.memory.write(base + o, data)
        segments: list[Segment] = []
        for s in steps:
            if s[0] == "copy":
                segments.append(Segment(copy=s[1]))
                continue
            _, L, sym, o = s
            if not segments or segments[-1].copy is not None:
                segments.append(Segment())
            segments[-1].packets.append((L, sym, base + o))
        npk = 0
        for seg in segments:
            items, seg.packets = seg.packets, []
            for i, (L, sym, ka) in enumerate(items):
                first, last = i == 0, i == len(items) - 1
                grid = [int(g) * int(b) for g, b in zip(L["grid"], L["block"])]
                seg.packets.append(aql.dispatch_packet(
                    sym["kernel_object"], ka, grid, [int(b) for b in L["block"]],
                    group_segment_size=sym["group_size"],
                    private_segment_size=sym["private_size"],
                    completion_signal=self.done if last else 0, barrier=True,
                    acquire=aql.FENCE_SCOPE_SYSTEM if first else aql.FENCE_SCOPE_AGENT,
                    release=aql.FENCE_SCOPE_SYSTEM if last else aql.FENCE_SCOPE_AGENT))
            npk += len(seg.packets)
        self.records += 1
        return RocmRecording(kernel, segments, base, ptrs, npk)

    def release(self, recording: RocmRecording) -> None:
        """Free a recording's kernarg blocks (after the queue finished with them)."""
        self._guard()
        if recording.kernargs:
            self._wait_idle("the queued work before releasing a recording")
            self.hsa.pool_free(recording.kernargs)
            recording.kernargs = 0
            recording.segments = []

    def replay(self, recording: RocmRecording) -> None:
        """Submit a recording again: each packet segment copied into the ring, copies run
        (synchronously) after the segment before them completed."""
        self._guard()
        if not recording.segments and recording.packets:
            raise RocmError("this recording was released")
        for seg in recording.segments:
            if seg.copy is not None:
                self._wait_idle("the packets before a recorded copy")
                dst, src, n = seg.copy
                self.hsa.copy(dst, src, n)
            else:
                self._submit(seg.packets)
        self.replays += 1

    # ---- the queue ---------------------------------------------------------------------
    def _wait_free(self, end: int) -> None:
        """Wait (bounded) until the packet processor read far enough that slots up to write
        index ``end`` (exclusive) are free: ``end - read_index <= ring size``."""
        deadline = time.monotonic() + self.timeout_s
        spin = 0
        while end - self.hsa.queue_load_read_index(self.queue) > self.ring_size:
            self._guard()
            if time.monotonic() >= deadline:
                self._poison(f"timed out after {self.timeout_s:g} s waiting for free queue "
                             f"slots")
                raise HsaTimeout(f"the ROCm device ({self.arch}) timed out after "
                                 f"{self.timeout_s:g} s waiting for free queue slots; the "
                                 f"device is now poisoned")
            spin += 1
            if spin > 64:
                time.sleep(0.0002)

    def _submit(self, packets: list[bytes]) -> None:
        """Write ``packets`` into the ring and ring the doorbell (see the module doc)."""
        h, mem = self.hsa, self.hsa.memory
        wc = self.ring == "device"
        h.signal_add(self.done, 1)           # the last packet's completion decrements it
        pos, n = 0, len(packets)
        while pos < n:
            chunk = min(n - pos, self.ring_size)
            idx = h.queue_add_write_index(self.queue, chunk)
            self._wait_free(idx + chunk)
            slots = [self.ring_base + ((idx + k) % self.ring_size) * aql.PACKET_BYTES
                     for k in range(chunk)]
            if wc:
                for k in range(chunk):
                    mem.write(slots[k] + 4, aql.body(packets[pos + k]))
                h.store_fence()              # bodies reach device memory before any header
                for k in range(chunk):
                    mem.store_release_u32(slots[k], aql.header_word(packets[pos + k]))
                h.store_fence()              # headers drained before the doorbell
            else:
                for k in range(chunk):
                    mem.write(slots[k] + 4, aql.body(packets[pos + k]))
                    mem.store_release_u32(slots[k], aql.header_word(packets[pos + k]))
            h.signal_store(self.doorbell, idx + chunk - 1)
            self.doorbells += 1
            pos += chunk

    def close(self) -> None:
        """Destroy the queue and the completion signal (waits for queued work unless the
        device is poisoned)."""
        if self.queue:
            if not self.poisoned:
                self._wait_idle("the queued work before closing")
            self.hsa.queue_destroy(self.queue)
            self.hsa.signal_destroy(self.done)
            self.queue = 0
            self.hsa.shut_down()


def device_available() -> tuple[bool, str]:
    """(True, gfx arch) when the HSA runtime loads and lists a GPU agent, else (False, why)."""
    try:
        dev = RocmDevice()
    except DeviceError as e:
        return False, str(e)
    arch = dev.arch
    dev.close()
    return True, arch


def open_device() -> RocmDevice:
    """The registry's ``open_device`` hook of ``rocm``: the first GPU agent. A missing HSA
    runtime, no GPU or a failing HSA call is a :class:`~poot.backends.cpu.runtime.DeviceError`."""
    try:
        return RocmDevice()
    except DeviceError:
        raise
    except Exception as e:  # noqa: BLE001  (a broken runtime library)
        raise DeviceError(f"no ROCm device: {type(e).__name__}: {e}") from None


__all__ = ["ArchMismatch", "DevicePoisoned", "RingPlacementError", "RocmDevice", "RocmError",
           "RocmKernel", "RocmRecording", "device_available", "open_device"]
