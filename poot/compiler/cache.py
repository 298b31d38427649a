"""The on-disk compile cache: the second run of a model starts without the poot passes and
the lowering.

Key: sha256 of (the step graph's IR text, ``target.key()``, the compile options, the poot
version and a hash of the compiler's source files: ``poot/compiler``, ``poot/dialects/``,
``poot/passes/`` and the target backend's folder but its ``runtime.py``). A change to any of
them is a different key.

Entry, pickled with the program's storage and dispatch counts: what the backend's
registration keeps (:mod:`poot.backends.registry`, hooks ``cache_entry`` / ``load_entry``),
else the executable itself when it is a plain artifact that imports no MLIR -- CUDA's
:class:`~poot.backends.cuda.artifact.CudaArtifact` (launch plan + PTX), Vulkan's
:class:`~poot.backends.vulkan.artifact.VulkanArtifact` (plan + SPIR-V) -- (~0.5 MB for a
30-layer CUDA step). The CPU backend (:mod:`poot.backends.cpu.link`) keeps the program's
interface and its **machine code** as ``<key>.<sha256 prefix>.so`` (the shared object made
ahead of time by LLVM's ``opt``/``llc`` and ``ld -shared``, or the JIT's object code linked
by the system linker, with the LLVM-dialect text as the fallback when no linker is found or
the ``.so`` does not load); a hit loads it with ``ctypes``: no LLVM. Files an entry names are
written through :class:`EntryFiles`.

**Integrity.** Every entry file is written to a temporary name and ``os.replace``-d into
place (a reader sees the old file or the whole new one). It starts with :data:`MAGIC` and a
JSON line holding the record kind (``program``; ``step`` or ``pipeline`` for index entries),
the full key the file is the entry of, the payload's size and the sha256 over (kind, key,
payload), all checked before the payload is read (:func:`unseal`). A file an entry names
(the ``.so``) must be named ``<that key>.<its sha256 prefix>.<suffix>`` and match the size
and sha256 recorded in the sealed entry before ``ctypes`` maps it (a truncated shared object
would otherwise crash the process with SIGBUS); CUDA/Vulkan/wgpu artifacts are pickled
inside the entry. So one whole, valid file standing in for another -- an index or program
entry copied or linked under another key's name, a half-synced folder, another entry's
``.so`` -- is never loaded as this key's. A damaged entry is discarded with one warning
(``poot: warning: compile cache entry ... is damaged (...); discarded, compiling again``;
``... is not the entry of its name (it holds the program entry of key ...)`` for another
key's) and compiled again. Entries of FORMAT 4 and earlier carry no key: they are not looked
up (the keys changed with :data:`FORMAT` / :data:`INDEX_FORMAT`), and one found under a
current name is discarded.
Shared objects are named by their hash, so a file another process has loaded is never
rewritten. Processes sharing one cache take an exclusive lock on ``locks/<key>.lock``
while compiling a missing step or program (:mod:`poot.compiler.cache_lock`): the second one
waits and then loads what the first wrote, instead of compiling it too. The lock file records
its holder (pid, host, since, what it compiles); a wait is bounded (``lock_timeout_s``,
``$POOT_CACHE_LOCK_TIMEOUT``, default 900 s) and ends in :class:`CacheLockTimeout` naming
the holder; a lock whose holder no longer runs on this host is broken with a warning.

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
directory that exists but cannot be written is used read-only (programs compiled before are
loaded, new ones are not saved; one warning says so); one that cannot be created turns the
cache off with one warning (``poot: warning: compile cache disabled: cannot create ...``).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import json
import os
import pickle
import threading
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from poot.backends.registry import BACKENDS, hook
from poot.errors import PootError
from poot.compiler.cache_lock import CacheLockTimeout, hold
from poot.compiler.compile import compile as compile_program
from poot.compiler.cache_lock import lock_timeout_s as _lock_timeout
from poot import settings
from poot.compiler.pipeline_parallel import PipelineProgram, compile_pipeline
from poot.progress import Tracker
from poot.version import __version__

#: one compile at a time per process: the code generators keep process-wide state (the CPU
#: backend's loaded libraries and malloc tuning, LLVM's JIT) that no one has shown safe to
#: drive from two threads at once
_COMPILING = threading.Lock()
_WARN_LOCK = threading.Lock()
_WARNED: set[str] = set()   # warnings already given on stderr (once per directory / entry)
#: 5: every entry file is bound to its key (record kind and full key sealed with it)
FORMAT = 5
#: first bytes of every entry file (then a JSON line with the payload's size and sha256)
MAGIC = b"poot-cache-entry\n"
#: 3: index entries are sealed and bound to their step key (FORMAT 5); index entries of
#: earlier formats are not looked up (a plain miss, not a damaged entry)
INDEX_FORMAT = 3


class CacheMiss(PootError):
    """No compiled program for a step where compiling is impossible (no MLIR here); the
    message says which part of the step key differs from the entries in the cache."""


#: the ``poot`` package's folder (the compiler's sources are hashed from it)
SOURCE_ROOT = Path(__file__).resolve().parents[1]


@functools.cache
def poot_version() -> str:
    """poot's version (part of every key): ``poot/version.py``'s, the one source the
    distribution's metadata is made from, so a source tree that was never installed (the copy
    a GPU machine without MLIR runs from a carried cache) keys its programs as the installed
    tree that compiled them does."""
    return __version__


#: files of a backend's folder that run compiled programs and never make them (not hashed)
RUNTIME_FILES = frozenset({"runtime.py"})


@functools.cache
def compiler_source_hash(backend: str = "cpu") -> str:
    """sha256 over the compiler's source files (paths and contents): ``poot/compiler``,
    ``poot/dialects/``, ``poot/passes/`` and the backend's own code generator (``poot/backends/<b>.py``
    or ``poot/backends/<b>/``, ``poot/backends/gpu`` for the backends on the shared GPU plan,
    and the folders its registration's ``sources`` names; other backends' files do not
    invalidate it). A backend's ``runtime.py`` is left out: a runtime loads and runs what was
    compiled and no code generator imports it, so editing one keeps every cached program."""
    reg = BACKENDS.get(backend)
    shared = reg is not None and reg.shared_gpu
    subs = ("compiler", "dialects", "passes", f"backends/{backend}") + \
        (("backends/gpu",) if shared else ())
    subs += reg.sources if reg is not None else ()
    return _source_hash(subs, (f"backends/{backend}.py", "backends/__init__.py"))


@functools.cache
def step_source_hash(backend: str = "cpu") -> str:
    """sha256 over what turns a model and a step spec into a program: the tracer (``models``,
    ``graph``) and everything :func:`compiler_source_hash` covers."""
    return _source_hash(("models", "graph"), (), compiler_source_hash(backend))


def _source_hash(subs, singles, salt: str = "") -> str:
    """sha256 (after ``salt``) over the source files (``.py``, ``.mlir``, ``.irdl``; a
    backend's ``runtime.py`` left out) under the folders ``subs`` of :data:`SOURCE_ROOT` and
    its files ``singles``, by folder/name and contents."""
    files: set[Path] = set()
    for sub in subs:
        if (SOURCE_ROOT / sub).is_dir():
            files |= {f for f in (SOURCE_ROOT / sub).rglob("*")
                      if f.suffix in (".py", ".mlir", ".irdl")
                      and "__pycache__" not in f.parts and f.name not in RUNTIME_FILES}
    for f in singles:
        if (SOURCE_ROOT / f).is_file():
            files.add(SOURCE_ROOT / f)
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
    return _digest((f"format={FORMAT}", graph_text, target.key(), canonical(options),
                    poot_version(), compiler_source_hash(target.backend)))


def step_describe(model, weight_types, spec, target, options) -> dict[str, str]:
    """What a step key is made of, as text per part (kept in index entries to explain a
    miss). ``model``: a family instance (``config`` a dataclass); ``weight_types``: role ->
    PootType; ``spec``: a :class:`~poot.models.StepSpec`."""
    cls = type(model)
    types = "\n".join(f"{n}:{canonical(t)}" for n, t in sorted(weight_types.items()))
    return {"family": f"{cls.__module__}.{cls.__qualname__}",
            "config": canonical(model.config),
            "weights": hashlib.sha256(types.encode()).hexdigest(),
            "step": canonical(spec), "target": target.key(), "options": canonical(options),
            "version": poot_version(), "sources": step_source_hash(target.backend)}


def step_key(model, weight_types, spec, target, options) -> str:
    """The step key (see the module docstring); computed without tracing or MLIR."""
    d = step_describe(model, weight_types, spec, target, options)
    return _digest([f"index={INDEX_FORMAT}"] + [f"{k}={d[k]}" for k in sorted(d)])


def default_dir() -> Path:
    return Path(settings.get_str("POOT_CACHE_DIR") or Path.home() / ".cache" / "poot")


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


class DamagedEntry(Exception):
    """A cache file that fails its check (internal: the entry is discarded and recompiled)."""


class ForeignEntry(DamagedEntry):
    """A whole, valid cache entry found under the name of another key (internal: discarded
    and recompiled like a damaged one)."""


def _atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same directory and
    ``os.replace``: a reader sees the old file or the whole new one, never a part."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    finally:
        try:
            tmp.unlink()
        except OSError:
            pass


class EntryFiles:
    """The files of one program entry, beside it in ``programs/``: each named
    ``<key>.<sha256 prefix>.<suffix>`` (content-named: a file another process has loaded is
    never rewritten in place) and recorded with its size and sha256, which are checked before
    anything loads it. What a backend's ``cache_entry`` hook writes through.

    ``recorded``: file name -> (size in bytes, sha256 hex), stored in the entry."""

    def __init__(self, folder: Path, key: str):
        self.folder, self.key = folder, key
        self.recorded: dict[str, tuple[int, str]] = {}

    def write(self, data: bytes, suffix: str) -> str:
        """Write ``data`` as an entry file (atomically); its name. Raises ``OSError``."""
        digest = hashlib.sha256(data).hexdigest()
        name = f"{self.key}.{digest[:16]}.{suffix}"
        _atomic_write(self.folder / name, data)
        self.recorded[name] = (len(data), digest)
        return name

    def make(self, make: Callable[[Path], bool], suffix: str) -> str | None:
        """An entry file written by ``make(path)`` to a temporary path (True: written);
        its name, or None when ``make`` returned False. Raises ``OSError``."""
        tmp = self.folder / f".{self.key}.{os.getpid()}.{threading.get_ident()}.{suffix}"
        try:
            if not make(tmp):
                return None
            size, digest = file_digest(tmp)
            name = f"{self.key}.{digest[:16]}.{suffix}"
            os.replace(tmp, self.folder / name)
            self.recorded[name] = (size, digest)
            return name
        finally:
            try:
                tmp.unlink()
            except OSError:
                pass


def _sealed_digest(record: str, key: str, payload: bytes) -> str:
    """sha256 over the record kind, the key and the payload: the seal covers the binding."""
    return hashlib.sha256(f"{record}\n{key}\n".encode() + payload).hexdigest()


def seal(payload: bytes, record: str, key: str) -> bytes:
    """An entry file: :data:`MAGIC`, a JSON line with the record kind (``"program"``,
    ``"step"``, ``"pipeline"``), the full key it is the entry of, the payload's size and the
    sha256 over (record, key, payload), then the payload."""
    head = json.dumps({"record": record, "key": key, "size": len(payload),
                       "sha256": _sealed_digest(record, key, payload)})
    return MAGIC + head.encode() + b"\n" + payload


def unseal_any(data: bytes) -> tuple[str, str, bytes]:
    """(record kind, key, payload) of an entry file written by :func:`seal`, whichever key it
    is the entry of; :class:`DamagedEntry` saying what is wrong when the file is not one
    (also one of an older format, not bound to its key), is truncated or its bytes changed."""
    if not data.startswith(MAGIC):
        raise DamagedEntry("not a poot cache entry" if data else "empty file")
    nl = data.find(b"\n", len(MAGIC))
    try:
        head = json.loads(data[len(MAGIC):nl])
        size, digest = int(head["size"]), str(head["sha256"])
    except (ValueError, KeyError, TypeError):
        raise DamagedEntry("unreadable header") from None
    record, key = head.get("record"), head.get("key")
    if not isinstance(record, str) or not isinstance(key, str):
        raise DamagedEntry("an entry of an older format, not bound to its key")
    payload = data[nl + 1:]
    if len(payload) != size:
        raise DamagedEntry(f"truncated: {len(payload)} of {size} bytes")
    if _sealed_digest(record, key, payload) != digest:
        raise DamagedEntry("sha256 mismatch")
    return record, key, payload


def unseal(data: bytes, record: str, key: str) -> bytes:
    """The payload of the ``record`` entry of ``key`` (see :func:`unseal_any`);
    :class:`ForeignEntry` when the file is a whole entry of another key or kind (a file
    copied, linked or synced under another entry's name)."""
    got_record, got_key, payload = unseal_any(data)
    if (got_record, got_key) != (record, key):
        raise ForeignEntry(f"it holds the {got_record} entry of key {got_key[:16]}..., not "
                           f"the {record} entry of {key[:16]}...")
    return payload


def file_digest(path: Path) -> tuple[int, str]:
    """(size in bytes, sha256 hex) of a file, read in 1 MiB blocks."""
    h = hashlib.sha256()
    n = 0
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
            n += len(block)
    return n, h.hexdigest()


def mlir_importable() -> bool:
    """Whether the MLIR Python package can be imported here (found, not imported)."""
    import importlib.util

    try:
        return importlib.util.find_spec("mlir") is not None
    except (ImportError, ValueError):
        return False


def _warn(message: str, once: str) -> None:
    """``poot: warning: <message>`` on stderr, once per ``once`` key per process."""
    import sys

    with _WARN_LOCK:
        if once in _WARNED:
            return
        _WARNED.add(once)
    print(f"poot: warning: {message}", file=sys.stderr)


class CompileCache:
    """``compile(graph, target, options)`` through the on-disk cache (see the module doc).

    Attributes: dir; use (lookups on: also in a directory this process cannot write);
    enabled (writes on); hits, misses (counts of this instance); damaged (entries found
    damaged, or bound to another key, and discarded); lock_timeout_s (seconds a compile
    waits for another process compiling the same step before :class:`CacheLockTimeout`).
    ``lock_timeout_s`` (option): else ``$POOT_CACHE_LOCK_TIMEOUT``, else 900; a value that is
    not a positive number raises :class:`~poot.compiler.cache_lock.InvalidLockTimeout`.
    """

    def __init__(self, directory: str | os.PathLike | None = None, enabled: bool = True,
                 lock_timeout_s: float | None = None):
        self.dir = Path(directory) if directory else default_dir()
        #: seconds to wait for a step another process compiles (``$POOT_CACHE_LOCK_TIMEOUT``)
        self.lock_timeout_s = _lock_timeout(lock_timeout_s)
        self.use = enabled
        self.enabled = enabled
        self.hits = 0
        self.misses = 0
        self.damaged = 0
        if not enabled:
            return
        try:
            (self.dir / "programs").mkdir(parents=True, exist_ok=True)
        except OSError as e:
            if (self.dir / "programs").is_dir():      # there, but this process cannot add to it
                self._read_only(e)
            else:
                self._unusable(e)
            return
        if not os.access(self.dir / "programs", os.W_OK | os.X_OK):
            self._read_only(PermissionError(13, "not writable"))

    def _read_only(self, e: OSError) -> None:
        """Reads stay on, writes go off; said once per directory."""
        self.enabled = False
        _warn(f"compile cache {self.dir} is read-only ({e.strerror or e}): programs compiled "
              f"before are loaded from it, new ones are not saved", f"ro:{self.dir}")

    def _unusable(self, e: OSError) -> None:
        """The directory cannot be created: the cache is off; said once per directory."""
        self.enabled = self.use = False
        _warn(f"compile cache disabled: cannot create {self.dir} ({e.strerror or e}); every "
              f"run compiles from scratch (set POOT_CACHE_DIR to a writable directory)",
              f"off:{self.dir}")

    def _disable(self, e: OSError) -> None:
        """A write failed: stop writing (reads go on), say so once per directory."""
        self.enabled = False
        _warn(f"compile cache {self.dir}: cannot write ({e.strerror or e}); new programs are "
              f"not saved", f"wr:{self.dir}")

    def path(self, key: str) -> Path:
        """The entry file of program ``key``."""
        return self.dir / "programs" / f"{key}.pkl"

    def _discard(self, path: Path, why: str, stat=None, foreign: bool = False) -> None:
        """A damaged entry, or a ``foreign`` one (a whole entry of another key under this
        key's name): one warning, and the files go (when writable; ``stat``: only if ``path``
        is still the file that was read, not one another process wrote since)."""
        self.damaged += 1
        state = "is not the entry of its name" if foreign else "is damaged"
        _warn(f"compile cache entry {path.stem[:16]} ({path.parent}) {state} ({why}); "
              f"discarded, compiling again", f"bad:{path}")
        if not self.enabled:
            return
        try:
            now = os.stat(path)
            if stat is None or (now.st_ino, now.st_mtime_ns) == (stat.st_ino,
                                                                  stat.st_mtime_ns):
                path.unlink()
        except OSError:
            pass

    def _locked(self, name: str, progress=None, wait: bool = True, what: str = "compiling"):
        """Hold ``locks/<name>.lock`` within the block (:func:`poot.compiler.cache_lock.hold`:
        ``flock``, the holder recorded, a wait bounded by ``lock_timeout_s``, a lock whose
        holder is gone broken), so processes sharing the cache compile a program once: the
        second waits, then finds it. Without a writable cache there is no lock (nothing is
        written to race on). The block gets True when it holds the lock (or there is none);
        with ``wait=False``, False at once when another process holds it. Raises
        :class:`CacheLockTimeout`. ``what``: what the holder compiles, for the record."""
        if not self.enabled:
            return nullcontext(True)
        try:
            (self.dir / "locks").mkdir(exist_ok=True)
        except OSError:
            return nullcontext(True)
        on_wait = None
        if progress is not None:
            def on_wait():
                progress("waiting for another process compiling it")
        return hold(self.dir / "locks" / f"{name}.lock", what, self.lock_timeout_s, wait,
                    on_wait, _warn)

    # ---- the step index -----------------------------------------------------------------
    def index_path(self, skey: str) -> Path:
        return self.dir / "index" / f"{skey}.json"

    def lookup(self, skey: str, target) -> "CachedProgram | None":
        """The program recorded under step key ``skey``, or None. Imports no MLIR for a GPU
        entry (a CPU entry loads its linked ``.so`` with ctypes; the LLVM-text fallback needs
        MLIR). An absent entry is a miss; a damaged one is discarded (one warning) and a
        miss."""
        rec = self._index_record(skey, "step")
        if rec is None:
            return None
        prog = self._load(rec["program"], target)
        if prog is not None:
            self.hits += 1
        return prog

    def compile_step(self, skey: str, describe: dict, trace: Callable[[], Any], target,
                     options, progress=None, wait: bool = True):
        """The program of one step: the index entry ``skey`` when there is one (no trace),
        else ``trace()`` compiled through :meth:`compile` and recorded under ``skey``.
        ``describe`` (:func:`step_describe`) is stored beside it to explain later misses.
        Where MLIR cannot be imported a miss raises :class:`CacheMiss`. ``progress``: a
        :mod:`poot.progress` callback or Tracker (units: cache lookup, tracing, the
        compile's passes and code generation, linking, writing). ``wait=False``: when
        another process is compiling this step, return None at once instead of waiting for
        it (what a :mod:`~poot.api.compile_ahead` worker does)."""
        track = Tracker.of(progress)
        hit = self.lookup(skey, target)
        if hit is not None:
            track("loaded from the compile cache")
            return hit
        if not mlir_importable():
            raise CacheMiss(self.explain_miss(skey, describe))
        what = f"compiling the step {str(describe.get('step', skey))[:160]}"
        with self._locked(f"step-{skey}", track, wait=wait, what=what) as held:
            if not held:
                return None
            hit = self.lookup(skey, target)       # compiled by another process meanwhile
            if hit is not None:
                track("loaded from the compile cache")
                return hit
            track.add(1)
            track("tracing")
            program = self.compile(trace(), target, options, progress=track)
            gkey = getattr(program, "cache_key", None)
            if gkey is not None and self.enabled:
                try:
                    self.index_path(skey).parent.mkdir(parents=True, exist_ok=True)
                    _atomic_write(self.index_path(skey), seal(json.dumps(
                        {"program": gkey, "describe": describe}, indent=1).encode(),
                        "step", skey))
                except OSError as e:
                    self._disable(e)
        return program

    def compile_pipeline_step(self, skey: str, describe: dict, trace: Callable[[], Any],
                              target, options, stages: int, progress=None,
                              placement: Callable[[], dict] | None = None):
        """:meth:`compile_step` for a step cut into ``stages`` pipeline stages
        (:func:`poot.compiler.pipeline_parallel.compile_pipeline`): its index entry (under ``skey``
        and the stage count) lists each stage's program key and the boundaries, so a carried
        cache loads the whole pipeline without tracing or MLIR; each stage program is cached
        by its graph like any other. ``placement()``: the carried states' stages every step of
        the model keeps (:func:`poot.compiler.pipeline_parallel.state_placement`), asked on a miss. A
        miss where MLIR is missing raises :class:`CacheMiss`."""
        track = Tracker.of(progress)
        pkey = _digest([skey, f"pipeline={stages}"])
        describe = {**describe, "pipeline": stages}
        rec = self._index_record(pkey, "pipeline")
        if rec is not None:
            progs = [self._load(k, target) for k in rec["pipeline"]]
            if all(p is not None for p in progs):
                self.hits += 1
                track("loaded from the compile cache")
                prog = PipelineProgram.from_record(progs, rec)
                prog.cache_key = pkey
                return prog
        if not mlir_importable():
            raise CacheMiss(self.explain_miss(pkey, describe))
        track.add(1)
        track("tracing")
        prog = compile_pipeline(trace(), stages,
                                lambda g: self.compile(g, target, options, progress=track),
                                placement=placement() if placement is not None else None)
        keys = [getattr(p, "cache_key", None) for p in prog.stages]
        if all(keys) and self.enabled:
            try:
                self.index_path(pkey).parent.mkdir(parents=True, exist_ok=True)
                _atomic_write(self.index_path(pkey), seal(json.dumps(
                    {"pipeline": keys, "describe": describe, **prog.record()},
                    indent=1).encode(),
                    "pipeline", pkey))
                prog.cache_key = pkey
            except OSError as e:
                self._disable(e)
        return prog

    def _read_file(self, path: Path) -> "tuple[bytes, os.stat_result] | None":
        """An entry file's bytes and the stat taken before reading them (so a discard only
        removes the file that was read); None when absent, or unreadable (then discarded)."""
        try:
            st = os.stat(path)
            with open(path, "rb") as f:
                return f.read(), st
        except FileNotFoundError:
            return None
        except OSError as e:
            self._discard(path, f"unreadable: {e.strerror or e}")
            return None

    def _index_record(self, key: str, record: str) -> dict | None:
        """The index entry ``key`` of kind ``record`` (``"step"``: names a program;
        ``"pipeline"``: names stage programs) as a dict; None when absent, damaged or the
        entry of another key (then discarded: one warning)."""
        if not self.use:
            return None
        path = self.index_path(key)
        read = self._read_file(path)
        if read is None:
            return None
        data, st = read
        try:
            rec = json.loads(unseal(data, record, key))
            field = "program" if record == "step" else record
            if not isinstance(rec, dict):
                raise TypeError("not an object")
            if field not in rec:
                raise KeyError(field)
            return rec
        except ForeignEntry as e:
            self._discard(path, str(e), st, foreign=True)
        except DamagedEntry as e:
            self._discard(path, str(e), st)
        except (ValueError, KeyError, TypeError) as e:
            self._discard(path, f"unreadable index entry: {type(e).__name__}", st)
        return None

    def explain_miss(self, skey: str, describe: dict) -> str:
        """Why step ``skey`` has no entry: the parts of its key that differ from the closest
        index entry (fewest differing parts), or that the index is empty."""
        where = self.dir / "index"
        best = None
        for f in sorted(where.glob("*.json")) if where.is_dir() else []:
            try:
                d = json.loads(unseal_any(f.read_bytes())[2]).get("describe", {})
            except (OSError, ValueError, AttributeError, DamagedEntry):
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

    # ---- entries ------------------------------------------------------------------------
    def _read_entry(self, gkey: str) -> dict | None:
        """The verified entry dict of program ``gkey``: None when absent or damaged (then
        discarded). Every file it names (a linked ``.so``) is checked against the size and
        sha256 recorded when it was written, before anything loads it."""
        path = self.path(gkey)
        read = self._read_file(path)
        if read is None:
            return None
        data, st = read
        try:
            entry = pickle.loads(unseal(data, "program", gkey))
            if not isinstance(entry, dict):
                raise DamagedEntry("not an entry")
            files = entry.get("files", {})
            if entry.get("object") not in (None, *files):
                raise DamagedEntry("its so file is not recorded with it")
            for name, (size, digest) in files.items():
                side = path.parent / name
                what = f"its {name.rsplit('.', 1)[-1]} file"
                if name != f"{gkey}.{digest[:16]}.{name.rsplit('.', 1)[-1]}":
                    raise ForeignEntry(f"{what} {name} is not named by this key and its "
                                       f"sha256")
                try:
                    got = file_digest(side)
                except OSError as e:
                    raise DamagedEntry(f"{what}: {e.strerror or e}") from None
                if got[0] != size:
                    raise DamagedEntry(f"{what}: {got[0]} bytes, {size} recorded")
                if got[1] != digest:
                    raise DamagedEntry(f"{what}: sha256 mismatch")
        except ForeignEntry as e:
            self._discard(path, str(e), st, foreign=True)
            return None
        except DamagedEntry as e:
            self._discard(path, str(e), st)
            return None
        except Exception as e:  # noqa: BLE001  (an entry of classes that changed since)
            self._discard(path, f"unreadable: {type(e).__name__}", st)
            return None
        return entry

    def _load(self, gkey: str, target):
        """The program entry ``gkey``, or None when it is absent, damaged or stale. A
        backend's own entry is loaded by its registration's ``load_entry`` hook; a stale one
        (the hook returns None or raises: e.g. its runtime libraries are gone) is compiled
        again."""
        entry = self._read_entry(gkey)
        if entry is None:
            return None
        if entry.get("kind") == "artifact":
            exe = entry["artifact"]
        else:
            try:
                exe = hook(BACKENDS[entry["kind"]].load_entry)(entry, self.path(gkey).parent)
            except Exception:  # noqa: BLE001  (stale: e.g. its runtime libraries are gone)
                return None
            if exe is None:
                return None
        return CachedProgram(exe, entry["storage"], target, entry["dispatches"],
                             cache_key=gkey)

    def _write_entry(self, key: str, entry: dict, progress) -> bool:
        """Write ``entry`` (files it names are in place already) atomically; False when the
        write failed (the cache then stops writing)."""
        progress("writing the compile cache")
        try:
            _atomic_write(self.path(key), seal(pickle.dumps(entry), "program", key))
            return True
        except OSError as e:
            self._disable(e)
        except (pickle.PicklingError, TypeError, AttributeError):
            pass
        return False

    def _entry(self, key: str, program, target, options, progress) -> dict | None:
        """The entry of a freshly compiled ``program``: made by its backend's
        ``cache_entry`` hook when the registration has one (files it writes are named by
        ``key`` and their sha256, see :class:`EntryFiles`), else the executable pickled as a
        plain artifact. None when there is nothing to keep or writing failed."""
        reg = BACKENDS.get(target.backend)
        common = {"storage": program.storage, "dispatches": dict(program.dispatches)}
        if reg is None or reg.cache_entry is None:      # a portable artifact (no MLIR objects)
            progress.add(1)
            return {"kind": "artifact", "artifact": program.executable, **common}
        progress.add(2)
        files = EntryFiles(self.dir / "programs", key)
        try:
            fields = hook(reg.cache_entry)(program, files, options, progress)
        except OSError as e:
            self._disable(e)
            return None
        if fields is None:
            return None
        return {**fields, "kind": reg.name, **common, "files": files.recorded}

    # ---- graph-keyed compile --------------------------------------------------------------
    def compile(self, graph, target, options, progress=None):
        """``compile(graph, target, options)`` through the cache. A program is kept as its
        backend's ``cache_entry`` hook makes it (CPU: its linked machine code and LLVM text)
        or, without one, as its executable, a plain artifact (CUDA's PTX + plan, Vulkan's
        SPIR-V + plan). A program written to or read from the cache carries its key as
        ``cache_key``."""
        track = Tracker.of(progress)
        if not self.use:
            return compile_program(graph, target, options, progress=track)
        key = cache_key(graph.text(), target, options)
        hit = self._load(key, target)
        if hit is not None:
            self.hits += 1
            return hit
        with self._locked(f"program-{key}", track,
                          what=f"compiling the graph {graph.name}"):
            hit = self._load(key, target)
            if hit is not None:
                self.hits += 1
                return hit
            self.misses += 1
            with _COMPILING:
                program = compile_program(graph, target, options, progress=track)
            if not self.enabled:
                return program
            entry = self._entry(key, program, target, options, track)
            if entry is not None and self.enabled and self._write_entry(key, entry, track):
                program.cache_key = key
        return program


__all__ = ["CacheLockTimeout", "CacheMiss", "CachedProgram", "CompileCache", "EntryFiles",
           "cache_key", "canonical", "compiler_source_hash", "default_dir", "poot_version",
           "step_describe", "step_key", "step_source_hash"]
