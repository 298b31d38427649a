"""Tool-call and reasoning parsers (:mod:`poot.text.tool_calls`), per format, on the text each
family's own chat template writes for an assistant's calls (rendered, not typed in): the
whole parse gives back the calls; every split of that text into stream deltas reassembles to
exactly the whole parse; markup never reaches ``content``; text a parser cannot read is
content, never an error. The constraining grammars accept the rendered calls and reject
arguments that break the tool's schema (llguidance on SmolLM2's vocabulary)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from poot.text.chat import render_template
from poot.text.tool_calls import (FORMATS, OutputParser, StreamParser, detect_format,
                                  detect_reasoning, prompt_opens_thought)

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = ROOT / "test" / "fixtures" / "chat_templates"
sys.path.insert(0, str(ROOT / "test" / "driver"))

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
        "required": ["city"]}}}
SEARCH = {"type": "function", "function": {
    "name": "search", "parameters": {"type": "object", "properties": {
        "q": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}},
        "required": ["q"]}}}
TOOLS = [WEATHER, SEARCH]
CALLS = [("get_weather", {"city": "Paris </tool_call> [TOOL_CALLS]", "unit": "c"}),
         ("search", {"q": "caf\u00e9 \"quoted\" \\ 😀", "tags": ["a", "b}"]})]
SPECIAL = {"bos_token": "<s>", "eos_token": "</s>"}

#: family -> (template file, its format, where the assistant's text starts and ends)
FAMILIES = {
    "qwen2_5": ("qwen2_5.jinja", "hermes", "<|im_start|>assistant\n", "<|im_end|>"),
    "qwen3": ("qwen3.jinja", "hermes", "<|im_start|>assistant\n", "<|im_end|>"),
    "llama3_1": ("llama3_1.jinja", "llama3_json",
                 "<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>"),
    "mistral": ("mistral_nemo.jinja", "mistral", "[/INST]", "</s>"),
}


def _template(family: str) -> str:
    return (TEMPLATES / FAMILIES[family][0]).read_text()


def _parser(family: str) -> OutputParser:
    """The family's parser as the server picks it: format and reasoning split from the
    template (Qwen 3's template writes an empty ``<think></think>`` before the answer)."""
    t = _template(family)
    return OutputParser(detect_format(t), detect_reasoning(t))


def _assistant_text(family: str, calls, content: str | None = None) -> str:
    """What the family's model writes for ``calls``: the assistant turn of the template's
    rendering of a conversation ending in those calls, without its end-of-turn marker."""
    n = 1 if family == "llama3_1" else len(calls)      # Llama 3.1's template: one call a turn
    msgs = [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": content or "", "tool_calls": [
                {"id": f"abcdefgh{k}", "type": "function",
                 "function": {"name": name, "arguments": args}}
                for k, (name, args) in enumerate(calls[:n])]}]
    text = render_template(_template(family), msgs, tools=TOOLS, special_tokens=SPECIAL)
    _, _, start, end = FAMILIES[family]
    body = text[text.rindex(start) + len(start):]
    return body[:body.rindex(end)]


def _stream(parser: OutputParser, pieces: list[str]):
    """Feed ``pieces`` as deltas; (content, reasoning, [(name, arguments)], ids) assembled
    from the deltas as an OpenAI client does."""
    sp = StreamParser(parser, new_id=lambda: "id")
    deltas = [sp.push(p) for p in pieces] + [sp.finish()]
    calls: dict[int, list[str]] = {}
    for d in deltas:
        for t in d.tool_calls:
            if t.id is not None:
                assert t.index not in calls and t.name, "a call's first delta names it once"
                calls[t.index] = [t.name, ""]
            calls[t.index][1] += t.arguments
    assert sorted(calls) == list(range(len(calls)))
    return ("".join(d.content for d in deltas) or None,
            "".join(d.reasoning for d in deltas) or None,
            [tuple(c) for c in calls.values()])


