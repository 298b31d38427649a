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

Entry (CUDA): the :class:`~poot.backends.cuda.artifact.CudaArtifact` (launch plan + PTX)
with the program's storage and dispatch counts, pickled (``<key>.pkl``, ~0.5 MB for a 30-layer
step). Loading it imports no MLIR.

**The step index** (``index/<step key>.json`` -> program key): finding a program without
tracing. Tracing builds MLIR, so a machine without MLIR cannot compute the graph key above.
:func:`step_key` is computed from what the trace is a function of: the family and its config,
the weight names and types, the :class:`~poot.models.StepSpec` (sampler spec and KV capacity
included), ``target.key()``, the compile options and a hash of the sources that trace and
compile (:func:`step_source_hash`). :meth:`CompileCache.compile_step` looks the step key up
first (a hit loads the entry: no trace, no MLIR) and on a miss traces, compiles through the
graph key and records the index entry. An index entry also stores what its key was made of
(``describe``), so a miss can say which part differs from the entries that are there
(:meth:`CompileCache.explain_miss`). To run on a machine without MLIR, fill the cache here
(``poot compile``) and carry the cache directory.

Location: ``$POOT_CACHE_DIR``, else ``~/.cache/poot``; ``enabled=False`` turns it off. A
directory that cannot be created or written turns it off with one warning on stderr
(``poot: warning: compile cache disabled: ...``).
"""

from __future__ import annotations

import ctypes
import dataclasses
import enum
import functools
import hashlib
import json
import os
import pickle
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from poot.errors import PootError

_LOCK = threading.Lock()
_WARNED: set[str] = set()   # cache directories already reported unusable on stderr
FORMAT = 3
INDEX_FORMAT = 1
#: Backends whose code generation goes through the shared GPU plan (``poot/backends/gpu``).
GPU_BACKENDS = ("cuda", "vulkan", "rocm")


class CacheMiss(PootError):
    """No compiled program for a step where compiling is impossible (no MLIR here); the
    message says which part of the step key differs from the entries in the cache."""


@functools.cache
def compiler_source_hash(backend: str = "cpu") -> str:
    """sha256 over the compiler's source files (paths and contents): ``poot/compiler``,
    ``dialects/``, ``passes/`` and the backend's own code generator (``poot/backends/<b>.py``
    or ``poot/backends/<b>/``, and ``poot/backends/gpu`` for the GPU backends; other backends'
    files do not invalidate it)."""
    subs = ("compiler", "dialects", "passes", f"backends/{backend}") + \
        (("backends/gpu",) if backend in GPU_BACKENDS else ())
    return _source_hash(subs, (f"backends/{backend}.py", "backends/__init__.py"))


@functools.cache
def step_source_hash(backend: str = "cpu") -> str:
    """sha256 over what turns a model and a step spec into a program: the tracer (``models``,
    ``graph``) and everything :func:`compiler_source_hash` covers."""
    return _source_hash(("models", "graph"), (), compiler_source_hash(backend))


def _source_hash(subs, singles, salt: str = "") -> str:
    import poot

    files: set[Path] = set()
    for base in map(Path, poot.__path__):
        for sub in subs:
            if (base / sub).is_dir():
                files |= {f for f in (base / sub).rglob("*")
                          if f.suffix in (".py", ".mlir", ".irdl")
                          and "__pycache__" not in f.parts}
        for f in singles:
            if (base / f).is_file():
                files.add(base / f)
    h = hashlib.sha256(salt.encode())
    for f in sorted(files):
        h.update(f"{f.parent.name}/{f.name}".encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def canonical(obj) -> str:
    """A text identity of ``obj`` that does not depend on the process: dataclasses by field,
    sets sorted (a ``frozenset`` repr follows string hashing, which differs per process),
    enums by name, floats by ``repr``; anything else by ``repr``."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        inner = ",".join(f"{f.name}={canonical(getattr(obj, f.name))}"
                         for f in dataclasses.fields(obj))
        return f"{type(obj).__qualname__}({inner})"
    if isinstance(obj, enum.Enum):
        return f"{type(obj).__qualname__}.{obj.name}"
    if isinstance(obj, (set, frozenset)):
        return "{" + ",".join(sorted(canonical(x) for x in obj)) + "}"
    if isinstance(obj, dict):
        return "{" + ",".join(sorted(f"{canonical(k)}:{canonical(v)}"
                                     for k, v in obj.items())) + "}"
    if isinstance(obj, (list, tuple)):
        return ("[" if isinstance(obj, list) else "(") + ",".join(map(canonical, obj)) + ")"
    return repr(obj)


