"""The CUDA device: runs a :class:`~poot.backends.cuda.artifact.CudaArtifact` on
``cuda.bindings.driver``. Imports no MLIR (it runs on machines that have none). The plan's
buffers and arguments as a runtime sees them are shared with ROCm
(:mod:`poot.backends.gpu.artifact`).

    dev = CudaDevice()
    kernel = dev.load(artifact)            # cuModuleLoadData(PTX) once, internal buffers
    rec = dev.record(kernel, bindings)     # the whole step captured into one CUDA graph
    dev.replay(rec)                        # one cuGraphLaunch per step

:class:`CudaDevice` follows the executor's Device protocol (:mod:`poot.runtime.device`)
structurally: ``alloc``/``upload``/``download``/``load``/``record``/``replay``/``synchronize``.
A kernel's ``args`` are inputs, params (weights), outputs, in the artifact's order; a
recording fixes them to buffers. Values private to the step (intermediates, scratch,
constants) are allocated once per loaded kernel. An output that the artifact writes in place
over an input (the KV caches) works both ways: bound to the input's own buffer (aliased) it is
updated in place; bound to another buffer (ping-pong) the graph starts with a copy of the input
into it.

Pipelining (the executor's queued transfers): everything runs on the device's one stream, in
issue order. :meth:`CudaDevice.upload_async` copies the array into a ring of page-locked host
slots (``cuMemHostAlloc``) and queues ``cuMemcpyHtoDAsync`` from there plus an event; a slot is
rewritten by the host only after its event says the stream has read it.
:meth:`CudaDevice.download_async` queues ``cuMemcpyDtoHAsync`` into a free page-locked slot plus
an event and returns a :class:`CudaReadback` whose ``wait()`` syncs that event only (the
stream may already run the next step). ``record(..., copies=[(src, dst)])`` captures
device-to-device copies after the step (graph memcpy nodes: the sampled token fed back into the
next step's token input). The synchronous :meth:`CudaDevice.upload` waits for the stream first,
so a host write never lands under queued work that still reads the buffer.

Several devices (a layer pipeline across GPUs): each :class:`CudaDevice` holds its own context
(``CudaDevice(1)``; ``own_context=True`` creates a separate one, so two devices can share one
GPU) and makes it current on the calling thread before every driver call (a thread-local
remembers the current one: ``cuCtxSetCurrent`` only on a switch). Three queue operations
connect them, none blocking the host: ``a.signal()`` records a's marker event after its queued
work, ``b.wait_for(marker)`` makes b's later work wait for it on the GPU, and
``b.copy_from(a, src, dst)`` queues a copy of a's buffer into b's (``cuMemcpyPeerAsync``
between contexts). One event per device suffices: a wait takes the event's state when the
wait is issued, so re-recording it afterwards does not disturb a wait already queued, and a
replay loop creates nothing.

:class:`StepRunner` is the self-contained form used by the device check and the benchmarks:
every buffer allocated by the runner, carried state in place, per-step inputs written into
stable slot buffers before each graph launch, only the named outputs read back.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

if __package__:
    from poot.backends.gpu import artifact as plan_io
    from poot.runtime.device import row_regions
else:   # a plain file beside artifact.py (devcheck.py without the poot package)
    from artifact import plan_io  # type: ignore  # noqa: E402
    row_regions = None   # devcheck.py copies no rows
Arg, DeviceBuffer, host_of, kernel_args = (plan_io.Arg, plan_io.DeviceBuffer, plan_io.host_of,
                                           plan_io.kernel_args)
bind_pointers, check_copies = plan_io.bind_pointers, plan_io.check_copies


class CudaError(RuntimeError):
    """A CUDA driver call failed (the message names the call and the error)."""


_cu = None
#: the context of the :class:`CudaDevice` made last: the default a thread that has none gets
_ctx = None
#: ``_thread.ctx``: the context this module last made current on the calling thread
_thread = threading.local()
#: CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
_PEER_ALREADY_ENABLED = 704


def _module():
    """``cuda.bindings.driver``, imported on first use (ImportError when absent)."""
    global _cu
    if _cu is None:
        from cuda.bindings import driver as cu  # noqa: PLC0415

        _cu = cu
    return _cu


def driver():
    """``cuda.bindings.driver`` (imported on first use; ImportError when absent). On a thread
    that has no context of this module's yet, the context of the device made last is made
    current: the driver's current context is per thread, and a device made on one thread (a
    server's loader) is used on another (its engine thread), where a call would otherwise fail
    with CUDA_ERROR_INVALID_CONTEXT. A context already current here is left alone: each
    :class:`CudaDevice` makes its own current before it calls the driver."""
    cu = _module()
    if _ctx is not None and getattr(_thread, "ctx", None) is None:
        _check(cu.cuCtxSetCurrent(_ctx), "cuCtxSetCurrent")
        _thread.ctx = _ctx
    return cu


def _make_current(ctx) -> None:
    """Make ``ctx`` current on the calling thread (``cuCtxSetCurrent`` only when this module
    made another one current here last)."""
    if getattr(_thread, "ctx", None) is not ctx:
        _check(_module().cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        _thread.ctx = ctx


def _handle(h) -> int:
    """A driver handle (context, ...) as an int, for comparing two wrappers of one handle."""
    try:
        return int(h)
    except TypeError:
        return id(h)


def _create_context(cu, dev):
    """``cuCtxCreate`` on ``dev`` (made current on the calling thread): cuda-python 13's
    ``(params, flags, dev)`` or 12's ``(flags, dev)``."""
    try:
        res = cu.cuCtxCreate(None, 0, dev)
    except TypeError:
        res = cu.cuCtxCreate(0, dev)
    return _check(res, "cuCtxCreate")


def _check(res, what: str):
    err = res[0]
    if int(err) != 0:
        try:
            name = driver().cuGetErrorName(err)[1].decode()
        except Exception:  # noqa: BLE001
            name = str(err)
        raise CudaError(f"{what}: {name}")
    if len(res) == 1:
        return None
    return res[1] if len(res) == 2 else res[1:]


def nvidia_driver() -> str | None:
    """The NVIDIA driver's CUDA library (``libcuda.so.1``) when the dynamic loader finds it
    (it ships with the GPU driver, not with cuda-python), else None. Loading it is all this
    does: nothing is initialized."""
    for name in ("libcuda.so.1", "libcuda.so"):
        try:
            ctypes.CDLL(name)
            return name
        except OSError:
            continue
    return None


