"""Several CUDA devices in one process (a layer pipeline across GPUs): each CudaDevice runs in
its own context whatever was made last or used before, ``copy_from`` moves a buffer between
devices (``cuMemcpyPeerAsync`` between contexts), ``signal``/``wait_for`` order it.

The tests marked ``both`` run on ``fake_cuda`` (two fake GPUs; a call in the wrong context
fails there) and on the real driver (skipped without a device; those needing two GPUs skip on
one). The others inspect the fake driver's bookkeeping."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from fake_cuda import FakeDriver

from poot.backends.gpu.artifact import BufType

MAT = ("float32", (4, 8), 128)


@pytest.fixture(params=["fake", "device"])
def both(request, monkeypatch):
    """(runtime module, make(ordinal=0, own_context=False), fake driver or None); devices
    made through ``make`` are closed afterwards."""
    from poot.backends.cuda import runtime

    monkeypatch.setattr(runtime, "_ctx", None)
    monkeypatch.setattr(runtime, "_thread", threading.local())
    drv = None
    if request.param == "fake":
        drv = FakeDriver()
        monkeypatch.setattr(runtime, "_cu", drv)
    else:
        ok, why = runtime.device_available()
        if not ok:
            pytest.skip(f"no CUDA device: {why}")
    cu = runtime.driver()
    runtime._check(cu.cuInit(0), "cuInit")
    count = runtime._check(cu.cuDeviceGetCount(), "cuDeviceGetCount")
    made = []

    def make(ordinal: int = 0, own_context: bool = False):
        if ordinal >= count:
            pytest.skip(f"needs {ordinal + 1} CUDA devices, {count} here")
        d = runtime.CudaDevice(ordinal, own_context=own_context)
        made.append(d)
        return d

    yield runtime, make, drv
    for d in reversed(made):
        d.close()


@pytest.fixture
def fake(monkeypatch):
    """(runtime module, make, FakeDriver) on the fake driver only."""
    from poot.backends.cuda import runtime

    drv = FakeDriver()
    monkeypatch.setattr(runtime, "_cu", drv)
    monkeypatch.setattr(runtime, "_ctx", None)
    monkeypatch.setattr(runtime, "_thread", threading.local())
    return runtime, runtime.CudaDevice, drv


def _mat(seed: int = 0) -> np.ndarray:
    return np.arange(32, dtype=np.float32).reshape(4, 8) * (seed + 1) + 0.5


def _buf(rt, dev, dtype="float32", shape=(4, 8)):
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    return dev.alloc(BufType(dtype, shape, n))


# ---- contexts --------------------------------------------------------------------------------
@pytest.mark.parametrize("order", [(0, 1), (1, 0)])
def test_each_device_works_in_its_own_context(fake, order):
    rt, Dev, drv = fake
    made = {o: Dev(o) for o in order}
    d0, d1 = made[0], made[1]
    assert d0.ctx is not d1.ctx and (d0.ctx.ordinal, d1.ctx.ordinal) == (0, 1)
    bufs = []
    for k, d in enumerate([d0, d1, d1, d0, d1, d0]):       # interleaved
        b = _buf(rt, d)
        assert drv.owner_of(b.ptr) is d.ctx
        d.upload(b, _mat(k))
        bufs.append((d, b, k))
    for d, b, k in reversed(bufs):
        np.testing.assert_array_equal(d.download(b), _mat(k))
    # queued transfers: page-locked slots and their events made in the right context too
    reads = []
    for d, b, k in bufs:
        d.upload_async(b, _mat(k + 10))
        reads.append((d.download_async(b), k))
    for r, k in reads:
        np.testing.assert_array_equal(r.wait(), _mat(k + 10))


def test_context_is_set_only_on_a_switch(fake):
    rt, Dev, drv = fake
    d0, d1 = Dev(0), Dev(1)
    a, b = _buf(rt, d0), _buf(rt, d1)
    n = drv.set_current_calls
    for _ in range(5):
        d1.upload(b, _mat())
        d1.download(b)
        d1.synchronize()
    assert drv.set_current_calls == n                  # d1 was current already
    d0.download(a)
    d1.download(b)
    d0.synchronize()
    assert drv.set_current_calls == n + 3


def test_two_devices_used_on_another_thread(fake):
    """Made on one thread (a loader), used interleaved on another (the engine thread)."""
    rt, Dev, drv = fake
    d0, d1 = Dev(0), Dev(1)
    a, b = _buf(rt, d0), _buf(rt, d1)
    got, errors = [], []

    def run():
        try:
            d1.upload(b, _mat(1))
            d0.upload(a, _mat(0))
            c = _buf(rt, d1)
            got.append(drv.owner_of(c.ptr) is d1.ctx)
            got.append(d0.download(a).sum() == _mat(0).sum())
            got.append(d1.download(b).sum() == _mat(1).sum())
        except Exception as exc:  # noqa: BLE001  (reported below)
            errors.append(exc)

    t = threading.Thread(target=run)
    t.start()
    t.join(30)
    assert not errors, errors
    assert got == [True, True, True]


# ---- copy_from -------------------------------------------------------------------------------
def test_copy_from_moves_the_bytes_between_devices(both):
    rt, make, drv = both
    d0, d1 = make(0), make(1)
    a, b = _buf(rt, d0), _buf(rt, d1)
    d0.upload(a, _mat(3))
    d1.wait_for(d0.signal())
    d1.copy_from(d0, a, b)
    np.testing.assert_array_equal(d1.download(b), _mat(3))
    # and back, the other way round
    c = _buf(rt, d0)
    d1.upload(b, _mat(4))
    d0.wait_for(d1.signal())
    d0.copy_from(d1, b, c)
    np.testing.assert_array_equal(d0.download(c), _mat(4))
    if drv is not None:
        assert drv.peer_copies == 2
        assert drv.peer_enabled == {(int(d1.ctx), int(d0.ctx)), (int(d0.ctx), int(d1.ctx))}


def test_copy_from_waits_for_the_producers_queued_work(both):
    rt, make, drv = both
    d0, d1 = make(0), make(1)
    a, b = _buf(rt, d0), _buf(rt, d1)
    for k in range(3):                   # a replay loop: the same event, re-recorded
        d0.upload_async(a, _mat(k))      # queued on d0's stream, not run yet (lazy fake)
        d1.wait_for(d0.signal())
        d1.copy_from(d0, a, b)
        np.testing.assert_array_equal(d1.download(b), _mat(k))


def test_the_fake_copy_without_a_wait_reads_early(fake):
    """What the wait prevents: the copy runs before the producer's queued upload."""
    rt, Dev, drv = fake
    d0, d1 = Dev(0), Dev(1)
    a, b = _buf(rt, d0), _buf(rt, d1)
    d0.upload_async(a, _mat(5))
    d1.copy_from(d0, a, b)
    assert not d1.download(b).any()