def _digest(parts) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def cache_key(graph_text: str, target, options) -> str:
    """The program key: the traced graph's text, the target, the options, the compiler."""
    import poot

    return _digest((f"format={FORMAT}", graph_text, target.key(), canonical(options),
                    poot.__version__, compiler_source_hash(target.backend)))


def step_describe(model, weight_types, spec, target, options) -> dict[str, str]:
    """What a step key is made of, as text per part (kept in index entries to explain a
    miss). ``model``: a family instance (``config`` a dataclass); ``weight_types``: role ->
    PootType; ``spec``: a :class:`~poot.models.StepSpec`."""
    import poot

    cls = type(model)
    types = "\n".join(f"{n}:{canonical(t)}" for n, t in sorted(weight_types.items()))
    return {"family": f"{cls.__module__}.{cls.__qualname__}",
            "config": canonical(model.config),
            "weights": hashlib.sha256(types.encode()).hexdigest(),
            "step": canonical(spec), "target": target.key(), "options": canonical(options),
            "version": poot.__version__, "sources": step_source_hash(target.backend)}


def step_key(model, weight_types, spec, target, options) -> str:
    """The step key (see the module docstring); computed without tracing or MLIR."""
    d = step_describe(model, weight_types, spec, target, options)
    return _digest([f"index={INDEX_FORMAT}"] + [f"{k}={d[k]}" for k in sorted(d)])


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
    cache_key: str | None = None

    def run(self, inputs, params=None):
        return self.executable.run(inputs, params or {})


def _load_libs(libs) -> None:
    for lib in libs:
        ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)