NO_DRIVER = ("the NVIDIA driver is not installed here: its CUDA library libcuda.so.1 was not "
             "found (the cuda backend needs an NVIDIA GPU and its driver)")


def device_available() -> tuple[bool, str]:
    """(True, name) when cuda.bindings imports and a CUDA device answers, else (False, why)."""
    try:
        cu = driver()
    except Exception as e:  # noqa: BLE001
        return False, f"no CUDA device (cuda.bindings not importable: {e})"
    if nvidia_driver() is None:
        return False, NO_DRIVER
    try:
        _check(cu.cuInit(0), "cuInit")
        n = _check(cu.cuDeviceGetCount(), "cuDeviceGetCount")
        if not n:
            return False, "no CUDA device"
        dev = _check(cu.cuDeviceGet(0), "cuDeviceGet")
        name = _check(cu.cuDeviceGetName(128, dev), "cuDeviceGetName")
        return True, name.split(b"\0")[0].decode()
    except Exception as e:  # noqa: BLE001
        return False, f"no CUDA device ({e})"


class StreamCalls:
    """The driver calls a step makes between its host work, all of which only queue work on
    a stream or look at an event (none waits for the GPU): host-to-device, device-to-device
    and device-to-host copies, event records and queries, graph launches. This set goes
    through cuda-python, which gives the GIL up around every call; :class:`GilHeldCalls`
    keeps it. ``cu`` is ``cuda.bindings.driver`` (or a stand-in with its functions). Every
    method raises :class:`CudaError` naming the call when the driver returns an error."""

    def __init__(self, cu):
        self.cu = cu

    def htod_async(self, dst: int, src: int, nbytes: int, stream) -> None:
        """``cuMemcpyHtoDAsync``: ``nbytes`` from host address ``src`` (page-locked) to
        device address ``dst``, on ``stream``."""
        _check(self.cu.cuMemcpyHtoDAsync(dst, src, nbytes, stream), "cuMemcpyHtoDAsync")

    def dtod_async(self, dst: int, src: int, nbytes: int, stream) -> None:
        """``cuMemcpyDtoDAsync``: ``nbytes`` from device address ``src`` to ``dst``."""
        _check(self.cu.cuMemcpyDtoDAsync(dst, src, nbytes, stream), "cuMemcpyDtoDAsync")

    def dtoh_async(self, dst: int, src: int, nbytes: int, stream) -> None:
        """``cuMemcpyDtoHAsync``: ``nbytes`` from device address ``src`` to host ``dst``."""
        _check(self.cu.cuMemcpyDtoHAsync(dst, src, nbytes, stream), "cuMemcpyDtoHAsync")

    def event_record(self, event, stream) -> None:
        """``cuEventRecord``: ``event`` fires once ``stream`` ran the work queued so far."""
        _check(self.cu.cuEventRecord(event, stream), "cuEventRecord")

    def event_done(self, event) -> bool:
        """``cuEventQuery``: whether ``event`` fired (CUDA_ERROR_NOT_READY: not yet)."""
        err = self.cu.cuEventQuery(event)[0]
        if int(err) == _NOT_READY:
            return False
        _check((err,), "cuEventQuery")
        return True

    def graph_launch(self, graph_exec, stream) -> None:
        """``cuGraphLaunch``: one replay of an instantiated graph on ``stream``."""
        _check(self.cu.cuGraphLaunch(graph_exec, stream), "cuGraphLaunch")


#: CUDA_ERROR_NOT_READY (an event or stream that has not finished yet)
_NOT_READY = 600


class GilHeldCalls(StreamCalls):
    """:class:`StreamCalls` through libcuda's own entry points (``ctypes.PyDLL``: the GIL
    stays held). Each call returns in microseconds, but a call that gives the GIL up must
    take it back, and while the server's event loop holds it that waits up to a switch
    interval: with a dozen such calls a step (a few inputs written, the launch, the reads
    queued) the engine thread lost about as long as the GPU step took (py-spy on an H100 at
    64 streams). Calls that block -- synchronizations, allocations, module loads -- still go
    through cuda-python, which lets the other threads run while they wait.

    ``lib`` is the loaded driver library; handles (streams, events, graph execs) are passed
    as their addresses (``int()`` of cuda-python's wrappers). The ``_v2`` symbols are the
    ones ``cuda.h`` maps the plain names to (64-bit device pointers)."""

    def __init__(self, lib, cu):
        super().__init__(cu)
        c = ctypes
        u64, ptr, size = c.c_uint64, c.c_void_p, c.c_size_t

        def fn(name, *argtypes):
            f = getattr(lib, name)
            f.argtypes, f.restype = list(argtypes), c.c_int
            return f

        self._htod = fn("cuMemcpyHtoDAsync_v2", u64, ptr, size, ptr)
        self._dtod = fn("cuMemcpyDtoDAsync_v2", u64, u64, size, ptr)
        self._dtoh = fn("cuMemcpyDtoHAsync_v2", ptr, u64, size, ptr)
        self._record = fn("cuEventRecord", ptr, ptr)
        self._query = fn("cuEventQuery", ptr)
        self._launch = fn("cuGraphLaunch", ptr, ptr)

    def _fail(self, err: int, what: str) -> None:
        _check((self.cu.CUresult(err),), what)

    def htod_async(self, dst: int, src: int, nbytes: int, stream) -> None:
        err = self._htod(int(dst), int(src), int(nbytes), int(stream))
        if err:
            self._fail(err, "cuMemcpyHtoDAsync")

    def dtod_async(self, dst: int, src: int, nbytes: int, stream) -> None:
        err = self._dtod(int(dst), int(src), int(nbytes), int(stream))
        if err:
            self._fail(err, "cuMemcpyDtoDAsync")

    def dtoh_async(self, dst: int, src: int, nbytes: int, stream) -> None:
        err = self._dtoh(int(dst), int(src), int(nbytes), int(stream))
        if err:
            self._fail(err, "cuMemcpyDtoHAsync")

    def event_record(self, event, stream) -> None:
        err = self._record(int(event), int(stream))
        if err:
            self._fail(err, "cuEventRecord")

    def event_done(self, event) -> bool:
        err = self._query(int(event))
        if err == _NOT_READY:
            return False
        if err:
            self._fail(err, "cuEventQuery")
        return True

    def graph_launch(self, graph_exec, stream) -> None:
        err = self._launch(int(graph_exec), int(stream))
        if err:
            self._fail(err, "cuGraphLaunch")


