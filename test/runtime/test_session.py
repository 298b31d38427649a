"""Session record-then-replay on the CPU device, slot buffers, carried state (updated in
place)."""

from __future__ import annotations

import ctypes
import shutil

import numpy as np
import pytest

from exec_graphs import ROWS, WIDTH, cache_step
from poot.compiler import CompileOptions, compile, host_cpu
from poot.runtime import Session, SessionError
from poot.backends.cpu.runtime import CpuDevice

# The executor is under test here, not dispatch fusion: the small graph compiles unfused.
OPTIONS = CompileOptions(fuse=False)


@pytest.fixture(scope="module")
def program():
    return compile(cache_step(), host_cpu(), OPTIONS)


def _engine(program, alias=False, seed=0):
    eng = Session(CpuDevice(), alias_carried=alias)
    w = np.random.default_rng(seed).standard_normal((WIDTH, WIDTH)).astype(np.float32)
    eng.load_weights({"w": w}, program.graph.params)
    return eng, eng.add_entry(program), w


def test_storage_declares_the_cache_alias(program):
    assert [(b.name, b.aliases) for b in program.storage if b.aliases] == [("cache", "cache")]


def test_record_once_then_replay_state_in_place(program):
    """The CPU program updates the cache in place (no out-parameter for it): one buffer for
    the carried state, one recording, replays from the second step on."""
    eng, entry, _ = _engine(program)
    dev = eng.device
    assert entry.in_place == {"cache"} and len(eng._state["cache"].buffers) == 1
    assert program.executable.in_place == {"cache": "cache"}
    assert [n for n, _ in program.executable.outputs] == ["y"]
    x = np.ones((1, WIDTH), np.float32)
    eng.step(entry, {"x": x, "idx": np.array([[0]])})
    assert (dev.records, dev.replays) == (1, 1)
    for i in range(6):
        eng.step(entry, {"idx": np.array([[i % ROWS]])})
    assert (dev.records, dev.replays) == (1, 7)          # only replays from here on
    assert len(entry.recordings) == 1


def test_no_state_no_second_recording():
    from poot.dialects.types import DType, TensorType
    from poot.graph.builder import Builder, TraceLimits

    b = Builder(TraceLimits(max_values=16, max_ops=16, max_literal_bytes=64,
                            max_owned_bytes=4096))
    x = b.input("x", TensorType((4,), DType.F32))
    g = b.finish({"y": x * x})
    eng = Session(CpuDevice())
    entry = eng.add_entry(compile(g, host_cpu(), OPTIONS))
    for v in range(1, 5):
        out = eng.step(entry, {"x": np.full(4, v, np.float32)})
        np.testing.assert_array_equal(out["y"], np.full(4, v * v, np.float32))
    assert (eng.device.records, eng.device.replays) == (1, 4)


def test_slot_buffers_rewritten_in_place(program):
    eng, entry, _ = _engine(program)
    buf = entry.slots["x"]
    for v in (1.0, 2.0, 3.0):
        eng.step(entry, {"x": np.full((1, WIDTH), v, np.float32), "idx": np.array([[0]])})
        assert entry.slots["x"] is buf
        np.testing.assert_array_equal(buf, np.full((1, WIDTH), v, np.float32))
    # an input not given keeps its last value
    eng.step(entry, {"idx": np.array([[1]])})
    np.testing.assert_allclose(eng.read_state("cache")[1],
                               (np.full((1, WIDTH), 3.0, np.float32) @ _w(eng))[0], rtol=1e-5)


def _w(eng):
    return eng._weights["w"]


@pytest.mark.parametrize("alias", [False], ids=["in-place"])
def test_kv_carried_vs_reference(program, alias):
    """Carried cache across steps equals a numpy replay (out-of-range rows dropped); catches
    a cache read after being overwritten (aliasing) or a lost update (wrong parity)."""
    eng, entry, w = _engine(program, alias)
    rng = np.random.default_rng(1)
    cache = np.zeros((ROWS, WIDTH), np.float32)
    for step, idx in enumerate([0, 3, 3, 7, ROWS, 1, 5, 0, ROWS + 3, 2]):
        x = rng.standard_normal((1, WIDTH)).astype(np.float32)
        out = eng.step(entry, {"x": x, "idx": np.array([[idx]], np.int32)})
        if 0 <= idx < ROWS:
            cache[idx] = (x @ w)[0]
        np.testing.assert_allclose(out["y"], cache.sum(0), rtol=1e-5, atol=1e-5,
                                   err_msg=f"step {step}")
        np.testing.assert_allclose(eng.read_state("cache"), cache, rtol=1e-5, atol=1e-6)


def test_two_entries_share_state(program):
    eng, a, w = _engine(program)
    b = eng.add_entry(program)
    x = np.ones((1, WIDTH), np.float32)
    eng.step(a, {"x": x, "idx": np.array([[0]])})
    out = eng.step(b, {"x": 2 * x, "idx": np.array([[1]])})
    np.testing.assert_allclose(out["y"], (x @ w)[0] + (2 * x @ w)[0], rtol=1e-5)


def test_errors(program):
    eng = Session(CpuDevice())
    with pytest.raises(SessionError, match="weight 'w' is not loaded"):
        eng.add_entry(program)
    eng, entry, _ = _engine(program)
    with pytest.raises(SessionError, match="no per-step input 'nope'"):
        eng.step(entry, {"nope": np.zeros(1)})
    with pytest.raises(SessionError, match="carried state"):
        eng.step(entry, {"cache": np.zeros((ROWS, WIDTH), np.float32)})


