"""Progress on stderr for the commands that load and compile (:mod:`poot.progress` events).

* On a terminal: a tqdm bar per phase -- a step's compile counts its units (passes,
  dispatch regions, kernels, LLVM codegen, ...) with the unit running now, the elapsed time
  and an estimate of the time left; the bar's clock ticks while a long unit (LLVM codegen)
  runs.
  A finished phase leaves one line (``poot: decode step: 15 stages in 18.3 s``).
* The estimate: units differ a lot in cost (the CPU's LLVM codegen is most of a step's compile),
  so counting them predicts badly. Each finished phase's time per stage is remembered (in
  memory, and in ``history``, a small JSON file, for later runs); a phase whose stages match
  a remembered one is estimated from it, scaled by how long its finished stages took here
  (``[00:04<~00:15]``). The very first CPU compile is estimated from :data:`PRIOR` (measured
  here); a phase that matches nothing shows tqdm's own rate.
* Not a terminal (a log, CI): one plain line per stage as it ends, with its time
  (``poot: decode step: LLVM codegen 1.9 s``), and one per phase.
* ``quiet``: nothing.

Warnings and errors are not progress: they are printed whatever this says.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import TextIO

#: remembered phases kept in the history file
HISTORY_PHASES = 8
#: what the very first compile is estimated from: the seconds per stage of a cold CPU step of
#: SmolLM2-135M measured on 2 cores (only the proportions matter: the estimate is scaled by
#: how long the finished stages took). Used after every remembered phase.
PRIOR = [{"tracing": 0.2, "pass poot-canonicalize": 0.35, "pass poot-cse": 0.1,
          "pass poot-dce": 0.05, "pass poot-rope-fusion": 0.1,
          "pass poot-flash-attention": 0.1, "pass poot-legalize": 0.05, "planning": 0.04,
          "pass poot-fuse-dispatch": 0.45, "lower to linalg": 0.25, "bufferize": 0.25,
          "lower to LLVM": 0.25, "LLVM IR": 0.15, "LLVM codegen": 1.9, "linking": 0.05,
          "writing the shared object": 0.01, "writing the compile cache": 0.02}]


class Reporter:
    """A :mod:`poot.progress` callback writing to ``stream`` (see the module docstring).
    ``tty``: force the terminal form on or off (default: ``stream.isatty()``). ``history``:
    a JSON file of stage times of earlier compiles (read if it is there, written at
    :meth:`close`; None: kept in memory only). Call :meth:`close` when the work is over
    (also the context-manager exit)."""

    def __init__(self, stream: TextIO | None = None, quiet: bool = False,
                 tty: bool | None = None, refresh_s: float = 0.5,
                 history: str | os.PathLike | None = None):
        self.stream = stream or sys.stderr
        self.quiet = quiet
        self.tty = (self.stream.isatty() if hasattr(self.stream, "isatty") else False) \
            if tty is None else tty
        self.refresh_s = refresh_s
        self.phase: str | None = None
        self.phase_t0 = 0.0
        self.stage: str | None = None
        self.stage_t0 = 0.0
        self.stage_units = 0
        self.units = 0                   # units started in this phase
        self.times: dict[str, float] = {}     # seconds per finished stage of this phase
        self.history_path = history
        self.history: list[dict[str, float]] = self._read_history()
        self.learned = 0                 # phases added to the history by this reporter
        self.bar = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    # ---- events --------------------------------------------------------------------------
    def __call__(self, stage: str, done: int = 0, total: int = 0) -> None:
        if self.quiet:
            return
        with self._lock:
            now = time.perf_counter()
            if total == 0:
                self._end_phase(now)
                self.phase, self.phase_t0, self.units = stage, now, 0
                if self.tty:
                    self._open_bar(stage, None)
                return
            if self.phase is None:
                self.phase, self.phase_t0, self.units = "compiling", now, 0
            self.units += 1
            if stage != self.stage:
                self._end_stage(now)
                self.stage, self.stage_t0, self.stage_units = stage, now, 0
            self.stage_units += 1
            if self.tty:
                if self.bar is None or self.bar.total is None:
                    self._open_bar(self.phase, total)
                self.bar.total = total
                self.bar.n = done
                self.bar.set_postfix_str(stage, refresh=False)
                self._show_estimate(now)
                self.bar.refresh()

    def close(self, failed: bool = False) -> None:
        """End the current phase (its last line; none when ``failed``: the error that
        follows says what happened) and stop the clock."""
        if self.quiet:
            return
        with self._lock:
            if failed:
                if self.bar is not None:
                    self.bar.close()
                    self.bar = None
                self.phase = self.stage = None
            else:
                self._end_phase(time.perf_counter())
            self._write_history()
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(timeout=2)
            self._ticker = None

    def __enter__(self) -> "Reporter":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self.close(failed=exc_type is not None)

    # ---- output --------------------------------------------------------------------------
    def _line(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    def _end_stage(self, now: float) -> None:
        if self.stage is None:
            return
        self.times[self.stage] = self.times.get(self.stage, 0.0) + now - self.stage_t0
        if not self.tty:
            many = f" ({self.stage_units} units)" if self.stage_units > 1 else ""
            self._line(f"poot: {self.phase}: {self.stage}{many} {now - self.stage_t0:.1f} s")
        self.stage = None

    def _end_phase(self, now: float) -> None:
        if self.phase is None:
            return
        self._end_stage(now)
        took = now - self.phase_t0
        what = f"{self.units} stages in " if self.units > 1 else ""
        if self.bar is not None:
            if self.bar.total:
                self.bar.n = self.bar.total
            self.bar.close()
            self.bar = None
        if self.tty or self.units != 1:
            self._line(f"poot: {self.phase}: {what}{took:.1f} s")
        if self.units > 1:
            self.history = ([dict(self.times)] + self.history)[:HISTORY_PHASES]
            self.learned += 1
        self.times = {}
        self.phase = None

    # ---- the estimate of the time left ---------------------------------------------------
    def estimate_left(self, now: float) -> float | None:
        """Seconds left in this phase, from the most recent remembered phase that has every
        stage seen so far (see the module docstring), or None."""
        seen = set(self.times) | ({self.stage} if self.stage else set())
        done_here = sum(self.times.values())
        for past in self.history + PRIOR:
            if not seen <= set(past):
                continue
            done_then = sum(past[s] for s in self.times)
            if done_then <= 0 or done_here <= 0:
                return None
            total = sum(past.values()) * done_here / done_then
            return max(0.0, total - (now - self.phase_t0))
        return None

    def _show_estimate(self, now: float) -> None:
        if self.bar is None or not self.bar.total:
            return
        left = self.estimate_left(now)
        when = "{remaining}" if left is None else f"~{int(left) // 60:02d}:{int(left) % 60:02d}"
        self.bar.bar_format = ("{desc}: {n_fmt}/{total_fmt} {bar:20} [{elapsed}<" + when +
                               "]{postfix}")

    def _read_history(self) -> list[dict[str, float]]:
        if not self.history_path:
            return []
        try:
            with open(self.history_path) as f:
                data = json.load(f)
            return [{str(k): float(v) for k, v in p.items()} for p in data["phases"]
                    ][:HISTORY_PHASES]
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return []

    def _write_history(self) -> None:
        """Save the remembered phases (quietly: a history that cannot be written only
        costs a later estimate)."""
        if not self.history_path or not self.learned or \
                not os.path.isdir(os.path.dirname(os.fspath(self.history_path)) or "."):
            return
        tmp = f"{self.history_path}.{os.getpid()}.tmp"
        try:
            with open(tmp, "w") as f:
                json.dump({"phases": self.history}, f)
            os.replace(tmp, self.history_path)
        except OSError:
            try:
                os.unlink(tmp)
            except OSError:
                pass

    def _open_bar(self, desc: str, total: int | None) -> None:
        from tqdm import tqdm

        if self.bar is not None:
            self.bar.close()
        fmt = ("{desc}: {n_fmt}/{total_fmt} {bar:20} [{elapsed}<{remaining}]{postfix}"
               if total else "{desc} [{elapsed}]")
        self.bar = tqdm(total=total, desc=f"poot: {desc}", file=self.stream, leave=False,
                        bar_format=fmt, dynamic_ncols=True, mininterval=0)
        if self._ticker is None:
            self._stop.clear()
            self._ticker = threading.Thread(target=self._tick, name="poot-progress",
                                            daemon=True)
            self._ticker.start()

    def _tick(self) -> None:
        """Redraw the bar twice a second so its clock moves while one unit runs long."""
        while not self._stop.wait(self.refresh_s):
            with self._lock:
                if self.bar is not None:
                    self._show_estimate(time.perf_counter())
                    self.bar.refresh()


def history_file(cache_dir: str | os.PathLike | None = None) -> str:
    """Where the stage times of earlier compiles are kept: ``progress.json`` in the compile
    cache folder (``cache_dir``, else ``$POOT_CACHE_DIR`` / ``~/.cache/poot``); written only
    when that folder exists."""
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.compiler.cache import default_dir

    folder = os.fspath(cache_dir) if cache_dir else os.fspath(default_dir())
    return os.path.join(folder, "progress.json")


__all__ = ["Reporter", "history_file"]
