"""A compile cache entry is only ever loaded as the entry of its own key.

Two different steps with the same interface (``y`` = x @ w, and 2 * x @ w) are compiled into
one cache; then one's file is put under the other's name (copied, or linked) the way a
half-synced or hand-assembled cache folder does. Every such file is a whole, sealed entry, so
only the key and record kind sealed in it can tell: the load must discard it with one warning
and compile the right program again (its output checked against numpy), never run the other
step's program.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil

import numpy as np
import pytest
from exec_graphs import ROWS, WIDTH, cache_step

from poot.compiler import CompileOptions, host_cpu
from poot.dialects.types import DType, TensorType
from poot.runtime import Session
from poot.backends.cpu.runtime import CpuDevice
from poot.graph.builder import Builder, TraceLimits

OPTIONS = CompileOptions(fuse=False)
RNG = np.random.default_rng(7)
W = RNG.standard_normal((WIDTH, WIDTH)).astype(np.float32)
X = RNG.standard_normal((1, WIDTH)).astype(np.float32)
KEY_A, KEY_B = "a" * 64, "b" * 64        # step keys (any text names a step in the index)


def doubled_step():
    """:func:`exec_graphs.cache_step` with the row written as 2 * (x @ w): same inputs, params,
    outputs and storage, another program."""
    b = Builder(TraceLimits(max_values=64, max_ops=64, max_literal_bytes=1024,
                            max_owned_bytes=1 << 20), name="cache_step")
    x = b.input("x", TensorType((1, WIDTH), DType.F32))
    idx = b.input("idx", TensorType((1, 1), DType.I32))
    cache = b.input("cache", TensorType((ROWS, WIDTH), DType.F32))
    w = b.param("w", TensorType((WIDTH, WIDTH), DType.F32))
    xw = b.matmul(x, w)
    new = b.scatter(cache, idx, b.binary("add", xw, xw))
    return b.finish({"y": b.reduce("sum", new, 0), "cache": new})


STEPS = {KEY_A: (cache_step, 1.0), KEY_B: (doubled_step, 2.0)}


def _y(program) -> np.ndarray:
    eng = Session(CpuDevice())
    eng.load_weights({"w": W}, {"w": TensorType((WIDTH, WIDTH), DType.F32)})
    out = eng.step(eng.add_entry(program), {"x": X, "idx": np.array([[3]])})
    return out["y"]


def _expect(skey: str) -> np.ndarray:
    return STEPS[skey][1] * (X @ W)[0]          # the cache starts zero: y is the row written


def _step(cache, skey: str):
    make = STEPS[skey][0]
    return cache.compile_step(skey, {"step": skey}, make, host_cpu(), OPTIONS)


@pytest.fixture
def two_steps(tmp_path, monkeypatch):
    """A cache holding both steps (index entries and programs); {step key: program key}."""
    import poot.compiler.cache as C

    monkeypatch.setattr(C, "_WARNED", set())
    cache = C.CompileCache(tmp_path)
    keys = {}
    for skey in STEPS:
        prog = _step(cache, skey)
        np.testing.assert_allclose(_y(prog), _expect(skey), rtol=1e-5)
        keys[skey] = prog.cache_key
    assert cache.misses == 2 and keys[KEY_A] != keys[KEY_B]
    return tmp_path, keys


def _put(src, dst, how: str) -> None:
    """Replace ``dst`` by ``src``'s file: a copy, or a symbolic link to it."""
    dst.unlink()
    if how == "copy":
        shutil.copyfile(src, dst)
    else:
        os.symlink(src, dst)


def _old_format(data: bytes) -> bytes:
    """An entry file of the previous format (FORMAT 4): the sealed header held only the
    payload's size and sha256, no key."""
    from poot.compiler.cache import MAGIC

    payload = data[data.index(b"\n", len(MAGIC)) + 1:]
    head = {"size": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}
    return MAGIC + json.dumps(head).encode() + b"\n" + payload


def _load_b_again(cache_dir, capsys, *, recompiled: bool):
    """Load step B through a fresh cache: one warning, B's program (not A's); then a clean
    hit, and A still loads as A."""
    import poot.compiler.cache as C

    capsys.readouterr()
    cache = C.CompileCache(cache_dir)
    prog = _step(cache, KEY_B)
    np.testing.assert_allclose(_y(prog), _expect(KEY_B), rtol=1e-5)
    err = [ln for ln in capsys.readouterr().err.splitlines() if "compile cache" in ln]
    assert len(err) == 1 and cache.damaged == 1, err
    assert "discarded, compiling again" in err[0]
    assert cache.misses == (1 if recompiled else 0)
    again = C.CompileCache(cache_dir)
    for skey in (KEY_B, KEY_A):
        np.testing.assert_allclose(_y(_step(again, skey)), _expect(skey), rtol=1e-5)
    assert (again.hits, again.misses, again.damaged) == (2, 0, 0)
    return err[0]


