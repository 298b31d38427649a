"""The CPU backend's linked machine code: a compiled program turned into a compile-cache entry
and an entry turned back into a runnable :class:`~poot.backends.cpu.codegen.CpuProgram`.

The compile cache (:mod:`poot.compiler.cache`) calls the two hooks of the ``cpu``
registration (:mod:`poot.backends.registry`): :func:`cache_entry` on a miss, :func:`load_entry`
on a hit. The cache seals, names and verifies the files; this module knows what is in them:

* a program compiled ahead of time (:class:`~poot.backends.cpu.codegen.NativeCode`): its
  shared object, written as it is;
* a JIT-compiled one (:class:`~poot.backends.cpu.codegen.JitCode`): the JIT's object code
  linked by the system linker (:func:`link_object`) and the LLVM-dialect module text, the
  fallback when no linker is found or the ``.so`` does not load (:func:`program_from_llvm`
  runs LLVM's JIT again; the poot passes, the linalg lowering and the MLIR pipeline do not).

A hit loads the ``.so`` with ``ctypes`` (runtime libraries preloaded ``RTLD_GLOBAL``,
:func:`with_this_openmp`) and calls the packed ``_mlir__mlir_ciface_<name>`` wrapper.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import time
from pathlib import Path

from poot.backends.cpu.codegen import CpuProgram, JitCode, runtime_libs
from poot.compiler.target import OPENMP_NAMES, openmp_runtime


def load_libs(libs) -> None:
    """Load each shared library of ``libs`` (paths) ``RTLD_GLOBAL``, so that a program's
    undefined symbols resolve against them."""
    for lib in libs:
        ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)


def with_this_openmp(libs) -> list[str]:
    """The shared libraries a cached CPU program was linked against (paths), its OpenMP
    runtime replaced by the one this process finds
    (:func:`~poot.compiler.target.openmp_runtime`; unchanged when none is found): the
    kernels call only the ``__kmpc_*`` entry points every such runtime has, the entry may
    come from a process that found another one (a system's, a wheel in another
    environment), and two OpenMP runtimes in one process abort it."""
    here = openmp_runtime()
    return [here if here and os.path.basename(lib) in OPENMP_NAMES else lib
            for lib in libs]


def program_from_object(so_path: str | os.PathLike, name: str, inputs, params, outputs,
                        shared_libs=(), in_place=None, repack=None) -> CpuProgram:
    """A ``CpuProgram`` calling step function ``name`` of a linked shared object, loaded
    after ``shared_libs``. Raises ``OSError`` when the object does not load,
    ``AttributeError`` when it has no such function."""
    t0 = time.perf_counter()
    load_libs(shared_libs)
    lib = ctypes.CDLL(str(so_path))
    sym = getattr(lib, f"_mlir__mlir_ciface_{name}")
    fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(ctypes.cast(sym, ctypes.c_void_p).value)
    prog = CpuProgram(name, list(inputs), list(params), list(outputs), engine=lib,
                      in_place=dict(in_place or {}), repack=dict(repack or {}))
    prog._fn = fn
    prog.compile_s = time.perf_counter() - t0
    return prog


def link_object(engine, so_path: Path) -> bool:
    """Dump the JIT engine's object code and link it into ``so_path``; False when there is
    no linker or linking fails."""
    ld = shutil.which("ld") or shutil.which("ld.lld")
    if ld is None or not hasattr(engine, "dump_to_object_file"):
        return False
    obj = so_path.with_suffix(f".o{os.getpid()}")
    tmp = so_path.with_suffix(f".so{os.getpid()}")
    try:
        engine.dump_to_object_file(str(obj))
        r = subprocess.run([ld, "-shared", "-Bsymbolic", "-o", str(tmp), str(obj)],
                           capture_output=True,
                           timeout=600)
        if r.returncode != 0:
            return False
        os.replace(tmp, so_path)
        return True
    except (OSError, subprocess.SubprocessError):
        return False
    finally:
        for f in (obj, tmp):
            try:
                f.unlink()
            except OSError:
                pass


def program_from_llvm(text: str, name: str, inputs, params, outputs, opt_level: int = 2,
                      shared_libs=None, in_place=None, repack=None) -> CpuProgram:
    """A ``CpuProgram`` from LLVM-dialect module text (the JIT runs; nothing else), linked
    against ``shared_libs`` (default: the MLIR runner utils; an OpenMP-parallel program needs
    the OpenMP runtime it was compiled with). Raises ``FileNotFoundError`` when one of those
    libraries is gone."""
    from mlir import ir
    from mlir.execution_engine import ExecutionEngine

    t0 = time.perf_counter()
    ctx = ir.Context()
    module = ir.Module.parse(text, ctx)
    libs = list(shared_libs) if shared_libs is not None else list(runtime_libs())
    missing = [lib for lib in libs if not os.path.exists(lib)]
    if missing:
        raise FileNotFoundError(f"shared libraries of a cached program are gone: {missing}")
    engine = JitCode(ExecutionEngine(module, opt_level=opt_level, shared_libs=libs), text, libs)
    prog = CpuProgram(name, list(inputs), list(params), list(outputs), engine,
                      in_place=dict(in_place or {}), repack=dict(repack or {}))
    prog._fn = engine.lookup(name)
    prog.compile_s = time.perf_counter() - t0
    prog._ctx = ctx  # keep the context alive with the engine
    return prog


def _interface(exe: CpuProgram, opt_level: int) -> dict:
    """What a cache entry keeps of a program's calling interface."""
    return {"name": exe.name, "inputs": exe.inputs, "params": exe.params,
            "outputs": exe.outputs, "in_place": dict(getattr(exe, "in_place", {}) or {}),
            "repack": dict(getattr(exe, "repack", {}) or {}),
            "opt_level": opt_level}


