"""The on-disk compile cache: the second run of a model starts without the poot passes and
the lowering.

Key: sha256 of (the step graph's IR text, ``target.key()``, the compile options, the poot
version and a hash of the compiler's source files: ``poot/compiler``, ``dialects/``,
``passes/`` and the target backend's code generator). A change to any of them is a different
key.

Entry (CPU), pickled with the program's interface (inputs, params, outputs, storage,
dispatch counts, the shared libraries it links against):

* the **machine code**: the JIT's object file (``ExecutionEngine.dump_to_object_file``)
  linked into ``<key>.so`` with the system linker (``ld -shared``). A hit loads it with
  ``ctypes`` (runtime libraries preloaded ``RTLD_GLOBAL``) and calls the packed
  ``_mlir__mlir_ciface_<name>`` wrapper: no MLIR, no LLVM. Measured on SmolLM2 (unfused
  steps) the LLVM JIT is ~85-150 s of a ~110-200 s step compile, so this is what makes the
  second run start fast.
* the **LLVM-dialect module text**, the fallback when no linker is found or the ``.so`` does
  not load: :func:`cpu_program_from_llvm` re-creates the ``ExecutionEngine`` from it (LLVM's
  JIT runs again; the poot passes, the linalg lowering and the MLIR pipeline do not).

How the text is obtained: if the backend's program exposes ``llvm_text`` it is used;
otherwise the miss-path compile captures the module handed to the ``ExecutionEngine`` (a
scoped wrapper around ``poot.backends.cpu.ExecutionEngine``, restored afterwards). A backend
with neither is compiled every time (cache entries are only written when text was captured).

Location: ``$POOT_CACHE_DIR``, else ``~/.cache/poot``; ``enabled=False`` turns it off. A
directory that cannot be created or written turns it off with one warning on stderr
(``poot: warning: compile cache disabled: ...``).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import pickle
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_LOCK = threading.Lock()
_WARNED: set[str] = set()   # cache directories already reported unusable on stderr
FORMAT = 3


@functools.cache
def compiler_source_hash(backend: str = "cpu") -> str:
    """sha256 over the compiler's source files (paths and contents): ``poot/compiler``,
    ``dialects/``, ``passes/`` and the backend's own code generator (``poot/backends/<b>.py``
    or ``poot/backends/<b>/``; other backends' files do not invalidate it)."""
    import poot

    files: set[Path] = set()
    for base in map(Path, poot.__path__):
        for sub in ("compiler", "dialects", "passes", f"backends/{backend}"):
            if (base / sub).is_dir():
                files |= {f for f in (base / sub).rglob("*")
                          if f.suffix in (".py", ".mlir", ".irdl")
                          and "__pycache__" not in f.parts}
        for f in (f"backends/{backend}.py", "backends/__init__.py"):
            if (base / f).is_file():
                files.add(base / f)
    h = hashlib.sha256()
    for f in sorted(files):
        h.update(f"{f.parent.name}/{f.name}".encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def cache_key(graph_text: str, target, options) -> str:
    import poot

    h = hashlib.sha256()
    for part in (f"format={FORMAT}", graph_text, target.key(), repr(options),
                 poot.__version__, compiler_source_hash(target.backend)):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def default_dir() -> Path:
    return Path(os.environ.get("POOT_CACHE_DIR") or Path.home() / ".cache" / "poot")


@dataclass
class CachedProgram:
    """A program rebuilt from the cache: what the executor needs (``executable``,
    ``storage``) and the compile report (``dispatches``); ``graph`` is not kept."""

    executable: Any
    storage: list
    target: Any
    dispatches: dict = field(default_factory=dict)
    from_cache: bool = True
    graph: Any = None

    def run(self, inputs, params=None):
        return self.executable.run(inputs, params or {})


def _load_libs(libs) -> None:
    for lib in libs:
        ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)


def cpu_program_from_object(so_path: str, name: str, inputs, params, outputs,
                            shared_libs=()):
    """A ``CpuProgram`` calling the step function of a linked shared object."""
    from poot.backends.cpu import CpuProgram

    t0 = time.perf_counter()
    _load_libs(shared_libs)
    lib = ctypes.CDLL(str(so_path))
    sym = getattr(lib, f"_mlir__mlir_ciface_{name}")
    fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(ctypes.cast(sym, ctypes.c_void_p).value)
    prog = CpuProgram(name, list(inputs), list(params), list(outputs), engine=lib)
    prog._fn = fn
    prog.compile_s = time.perf_counter() - t0
    return prog


