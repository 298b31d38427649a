"""Tool calls and reasoning on the engine's side: which tool-call format and reasoning split a
model's chat template implies, whether a tool's parameter schema can be honored, and the
guided-decoding constraint (:class:`~poot.sampling_params.Guide`) of an answer that calls
tools, or that may think first (:mod:`poot.text.tool_calls` has the formats and parsers).
The checks of a request's ``tools``, ``tool_choice`` and tool messages live here too, one
definition for the server (:mod:`poot.serve.tools` turns them into 400s) and for
``LLM.chat`` / ``poot chat --tools`` (:mod:`poot.api.chat`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from poot.engine.guided import JSON_DEFAULTS, first_line
from poot.sampling_params import Guide, InvalidRequest
from poot.text.tool_calls import (FORMATS, OutputParser, ToolFormat, detect_format,
                                  detect_reasoning)

#: llguidance's JSON options inside a constrained call: one line, ``", "`` and ``": "``
#: between items (as the templates' ``tojson`` writes them): no whitespace for a small
#: model to loop on, and few tokens
CALL_JSON = {"whitespace_flexible": False, "whitespace_pattern": None,
             "item_separator": ", ", "key_separator": ": ", "lenient": False}


def tool_format(template: str | None, parser: str) -> ToolFormat:
    """The format ``parser`` names (``--tool-call-parser``: a :data:`FORMATS` name), or
    (``auto``) the one chat ``template`` implies."""
    return detect_format(template) if parser == "auto" else FORMATS[parser]


def reasoning_on(template: str | None, parser: str) -> bool:
    """``<think>`` blocks are split off: ``parser`` (``--reasoning-parser``) says so, or
    (``auto``) ``template`` is a thinking model's."""
    return detect_reasoning(template) if parser == "auto" else parser != "none"


def schema_problem(schema: Any) -> str | None:
    """Why ``schema`` is not a JSON schema of an object that llguidance can honor (checked
    without the vocabulary: unknown types, unsupported keywords and formats, bad references
    and regexes); None when it is."""
    import llguidance as L

    if not isinstance(schema, dict):
        return "must be a JSON schema (an object)"
    if schema.get("type", "object") != "object":
        return "must describe an object (type \"object\")"
    try:
        grammar = L.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_DEFAULTS)
        bad, messages = L.LLMatcher.validate_grammar_with_warnings(grammar, None)
    except Exception as e:  # noqa: BLE001  (llguidance's conversion errors: the user's schema)
        bad, messages = True, [str(e)]
    return ("; ".join(first_line(m) for m in messages) or "invalid") if bad else None


#: OpenAI's rule for a function's name
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
#: the most tools one request may define
MAX_TOOLS = 128


class InvalidToolSchema(InvalidRequest):
    """A tool's ``parameters`` is not a JSON schema of an object that llguidance can
    honor (:func:`schema_problem` says why)."""


def check_tools(tools: Any) -> list[dict[str, Any]]:
    """``tools`` checked: a list (at most :data:`MAX_TOOLS`) of OpenAI chat function tools
    ``{"type": "function", "function": {"name", "description"?, "parameters"?,
    "strict"?}}``, names 1-64 of ``[A-Za-z0-9_-]`` and unique, ``parameters`` a JSON schema
    of an object that llguidance can honor. None is no tools.

    Raises:
        InvalidRequest: naming the field (``tools[2].function.name``, ...);
            :class:`InvalidToolSchema` for a schema.
    """
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise InvalidRequest("tools", tools, "a list of function tools")
    if len(tools) > MAX_TOOLS:
        raise InvalidRequest("tools", f"{len(tools)} tools", f"at most {MAX_TOOLS}")
    seen: set[str] = set()
    for i, t in enumerate(tools):
        p = f"tools[{i}]"
        if not isinstance(t, Mapping) or t.get("type") != "function":
            raise InvalidRequest(f"{p}.type", t.get("type") if isinstance(t, Mapping) else t,
                                 "only function tools are supported (type \"function\")")
        fn = t.get("function")
        if not isinstance(fn, Mapping):
            raise InvalidRequest(f"{p}.function", fn, "a function tool needs a 'function' "
                                 "object")
        unknown = sorted(set(fn) - {"name", "description", "parameters", "strict"})
        if unknown:
            raise InvalidRequest(f"{p}.function.{unknown[0]}", fn[unknown[0]],
                                 "unknown field of a function")
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise InvalidRequest(f"{p}.function.name", name, "a function name is 1-64 "
                                 "letters, digits, '_' or '-'")
        if name in seen:
            raise InvalidRequest(f"{p}.function.name", name, "two tools have this name")
        seen.add(name)
        if not isinstance(fn.get("description", ""), str):
            raise InvalidRequest(f"{p}.function.description", fn["description"],
                                 "must be a string")
        if "parameters" in fn:
            why = schema_problem(fn["parameters"])
            if why is not None:
                raise InvalidToolSchema(f"{p}.function.parameters", "...", why)
    return [dict(t) for t in tools]


