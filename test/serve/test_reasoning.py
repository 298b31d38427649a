"""Reasoning content in chat completions (``--reasoning-parser think``) on the tiny fixture:
a ``<think>...</think>`` thought goes to ``message.reasoning_content`` (streamed as
``delta.reasoning_content``) and the rest to ``content``; a constraint (a tool call,
``response_format``) applies to the answer after the thought, not to the thought."""

from __future__ import annotations


import httpx
import pytest

L = pytest.importorskip("llguidance")

from sse import parse_sse  # noqa: E402

CHAT = "/v1/chat/completions"
MSGS = [{"role": "user", "content": "hi"}]
#: the output forced to hold a thought (a user's grammar is kept as it is)
THOUGHT = 'start: "<think>" /[a-z]{2,5}/ "</think>" /[a-z]{2,5}/\n'
PICK = {"type": "function", "function": {"name": "pick", "parameters": {
    "type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["n"], "additionalProperties": False}}}


@pytest.fixture(scope="module")
def think_server(tiny):
    from poot.serve import ServeConfig
    from server_util import running

    with running(tiny, ServeConfig(served_model_name="tiny", reasoning_parser="think",
                                   tool_call_parser="hermes")) as srv:
        yield srv


def _streamed(srv, body):
    r = httpx.post(srv.url + CHAT, json={**body, "stream": True}, timeout=120)
    reasoning = content = ""
    calls: dict[int, list[str]] = {}
    finish = None
    for e in parse_sse(r.text):
        if not e.get("choices"):
            continue
        ch = e["choices"][0]
        d = ch["delta"]
        reasoning += d.get("reasoning_content") or ""
        content += d.get("content") or ""
        for t in d.get("tool_calls") or []:
            c = calls.setdefault(t["index"], ["", ""])
            c[0] = t["function"].get("name") or c[0]
            c[1] += t["function"].get("arguments", "")
        finish = ch["finish_reason"] or finish
    return reasoning or None, content or None, [tuple(c) for c in calls.values()], finish


def test_thought_is_reasoning_content_streamed_and_not(think_server):
    body = {"model": "tiny", "messages": MSGS, "temperature": 0, "max_tokens": 40,
            "guided_grammar": THOUGHT}
    r = httpx.post(think_server.url + CHAT, json=body, timeout=120).json()
    msg = r["choices"][0]["message"]
    assert 2 <= len(msg["reasoning_content"]) <= 5 and msg["reasoning_content"].isalpha()
    assert 2 <= len(msg["content"]) <= 5 and "<" not in msg["content"]
    assert _streamed(think_server, body) == (msg["reasoning_content"], msg["content"], [],
                                             r["choices"][0]["finish_reason"])


@pytest.mark.parametrize("in_thought", [False, True])
def test_a_constraint_applies_after_the_thought(tiny, in_thought):
    """:func:`allow_thought`: a JSON schema, or a tool format's call grammar, constrains
    the answer; the thought before it (opened by the model, or by the prompt) is free."""
    from poot.sampling_params import Guide
    from poot.engine.tool_calls import CALL_JSON, allow_thought
    from poot.text.tool_calls import FORMATS

    tok = tiny.tokenizer
    lt = L.LLTokenizer(tok.backend.to_str(), n_vocab=tok.vocab_size,
                       eos_token=sorted(tok.stop_ids))

    def accepts(guide, text):
        m = L.LLMatcher(lt, L.grammar_from("lark", guide.spec), log_level=0)
        return all(m.consume_token(t) for t in tok.encode(text, add_special_tokens=False)) \
            and m.is_accepting()

    opened = "" if in_thought else "<think>"
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    guide = allow_thought(Guide("json_schema", schema), in_thought)
    assert accepts(guide, opened + 'so {"a": "x"} </think>{"a": 1}')
    assert not accepts(guide, opened + "so </think>not json")
    assert accepts(guide, '{"a": 2}') != in_thought      # no thought: only when not opened
    kind, spec = FORMATS["hermes"].guide([PICK], "required", False, lambda _: None, CALL_JSON)
    guide = allow_thought(Guide(kind, spec), in_thought, ours=True)
    call = '<tool_call>\n{"name": "pick", "arguments": {"n": 3}}\n</tool_call>'
    assert accepts(guide, opened + "hmm <tool_call> </think>" + call)
    assert not accepts(guide, opened + "hmm</think>" + call.replace("3", "12"))