def link_object(engine, so_path: Path) -> bool:
    """Dump the engine's object code and link it into ``so_path``; False when no linker."""
    ld = shutil.which("ld") or shutil.which("ld.lld")
    if ld is None or not hasattr(engine, "dump_to_object_file"):
        return False
    obj = so_path.with_suffix(f".o{os.getpid()}")
    tmp = so_path.with_suffix(f".so{os.getpid()}")
    try:
        engine.dump_to_object_file(str(obj))
        r = subprocess.run([ld, "-shared", "-o", str(tmp), str(obj)], capture_output=True,
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


def cpu_program_from_llvm(text: str, name: str, inputs, params, outputs, opt_level: int = 2,
                          shared_libs=None):
    """A ``CpuProgram`` from LLVM-dialect module text (the JIT runs; nothing else), linked
    against ``shared_libs`` (default: the MLIR runner utils; an OpenMP-parallel program needs
    the OpenMP runtime it was compiled with)."""
    from mlir import ir
    from mlir.execution_engine import ExecutionEngine

    from poot.backends.cpu import CpuProgram, runtime_libs

    t0 = time.perf_counter()
    ctx = ir.Context()
    module = ir.Module.parse(text, ctx)
    libs = list(shared_libs) if shared_libs is not None else list(runtime_libs())
    missing = [lib for lib in libs if not os.path.exists(lib)]
    if missing:
        raise FileNotFoundError(f"shared libraries of a cached program are gone: {missing}")
    engine = ExecutionEngine(module, opt_level=opt_level, shared_libs=libs)
    prog = CpuProgram(name, list(inputs), list(params), list(outputs), engine)
    prog._fn = engine.lookup(name)
    prog.compile_s = time.perf_counter() - t0
    prog._ctx = ctx  # keep the context alive with the engine
    return prog


class _Capture:
    """Within the block, remember the text of every module given to the CPU backend's
    ExecutionEngine (used when the backend exposes no ``llvm_text``)."""

    def __enter__(self):
        import poot.backends.cpu as cpu

        self.texts: list[str] = []
        self.libs: list[list[str]] = []
        self._cpu, self._orig = cpu, cpu.ExecutionEngine
        texts, libs = self.texts, self.libs

        def capture(module, *a, **kw):
            texts.append(str(module))
            libs.append(list(kw.get("shared_libs") or []))
            return self._orig(module, *a, **kw)

        cpu.ExecutionEngine = capture
        return self

    def __exit__(self, *exc):
        self._cpu.ExecutionEngine = self._orig


class CompileCache:
    """``compile(graph, target, options)`` through the on-disk cache."""

    def __init__(self, directory: str | os.PathLike | None = None, enabled: bool = True):
        self.dir = Path(directory) if directory else default_dir()
        self.enabled = enabled
        self.hits = 0
        self.misses = 0
        if enabled:
            try:
                (self.dir / "programs").mkdir(parents=True, exist_ok=True)
                if not os.access(self.dir / "programs", os.W_OK | os.X_OK):
                    raise PermissionError(13, "not writable")
            except OSError as e:
                self._disable(e)

    def _disable(self, e: OSError) -> None:
        """Turn the cache off for this instance and say so once per directory on stderr (an
        unusable ``POOT_CACHE_DIR`` must not silently cost a full compile every run)."""
        import sys

        self.enabled = False
        where = str(self.dir)
        if where not in _WARNED:
            _WARNED.add(where)
            why = e.strerror or str(e)
            print(f"poot: warning: compile cache disabled: cannot use {where}: {why}",
                  file=sys.stderr)

    def path(self, key: str) -> Path:
        return self.dir / "programs" / f"{key}.pkl"

    def compile(self, graph, target, options):
        from poot.compiler import compile

        if not self.enabled or target.backend != "cpu":
            return compile(graph, target, options)
        key = cache_key(graph.text(), target, options)
        path = self.path(key)
        if path.is_file():
            try:
                with open(path, "rb") as f:
                    entry = pickle.load(f)
                so = path.with_suffix(".so")
                exe = None
                if entry.get("object") and so.is_file():
                    try:
                        exe = cpu_program_from_object(so, entry["name"], entry["inputs"],
                                                      entry["params"], entry["outputs"],
                                                      entry.get("libs") or ())
                    except (OSError, AttributeError):
                        exe = None
                exe = exe or cpu_program_from_llvm(entry["llvm"], entry["name"], entry["inputs"],
                                            entry["params"], entry["outputs"],
                                            entry["opt_level"], entry.get("libs"))
                self.hits += 1
                return CachedProgram(exe, entry["storage"], target, entry["dispatches"])
            except Exception:  # a stale or unreadable entry: recompile and overwrite
                pass
        self.misses += 1
        with _LOCK:
            with _Capture() as cap:
                program = compile(graph, target, options)
        exe = program.executable
        text, libs = getattr(exe, "llvm_text", None), getattr(exe, "shared_libs", None)
        if text is None and len(cap.texts) == 1:
            text, libs = cap.texts[0], cap.libs[0]
        if text is not None:
            entry = {"llvm": text, "name": exe.name, "inputs": exe.inputs,
                     "params": exe.params, "outputs": exe.outputs,
                     "opt_level": options.opt_level, "libs": libs,
                     "storage": program.storage,
                     "dispatches": dict(program.dispatches)}
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                entry["object"] = link_object(exe.engine, path.with_suffix(".so"))
                tmp = path.with_suffix(f".tmp{os.getpid()}")
                with open(tmp, "wb") as f:
                    pickle.dump(entry, f)
                os.replace(tmp, path)
            except OSError as e:
                self._disable(e)
            except (pickle.PicklingError, TypeError, AttributeError):
                pass
        return program


__all__ = ["CachedProgram", "CompileCache", "cache_key", "compiler_source_hash",
           "cpu_program_from_llvm", "cpu_program_from_object", "default_dir", "link_object"]