def _whole(parser: OutputParser, text: str):
    p = parser.parse(text)
    return p.content, p.reasoning, [(c.name, c.arguments) for c in p.tool_calls]


def _check_every_split(parser: OutputParser, text: str):
    whole = _whole(parser, text)
    for i in range(len(text) + 1):
        assert _stream(parser, [text[:i], text[i:]]) == whole, i
    assert _stream(parser, list(text)) == whole
    return whole


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_detect_format_from_template(family):
    assert detect_format(_template(family)).name == FAMILIES[family][1]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_rendered_calls_parse_back_at_every_split(family):
    text = _assistant_text(family, CALLS)
    content, reasoning, calls = _check_every_split(_parser(family), text)
    want = CALLS[:1] if family == "llama3_1" else CALLS
    assert content is None and not (reasoning or "").strip()
    assert [(n, json.loads(a)) for n, a in calls] == want


@pytest.mark.parametrize("family", ["qwen2_5", "qwen3"])
def test_text_before_a_call_is_content(family):
    text = _assistant_text(family, CALLS, content="Let me look <that> up.")
    content, _, calls = _check_every_split(_parser(family), text)
    assert content == "Let me look <that> up."
    assert [n for n, _ in calls] == ["get_weather", "search"]


def test_smollm2_template_is_generic_and_gets_the_tools(smollm2):
    fmt = detect_format(smollm2.chat_template)
    assert fmt.name == "generic" and not detect_reasoning(smollm2.chat_template)
    msgs = fmt.prepare([{"role": "user", "content": "weather in Paris?"}], TOOLS, None)
    text = render_template(smollm2.chat_template, msgs, add_generation_prompt=True,
                           special_tokens=smollm2.special_tokens)
    assert text.startswith("<|im_start|>system\n") and '"get_weather"' in text
    assert '"response"' in text and '"tool_calls"' in text


def test_tiny_fixture_template_is_generic():
    from chat_fixture import TEMPLATE

    assert detect_format(TEMPLATE).name == "generic"


def test_generic_calls_and_response_at_every_split():
    parser = OutputParser(FORMATS["generic"])
    out = json.dumps({"tool_calls": [{"name": n, "arguments": a} for n, a in CALLS]})
    _, _, calls = _check_every_split(parser, out)
    assert [(n, json.loads(a)) for n, a in calls] == CALLS
    reply = json.dumps({"response": "Paris is \"sunny\" \u2014 😀\n"}, ensure_ascii=True)
    assert _check_every_split(parser, reply) == ("Paris is \"sunny\" \u2014 😀\n", None, [])


