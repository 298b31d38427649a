"""The compile cache's per-entry lock: processes sharing a cache compile a step once.

A lock is an exclusive ``flock`` on ``locks/<name>.lock`` (the kernel drops it when the last
descriptor of its holder closes, also when the holder dies). Its holder writes who it is into
the file -- ``{"pid", "host", "since" (UTC), "what"}`` -- and empties it on release.

A waiter never blocks in the kernel: it polls until

* it holds the lock;
* ``timeout_s`` passed (default :data:`DEFAULT_TIMEOUT_S`, ``$POOT_CACHE_LOCK_TIMEOUT``
  seconds, or the ``lock_timeout_s`` option of the cache): :class:`CacheLockTimeout` names the
  holder, the lock file and what to do;
* the recorded holder is a process of this host that no longer runs (or is a zombie) while the
  ``flock`` is still held -- a child it forked kept the descriptor -- for
  :data:`DEAD_GRACE_S` (a new holder writes its record at once): the lock file is unlinked
  (under ``<name>.lock.break``, so two waiters never both break it) and a fresh one is taken,
  with one warning. A holder on another host cannot be checked: it is waited for.

A holder checks, once it has the ``flock``, that the path still names the file it locked
(a lock broken meanwhile is taken again from the new file).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from poot.errors import PootError
from poot import settings

#: environment variable: seconds a process waits for a compile cache lock held by another
ENV = "POOT_CACHE_LOCK_TIMEOUT"
#: seconds waited by default (a large step compiles in minutes on a slow host)
DEFAULT_TIMEOUT_S = 900.0
#: seconds the record of a holder that is gone must stand before its lock is broken
DEAD_GRACE_S = 0.5
_POLL_S = (0.05, 0.5)       # first and longest pause between attempts


class CacheLockTimeout(PootError):
    """Another process held a compile cache lock for longer than the wait allowed.

    Attributes: path (the lock file), holder (its record: pid, host, since, what; None when
    unreadable), waited_s."""

    def __init__(self, path: Path, holder: dict | None, waited_s: float):
        self.path, self.holder, self.waited_s = path, holder, waited_s
        if holder:
            who = (f"pid {holder.get('pid')} on {holder.get('host')} since "
                   f"{holder.get('since')} ({holder.get('what')})")
            end = f"kill {holder.get('pid')} on {holder.get('host')}, or the process"
        else:
            who = "a process that left no record"
            end = "the process"
        super().__init__(
            f"compile cache lock {path} is still held after {waited_s:.1f} s by {who}: if it "
            f"is still compiling, wait for it or set {ENV} to more seconds; if it is stuck, "
            f"end it ({end} `fuser {path}` lists there)")


class InvalidLockTimeout(PootError):
    """``$POOT_CACHE_LOCK_TIMEOUT`` (or the option) is not a positive number of seconds."""


def lock_timeout_s(value: float | None = None) -> float:
    """Seconds to wait for a lock: ``value``, else ``$POOT_CACHE_LOCK_TIMEOUT``, else
    :data:`DEFAULT_TIMEOUT_S`. Raises :class:`InvalidLockTimeout` for a value that is not a
    positive finite number."""
    where = "the lock timeout"
    if value is None:
        raw = settings.get_str(ENV)
        if raw is None:
            return DEFAULT_TIMEOUT_S
        where = f"{ENV}={raw!r}"
        try:
            value = float(raw)
        except ValueError:
            raise InvalidLockTimeout(f"{where}: not a number of seconds") from None
    if not (0 < value < float("inf")):
        raise InvalidLockTimeout(f"{where}: must be a positive number of seconds, got {value}")
    return float(value)


def read_holder(fd: int) -> dict | None:
    """The holder record in lock file ``fd``; None when empty or unreadable."""
    try:
        rec = json.loads(os.pread(fd, 4096, 0) or b"null")
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) else None


def holder_gone(holder: dict | None) -> bool:
    """Whether ``holder`` is a process of this host that no longer runs (or is a zombie: it
    holds no descriptors). False when it cannot be told (another host, no record)."""
    if not holder or holder.get("host") != socket.gethostname():
        return False
    pid = holder.get("pid")
    if not isinstance(pid, int) or pid <= 0 or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:                 # EPERM: it runs, as another user
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def _record(what: str) -> bytes:
    return json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                       "since": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                       "what": what}).encode()


def _same_file(fd: int, path: Path) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _break(path: Path, fd: int, holder: dict, warn: Callable[[str, str], None]) -> None:
    """Unlink lock file ``path`` if it is still the file ``fd`` (serialised with other
    breakers by ``<path>.break``), saying so once."""
    try:
        guard = os.open(f"{path}.break", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        return
    try:
        fcntl.flock(guard, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if _same_file(fd, path):
            os.unlink(path)
            warn(f"compile cache lock {path} was held by pid {holder.get('pid')} on "
                 f"{holder.get('host')} since {holder.get('since')} ({holder.get('what')}), "
                 f"which is no longer running; taking it over",
                 f"lock:{path}:{holder.get('pid')}")
    except OSError:                 # another waiter is breaking it: try again later
        pass
    finally:
        os.close(guard)


def _acquire(path: Path, what: str, timeout_s: float, wait: bool, on_wait, warn) -> int | None:
    """A descriptor of ``path`` holding its ``flock`` (the record written), or None when
    ``wait`` is False and another process holds it. Raises :class:`CacheLockTimeout`, and
    OSError when the lock file cannot be opened."""
    start = time.monotonic()
    pause, told, gone_since = _POLL_S[0], False, None
    fd = None
    try:
        while True:
            if fd is None:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pass
            else:
                if not _same_file(fd, path):        # broken and replaced: lock the new file
                    os.close(fd)
                    fd = None
                    continue
                try:
                    os.ftruncate(fd, 0)
                    os.pwrite(fd, _record(what), 0)
                except OSError:
                    pass
                held, fd = fd, None
                return held
            if not wait:
                return None
            if not told and on_wait is not None:
                on_wait()
            told = True
            holder, now = read_holder(fd), time.monotonic()
            if holder_gone(holder):
                seen = (os.fstat(fd).st_ino, json.dumps(holder, sort_keys=True))
                if gone_since is None or gone_since[0] != seen:
                    gone_since = (seen, now)
                elif now - gone_since[1] >= DEAD_GRACE_S:
                    _break(path, fd, holder, warn)
                    os.close(fd)
                    fd, gone_since = None, None
                    continue
            else:
                gone_since = None
            if now - start >= timeout_s:
                raise CacheLockTimeout(path, holder, now - start)
            time.sleep(min(pause, max(0.0, start + timeout_s - now) + 0.001))
            pause = min(pause * 1.5, _POLL_S[1])
    finally:
        if fd is not None:
            os.close(fd)


@contextmanager
def hold(path: Path, what: str, timeout_s: float = DEFAULT_TIMEOUT_S, wait: bool = True,
         on_wait: Callable[[], None] | None = None,
         warn: Callable[[str, str], None] = lambda message, once: None):
    """Hold lock file ``path`` within the block (see the module doc); the block gets True
    when it holds the lock, or when the file cannot be opened (no lock then), and False at
    once when ``wait`` is False and another process holds it. ``what``: what the holder does
    (recorded for waiters); ``on_wait()``: called once when the lock is busy; ``warn(message,
    once_key)``: says a lock was broken. Raises :class:`CacheLockTimeout` after ``timeout_s``
    seconds of waiting."""
    try:
        fd = _acquire(Path(path), what, timeout_s, wait, on_wait, warn)
        held = fd is not None
    except OSError:
        fd, held = None, True
    try:
        yield held
    finally:
        if fd is not None:
            try:
                os.ftruncate(fd, 0)     # a record left behind would name a finished process
            except OSError:
                pass
            os.close(fd)


__all__ = ["CacheLockTimeout", "DEFAULT_TIMEOUT_S", "ENV", "InvalidLockTimeout", "hold",
           "holder_gone", "lock_timeout_s", "read_holder"]
