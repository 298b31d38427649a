"""The Responses API's translation layer, without a server: requests -> chat completion
requests (OpenAI's public chat shapes), and chat completions / chunk streams -> Response
objects and typed events, checked against the official ``openai`` client's own types. Tool
calls and reasoning are fed as synthetic OpenAI-shaped chat results (the chat route's tool
calling is built elsewhere)."""

from __future__ import annotations

import json

import pytest
from pydantic import TypeAdapter

from poot.serve.errors import APIError
from poot.serve.protocol import ChatCompletionRequest
from poot.serve.responses_output import ResponseBuilder, chat_chunks, response_events
from poot.serve.responses_request import ResponsesRequest, to_chat

openai_types = pytest.importorskip("openai.types.responses", reason="needs the openai client")

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}},
           "required": ["city"]}


def req(**kw) -> ResponsesRequest:
    return ResponsesRequest.model_validate({"model": "m", **kw})


def chat_of(**kw) -> dict:
    body, _ = to_chat(req(**kw))
    ChatCompletionRequest.model_validate(body)      # the chat route's own model takes it
    return body


# ---- requests -> chat ----------------------------------------------------------------------

def test_string_input_and_instructions():
    body = chat_of(input="hi", instructions="be brief", max_output_tokens=7, temperature=0,
                   top_p=0.5)
    assert body == {"model": "m", "messages": [{"role": "system", "content": "be brief"},
                                               {"role": "user", "content": "hi"}],
                    "max_completion_tokens": 7, "temperature": 0, "top_p": 0.5}


def test_items_with_calls_and_outputs():
    items = [
        {"role": "developer", "content": "use tools"},
        {"type": "message", "role": "user",
         "content": [{"type": "input_text", "text": "weather in "},
                     {"type": "input_text", "text": "Paris?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "Let me look.", "annotations": []}]},
        {"type": "function_call", "call_id": "c1", "name": "weather",
         "arguments": "{\"city\":\"Paris\"}"},
        {"type": "function_call", "call_id": "c2", "name": "weather",
         "arguments": "{\"city\":\"Lyon\"}"},
        {"type": "function_call_output", "call_id": "c1", "output": "18C"},
        {"type": "function_call_output", "call_id": "c2",
         "output": [{"type": "input_text", "text": "20C"}]},
    ]
    body = chat_of(input=items)
    assert body["messages"] == [
        {"role": "developer", "content": "use tools"},
        {"role": "user", "content": "weather in Paris?"},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "weather", "arguments": "{\"city\":\"Paris\"}"}},
            {"id": "c2", "type": "function",
             "function": {"name": "weather", "arguments": "{\"city\":\"Lyon\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "18C"},
        {"role": "tool", "tool_call_id": "c2", "content": "20C"}]


def test_tools_tool_choice_and_format():
    body = chat_of(input="hi", tools=[{"type": "function", "name": "weather",
                                       "description": "d", "parameters": WEATHER,
                                       "strict": True}],
                   tool_choice={"type": "function", "name": "weather"},
                   parallel_tool_calls=False,
                   text={"format": {"type": "json_schema", "name": "w", "schema": WEATHER}})
    assert body["tools"] == [{"type": "function", "function": {
        "name": "weather", "description": "d", "parameters": WEATHER, "strict": True}}]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "weather"}}
    assert body["parallel_tool_calls"] is False
    assert body["response_format"] == {"type": "json_schema",
                                       "json_schema": {"name": "w", "schema": WEATHER}}
    assert chat_of(input="x", tool_choice="required")["tool_choice"] == "required"
    assert chat_of(input="x", text={"format": {"type": "json_object"}})[
        "response_format"] == {"type": "json_object"}
    assert "response_format" not in chat_of(input="x", text={"format": {"type": "text"}})


def test_stream_asks_for_usage():
    body = chat_of(input="hi", stream=True)
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


def test_store_absent_or_false_is_accepted():
    chat_of(input="hi")
    chat_of(input="hi", store=False, background=False)


#: requests the server refuses before anything runs: (fields, the field the 400 names)
REFUSED = [
    ({"store": True}, "store"),
    ({"previous_response_id": "resp_1"}, "previous_response_id"),
    ({"background": True}, "background"),
    ({"conversation": "conv_1"}, "conversation"),
    ({"prompt": {"id": "pmpt_1"}}, "prompt"),
    ({"truncation": "auto"}, "truncation"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"tools": [{"type": "function", "name": "f"}, {"type": "file_search"}]},
     "tools[1].type"),
    ({"tools": [{"type": "function"}]}, "tools[0].name"),
    ({"tools": [{"type": "function", "name": "f", "function": {}}]}, "tools[0].function"),
    ({"tool_choice": {"type": "web_search_preview"}}, "tool_choice"),
    ({"tool_choice": "sometimes"}, "tool_choice"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]"),
    ({"input": [{"role": "user", "content": "x"},
                {"type": "function_call_output", "call_id": "nope", "output": "1"}]},
     "input[1].call_id"),
    ({"input": [{"type": "reasoning", "summary": []}]}, "input"),
]


