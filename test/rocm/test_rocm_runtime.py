"""The ROCm runtime over the fake HSA library (:mod:`fake_hsa`): record/replay packets,
publication order, doorbell, ring wrap-around, bounded waits and poisoning, the store fence
rule, typed errors. The last test runs on a real HSA runtime and skips without one."""

from __future__ import annotations

import ctypes
import struct
import time
from types import SimpleNamespace

import numpy as np
import pytest

import fake_hsa
from fake_hsa import FakeHsa, f32, fake_code_object, kernel
from poot.backends.rocm import aql, hsa as hsa_mod
from poot.backends.rocm.hsa import Hsa, HsaError, HsaTimeout, NoRocmRuntime
from poot.backends.gpu.artifact import BufType
from poot.backends.rocm.runtime import (ArchMismatch, DevicePoisoned, RingPlacementError,
                                        RocmDevice, RocmError, open_device)
from poot.runtime.device import DeviceError

N = 256                     # elements per buffer
WG = 64                     # work-items per workgroup


@kernel(2)
def add_one(fake, args, d):
    n = d["grid_size_x"]                  # work-items: the whole vector
    f32(args[1], n)[:] = f32(args[0], n) + 1


@kernel(2)
def twice(fake, args, d):
    n = d["grid_size_x"]
    f32(args[1], n)[:] = f32(args[0], n) * 2


def spec(i, role, name):
    return {"id": i, "role": role, "name": name, "dtype": "float32", "shape": [N],
            "nbytes": 4 * N}


