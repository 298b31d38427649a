"""``POST /v1/responses`` on a real server (the tiny fixture), talked to with the official
``openai`` client: the same text as the equivalent chat completion (greedy), streaming and
not; structured output through ``text.format``; usage; and the 400s of requests needing
server-side state, each naming its field."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from sse import parse_sse

INSTRUCTIONS = "be brief"
QUESTION = "What is the capital of France?"
CHAT = [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": QUESTION}]


def client(srv):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)


def chat_text(srv, messages=CHAT, **kw) -> tuple[str, str, dict]:
    r = client(srv).chat.completions.create(model="tiny", messages=messages, temperature=0,
                                            max_completion_tokens=20, **kw)
    return r.choices[0].message.content, r.choices[0].finish_reason, r.usage


def test_sync_equals_chat_completion(server):
    text, finish, usage = chat_text(server)
    r = client(server).responses.create(model="tiny", instructions=INSTRUCTIONS,
                                        input=QUESTION, temperature=0, max_output_tokens=20)
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.output_text == text and text
    assert r.status == ("incomplete" if finish == "length" else "completed")
    assert [i.type for i in r.output] == ["message"]
    assert r.usage.input_tokens == usage.prompt_tokens
    assert r.usage.output_tokens == usage.completion_tokens
    assert r.store is False and r.model == "tiny"


def test_items_input_equals_chat_completion(server):
    msgs = CHAT + [{"role": "assistant", "content": "Paris."},
                   {"role": "user", "content": "And of Italy?"}]
    text, _, _ = chat_text(server, msgs)
    items = [{"role": "system", "content": INSTRUCTIONS},
             {"type": "message", "role": "user",
              "content": [{"type": "input_text", "text": QUESTION}]},
             {"type": "message", "role": "assistant",
              "content": [{"type": "output_text", "text": "Paris.", "annotations": []}]},
             {"role": "user", "content": "And of Italy?"}]
    r = client(server).responses.create(model="tiny", input=items, temperature=0,
                                        max_output_tokens=20)
    assert r.output_text == text


def test_stream_equals_chat_completion(server):
    text, _, usage = chat_text(server)
    events = list(client(server).responses.create(
        model="tiny", instructions=INSTRUCTIONS, input=QUESTION, temperature=0,
        max_output_tokens=20, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", kinds[-1]]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == text
    final = events[-1].response
    assert final.output_text == text
    assert final.usage.output_tokens == usage.completion_tokens


def test_stream_framing(server):
    """Every event is ``event: <type>`` then its one-line JSON ``data:``; no ``[DONE]``."""
    with httpx.stream("POST", server.url + "/v1/responses", timeout=60, json={
            "model": "tiny", "input": "hi", "max_output_tokens": 4, "stream": True}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        body = r.read().decode()
    blocks = body[:-2].split("\n\n")
    for b in blocks:
        name, data = b.split("\n")
        assert name == "event: " + json.loads(data[len("data: "):])["type"]
    # the chat stream's framing helper sees the same payloads once the names are dropped
    payloads = parse_sse("".join(b.split("\n")[1] + "\n\n" for b in blocks) +
                         "data: [DONE]\n\n")
    assert payloads[-1]["type"] in ("response.completed", "response.incomplete")


def test_json_schema_format(server):
    schema = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 8}},
              "required": ["answer"], "additionalProperties": False}
    fmt = {"format": {"type": "json_schema", "name": "a", "schema": schema, "strict": True}}
    r = client(server).responses.create(model="tiny", input=QUESTION, text=fmt,
                                        temperature=0, max_output_tokens=40)
    chat = client(server).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": QUESTION}], temperature=0,
        max_completion_tokens=40, response_format={
            "type": "json_schema", "json_schema": {"name": "a", "schema": schema,
                                                   "strict": True}})
    assert r.output_text == chat.choices[0].message.content
    if r.status == "completed":
        assert set(json.loads(r.output_text)) == {"answer"}
    assert r.text.format.type == "json_schema"


#: (request fields, the field the 400 names)
REFUSED = [
    ({"store": True}, "store"),
    ({"previous_response_id": "resp_123"}, "previous_response_id"),
    ({"background": True}, "background"),
    ({"tools": [{"type": "web_search_preview"}]}, "tools[0].type"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]"),
    ({"input": [{"type": "computer_call", "id": "x"}]}, "input[0]"),
    ({"input": [{"role": "user", "content": [{"type": "input_image",
                                              "image_url": "http://x"}]}]},
     "input[0].content[0]"),
    ({"max_output_tokens": 100000}, "max_output_tokens"),
    ({"text": {"format": {"type": "json_schema", "name": "x",
                          "schema": {"type": "nonsense"}}}}, "text.format.schema"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"model": "other"}, "model"),
]


@pytest.mark.parametrize("fields,param", REFUSED, ids=[p for _, p in REFUSED])
def test_refused_naming_the_field(server, fields, param):
    r = httpx.post(server.url + "/v1/responses", timeout=60,
                   json={"model": "tiny", "input": "hi", **fields})
    assert r.status_code in (400, 404), r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["param"] == param, err
    assert server.state.aengine.inflight == 0


def test_function_tools_reach_the_chat_path(server):
    """Function tools are handed to chat completions as chat ``tools``: whatever it answers
    (a 400 naming ``tools`` on a server without tool calling, or a Response), the Responses
    route answers the same way under its own field names."""
    tools = [{"type": "function", "name": "weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
    r = httpx.post(server.url + "/v1/responses", timeout=60, json={
        "model": "tiny", "input": "weather in Paris?", "tools": tools,
        "max_output_tokens": 8})
    chat = httpx.post(server.url + "/v1/chat/completions", timeout=60, json={
        "model": "tiny", "messages": [{"role": "user", "content": "weather in Paris?"}],
        "tools": [{"type": "function", "function": {k: v for k, v in tools[0].items()
                                                    if k != "type"}}],
        "max_completion_tokens": 8})
    assert r.status_code == chat.status_code
    if chat.status_code == 400:
        param = chat.json()["error"]["param"]
        assert r.json()["error"]["param"] == {"messages": "input"}.get(param, param)


def _wait(cond, what: str, limit: float = 30.0) -> None:
    import time

    end = time.monotonic() + limit
    while not cond():
        if time.monotonic() > end:
            pytest.fail(f"gave up waiting for {what}")
        time.sleep(0.01)


def test_stream_disconnect_aborts(server, tiny, gate):
    """A client that leaves a Responses stream aborts the chat request under it: the engine
    (paused after the first token) frees its blocks, and the server stays clean."""
    eng, aeng = tiny.engine, server.state.aengine
    aborts = aeng.aborts
    gate.close_after_token = True
    with httpx.Client(timeout=60) as c:
        with c.stream("POST", server.url + "/v1/responses", json={
                "model": "tiny", "input": "tell me a long story", "temperature": 0,
                "max_output_tokens": 100, "stream": True}) as r:
            for line in r.iter_lines():
                if line == "event: response.output_text.delta":
                    break
            else:
                pytest.fail("no text delta before the disconnect")
            assert eng.stats().running == 1
    _wait(lambda: aeng.aborts > aborts, "the server to abort the request")
    gate.open()
    _wait(lambda: eng.stats().kv_blocks_used == 0 and eng.stats().running == 0,
          "the blocks to be freed")
    assert aeng.inflight == 0
