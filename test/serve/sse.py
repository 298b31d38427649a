"""Strict server-sent-event parsing for the tests: every event is ``data: <json>`` or
``data: [DONE]`` followed by a blank line, and ``[DONE]`` comes last."""

from __future__ import annotations

import json


def parse_sse(raw: str) -> list[dict]:
    """The JSON payloads of an SSE body; asserts the framing and the final ``[DONE]``."""
    assert raw.endswith("\n\n"), raw[-80:]
    events = raw[:-2].split("\n\n")
    assert events and events[-1] == "data: [DONE]", events[-3:]
    out = []
    for ev in events[:-1]:
        assert ev.startswith("data: ") and "\n" not in ev, ev[:120]
        payload = json.loads(ev[len("data: "):])
        assert isinstance(payload, dict)
        out.append(payload)
    return out
