"""``GilHeldCalls``: a step's queued driver calls through the driver library's own entry
points with the GIL held, on a recording library (runs without a GPU). Each call passes the
handles' addresses and the sizes as the C signature's integers, in the driver's argument
order, under the ``_v2`` symbol ``cuda.h`` maps the plain name to; an error code becomes a
``CudaError`` naming the call; ``cuEventQuery``'s CUDA_ERROR_NOT_READY is an answer, not an
error. And a page-locked slot's wait asks its event before it synchronizes. On a GPU these
calls run in every CUDA step (``bench/gpu_run/engine_check.py``)."""

from __future__ import annotations

import pytest

from poot.backends.cuda import runtime as cuda_rt
from poot.backends.cuda.runtime import CudaError, GilHeldCalls, StreamCalls, stream_calls


class Handle:
    """A cuda-python-like handle: ``int()`` gives its address."""

    def __init__(self, address: int):
        self.address = address

    def __int__(self) -> int:
        return self.address


class RecordingLibrary:
    """Entry points that record ``(symbol, args)`` and return the code set for their symbol
    (0 by default); the ``argtypes`` / ``restype`` the caller sets are kept on them."""

    SYMBOLS = ("cuMemcpyHtoDAsync_v2", "cuMemcpyDtoDAsync_v2", "cuMemcpyDtoHAsync_v2",
               "cuEventRecord", "cuEventQuery", "cuGraphLaunch")

    def __init__(self):
        self.calls: list[tuple[str, tuple]] = []
        self.codes: dict[str, int] = {}
        for name in self.SYMBOLS:
            setattr(self, name, self._entry(name))

    def _entry(self, name):
        def f(*args):
            self.calls.append((name, args))
            return self.codes.get(name, 0)
        return f


class NoDriverModule:
    """``cu`` for the error path: CUresult passes the code through (no cuda-python here)."""

    @staticmethod
    def CUresult(code):  # noqa: N802 (the driver's name)
        return code


def test_each_call_passes_addresses_and_sizes_in_the_drivers_order():
    lib = RecordingLibrary()
    calls = GilHeldCalls(lib, NoDriverModule())
    stream, event, graph = Handle(0x51), Handle(0xE1), Handle(0x6A)
    calls.htod_async(0x9000, 0x7000, 48, stream)
    calls.dtod_async(0x9010, 0x1000, 8, stream)
    calls.dtoh_async(0x7100, 0x9000, 16, stream)
    calls.event_record(event, stream)
    calls.graph_launch(graph, stream)
    assert lib.calls == [("cuMemcpyHtoDAsync_v2", (0x9000, 0x7000, 48, 0x51)),
                         ("cuMemcpyDtoDAsync_v2", (0x9010, 0x1000, 8, 0x51)),
                         ("cuMemcpyDtoHAsync_v2", (0x7100, 0x9000, 16, 0x51)),
                         ("cuEventRecord", (0xE1, 0x51)),
                         ("cuGraphLaunch", (0x6A, 0x51))]
    assert all(type(a) is int for _, args in lib.calls for a in args)
    import ctypes
    assert lib.cuMemcpyHtoDAsync_v2.argtypes == [ctypes.c_uint64, ctypes.c_void_p,
                                                 ctypes.c_size_t, ctypes.c_void_p]
    assert lib.cuEventQuery.restype is ctypes.c_int


def test_an_error_code_names_the_call():
    lib = RecordingLibrary()
    lib.codes["cuGraphLaunch"] = 400          # CUDA_ERROR_INVALID_HANDLE
    calls = GilHeldCalls(lib, NoDriverModule())
    with pytest.raises(CudaError, match="cuGraphLaunch"):
        calls.graph_launch(Handle(1), Handle(2))
    lib.codes["cuEventQuery"] = 700           # CUDA_ERROR_ILLEGAL_ADDRESS: an error
    with pytest.raises(CudaError, match="cuEventQuery"):
        calls.event_done(Handle(3))


def test_event_query_not_ready_is_an_answer():
    lib = RecordingLibrary()
    calls = GilHeldCalls(lib, NoDriverModule())
    assert calls.event_done(Handle(3)) is True
    lib.codes["cuEventQuery"] = 600           # CUDA_ERROR_NOT_READY
    assert calls.event_done(Handle(3)) is False


def test_a_stand_in_driver_gets_the_binding_calls():
    """A test's fake driver module must never reach the real library's entry points."""
    assert type(stream_calls(NoDriverModule())) is StreamCalls


class SyncRecorder:
    def __init__(self):
        self.synced = []

    def cuEventSynchronize(self, event):  # noqa: N802
        self.synced.append(event)
        return (0,)


class Answers(StreamCalls):
    def __init__(self, done: bool):
        super().__init__(None)
        self.done, self.asked = done, 0

    def event_done(self, event) -> bool:
        self.asked += 1
        return self.done


@pytest.mark.parametrize("done", [True, False])
def test_a_slot_wait_synchronizes_only_when_its_copy_is_still_queued(monkeypatch, done):
    rec = SyncRecorder()
    monkeypatch.setattr(cuda_rt, "_cu", rec)
    monkeypatch.setattr(cuda_rt, "_ctx", None)
    slot = cuda_rt._Pinned.__new__(cuda_rt._Pinned)
    slot.calls, slot.event, slot.queued = Answers(done), "event", True
    slot.wait()
    assert slot.calls.asked == 1 and slot.queued is False
    assert rec.synced == ([] if done else ["event"])
    slot.wait()                               # nothing queued: neither asks nor waits
    assert slot.calls.asked == 1
