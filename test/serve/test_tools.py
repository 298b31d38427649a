"""Tool calling in chat completions on the tiny fixture (random weights, byte-level
vocabulary; its template has no tool support): bad tool input is a 400 naming the field,
decided before anything is queued; a required or named call is constrained to the format's
markup around arguments valid against the tool's schema (checked with ``jsonschema``),
streamed deltas reassemble to the non-streamed call, and finish_reason is ``tool_calls``.
The tiny context (128 tokens) is too short for the generic format's system message, so the
server here parses the ``hermes`` format (``--tool-call-parser hermes``)."""

from __future__ import annotations

import json

import httpx
import pytest

jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("llguidance")

from sse import parse_sse  # noqa: E402

CHAT = "/v1/chat/completions"
MSGS = [{"role": "user", "content": "hi"}]
PICK = {"type": "function", "function": {"name": "pick", "parameters": {
    "type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9},
                                     "c": {"enum": ["r", "g"]}},
    "required": ["n", "c"], "additionalProperties": False}}}
FLAG = {"type": "function", "function": {"name": "flag", "parameters": {
    "type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"],
    "additionalProperties": False}}}


def _tool(name="f", parameters=None, **fn):
    f = {"name": name, **fn}
    if parameters is not None:
        f["parameters"] = parameters
    return {"type": "function", "function": f}