@pytest.mark.parametrize("how", ["copy", "symlink", "old-format"])
def test_index_entry_under_another_step_key(two_steps, capsys, how):
    """Step A's index entry under step B's name would load A's program for B."""
    cache_dir, keys = two_steps
    a, b = (cache_dir / "index" / f"{k}.json" for k in (KEY_A, KEY_B))
    if how == "old-format":         # INDEX_FORMAT 2 wrote plain JSON
        b.write_text(json.dumps({"program": keys[KEY_A], "describe": {"step": KEY_B}}))
    else:
        _put(a, b, how)
    warning = _load_b_again(cache_dir, capsys, recompiled=False)  # B's program is whole
    if how == "old-format":
        assert "not a poot cache entry" in warning
    else:
        assert "is not the entry of its name" in warning and f"key {KEY_A[:16]}" in warning
    assert a.is_file() and not a.is_symlink()       # the link went, not what it named


@pytest.mark.parametrize("how", ["copy", "symlink", "old-format"])
def test_program_entry_under_another_graph_key(two_steps, capsys, how):
    """Program A's entry under program B's name would run A for B."""
    cache_dir, keys = two_steps
    a, b = (cache_dir / "programs" / f"{keys[k]}.pkl" for k in (KEY_A, KEY_B))
    if how == "old-format":
        b.write_bytes(_old_format(a.read_bytes()))
    else:
        _put(a, b, how)
    warning = _load_b_again(cache_dir, capsys, recompiled=True)
    if how == "old-format":
        assert "older format" in warning
    else:
        assert "is not the entry of its name" in warning
        assert f"program entry of key {keys[KEY_A][:16]}" in warning


@pytest.mark.skipif(not shutil.which("ld"), reason="no system linker (ld): the cache keeps "
                    "LLVM text only, no shared object to swap")
@pytest.mark.parametrize("how", ["copy", "symlink"])
def test_shared_object_of_another_entry(two_steps, capsys, how):
    """Program A's ``.so`` under program B's ``.so`` name (whole, valid machine code of the
    same interface)."""
    cache_dir, keys = two_steps
    so = {k: next((cache_dir / "programs").glob(f"{keys[k]}.*.so")) for k in STEPS}
    _put(so[KEY_A], so[KEY_B], how)
    warning = _load_b_again(cache_dir, capsys, recompiled=True)
    assert "sha256 mismatch" in warning or "bytes," in warning


@pytest.mark.skipif(not shutil.which("ld"), reason="no system linker (ld): no shared object")
def test_entry_naming_another_entrys_shared_object(two_steps, capsys):
    """A sealed entry of program B that names program A's ``.so`` (with A's size and sha256,
    so the file checks out): a content-named file must be named by the entry's own key."""
    import pickle

    from poot.compiler.cache import seal, unseal

    cache_dir, keys = two_steps
    pa, pb = (cache_dir / "programs" / f"{keys[k]}.pkl" for k in (KEY_A, KEY_B))
    ea = pickle.loads(unseal(pa.read_bytes(), "program", keys[KEY_A]))
    eb = pickle.loads(unseal(pb.read_bytes(), "program", keys[KEY_B]))
    eb["object"], eb["files"] = ea["object"], ea["files"]
    pb.write_bytes(seal(pickle.dumps(eb), "program", keys[KEY_B]))
    warning = _load_b_again(cache_dir, capsys, recompiled=True)
    assert "is not named by this key and its sha256" in warning


def test_pipeline_index_entry_is_bound_to_its_key_and_kind(tmp_path, capsys, monkeypatch):
    """A pipeline's index entry (its stage programs) under another pipeline's name, or under
    a step's name, or a step's under a pipeline's name, is not read as that entry."""
    import poot.compiler.cache as C
    from poot.compiler.cache import seal

    monkeypatch.setattr(C, "_WARNED", set())
    cache = C.CompileCache(tmp_path)
    (tmp_path / "index").mkdir()
    rec = json.dumps({"pipeline": ["p" * 64, "q" * 64], "describe": {}, "boundaries": {},
                      "weight_bytes": [1, 2]}).encode()
    cache.index_path(KEY_A).write_bytes(seal(rec, "pipeline", KEY_A))
    assert cache._index_record(KEY_A, "pipeline")["pipeline"] == ["p" * 64, "q" * 64]
    for kind in ("pipeline", "step"):       # as another pipeline's, as a step's entry
        shutil.copyfile(cache.index_path(KEY_A), cache.index_path(KEY_B))
        monkeypatch.setattr(C, "_WARNED", set())
        assert cache._index_record(KEY_B, kind) is None
        err = capsys.readouterr().err
        assert "is not the entry of its name" in err, err
        assert f"pipeline entry of key {KEY_A[:16]}" in err, err
        assert not cache.index_path(KEY_B).exists()
    step = json.dumps({"program": "p" * 64, "describe": {}}).encode()
    cache.index_path(KEY_B).write_bytes(seal(step, "step", KEY_B))
    monkeypatch.setattr(C, "_WARNED", set())
    assert cache._index_record(KEY_B, "pipeline") is None       # a step's, not a pipeline's
    assert f"step entry of key {KEY_B[:16]}" in capsys.readouterr().err