def stream_calls(cu) -> StreamCalls:
    """:class:`GilHeldCalls` when ``cu`` is cuda-python's driver module and the driver
    library loads through ctypes with its entry points (``POOT_CUDA_GIL_CALLS=0``: never),
    else :class:`StreamCalls` over ``cu`` (a stand-in driver's handles mean nothing to the
    real one)."""
    real = getattr(cu, "__name__", None) == "cuda.bindings.driver"
    name = nvidia_driver() if real and os.environ.get("POOT_CUDA_GIL_CALLS", "1") != "0" \
        else None
    if name is not None:
        try:
            return GilHeldCalls(ctypes.PyDLL(name), cu)
        except (OSError, AttributeError):
            pass
    return StreamCalls(cu)


class _Pinned:
    """One page-locked host allocation (``cuMemHostAlloc``), its uint8 view and an event
    recorded after the last queued copy that uses it (through ``calls``, the device's
    :class:`StreamCalls`)."""

    def __init__(self, nbytes: int, calls: StreamCalls):
        cu = driver()
        self.calls = calls
        self.nbytes = max(4096, (int(nbytes) + 4095) // 4096 * 4096)
        self.ptr = int(_check(cu.cuMemHostAlloc(self.nbytes, 0), "cuMemHostAlloc"))
        self.view = np.ctypeslib.as_array((ctypes.c_uint8 * self.nbytes).from_address(self.ptr))
        self.event = _check(cu.cuEventCreate(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING),
                            "cuEventCreate")
        self.queued = False

    def record(self, stream) -> None:
        self.calls.event_record(self.event, stream)
        self.queued = True

    def wait(self) -> None:
        """Wait until the stream passed this slot's last queued copy (asking the event
        first: a slot the stream is done with costs no synchronizing call)."""
        if self.queued:
            if not self.calls.event_done(self.event):
                _check(driver().cuEventSynchronize(self.event), "cuEventSynchronize")
            self.queued = False

    def free(self) -> None:
        self.wait()
        cu = driver()
        _check(cu.cuMemFreeHost(self.ptr), "cuMemFreeHost")
        _check(cu.cuEventDestroy(self.event), "cuEventDestroy")
        self.view = None


class CudaReadback:
    """A queued device-to-host copy into a page-locked slot (the executor's ``Readback``):
    ``wait()`` syncs the slot's event and returns a host copy; ``release()`` gives the slot back
    without waiting (a later read queued into it lands after this one)."""

    def __init__(self, device: "CudaDevice", slot: _Pinned, dtype, shape, nbytes: int):
        self.device, self.slot = device, slot
        self.dtype, self.shape, self.nbytes = dtype, shape, nbytes

    def wait(self) -> np.ndarray:
        if self.slot is None:
            raise CudaError("this readback was already waited for or released")
        self.device._driver()       # its context, on whichever thread waits
        self.slot.wait()
        out = self.slot.view[:self.nbytes].view(self.dtype).reshape(self.shape).copy()
        self.release()
        return out

    def release(self) -> None:
        if self.slot is not None:
            self.device._read_free.append(self.slot)
            self.slot = None


@dataclass
class CudaKernel:
    """A loaded artifact: ``args`` (inputs, params, outputs), the module and functions, the
    buffers private to the step."""

    args: list[Arg]
    artifact: Any
    module: Any
    functions: list
    private: dict[int, DeviceBuffer]
    load_s: float = 0.0


@dataclass
class CudaRecording:
    kernel: CudaKernel
    graph: Any
    exec: Any
    pointers: dict[int, int]
    keep: list = field(default_factory=list)
    nodes: int = 0


def _check_block_sizes(plan: dict, fns: list) -> None:
    """Refuse a program one of whose launches asks for more threads per block than its
    kernel can run with (registers): named here rather than as a bare
    CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES at graph instantiation. Kernels launched with more
    than 48 KB of dynamic workgroup memory (a launch's ``shared``) are allowed their most
    (``CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES``); a device that cannot give it
    refuses here, naming the kernel."""
    cu = driver()
    attr = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK
    most = {}
    shared: dict = {}
    for L in plan["launches"]:
        if L["op"] == "kernel":
            k = L["kernel"]
            if k not in most:
                most[k] = _check(cu.cuFuncGetAttribute(attr, fns[k]), "cuFuncGetAttribute")
            b = L["block"][0] * L["block"][1] * L["block"][2]
            if b > most[k]:
                raise CudaError(f"kernel {plan['kernels'][k]} is launched with {b} threads "
                                f"per block but can run at most {most[k]}")
            shared[k] = max(shared.get(k, 0), L.get("shared", 0))
    for k, nb in shared.items():
        if nb > 48 << 10:
            dyn = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            err = cu.cuFuncSetAttribute(fns[k], dyn, nb)[0]
            if int(err) != 0:
                raise CudaError(f"kernel {plan['kernels'][k]} needs {nb} bytes of workgroup "
                                f"memory, more than this device gives a block ({err})")


class CudaDevice:
    """One CUDA device (the first by default) with one stream, in its own context: the
    device's primary context, or with ``own_context`` a context created for it alone (two such
    devices on one GPU act as two devices: a pipeline's stages tested on one GPU)."""

    name = "cuda"
    overlaps = True          # replays and queued copies return before the stream ran them
    #: page-locked slots in the upload ring: enough for the writes of several steps, so a
    #: write never waits for a slot whose copy is queued behind the step in flight (a step
    #: writes up to a dozen inputs, its sampler's among them; a slot is 4 KiB or more)
    STAGING_SLOTS = 64
    SIGNAL_EVENTS = 16       # marker events :meth:`signal` records in turn

    def __init__(self, ordinal: int = 0, own_context: bool = False):
        cu = _module()
        _check(cu.cuInit(0), "cuInit")
        self.ordinal = int(ordinal)
        self.own_context = bool(own_context)
        self.dev = _check(cu.cuDeviceGet(ordinal), "cuDeviceGet")
        if own_context:
            self.ctx = _create_context(cu, self.dev)
            _thread.ctx = self.ctx        # cuCtxCreate made it current on this thread
        else:
            self.ctx = _check(cu.cuDevicePrimaryCtxRetain(self.dev),
                              "cuDevicePrimaryCtxRetain")
        global _ctx
        _ctx = self.ctx
        cu = self._driver()
        self.stream = _check(cu.cuStreamCreate(0), "cuStreamCreate")
        #: the copies, event records and launches of a step (:func:`stream_calls`)
        self.calls = stream_calls(cu)
        self.device_name = _check(cu.cuDeviceGetName(128, self.dev),
                                  "cuDeviceGetName").split(b"\0")[0].decode()
        self._modules: dict[int, Any] = {}
        #: launch a ``pdl`` plan's kernels with programmatic stream serialization (see
        #: :func:`poot.backends.cuda.codegen.add_grid_dependency_control`); POOT_CUDA_PDL=0
        #: turns it off (the kernels' griddepcontrol then does nothing)
        self.pdl = os.environ.get("POOT_CUDA_PDL", "1") != "0"
        self.records = 0
        self.replays = 0
        self.allocated = 0
        self._stage: list[_Pinned | None] = [None] * self.STAGING_SLOTS   # upload ring
        self._stage_next = 0
        self._read_free: list[_Pinned] = []                              # download slots
        #: recorded in turn by :meth:`signal` (made once: replay loops make none)
        self._signals = [_check(cu.cuEventCreate(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING),
                                "cuEventCreate") for _ in range(self.SIGNAL_EVENTS)]
        self._signal_next = 0
        #: source contexts (handles) this context's peer access was settled for
        self._peers: set[int] = set()

    def _driver(self):
        """The driver, with this device's context current on the calling thread (every
        method calls this before the driver: several devices share a thread)."""
        _make_current(self.ctx)
        return _cu

    # ---- buffers -----------------------------------------------------------------------
    def _alloc_bytes(self, nbytes: int) -> int:
        cu = self._driver()
        ptr = _check(cu.cuMemAlloc(max(16, nbytes)), "cuMemAlloc")
        _check(cu.cuMemsetD8(ptr, 0, max(16, nbytes)), "cuMemsetD8")
        self.allocated += nbytes
        return int(ptr)

    def alloc(self, type_) -> DeviceBuffer:
        dt, shape, n = host_of(type_)
        return DeviceBuffer(self._alloc_bytes(n), n, dt, shape)

    def upload(self, buffer: DeviceBuffer, array) -> None:
        """Write ``array`` into ``buffer``. A random-init weight (duck-typed
        :class:`poot.models.random_init.RandomArray`: ``chunks()``/``scaled_pool()``) is
        filled on the device from its pool: the host never builds the whole tensor."""
        cu = self._driver()
        # queued work (a pipelined step still running) may read or write the buffer
        _check(cu.cuStreamSynchronize(self.stream), "cuStreamSynchronize")
        if hasattr(array, "chunks") and hasattr(array, "scaled_pool"):
            self._fill_random(buffer, array)
            return
        a = self._host_array(buffer, array)
        _check(cu.cuMemcpyHtoD(buffer.ptr, a.ctypes.data, a.nbytes), "cuMemcpyHtoD")

    def upload_rows(self, buffer: DeviceBuffer, start: int, array) -> None:
        """Write ``array`` over rows ``start..`` (first axis) of ``buffer`` (after the queued
        work finished): one sequence's row of carried state, without the rest."""
        cu = self._driver()
        _check(cu.cuStreamSynchronize(self.stream), "cuStreamSynchronize")
        a = np.asarray(array)
        if a.dtype.itemsize == 2 and buffer.dtype == np.uint16:
            a = a.view(np.uint16)
        a = np.ascontiguousarray(a.astype(buffer.dtype, copy=False))
        row = int(np.prod(buffer.shape[1:], dtype=np.int64)) * buffer.dtype.itemsize
        if a.nbytes % row or start < 0 or start * row + a.nbytes > buffer.nbytes:
            raise CudaError(f"cannot write {list(a.shape)} at row {start} of a buffer of "
                            f"{list(buffer.shape)}")
        _check(cu.cuMemcpyHtoD(buffer.ptr + start * row, a.ctypes.data, a.nbytes),
               "cuMemcpyHtoD")

    @staticmethod
    def _host_array(buffer: DeviceBuffer, array) -> np.ndarray:
        """``array`` as contiguous host bytes of ``buffer``'s dtype and size."""
        return plan_io.host_bytes(buffer, array, CudaError)

    def _fill_random(self, buffer: DeviceBuffer, r) -> None:
        """``buffer`` = ``np.asarray(r)``, built on the device: norm scales (``scale`` 0) by a
        memset of the bit pattern of 1; matrices by one device-to-device copy per chunk from
        the scaled pool, uploaded once per (seed, scale, dtype) and kept."""
        cu = self._driver()
        if r.nbytes != buffer.nbytes:
            raise CudaError(f"cannot write {r.nbytes} bytes into a buffer of {buffer.nbytes}")
        item = r.dtype.itemsize
        if r.scale == 0.0:
            one = np.ones(1, r.dtype).view({2: np.uint16, 4: np.uint32}[item])[0]
            fill = cu.cuMemsetD16 if item == 2 else cu.cuMemsetD32
            _check(fill(buffer.ptr, int(one), r.size), "cuMemset")
            return
        pools = self.__dict__.setdefault("_pools", {})
        key = (r.seed, r.scale, r.dtype.str)
        if key not in pools:
            host = np.ascontiguousarray(r.scaled_pool())
            buf = DeviceBuffer(self._alloc_bytes(host.nbytes), host.nbytes, host.dtype, host.shape)
            _check(cu.cuMemcpyHtoD(buf.ptr, host.ctypes.data, host.nbytes), "cuMemcpyHtoD")
            pools[key] = buf
        src = pools[key].ptr
        for first, start, n in r.chunks():
            _check(cu.cuMemcpyDtoDAsync(buffer.ptr + first * item, src + start * item,
                                        n * item, self.stream), "cuMemcpyDtoDAsync")
        self.synchronize()

    def upload_async(self, buffer: DeviceBuffer, array) -> None:
        """Queue a host-to-device write on the stream. ``array`` is copied at once into the
        next page-locked slot of the upload ring (waiting, if ever, only until the stream
        has read that slot's previous contents), so the caller may reuse it immediately."""
        self._driver()              # the slots are made and freed in this context too
        a = self._host_array(buffer, array)
        i = self._stage_next
        self._stage_next = (i + 1) % len(self._stage)
        slot = self._stage[i]
        if slot is None or slot.nbytes < a.nbytes:
            if slot is not None:
                slot.free()
            slot = self._stage[i] = _Pinned(a.nbytes, self.calls)
        slot.wait()                 # the stream has copied what the slot held before
        slot.view[:a.nbytes] = a.reshape(-1).view(np.uint8)
        self.calls.htod_async(buffer.ptr, slot.ptr, a.nbytes, self.stream)
        slot.record(self.stream)

    def copy_rows_async(self, src: DeviceBuffer, dst: DeviceBuffer,
                        runs: Sequence[tuple[int, int, int]]) -> None:
        """Queue device-to-device copies of rows of ``src`` into ``dst`` on the stream (one
        ``cuMemcpyDtoDAsync`` a run of consecutive rows; :meth:`Device.copy_rows_async
        <poot.runtime.device.Device.copy_rows_async>`)."""
        self._driver()
        for so, do, n in row_regions(src, dst, runs):
            self.calls.dtod_async(dst.ptr + do, src.ptr + so, n, self.stream)

    def download_async(self, buffer: DeviceBuffer) -> CudaReadback:
        """Queue a device-to-host copy of ``buffer`` (into a page-locked slot) after the work
        issued so far; the returned readback's ``wait()`` waits for that copy only."""
        self._driver()
        slot = None
        for j, s in enumerate(self._read_free):
            if s.nbytes >= buffer.nbytes:
                slot = self._read_free.pop(j)
                break
        if slot is None:
            slot = _Pinned(buffer.nbytes, self.calls)
        self.calls.dtoh_async(slot.ptr, buffer.ptr, buffer.nbytes, self.stream)
        slot.record(self.stream)
        return CudaReadback(self, slot, buffer.dtype, buffer.shape, buffer.nbytes)

    def download(self, buffer: DeviceBuffer) -> np.ndarray:
        cu = self._driver()
        _check(cu.cuStreamSynchronize(self.stream), "cuStreamSynchronize")
        out = np.empty(buffer.shape, buffer.dtype)
        _check(cu.cuMemcpyDtoH(out.ctypes.data, buffer.ptr, buffer.nbytes), "cuMemcpyDtoH")
        return out

    def synchronize(self) -> None:
        _check(self._driver().cuStreamSynchronize(self.stream), "cuStreamSynchronize")

    # ---- several devices ---------------------------------------------------------------
    def signal(self):
        """Record a marker event on this device's stream, after the work queued so far, and
        return it (for another device's :meth:`wait_for`). The events are a ring of
        :attr:`SIGNAL_EVENTS` made once and re-recorded in turn: a marker kept for a later
        wait stays exact while fewer newer ones were recorded (the pipeline waits for the
        copies read from a device before it writes again); past that its event was
        re-recorded later on this stream, so a wait on it waits for more, never less (a
        wait takes the event's state when the wait is issued)."""
        self._driver()
        ev = self._signals[self._signal_next]
        self._signal_next = (self._signal_next + 1) % len(self._signals)
        self.calls.event_record(ev, self.stream)
        return ev

    def wait_for(self, marker) -> None:
        """Work queued on this device from now on waits (on the GPU; the host does not) until
        ``marker`` fired: an event from :meth:`signal`, of this or another device."""
        cu = self._driver()
        _check(cu.cuStreamWaitEvent(self.stream, marker, 0), "cuStreamWaitEvent")

    def copy_from(self, src_device: "CudaDevice", src: DeviceBuffer, dst: DeviceBuffer) -> None:
        """Queue on this device's stream a copy of the whole ``src`` (a buffer of
        ``src_device``: this or another device, or another context on the same GPU) into
        ``dst`` (a buffer of this device). The caller orders it after the producer's work:
        ``self.wait_for(src_device.signal())`` first. CudaError when the byte sizes
        differ. Peer access between two GPUs is enabled on their first copy where the
        hardware allows it; otherwise the driver copies through the host."""
        if src.nbytes != dst.nbytes:
            raise CudaError(f"copy_from: source of {src.nbytes} bytes into a destination of "
                            f"{dst.nbytes} bytes")
        cu = self._driver()
        if _handle(src_device.ctx) == _handle(self.ctx):
            _check(cu.cuMemcpyDtoDAsync(dst.ptr, src.ptr, src.nbytes, self.stream),
                   "cuMemcpyDtoDAsync")
            return
        self._enable_peer(src_device)
        _check(cu.cuMemcpyPeerAsync(dst.ptr, self.ctx, src.ptr, src_device.ctx, src.nbytes,
                                    self.stream), "cuMemcpyPeerAsync")

    def _enable_peer(self, src_device: "CudaDevice") -> None:
        """Once per source context: let this context read ``src_device``'s memory directly
        (``cuCtxEnablePeerAccess``) when the two are different GPUs that can."""
        key = _handle(src_device.ctx)
        if key in self._peers:
            return
        cu = self._driver()
        if src_device.ordinal != self.ordinal:
            can = _check(cu.cuDeviceCanAccessPeer(self.dev, src_device.dev),
                         "cuDeviceCanAccessPeer")
            if can:
                res = cu.cuCtxEnablePeerAccess(src_device.ctx, 0)
                if int(res[0]) != _PEER_ALREADY_ENABLED:
                    _check(res, "cuCtxEnablePeerAccess")
        self._peers.add(key)

    def memory_info(self) -> tuple[int, int]:
        """(free, total) bytes of this device's GPU memory (``cuMemGetInfo``)."""
        free, total = _check(self._driver().cuMemGetInfo(), "cuMemGetInfo")
        return int(free), int(total)

    def close(self) -> None:
        """Give the device's resources back: its page-locked slots, signal event and stream,
        and its context (a context of its own is destroyed, with every buffer in it; the
        primary context is released). The device is not used afterwards; a second close
        does nothing."""
        if self.ctx is None:
            return
        cu = self._driver()
        _check(cu.cuStreamSynchronize(self.stream), "cuStreamSynchronize")
        for slot in [s for s in self._stage if s is not None] + self._read_free:
            slot.free()
        self._stage, self._read_free = [None] * self.STAGING_SLOTS, []
        for ev in self._signals:
            _check(cu.cuEventDestroy(ev), "cuEventDestroy")
        _check(cu.cuStreamDestroy(self.stream), "cuStreamDestroy")
        global _ctx
        if _ctx is self.ctx:
            _ctx = None
        _thread.ctx = None
        if self.own_context:
            _check(cu.cuCtxDestroy(self.ctx), "cuCtxDestroy")
        else:
            _check(cu.cuDevicePrimaryCtxRelease(self.dev), "cuDevicePrimaryCtxRelease")
        self.ctx = None

    # ---- programs ----------------------------------------------------------------------
    def load(self, program) -> CudaKernel:
        """Load an artifact (or a Program whose ``executable`` is one): JIT the PTX once
        (modules are cached per PTX text), allocate the step's private buffers."""
        art = getattr(program, "executable", program)
        if not hasattr(art, "plan") or not hasattr(art, "ptx"):
            raise CudaError(f"{type(art).__name__} is not a compiled CUDA program")
        cu = self._driver()
        t0 = time.perf_counter()
        key = hash(art.ptx)
        mod = self._modules.get(key)
        if mod is None:
            mod = _check(cu.cuModuleLoadData(art.ptx.encode() + b"\0"), "cuModuleLoadData")
            self._modules[key] = mod
        fns = [_check(cu.cuModuleGetFunction(mod, k.encode()), f"cuModuleGetFunction {k}")
               for k in art.plan["kernels"]]
        _check_block_sizes(art.plan, fns)
        plan = art.plan
        args = kernel_args(plan)
        private = {}
        import base64

        for b in plan["buffers"]:
            if b["role"] in ("value", "scratch", "const"):
                buf = DeviceBuffer(self._alloc_bytes(b["nbytes"]), b["nbytes"],
                             np.dtype(b.get("dtype", "uint8")),
                             tuple(b.get("shape", [b["nbytes"]])))
                if b["role"] == "const":
                    data = np.frombuffer(base64.b64decode(b["data"]), np.uint8)
                    _check(cu.cuMemcpyHtoD(buf.ptr, data.ctypes.data, data.nbytes),
                           "cuMemcpyHtoD")
                private[b["id"]] = buf
        return CudaKernel(args, art, mod, fns, private, time.perf_counter() - t0)

    def in_place_outputs(self, kernel: CudaKernel) -> set[str]:
        """Outputs the program writes over their aliased input's own buffer (the plan's
        ``in_place``): bound to that input's buffer they cost no copy (see the Session)."""
        return {o["name"] for o in kernel.artifact.plan["outputs"] if o.get("in_place")}

    def _pointers(self, kernel: CudaKernel, bindings: Sequence[DeviceBuffer]):
        return bind_pointers(kernel.args, kernel.private, bindings, CudaError)

    def _enqueue(self, kernel: CudaKernel, ptrs: dict, pre, keep: list,
                 launches=None, post=()) -> int:
        cu = self._driver()
        n = 0
        for src, dst, nb in pre:
            _check(cu.cuMemcpyDtoDAsync(dst, src, nb, self.stream), "cuMemcpyDtoDAsync")
            n += 1
        pdl = self.pdl and kernel.artifact.plan.get("pdl", False)
        prev_kernel = False          # programmatic edges only between two kernels
        for L in (kernel.artifact.plan["launches"] if launches is None else launches):
            if L["op"] == "copy":
                _check(cu.cuMemcpyDtoDAsync(ptrs[L["dst"]], ptrs[L["src"]], L["nbytes"],
                                            self.stream), "cuMemcpyDtoDAsync")
                prev_kernel = False
            else:
                vals = np.array([ptrs[b] for b in L["args"]], dtype=np.uint64)
                params = np.array([vals.ctypes.data + 8 * i for i in range(len(vals))],
                                  dtype=np.uint64)
                keep += [vals, params]
                f = kernel.functions[L["kernel"]]
                what = f"cuLaunchKernel {kernel.artifact.plan['kernels'][L['kernel']]}"
                if pdl and prev_kernel:
                    self._launch_programmatic(f, L, params if len(vals) else None, keep, what)
                else:
                    g, b = L["grid"], L["block"]
                    _check(cu.cuLaunchKernel(f, g[0], g[1], g[2], b[0], b[1], b[2],
                                             L.get("shared", 0), self.stream,
                                             params.ctypes.data if len(vals) else 0, 0), what)
                prev_kernel = True
            n += 1
        for src, dst, nb in post:
            _check(cu.cuMemcpyDtoDAsync(dst, src, nb, self.stream), "cuMemcpyDtoDAsync")
            n += 1
        return n

    def _launch_programmatic(self, f, L: dict, params, keep: list, what: str) -> None:
        """``cuLaunchKernelEx`` with programmatic stream serialization: the kernel may launch
        before the previous kernel on the stream has finished (it waits for it in its first
        instruction, ``griddepcontrol.wait``); stream capture turns this into a programmatic
        edge of the CUDA graph."""
        cu = self._driver()
        attr = cu.CUlaunchAttribute()
        attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attr.value.programmaticStreamSerializationAllowed = 1
        cfg = cu.CUlaunchConfig()
        g, b = L["grid"], L["block"]
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = g
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = b
        cfg.sharedMemBytes = L.get("shared", 0)
        cfg.hStream = self.stream
        cfg.attrs = [attr]
        cfg.numAttrs = 1
        keep += [attr, cfg]
        _check(cu.cuLaunchKernelEx(cfg, f, params.ctypes.data if params is not None else 0,
                                   0), what)

    def record(self, kernel: CudaKernel, bindings: Sequence[DeviceBuffer],
               copies: Sequence[tuple[DeviceBuffer, DeviceBuffer]] = ()) -> CudaRecording:
        """Capture the whole step over ``bindings`` into one CUDA graph (once), ending with
        the device-to-device ``copies`` ``(src, dst)`` (equal byte sizes: memcpy nodes)."""
        cu = self._driver()
        ptrs, pre = self._pointers(kernel, bindings)
        check_copies(copies, DeviceBuffer, CudaError)
        post = [(src.ptr, dst.ptr, src.nbytes) for src, dst in copies]
        keep: list = []
        _check(cu.cuStreamBeginCapture(
            self.stream, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
            "cuStreamBeginCapture")
        try:
            n = self._enqueue(kernel, ptrs, pre, keep, post=post)
        finally:
            graph = _check(cu.cuStreamEndCapture(self.stream), "cuStreamEndCapture")
        gexec = _check(cu.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
        self.records += 1
        return CudaRecording(kernel, graph, gexec, ptrs, keep, n)

    def run_eager(self, kernel: CudaKernel, bindings: Sequence[DeviceBuffer], launches=None) -> int:
        """Launch the step (or ``launches``) directly, without a graph (for checks)."""
        ptrs, pre = self._pointers(kernel, bindings)
        keep: list = []
        n = self._enqueue(kernel, ptrs, pre if launches is None else [], keep, launches)
        self.synchronize()
        return n

    def release(self, recording: CudaRecording) -> None:
        """Destroy a recording's CUDA graph (it must not be replayed afterwards)."""
        cu = self._driver()
        _check(cu.cuGraphExecDestroy(recording.exec), "cuGraphExecDestroy")
        _check(cu.cuGraphDestroy(recording.graph), "cuGraphDestroy")

    def replay(self, recording: CudaRecording) -> None:
        self._driver()
        self.calls.graph_launch(recording.exec, self.stream)
        self.replays += 1

    def profile_kernel(self, kernel: CudaKernel, bindings: Sequence[DeviceBuffer], repeats: int = 3,
                       top: int = 16) -> dict:
        """:func:`profile_kernel` on this device (the executor's optional profiling hook)."""
        return profile_kernel(self, kernel, bindings, repeats=repeats, top=top)


def profile_dispatches(runner: "StepRunner") -> dict[str, float]:
    """GPU milliseconds per dispatch kind for one step of a :class:`StepRunner`
    (:func:`profile_kernel`'s ``by_kind`` milliseconds)."""
    prof = profile_kernel(runner.device, runner.kernel, runner.bindings, repeats=1)
    return {k: v["ms"] for k, v in prof["by_kind"].items()}


def _graph_us(dev: CudaDevice, kernel: CudaKernel, ptrs: dict, pre, chains: list[list],
              replays: int, rounds: int) -> float:
    """The launch lists ``chains`` (each enqueued on its own, so programmatic edges join
    launches of one chain only; the copies ``pre`` first) captured into a CUDA graph of
    their own and launched ``replays`` times back to back, ``rounds`` times after a warm-up
    round: the least mean microseconds a replay (the profilers' one timing loop)."""
    cu = dev._driver()
    keep: list = []
    _check(cu.cuStreamBeginCapture(
        dev.stream, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
        "cuStreamBeginCapture")
    try:
        for i, launches in enumerate(chains):
            dev._enqueue(kernel, ptrs, [] if i else pre, keep, launches)
    finally:
        graph = _check(cu.cuStreamEndCapture(dev.stream), "cuStreamEndCapture")
    gexec = _check(cu.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
    ev0 = _check(cu.cuEventCreate(0), "cuEventCreate")
    ev1 = _check(cu.cuEventCreate(0), "cuEventCreate")
    best = float("inf")
    try:
        for _ in range(rounds + 1):                 # the first round warms up
            _check(cu.cuEventRecord(ev0, dev.stream), "cuEventRecord")
            for _ in range(replays):
                _check(cu.cuGraphLaunch(gexec, dev.stream), "cuGraphLaunch")
            _check(cu.cuEventRecord(ev1, dev.stream), "cuEventRecord")
            _check(cu.cuEventSynchronize(ev1), "cuEventSynchronize")
            best = min(best, float(_check(cu.cuEventElapsedTime(ev0, ev1),
                                          "cuEventElapsedTime")) * 1e3 / replays)
    finally:
        for ev in (ev0, ev1):
            _check(cu.cuEventDestroy(ev), "cuEventDestroy")
        _check(cu.cuGraphExecDestroy(gexec), "cuGraphExecDestroy")
        _check(cu.cuGraphDestroy(graph), "cuGraphDestroy")
    return best


def profile_kernel(dev: CudaDevice, kernel: CudaKernel, bindings: Sequence[DeviceBuffer],
                   repeats: int = 3, top: int = 16) -> dict:
    """Where one step's GPU time goes, measured as a graph replay sees it (but for the
    overlap PDL gives between two different dispatches: each capture starts its own chain):
    the dispatches of one body (the layers' copies of one dispatch region share a ``key``)
    are captured, in step order and repeated to at least 16 launches, into a CUDA graph of
    their own, which is replayed ``repeats`` times (the minimum is kept); a dispatch's time
    is the graph's time over its launches. Each copy reads its own layer's weights, as the
    step does (a body that occurs once, like the LM head, re-reads its weight: L2 may hold a
    small one). The buffers' current contents are used and rewritten as a step would.

    Returns ``{"total_ms", "by_kind": {kind: {"ms", "dispatches", "launches"}},
    "top": [{"callee", "kind", "copies", "us", "weight_bytes", "GBps", "launches":
    [[grid, block], ...]}, ...]`` (the ``top`` bodies by total time) and a ``note``.
    """
    plan = kernel.artifact.plan
    ptrs, _ = dev._pointers(kernel, bindings)
    nbytes = {b["id"]: b["nbytes"] for b in plan["buffers"]}
    role = {b["id"]: b["role"] for b in plan["buffers"]}
    groups: dict[str, list[dict]] = {}
    for d in plan["dispatches"]:
        groups.setdefault(d.get("key", d["callee"]), []).append(d)
    rows = []
    for key, ds in groups.items():
        rep = -(-16 // len(ds))
        chains = [plan["launches"][d["first"]:d["first"] + d["count"]]
                  for _ in range(rep) for d in ds]
        us = _graph_us(dev, kernel, ptrs, [], chains, 1, max(1, repeats)) / (rep * len(ds))
        d0 = ds[0]
        wbytes = sum(nbytes[b] for b in set(d0["args"]) if role.get(b) == "param")
        rows.append({"callee": d0["callee"], "kind": d0["kind"], "copies": len(ds),
                     "us": round(us, 2), "weight_bytes": wbytes,
                     "GBps": round(wbytes / (us * 1e-6) / 1e9, 1) if wbytes else None,
                     "launches": [[L.get("grid"), L.get("block")] for L in
                                  plan["launches"][d0["first"]:d0["first"] + d0["count"]]]})
    by_kind: dict[str, dict] = {}
    for r, ds in zip(rows, groups.values()):
        k = by_kind.setdefault(r["kind"], {"ms": 0.0, "dispatches": 0, "launches": 0})
        k["ms"] += r["us"] * r["copies"] / 1e3
        k["dispatches"] += r["copies"]
        k["launches"] += sum(d["count"] for d in ds)
    rows.sort(key=lambda r: -r["us"] * r["copies"])
    return {"total_ms": sum(k["ms"] for k in by_kind.values()), "by_kind": by_kind,
            "top": rows[:top],
            "note": "per dispatch body: its copies captured into a CUDA graph of their own, "
                    "replayed back to back (min over repeats); graph time / launches"}


def profile_in_context(dev: CudaDevice, kernel: CudaKernel, bindings: Sequence[DeviceBuffer],
                       replays: int = 20, rounds: int = 3) -> dict:
    """What each dispatch adds to the whole step as a graph replay runs it: the step's first
    k dispatches (k = 0 .. all) are each captured into a CUDA graph of their own, launched as
    the step's recording launches them (programmatic edges included), and replayed
    ``replays`` times back to back; a prefix's time is the mean per replay, the minimum over
    ``rounds`` rounds. Dispatch k's cost is prefix k+1's time minus prefix k's, in us: the
    DRAM state, launch latency and overlap with its neighbours are those of the real step
    (unlike :func:`profile_kernel`, which times a body alone). Differences of prefixes are
    noisy to ~0.5 us a dispatch; sums over a body's copies (``by_key``) are steadier.

    The prefixes rewrite the step's buffers as the step does (a decode step is idempotent
    over its inputs; the KV write stores the same rows again).

    Returns ``{"total_us", "empty_us", "dispatches": [{"i", "callee", "key", "kind", "us"},
    ...], "by_key": {key: {"callee", "kind", "copies", "us"}}}`` (``empty_us``: the replay
    of no dispatch, what launching a graph costs; ``by_key`` summed over copies, sorted by
    cost)."""
    plan = kernel.artifact.plan
    ptrs, pre = dev._pointers(kernel, bindings)
    ds = plan["dispatches"]
    ends = [0] + [d["first"] + d["count"] for d in ds]
    times = [_graph_us(dev, kernel, ptrs, pre, [plan["launches"][:end]], replays, rounds)
             for end in ends]
    rows, by_key = [], {}
    for i, d in enumerate(ds):
        us = times[i + 1] - times[i]
        key = d.get("key", d["callee"])
        rows.append({"i": i, "callee": d["callee"], "key": key, "kind": d["kind"],
                     "us": round(us, 2)})
        k = by_key.setdefault(key, {"callee": d["callee"], "kind": d["kind"], "copies": 0,
                                    "us": 0.0})
        k["copies"] += 1
        k["us"] += us
    for k in by_key.values():
        k["us"] = round(k["us"], 2)
    return {"total_us": round(times[-1], 2), "empty_us": round(times[0], 2),
            "dispatches": rows,
            "by_key": dict(sorted(by_key.items(), key=lambda kv: -kv[1]["us"]))}


class StepRunner:
    """A loaded artifact with every buffer owned here: weights uploaded once, carried state
    in place, per-step inputs in stable slot buffers, the step as one CUDA graph."""

    def __init__(self, device: CudaDevice, artifact, weights: dict[str, np.ndarray]):
        self.device = device
        self.kernel = device.load(artifact)
        self.bufs: dict[int, DeviceBuffer] = {}
        for a in self.kernel.args:
            if a.buffer not in self.bufs:
                self.bufs[a.buffer] = device.alloc(a.type)
        self.by_name = {(a.role, a.name): a for a in self.kernel.args}
        for a in self.kernel.args:
            if a.role == "param":
                if a.name not in weights:
                    raise CudaError(f"weight '{a.name}' is not given")
                device.upload(self.bufs[a.buffer], weights[a.name])
        self.bindings = [self.bufs[a.buffer] for a in self.kernel.args]
        self.recording = None
        self.graph_s = 0.0

    def buffer(self, role: str, name: str) -> DeviceBuffer:
        return self.bufs[self.by_name[(role, name)].buffer]

    def write(self, inputs: dict[str, np.ndarray]) -> None:
        """Queue per-step inputs into their slot buffers (async, ahead of the graph; the
        device stages each array in page-locked memory, so it may be reused at once)."""
        for name, value in inputs.items():
            self.device.upload_async(self.buffer("input", name), value)

    def step(self, inputs: dict[str, np.ndarray] | None = None,
             read: Sequence[str] = ("logits",)) -> dict[str, np.ndarray]:
        if inputs:
            self.write(inputs)
        if self.recording is None:
            t0 = time.perf_counter()
            self.recording = self.device.record(self.kernel, self.bindings)
            self.graph_s = time.perf_counter() - t0
        self.device.replay(self.recording)
        return {n: self.device.download(self.buffer("output", n)) for n in read}

    def run_dispatch(self, index: int, args: dict[int, np.ndarray]) -> list[np.ndarray]:
        """Run dispatch ``index`` alone (eagerly) with ``args`` (plan buffer id -> host array)
        written into its argument buffers first; returns host copies of its results."""
        plan = self.kernel.artifact.plan
        d = plan["dispatches"][index]
        ptrs, _ = self.device._pointers(self.kernel, self.bindings)
        specs = {b["id"]: b for b in plan["buffers"]}

        def view(bid):
            s = specs[bid]
            return DeviceBuffer(ptrs[bid], s["nbytes"], np.dtype(s.get("dtype", "uint8")),
                          tuple(s.get("shape", [s["nbytes"]])))
        for bid, value in args.items():
            buf = view(bid)
            a = np.ascontiguousarray(np.asarray(value))
            if a.nbytes != buf.nbytes:
                raise CudaError(f"dispatch {index}: argument of {a.nbytes} bytes for a "
                                f"buffer of {buf.nbytes}")
            _check(self.device._driver().cuMemcpyHtoD(buf.ptr, a.ctypes.data, a.nbytes),
                   "cuMemcpyHtoD")
        self.device.run_eager(self.kernel, self.bindings,
                              plan["launches"][d["first"]:d["first"] + d["count"]])
        return [self.device.download(view(bid)) for bid in d["outs"]]


__all__ = ["CudaDevice", "CudaError", "CudaKernel", "CudaReadback", "CudaRecording",
           "StepRunner", "device_available", "profile_dispatches", "profile_kernel"]


def open_device(ordinal: int = 0) -> "CudaDevice":
    """The registry's ``open_device`` hook of ``cuda``: CUDA device ``ordinal`` (a layer
    pipeline opens 0..N-1); a missing driver, ``cuda-python`` or device (an ordinal past the
    devices present) is a :class:`~poot.backends.cpu.runtime.DeviceError`."""
    # lazy: this file also loads alone, without the poot package (devcheck on a GPU machine)
    from poot.runtime.device import DeviceError

    try:
        from cuda.bindings import driver  # noqa: F401,F811  (is cuda-python installed?)
    except ImportError:
        raise DeviceError("the cuda backend needs cuda-python: pip install 'poot[cuda]'") \
            from None
    if nvidia_driver() is None:        # cuda-python would raise deep inside cuInit
        raise DeviceError(NO_DRIVER)
    try:
        return CudaDevice(ordinal)
    except CudaError as e:
        raise DeviceError(f"no CUDA device {ordinal}: {e}") from None
    except Exception as e:  # noqa: BLE001  (cuda-python's own loader errors, ...)
        why = (str(e).strip().splitlines() or [""])[0]
        raise DeviceError(f"no CUDA device: {type(e).__name__}: {why}") from None
