"""A compile worker of :mod:`poot.api.compile_ahead`: ``python -m poot.api.compile_worker``
reads its pickled job on stdin and compiles each step into the compile cache."""

from __future__ import annotations

import pickle
import signal
import sys

from poot.api.step_cache import compile_cached
from poot.compiler.cache import CompileCache
from poot.engine.runner import step_trace


def run_worker(job: dict) -> list[bool]:
    """One worker's pass: each step of ``job["steps"]`` compiled into the cache at
    ``job["cache_dir"]`` unless it is there already or another process holds its lock.
    Returns, per step, whether this call compiled or found it (False: skipped, locked)."""
    cache = CompileCache(job["cache_dir"])
    done = []
    for key_model, types, spec in job["steps"]:
        prog = compile_cached(cache, key_model, types, spec,
                              step_trace(key_model, types, spec), job["target"],
                              job["options"], wait=False)
        done.append(prog is not None)
    return done


def main() -> int:
    """``python -m poot.api.compile_worker``: a worker reading its pickled job on stdin."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)   # Ctrl-C ends it quietly, no traceback
    run_worker(pickle.load(sys.stdin.buffer))
    return 0


if __name__ == "__main__":
    sys.exit(main())