def test_compile_cache_round_trip(program, tmp_path):
    from poot.compiler.cache import CachedProgram, CompileCache

    cache = CompileCache(tmp_path)
    p1 = cache.compile(cache_step(), host_cpu(), OPTIONS)
    p2 = cache.compile(cache_step(), host_cpu(), OPTIONS)
    assert (cache.misses, cache.hits) == (1, 1) and isinstance(p2, CachedProgram)
    w = np.eye(WIDTH, dtype=np.float32)
    for p in (p1, p2):
        eng = Session(CpuDevice())
        eng.load_weights({"w": w}, {"w": program.graph.params["w"]})
        e = eng.add_entry(p)
        out = eng.step(e, {"x": np.ones((1, WIDTH), np.float32), "idx": np.array([[2]])})
        np.testing.assert_array_equal(out["y"], np.ones(WIDTH, np.float32))
    if shutil.which("ld"):
        assert isinstance(p2.executable.engine, ctypes.CDLL)   # machine code, no JIT
    other = CompileCache(tmp_path)
    other.compile(cache_step(), host_cpu(), CompileOptions(fuse=False, opt_level=1))
    assert other.misses == 1       # options are part of the key


class _SaysInPlace(CpuDevice):
    """A CPU device that claims the program writes ``cache`` over its input (as the CUDA
    plan does for KV scatters): the engine must then bind one buffer and never flip it."""

    def in_place_outputs(self, kernel):
        return {"cache"}


def test_state_the_device_writes_in_place_has_one_buffer(program):
    eng = Session(_SaysInPlace())
    w = np.random.default_rng(0).standard_normal((WIDTH, WIDTH)).astype(np.float32)
    eng.load_weights({"w": w}, program.graph.params)
    entry = eng.add_entry(program)
    assert entry.in_place == {"cache"} and len(eng._state["cache"].buffers) == 1
    b = eng._bindings(entry)
    names = [(a.role, a.name) for a in entry.kernel.args]
    assert b[names.index(("input", "cache"))] is b[names.index(("output", "cache"))]
    for i in range(3):
        eng.step(entry, {"x": np.ones((1, WIDTH), np.float32), "idx": np.array([[i]])})
    assert eng.device.records == 1            # one parity: recorded once, replayed after
    # state a program returns as an out-parameter (compiled without in-place updates) gets a
    # second buffer (ping-pong), and the result is the same
    from poot.backends.cpu.codegen import compile_cpu

    plain = compile_cpu(cache_step(), fuse=False)
    assert not plain.in_place and ("cache" in dict(plain.outputs))
    eng2 = Session(CpuDevice())
    eng2.load_weights({"w": w}, program.graph.params)
    e2 = eng2.add_entry(plain, carry={"cache": "cache"})
    assert not e2.in_place and len(eng2._state["cache"].buffers) == 2
    for i in range(3):
        eng2.step(e2, {"x": np.ones((1, WIDTH), np.float32), "idx": np.array([[i]])})
    np.testing.assert_array_equal(eng2.read_state("cache"), eng.read_state("cache"))


# ---- feedback and queued stepping ----------------------------------------------------------------
def test_feedback_copies_an_output_into_an_input_slot(program):
    eng = Session(CpuDevice())
    w = np.eye(WIDTH, dtype=np.float32)
    eng.load_weights({"w": w}, program.graph.params)
    e = eng.add_entry(program, feedback={"y": "x"})      # y f32 [W] -> x f32 [1, W]
    x = np.arange(WIDTH, dtype=np.float32)[None, :] + 1
    y0 = eng.step(e, {"x": x, "idx": np.array([[0]])})["y"]
    np.testing.assert_array_equal(eng.device.download(e.slots["x"])[0], y0)
    y1 = eng.step(e, {"idx": np.array([[1]])})["y"]      # x is now y0: row 1 = y0 @ I
    np.testing.assert_array_equal(y1, x[0] + y0)


@pytest.mark.parametrize("feedback, why", [
    ({"nope": "x"}, "not a per-step output"),
    ({"y": "cache"}, "not a per-step input slot"),
    ({"y": "idx"}, "does not fit"),
])
def test_feedback_refusals(program, feedback, why):
    eng = Session(CpuDevice())
    eng.load_weights({"w": np.eye(WIDTH, dtype=np.float32)}, program.graph.params)
    with pytest.raises(SessionError, match=why):
        eng.add_entry(program, feedback=feedback)


def test_submit_collect_equals_step(program):
    a, ea, _ = _engine(program)
    b, eb, _ = _engine(program)
    x = np.ones((1, WIDTH), np.float32)
    idx = np.zeros((1, 1), np.int32)
    subs = []
    for i in range(5):
        idx[0, 0] = i                                    # reused at once: the device copied it
        want = a.step(ea, {"x": x * i, "idx": idx})
        subs.append((want, b.submit(eb, {"x": x * i, "idx": idx})))
    for want, s in subs:
        np.testing.assert_array_equal(b.collect(s)["y"], want["y"])
    with pytest.raises(SessionError, match="already collected"):
        b.collect(subs[0][1])
    with pytest.raises(SessionError, match="no per-step output"):
        b.submit(eb, read=["cache"])
