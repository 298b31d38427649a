"""Chat with tools from Python (``LLM.chat(messages, tools=...)``) and the CLI (``poot chat
--tools FILE``): the tools and the conversation's calls and results reach the chat template
in HF's shapes, a reply's parsed calls come back in OpenAI's, and the CLI shows each call
and sends the typed result back. The parser is reached through one seam
(:func:`poot.api.chat.tool_call_parser`); these tests plug a scripted one in there."""

from __future__ import annotations

import io
import json
from types import SimpleNamespace

import pytest

from poot.api import chat as api_chat
from poot.api.chat import _tool_choice, chat_prompt
from poot.engine.tool_calls import check_tool_choice, check_tools
from poot.sampling_params import InvalidRequest, SamplingParams

WEATHER = {"type": "function", "function": {
    "name": "weather", "description": "the weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
CALL = {"id": "call_1", "type": "function",
        "function": {"name": "weather", "arguments": "{\"city\": \"Paris\"}"}}

#: a template that shows what it received: the tools, calls (arguments as an object) and
#: the tool messages' ids
TEMPLATE = ("{% for t in tools %}TOOL {{ t.function.name }}\n{% endfor %}"
            "{% for m in messages %}{{ m.role }}:"
            "{% for c in m.tool_calls or [] %} CALL {{ c.function.name }} "
            "city={{ c.function.arguments.city }}{% endfor %}"
            "{% if m.tool_call_id %} [{{ m.tool_call_id }}]{% endif %} {{ m.content }}\n"
            "{% endfor %}")


def stub_handle(template: str = TEMPLATE):
    tok = SimpleNamespace(chat_template=template, special_tokens={}, source="stub",
                          encode=lambda text, add_special_tokens=True: [ord(c) for c in text])
    return SimpleNamespace(tokenizer=tok)


def rendered(ids) -> str:
    return "".join(chr(i) for i in ids)


def test_template_gets_tools_calls_and_results():
    msgs = [{"role": "user", "content": "weather?"},
            {"role": "assistant", "content": "", "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "call_1", "content": "18C"}]
    text = rendered(chat_prompt(stub_handle(), msgs, [WEATHER]))
    assert text == ("TOOL weather\nuser: weather?\nassistant: CALL weather city=Paris \n"
                    "tool: [call_1] 18C\n")
    assert msgs[1]["tool_calls"][0]["function"]["arguments"] == "{\"city\": \"Paris\"}"


class ScriptedParser:
    """A stand-in for the model's tool-call parser: the first reply is a call, the next
    ones text; records what it prepared."""

    def __init__(self):
        self.replies = 0
        self.prepared: list[list[dict]] = []
        self.choices: list = []

    def prepare(self, messages, tools, choice):
        self.prepared.append([dict(m) for m in messages])
        return [{"role": "system", "content": "tools: " + ",".join(
            t["function"]["name"] for t in tools)}] + messages

    def guide(self, tools, choice):
        self.choices.append(choice)
        return None

    def parse(self, text):
        self.replies += 1
        if self.replies == 1:
            return {"role": "assistant", "content": None, "tool_calls": [CALL]}
        return {"role": "assistant", "content": "It is 18C."}


def test_parser_prepares_the_messages():
    p = ScriptedParser()
    text = rendered(chat_prompt(stub_handle(), [{"role": "user", "content": "hi"}],
                                [WEATHER], p))
    assert text.startswith("TOOL weather\nsystem: tools: weather\nuser: hi")
    assert p.prepared == [[{"role": "user", "content": "hi"}]]


@pytest.mark.parametrize("tools,field", [
    ("weather", "tools"),
    ([{"type": "web_search"}], "tools[0].type"),
    ([{"type": "function", "function": {"name": ""}}], "tools[0].function.name"),
    ([WEATHER, WEATHER], "tools[1].function.name"),
    ([{"type": "function", "function": {"name": "f", "parameters": "x"}}],
     "tools[0].function.parameters"),
])
def test_bad_tools_name_the_field(tools, field):
    with pytest.raises(InvalidRequest) as e:
        check_tools(tools)
    assert e.value.field == field


@pytest.fixture(scope="module")
def tiny_chat(tmp_path_factory):
    from chat_fixture import chat_gguf
    return chat_gguf(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def llm(tiny_chat, tmp_path_factory):
    from poot.api import LLM
    return LLM(str(tiny_chat), kv_capacity=128, prefill_chunk=16, max_batch=2,
               cache_dir=str(tmp_path_factory.mktemp("cache")))


GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


def test_llm_chat_without_tools_is_the_reply(llm):
    from poot.api import Driver

    msgs = [{"role": "user", "content": "hello"}]
    r = llm.chat(msgs, GREEDY)
    assert r.content == r.text == Driver(llm.handle).complete(msgs, GREEDY).text
    assert r.tool_calls == [] and r.message() == {"role": "assistant", "content": r.text}


def test_llm_chat_returns_parsed_calls(llm, monkeypatch):
    p = ScriptedParser()
    monkeypatch.setattr(api_chat, "tool_call_parser", lambda handle: p)
    r = llm.chat([{"role": "user", "content": "weather?"}], GREEDY, tools=[WEATHER])
    assert r.tool_calls == [CALL] and r.content is None
    assert r.message() == {"role": "assistant", "content": "", "tool_calls": [CALL]}
    assert r.finish_reason == "length" and r.stats.generated_tokens == 6


def _chat_cli(args, stdin: str, capsys, monkeypatch):
    from poot.cli import main

    monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    rc = main(["chat", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_shows_calls_and_sends_results(tiny_chat, tmp_path, capsys, monkeypatch):
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps([WEATHER]))
    p = ScriptedParser()
    monkeypatch.setattr(api_chat, "tool_call_parser", lambda handle: p)
    rc, out, err = _chat_cli(["--model", str(tiny_chat), "--tools", str(tools),
                              "--max-tokens", "4", "--kv-capacity", "128",
                              "--prefill-chunk", "16", "-q"],
                             "weather in Paris?\n18C\n", capsys, monkeypatch)
    assert rc == 0, err
    assert out.splitlines() == ["[call call_1] weather({\"city\": \"Paris\"})", "It is 18C."]
    # the second reply was asked with the call and its typed result
    assert p.prepared[1][-2:] == [
        {"role": "assistant", "content": "", "tool_calls": [
            {**CALL, "function": {"name": "weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18C"}]


@pytest.mark.parametrize("content,says", [
    ("[{\"type\": \"function\", \"function\": {}}]", "tools[0].function.name"),
    ("not json", "not a JSON file"),
])
def test_cli_bad_tools_file(tiny_chat, tmp_path, capsys, monkeypatch, content, says):
    tools = tmp_path / "tools.json"
    tools.write_text(content)
    rc, _, err = _chat_cli(["--model", str(tiny_chat), "--tools", str(tools)], "",
                           capsys, monkeypatch)
    assert rc == 2
    assert err.startswith("poot: error: --tools ") and says in err and err.count("\n") == 1


@pytest.mark.parametrize("choice,want", [
    (None, None), ("auto", None), ("none", None), ("required", "required"),
    ("weather", "weather"), ({"type": "function", "function": {"name": "weather"}}, "weather"),
])
def test_tool_choice(choice, want):
    got = check_tool_choice(_tool_choice(choice), [WEATHER])
    assert (None if got == "none" else got) == want


@pytest.mark.parametrize("choice", ["sometimes", "nope", {"type": "function"}, 3])
def test_bad_tool_choice_names_it(choice):
    with pytest.raises(InvalidRequest) as e:
        check_tool_choice(_tool_choice(choice), [WEATHER])
    assert e.value.field == "tool_choice"


def test_llm_chat_required_constrains_with_the_parsers_guide(llm, monkeypatch):
    """The parser's constraint for ``tool_choice="required"`` is the reply's guide."""
    from poot.sampling_params import Guide

    class Constraining(ScriptedParser):
        def guide(self, tools, choice):
            self.choices.append(choice)
            return Guide.regex("CALL weather") if choice == "required" else None

    p = Constraining()
    monkeypatch.setattr(api_chat, "tool_call_parser", lambda handle: p)
    r = llm.chat([{"role": "user", "content": "weather?"}],
                 SamplingParams(temperature=0, max_tokens=16), tools=[WEATHER],
                 tool_choice="required")
    assert r.text == "CALL weather" and p.choices == ["required"]
    with pytest.raises(InvalidRequest) as e:
        llm.chat([{"role": "user", "content": "weather?"}],
                 SamplingParams(max_tokens=4, guided=Guide.regex("x")), tools=[WEATHER],
                 tool_choice="required")
    assert e.value.field == "tool_choice"