@pytest.mark.parametrize("fields,param", REFUSED, ids=[p for _, p in REFUSED])
def test_refused_with_field(fields, param):
    with pytest.raises(APIError) as e:
        to_chat(req(**{"input": "hi", **fields}))
    assert e.value.status == 400 and e.value.param == param
    assert e.value.message


def test_chat_errors_name_responses_fields():
    items = [{"role": "user", "content": "x"},
             {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
             {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
             {"type": "function_call_output", "call_id": "c2", "output": "1"}]
    _, names = to_chat(req(input=items, instructions="sys"))
    assert names.param("messages[0].content") == "instructions"
    assert names.param("messages[1].content") == "input[0].content"
    assert names.param("messages[2].tool_calls[1].function.arguments") == "input[2].arguments"
    assert names.param("messages[2].tool_calls[0].id") == "input[1].call_id"
    assert names.param("messages[3].content") == "input[3].output"
    assert names.param("messages[3].tool_call_id") == "input[3].call_id"
    assert names.param("messages") == "input"
    assert names.param("max_completion_tokens") == "max_output_tokens"
    assert names.param("response_format.json_schema.schema") == "text.format.schema"
    assert names.param("tools[2].function.parameters") == "tools[2].parameters"
    assert names.param("tool_choice.function.name") == "tool_choice.name"
    e = names.rename(APIError(400, "lower max_completion_tokens", param="max_completion_tokens"))
    assert (e.param, e.message) == ("max_output_tokens", "lower max_output_tokens")


# ---- chat results -> Responses -------------------------------------------------------------

RESPONSE = TypeAdapter(openai_types.Response)
EVENT = TypeAdapter(openai_types.ResponseStreamEvent)


def completion(message: dict, finish="stop") -> dict:
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", **message},
                         "finish_reason": finish, "logprobs": None}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 9, "total_tokens": 14,
                      "prompt_tokens_details": {"cached_tokens": 2}}}


def chunk(delta: dict | None = None, finish=None, usage=None) -> dict:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "logprobs": None,
                                         "finish_reason": finish}]
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": choices, "usage": usage}


CALL_MESSAGE = {
    "reasoning_content": "The user wants weather.", "content": "Checking.",
    "tool_calls": [
        {"id": "call_a", "type": "function",
         "function": {"name": "weather", "arguments": "{\"city\": \"Paris\"}"}},
        {"id": "call_b", "type": "function",
         "function": {"name": "weather", "arguments": "{\"city\": \"Lyon\"}"}}]}

#: the same message as OpenAI streams it: thought, text, then each call (id and name in its
#: first piece, the arguments split anywhere)
CALL_CHUNKS = [
    chunk({"role": "assistant", "content": ""}),
    chunk({"reasoning_content": "The user "}), chunk({"reasoning_content": "wants weather."}),
    chunk({"content": "Check"}), chunk({"content": "ing."}),
    chunk({"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                           "function": {"name": "weather", "arguments": ""}}]}),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{\"city\": "}}]}),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": "\"Paris\"}"}}]}),
    chunk({"tool_calls": [{"index": 1, "id": "call_b", "type": "function",
                           "function": {"name": "weather", "arguments": "{\"ci"}}]}),
    chunk({"tool_calls": [{"index": 1, "function": {"arguments": "ty\": \"Lyon\"}"}}]}),
    chunk({}, finish="tool_calls"),
    chunk(usage={"prompt_tokens": 5, "completion_tokens": 9, "total_tokens": 14,
                 "prompt_tokens_details": {"cached_tokens": 2}}),
]


def without_ids(output: list[dict]) -> list[dict]:
    return [{k: v for k, v in item.items() if k != "id"} for item in output]


