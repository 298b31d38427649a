"""Partial JSON scanning: where the members of a JSON object (or the elements of an array)
start and end in text that may stop anywhere, as a model's output does while it streams.

Only structure is found here (string and bracket aware); values are decoded with ``json``
once complete. Every function returns ``None`` for "incomplete: more text may complete it"
and raises :class:`Malformed` for text no continuation can make valid at that point.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

_WS = " \t\r\n"
_SCALAR = re.compile(r"[^,}\]\s]*")
_STRING_REST = re.compile(r'(?:[^"\\]|\\.)*"', re.S)
_HIGH_SURROGATE_TAIL = re.compile(r"\\u[dD][89abAB][0-9a-fA-F]{2}$")


class Malformed(ValueError):
    """Text that is not the JSON expected here, whatever follows."""


def loads(text: str):
    """``json.loads``, raising :class:`Malformed`."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise Malformed(e.msg) from None


def skip_ws(s: str, i: int) -> int:
    """The index of the first non-whitespace character of ``s`` at or after ``i``."""
    while i < len(s) and s[i] in _WS:
        i += 1
    return i


def string_end(s: str, i: int) -> int | None:
    """End (exclusive) of the JSON string starting at ``s[i] == '"'``; None if incomplete."""
    m = _STRING_REST.match(s, i + 1)
    return m.end() if m else None


def value_end(s: str, i: int) -> int | None:
    """End (exclusive) of the JSON value starting at ``s[i]`` (an object, array, string or
    scalar); None while incomplete (a scalar at the end of the text may still grow)."""
    c = s[i]
    if c == '"':
        return string_end(s, i)
    if c in "{[":
        depth, j = 0, i
        while j < len(s):
            c = s[j]
            if c == '"':
                e = string_end(s, j)
                if e is None:
                    return None
                j = e
                continue
            if c in "{[":
                depth += 1
            elif c in "}]":
                depth -= 1
                if depth == 0:
                    return j + 1
            j += 1
        return None
    if c in ",:}]":
        raise Malformed(f"unexpected {c!r}")
    e = _SCALAR.match(s, i).end()
    return e if e < len(s) else None


@dataclass
class Member:
    """One member of a scanned object: its key, and where its value starts and ends in the
    text (``end`` None: the value is not complete yet)."""

    key: str
    start: int
    end: int | None


def object_members(s: str, i: int) -> tuple[list[Member], int | None]:
    """The members of the object starting at ``s[i] == '{'`` found so far, and the end of the
    object (None while it is open). Raises :class:`Malformed`."""
    if s[i] != "{":
        raise Malformed("not an object")
    out: list[Member] = []
    j = skip_ws(s, i + 1)
    while j < len(s):
        if s[j] == "}" and not out:
            return out, j + 1
        if s[j] != '"':
            raise Malformed("expected a key")
        e = string_end(s, j)
        if e is None:
            return out, None
        key = loads(s[j:e])
        j = skip_ws(s, e)
        if j >= len(s):
            return out, None
        if s[j] != ":":
            raise Malformed("expected ':'")
        v = skip_ws(s, j + 1)
        if v >= len(s):
            return out, None
        ve = value_end(s, v)
        out.append(Member(key, v, ve))
        if ve is None:
            return out, None
        j = skip_ws(s, ve)
        if j >= len(s):
            return out, None
        if s[j] == "}":
            return out, j + 1
        if s[j] != ",":
            raise Malformed("expected ',' or '}'")
        j = skip_ws(s, j + 1)
    return out, None


def array_elements(s: str, i: int) -> tuple[list[tuple[int, int | None]], int | None]:
    """``(start, end)`` of each element of the array starting at ``s[i] == '['`` found so
    far (``end`` None: incomplete), and the array's end (None while open)."""
    if s[i] != "[":
        raise Malformed("not an array")
    out: list[tuple[int, int | None]] = []
    j = skip_ws(s, i + 1)
    while j < len(s):
        if s[j] == "]" and not out:
            return out, j + 1
        e = value_end(s, j)
        out.append((j, e))
        if e is None:
            return out, None
        j = skip_ws(s, e)
        if j >= len(s):
            return out, None
        if s[j] == "]":
            return out, j + 1
        if s[j] != ",":
            raise Malformed("expected ',' or ']'")
        j = skip_ws(s, j + 1)
    return out, None


def string_prefix(raw: str) -> str:
    """The decoded text of ``raw``, the inside of a JSON string that may stop anywhere
    (mid-escape, or between the two halves of a surrogate pair): what is certain so far."""
    for cut in range(len(raw), max(len(raw) - 13, -1), -1):   # an escape is <= 12 chars
        head = raw[:cut]
        m = _HIGH_SURROGATE_TAIL.search(head)
        if m and (len(head[:m.start()]) - len(head[:m.start()].rstrip("\\"))) % 2 == 0:
            continue                    # half a surrogate pair: wait for the other half
        try:
            return json.loads('"' + head + '"', strict=False)
        except json.JSONDecodeError:
            continue
    return ""


__all__ = ["Malformed", "Member", "array_elements", "loads", "object_members", "skip_ws",
           "string_end", "string_prefix", "value_end"]