def test_generic_prepare_maps_calls_and_results_to_its_json():
    msgs = [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "c1", "type": "function",
                 "function": {"name": "search", "arguments": '{"q": "x"}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "found"}]
    out = FORMATS["generic"].prepare(msgs, TOOLS, "required")
    assert out[0]["role"] == "system" and "search" in out[0]["content"]
    assert "response" not in out[0]["content"]            # a call is required
    assert json.loads(out[2]["content"]) == {"tool_calls": [{"name": "search",
                                                             "arguments": {"q": "x"}}]}
    assert out[3] == {"role": "user", "content": "Tool result (search): found"}


def test_llama_text_answer_and_python_tag():
    parser = OutputParser(FORMATS["llama3_json"])
    assert _check_every_split(parser, "The weather is fine.") == \
        ("The weather is fine.", None, [])
    tagged = '<|python_tag|>{"name": "search", "parameters": {"q": "a"}}; ' \
             '{"name": "get_weather", "parameters": {"city": "b"}}'
    assert [n for n, _ in _check_every_split(parser, tagged)[2]] == ["search", "get_weather"]


@pytest.mark.parametrize("fmt,text", [
    ("hermes", 'A <tool_call>{"name": broken}</tool_call> B'),
    ("hermes", '<tool_call>{"name": "f", "arguments": [1]}</tool_call>'),
    ("hermes", '<tool_call>{"name": "f", "arguments": {"a": 1}'),
    ("hermes", "<tool_call>"),
    ("llama3_json", '{"answer": 42}'),
    ("llama3_json", '{"name": "f", "parameters": {"a": 1}} trailing'),
    ("mistral", "[TOOL_CALLS] not json"),
    ("mistral", "[1, 2]"),
    ("generic", '{"tool_calls": 3}'),
    ("generic", "plain words"),
    ("generic", '{"response": "cut'),
])
def test_unparseable_output_is_content(fmt, text):
    content, reasoning, calls = _whole(OutputParser(FORMATS[fmt]), text)
    assert calls == [] and reasoning is None
    assert content == text.strip()


def test_qwen3_reasoning_then_call_at_every_split():
    tpl = _template("qwen3")
    assert detect_reasoning(tpl)
    prompt = render_template(tpl, [{"role": "user", "content": "hi"}], tools=TOOLS,
                             add_generation_prompt=True, enable_thinking=False)
    assert prompt.endswith("<think>\n\n</think>\n\n") and not prompt_opens_thought(prompt)
    parser = OutputParser(detect_format(tpl), reasoning=True)
    # the template writes its own (empty) thought before a call: this reply has a real one
    call = _assistant_text("qwen3", CALLS[:1]).removeprefix("<think>\n\n</think>\n\n")
    out = "<think>\nIt asks for </thin weather.\n</think>\n\nChecking." + call
    content, reasoning, calls = _check_every_split(parser, out)
    assert reasoning == "\nIt asks for </thin weather.\n" and content == "Checking."
    assert [n for n, _ in calls] == ["get_weather"]
    assert _check_every_split(parser, "No thought here.") == ("No thought here.", None, [])


def test_thought_opened_by_the_prompt():
    """DeepSeek-R1's template ends its generation prompt with ``<think>\\n``: the answer
    starts as reasoning, and a thought never closed is all reasoning."""
    assert prompt_opens_thought("<|Assistant|><think>\n")
    parser = OutputParser(None, reasoning=True, in_thought=True)
    assert _check_every_split(parser, "hmm\n</think>\n\n42") == ("42", "hmm\n", [])
    assert _check_every_split(parser, "still thinking") == (None, "still thinking", [])


# ---- the constraining grammars --------------------------------------------------------------

def _matcher(tokenizer, kind, spec):
    L = pytest.importorskip("llguidance")
    grammar = L.grammar_from("lark", spec) if kind == "grammar" else \
        L.LLMatcher.grammar_from_json_schema(spec)
    lt = L.LLTokenizer(tokenizer.backend.to_str(), n_vocab=tokenizer.vocab_size,
                       eos_token=sorted(tokenizer.stop_ids))
    bad, msgs = L.LLMatcher.validate_grammar_with_warnings(grammar, lt)
    assert not bad, msgs
    return L.LLMatcher(lt, grammar, log_level=0)


def _accepts(tokenizer, kind, spec, text: str) -> bool:
    m = _matcher(tokenizer, kind, spec)
    for t in tokenizer.encode(text, add_special_tokens=False):
        if not m.consume_token(t):
            return False
    return m.is_accepting()


JSON_OPTIONS = {"whitespace_pattern": r"[\x20\x0A\x0D\x09]{0,24}", "lenient": False}


@pytest.mark.parametrize("family", ["qwen2_5", "llama3_1"])
def test_required_grammar_accepts_the_rendered_call(smollm2, family):
    fmt = detect_format(_template(family))
    kind, spec = fmt.guide(TOOLS, "required", False, lambda _: None, JSON_OPTIONS)
    assert _accepts(smollm2, kind, spec, _assistant_text(family, CALLS[:1]))
    bad = _assistant_text(family, [("get_weather", {"city": "x", "unit": "kelvin"})])
    assert not _accepts(smollm2, kind, spec, bad)
    kind, spec = fmt.guide(TOOLS, "search", False, lambda _: None, JSON_OPTIONS)
    assert not _accepts(smollm2, kind, spec, _assistant_text(family, CALLS[:1]))


def test_mistral_grammar_uses_the_special_token_when_there_is_one(smollm2):
    fmt = FORMATS["mistral"]
    _, spec = fmt.guide(TOOLS, "required", True, lambda t: 7, JSON_OPTIONS)
    assert spec.startswith("start: <[7]> ")
    kind, spec = fmt.guide(TOOLS, "required", True, lambda t: None, JSON_OPTIONS)
    assert _accepts(smollm2, kind, spec, _assistant_text("mistral", CALLS).replace(
        ', "id": "abcdefgh0"', "").replace(', "id": "abcdefgh1"', ""))


def test_generic_auto_schema_allows_a_response_or_calls(smollm2):
    kind, spec = FORMATS["generic"].guide(TOOLS, None, True, lambda _: None, JSON_OPTIONS)
    assert _accepts(smollm2, kind, spec, '{"response": "hello"}')
    assert _accepts(smollm2, kind, spec, json.dumps(
        {"tool_calls": [{"name": n, "arguments": a} for n, a in CALLS]}, ensure_ascii=False))
    kind, spec = FORMATS["generic"].guide(TOOLS, "required", False, lambda _: None,
                                          JSON_OPTIONS)
    assert not _accepts(smollm2, kind, spec, '{"response": "hello"}')
    assert not _accepts(smollm2, kind, spec, json.dumps(      # one call only
        {"tool_calls": [{"name": n, "arguments": a} for n, a in CALLS]}, ensure_ascii=False))


@pytest.mark.parametrize("family", ["qwen2_5", "llama3_1", "mistral"])
def test_auto_grammar_is_free_text_until_a_call_starts(smollm2, family):
    """``tool_choice: auto``: any text, or a call constrained from its markup on."""
    fmt = detect_format(_template(family))
    kind, spec = fmt.guide(TOOLS, None, True, lambda _: None, JSON_OPTIONS)
    call = _assistant_text(family, CALLS[:1])
    bad = _assistant_text(family, [("get_weather", {"city": "x", "unit": "kelvin"})])
    if family == "mistral":
        call, bad = (t.replace(', "id": "abcdefgh0"', "") for t in (call, bad))
    assert _accepts(smollm2, kind, spec, "It is sunny <b>today</b>, no tool needed.")
    assert _accepts(smollm2, kind, spec, call)
    assert not _accepts(smollm2, kind, spec, bad)
    if family != "llama3_1":              # Llama's calls are the whole answer
        assert _accepts(smollm2, kind, spec, "Let me check.\n" + call)
        assert not _accepts(smollm2, kind, spec, "Let me check.\n" + bad)


def test_model_tool_calls_for_chat_outside_the_server(smollm2):
    """:class:`poot.engine.tool_calls.ModelToolCalls` (what ``LLM.chat(tools=)`` plugs in):
    SmolLM2's generic format prepares, constrains and parses a reply."""
    pytest.importorskip("llguidance")
    from poot.engine.tool_calls import ModelToolCalls

    mt = ModelToolCalls.of(smollm2)
    assert mt.fmt.name == "generic" and not mt.reasoning
    msgs = mt.prepare([{"role": "user", "content": "hi"}], TOOLS, "required")
    assert msgs[0]["role"] == "system" and "get_weather" in msgs[0]["content"]
    guide = mt.guide(TOOLS, "required")
    assert guide.kind == "json_schema"
    reply = json.dumps({"tool_calls": [{"name": "search", "arguments": {"q": "x"}}]})
    assert _accepts(smollm2, guide.kind, guide.spec, reply)
    msg = mt.parse(reply)
    assert msg["content"] is None
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in msg["tool_calls"]] \
        == [("search", '{"q": "x"}')]