def test_completion_with_reasoning_text_and_calls():
    out = ResponseBuilder("resp_1", req(input="hi")).from_completion(completion(
        CALL_MESSAGE, "tool_calls"))
    r = RESPONSE.validate_python(out)
    assert r.status == "completed" and r.store is False
    assert [i.type for i in r.output] == ["reasoning", "message", "function_call",
                                          "function_call"]
    assert r.output[0].content[0].text == "The user wants weather."
    assert r.output_text == "Checking."
    calls = [(i.call_id, i.name, json.loads(i.arguments)) for i in r.output[2:]]
    assert calls == [("call_a", "weather", {"city": "Paris"}),
                     ("call_b", "weather", {"city": "Lyon"})]
    assert (r.usage.input_tokens, r.usage.output_tokens, r.usage.total_tokens,
            r.usage.input_tokens_details.cached_tokens) == (5, 9, 14, 2)


def stream(chunks: list[dict], request: ResponsesRequest) -> list[dict]:
    b = ResponseBuilder("resp_1", request)
    events = b.start()
    for c in chunks:
        events += b.feed_chunk(c)
    return events + b.end()


def test_stream_events_reassemble_to_the_completion():
    events = stream(CALL_CHUNKS, req(input="hi"))
    parsed = [EVENT.validate_python(e) for e in events]
    assert [e.sequence_number for e in parsed] == list(range(len(parsed)))
    types = [e.type for e in parsed]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] == "response.completed"
    # every item: added, then its deltas, then done; the stream's items are the response's
    final = events[-1]["response"]
    whole = ResponseBuilder("resp_2", req(input="hi")).from_completion(
        completion(CALL_MESSAGE, "tool_calls"))
    assert without_ids(final["output"]) == without_ids(whole["output"])
    assert final["usage"] == whole["usage"]
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert done == final["output"]
    args = {}
    for e in events:
        if e["type"] == "response.function_call_arguments.delta":
            args[e["output_index"]] = args.get(e["output_index"], "") + e["delta"]
    assert args == {2: "{\"city\": \"Paris\"}", 3: "{\"city\": \"Lyon\"}"}
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text == "Checking."
    # the message was done before the first call began
    assert types.index("response.output_text.done") < types.index(
        "response.function_call_arguments.delta")


def test_length_finish_is_incomplete():
    events = stream([chunk({"content": "abc"}), chunk({}, finish="length")],
                    req(input="hi", max_output_tokens=3))
    last = EVENT.validate_python(events[-1])
    assert last.type == "response.incomplete"
    assert last.response.incomplete_details.reason == "max_output_tokens"
    assert last.response.output[0].status == "incomplete"


def test_empty_answer_is_one_empty_message():
    r = RESPONSE.validate_python(ResponseBuilder("resp_1", req(input="hi")).from_completion(
        completion({"content": ""})))
    assert [i.type for i in r.output] == ["message"] and r.output_text == ""


def test_error_mid_stream_is_response_failed():
    events = stream([chunk({"content": "ab"}),
                     {"error": {"message": "boom", "type": "server_error", "param": None,
                                "code": "engine_error"}}], req(input="hi"))
    kinds = [e["type"] for e in events]
    assert "response.failed" in kinds
    failed = EVENT.validate_python(events[kinds.index("response.failed")])
    assert failed.response.status == "failed" and failed.response.error.message == "boom"


async def _aiter(items):
    for x in items:
        yield x


def test_sse_body_from_chat_sse_body():
    import asyncio

    from poot.serve.responses import SSE_DONE, sse

    raw = ["".join(sse(c) for c in CALL_CHUNKS[:4]), "".join(sse(c) for c in CALL_CHUNKS[4:]),
           SSE_DONE]

    async def collect():
        return [x async for x in response_events(ResponseBuilder("resp_1", req(input="h")),
                                                 _aiter(raw))]

    body = "".join(asyncio.run(collect()))
    blocks = body[:-2].split("\n\n")
    names = [b.split("\n")[0] for b in blocks]
    datas = [json.loads(b.split("\n")[1][len("data: "):]) for b in blocks]
    assert all(n == f"event: {d['type']}" for n, d in zip(names, datas))
    assert datas[-1]["type"] == "response.completed"
    assert chat_chunks(sse({"a": 1}) + SSE_DONE) == [{"a": 1}, None]
