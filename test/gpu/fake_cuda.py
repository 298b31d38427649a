"""A test-side stand-in for ``cuda.bindings.driver``: the few driver calls the CUDA runtime's
buffers, copies, events and graphs use, over host memory, with a *lazy* stream.

Queued work (``*Async`` copies, graph launches, event records) runs only when the host waits
for it (``cuStreamSynchronize``, ``cuEventSynchronize``), so a host array or a page-locked slot
rewritten before the stream read it shows up as a wrong value, as on a real device. The
synchronous ``cuMemcpyHtoD``/``DtoH`` do *not* drain the stream (a per-thread default stream's
semantics): the runtime must order them itself. Kernel launches are not emulated: plans whose
launches are copies only.

Several devices: ``devices`` GPUs (2 by default), each with a primary context, plus contexts
made with ``cuCtxCreate``. The current context is per thread; a device allocation, stream or
event belongs to the context current when it was made, and a call that uses one from another
context than the current one fails (CUDA_ERROR_INVALID_CONTEXT), so work run in the wrong
context shows. ``cuStreamWaitEvent`` queues a wait that runs the event's stream up to the
record the wait saw; ``cuMemcpyPeerAsync`` checks each side's context."""

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
    CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8


OK = 0
INVALID_DEVICE = 101
#: what the driver answers a thread with no current context (or a handle of another context)
INVALID_CONTEXT = 201
INVALID_HANDLE = 400
NOT_READY = 600
PEER_ACCESS_ALREADY_ENABLED = 704
ERROR_NAMES = {INVALID_DEVICE: "CUDA_ERROR_INVALID_DEVICE",
               INVALID_CONTEXT: "CUDA_ERROR_INVALID_CONTEXT",
               INVALID_HANDLE: "CUDA_ERROR_INVALID_HANDLE", NOT_READY: "CUDA_ERROR_NOT_READY",
               PEER_ACCESS_ALREADY_ENABLED: "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED"}


class Context:
    """A fake CUcontext: its device ordinal, primary or created; ``int()`` gives its handle."""

    _next = 1

    def __init__(self, ordinal: int, primary: bool):
        self.ordinal, self.primary, self.destroyed = ordinal, primary, False
        self.handle = Context._next
        Context._next += 1

    def __int__(self):
        return self.handle

    def __repr__(self):
        return f"<ctx {self.handle} dev{self.ordinal}{' primary' if self.primary else ''}>"


class _Event:
    def __init__(self, ctx=None):
        self.ctx = ctx
        self.recorded = 0
        self.done = 0
        self.stream = None        # the stream of its last record


