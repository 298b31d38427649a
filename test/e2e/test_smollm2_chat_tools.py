"""``LLM.chat(tools=...)`` and ``poot chat --tools`` on the bundled SmolLM2 with its own
tool-call format: its chat template has no tool markup, so the generic JSON answer is chosen
(:mod:`poot.text.tool_calls`), and ``tool_choice="required"`` constrains the reply to a call
whose arguments follow the tool's schema (checked here with ``jsonschema``, independent of
the constraint's own grammar)."""

from __future__ import annotations

import io
import json

import jsonschema
import pytest

from poot.sampling_params import SamplingParams

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather of a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 40},
        "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris, in celsius?"}]
GREEDY = SamplingParams(temperature=0, max_tokens=60)


def _valid(call: dict) -> dict:
    assert call["type"] == "function" and call["id"]
    assert call["function"]["name"] == "get_weather"
    args = json.loads(call["function"]["arguments"])
    jsonschema.validate(args, WEATHER["function"]["parameters"])
    return args


def test_llm_chat_required_returns_a_valid_call(smollm2):
    from poot.api import LLM

    r = LLM(handle=smollm2).chat(ASK, GREEDY, tools=[WEATHER], tool_choice="required")
    assert r.finish_reason in ("stop", "tool_calls"), r.text
    assert r.content is None and len(r.tool_calls) >= 1, r.text
    for call in r.tool_calls:
        _valid(call)
    # the call, answered, goes back through the template: the reply to the result is text
    msgs = ASK + [r.message(), {"role": "tool", "tool_call_id": r.tool_calls[0]["id"],
                                "content": "18 degrees, sunny"}]
    final = LLM(handle=smollm2).chat(msgs, GREEDY, tools=[WEATHER], tool_choice="none")
    assert final.tool_calls == [] and final.content


def test_llm_chat_named_tool_choice_is_that_tool(smollm2):
    from poot.api import LLM

    other = {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"zone": {"type": "string", "maxLength": 20}}}}}
    r = LLM(handle=smollm2).chat(ASK, GREEDY, tools=[other, WEATHER],
                                 tool_choice="get_weather")
    assert [c["function"]["name"] for c in r.tool_calls][:1] == ["get_weather"], r.text


def test_cli_chat_tools_shows_the_call(smollm2, tmp_path, capsys, monkeypatch):
    from poot.cli import main

    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps([WEATHER]))
    monkeypatch.setattr("sys.stdin", io.StringIO("What is the weather in Paris?\n18C\n"))
    rc = main(["chat", "--tools", str(tools), "--max-tokens", "60", "--temperature", "0",
               "--kv-capacity", "256", "--prefill-chunk", "32", "-q"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    lines = out.splitlines()
    # auto: SmolLM2 may answer in text or call; a call is shown as [call ID] name({...})
    calls = [ln for ln in lines if ln.startswith("[call ")]
    for ln in calls:
        name_args = ln.split("] ", 1)[1]
        assert name_args.startswith("get_weather(")
        json.loads(name_args[len("get_weather("):-1])
    assert lines, err
