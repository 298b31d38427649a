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

from array import array
from dataclasses import dataclass
from functools import lru_cache
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

    Each stop string is matched by Knuth-Morris-Pratt: its failure function (one int per
    character) and a state, the length of the longest suffix of the text so far that is a
    prefix of it. Memory is O(total stop length) and each character fed costs O(number of
    stops), amortized; the text held back is the longest of those suffixes.
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
        self._fail = tuple(_failure(s) for s in self.stops)
        self._state = [0] * len(self.stops)

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
        base = len(self._held)
        for j, ch in enumerate(delta):
            s = self._advance(ch)
            if s is not None:
                self._held = ""
                self.stopped, self.stop = True, s
                return self._release(buf[:base + j + 1 - len(s)], stopped=True, stop=s)
        keep = max(self._state, default=0)
        self._held = buf[len(buf) - keep:] if keep else ""
        return self._release(buf[:len(buf) - keep])

    def _advance(self, ch: str) -> str | None:
        """Step every stop's state over ``ch``; the longest stop completed by it, or None."""
        done = None
        for i, (s, fail) in enumerate(zip(self.stops, self._fail)):
            k = self._state[i]
            while k and s[k] != ch:
                k = fail[k - 1]
            if s[k] == ch:
                k += 1
                if k == len(s):
                    if done is None or k > len(done):
                        done = s
                    k = fail[k - 1]
            self._state[i] = k
        return done

    def flush(self) -> str:
        """Generation ended without a stop string: release the held-back text."""
        if self.stopped:
            return ""
        rest, self._held = self._held, ""
        self._state = [0] * len(self.stops)     # the released text can begin no stop now
        return self._release(rest).text

    def _release(self, text: str, stopped: bool = False, stop: str | None = None
                 ) -> StopUpdate:
        if text:
            self._out.append(text)
        return StopUpdate(text, stopped, stop)


@lru_cache(maxsize=64)
def _failure(s: str) -> array:
    """KMP's failure function of ``s``: ``f[i]`` is the length of the longest proper prefix
    of ``s[:i + 1]`` that is also its suffix (``len(s)`` ints, O(len(s)) time). Cached: the
    ``n`` choices of a request (and requests repeating their stops) share it; never
    mutated."""
    f = array("l", [0]) * len(s)
    k = 0
    for i in range(1, len(s)):
        while k and s[i] != s[k]:
            k = f[k - 1]
        if s[i] == s[k]:
            k += 1
        f[i] = k
    return f


def apply_stops(text: str, stops: Iterable[str]) -> tuple[str, str | None]:
    """Non-streaming form: ``(text up to the first completed stop string, that stop)``."""
    m = StopMatcher(stops)
    u = m.feed(text)
    return (m.text, u.stop) if u.stopped else (m.text + m.flush(), None)
