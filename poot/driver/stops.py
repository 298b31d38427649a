"""Stop strings over streamed text.

Generation emits text in deltas (from the incremental detokenizer). :class:`StopMatcher` takes
each delta and returns the part that is safe to show now: text that can no longer become part
of a stop string. A suffix that could still be the start of a stop string is held back until
the next delta decides it. When a stop string completes, the text before it is released, the
stop string itself is dropped (OpenAI semantics: the stop sequence is not part of the output)
and the matcher reports the stop; anything after it is discarded.

Which stop wins: the one that *completes* first in the text (ties: the one that starts first,
that is the longest). That is what a token-by-token check would find, and it makes the result
independent of how the text was cut into deltas.

    m = StopMatcher(["\\n\\nUser:", "</s>"])
    for delta in deltas:
        out = m.feed(delta)
        send(out.text)
        if out.stopped:
            break
    else:
        send(m.flush())        # generation ended another way: release what was held back
    m.text                     # everything released, stop string excluded
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable


@dataclass(frozen=True)
class StopUpdate:
    """The result of one :meth:`StopMatcher.feed`.

    Attributes:
        text: text safe to emit now (possibly empty).
        stopped: a stop string completed; ``text`` is the last text of the output.
        stop: the stop string that matched (``None`` while not stopped).
    """

    text: str
    stopped: bool = False
    stop: str | None = None


class StopMatcher:
    """Incremental stop-string matching; see the module docstring.

    Holds back at most ``max(len(stop)) - 1`` characters. Strings are compared as Python
    ``str`` (code points), exactly as given: no normalization.
    """

    def __init__(self, stops: Iterable[str]):
        self.stops = tuple(dict.fromkeys(stops))
        for s in self.stops:
            if not isinstance(s, str) or not s:
                raise ValueError(f"stop strings must be non-empty str, got {s!r}")
        self._held = ""
        self._out: list[str] = []
        self.stopped = False
        self.stop: str | None = None
        # every proper prefix of every stop string, for the hold-back test
        self._prefixes = {s[:i] for s in self.stops for i in range(1, len(s))}
        self._longest = max((len(s) for s in self.stops), default=0)

    @property
    def text(self) -> str:
        """Everything released so far."""
        return "".join(self._out)

    @property
    def held(self) -> str:
        """Text held back because it may begin a stop string."""
        return self._held

    def feed(self, delta: str) -> StopUpdate:
        """Add ``delta``; return what is safe to emit. After a stop, feeding is an error."""
        if self.stopped:
            raise RuntimeError("StopMatcher.feed after the stop was reported")
        buf = self._held + delta
        best = None  # (end, start, stop)
        for s in self.stops:
            i = buf.find(s)
            if i >= 0 and (best is None or (i + len(s), i) < best[:2]):
                best = (i + len(s), i, s)
        if best is not None:
            _, start, s = best
            self._held = ""
            self.stopped, self.stop = True, s
            return self._release(buf[:start], stopped=True, stop=s)
        keep = 0
        for n in range(min(len(buf), self._longest - 1), 0, -1):
            if buf[-n:] in self._prefixes:
                keep = n
                break
        self._held = buf[len(buf) - keep:] if keep else ""
        return self._release(buf[:len(buf) - keep])

    def flush(self) -> str:
        """Generation ended without a stop string: release the held-back text."""
        if self.stopped:
            return ""
        rest, self._held = self._held, ""
        return self._release(rest).text

    def _release(self, text: str, stopped: bool = False, stop: str | None = None
                 ) -> StopUpdate:
        if text:
            self._out.append(text)
        return StopUpdate(text, stopped, stop)


def apply_stops(text: str, stops: Iterable[str]) -> tuple[str, str | None]:
    """Non-streaming form: ``(text up to the first completed stop string, that stop)``."""
    m = StopMatcher(stops)
    u = m.feed(text)
    return (m.text, u.stop) if u.stopped else (m.text + m.flush(), None)
