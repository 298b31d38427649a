"""N-gram prompt lookup (vLLM's ``ngram`` proposer, llama.cpp's lookup decoding).

The last n tokens of a sequence (prompt and output), n from ``prompt_lookup_max`` down to
``prompt_lookup_min``, are looked up among its earlier tokens; the tokens that followed the
most recent earlier occurrence of the longest n-gram that matches are proposed, up to k.
Outputs that copy from their input (editing code, reformatting a list, quoting a document)
are proposed whole runs at a time; free text rarely matches.

:class:`NgramIndex` keeps, per n, the latest start of every n-gram that has a successor, and
is brought up to date incrementally as the sequence grows (O(max n) per new token), so a
proposal costs a few dictionary look-ups whatever the sequence's length.
"""

from __future__ import annotations

from typing import Sequence


class NgramIndex:
    """The n-grams of one growing token sequence (module doc).

    Args:
        min_n, max_n: the n-gram lengths matched (1 <= min_n <= max_n).
    """

    def __init__(self, min_n: int, max_n: int):
        self.min_n, self.max_n = min_n, max_n
        self._last: dict[int, dict[tuple, int]] = {n: {} for n in range(min_n, max_n + 1)}
        self._seen = 0                      # tokens indexed (as successors)

    def _update(self, tokens: Sequence[int]) -> None:
        """Index every n-gram that gained a successor since the last call (a sequence only
        grows: rejected proposals are never appended to it)."""
        for end in range(max(self._seen, 1), len(tokens)):     # tokens[end] is a successor
            for n, last in self._last.items():
                if end >= n:
                    last[tuple(tokens[end - n:end])] = end - n
        self._seen = max(self._seen, len(tokens))

    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        """Up to ``k`` tokens following the latest earlier occurrence of the longest suffix
        n-gram of ``tokens`` that occurred before ([] when none does)."""
        if k <= 0 or len(tokens) < 2:
            return []
        self._update(tokens)
        for n in range(min(self.max_n, len(tokens) - 1), self.min_n - 1, -1):
            start = self._last[n].get(tuple(tokens[len(tokens) - n:]))
            if start is not None:
                return list(tokens[start + n:start + n + k])
        return []


__all__ = ["NgramIndex"]