class _Stream:
    def __init__(self, ctx=None):
        self.ctx = ctx
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

    def __init__(self, devices: int = 2, peer_access: bool = True,
                 total_memory: int = 1 << 30):
        self._current = threading.local()     # like the driver: a current context per thread
        self.dynamic_shared: dict = {}         # function -> its dynamic workgroup memory limit
        self.devices = devices
        self.peer_access = peer_access        # what cuDeviceCanAccessPeer answers (2 GPUs)
        self.total_memory = total_memory
        self.mem: dict[int, ctypes.Array] = {}
        self.owner: dict[int, Context] = {}   # device allocation -> its context
        self.streams: list[_Stream] = []
        self.events: list[_Event] = []
        self.contexts: list[Context] = []
        self._primary: dict[int, Context] = {}
        self.primary_refs: dict[int, int] = {}
        self.peer_enabled: set[tuple[int, int]] = set()   # (context, peer context) handles
        self.host_allocs = 0
        self.async_copies = 0
        self.peer_copies = 0
        self.set_current_calls = 0
        self.queries = 0
        self.waits: list[tuple[_Stream, _Event]] = []

    def _alloc(self, n):
        b = ctypes.create_string_buffer(int(n))
        p = ctypes.addressof(b)
        self.mem[p] = b
        return p

    # ---- context, errors ---------------------------------------------------------------------
    def cuInit(self, flags): return (OK,)                                   # noqa: E704,N802

    def cuDeviceGet(self, i):                                                       # noqa: N802
        return (OK, i) if 0 <= i < self.devices else (INVALID_DEVICE, None)

    def cuDeviceGetCount(self): return (OK, self.devices)                   # noqa: E704,N802

    def cuDevicePrimaryCtxRetain(self, d):                                          # noqa: N802
        if d not in self._primary:
            self._primary[d] = Context(d, primary=True)
            self.contexts.append(self._primary[d])
        self.primary_refs[d] = self.primary_refs.get(d, 0) + 1
        return (OK, self._primary[d])

    def cuDevicePrimaryCtxRelease(self, d):                                         # noqa: N802
        self.primary_refs[d] -= 1
        return (OK,)

    def cuCtxCreate(self, *args):                                                   # noqa: N802
        """cuda-python 13's ``(params, flags, dev)``."""
        if len(args) != 3:
            raise TypeError(f"cuCtxCreate() takes exactly 3 positional arguments "
                            f"({len(args)} given)")
        dev = args[2]
        if not 0 <= dev < self.devices:
            return (INVALID_DEVICE, None)
        c = Context(dev, primary=False)
        self.contexts.append(c)
        self._current.ctx = c                 # the new context is current on this thread
        return (OK, c)

    def cuCtxDestroy(self, c):                                                      # noqa: N802
        c.destroyed = True
        if self.current() is c:
            self._current.ctx = None
        return (OK,)

    def cuCtxSetCurrent(self, c):                                                   # noqa: N802
        self.set_current_calls += 1
        self._current.ctx = c
        return (OK,)

    def cuCtxGetCurrent(self): return (OK, self.current())                  # noqa: E704,N802

    def current(self):
        """The calling thread's current context (None when it has none)."""
        return getattr(self._current, "ctx", None)

    def _no_context(self) -> bool:
        c = self.current()
        return c is None or getattr(c, "destroyed", False)

    def _foreign(self, *handles) -> bool:
        """No current context, or a stream/event/device pointer of another context."""
        if self._no_context():
            return True
        cur = self.current()
        for h in handles:
            ctx = h if isinstance(h, Context) else getattr(h, "ctx", None)
            if isinstance(h, int):
                ctx = self.owner_of(h)
            if ctx is not None and ctx is not cur:
                return True
        return False

    def owner_of(self, p):
        """The context of the device allocation that holds address ``p`` (None: host memory
        or unknown)."""
        p = int(p)
        for base, b in self.mem.items():
            if base <= p < base + ctypes.sizeof(b):
                return self.owner.get(base)
        return None

    def cuDeviceGetName(self, n, d): return (OK, b"fake\0")                 # noqa: E704,N802

    def cuGetErrorName(self, e):                                                    # noqa: N802
        return (OK, ERROR_NAMES.get(int(e), "CUDA_ERROR_FAKE").encode())

    def cuDeviceCanAccessPeer(self, d, peer):                                       # noqa: N802
        return (OK, int(self.peer_access and d != peer))

    def cuCtxEnablePeerAccess(self, peer, flags):                                   # noqa: N802
        if self._no_context():
            return (INVALID_CONTEXT,)
        key = (int(self.current()), int(peer))
        if key in self.peer_enabled:
            return (PEER_ACCESS_ALREADY_ENABLED,)
        self.peer_enabled.add(key)
        return (OK,)

    def cuMemGetInfo(self):                                                         # noqa: N802
        if self._no_context():
            return (INVALID_CONTEXT, None, None)
        dev = self.current().ordinal
        used = sum(ctypes.sizeof(self.mem[p]) for p, c in self.owner.items()
                   if c.ordinal == dev and not c.destroyed)
        return (OK, self.total_memory - used, self.total_memory)

    def cuStreamCreate(self, flags):                                                # noqa: N802
        if self._no_context():
            return (INVALID_CONTEXT, None)
        s = _Stream(self.current())
        self.streams.append(s)
        return (OK, s)

    def cuStreamDestroy(self, s):                                                   # noqa: N802
        if s in self.streams:
            self.streams.remove(s)
        return (OK,)

    # ---- memory ------------------------------------------------------------------------------
    def cuMemAlloc(self, n):                                                        # noqa: N802
        if self._no_context():
            return (INVALID_CONTEXT, None)
        p = self._alloc(n)
        self.owner[p] = self.current()
        return (OK, p)

    def cuMemHostAlloc(self, n, flags):                                             # noqa: N802
        if self._no_context():
            return (INVALID_CONTEXT, None)
        self.host_allocs += 1
        return (OK, self._alloc(n))

    def cuMemFreeHost(self, p):                                                     # noqa: N802
        del self.mem[int(p)]
        return (OK,)

    def cuMemsetD8(self, p, v, n):                                                  # noqa: N802
        if self._foreign(int(p)):
            return (INVALID_CONTEXT,)
        ctypes.memset(int(p), v, n)
        return (OK,)

    def cuMemcpyHtoD(self, dst, src, n):                                            # noqa: N802
        if self._foreign(int(dst)):
            return (INVALID_CONTEXT,)
        ctypes.memmove(int(dst), int(src), n)
        return (OK,)

    def cuMemcpyDtoH(self, dst, src, n):                                            # noqa: N802
        if self._foreign(int(src)):
            return (INVALID_CONTEXT,)
        ctypes.memmove(int(dst), int(src), n)
        return (OK,)

    def _copy_async(self, dst, src, n, stream):
        if self._foreign(stream, int(dst), int(src)):
            return (INVALID_CONTEXT,)
        self.async_copies += 1
        dst, src = int(dst), int(src)
        stream.put(lambda: ctypes.memmove(dst, src, n))
        return (OK,)

    def cuMemcpyPeerAsync(self, dst, dst_ctx, src, src_ctx, n, stream):            # noqa: N802
        if self._foreign(stream):
            return (INVALID_CONTEXT,)
        if self.owner_of(dst) is not dst_ctx or self.owner_of(src) is not src_ctx:
            return (INVALID_HANDLE,)
        self.peer_copies += 1
        dst, src = int(dst), int(src)
        stream.put(lambda: ctypes.memmove(dst, src, n))
        return (OK,)

    cuMemcpyHtoDAsync = cuMemcpyDtoHAsync = cuMemcpyDtoDAsync = _copy_async

    # ---- streams, events ---------------------------------------------------------------------
    def cuStreamSynchronize(self, s):                                               # noqa: N802
        if self._foreign(s):
            return (INVALID_CONTEXT,)
        s.run_until()
        return (OK,)

    def cuEventCreate(self, flags):                                                 # noqa: N802
        if self._no_context():
            return (INVALID_CONTEXT, None)
        e = _Event(self.current())
        self.events.append(e)
        return (OK, e)

    def cuEventDestroy(self, e): return (OK,)                               # noqa: E704,N802

    def cuEventRecord(self, e, s):                                                  # noqa: N802
        if self._foreign(s, e):
            return (INVALID_CONTEXT,)
        e.recorded += 1
        e.stream = s
        n = e.recorded

        def fire():
            e.done = max(e.done, n)
        s.put(fire)
        return (OK,)

    def cuEventSynchronize(self, e):                                                # noqa: N802
        for s in self.streams:
            s.run_until(lambda: e.done >= e.recorded)
        return (OK,)

    def cuEventQuery(self, e):                                                      # noqa: N802
        """Whether ``e``'s last record ran: never runs the lazy stream (a real query does
        not wait either), so a record still queued answers CUDA_ERROR_NOT_READY."""
        self.queries += 1
        return (OK,) if e.done >= e.recorded else (NOT_READY,)

    def cuStreamWaitEvent(self, s, e, flags):                                       # noqa: N802
        """Work queued on ``s`` afterwards waits for ``e``'s record as of now (the event may
        be of another context): running the wait runs the event's stream that far."""
        if self._foreign(s):
            return (INVALID_CONTEXT,)
        self.waits.append((s, e))
        n, src = e.recorded, e.stream
        if src is not None and n:
            s.put(lambda: src.run_until(lambda: e.done >= n))
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
        if self._foreign(s):
            return (INVALID_CONTEXT,)
        for op in ex:
            s.queue.append(op)
        return (OK,)

    def cuModuleLoadData(self, image): return (OK, object())                # noqa: E704,N802

    def cuModuleGetFunction(self, m, name):                                         # noqa: N802
        raise NotImplementedError("the fake driver runs copy-only plans")

    def cuLaunchKernel(self, *a):                                                   # noqa: N802
        raise NotImplementedError("the fake driver runs copy-only plans")

    #: most dynamic workgroup memory a kernel may be given (an sm_90 block's 227 KB)
    max_dynamic_shared = 227 << 10

    def cuFuncGetAttribute(self, attr, f):                                          # noqa: N802
        return (OK, 1024) if attr == CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK \
            else (OK, self.dynamic_shared.get(f, 0))

    def cuFuncSetAttribute(self, f, attr, value):                                   # noqa: N802
        """Only the dynamic workgroup memory limit, refused past :attr:`max_dynamic_shared`
        (CUDA_ERROR_INVALID_VALUE)."""
        if attr != CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES or \
                value > self.max_dynamic_shared:
            return (1,)
        self.dynamic_shared[f] = value
        return (OK,)


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
