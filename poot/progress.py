"""Progress of long work (loading a model, compiling its steps), reported through one callback.

    progress(stage: str, done: int, total: int) -> None

``stage`` names what starts now:

* ``total == 0``: a phase of its own (``"loading model.gguf"``, ``"compiling decode"``,
  ``"uploading weights"``); the previous phase has ended.
* ``total > 0``: one unit of the current phase's work starts (``"pass poot-cse"``,
  ``"LLVM JIT"``, ``"spirv-val"`` once per kernel); ``done`` units of ``total`` have finished.
  ``total`` may grow while the phase learns its size (the kernel count is known after
  fusion). Consecutive units with the same name are one stage of several units.

The compiler reports through a :class:`Tracker` (a callable taking the stage name, with
:meth:`Tracker.add` to announce more units); a caller passes a plain callback.
:func:`as_callback` accepts the older one-argument form ``progress(message)``, which then
sees the phases only.
"""

from __future__ import annotations

import inspect
from typing import Callable, Optional

#: ``(stage, done, total)``; see the module docstring.
Callback = Callable[[str, int, int], None]


def _nothing(stage: str, done: int = 0, total: int = 0) -> None:
    pass


def as_callback(progress) -> Callback:
    """``progress`` as a three-argument callback: None -> a no-op; a callable that takes a
    single argument -> called with phase names only (``total == 0`` events)."""
    if progress is None:
        return _nothing
    if isinstance(progress, Tracker):
        return progress.callback
    try:
        params = inspect.signature(progress).parameters.values()
    except (TypeError, ValueError):       # a builtin without a signature: assume the full form
        return progress
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if any(p.kind == p.VAR_POSITIONAL for p in params) or len(positional) >= 3:
        return progress
    return lambda stage, done=0, total=0: progress(stage) if total == 0 else None


class Tracker:
    """Counts the units of one phase (one step's compile) for a progress callback.

    ``tracker(stage)`` says a unit named ``stage`` starts (the previous unit, if any, is
    finished); ``tracker.add(n)`` announces ``n`` more units. A tracker without a callback
    does nothing, so code can report unconditionally.

    Attributes: callback (``(stage, done, total)``), done, total (units), stage (the unit
    running now, or None).
    """

    def __init__(self, progress=None, total: int = 0):
        self.callback = as_callback(progress)
        self.done = 0
        self.total = total
        self.stage: Optional[str] = None

    @classmethod
    def of(cls, progress) -> "Tracker":
        """``progress`` itself when it is a Tracker (the caller's count goes on), else a new
        tracker over it."""
        return progress if isinstance(progress, Tracker) else cls(progress)

    def add(self, n: int) -> None:
        """``n`` more units of work will follow (n >= 0)."""
        self.total += max(0, int(n))

    def __call__(self, stage: str) -> None:
        if self.stage is not None:
            self.done += 1
        self.stage = stage
        self.total = max(self.total, self.done + 1)
        self.callback(stage, self.done, self.total)


__all__ = ["Callback", "Tracker", "as_callback"]