def check_tool_choice(value: Any, tools: list[dict[str, Any]]) -> str | None:
    """``tool_choice`` against the checked ``tools``: None (``"auto"`` or absent),
    ``"none"``, ``"required"`` or the forced tool's name (from OpenAI's ``{"type":
    "function", "function": {"name": ...}}``).

    Raises:
        InvalidRequest: naming ``tool_choice`` (another shape, no tools to choose from, or
            a name that is not one of the tools).
    """
    names = [t["function"]["name"] for t in tools]
    if value is None or value == "auto":
        return None
    if value in ("none", "required"):
        if value == "required" and not names:
            raise InvalidRequest("tool_choice", value, "\"required\" needs tools")
        return value
    fn = value.get("function") if isinstance(value, Mapping) else None
    if not isinstance(value, Mapping) or value.get("type") != "function" or \
            not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
        raise InvalidRequest("tool_choice", value, "\"none\", \"auto\", \"required\" or "
                             "{\"type\": \"function\", \"function\": {\"name\": ...}}")
    if fn["name"] not in names:
        raise InvalidRequest("tool_choice", fn["name"][:64], "names no tool of 'tools'")
    return fn["name"]


def check_tool_messages(messages: Sequence[Mapping[str, Any]]) -> None:
    """Each assistant ``tool_calls`` entry in OpenAI's shape (``{"id", "type": "function",
    "function": {"name", "arguments": <JSON text>}}``), and each ``tool`` message's
    ``tool_call_id`` the id of a call in an earlier assistant message.

    Raises:
        InvalidRequest: naming the message (``messages[3].tool_call_id``, ...).
    """
    ids: set[str] = set()
    for i, m in enumerate(messages):
        calls = m.get("tool_calls")
        if calls is not None:
            if m.get("role") != "assistant" or not isinstance(calls, list):
                raise InvalidRequest(f"messages[{i}].tool_calls", "...",
                                     "tool_calls is a list, on an assistant message")
            for k, c in enumerate(calls):
                fn = c.get("function") if isinstance(c, Mapping) else None
                if not isinstance(c, Mapping) or not isinstance(c.get("id"), str) or \
                        not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) \
                        or not isinstance(fn.get("arguments"), str):
                    raise InvalidRequest(f"messages[{i}].tool_calls[{k}]", "...",
                                         "a tool call is {\"id\", \"type\": \"function\", "
                                         "\"function\": {\"name\", \"arguments\": <JSON "
                                         "text>}}")
                ids.add(c["id"])
        if m.get("role") == "tool":
            tid = m.get("tool_call_id")
            if not isinstance(tid, str) or tid not in ids:
                raise InvalidRequest(f"messages[{i}].tool_call_id", tid,
                                     "must be the id of a call in an earlier assistant "
                                     "message")


def _answer_rule(guide: Guide, ours: bool) -> str | None:
    """``guide`` as Lark rules whose start is named ``answer``; None for a user's grammar
    (``ours`` False: kept as it is)."""
    if guide.kind in ("json_schema", "json_object"):
        schema = guide.spec if guide.kind == "json_schema" else {"type": "object"}
        if isinstance(schema, dict):
            schema = {"x-guidance": JSON_DEFAULTS, **schema}
        return "answer: %json" + json.dumps(schema) + "\n"
    if guide.kind == "regex":
        return "answer: /" + guide.spec.replace("/", "\\/") + "/\n"
    if ours:
        return re.sub(r"^start:", "answer:", guide.spec, count=1, flags=re.M)
    return None


