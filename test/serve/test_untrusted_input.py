"""Request fields a client controls that could hurt the server or its other clients: stop
strings past the length cap (a fast 400, nothing built), lone surrogates in chat messages
(400 naming the field), sampling parameters that are out of range once they are f32 on the
device (400 naming the field), and streamed text holding characters that line-splitting SSE
clients take for line breaks (escaped, so each event stays one line)."""

from __future__ import annotations

import json

import httpx
import pytest

from poot.sampling_params import MAX_STOP_CHARS
from test_errors import CHAT, COMP, chat, check_error, comp


def _post(srv, route, body):
    """POST ``body`` as JSON with non-ASCII escaped (a lone surrogate as ``\\udXXX``, as
    JavaScript's JSON.stringify sends it)."""
    return httpx.post(srv.url + route, content=json.dumps(body), timeout=120,
                      headers={"content-type": "application/json"})


@pytest.mark.parametrize("route,body", [
    (CHAT, chat(stop="x" * 300_000)),
    (COMP, comp(stop=["a", "y" * 300_000])),
    (CHAT, chat(stop=["z" * (MAX_STOP_CHARS // 2)] * 2 + ["w"], n=4)),
])
def test_stop_past_the_cap_is_400_naming_stop_and_the_limit(server, route, body):
    err = check_error(_post(server, route, body), 400, "stop")
    assert str(MAX_STOP_CHARS) in err["message"], err
    assert len(err["message"]) < 300, err           # the value is not echoed back
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200


def test_stop_at_the_cap_is_served(server):
    stops = ["q" * (MAX_STOP_CHARS - 1), "\u2028"]
    r = _post(server, COMP, comp(stop=stops, max_tokens=4, temperature=0, n=2))
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"]) == 2


@pytest.mark.parametrize("messages,param", [
    ([{"role": "user", "content": "a\ud800b"}], "messages[0].content"),
    ([{"role": "system", "content": "ok"}, {"role": "user", "content": "\udfff"}],
     "messages[1].content"),
    ([{"role": "user", "content": [{"type": "text", "text": "ok"},
                                   {"type": "text", "text": "x\udc80"}]}],
     "messages[0].content[1].text"),
    ([{"role": "user", "content": "hi", "name": "\ud83d"}], "messages[0].name"),
])
def test_lone_surrogate_in_a_message_is_400_naming_it(server, messages, param):
    err = check_error(_post(server, CHAT, chat(messages=messages, max_tokens=2)), 400, param)
    assert "surrogate" in err["message"], err


def test_lone_surrogate_in_a_prompt_is_400(server):
    check_error(_post(server, COMP, comp(prompt="a\ud800", max_tokens=2)), 400, "prompt")


def test_lone_surrogate_in_tokenize_messages_is_400(server):
    body = {"messages": [{"role": "user", "content": "ok"}, {"role": "user", "content": "\ud800"}]}
    check_error(_post(server, "/tokenize", body), 400, "messages[1].content")


@pytest.mark.parametrize("field,value", [
    ("repetition_penalty", 1e-40),        # 0 (or subnormal, flushed to 0) as f32
    ("repetition_penalty", 1e-45),
    ("repetition_penalty", 1.2e-38),      # a normal f32, but a seen logit / it is inf
    ("top_p", 1e-40),
])
@pytest.mark.parametrize("route,make", [(CHAT, chat), (COMP, comp)])
def test_value_out_of_range_as_f32_is_400_naming_it(server, route, make, field, value):
    err = check_error(_post(server, route, make(**{field: value}, max_tokens=2)), 400, field)
    assert "32-bit" in err["message"], err


# The characters a line-splitting client (Python's str.splitlines, JavaScript's line
# terminators) takes for a line break that JSON leaves unescaped
LINE_BREAKS = "\u2028\u2029\x85"


@pytest.mark.parametrize("route", [CHAT, COMP])
def test_streamed_line_separators_stay_in_one_event(server, route):
    choice = f"a{LINE_BREAKS}b"
    make = chat if route == CHAT else comp
    body = make(stream=True, max_tokens=16, temperature=0, guided_choice=[choice])
    with httpx.stream("POST", server.url + route, json=body, timeout=120) as r:
        assert r.status_code == 200
        raw = r.read().decode("utf-8")
    lines = raw.splitlines()
    assert lines[-2:] == ["data: [DONE]", ""]
    text = ""
    for line in lines:
        if not line or line == "data: [DONE]":
            continue
        assert line.startswith("data: "), line[:80]
        chunk = json.loads(line[len("data: "):])     # each line is a whole event
        for ch in chunk["choices"]:
            text += (ch.get("delta") or {}).get("content") or ch.get("text") or ""
    assert text == choice
    assert not set(LINE_BREAKS) & set(raw)
