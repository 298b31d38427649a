"""``poot serve`` as a child process for the tests that need a whole process (signals, Ray):
its stderr is collected on a thread; ``url`` comes from its "listening on" line."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time


class ServeProcess:
    """``python -m poot.cli serve ARGS`` with stderr collected (:attr:`lines`)."""

    def __init__(self, *args: str, env: dict | None = None):
        self.proc = subprocess.Popen([sys.executable, "-m", "poot.cli", "serve", *args],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, **(env or {})})
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    @property
    def log(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, pattern: str, limit: float) -> re.Match:
        """The first stderr line matching ``pattern``; fails if the process exits first or
        ``limit`` seconds pass."""
        end = time.monotonic() + limit
        rx = re.compile(pattern)
        seen = 0
        while True:
            for line in self.lines[seen:]:
                m = rx.search(line)
                if m:
                    return m
            seen = len(self.lines)
            if self.proc.poll() is not None:
                self._reader.join(5)
                if any(rx.search(l) for l in self.lines):
                    return next(rx.search(l) for l in self.lines if rx.search(l))
                raise AssertionError(f"poot serve exited ({self.proc.returncode}) before "
                                     f"{pattern!r}:\n{self.log[-3000:]}")
            if time.monotonic() > end:
                raise AssertionError(f"no {pattern!r} within {limit} s:\n{self.log[-3000:]}")
            time.sleep(0.05)

    def terminate(self, limit: float) -> int:
        """SIGTERM, then the exit status (killed and failed past ``limit`` seconds)."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(limit)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"poot serve did not exit within {limit} s of SIGTERM:\n"
                                 f"{self.log[-3000:]}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