def allow_thought(guide: Guide, in_thought: bool, ours: bool = False) -> Guide:
    """``guide`` applied to the answer after a thought, not to the thought: an optional
    ``<think>...</think>`` first (``in_thought``: the prompt opened it, so the text up to
    ``</think>``). A user's grammar is kept as it is (it must allow the thought itself);
    ``ours``: the grammar is a tool format's (its ``start`` rule becomes the answer)."""
    answer = _answer_rule(guide, ours)
    if answer is None:
        return guide
    if in_thought:
        head = 'start: rest answer\nrest[lazy]: /(.|\\n)*<\\/think>/\n'
    else:
        head = 'start: thought? answer\nthought[lazy]: "<think>" /(.|\\n)*/ "</think>"\n'
    return Guide.grammar(head + answer)


def call_guide(fmt: ToolFormat, tools: list[dict[str, Any]], choice: str | None,
               parallel: bool, tokenizer) -> Guide | None:
    """The constraint of an answer that may call ``tools`` (OpenAI function tools) in
    format ``fmt``: ``choice`` None (auto), ``"required"`` or a tool's name; ``parallel``:
    several calls allowed; ``tokenizer``: the model's (its special tokens stand for markup
    such as ``[TOOL_CALLS]``). None: unconstrained."""

    def special_id(text: str) -> int | None:
        tid = tokenizer.token_to_id(text)
        return tid if tid is not None and tid in tokenizer.special_ids else None

    made = fmt.guide(tools, choice, parallel, special_id, CALL_JSON)
    if made is None:
        return None
    kind, spec = made
    if kind == "json_schema":
        return Guide(kind, {**spec, "x-guidance": CALL_JSON})
    return Guide(kind, spec)


@dataclass
class ModelToolCalls:
    """One model's tool calling outside the server (``LLM.chat(tools=...)``, ``poot chat
    --tools``): its tool-call format and reasoning split, with the three operations a chat
    with tools needs. Made by :meth:`of` from the model's tokenizer."""

    fmt: ToolFormat
    reasoning: bool
    tokenizer: Any

    @classmethod
    def of(cls, tokenizer, tool_call_parser: str = "auto",
           reasoning_parser: str = "auto") -> "ModelToolCalls":
        """The tool calling of the model with ``tokenizer`` (its chat template decides
        unless the parser names say otherwise)."""
        template = tokenizer.chat_template
        return cls(tool_format(template, tool_call_parser),
                   reasoning_on(template, reasoning_parser), tokenizer)

    def prepare(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                choice: str | None) -> list[dict[str, Any]]:
        """The messages as the chat template gets them (:meth:`ToolFormat.prepare`)."""
        return self.fmt.prepare(messages, tools, choice)

    def guide(self, tools: list[dict[str, Any]], choice: str | None, parallel: bool = True,
              in_thought: bool = False) -> Guide | None:
        """The reply's constraint (:func:`call_guide`; after an optional thought for a
        thinking model)."""
        guide = call_guide(self.fmt, tools, choice, parallel, self.tokenizer)
        return allow_thought(guide, in_thought, ours=True) \
            if guide is not None and self.reasoning else guide

    def parse(self, text: str, in_thought: bool = False) -> dict[str, Any]:
        """A whole reply as OpenAI's chat ``message`` (``content``, ``tool_calls`` when
        there are calls, ``reasoning_content`` for a thinking model)."""
        return OutputParser(self.fmt, self.reasoning, in_thought).parse(text).message()


__all__ = ["CALL_JSON", "MAX_TOOLS", "InvalidToolSchema", "ModelToolCalls",
           "check_tool_choice", "check_tool_messages", "check_tools", "allow_thought", "call_guide", "reasoning_on",
           "schema_problem", "tool_format"]
