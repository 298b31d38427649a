"""Compiling a model's steps into the compile cache: one step now (:func:`compile_cached`: a
hit reads it), or many ahead, in parallel: worker processes fill the compile cache with the
steps the loading process will ask for later.

A cold load compiles its steps one after another (the prefill chunk, the decode step of each
bucket, their samplers), each mostly one core of Python and MLIR passes with only the LLVM
stages fanned out, so a 2-core machine idles half the time. :func:`compile_ahead` starts
worker processes (``python -m poot.api.compile_ahead``) on the same steps in the *opposite*
order. A worker takes each step that no other process is compiling (the step's lock in the
compile cache, tried without waiting: a step being compiled is skipped), compiles it into the
shared cache and goes on. The loading process compiles its steps in its own order through the
same cache: a step a worker finished is a hit, one a worker is compiling is waited for (its
progress says ``waiting for another process compiling it``), so no step is compiled twice and
the longest steps, last in the loader's order, start first.

Nothing a worker does is needed for correctness: a worker that fails or is killed leaves its
step to the loading process, which compiles it (and raises any error) itself. Workers run
only where the cache is writable and MLIR importable, and there are at least two steps to
compile.

``POOT_COMPILE_WORKERS``: how many workers (0: none); default ``min(cores - 1, 2)``.
"""

from __future__ import annotations

import atexit
import os
import pickle
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

#: One step: (key model, weight types, spec), as :func:`compile_cached` takes them.
Step = tuple[Any, Any, Any]


def default_workers() -> int:
    """Worker processes for a cold load: ``POOT_COMPILE_WORKERS`` when set (an integer >=
    0, else :class:`~poot.sampling_params.InvalidRequest`), else one fewer than the cores this
    process may use, at most 2 (each step's LLVM stages already use every core)."""
    env = os.environ.get("POOT_COMPILE_WORKERS")
    if env is not None and env.strip():
        if not env.strip().isdigit():
            from poot.sampling_params import InvalidRequest

            raise InvalidRequest("POOT_COMPILE_WORKERS", env, "must be an integer >= 0")
        return int(env)
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    return max(0, min(cores - 1, 2))


class Ahead:
    """The worker processes of one :func:`compile_ahead` (``procs``; empty when none were
    started) and the steps they were given (``steps``: the misses, in the workers' order)."""

    def __init__(self, procs: list, logs: list, steps: list):
        self.procs = procs
        self.logs = logs
        self.steps = steps

    def close(self, ok: bool, timeout_s: float = 600.0) -> list[int]:
        """Wait for the workers (``ok``; killed after ``timeout_s``), else kill them at once.
        Idempotent. Returns their exit codes; a failed worker is reported once on stderr (a
        step it left is compiled by the process that needs it)."""
        from poot.compiler.cache import _warn

        if self in _OPEN:
            _OPEN.remove(self)
        codes = []
        for p, log in zip(self.procs, self.logs):
            if ok:
                try:
                    p.wait(timeout=timeout_s)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
            else:
                p.kill()
                p.wait()
            codes.append(p.returncode)
            if log.closed:
                continue
            try:
                log.seek(0)
                tail = log.read().decode(errors="replace").strip().splitlines()[-1:]
            except (OSError, ValueError):
                tail = []
            log.close()
            if ok and p.returncode > 0:      # < 0: a signal (Ctrl-C reaches it too)
                _warn(f"a compile worker exited with status {p.returncode}"
                      f"{': ' + tail[0] if tail else ''} (a step it left is compiled when "
                      f"needed)",
                      f"ahead:{p.returncode}:{tail}")
        return codes


_OPEN: list[Ahead] = []          # started and not yet closed: waited for at exit


def _close_open() -> None:
    for a in list(_OPEN):
        a.close(True)


atexit.register(_close_open)


