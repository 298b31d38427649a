"""The wgpu device: the executor's Device protocol on PyPI ``wgpu`` (wgpu-native in its wheel).

The portable GPU path: any adapter wgpu opens (Vulkan first, then Metal, D3D12, GL), no vendor
SDK. It runs the same compiled program as raw Vulkan -- a
:class:`~poot.backends.vulkan.artifact.VulkanArtifact`, SPIR-V per kernel plus the step plan,
with the same binding ABI -- compiled for the adapter's features
(:func:`poot.backends.wgpu.target.target`). Imports no MLIR.

    dev = WgpuDevice()                            # discrete > integrated > cpu adapter
    kernel = dev.load(program_or_artifact)        # shader modules + pipelines, once
    rec = dev.record(kernel, buffers)             # bind groups, once
    dev.replay(rec); dev.synchronize()            # re-encoded from the cached list, submitted

Semantics (what the wgpu backend guarantees):

* **SPIR-V in, translated by naga**: each kernel's SPIR-V goes through wgpu's shader front
  end (naga) and out to the adapter's native language; what naga rejects is legalized in the
  kernel generator (non-finite constants; 8-bit storage emulated on 32-bit words because the
  target never declares it), so a kernel that still fails is a :class:`WgpuError` naming it.
* **cached encoding, re-encoded per step**: WebGPU command buffers are single-use, so
  :meth:`record` builds everything that can be built once -- one bind group per dispatch
  (binding i = storage buffer i, the last one the error word), the pipelines of
  :meth:`load` -- and keeps the step as a flat list of (pipeline, bind group, groups) and
  copies; :meth:`replay` encodes that list into one compute pass per run of dispatches (a
  copy ends a pass) and submits. wgpu orders the dispatches of a pass (each is its own usage
  scope) as the plan's barriers do. The per-dispatch calls go straight to wgpu-native's C
  functions with the handles taken at record time (wgpu-py's wrappers cost about 12 us a
  dispatch on the H200's host, half a SmolLM2 step), a pipeline set only when it changes;
  where wgpu-py's internals differ, its public calls are used instead.
* **submissions split by the device's limits**: at most ``dispatches_per_submit``
  dispatches per command buffer (default: the whole step); a dispatch whose workgroup count
  exceeds ``max-compute-workgroups-per-dimension``, a kernel binding more storage buffers than
  ``max-storage-buffers-per-shader-stage`` and a buffer larger than
  ``max-storage-buffer-binding-size`` are refused at :meth:`load` / :meth:`alloc`
  (:class:`WgpuLimitExceeded`, naming the limit and the value) before anything runs.
* **error word**: one 8-byte buffer bound last to every kernel (the Vulkan ABI); every queued
  read copies it beside the data it reads, and :meth:`synchronize` copies it alone; a
  nonzero code raises :class:`~poot.backends.vulkan.runtime.KernelFault` (then it is
  cleared), so a fault in a pipelined step surfaces at the next readback.
* **queued work** (``overlaps`` is True): WebGPU's queue orders ``writeBuffer`` and
  submissions, so :meth:`upload_async` is ``queue.write_buffer`` (the bytes are taken at the
  call; the replays queued before it are submitted first) and :meth:`replay` encodes
  without waiting; :meth:`download_async` adds a copy into a mappable buffer, submits
  everything queued in one ``queue.submit`` (each costs wgpu-native tens of microseconds of
  host time) and requests the buffer's map. Waiting for a read first submits what was queued
  behind it, then polls the device until the read's own submission has run (by its index:
  wgpu-py's ``map_sync`` would wait for the latest one). So step n+1 is encoded and on the
  GPU while the host waits for step n's token.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from poot.backends.gpu.artifact import check_bindings, check_copies
from poot.backends.vulkan.artifact import VulkanArtifact
from poot.backends.vulkan.runtime import KernelFault, buffer_bytes, host_layout
from poot.errors import PootError
from poot.runtime.device import DeviceError, Ready, row_regions
from poot import settings


class WgpuError(PootError):
    """A wgpu runtime failure (no adapter, a shader naga rejects, a failed submission)."""


class WgpuLimitExceeded(WgpuError):
    """A program or buffer past one of the adapter's limits (``limit``, ``value``,
    ``allowed``, and ``what`` names the kernel or buffer)."""

    def __init__(self, limit: str, value: int, allowed: int, what: str):
        super().__init__(f"{what} needs {limit} = {value}; this adapter allows {allowed}")
        self.limit, self.value, self.allowed, self.what = limit, value, allowed, what


#: adapter types by preference
_PREFERENCE = {"DiscreteGPU": 0, "IntegratedGPU": 1, "VirtualGPU": 2, "CPU": 3, "Unknown": 4}
#: wgpu backends by preference (SPIR-V is closest to Vulkan's own)
_BACKEND_PREFERENCE = {"Vulkan": 0, "Metal": 1, "D3D12": 2, "OpenGL": 3}
#: the optional features poot asks for when the adapter has them
WANTED_FEATURES = ("shader-int64", "shader-i16", "shader-f16", "subgroup")
#: limits raised to the adapter's own (the WebGPU defaults are far below a GPU's)
RAISED_LIMITS = ("max-storage-buffers-per-shader-stage", "max-storage-buffer-binding-size",
                 "max-buffer-size", "max-compute-workgroup-storage-size",
                 "max-compute-invocations-per-workgroup", "max-compute-workgroup-size-x",
                 "max-compute-workgroup-size-y", "max-compute-workgroup-size-z",
                 "max-compute-workgroups-per-dimension", "max-bindings-per-bind-group")


def _wgpu():
    try:
        import wgpu
    except ImportError as e:
        raise WgpuError(f"the 'wgpu' package does not import ({e}): pip install "
                        f"'poot[wgpu]'") from None
    return wgpu


@dataclass(frozen=True)
class WgpuKernelArg:
    """A loaded kernel's argument (the executor's KernelArg shape, without its import)."""

    role: str
    name: str
    type: Any


@dataclass(eq=False)
class WgpuBuffer:
    buffer: Any
    nbytes: int           # logical bytes
    size: int             # allocated bytes (>= 4, multiple of 4)
    dtype: np.dtype
    shape: tuple


@dataclass(eq=False)
class WgpuLoadedKernel:
    """A loaded program: ``args`` (inputs, params, outputs), its pipelines and temps."""

    args: list
    artifact: VulkanArtifact
    pipelines: list
    layouts: list
    temps: dict = field(default_factory=dict)    # plan buffer id -> WgpuBuffer
    program: Any = None


@dataclass(eq=False)
class WgpuRecording:
    """A step ready to encode: ``ops`` is ``("dispatch", pipeline, bind group, groups,
    pipeline handle, bind group handle)`` (the handles wgpu-native's, or None) or ``("copy",
    src, dst, nbytes)`` in plan order."""

    kernel: WgpuLoadedKernel
    ops: list
    keep: list = field(default_factory=list)
    submits: int = 0


class WgpuReadback:
    """A queued read (the executor's ``Readback``): a mappable buffer holding the read
    buffer's bytes and then the error word.

    With wgpu-native's C functions (:class:`_Native`) the map is requested as soon as the copy
    is submitted and :meth:`wait` polls the device until *that* submission has run: wgpu-py's
    ``map_sync`` polls until the latest submission is done, so reading step n's token would
    also wait for step n+1, which the pipelined decode loop has queued by then. Without them,
    ``map_sync``."""

    def __init__(self, device: "WgpuDevice", mappable, buffer: WgpuBuffer,
                 recording: WgpuRecording, issued: int, index: int | None = None,
                 mapping: "_Mapping | None" = None):
        self.device, self.mappable, self.buffer, self.recording = \
            device, mappable, buffer, recording
        self.issued = issued
        self.index = index            # wgpu-native's submission index of the copy, or None
        self.mapping = mapping        # the map requested at submission (native), or None

    def wait(self) -> np.ndarray:
        if self.mappable is None:
            raise WgpuError("this readback was already waited for or released")
        dev, m, b = self.device, self.mappable, self.buffer
        self.mappable = None
        dev._flush()                  # what was queued behind the read runs while we wait
        if self.mapping is not None:
            raw = dev._native().read_mapped(dev.device, self.mapping, self.index)
        else:
            m.map_sync(dev.wgpu.MapMode.READ)
            try:
                raw = np.frombuffer(m.read_mapped(0, b.size + 8), np.uint8).copy()
            finally:
                m.unmap()
        dev._map_free.append(m)
        dev._raise_fault(raw[b.size:b.size + 8].view(np.uint32), self.recording, self.issued)
        return raw[:b.nbytes].view(b.dtype).reshape(b.shape).copy()

    def release(self) -> None:
        """Drop the read: its mappable buffer is reused once its map has resolved (a native
        map request) or freed with it."""
        if self.mappable is not None and self.mapping is not None:
            self.device._released.append((self.mappable, self.mapping))
        self.mappable = None


@dataclass
class _Mapping:
    """A map request of ``buffer``'s first ``size`` bytes: ``status`` is set by
    wgpu-native's callback (kept alive here until it has run)."""

    size: int
    buffer: Any
    callback: Any = None
    status: int | None = None


class _Native:
    """wgpu-native's C functions that wgpu-py wraps at a cost or not at all: the compute
    pass calls of :meth:`WgpuDevice._encode` (``pass_fns``), submission with an index
    (``wgpuQueueSubmitForIndex``), a device poll that waits for one submission, and buffer
    maps with a callback of our own (no poll thread)."""

    def __init__(self, ffi, lib):
        self.ffi, self.lib = ffi, lib
        self.full_polls = 0       # reads whose own submission's poll left the map pending
        self.pass_fns = (lib.wgpuComputePassEncoderSetPipeline,
                         lib.wgpuComputePassEncoderSetBindGroup,
                         lib.wgpuComputePassEncoderDispatchWorkgroups, ffi.NULL)

    @classmethod
    def find(cls) -> "_Native | None":
        try:
            from wgpu.backends.wgpu_native._ffi import ffi, lib

            for name in ("wgpuComputePassEncoderSetPipeline", "wgpuQueueSubmitForIndex",
                         "wgpuDevicePoll", "wgpuBufferMapAsync",
                         "wgpuBufferGetConstMappedRange", "wgpuBufferUnmap"):
                getattr(lib, name)
            return cls(ffi, lib)
        except (ImportError, AttributeError):
            return None

    def submit(self, queue, cbs) -> int:
        """``queue.submit(cbs)``; returns the submission's index."""
        ids = self.ffi.new("WGPUCommandBuffer[]", [cb._internal for cb in cbs])
        return int(self.lib.wgpuQueueSubmitForIndex(queue._internal, len(cbs), ids))

    def request_map(self, buffer, size: int) -> _Mapping:
        """Ask for ``buffer``'s first ``size`` bytes mapped for reading once the GPU is done
        with it (its copy is submitted)."""
        ffi, lib = self.ffi, self.lib
        mapping = _Mapping(size, buffer)

        def done(status, _message, _u1, _u2):
            mapping.status = int(status)

        mapping.callback = ffi.callback("void(WGPUMapAsyncStatus, WGPUStringView, void *, "
                                        "void *)", done)
        info = ffi.new("WGPUBufferMapCallbackInfo *")
        info.mode = lib.WGPUCallbackMode_AllowProcessEvents
        info.callback = mapping.callback
        lib.wgpuBufferMapAsync(buffer._internal, lib.WGPUMapMode_Read, 0, size, info[0])
        return mapping

    def poll(self, device, index: int | None) -> None:
        """Block until submission ``index`` (None: every submission) has run, and run the
        callbacks of what finished."""
        idx = self.ffi.NULL if index is None else self.ffi.new("WGPUSubmissionIndex *", index)
        self.lib.wgpuDevicePoll(device._internal, True, idx)

    def read_mapped(self, device, mapping: _Mapping, index: int | None) -> np.ndarray:
        """The mapped bytes (copied), after waiting for submission ``index``; unmaps."""
        if mapping.status is None:
            self.poll(device, index)
        if mapping.status is None:       # not resolved by that submission: wait for all
            self.full_polls += 1
            self.poll(device, None)
        if mapping.status != self.lib.WGPUMapAsyncStatus_Success:
            raise WgpuError(f"mapping a readback buffer failed (status {mapping.status})")
        lib, buf = self.lib, mapping.buffer
        ptr = lib.wgpuBufferGetConstMappedRange(buf._internal, 0, mapping.size)
        raw = np.frombuffer(self.ffi.buffer(ptr, mapping.size), np.uint8).copy()
        lib.wgpuBufferUnmap(buf._internal)
        mapping.callback = None
        return raw


#: wgpu backends that run poot's SPIR-V compute kernels. wgpu's OpenGL backend translates
#: them to GLSL, which has no 64-bit integers (naga: "Using `u64` values requires
#: SHADER_INT64") among other limits: an OpenGL adapter (Mesa's llvmpipe on a machine without
#: a Vulkan driver, say) is refused, never picked.
COMPUTE_BACKENDS = ("Vulkan", "Metal", "D3D12")


def _pick(adapters):
    """The preferred adapter that runs compute kernels (:data:`COMPUTE_BACKENDS`), else
    None."""
    def rank(a):
        info = a.info
        return (_BACKEND_PREFERENCE.get(info.get("backend_type"), 9),
                _PREFERENCE.get(info.get("adapter_type"), 9))
    usable = [a for a in adapters if a.info.get("backend_type") in COMPUTE_BACKENDS]
    return min(usable, key=rank) if usable else None


def _refusal(adapters) -> str:
    """Why none of ``adapters`` is usable (each named with its backend)."""
    if not adapters:
        return "wgpu found no adapter (no Vulkan/Metal/D3D12 driver)"
    names = ", ".join(f"{a.info.get('device') or '?'} ({a.info.get('backend_type')})"
                      for a in adapters)
    return (f"wgpu found no Vulkan, Metal or D3D12 adapter, only {names}: its OpenGL "
            f"backend cannot run poot's compute kernels (no 64-bit integers); install a "
            f"Vulkan driver (Debian: mesa-vulkan-drivers)")


class WgpuDevice:
    """The executor Device for wgpu (see the module doc).

    Args:
        adapter_index: pick this adapter of ``wgpu.gpu.enumerate_adapters_sync()`` instead
            of the preferred one (``POOT_WGPU_ADAPTER`` sets it too).
        dispatches_per_submit: most dispatches per command buffer (None: the whole step).

    Raises:
        WgpuError: no ``wgpu`` package or no adapter.
    """

    name = "wgpu"
    overlaps = True           # replays and queued writes and reads return before they ran

    def __init__(self, adapter_index: int | None = None,
                 dispatches_per_submit: int | None = None):
        wgpu = self.wgpu = _wgpu()
        try:
            adapters = wgpu.gpu.enumerate_adapters_sync()
        except Exception as e:  # noqa: BLE001  (wgpu-native's own loader errors)
            raise WgpuError(f"wgpu found no adapter: {type(e).__name__}: {e}") from None
        if adapter_index is None:
            adapter_index = settings.get_int("POOT_WGPU_ADAPTER")
        if adapter_index is not None:
            if not 0 <= adapter_index < len(adapters):
                raise WgpuError(f"adapter {adapter_index} does not exist ({len(adapters)} "
                                f"adapters)")
            adapter = _pick([adapters[adapter_index]])
            if adapter is None:
                raise WgpuError(_refusal([adapters[adapter_index]]))
        else:
            adapter = _pick(adapters)
        if adapter is None:
            raise WgpuError(_refusal(adapters))
        self.adapter = adapter
        self.info = dict(adapter.info)
        feats = set(adapter.features)
        self.features = sorted(f for f in WANTED_FEATURES if f in feats)
        alim = dict(adapter.limits)
        want = {k: alim[k] for k in RAISED_LIMITS if k in alim}
        self.device = adapter.request_device_sync(required_features=self.features,
                                                  required_limits=want)
        self.limits = dict(self.device.limits)
        self.queue = self.device.queue
        if dispatches_per_submit is not None and dispatches_per_submit < 1:
            raise WgpuError("dispatches_per_submit must be at least 1")
        self.dispatches_per_submit = dispatches_per_submit
        usage = wgpu.BufferUsage
        self._storage_usage = usage.STORAGE | usage.COPY_SRC | usage.COPY_DST
        self._err = self._make_buffer(8, np.uint32, (2,))
        self._err_read = self.device.create_buffer(size=8, usage=usage.MAP_READ
                                                   | usage.COPY_DST)
        self._pending: WgpuRecording | None = None    # replayed since the last error check
        self._map_free: list = []                      # mappable readback buffers
        self._unsubmitted: list = []                   # replayed command buffers, queued
        self._last_index: int | None = None            # submission index of the last submit
        self._released: list = []                      # (mappable, _Mapping) of dropped reads
        self._fault: tuple = (-1, None)                # (submissions, (code, kernel)) raised
        self.replays = self.records = self.submits = 0
        self.subgroup_size = self._probe_subgroup_size() if "subgroup" in self.features \
            else None

    def _probe_subgroup_size(self) -> int | None:
        """The subgroup size compute pipelines actually run with: a probe kernel writes the
        ``subgroup_size`` builtin at three workgroup sizes; one value seen everywhere is the
        size (the adapter only reports a min..max range), else None (then the target uses
        no subgroup operations)."""
        seen = set()
        for wg in (32, 64, 256):
            src = (f"@group(0) @binding(0) var<storage, read_write> out: array<u32>;\n"
                   f"@compute @workgroup_size({wg})\n"
                   f"fn main(@builtin(local_invocation_index) i: u32, "
                   f"@builtin(subgroup_size) s: u32) {{ out[i] = s; }}\n")
            try:
                mod = self.device.create_shader_module(code=src)
                pipe = self.device.create_compute_pipeline(
                    layout="auto", compute={"module": mod, "entry_point": "main"})
                buf = self.device.create_buffer(size=4 * wg, usage=self._storage_usage)
                group = self.device.create_bind_group(
                    layout=pipe.get_bind_group_layout(0),
                    entries=[{"binding": 0, "resource": {"buffer": buf}}])
                enc = self.device.create_command_encoder()
                cpass = enc.begin_compute_pass()
                cpass.set_pipeline(pipe)
                cpass.set_bind_group(0, group)
                cpass.dispatch_workgroups(1)
                cpass.end()
                self.queue.submit([enc.finish()])
                seen |= set(np.frombuffer(self.queue.read_buffer(buf), np.uint32).tolist())
            except Exception:  # noqa: BLE001  (no subgroup builtin here: no size)
                return None
        return int(seen.pop()) if len(seen) == 1 else None

    # ---- what the compiler needs -------------------------------------------------------------
    def capabilities(self) -> dict:
        """The adapter as :func:`poot.backends.wgpu.target.target` reads it: wgpu feature
        names, subgroup sizes (min, max), limits."""
        info = self.info
        sg_min = info.get("subgroup_min_size", info.get("stackgroup_min_size"))
        sg_max = info.get("subgroup_max_size", info.get("stackgroup_max_size"))
        return {"name": info.get("device", ""), "adapter_type": info.get("adapter_type"),
                "backend_type": info.get("backend_type"), "features": list(self.features),
                "subgroup_min_size": sg_min, "subgroup_max_size": sg_max,
                "subgroup_size": self.subgroup_size,
                "limits": {k: int(v) for k, v in self.limits.items()
                           if isinstance(v, int)}}

    def memory_budget(self) -> None:
        """wgpu reports no memory budget."""
        return None

    # ---- buffers -----------------------------------------------------------------------------
    def _make_buffer(self, nbytes: int, dtype, shape, what: str = "a buffer") -> WgpuBuffer:
        size = max(4, (int(nbytes) + 3) // 4 * 4)
        cap = int(self.limits.get("max-storage-buffer-binding-size", size))
        if size > cap:
            raise WgpuLimitExceeded("max-storage-buffer-binding-size", size, cap, what)
        buf = self.device.create_buffer(size=size, usage=self._storage_usage)
        return WgpuBuffer(buf, int(nbytes), size, np.dtype(dtype), tuple(shape))

    def alloc(self, type_) -> WgpuBuffer:
        """A zero-filled buffer of ``type_`` (BufferSpec or poot type; WebGPU zero-fills)."""
        dtype, shape, nbytes = host_layout(type_)
        return self._make_buffer(nbytes, dtype, shape, what=f"a {list(shape)} buffer")

    def _write(self, buffer: WgpuBuffer, offset: int, raw: np.ndarray) -> None:
        """``queue.write_buffer``: ordered after every submission so far and before the next
        one, so no wait is needed."""
        n = raw.size
        if offset % 4:
            raise WgpuError(f"a write at byte {offset} is not 4-byte aligned")
        self._flush()                       # the replays issued before it read the old bytes
        if n % 4:                           # WebGPU writes whole words: keep the tail's bytes
            tail = self._read(buffer, offset + n - n % 4, 4)
            raw = np.concatenate([raw, tail[n % 4:]])
        self.queue.write_buffer(buffer.buffer, offset, raw)

    def _read(self, buffer: WgpuBuffer, offset: int, size: int) -> np.ndarray:
        self._flush()
        return np.frombuffer(self.queue.read_buffer(buffer.buffer, offset, size), np.uint8)

    def upload(self, buffer: WgpuBuffer, array) -> None:
        raw = buffer_bytes(array, buffer.dtype, WgpuError)
        if raw.size != buffer.nbytes:
            raise WgpuError(f"cannot write {list(np.shape(array))} into a buffer of "
                            f"{list(buffer.shape)}")
        self._write(buffer, 0, raw)

    def upload_rows(self, buffer: WgpuBuffer, start: int, array) -> None:
        """Write ``array`` over rows ``start..`` (first axis) of ``buffer``."""
        raw = buffer_bytes(array, buffer.dtype, WgpuError)
        row = int(np.prod(buffer.shape[1:], dtype=np.int64)) * buffer.dtype.itemsize
        off = start * row
        if raw.size % row or start < 0 or off + raw.size > buffer.nbytes:
            raise WgpuError(f"cannot write {list(np.shape(array))} at row {start} of a buffer "
                            f"of {list(buffer.shape)}")
        self._write(buffer, off, raw)

    def download(self, buffer: WgpuBuffer) -> np.ndarray:
        if self._pending is not None:
            self.synchronize()
        raw = self._read(buffer, 0, buffer.size)[:buffer.nbytes]
        return raw.view(buffer.dtype).reshape(buffer.shape).copy()

    def upload_async(self, buffer: WgpuBuffer, array) -> None:
        """:meth:`upload`: already queued (``queue.write_buffer`` takes the bytes at once and
        runs in queue order)."""
        self.upload(buffer, array)

    def copy_rows_async(self, src: WgpuBuffer, dst: WgpuBuffer,
                        runs: Sequence[tuple[int, int, int]]) -> None:
        """Queue copies of rows of ``src`` into ``dst`` (``copy_buffer_to_buffer``, a run of
        consecutive rows each, 4-byte aligned) after the work issued so far: the command
        buffer goes out with the next submission, after any write queued before this call
        (:meth:`Device.copy_rows_async <poot.runtime.device.Device.copy_rows_async>`)."""
        regions = row_regions(src, dst, runs)
        if not regions:
            return
        if any(x % 4 for r in regions for x in r):
            raise WgpuError(f"row copies of {np.dtype(src.dtype)} rows are not 4-byte aligned")
        enc = self.device.create_command_encoder()
        for so, do, n in regions:
            enc.copy_buffer_to_buffer(src.buffer, so, dst.buffer, do, n)
        self._unsubmitted.append(enc.finish())

    def download_async(self, buffer: WgpuBuffer):
        """Queue a read of ``buffer`` (and of the error word) after the work issued so far:
        a :class:`WgpuReadback` (a finished one when nothing was replayed since the last
        error check)."""
        if self._pending is None:
            return Ready(self.download(buffer))
        usage = self.wgpu.BufferUsage
        need = buffer.size + 8
        self._reap_released()
        m = next((b for b in self._map_free if b.size >= need), None)
        if m is None:
            m = self.device.create_buffer(size=max(need, 256),
                                          usage=usage.MAP_READ | usage.COPY_DST)
        else:
            self._map_free.remove(m)
        enc = self.device.create_command_encoder()
        enc.copy_buffer_to_buffer(buffer.buffer, 0, m, 0, buffer.size)
        enc.copy_buffer_to_buffer(self._err.buffer, 0, m, buffer.size, 8)
        self._unsubmitted.append(enc.finish())
        self._flush()
        native = self._native()
        mapping = native.request_map(m, need) if native is not None else None
        return WgpuReadback(self, m, buffer, self._pending, self.submits, self._last_index,
                            mapping)

    def _reap_released(self) -> None:
        """Unmap the buffers of dropped reads whose maps have resolved; they are free again."""
        keep = []
        for m, mapping in self._released:
            if mapping.status is None:
                keep.append((m, mapping))
                continue
            lib = self._native().lib
            if mapping.status == lib.WGPUMapAsyncStatus_Success:
                lib.wgpuBufferUnmap(m._internal)
                self._map_free.append(m)
            mapping.callback = None
        self._released = keep

    # ---- programs ----------------------------------------------------------------------------
    def in_place_outputs(self, kernel: WgpuLoadedKernel) -> set[str]:
        """Outputs the program writes over their aliased input's own buffer."""
        return set(kernel.artifact.in_place)

    def load(self, program) -> WgpuLoadedKernel:
        """Load a compiled step: a Program whose ``executable`` is a VulkanArtifact, an
        artifact, or an artifact directory. Raises :class:`WgpuLimitExceeded` for a kernel
        past the adapter's limits and :class:`WgpuError` for one naga rejects."""
        wgpu = self.wgpu
        art = getattr(program, "executable", program)
        if isinstance(art, (str, os.PathLike)):
            art = VulkanArtifact.load(Path(art))
        if not isinstance(art, VulkanArtifact):
            raise WgpuError(f"{type(art).__name__} is not a compiled SPIR-V program")
        lim = self.limits
        max_bind = int(lim.get("max-storage-buffers-per-shader-stage", 8))
        max_groups = int(lim.get("max-compute-workgroups-per-dimension", 65535))
        max_inv = int(lim.get("max-compute-invocations-per-workgroup", 256))
        for k in art.kernels:
            if k.bindings > max_bind:
                raise WgpuLimitExceeded("max-storage-buffers-per-shader-stage", k.bindings,
                                        max_bind, f"kernel {k.name}")
            inv = int(np.prod(k.workgroup))
            if inv > max_inv:
                raise WgpuLimitExceeded("max-compute-invocations-per-workgroup", inv, max_inv,
                                        f"kernel {k.name}")
        for s in art.steps:
            if s.op == "dispatch" and max(int(g) for g in s.groups) > max_groups:
                raise WgpuLimitExceeded("max-compute-workgroups-per-dimension",
                                        max(int(g) for g in s.groups), max_groups,
                                        f"a dispatch of kernel {art.kernels[s.kernel].name}")
        args = [WgpuKernelArg(*a) for a in art.arguments()]
        pipelines, layouts = [], []
        for k in art.kernels:
            try:
                mod = self.device.create_shader_module(label=k.name, code=k.spirv)
            except Exception as e:  # noqa: BLE001  (naga's validation error)
                why = " ".join(line.strip() for line in str(e).splitlines() if line.strip())
                raise WgpuError(f"wgpu rejected kernel {k.name}: {why[:600]}") from None
            bgl = self.device.create_bind_group_layout(entries=[
                {"binding": i, "visibility": wgpu.ShaderStage.COMPUTE,
                 "buffer": {"type": wgpu.BufferBindingType.storage}}
                for i in range(k.bindings)])
            pl = self.device.create_pipeline_layout(bind_group_layouts=[bgl])
            pipelines.append(self.device.create_compute_pipeline(
                label=k.name, layout=pl, compute={"module": mod, "entry_point": k.entry}))
            layouts.append(bgl)
        temps = {}
        for i, b in enumerate(art.buffers):
            if b["kind"] in ("temp", "const"):
                n = int(b["nbytes"])
                temps[i] = self._make_buffer(n, np.uint8, (n,), what=f"temp buffer {i}")
                if b["kind"] == "const":
                    data = np.frombuffer(bytes.fromhex(b["data"]), np.uint8)
                    t = temps[i]
                    t.nbytes, t.shape = data.size, (data.size,)
                    self.upload(t, data)
        return WgpuLoadedKernel(args, art, pipelines, layouts, temps, program)

    def record(self, kernel: WgpuLoadedKernel, bindings: Sequence[WgpuBuffer],
               copies: Sequence[tuple[WgpuBuffer, WgpuBuffer]] = ()) -> WgpuRecording:
        """Bind groups for every dispatch, once; the step's encoding as a flat list ending
        with the whole-buffer ``copies`` ``(src, dst)`` (equal byte sizes)."""
        art = kernel.artifact
        check_bindings(kernel.args, bindings, WgpuBuffer, WgpuError)
        check_copies(copies, WgpuBuffer, WgpuError)
        def buf(i) -> WgpuBuffer:
            return art.buffer_of(i, bindings, kernel.temps)

        ops = []
        for s in art.steps:
            if s.op == "dispatch":
                kern = art.kernels[s.kernel]
                bufs = [buf(i) for i in s.args] + [self._err]
                if len(bufs) != kern.bindings:
                    raise WgpuError(f"kernel {kern.name}: plan binds {len(bufs)} buffers to "
                                    f"{kern.bindings} bindings")
                group = self.device.create_bind_group(layout=kernel.layouts[s.kernel], entries=[
                    {"binding": j, "resource": {"buffer": b.buffer, "offset": 0,
                                                "size": b.size}}
                    for j, b in enumerate(bufs)])
                pipe = kernel.pipelines[s.kernel]
                ops.append(("dispatch", pipe, group, tuple(int(g) for g in s.groups),
                            getattr(pipe, "_internal", None), getattr(group, "_internal", None)))
            else:
                src, dst = buf(s.src), buf(s.dst)
                if src is dst:
                    continue            # state written in place, bound to one buffer
                n = min(src.size, dst.size, s.nbytes + 3 - (s.nbytes + 3) % 4)
                ops.append(("copy", src.buffer, dst.buffer, n))
        for src, dst in copies:
            ops.append(("copy", src.buffer, dst.buffer, min(src.size, dst.size)))
        self.records += 1
        return WgpuRecording(kernel, ops, [list(bindings), list(copies)])

    # ---- running -----------------------------------------------------------------------------
    def _native(self):
        """wgpu-native's raw C functions (:class:`_Native`), or None where wgpu-py does not
        expose them (then the public calls are used: :meth:`_encode`, :meth:`_flush`,
        :class:`WgpuReadback`)."""
        if not hasattr(self, "_native_fns"):
            self._native_fns = _Native.find()
        return self._native_fns

    def _encode(self, ops) -> list:
        """Command buffers for ``ops``: one compute pass per run of dispatches, at most
        ``dispatches_per_submit`` dispatches per command buffer."""
        out, enc, cpass, n = [], None, None, 0
        cap = self.dispatches_per_submit
        native = self._native()
        if native is not None:
            set_pipe, set_group, dispatch, null = native.pass_fns
        for op in ops:
            if op[0] == "dispatch" and cap is not None and n >= cap:
                if cpass is not None:
                    cpass.end()
                out.append(enc.finish())
                enc, cpass, n = None, None, 0
            if enc is None:
                enc = self.device.create_command_encoder()
            if op[0] == "dispatch":
                if cpass is None:
                    cpass = enc.begin_compute_pass()
                    handle, last = getattr(cpass, "_internal", None), None
                _, pipe, group, (x, y, z), ph, gh = op
                if native is not None and handle is not None and gh is not None:
                    if ph != last:
                        set_pipe(handle, ph)
                        last = ph
                    set_group(handle, 0, gh, 0, null)
                    dispatch(handle, x, y, z)
                else:
                    cpass.set_pipeline(pipe)
                    cpass.set_bind_group(0, group)
                    cpass.dispatch_workgroups(x, y, z)
                n += 1
            else:
                if cpass is not None:
                    cpass.end()
                    cpass = None
                enc.copy_buffer_to_buffer(op[1], 0, op[2], 0, op[3])
        if enc is None:
            enc = self.device.create_command_encoder()
        if cpass is not None:
            cpass.end()
        out.append(enc.finish())
        return out

    def replay(self, recording: WgpuRecording) -> None:
        """Encode the recorded step again (pipelines and bind groups reused) and queue it,
        without waiting: its command buffers go out with the next read, write or wait (one
        ``queue.submit`` for a token's decode step, sampler and readback), or each alone when
        ``dispatches_per_submit`` is set."""
        try:
            cbs = self._encode(recording.ops)
        except Exception as e:  # noqa: BLE001  (wgpu-native's validation errors)
            raise WgpuError(f"encoding the step failed: {type(e).__name__}: {e}") from None
        if self.dispatches_per_submit is None:
            self._unsubmitted += cbs
        else:
            self._flush()
            for cb in cbs:
                self._unsubmitted.append(cb)
                self._flush()
        self._pending = recording
        recording.submits += 1
        self.replays += 1

    def _flush(self) -> None:
        """Submit the queued command buffers (one ``queue.submit``)."""
        if not self._unsubmitted:
            return
        cbs, self._unsubmitted = self._unsubmitted, []
        native = self._native()
        try:
            if native is not None:
                self._last_index = native.submit(self.queue, cbs)
            else:
                self.queue.submit(cbs)
                self._last_index = None
        except Exception as e:  # noqa: BLE001  (wgpu-native's validation errors)
            raise WgpuError(f"submitting the step failed: {type(e).__name__}: {e}") from None
        self.submits += 1

    def synchronize(self) -> None:
        """Wait for the submitted step; raise :class:`KernelFault` if a kernel check set the
        error word."""
        self._flush()
        rec, self._pending = self._pending, None
        if rec is None:
            return
        enc = self.device.create_command_encoder()
        enc.copy_buffer_to_buffer(self._err.buffer, 0, self._err_read, 0, 8)
        self.queue.submit([enc.finish()])
        self._err_read.map_sync(self.wgpu.MapMode.READ)
        try:
            err = np.frombuffer(self._err_read.read_mapped(), np.uint32).copy()
        finally:
            self._err_read.unmap()
        self._raise_fault(err, rec)

    def _raise_fault(self, err: np.ndarray, rec: WgpuRecording | None,
                     issued: int | None = None) -> None:
        """Raise the fault ``err`` holds, once: a readback issued (``issued``: submissions
        then) before the word was cleared carries the same fault again and stays quiet."""
        if err[0]:
            code, k = int(err[0]), int(err[1])
            if issued is not None and issued <= self._fault[0] and (code, k) == self._fault[1]:
                return
            self._fault = (self.submits, (code, k))
            self.queue.write_buffer(self._err.buffer, 0, np.zeros(2, np.uint32))
            raise KernelFault(code, rec.kernel.artifact.faulting_kernel(k)
                              if rec is not None else None)

    def close(self) -> None:
        """Release the device (wgpu frees the rest when the objects are collected)."""
        self._pending, self._unsubmitted = None, []
        try:
            self.device.destroy()
        except Exception:  # noqa: BLE001
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def open_device() -> WgpuDevice:
    """The registry's ``open_device`` hook of ``wgpu``: the preferred adapter; a missing
    ``wgpu`` package or no adapter is a :class:`~poot.backends.cpu.runtime.DeviceError`."""
    import importlib.util

    if importlib.util.find_spec("wgpu") is None:
        raise DeviceError("the wgpu backend needs the 'wgpu' package: pip install 'poot[wgpu]'")
    try:
        return WgpuDevice()
    except WgpuError as e:
        raise DeviceError(f"no usable wgpu adapter: {e}") from None


__all__ = ["WgpuBuffer", "WgpuDevice", "WgpuError", "WgpuKernelArg", "WgpuLimitExceeded",
           "WgpuLoadedKernel", "WgpuRecording", "open_device"]