def _call_msgs(call_id="call_1", tool_id="call_1", arguments='{"n": 1}'):
    return [*MSGS, {"role": "assistant", "content": None, "tool_calls": [
        {"id": call_id, "type": "function",
         "function": {"name": "pick", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": tool_id, "content": "3"}]


@pytest.fixture(scope="module")
def tool_server(tiny):
    from poot.serve import ServeConfig
    from server_util import running

    with running(tiny, ServeConfig(served_model_name="tiny", tool_call_parser="hermes")) \
            as srv:
        yield srv


def _post(srv, body) -> httpx.Response:
    return httpx.post(srv.url + CHAT, content=json.dumps(body), timeout=120,
                      headers={"content-type": "application/json"})


BAD = [
    ({"tools": [_tool(parameters="not a schema")]}, "tools[0].function.parameters"),
    ({"tools": [_tool(parameters={"type": "string"})]}, "tools[0].function.parameters"),
    ({"tools": [_tool(parameters={"type": "object", "properties": {"a": {"type": "strin"}}})]},
     "tools[0].function.parameters"),
    # a schema llguidance cannot honor: a look-ahead in a pattern, an unknown format
    ({"tools": [_tool(parameters={"type": "object", "properties": {
        "a": {"type": "string", "pattern": "(?=x)y"}}})]}, "tools[0].function.parameters"),
    ({"tools": [_tool(parameters={"type": "object", "properties": {
        "a": {"type": "string", "format": "no-such-format"}}})]},
     "tools[0].function.parameters"),
    ({"tools": [_tool("a"), _tool("b"), _tool("a")]}, "tools[2].function.name"),
    ({"tools": [_tool("has space")]}, "tools[0].function.name"),
    ({"tools": [{"type": "function"}]}, "tools[0].function"),
    ({"tools": [{"type": "retrieval", "function": {"name": "f"}}]}, "tools[0].type"),
    ({"tools": [PICK], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice"),
    ({"tools": [PICK], "tool_choice": "sometimes"}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [PICK], "messages": _call_msgs(tool_id="call_2")}, "messages[2].tool_call_id"),
    ({"tools": [PICK], "messages": [*MSGS, {"role": "tool", "tool_call_id": "x",
                                             "content": "3"}]}, "messages[1].tool_call_id"),
    ({"tools": [PICK], "messages": _call_msgs()[:2] + [{"role": "tool", "content": "3"}]},
     "messages[2].tool_call_id"),
    ({"tools": [PICK], "messages": [*MSGS, {"role": "assistant", "tool_calls": [
        {"id": "c", "function": {"name": "pick", "arguments": {"n": 1}}}]}]},
     "messages[1].tool_calls[0]"),
    ({"tools": [PICK], "tool_choice": "required",
      "response_format": {"type": "json_object"}}, "response_format"),
]


@pytest.mark.parametrize("fields,param", BAD, ids=[p for _, p in BAD])
def test_bad_tool_input_is_a_400_naming_the_field(tool_server, tiny, fields, param):
    added = []
    orig = tiny.engine.add_request
    tiny.engine.add_request = lambda *a, **k: added.append(a) or orig(*a, **k)
    try:
        r = _post(tool_server, {"model": "tiny", "messages": MSGS, "max_tokens": 4, **fields})
    finally:
        del tiny.engine.add_request
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error", err
    assert "Traceback" not in err["message"]
    assert added == []                       # decided before anything was queued


def _stream_calls(events):
    calls: dict[int, dict] = {}
    content, finish = "", None
    for e in events:
        ch = e["choices"][0] if e.get("choices") else None
        if ch is None:
            continue
        d = ch["delta"]
        content += d.get("content") or ""
        for t in d.get("tool_calls") or []:
            c = calls.setdefault(t["index"], {"id": None, "name": "", "arguments": ""})
            if "id" in t:
                assert c["id"] is None and t["type"] == "function"
                c["id"] = t["id"]
                c["name"] = t["function"]["name"]
            c["arguments"] += t["function"].get("arguments", "")
        finish = ch["finish_reason"] or finish
    return content, [calls[k] for k in sorted(calls)], finish


@pytest.mark.parametrize("choice", ["required", {"type": "function",
                                                 "function": {"name": "flag"}}])
def test_constrained_call_valid_and_streams_to_the_same_call(tool_server, choice):
    body = {"model": "tiny", "messages": MSGS, "tools": [PICK, FLAG], "tool_choice": choice,
            "parallel_tool_calls": False, "temperature": 0, "max_tokens": 110}
    r = _post(tool_server, body)
    assert r.status_code == 200, r.text
    ch = r.json()["choices"][0]
    assert ch["finish_reason"] == "tool_calls", ch
    msg = ch["message"]
    assert msg["content"] is None and len(msg["tool_calls"]) == 1
    call = msg["tool_calls"][0]
    assert call["type"] == "function" and call["id"].startswith("call_")
    tool = {"pick": PICK, "flag": FLAG}[call["function"]["name"]]
    if isinstance(choice, dict):
        assert call["function"]["name"] == "flag"
    jsonschema.validate(json.loads(call["function"]["arguments"]),
                        tool["function"]["parameters"])
    s = httpx.post(tool_server.url + CHAT, json={**body, "stream": True}, timeout=120)
    content, calls, finish = _stream_calls(parse_sse(s.text))
    assert content == "" and finish == "tool_calls"
    assert [(c["name"], c["arguments"]) for c in calls] == \
        [(call["function"]["name"], call["function"]["arguments"])]


def test_auto_with_a_tagged_format_is_free_text(tool_server):
    """``auto`` leaves a tagged format's text free until a call's markup starts: the random
    model writes no call, and its text comes back as content, the same streamed or not."""
    body = {"model": "tiny", "messages": MSGS, "tools": [PICK], "temperature": 0,
            "max_tokens": 24}
    msg = _post(tool_server, body).json()["choices"][0]["message"]
    assert "tool_calls" not in msg and msg["content"]
    s = httpx.post(tool_server.url + CHAT, json={**body, "stream": True}, timeout=120)
    assert _stream_calls(parse_sse(s.text))[0] == msg["content"]


def test_tool_results_reach_the_template(tool_server):
    """An assistant call and its tool result are accepted and rendered (the tokenize route
    is not needed: the prompt grows by the rendered turns)."""
    base = {"model": "tiny", "tools": [PICK], "temperature": 0, "max_tokens": 2}
    short = _post(tool_server, {**base, "messages": MSGS}).json()
    longer = _post(tool_server, {**base, "messages": _call_msgs()}).json()
    assert longer["usage"]["prompt_tokens"] > short["usage"]["prompt_tokens"]


def test_a_call_cut_by_max_tokens_is_content_not_an_error(tool_server):
    """A call that ``max_tokens`` cuts does not parse: its text is the content (finish
    ``length``), streamed or not, never a 500."""
    body = {"model": "tiny", "messages": MSGS, "tools": [PICK], "tool_choice": "required",
            "temperature": 0, "max_tokens": 20}
    r = _post(tool_server, body)
    assert r.status_code == 200, r.text
    ch = r.json()["choices"][0]
    assert ch["finish_reason"] == "length" and "tool_calls" not in ch["message"]
    assert ch["message"]["content"].startswith("<tool_call>")
    s = httpx.post(tool_server.url + CHAT, json={**body, "stream": True}, timeout=120)
    assert s.status_code == 200 and s.text.endswith("data: [DONE]\n\n")
    assert _stream_calls(parse_sse(s.text))[2] == "length"
