"""The compile cache's lock never makes a start wait without limit: a wait past the timeout
names the holder, and a lock whose holder is gone (its flock kept by a child it forked) is
taken over with a warning."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from exec_graphs import WIDTH, cache_step

from poot.compiler import CompileOptions, host_cpu
from poot.dialects.types import DType, TensorType
from poot.runtime import Session
from poot.backends.cpu.runtime import CpuDevice

ROOT = Path(__file__).resolve().parents[2]
SKEY = "c" * 64

# Holds the step lock of SKEY in a cache folder through the cache's own code and says so,
# then sleeps (a process compiling for a long time, or stuck).
HOLD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from poot.compiler.cache_lock import hold
    lock = Path(sys.argv[1]) / "locks" / ("step-" + sys.argv[2] + ".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with hold(lock, "compiling the step under test"):
        if sys.argv[3] == "fork":       # die holding it; a forked child keeps the descriptor
            import os
            child = os.fork()
            if child == 0:
                os.closerange(0, 3)
                time.sleep(120)
                os._exit(0)
            Path(sys.argv[4]).write_text(str(child))
            os._exit(0)
        print("held", flush=True)
        time.sleep(120)
""")


def _holder(cache_dir: Path, mode: str, pid_file: Path | None = None) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-c", HOLD, str(cache_dir), SKEY, mode,
                             str(pid_file)], stdout=subprocess.PIPE, text=True, env=env,
                            cwd=ROOT)


def _never():
    raise AssertionError("traced although another process holds the step")


def test_live_holder_times_out_naming_it(tmp_path):
    from poot.compiler.cache import CacheLockTimeout, CompileCache
    from poot.errors import PootError

    proc = _holder(tmp_path, "sleep")
    try:
        assert proc.stdout.readline().strip() == "held"
        lock = tmp_path / "locks" / f"step-{SKEY}.lock"
        record = json.loads(lock.read_text())      # the lock file says who holds it
        assert record["pid"] == proc.pid and record["host"] == socket.gethostname()
        assert record["what"] == "compiling the step under test" and record["since"]
        cache = CompileCache(tmp_path, lock_timeout_s=0.3)
        with pytest.raises(CacheLockTimeout) as e:
            cache.compile_step(SKEY, {"step": "s"}, _never, host_cpu(),
                               CompileOptions(fuse=False))
        assert isinstance(e.value, PootError) and e.value.path == lock
        msg = str(e.value)
        assert f"pid {proc.pid} on {socket.gethostname()}" in msg and str(lock) in msg
        assert "POOT_CACHE_LOCK_TIMEOUT" in msg and f"kill {proc.pid}" in msg
        assert proc.poll() is None                   # the holder was left alone
    finally:
        proc.kill()
        proc.wait()


def test_lock_timeout_from_the_environment(tmp_path, monkeypatch):
    from poot.compiler.cache import CompileCache
    from poot.compiler.cache_lock import DEFAULT_TIMEOUT_S, InvalidLockTimeout

    assert CompileCache(tmp_path).lock_timeout_s == DEFAULT_TIMEOUT_S >= 60
    monkeypatch.setenv("POOT_CACHE_LOCK_TIMEOUT", "2.5")
    assert CompileCache(tmp_path).lock_timeout_s == 2.5
    for bad in ("soon", "0", "-1", "inf"):
        monkeypatch.setenv("POOT_CACHE_LOCK_TIMEOUT", bad)
        with pytest.raises(InvalidLockTimeout, match="POOT_CACHE_LOCK_TIMEOUT"):
            CompileCache(tmp_path)


def test_lock_of_a_dead_holder_is_taken_over(tmp_path, capsys, monkeypatch):
    """The holder died inside the lock, but a child it forked keeps the flock: the recorded
    pid runs no more, so the lock is broken (one warning) and the step compiles."""
    import poot.compiler.cache as C

    monkeypatch.setattr(C, "_WARNED", set())
    pid_file = tmp_path / "child.pid"
    cache_dir = tmp_path / "cache"
    parent = _holder(cache_dir, "fork", pid_file)
    assert parent.wait(timeout=120) == 0
    child = int(pid_file.read_text())
    try:
        lock = cache_dir / "locks" / f"step-{SKEY}.lock"
        assert json.loads(lock.read_text())["pid"] == parent.pid
        os.kill(child, 0)                               # the flock is still held
        cache = C.CompileCache(cache_dir)               # the default timeout
        prog = cache.compile_step(SKEY, {"step": "s"}, cache_step, host_cpu(),
                                  CompileOptions(fuse=False))
        err = [ln for ln in capsys.readouterr().err.splitlines() if "lock" in ln]
        assert len(err) == 1 and f"held by pid {parent.pid}" in err[0], err
        assert "no longer running; taking it over" in err[0]
        eng = Session(CpuDevice())
        w = np.eye(WIDTH, dtype=np.float32)
        eng.load_weights({"w": w}, {"w": TensorType((WIDTH, WIDTH), DType.F32)})
        out = eng.step(eng.add_entry(prog), {"x": np.ones((1, WIDTH), np.float32),
                                             "idx": np.array([[2]])})
        np.testing.assert_array_equal(out["y"], np.ones(WIDTH, np.float32))
        assert json.loads(lock.read_text() or "null") is None   # released: record cleared
    finally:
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_stale_record_without_a_holder_is_taken_at_once(tmp_path, capsys):
    """A record left by a process that died (the kernel dropped its flock): nothing to wait
    for, nothing to warn about."""
    from poot.compiler.cache_lock import hold

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    lock = tmp_path / "x.lock"
    lock.write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname(),
                                "since": "2026-01-01T00:00:00+00:00", "what": "x"}))
    with hold(lock, "now me", timeout_s=5) as held:     # a wait would end in a timeout
        assert held and json.loads(lock.read_text())["pid"] == os.getpid()
    assert capsys.readouterr().err == ""
