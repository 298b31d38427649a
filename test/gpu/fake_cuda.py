"""A test-side stand-in for ``cuda.bindings.driver``: the few driver calls the CUDA runtime's
buffers, copies, events and graphs use, over host memory, with a *lazy* stream.

Queued work (``*Async`` copies, graph launches, event records) runs only when the host waits
for it (``cuStreamSynchronize``, ``cuEventSynchronize``), so a host array or a page-locked slot
rewritten before the stream read it shows up as a wrong value, as on a real device. The
synchronous ``cuMemcpyHtoD``/``DtoH`` do *not* drain the stream (a per-thread default stream's
semantics): the runtime must order them itself. Kernel launches are not emulated: plans whose
launches are copies only."""

from __future__ import annotations

import ctypes
import enum
import threading
from collections import deque


class CUevent_flags(enum.IntEnum):  # noqa: N801
    CU_EVENT_DEFAULT = 0
    CU_EVENT_DISABLE_TIMING = 2


class CUstreamCaptureMode(enum.IntEnum):  # noqa: N801
    CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1


class CUfunction_attribute(enum.IntEnum):  # noqa: N801
    CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 0


OK = 0
#: what the driver answers a thread with no current context
INVALID_CONTEXT = 201


class _Event:
    def __init__(self):
        self.recorded = 0
        self.done = 0


class _Stream:
    def __init__(self):
        self.queue: deque = deque()
        self.capture: list | None = None

    def put(self, op):
        (self.capture if self.capture is not None else self.queue).append(op)

    def run_until(self, pred=lambda: False):
        while self.queue and not pred():
            self.queue.popleft()()


class FakeDriver:
    CUevent_flags = CUevent_flags
    CUstreamCaptureMode = CUstreamCaptureMode
    CUfunction_attribute = CUfunction_attribute

    def __init__(self):
        self._current = threading.local()     # like the driver: a current context per thread
        self.mem: dict[int, ctypes.Array] = {}
        self.streams: list[_Stream] = []
        self.host_allocs = 0
        self.async_copies = 0

    def _alloc(self, n):
        b = ctypes.create_string_buffer(int(n))
        p = ctypes.addressof(b)
        self.mem[p] = b
        return p

    # ---- context, errors ---------------------------------------------------------------------
    def cuInit(self, flags): return (OK,)                                   # noqa: E704,N802
    def cuDeviceGet(self, i): return (OK, i)                                # noqa: E704,N802
    def cuDeviceGetCount(self): return (OK, 1)                              # noqa: E704,N802
    def cuDevicePrimaryCtxRetain(self, d): return (OK, object())            # noqa: E704,N802
    def cuCtxSetCurrent(self, c):                                                   # noqa: N802
        self._current.ctx = c
        return (OK,)

    def _no_context(self) -> bool:
        return getattr(self._current, "ctx", None) is None
    def cuDeviceGetName(self, n, d): return (OK, b"fake\0")                 # noqa: E704,N802
    def cuGetErrorName(self, e): return (OK, b"CUDA_ERROR_FAKE")            # noqa: E704,N802

    def cuStreamCreate(self, flags):                                                # noqa: N802
        s = _Stream()
        self.streams.append(s)
        return (OK, s)

    # ---- memory ------------------------------------------------------------------------------
    def cuMemAlloc(self, n):                                                        # noqa: N802
        if self._no_context():
            return (INVALID_CONTEXT, None)
        return (OK, self._alloc(n))

    def cuMemHostAlloc(self, n, flags):                                             # noqa: N802
        if self._no_context():
            return (INVALID_CONTEXT, None)
        self.host_allocs += 1
        return (OK, self._alloc(n))

    def cuMemFreeHost(self, p):                                                     # noqa: N802
        del self.mem[int(p)]
        return (OK,)

    def cuMemsetD8(self, p, v, n):                                                  # noqa: N802
        ctypes.memset(int(p), v, n)
        return (OK,)

    def cuMemcpyHtoD(self, dst, src, n):                                            # noqa: N802
        ctypes.memmove(int(dst), int(src), n)
        return (OK,)

    def cuMemcpyDtoH(self, dst, src, n):                                            # noqa: N802
        ctypes.memmove(int(dst), int(src), n)
        return (OK,)

    def _copy_async(self, dst, src, n, stream):
        if self._no_context():
            return (INVALID_CONTEXT,)
        self.async_copies += 1
        dst, src = int(dst), int(src)
        stream.put(lambda: ctypes.memmove(dst, src, n))
        return (OK,)

    cuMemcpyHtoDAsync = cuMemcpyDtoHAsync = cuMemcpyDtoDAsync = _copy_async

    # ---- streams, events ---------------------------------------------------------------------
    def cuStreamSynchronize(self, s):                                               # noqa: N802
        if self._no_context():
            return (INVALID_CONTEXT,)
        s.run_until()
        return (OK,)

    def cuEventCreate(self, flags): return (OK, _Event())                   # noqa: E704,N802
    def cuEventDestroy(self, e): return (OK,)                               # noqa: E704,N802

    def cuEventRecord(self, e, s):                                                  # noqa: N802
        e.recorded += 1
        n = e.recorded

        def fire():
            e.done = max(e.done, n)
        s.put(fire)
        return (OK,)

    def cuEventSynchronize(self, e):                                                # noqa: N802
        for s in self.streams:
            s.run_until(lambda: e.done >= e.recorded)
        return (OK,)

    # ---- graphs, modules ---------------------------------------------------------------------
    def cuStreamBeginCapture(self, s, mode):                                        # noqa: N802
        s.capture = []
        return (OK,)

    def cuStreamEndCapture(self, s):                                                # noqa: N802
        g, s.capture = s.capture, None
        return (OK, g)

    def cuGraphInstantiate(self, g, flags): return (OK, list(g))            # noqa: E704,N802

    def cuGraphLaunch(self, ex, s):                                                 # noqa: N802
        for op in ex:
            s.queue.append(op)
        return (OK,)

    def cuModuleLoadData(self, image): return (OK, object())                # noqa: E704,N802

    def cuModuleGetFunction(self, m, name):                                         # noqa: N802
        raise NotImplementedError("the fake driver runs copy-only plans")

    def cuLaunchKernel(self, *a):                                                   # noqa: N802
        raise NotImplementedError("the fake driver runs copy-only plans")


class CopyArtifact:
    """A copy-only CUDA step: ``echo`` = the ``tokens`` input, ``sampling.token`` = the
    ``positions`` input (i32). With ``tokens`` fed back from ``sampling.token``, step n reads as
    ``echo`` the position of step n-1."""

    # a module with no functions: what a real device loads for a plan without kernels
    ptx = ".version 6.0\n.target sm_50\n.address_size 64\n"

    def __init__(self):
        i32 = lambda name, bid, shape: {"name": name, "buffer": bid, "dtype": "int32",  # noqa
                                        "shape": list(shape), "nbytes": 4}
        self.plan = {
            "kernels": [], "dispatches": [],
            "buffers": [{"id": i, "role": r, "nbytes": 4} for i, r in
                        enumerate(["input", "input", "output", "output"])],
            "inputs": [i32("tokens", 0, (1, 1)), i32("positions", 1, (1, 1))],
            "params": [],
            "outputs": [i32("sampling.token", 2, (1,)), i32("echo", 3, (1,))],
            "launches": [{"op": "copy", "src": 0, "dst": 3, "nbytes": 4},
                         {"op": "copy", "src": 1, "dst": 2, "nbytes": 4}]}