def cpu_program_from_object(so_path: str, name: str, inputs, params, outputs,
                            shared_libs=(), in_place=None):
    """A ``CpuProgram`` calling the step function of a linked shared object."""
    from poot.backends.cpu import CpuProgram

    t0 = time.perf_counter()
    _load_libs(shared_libs)
    lib = ctypes.CDLL(str(so_path))
    sym = getattr(lib, f"_mlir__mlir_ciface_{name}")
    fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(ctypes.cast(sym, ctypes.c_void_p).value)
    prog = CpuProgram(name, list(inputs), list(params), list(outputs), engine=lib,
                      in_place=dict(in_place or {}))
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
                          shared_libs=None, in_place=None):
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
    prog = CpuProgram(name, list(inputs), list(params), list(outputs), engine,
                      in_place=dict(in_place or {}))
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
        self.use = enabled          # lookups: also in a directory this process cannot write
        self.enabled = enabled      # writes
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

    # ---- the step index -----------------------------------------------------------------
    def index_path(self, skey: str) -> Path:
        return self.dir / "index" / f"{skey}.json"

    def lookup(self, skey: str, target) -> "CachedProgram | None":
        """The program recorded under step key ``skey``, or None. Imports no MLIR for a CUDA
        entry (a CPU entry loads its linked ``.so`` with ctypes; the LLVM-text fallback needs
        MLIR). A stale or unreadable entry is a miss."""
        if not self.use:
            return None
        try:
            with open(self.index_path(skey)) as f:
                rec = json.load(f)
            prog = self._load(rec["program"], target)
        except (OSError, ValueError, KeyError):
            return None
        if prog is not None:
            self.hits += 1
        return prog

    def compile_step(self, skey: str, describe: dict, trace: Callable[[], Any], target,
                     options):
        """The program of one step: the index entry ``skey`` when there is one (no trace),
        else ``trace()`` compiled through :meth:`compile` and recorded under ``skey``.
        ``describe`` (:func:`step_describe`) is stored beside it to explain later misses.
        Where MLIR cannot be imported a miss raises :class:`CacheMiss`."""
        hit = self.lookup(skey, target)
        if hit is not None:
            return hit
        import importlib.util

        try:
            have_mlir = importlib.util.find_spec("mlir") is not None
        except (ImportError, ValueError):
            have_mlir = False
        if not have_mlir:
            raise CacheMiss(self.explain_miss(skey, describe))
        program = self.compile(trace(), target, options)
        gkey = getattr(program, "cache_key", None)
        if gkey is not None and self.enabled:
            try:
                self.index_path(skey).parent.mkdir(parents=True, exist_ok=True)
                tmp = self.index_path(skey).with_suffix(f".tmp{os.getpid()}")
                with open(tmp, "w") as f:
                    json.dump({"program": gkey, "describe": describe}, f, indent=1)
                os.replace(tmp, self.index_path(skey))
            except OSError as e:
                self._disable(e)
        return program

    def explain_miss(self, skey: str, describe: dict) -> str:
        """Why step ``skey`` has no entry: the parts of its key that differ from the closest
        index entry (fewest differing parts), or that the index is empty."""
        where = self.dir / "index"
        best = None
        for f in sorted(where.glob("*.json")) if where.is_dir() else []:
            try:
                d = json.load(open(f)).get("describe", {})
            except (OSError, ValueError):
                continue
            diff = [k for k in describe if d.get(k) != describe[k]]
            if best is None or len(diff) < len(best[0]):
                best = (diff, d)
        head = (f"no compiled program for this step in the compile cache {self.dir} and MLIR "
                f"is not importable here, so it cannot be compiled: compile it on a machine "
                f"with MLIR (poot compile ... with the same model, backend, --kv-capacity and "
                f"sources) and carry the cache directory")
        if best is None:
            return head + f" (the cache has no index entries{'' if self.use else '; the cache is off'})"
        diff, d = best
        parts = "; ".join(f"{k}: cached {str(d.get(k))[:80]!r} vs here {str(describe[k])[:80]!r}"
                          for k in diff)
        return head + f" (closest entry differs in {parts})"

    def _load(self, gkey: str, target):
        """The program entry ``gkey`` (CUDA or CPU), or None when it is absent or stale."""
        path = self.path(gkey)
        if not path.is_file():
            return None
        try:
            with open(path, "rb") as f:
                entry = pickle.load(f)
        except Exception:  # noqa: BLE001  (a stale or unreadable entry)
            return None
        if entry.get("backend") == "cuda":
            return CachedProgram(entry["artifact"], entry["storage"], target,
                                 entry["dispatches"], cache_key=gkey)
        return self._load_cpu(path, entry, target)

    def _load_cpu(self, path: Path, entry: dict, target):
        try:
            so = path.with_suffix(".so")
            exe = None
            if entry.get("object") and so.is_file():
                try:
                    exe = cpu_program_from_object(so, entry["name"], entry["inputs"],
                                                  entry["params"], entry["outputs"],
                                                  entry.get("libs") or (),
                                                  entry.get("in_place"))
                except (OSError, AttributeError):
                    exe = None
            exe = exe or cpu_program_from_llvm(entry["llvm"], entry["name"], entry["inputs"],
                                               entry["params"], entry["outputs"],
                                               entry["opt_level"], entry.get("libs"),
                                               entry.get("in_place"))
        except Exception:  # noqa: BLE001  (a stale entry: recompile and overwrite)
            return None
        return CachedProgram(exe, entry["storage"], target, entry["dispatches"],
                             cache_key=path.stem)

    def _write(self, path: Path, entry: dict) -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            with open(tmp, "wb") as f:
                pickle.dump(entry, f)
            os.replace(tmp, path)
        except OSError as e:
            self._disable(e)

    def _compile_cuda(self, graph, target, options):
        from poot.compiler import compile

        key = cache_key(graph.text(), target, options)
        hit = self._load(key, target) if self.use else None
        if hit is not None:
            self.hits += 1
            return hit
        self.misses += 1
        program = compile(graph, target, options)
        if self.enabled:
            self._write(self.path(key), {"backend": "cuda", "artifact": program.executable,
                                         "storage": program.storage,
                                         "dispatches": dict(program.dispatches)})
            if self.enabled:          # written (a failed write turned the cache off)
                program.cache_key = key
        return program

    # ---- graph-keyed compile --------------------------------------------------------------
    def compile(self, graph, target, options):
        """``compile(graph, target, options)`` through the cache (CPU and CUDA programs are
        cached; other backends compile every time). A program written to or read from the
        cache carries its key as ``cache_key``."""
        from poot.compiler import compile

        if self.enabled and target.backend == "cuda":
            return self._compile_cuda(graph, target, options)
        if not self.enabled or target.backend != "cpu":
            return compile(graph, target, options)
        key = cache_key(graph.text(), target, options)
        path = self.path(key)
        if path.is_file():
            hit = self._load(key, target)
            if hit is not None:
                self.hits += 1
                return hit
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
                     "in_place": dict(getattr(exe, "in_place", {}) or {}),
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
                program.cache_key = key
            except OSError as e:
                self._disable(e)
            except (pickle.PicklingError, TypeError, AttributeError):
                pass
        return program


__all__ = ["CacheMiss", "CachedProgram", "CompileCache", "cache_key", "canonical",
           "compiler_source_hash", "step_describe", "step_key", "step_source_hash",
           "cpu_program_from_llvm", "cpu_program_from_object", "default_dir", "link_object"]
