"""The OpenMP runtime the CPU kernels' parallel loops run on: the ``cmeel-libomp`` wheel that
``pip install`` brings (a system's ``libomp5`` only as the fallback), and without any runtime
one warning per process that never comes before a one-line user error.

Nothing here depends on whether this machine has a system libomp: ``POOT_CPU_OPENMP`` naming
a file that is not there hides every runtime (:data:`NO_RUNTIME`).
"""

from __future__ import annotations

import os
from importlib import metadata

import pytest

from test_cli_errors import GGUF, poot, user_error

#: the environment of a process that finds no OpenMP runtime, on 2 cores
NO_RUNTIME = {**os.environ, "POOT_CPU_OPENMP": "/nonexistent/libomp.so",
              "POOT_CPU_THREADS": "2"}

#: a prelude: at exit, print the OpenMP runtimes mapped into the process and the most threads
#: one kernel call started (an OpenMP runtime starts its workers at the first parallel loop)
REPORT = ("import atexit, os\n"
          "import poot.backends.cpu.runtime as _cpu\n"
          "_started, _replay = [0], _cpu.CpuDevice.replay\n"
          "def _threads():\n"
          "    return len(os.listdir('/proc/self/task'))\n"
          "def _counted(self, recording):\n"
          "    before = _threads()\n"
          "    _replay(self, recording)\n"
          "    _started[0] = max(_started[0], _threads() - before)\n"
          "_cpu.CpuDevice.replay = _counted\n"
          "def _report():\n"
          "    maps = open('/proc/self/maps').read().splitlines()\n"
          "    libs = sorted({ln.split()[-1] for ln in maps if 'libomp' in ln.split()[-1]})\n"
          "    print('poot-test:', '|'.join(libs) or '-', _started[0])\n"
          "atexit.register(_report)\n")


def wheel_runtime() -> str | None:
    """``libomp.so`` as the cmeel-libomp distribution's file list names it, or None."""
    try:
        files = metadata.distribution("cmeel-libomp").files or []
    except metadata.PackageNotFoundError:
        return None
    return next((os.path.realpath(f.locate()) for f in files if f.name == "libomp.so"), None)


def report(out: str) -> tuple[list[str], int]:
    """(runtimes mapped, threads started by a kernel call) of the :data:`REPORT` line."""
    _, libs, threads = next(ln for ln in out.splitlines() if ln.startswith("poot-test:")).split()
    return [lib for lib in libs.split("|") if lib != "-"], int(threads)


def test_the_wheel_runtime_is_found_first(monkeypatch):
    from poot.compiler.target import host_cpu, openmp_runtime

    lib = wheel_runtime()
    if lib is None:
        pytest.skip("the cmeel-libomp wheel (a dependency of poot) is not installed here")
    monkeypatch.delenv("POOT_CPU_OPENMP", raising=False)
    assert os.path.realpath(openmp_runtime()) == lib
    assert "openmp" in host_cpu().caps.features


def test_a_runtime_named_but_missing_is_none(monkeypatch):
    from poot.compiler.target import host_cpu, openmp_runtime

    monkeypatch.setenv("POOT_CPU_OPENMP", "/nonexistent/libomp.so")
    assert openmp_runtime() is None and "openmp" not in host_cpu().caps.features


def test_cached_program_loads_this_process_runtime(monkeypatch, tmp_path):
    """A cache entry written by a process that found another runtime loads this one's: two
    OpenMP runtimes in one process abort it."""
    from poot.backends.cpu.link import with_this_openmp

    here = tmp_path / "libomp.so"
    here.write_bytes(b"")
    monkeypatch.setenv("POOT_CPU_OPENMP", str(here))
    libs = ["/a/libmlir_c_runner_utils.so", "/usr/lib/x86_64-linux-gnu/libomp.so.5"]
    assert with_this_openmp(libs) == ["/a/libmlir_c_runner_utils.so", str(here)]
    monkeypatch.setenv("POOT_CPU_OPENMP", "0")             # none here: the entry's own
    assert with_this_openmp(libs) == libs


@pytest.mark.parametrize("argv,needles", [
    (["generate", "--model", GGUF, "--prompt", "hi", "--top-p", "0"], ["--top-p"]),
    (["generate", "--model", GGUF, "--kv-capacity", "1", "--prompt", "hi"],
     ["capacity of 1 token"]),
    (["bench", "--model", GGUF, "--kv-capacity", "16", "--max-tokens", "64"],
     ["capacity of 16 tokens"]),
    (["generate", "--model", "/nonexistent/model.gguf", "--prompt", "hi"],
     ["/nonexistent/model.gguf"]),
])
def test_without_a_runtime_user_errors_are_one_line(argv, needles):
    rc, _, err = poot(*argv, env=NO_RUNTIME)
    user_error(rc, err, *needles)


def test_without_a_runtime_one_warning_then_the_kernels_run():
    rc, out, err = poot("generate", "--model", GGUF, "--prompt", "hi", "--max-tokens", "4",
                        "-q", env=NO_RUNTIME)
    assert rc == 0, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("poot: warning: POOT_CPU_OPENMP=/nonexistent/libomp.so")
    assert "1 of 2 cores" in lines[0] and "pip install cmeel-libomp" in lines[0]


def test_generate_runs_on_the_wheel_runtime_with_its_threads():
    """``poot generate`` on 2 threads maps the wheel's libomp (and no other runtime), and its
    kernels start the runtime's second thread; on one thread they start none."""
    lib = wheel_runtime()
    if lib is None:
        pytest.skip("the cmeel-libomp wheel (a dependency of poot) is not installed here")
    argv = ("generate", "--model", GGUF, "--prompt", "hi", "--max-tokens", "4", "-q")
    env = {k: v for k, v in os.environ.items() if k != "POOT_CPU_OPENMP"}
    rc, out, err = poot(*argv, prelude=REPORT, env={**env, "POOT_CPU_THREADS": "2"})
    assert rc == 0 and err == "", err
    libs, started = report(out)
    assert [os.path.realpath(p) for p in libs] == [lib] and started >= 1
    rc, out, err = poot(*argv, prelude=REPORT, env={**env, "POOT_CPU_OPENMP": "0"})
    assert rc == 0 and err == "", err
    assert report(out) == ([], 0)