def cache_entry(program, files, options, progress) -> dict | None:
    """The ``cpu`` registration's compile-cache hook: the entry fields of a compiled
    program (``program.executable`` a :class:`CpuProgram`), its shared object written
    through ``files`` (:class:`poot.compiler.cache.EntryFiles`: content-named beside the
    entry, size and sha256 recorded). None when there is nothing to keep (a JIT program
    without its LLVM text). ``OSError`` from writing goes to the cache (it stops writing)."""
    exe = program.executable
    engine = exe.engine
    so_bytes = getattr(engine, "so_bytes", None)      # made ahead of time: no relink
    if so_bytes is not None:
        progress("writing the shared object")
        return {**_interface(exe, options.opt_level), "llvm": None,
                "libs": list(engine.shared_libs), "object": files.write(so_bytes, "so")}
    text = getattr(engine, "llvm_text", None)
    if text is None:
        return None
    progress("linking")
    return {**_interface(exe, options.opt_level), "llvm": text,
            "libs": list(engine.shared_libs),
            "object": files.make(lambda path: link_object(engine, path), "so")}


def load_entry(entry: dict, folder: Path) -> CpuProgram | None:
    """The ``cpu`` registration's compile-cache hook: the program of an entry written by
    :func:`cache_entry` (its files already verified by the cache), or None when it must be
    compiled again (compiled ahead of time and its ``.so`` does not load). Raises when the
    entry is stale (e.g. its runtime libraries are gone): the cache then compiles again."""
    so = entry.get("object")
    libs = with_this_openmp(entry.get("libs") or ())
    args = (entry["name"], entry["inputs"], entry["params"], entry["outputs"])
    if so:
        try:
            return program_from_object(folder / so, *args, libs, entry.get("in_place"),
                                       entry.get("repack"))
        except (OSError, AttributeError):
            pass
    if not entry.get("llvm"):
        return None                     # compiled ahead of time: compile again
    return program_from_llvm(entry["llvm"], *args, entry["opt_level"],
                             None if entry.get("libs") is None else libs,
                             entry.get("in_place"), entry.get("repack"))


__all__ = ["cache_entry", "link_object", "load_entry", "load_libs", "program_from_llvm",
           "program_from_object", "with_this_openmp"]