def test_copy_from_refuses_different_sizes(both):
    rt, make, drv = both
    d0 = make(0)
    d1 = make(0, own_context=True)
    a = _buf(rt, d0)
    b = _buf(rt, d1, shape=(2, 8))
    with pytest.raises(rt.CudaError, match=r"128 bytes.*64 bytes"):
        d1.copy_from(d0, a, b)


def test_own_contexts_on_one_gpu_copy_between_them(both):
    rt, make, drv = both
    d0, d1 = make(0, own_context=True), make(0, own_context=True)
    assert int(d0.ctx) != int(d1.ctx)
    a, b = _buf(rt, d0), _buf(rt, d1)
    d0.upload(a, _mat(7))
    d1.wait_for(d0.signal())
    d1.copy_from(d0, a, b)
    np.testing.assert_array_equal(d1.download(b), _mat(7))
    if drv is not None:
        assert drv.owner_of(a.ptr) is d0.ctx and drv.owner_of(b.ptr) is d1.ctx
        assert drv.peer_copies == 1
        assert not drv.peer_enabled                  # one GPU: nothing to enable


def test_copy_within_one_context_is_a_device_copy(fake):
    rt, Dev, drv = fake
    d, same = Dev(0), Dev(0)                          # both on GPU 0's primary context
    assert d.ctx is same.ctx
    a, b, c = _buf(rt, d), _buf(rt, same), _buf(rt, d)
    d.upload(a, _mat(2))
    n = drv.async_copies
    same.copy_from(d, a, b)
    d.copy_from(d, a, c)
    assert drv.async_copies == n + 2 and drv.peer_copies == 0
    np.testing.assert_array_equal(same.download(b), _mat(2))
    np.testing.assert_array_equal(d.download(c), _mat(2))


def test_peer_access_already_enabled_or_impossible(fake):
    rt, Dev, drv = fake
    d0, d1 = Dev(0), Dev(1)
    drv.peer_enabled.add((int(d1.ctx), int(d0.ctx)))  # enabled by someone else before
    a, b = _buf(rt, d0), _buf(rt, d1)
    d0.upload(a, _mat(1))
    d1.wait_for(d0.signal())
    d1.copy_from(d0, a, b)
    np.testing.assert_array_equal(d1.download(b), _mat(1))

    drv.peer_access = False                           # no peer access: copied through the host
    c = _buf(rt, d0)
    d1.upload(b, _mat(6))
    d0.wait_for(d1.signal())
    d0.copy_from(d1, b, c)
    np.testing.assert_array_equal(d0.download(c), _mat(6))
    assert (int(d0.ctx), int(d1.ctx)) not in drv.peer_enabled


# ---- signal, wait_for, memory_info, close ----------------------------------------------------
def test_signal_cycles_a_fixed_ring_of_events(both):
    """signal() creates no event: it records the ring's events in turn, so a marker stays
    distinct from the next SIGNAL_EVENTS - 1 ones."""
    rt, make, drv = both
    d = make(0)
    n = len(drv.events) if drv is not None else 0
    marks = [d.signal() for _ in range(3 * d.SIGNAL_EVENTS)]
    ring = marks[:d.SIGNAL_EVENTS]
    assert len({id(m) for m in ring}) == d.SIGNAL_EVENTS
    assert all(m is ring[i % d.SIGNAL_EVENTS] for i, m in enumerate(marks))
    if drv is not None:
        assert len(drv.events) == n


def test_wait_for_waits_on_the_waiting_devices_stream(fake):
    rt, Dev, drv = fake
    d0, d1 = Dev(0), Dev(1)
    marker = d0.signal()
    d1.wait_for(marker)
    assert drv.waits == [(d1.stream, marker)]
    assert marker.stream is d0.stream and marker.ctx is d0.ctx


def test_memory_info_is_per_device(both):
    rt, make, drv = both
    d0 = make(0)
    free, total = d0.memory_info()
    assert isinstance(free, int) and 0 < free <= total
    if drv is not None:
        d1 = make(1)
        d1.alloc(BufType("uint8", (1 << 20,), 1 << 20))
        assert d1.memory_info()[0] <= total - (1 << 20)
        assert d0.memory_info() == (free, total)


def test_close_destroys_an_own_context(fake):
    rt, Dev, drv = fake
    own, prim = Dev(0, own_context=True), Dev(1)
    ctx = own.ctx
    own.upload_async(_buf(rt, own), _mat())
    own.close()
    own.close()                                       # a second close does nothing
    assert ctx.destroyed and own.ctx is None
    prim.close()
    assert drv.primary_refs[1] == 0