def artifact(launches=None, arch="gfx942", code=None, kernarg_size=64):
    """A hand-built ROCm artifact: x -> add_one -> t (private) -> twice -> y."""
    if launches is None:
        launches = [{"op": "kernel", "kernel": 0, "grid": [N // WG], "block": [WG],
                     "args": [0, 1]},
                    {"op": "kernel", "kernel": 1, "grid": [N // WG], "block": [WG],
                     "args": [1, 2]}]
    plan = {"entry": "step", "target": {"arch": arch, "wavefront_size": 64},
            "kernels": ["add_one", "twice"],
            "buffers": [spec(0, "input", "x"), spec(1, "value", "t"), spec(2, "output", "y")],
            "launches": launches,
            "dispatches": [{"callee": "d0", "kind": "elementwise", "args": [0], "outs": [2],
                            "first": 0, "count": len(launches)}],
            "inputs": [{"name": "x", "buffer": 0, "dtype": "float32", "shape": [N],
                        "nbytes": 4 * N}],
            "params": [],
            "outputs": [{"name": "y", "buffer": 2, "dtype": "float32", "shape": [N],
                         "nbytes": 4 * N}]}
    info = {"kernarg_size": kernarg_size}
    code = code if code is not None else {
        arch: fake_code_object(arch, {"add_one": info, "twice": info})}
    return SimpleNamespace(plan=plan, code_objects=code, meta={})


def make(**kw):
    fkw = {k: kw.pop(k) for k in ("arch", "apu", "queue_max", "gpu", "host_pools") if k in kw}
    fake = FakeHsa(**fkw)
    fake.kernels.update(add_one=add_one, twice=twice)
    kw.setdefault("timeout_s", 0.2)
    return fake, RocmDevice(Hsa(fake, fake.memory), **kw)


def step(dev, art=None, copies=()):
    k = dev.load(art or artifact())
    bufs = [dev.alloc(a.type) for a in k.args]
    return k, bufs, dev.record(k, bufs, copies)


def ring_stores(fake):
    return [e for e in fake.log if e[0] in ("write", "release32", "doorbell", "add")]


# ---- record / replay --------------------------------------------------------------------
def test_replay_computes_and_reuses_the_same_packets():
    fake, dev = make()
    k, (x, y), rec = step(dev)
    for r in range(3):
        v = np.arange(N, dtype=np.float32) * (r + 1)
        dev.upload(x, v)
        dev.replay(rec)
        np.testing.assert_array_equal(dev.download(y), (v + 1) * 2)
    assert fake.violations == []
    assert len(fake.processed) == 6
    assert fake.processed[0::2] == [fake.processed[0]] * 3      # byte-identical each replay
    assert fake.processed[1::2] == [fake.processed[1]] * 3
    assert dev.records == 1 and dev.replays == 3


def test_packets_carry_kernarg_addresses_and_grid_in_work_items():
    fake, dev = make()
    k, (x, y), rec = step(dev)
    t = k.private[1]
    dev.replay(rec)
    dev.synchronize()
    p0, p1 = (aql.decode_dispatch(p) for p in fake.processed)
    for p, want in ((p0, [x.ptr, t.ptr]), (p1, [t.ptr, y.ptr])):
        args = struct.unpack("<2Q", ctypes.string_at(p["kernarg_address"], 16))
        assert list(args) == want
        # the rest of the kernarg segment (hidden arguments) is zero
        assert ctypes.string_at(p["kernarg_address"] + 16, 48) == bytes(48)
        assert p["kernarg_address"] % 16 == 0
        assert (p["grid_size_x"], p["workgroup_size_x"], p["dimensions"]) == (N, WG, 1)
        assert p["type"] == aql.PACKET_TYPE_KERNEL_DISPATCH and p["barrier"] == 1
    # in order; system scope at the step's edges, agent scope between its kernels
    assert (p0["acquire"], p0["release"]) == (aql.FENCE_SCOPE_SYSTEM, aql.FENCE_SCOPE_AGENT)
    assert (p1["acquire"], p1["release"]) == (aql.FENCE_SCOPE_AGENT, aql.FENCE_SCOPE_SYSTEM)
    # only the last packet signals completion
    assert p0["completion_signal"] == 0 and p1["completion_signal"] == dev.done
    syms = {s["name"]: s for s in fake._objects.values()}
    assert p0["kernel_object"] == syms["add_one"]["kernel_object"]


def test_kernarg_blocks_are_filled_at_record_time():
    fake, dev = make()
    k, (x, y), rec = step(dev)
    # nothing submitted yet, the kernarg blocks already hold the addresses
    assert not [e for e in fake.log if e[0] == "doorbell"] and fake.processed == []
    kas = [aql.decode_dispatch(p)["kernarg_address"] for seg in rec.segments
           for p in seg.packets]
    assert struct.unpack("<2Q", ctypes.string_at(kas[0], 16)) == (x.ptr, k.private[1].ptr)
    assert struct.unpack("<2Q", ctypes.string_at(kas[1], 16)) == (k.private[1].ptr, y.ptr)
    assert fake.allocs[rec.kernargs][2] == fake_hsa.KERNARG        # from the kernarg pool
    assert ([fake_hsa.GPU], rec.kernargs) in fake.allowed          # and open to the GPU


def test_header_written_last_with_release_then_doorbell_with_last_index():
    fake, dev = make()
    k, (x, y), rec = step(dev)
    doorbells = []
    for r in range(2):
        fake.log.clear()
        dev.replay(rec)
        ring = [e for e in fake.log if e[0] in ("write", "release32", "doorbell")]
        # per packet: the 60-byte body at slot+4, then the 32-bit header word at slot
        assert [e[0] for e in ring] == ["write", "release32", "write", "release32", "doorbell"]
        for j, (w, h) in enumerate(((ring[0], ring[1]), (ring[2], ring[3]))):
            assert w[1] == h[1] + 4 and w[2] == 60
            assert (h[1] - fake.queue["base"]) // 64 == 2 * r + j
            assert h[2] & 0xFF == aql.PACKET_TYPE_KERNEL_DISPATCH      # header, low half
            assert (h[2] >> 8) & 1 == 1 and h[2] >> 16 == 1          # barrier; setup: 1 dim
            assert h[2] == aql.header_word(rec.segments[0].packets[j])
        doorbells.append(ring[-1][1])
    # the doorbell carries the index of the last packet written: 1, then 3
    assert doorbells == [1, 3]
    assert fake.signals[fake.queue["doorbell"]] == 3
    assert fake.violations == []


def test_ring_wraps_around():
    fake, dev = make(queue_packets=4)
    three = [{"op": "kernel", "kernel": 0, "grid": [N // WG], "block": [WG], "args": [0, 1]},
             {"op": "kernel", "kernel": 1, "grid": [N // WG], "block": [WG], "args": [1, 2]},
             {"op": "kernel", "kernel": 0, "grid": [N // WG], "block": [WG], "args": [2, 2]}]
    k, (x, y), rec = step(dev, artifact(three))
    assert dev.ring_size == 4
    base = fake.queue["base"]
    v = np.arange(N, dtype=np.float32)
    dev.upload(x, v)
    dev.replay(rec)
    fake.log.clear()
    dev.replay(rec)                                  # indices 3, 4, 5 -> slots 3, 0, 1
    slots = [(e[1] - base) // 64 for e in fake.log if e[0] == "release32"]
    assert slots == [3, 0, 1]
    assert [e for e in fake.log if e[0] == "doorbell"] == [("doorbell", 5)]
    np.testing.assert_array_equal(dev.download(y), (v + 1) * 2 + 1)
    assert fake.violations == []


def test_a_step_longer_than_the_ring_is_submitted_in_ring_sized_chunks():
    fake, dev = make(queue_packets=4)
    six = [{"op": "kernel", "kernel": 0, "grid": [N // WG], "block": [WG],
            "args": [0, 1] if i == 0 else [1, 1]} for i in range(5)]
    six.append({"op": "kernel", "kernel": 1, "grid": [N // WG], "block": [WG],
                "args": [1, 2]})
    k, (x, y), rec = step(dev, artifact(six))
    dev.upload(x, np.zeros(N, np.float32))
    dev.replay(rec)
    assert [e for e in fake.log if e[0] == "doorbell"] == [("doorbell", 3), ("doorbell", 5)]
    np.testing.assert_array_equal(dev.download(y), np.full(N, 10, np.float32))


def test_recorded_copies_run_between_packet_segments():
    fake, dev = make()
    launches = artifact().plan["launches"]
    launches = [launches[0], {"op": "copy", "src": 1, "dst": 2, "nbytes": 4 * N},
                {"op": "kernel", "kernel": 1, "grid": [N // WG], "block": [WG],
                 "args": [2, 1]}]
    k, (x, y), rec = step(dev, artifact(launches))
    rec2 = dev.record(k, [x, y], copies=[(y, x)])
    assert [s.copy is None for s in rec2.segments] == [True, False, True, False]
    v = np.arange(N, dtype=np.float32)
    dev.upload(x, v)
    dev.replay(rec2)
    np.testing.assert_array_equal(dev.download(y), v + 1)            # the copy into y
    np.testing.assert_array_equal(dev.download(x), v + 1)            # then y -> x


# ---- bounded waits, poisoning ----------------------------------------------------------
def test_a_signal_that_never_completes_times_out_and_poisons():
    fake, dev = make(timeout_s=0.1)
    k, (x, y), rec = step(dev)
    fake.process = False                             # the GPU never runs the packets
    dev.replay(rec)
    t0 = time.monotonic()
    with pytest.raises(HsaTimeout, match="timed out after 0.1 s") as e:
        dev.synchronize()
    assert time.monotonic() - t0 < 2 and isinstance(e.value, DeviceError)
    for call in (lambda: dev.download(y), lambda: dev.replay(rec),
                 lambda: dev.alloc(BufType("float32", (4,), 16)), dev.synchronize):
        with pytest.raises(DevicePoisoned, match="poisoned: timed out"):
            call()


def test_waiting_for_free_slots_is_bounded_and_poisons():
    fake, dev = make(queue_packets=4, timeout_s=0.1)
    six = [{"op": "kernel", "kernel": 0, "grid": [N // WG], "block": [WG],
            "args": [0, 1]}] * 6
    k, (x, y), rec = step(dev, artifact(six))
    fake.process = False
    with pytest.raises(HsaTimeout, match="free queue slots"):
        dev.replay(rec)
    with pytest.raises(DevicePoisoned, match="free queue slots"):
        dev.replay(rec)


def test_a_queue_error_poisons_the_device():
    fake, dev = make()
    k, (x, y), rec = step(dev)
    dev.replay(rec)
    fake.raise_queue_error()
    with pytest.raises(DevicePoisoned, match="poisoned: queue error 0x1016"):
        dev.replay(rec)
    with pytest.raises(DevicePoisoned, match="queue exception"):
        dev.download(y)
    assert dev.poisoned.startswith("queue error")


# ---- the store fence rule ---------------------------------------------------------------
def test_discrete_device_ring_fences_before_headers_and_doorbell():
    fake, dev = make(ring="device")
    k, (x, y), rec = step(dev)
    fake.log.clear()
    dev.replay(rec)
    seq = [(e[0], e[1] if e[0] == "add" else None) for e in fake.log
           if e[0] != "add" or e[2] == 0]
    kinds = [s[0] for s in seq]
    assert kinds == ["write", "write", "add", "release32", "release32", "add", "doorbell"]
    fence = {s[1] for s in seq if s[0] == "add"}
    assert len(fence) == 1 and dev.done not in fence        # a private fence signal
    assert fake.violations == []


def test_system_ring_has_no_fence():
    fake, dev = make()
    k, (x, y), rec = step(dev)
    fake.log.clear()
    dev.replay(rec)
    assert not [e for e in fake.log if e[0] == "add" and e[2] == 0]
    assert [e for e in fake.log if e[0] == "add"] == [("add", dev.done, 1)]


def test_apu_refuses_a_device_memory_ring_and_uses_system_memory():
    with pytest.raises(RingPlacementError, match="integrated GPU"):
        make(apu=True, ring="device")
    fake, dev = make(apu=True)
    assert dev.is_apu and dev.ring == "system"
    k, (x, y), rec = step(dev)
    dev.upload(x, np.ones(N, np.float32))
    dev.replay(rec)
    np.testing.assert_array_equal(dev.download(y), np.full(N, 4, np.float32))


# ---- typed errors ------------------------------------------------------------------------
def test_missing_library_is_a_typed_error(monkeypatch):
    hsa_mod.use_library(None)
    monkeypatch.setattr(hsa_mod, "LIBRARY", "libhsa-runtime64-poot-absent.so.1")
    with pytest.raises(NoRocmRuntime, match=r"no ROCm runtime \(libhsa-runtime64.so.1 not "
                                            r"found\)") as e:
        Hsa()
    assert isinstance(e.value, DeviceError)
    with pytest.raises(DeviceError, match="no ROCm runtime"):
        open_device()
    ok, why = hsa_mod.runtime_available()
    assert not ok and "no ROCm runtime" in why


def test_real_loader_sets_every_signature(monkeypatch):
    class Fn:
        restype = argtypes = None

    class Lib:
        def __init__(self, name, skip=()):
            self.name = name
            for f in hsa_mod.SIGNATURES:
                if f not in skip:
                    setattr(self, f, Fn())

    hsa_mod.use_library(None)
    monkeypatch.setattr(ctypes, "CDLL", lambda name: Lib(name))
    lib, mem = hsa_mod.library()
    assert lib.name == "libhsa-runtime64.so.1" and type(mem) is hsa_mod.MemoryOps
    assert lib.hsa_queue_create.argtypes[3] is hsa_mod.QUEUE_CALLBACK
    assert lib.hsa_signal_wait_scacquire.restype is ctypes.c_int64
    assert all(getattr(lib, f).argtypes is not None for f in hsa_mod.SIGNATURES)
    monkeypatch.setattr(ctypes, "CDLL", lambda name: Lib(name, skip={"hsa_executable_create_alt"}))
    with pytest.raises(NoRocmRuntime, match="has no hsa_executable_create_alt"):
        hsa_mod.library()


def test_upload_rows_writes_only_those_rows():
    fake, dev = make()
    b = dev.alloc(BufType("float32", (4, 3), 48))
    dev.upload_rows(b, 2, np.full((1, 3), 7, np.float32))
    want = np.zeros((4, 3), np.float32)
    want[2] = 7
    np.testing.assert_array_equal(dev.download(b), want)
    with pytest.raises(RocmError, match="at row 4"):
        dev.upload_rows(b, 4, np.ones((1, 3), np.float32))


def test_open_device_with_an_injected_library():
    fake = FakeHsa()
    hsa_mod.use_library(fake, fake.memory)
    try:
        dev = open_device()
    finally:
        hsa_mod.use_library(None)
    assert isinstance(dev, RocmDevice) and dev.arch == "gfx942" and dev.wavefront_size == 64
    assert "hsa_init" in fake.calls and "hsa_queue_create" in fake.calls


def test_arch_mismatch_names_both():
    fake, dev = make(arch="gfx942")
    art = artifact(code={"gfx90a": fake_code_object("gfx90a", ["add_one", "twice"]),
                         "gfx1100": b"x"})
    with pytest.raises(ArchMismatch, match=r"gfx942.*\['gfx1100', 'gfx90a'\]"):
        dev.load(art)
    # a key with target features matches its base arch
    art = artifact(code={"gfx942:sramecc+:xnack-": fake_code_object("gfx942",
                                                                      ["add_one", "twice"])})
    assert dev.load(art).symbols[0]["kernarg_size"] == 64


def test_failed_hsa_call_names_the_call_and_status():
    fake, dev = make()
    with pytest.raises(HsaError, match="hsa_code_object_reader_create_from_memory failed: "
                                       "HSA_STATUS_ERROR_INVALID_CODE_OBJECT") as e:
        dev.load(artifact(code={"gfx942": b"\x7fELF not a code object"}))
    assert e.value.call == "hsa_code_object_reader_create_from_memory"
    art = artifact(code={"gfx942": fake_code_object("gfx942", ["add_one"])})
    with pytest.raises(HsaError, match="hsa_executable_get_symbol_by_name"):
        dev.load(art)                                # kernel 'twice' is not in it


def test_no_gpu_agent_and_bad_bindings():
    with pytest.raises(RocmError, match="no GPU agent"):
        make(gpu=False)
    fake, dev = make()
    k = dev.load(artifact())
    with pytest.raises(RocmError, match="needs 1024 bytes, bound 16"):
        dev.record(k, [dev.alloc(BufType("float32", (4,), 16)), dev.alloc(k.args[1].type)])
    big = artifact([{"op": "kernel", "kernel": 0, "grid": [1], "block": [2048],
                     "args": [0, 1]}])
    with pytest.raises(RocmError, match="2048 work-items"):
        dev.load(big)


def test_buffers_are_zeroed_and_roundtrip_through_staging():
    fake, dev = make()
    b = dev.alloc(BufType("float32", (3, 5), 60))
    np.testing.assert_array_equal(dev.download(b), np.zeros((3, 5), np.float32))
    v = np.arange(15, dtype=np.float32).reshape(3, 5)
    dev.upload(b, v)
    np.testing.assert_array_equal(dev.download_async(b).wait(), v)
    with pytest.raises(RocmError, match="cannot write 8 bytes"):
        dev.upload(b, np.zeros(2, np.float32))


def test_staging_falls_back_to_the_kernarg_pool_and_close_shuts_down():
    fake, dev = make(host_pools=(fake_hsa.KERNARG,))
    assert dev.host_pool == dev.kernarg_pool == fake_hsa.KERNARG
    k, (x, y), rec = step(dev)
    dev.upload(x, np.ones(N, np.float32))
    dev.replay(rec)
    np.testing.assert_array_equal(dev.download(y), np.full(N, 4, np.float32))
    dev.close()
    assert fake.initialized == 0 and "hsa_queue_destroy" in fake.calls
    with pytest.raises(RocmError, match="no kernarg / fine-grained system memory pool"):
        make(host_pools=())


def test_runtime_modules_import_no_mlir():
    """Upstream MLIR (``mlir.ir``, its native libraries) is not imported: poot's own
    ``mlir.dialects.poot`` name, registered by poot's pure-Python dialect tables, is fine."""
    import subprocess
    import sys

    code = ("import sys; import poot.backends.rocm.runtime, poot.backends.rocm.hsa, "
            "poot.backends.rocm.aql; "
            "bad = sorted(m for m in sys.modules if m in ('mlir', 'mlir.ir') "
            "or m.startswith('mlir._mlir_libs')); "
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


# ---- a real HSA runtime --------------------------------------------------------------------
def test_real_runtime_opens_a_gpu():
    ok, why = hsa_mod.runtime_available()
    if not ok:
        pytest.skip(f"needs a real ROCm runtime and AMD GPU: {why}")
    dev = open_device()
    assert dev.arch.startswith("gfx") and dev.wavefront_size in (32, 64)
    b = dev.alloc(BufType("float32", (1024,), 4096))
    v = np.arange(1024, dtype=np.float32)
    dev.upload(b, v)
    np.testing.assert_array_equal(dev.download(b), v)


@pytest.mark.parametrize("bad", ["abc", "0", "-1", "inf"])
def test_a_bad_wait_bound_is_refused_by_name(monkeypatch, bad):
    """POOT_ROCM_TIMEOUT_S that is not a positive finite number of seconds is a typed error
    naming it, not a ValueError from float() or a wait that never ends."""
    monkeypatch.setenv("POOT_ROCM_TIMEOUT_S", bad)
    with pytest.raises(RocmError, match="POOT_ROCM_TIMEOUT_S"):
        make(timeout_s=None)