def start_ahead(cache, steps: Sequence[Step], target, options,
                workers: int | None = None, later: Sequence[Step] = ()) -> Ahead:
    """Start ``workers`` processes (default :func:`default_workers`) compiling the cache
    misses among ``steps`` (key model, weight types, step spec), taken in *reverse* order
    (give ``steps`` in the order the caller compiles them), then those among ``later``
    (steps the caller leaves to the workers). The caller closes the returned
    :class:`Ahead` (:meth:`Ahead.close`); one still open at exit is waited for then, so the
    cache holds every step when the process ends. The keys, the model and the target must
    pickle (they do: configs and dataclasses); the workers open no checkpoint."""
    from poot.compiler.cache import mlir_importable, step_key

    n = default_workers() if workers is None else workers
    misses = []
    if n > 0 and cache is not None and cache.enabled and cache.use:
        misses = [s for s in [*list(steps)[::-1], *later]
                  if not cache.index_path(step_key(*s, target, options)).is_file()]
    procs, logs = [], []
    if len(misses) >= 2 and mlir_importable():
        try:
            payload = pickle.dumps({"cache_dir": str(cache.dir), "target": target,
                                    "options": options, "steps": misses})
        except (pickle.PicklingError, TypeError, AttributeError):
            payload = None            # e.g. a model class defined in __main__: no workers
        for _ in range(min(n, len(misses) - 1) if payload is not None else 0):
            try:
                log = tempfile.TemporaryFile()
                p = subprocess.Popen([sys.executable, "-m", "poot.api.compile_ahead"],
                                     stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                     stderr=log)
            except OSError:
                break                 # no worker: this process compiles every step
            try:
                p.stdin.write(payload)
                p.stdin.close()
            except BrokenPipeError:
                pass
            procs.append(p)
            logs.append(log)
    ahead = Ahead(procs, logs, misses if procs else [])
    if procs:
        _OPEN.append(ahead)
    return ahead


@contextmanager
def compile_ahead(cache, steps: Sequence[Step], target, options,
                  workers: int | None = None) -> Iterator[Ahead]:
    """:func:`start_ahead` for the block: on leaving, the workers are waited for (or killed
    when the block raised)."""
    ahead = start_ahead(cache, steps, target, options, workers)
    ok = False
    try:
        yield ahead
        ok = True
    finally:
        ahead.close(ok)


def compile_cached(cache, model, weight_types, spec, trace, target, options, progress=None,
                   wait: bool = True, pipeline: int = 1, placement=None):
    """The program of step ``spec`` through ``cache``'s step index (a hit neither traces nor
    imports MLIR; a miss calls ``trace()`` and compiles). ``progress``: a
    :mod:`poot.progress` callback, counting this step's units from zero. ``wait=False``:
    None when another process is compiling the step (see
    :meth:`~poot.compiler.cache.CompileCache.compile_step`). ``pipeline`` N > 1: a step with
    weights is cut into N stages (:meth:`~poot.compiler.cache.CompileCache.compile_pipeline_step`;
    ``placement()``: the KV pools' stages, ``poot.api._placement_of``); one without (a sampler)
    is not."""
    from poot.compiler.cache import step_describe, step_key
    from poot.progress import Tracker

    describe = step_describe(model, weight_types, spec, target, options)
    if pipeline > 1 and weight_types:
        return cache.compile_pipeline_step(
            step_key(model, weight_types, spec, target, options), describe, trace, target,
            options, pipeline, progress=Tracker(progress), placement=placement)
    return cache.compile_step(step_key(model, weight_types, spec, target, options), describe,
                              trace, target, options, progress=Tracker(progress), wait=wait)


def run_worker(job: dict) -> list[bool]:
    """One worker's pass: each step of ``job["steps"]`` compiled into the cache at
    ``job["cache_dir"]`` unless it is there already or another process holds its lock.
    Returns, per step, whether this call compiled or found it (False: skipped, locked)."""
    from poot.engine.runner import step_trace
    from poot.compiler.cache import CompileCache

    cache = CompileCache(job["cache_dir"])
    done = []
    for key_model, types, spec in job["steps"]:
        prog = compile_cached(cache, key_model, types, spec,
                              step_trace(key_model, types, spec), job["target"],
                              job["options"], wait=False)
        done.append(prog is not None)
    return done


def main() -> int:
    """``python -m poot.api.compile_ahead``: a worker reading its pickled job on stdin."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)   # Ctrl-C ends it quietly, no traceback
    run_worker(pickle.load(sys.stdin.buffer))
    return 0


if __name__ == "__main__":
    sys.exit(main())
