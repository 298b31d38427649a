"""A CPU program compiled by LLVM's in-process JIT (``POOT_CPU_CODEGEN=jit``: no ``opt`` /
``llc``) goes through the compile cache as the CPU backend's hooks keep it
(:mod:`poot.backends.cpu.link`): its JIT object code linked into a ``.so`` beside the entry and
its LLVM-dialect text; a hit loads the ``.so`` with ``ctypes``, and an entry without a ``.so``
(no linker where it was written) is rebuilt from the text by the JIT."""

from __future__ import annotations

import ctypes
import pickle
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

pytest.importorskip("mlir")

from exec_graphs import ROWS, WIDTH, cache_step  # noqa: E402


@pytest.fixture
def jit(monkeypatch):
    from poot.backends.cpu.codegen import native_tools

    monkeypatch.setenv("POOT_CPU_CODEGEN", "jit")
    native_tools.cache_clear()
    yield
    native_tools.cache_clear()


def _inputs():
    rng = np.random.default_rng(0)
    return ({"x": rng.standard_normal((1, WIDTH), np.float32),
             "idx": np.array([[1]], np.int32), "cache": np.zeros((ROWS, WIDTH), np.float32)},
            {"w": rng.standard_normal((WIDTH, WIDTH), np.float32)})


def test_jit_program_is_cached_as_linked_code_and_llvm_text(jit, tmp_path):
    from poot.backends.cpu.codegen import JitCode
    from poot.backends.cpu.link import load_entry
    from poot.compiler import CompileOptions, host_cpu
    from poot.compiler.cache import CompileCache, unseal

    cache = CompileCache(tmp_path)
    first = cache.compile(cache_step(), host_cpu(), CompileOptions(fuse=False))
    assert isinstance(first.executable.engine, JitCode) and cache.misses == 1
    inputs, params = _inputs()
    want = first.run(inputs, params)
    x, w = inputs["x"], params["w"]
    np.testing.assert_allclose(want["y"], (x @ w)[0], rtol=1e-5)

    entry = pickle.loads(unseal(cache.path(first.cache_key).read_bytes(), "program",
                                first.cache_key))
    assert entry["kind"] == "cpu" and "llvm.func" in entry["llvm"]
    assert entry["object"] in entry["files"] and entry["object"].endswith(".so")

    hit = CompileCache(tmp_path).compile(cache_step(), host_cpu(), CompileOptions(fuse=False))
    assert hit.from_cache and isinstance(hit.executable.engine, ctypes.CDLL)
    np.testing.assert_array_equal(hit.run(inputs, params)["y"], want["y"])

    rebuilt = load_entry({**entry, "object": None}, tmp_path / "programs")
    assert isinstance(rebuilt.engine, JitCode)
    np.testing.assert_array_equal(rebuilt.run(inputs, params)["y"], want["y"])
