"""Stop strings over streamed text (poot.engine.stops)."""

from __future__ import annotations

import random

import pytest

from poot.engine.stops import StopMatcher, apply_stops


def reference(text: str, stops) -> tuple[str, str | None]:
    """The first position where some stop string completes; ties: the longest one."""
    for end in range(1, len(text) + 1):
        done = [s for s in stops if text[:end].endswith(s)]
        if done:
            s = max(done, key=len)
            return text[:end - len(s)], s
    return text, None


def stream(text: str, cuts: list[int], stops):
    m = StopMatcher(stops)
    emitted, pieces, prev = "", [], 0
    for c in cuts + [len(text)]:
        u = m.feed(text[prev:c])
        prev = c
        emitted += u.text
        pieces.append(emitted)
        if u.stopped:
            return emitted, u.stop, pieces, m
    emitted += m.flush()
    return emitted, None, pieces, m


def random_cuts(rng, n):
    k = rng.randint(0, n)
    return sorted(rng.randint(0, n) for _ in range(k))


ALPHABETS = ["ab", "abc\n", "aé😀中\u0301", "xyz"]


def test_random_streams_match_reference_and_never_leak():
    rng = random.Random(42)
    for it in range(3000):
        alpha = ALPHABETS[it % len(ALPHABETS)]
        stops = ["".join(rng.choice(alpha) for _ in range(rng.randint(1, 4)))
                 for _ in range(rng.randint(1, 3))]
        text = "".join(rng.choice(alpha) for _ in range(rng.randint(0, 30)))
        want, stop = reference(text, stops)
        got, gstop, pieces, m = stream(text, random_cuts(rng, len(text)), stops)
        assert (got, gstop) == (want, stop), (text, stops)
        assert m.text == want
        # every intermediate emission is a prefix of the final output: nothing emitted
        # turned out to belong to a stop string
        assert all(want.startswith(p) for p in pieces)
        assert apply_stops(text, stops) == (want, stop)


def test_split_across_many_deltas_and_held_text():
    m = StopMatcher(["</end>"])
    assert m.feed("hello <").text == "hello "
    assert m.held == "<"
    for ch in "/en":
        u = m.feed(ch)
        assert u.text == "" and not u.stopped
    assert m.held == "</en"
    u = m.feed("d> trailing")
    assert u.stopped and u.stop == "</end>" and u.text == ""
    assert m.text == "hello "
    with pytest.raises(RuntimeError):
        m.feed("more")


def test_false_start_is_released():
    m = StopMatcher(["STOP"])
    assert m.feed("ST").text == ""
    assert m.feed("OX").text == "STOX"
    assert m.flush() == ""
    m = StopMatcher(["STOP"])
    assert m.feed("abc STO").text == "abc "
    assert m.flush() == "STO"
    assert m.text == "abc STO"


def test_overlapping_prefixes_and_earliest_completion():
    # "aab" contains a match of "ab" completing before "aabx" could
    assert apply_stops("xaabx", ["aabx", "ab"]) == ("xa", "ab")
    # same completion point: the longer (earlier-starting) stop wins
    assert apply_stops("xabc", ["bc", "abc"]) == ("x", "abc")
    # self-overlapping stop string
    assert apply_stops("aaab", ["aab"]) == ("a", "aab")
    m = StopMatcher(["aab"])
    assert m.feed("a").text == "" and m.feed("a").text == ""
    assert m.feed("a").text == "a"
    u = m.feed("b")
    assert u.stopped and m.text == "a"


def test_unicode():
    assert apply_stops("日本語です。終わり", ["。"]) == ("日本語です", "。")
    m = StopMatcher(["😀👍"])
    assert m.feed("ok 😀").text == "ok "
    assert m.feed("👎").text == "😀👎"
    u = m.feed("😀👍 tail")
    assert u.stopped and m.text == "ok 😀👎"
    # a combining mark is its own code point: no normalization
    assert apply_stops("cafe\u0301", ["é"]) == ("cafe\u0301", None)


def test_no_stops_passes_through():
    m = StopMatcher([])
    assert m.feed("abc").text == "abc" and m.held == "" and m.flush() == ""
    with pytest.raises(ValueError):
        StopMatcher([""])


def test_long_self_overlapping_stops_match_reference():
    """Stops long enough to exercise the matcher's failure links (periodic, overlapping)."""
    rng = random.Random(7)
    for _ in range(1500):
        base = "".join(rng.choice("ab") for _ in range(rng.randint(1, 3)))
        stops = [(base * 6)[:rng.randint(1, 12)] for _ in range(rng.randint(1, 2))]
        stops += ["".join(rng.choice("ab") for _ in range(rng.randint(1, 10)))]
        text = "".join(rng.choice([rng.choice("ab"), base]) for _ in range(rng.randint(0, 30)))
        want, stop = reference(text, stops)
        got, gstop, pieces, m = stream(text, random_cuts(rng, len(text)), stops)
        assert (got, gstop) == (want, stop), (text, stops)
        assert all(want.startswith(p) for p in pieces)
        assert len(m.held) < max(map(len, stops))


def test_feed_after_flush_starts_afresh():
    m = StopMatcher(["STOP"])
    assert m.feed("ST").text == "" and m.flush() == "ST"
    u = m.feed("OP")
    assert not u.stopped and u.text == "OP" and m.text == "STOP"


def test_memory_is_linear_in_the_stop_length():
    """A matcher of a stop string of the largest allowed length, and a stream through it,
    allocate O(length): a structure of all its prefixes would take ~n^2/2 characters
    (8 MB here, ~60x the bound)."""
    import tracemalloc

    from poot.sampling_params import MAX_STOP_CHARS

    rng = random.Random(3)
    n = MAX_STOP_CHARS
    stop = "".join(rng.choice("abc") for _ in range(n))
    text = stop[:-1] + "x" + stop[: n // 2]      # a near miss, then a long partial match
    tracemalloc.start()
    try:
        m = StopMatcher([stop, stop[::-1]])
        for i in range(0, len(text), 7):
            m.feed(text[i:i + 7])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert m.held == stop[: n // 2] and m.text == stop[:-1] + "x"
    assert peak < 32 * n, peak
