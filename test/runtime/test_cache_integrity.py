"""The compile cache survives damaged entries, a read-only directory, an uncreatable path
and processes sharing it (issue 24, items 3 and 10).

A damaged entry (a truncated or altered shared object, a truncated or foreign entry file,
an unreadable index entry) is discarded with one warning and compiled again, never loaded:
loading a truncated ``.so`` used to kill the process with SIGBUS, so those cases load in a
fresh interpreter and check how it exits.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]

def _run_step(cache_dir: Path) -> tuple[int, dict, str]:
    """Compile or load the step through ``cache_dir`` in a fresh interpreter and run it;
    (exit status, {"hits", "misses", "damaged", "y"}, stderr)."""
    code = textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {str(ROOT / "test" / "runtime")!r})
        import numpy as np
        from exec_graphs import WIDTH, cache_step
        from poot.compiler import CompileOptions, host_cpu
        from poot.runtime import Session
        from poot.backends.cpu.runtime import CpuDevice
        from poot.compiler.cache import CompileCache

        g = cache_step()
        cache = CompileCache({str(cache_dir)!r})
        p = cache.compile(g, host_cpu(), CompileOptions(fuse=False))
        eng = Session(CpuDevice())
        eng.load_weights({{"w": np.eye(WIDTH, dtype=np.float32)}}, {{"w": g.params["w"]}})
        out = eng.step(eng.add_entry(p), {{"x": np.ones((1, WIDTH), np.float32),
                                          "idx": np.array([[2]])}})
        print(json.dumps({{"hits": cache.hits, "misses": cache.misses,
                          "damaged": getattr(cache, "damaged", None),
                          "y": out["y"].tolist()}}))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=ROOT, timeout=300)
    info = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else {}
    return r.returncode, info, r.stderr


def _files(cache_dir: Path, suffix: str) -> list[Path]:
    return sorted((cache_dir / "programs").glob(f"*{suffix}"))


@pytest.fixture
def filled(tmp_path):
    """A cache holding the small step (compiled once in a fresh interpreter)."""
    rc, info, err = _run_step(tmp_path)
    assert rc == 0, err
    assert info["misses"] == 1 and info["hits"] == 0
    return tmp_path


def _damage_warnings(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith("poot: warning:") and
            "damaged" in ln]


def _recovered(cache_dir: Path, what: str):
    """The damaged cache: one warning, recompiled, right result; then a clean hit."""
    rc, info, err = _run_step(cache_dir)
    assert rc == 0, f"{what}: exit {rc} (-7 is SIGBUS: the damaged file was loaded)\n{err}"
    warnings = _damage_warnings(err)
    assert len(warnings) == 1, err
    assert "discarded, compiling again" in warnings[0]
    assert info["misses"] == 1 and info["damaged"] == 1
    assert info["y"] == [1.0] * len(info["y"])
    rc, info, err = _run_step(cache_dir)          # the entry was written again, whole
    assert rc == 0 and info["hits"] == 1 and info["misses"] == 0, err
    assert not _damage_warnings(err)
    return warnings[0]


@pytest.mark.skipif(not __import__("shutil").which("ld"), reason="no system linker (ld): "
                    "the cache keeps LLVM text only, no shared object to damage")
def test_truncated_shared_object_is_never_loaded(filled):
    so = _files(filled, ".so")
    assert len(so) == 1
    os.truncate(so[0], so[0].stat().st_size // 2)
    import re

    assert re.search(r"its so file: \d+ bytes, \d+ recorded", _recovered(filled, "truncated"))


@pytest.mark.skipif(not __import__("shutil").which("ld"), reason="no system linker (ld)")
def test_altered_shared_object_is_never_loaded(filled):
    so = _files(filled, ".so")[0]
    data = bytearray(so.read_bytes())
    data[len(data) // 2] ^= 0xFF                  # same size, one byte changed
    so.write_bytes(bytes(data))
    assert "sha256 mismatch" in _recovered(filled, "altered .so")


@pytest.mark.parametrize("how", ["truncate", "empty", "foreign"])
def test_damaged_entry_file(filled, how):
    pkl = _files(filled, ".pkl")[0]
    if how == "truncate":
        os.truncate(pkl, pkl.stat().st_size // 3)
    elif how == "empty":
        pkl.write_bytes(b"")
    else:
        pkl.write_bytes(b"\x80\x04not what poot wrote")
    _recovered(filled, f"{how} entry")


def test_entry_files_are_sealed_and_checked(tmp_path):
    from poot.compiler.cache import MAGIC, DamagedEntry, ForeignEntry, seal, unseal

    payload = b"x" * 1000
    data = seal(payload, "program", "a" * 64)
    assert data.startswith(MAGIC) and unseal(data, "program", "a" * 64) == payload
    with pytest.raises(DamagedEntry, match="truncated: 500 of 1000 bytes"):
        unseal(data[:len(data) - 500], "program", "a" * 64)
    flipped = data[:-1] + bytes([data[-1] ^ 1])
    with pytest.raises(DamagedEntry, match="sha256"):
        unseal(flipped, "program", "a" * 64)
    with pytest.raises(DamagedEntry, match="empty"):
        unseal(b"", "program", "a" * 64)
    # a whole entry of another key, or of another kind, is not this one
    with pytest.raises(ForeignEntry, match="program entry of key aaaa"):
        unseal(data, "program", "b" * 64)
    with pytest.raises(ForeignEntry, match="not the step entry"):
        unseal(data, "step", "a" * 64)
    # the key is under the seal: editing it in the header breaks the sha256
    relabelled = data.replace(b"a" * 64, b"b" * 64, 1)
    with pytest.raises(DamagedEntry, match="sha256"):
        unseal(relabelled, "program", "b" * 64)
    # an entry of the previous format (no key in its header) is never loaded
    import hashlib
    import json

    old = MAGIC + json.dumps({"size": len(payload), "sha256": hashlib.sha256(
        payload).hexdigest()}).encode() + b"\n" + payload
    with pytest.raises(DamagedEntry, match="older format"):
        unseal(old, "program", "a" * 64)


def test_unreadable_index_entry_is_discarded(tmp_path, capsys):
    from poot.compiler.cache import CompileCache

    cache = CompileCache(tmp_path)
    path = cache.index_path("k" * 64)
    path.parent.mkdir(parents=True)
    path.write_text('{"program": "abc", "desc')       # truncated JSON
    assert cache.lookup("k" * 64, target=None) is None
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "damaged" in err[0] and not path.exists()
    assert cache.lookup("k" * 64, target=None) is None     # absent now: a plain miss
    assert capsys.readouterr().err == ""


def test_writes_leave_no_partial_files(filled):
    names = [p.name for p in (filled / "programs").iterdir()]
    assert not [n for n in names if n.startswith(".") or n.endswith(".tmp")], names
    so = _files(filled, ".so")
    if so:                             # content-named: <key>.<sha256 prefix>.so
        key, digest, _ = so[0].name.split(".")
        from poot.compiler.cache import file_digest

        assert file_digest(so[0])[1].startswith(digest)


# --- processes sharing one cache ---------------------------------------------------------------

def test_concurrent_processes_compile_once(tmp_path):
    """Three processes start compiling the same step into one cache at the same moment: one
    compiles (holding the lock), the others wait and load what it wrote; all get the right
    result, and the entry is whole."""
    go = tmp_path / "go"
    cache_dir = tmp_path / "cache"
    code = textwrap.dedent(f"""
        import json, os, sys, time
        sys.path.insert(0, {str(ROOT / "test" / "runtime")!r})
        import numpy as np
        from exec_graphs import WIDTH, cache_step
        import poot.compiler
        from poot.compiler import CompileOptions, host_cpu
        from poot.runtime import Session
        from poot.backends.cpu.runtime import CpuDevice
        from poot.compiler.cache import CompileCache

        real = poot.compiler.compile
        def slow_compile(*a, **k):         # long enough for the others to arrive
            time.sleep(1.0)
            return real(*a, **k)
        poot.compiler.compile = slow_compile
        g = cache_step()
        open({str(tmp_path)!r} + "/ready." + str(os.getpid()), "w").close()
        while not os.path.exists({str(go)!r}):
            time.sleep(0.01)
        cache = CompileCache({str(cache_dir)!r})
        p = cache.compile(g, host_cpu(), CompileOptions(fuse=False))
        eng = Session(CpuDevice())
        eng.load_weights({{"w": np.eye(WIDTH, dtype=np.float32)}}, {{"w": g.params["w"]}})
        out = eng.step(eng.add_entry(p), {{"x": np.ones((1, WIDTH), np.float32),
                                          "idx": np.array([[2]])}})
        print(json.dumps({{"misses": cache.misses, "hits": cache.hits,
                          "ok": out["y"].tolist() == [1.0] * WIDTH}}))
    """)
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=ROOT) for _ in range(3)]
    try:
        while len(list(tmp_path.glob("ready.*"))) < len(procs):
            if any(p.poll() is not None for p in procs):
                break
            import time
            time.sleep(0.05)
        go.touch()
        outs = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    results = []
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert all(r["ok"] for r in results)
    assert sum(r["misses"] for r in results) == 1, results
    assert sum(r["hits"] for r in results) == 2, results
    rc, info, err = _run_step(cache_dir)
    assert rc == 0 and info["hits"] == 1 and not _damage_warnings(err), err


# --- item 10: a read-only cache, a cache path that cannot be created ---------------------------

def test_read_only_cache_still_loads(filled, monkeypatch, capsys):
    """A cache directory this process cannot write (here: ``os.access`` says so, as it does
    for a non-root user on a read-only folder) is read: a compiled step loads from it, one
    warning says it is read-only, and nothing is written."""
    import poot.compiler.cache as cache_mod
    from exec_graphs import cache_step
    from poot.compiler import CompileOptions, host_cpu

    before = sorted(p.name for p in (filled / "programs").iterdir())
    monkeypatch.setattr(cache_mod.os, "access", lambda path, mode: False)
    monkeypatch.setattr(cache_mod, "_WARNED", set())
    cache = cache_mod.CompileCache(filled)
    assert cache.use and not cache.enabled
    prog = cache.compile(cache_step(), host_cpu(), CompileOptions(fuse=False))
    assert cache.hits == 1 and getattr(prog, "from_cache", False)
    other = cache.compile(cache_step(), host_cpu(), CompileOptions(fuse=False, opt_level=1))
    assert cache.misses == 1 and getattr(other, "cache_key", None) is None
    assert sorted(p.name for p in (filled / "programs").iterdir()) == before
    # (the CPU backend may warn about its OpenMP runtime here too: not the cache's)
    err = [ln for ln in capsys.readouterr().err.splitlines() if "compile cache" in ln]
    assert len(err) == 1, err
    assert "is read-only" in err[0] and "loaded from it" in err[0] and "not saved" in err[0]
    assert "disabled" not in err[0]


def test_uncreatable_cache_path_says_so_once(tmp_path, monkeypatch, capsys):
    import poot.compiler.cache as cache_mod

    monkeypatch.setattr(cache_mod, "_WARNED", set())
    (tmp_path / "file").write_text("")
    where = tmp_path / "file" / "cache"
    for _ in range(2):
        cache = cache_mod.CompileCache(where)
        assert not cache.use and not cache.enabled
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"poot: warning: compile cache disabled: cannot create {where}")
    assert "POOT_CACHE_DIR" in err[0]
