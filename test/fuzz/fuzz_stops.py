"""Fuzz the stop-string matcher through its public API (``StopMatcher.feed`` / ``flush`` /
``text`` / ``held``, ``apply_stops``) against a reference matcher written the obvious way.

The input picks 1-4 stop strings and a text over a small alphabet (so stops do occur, overlap
and repeat) and cuts the text into deltas. Properties: the matcher's output, whether it
stopped and which stop won equal the reference's for the whole text, whatever the cuts; no
text past the stop is ever released; at most ``max(len(stop)) - 1`` characters are held.
Contract: ``StopMatcher`` raises ValueError only for an empty stop string.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import atheris  # noqa: E402

from _harness import PropertyFailed, instrumented, main  # noqa: E402

with instrumented(__name__ == "__main__"):
    from poot.engine.stops import StopMatcher, apply_stops

ALLOWED = (ValueError,)
ALPHABET = "ab\n\u00e9\U0001f600"


def reference(text: str, stops: list[str]) -> tuple[str, str | None]:
    """``(output, stop)``: the stop that completes first (ties: the one starting first) and
    the text before it; the whole text and None when no stop occurs."""
    for end in range(1, len(text) + 1):
        done = [s for s in stops if text[:end].endswith(s)]
        if done:
            s = max(done, key=len)
            return text[:end - len(s)], s
    return text, None


def _string(fdp, max_len: int, min_len: int = 0) -> str:
    n = fdp.ConsumeIntInRange(min_len, max_len)
    return "".join(ALPHABET[fdp.ConsumeIntInRange(0, len(ALPHABET) - 1)] for _ in range(n))


def _case(data: bytes) -> tuple[list[str], str, list[int]]:
    """``(stops, text, cuts)`` read from the input."""
    fdp = atheris.FuzzedDataProvider(data)
    stops = [_string(fdp, 6, min_len=0 if fdp.ConsumeProbability() < 0.02 else 1)
             for _ in range(fdp.ConsumeIntInRange(1, 4))]
    text = _string(fdp, 64)
    cuts = sorted({fdp.ConsumeIntInRange(0, len(text))
                   for _ in range(fdp.ConsumeIntInRange(0, 16))})
    return stops, text, cuts


def one_input(data: bytes) -> None:
    stops, text, cuts = _case(data)
    m = StopMatcher(stops)                      # ValueError for an empty stop: allowed
    want, want_stop = reference(text, stops)
    longest = max(len(s) for s in stops)
    released, stopped, stop = "", False, None
    for a, b in zip([0] + cuts, cuts + [len(text)]):
        u = m.feed(text[a:b])
        released += u.text
        if not want.startswith(released):
            raise PropertyFailed(f"released {released!r}, not a prefix of {want!r} "
                                 f"(stops {stops!r}, text {text!r}, cuts {cuts})")
        if len(m.held) > longest - 1:
            raise PropertyFailed(f"holds {m.held!r}, longer than {longest - 1}")
        if u.stopped:
            stopped, stop = True, u.stop
            break
    if not stopped:
        released += m.flush()
    got = (released, stop if stopped else None)
    if got != (want, want_stop) or m.text != want:
        raise PropertyFailed(f"stops {stops!r} text {text!r} cuts {cuts}: matcher {got!r} "
                             f"(text {m.text!r}), reference {(want, want_stop)!r}")
    if apply_stops(text, stops) != (want, want_stop):
        raise PropertyFailed(f"apply_stops({text!r}, {stops!r}) = "
                             f"{apply_stops(text, stops)!r}, reference {(want, want_stop)!r}")


if __name__ == "__main__":
    main(one_input, ALLOWED)
