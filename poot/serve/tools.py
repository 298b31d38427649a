"""Tool calling and reasoning in chat completions: a request's ``tools``, ``tool_choice``,
``parallel_tool_calls`` and tool messages checked (each fault a 400 naming the field, before
anything is queued), the model's tool-call format and reasoning split chosen (from its chat
template, or ``--tool-call-parser`` / ``--reasoning-parser``), and the constraint a call
needs (:mod:`poot.text.tool_calls` has the formats and parsers; this module joins them to
the request).

``tool_choice``: ``none`` (no tools in the answer, no parsing), ``auto`` (the model may
call: free text for tagged formats, the ``{tool_calls|response}`` JSON for the generic one),
``required`` or ``{"type": "function", "function": {"name": ...}}`` (generation constrained
to the format's markup around arguments valid against the tool's schema).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from poot.engine.guided import JSON_DEFAULTS, first_line
from poot.sampling_params import Guide
from poot.serve.errors import bad_request
from poot.text.tool_calls import (FORMATS, OutputParser, ToolFormat, detect_format,
                                  detect_reasoning)

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
#: llguidance's JSON options inside a constrained call: one line, ``", "`` and ``": "``
#: between items (as the templates' ``tojson`` writes them): no whitespace for a small
#: model to loop on, and few tokens
CALL_JSON = {"whitespace_flexible": False, "whitespace_pattern": None,
             "item_separator": ", ", "key_separator": ": ", "lenient": False}
#: the most tools one request may define
MAX_TOOLS = 128


@dataclass
class ToolRequest:
    """A chat request's checked tool fields. ``choice``: None (``auto``), ``"required"``
    or the forced tool's name; ``fmt``: the model's tool-call format (it also renders
    earlier calls and results); ``active``: the answer may call tools (tools given and
    ``tool_choice`` not ``none``)."""

    tools: list[dict[str, Any]]
    choice: str | None
    parallel: bool
    fmt: ToolFormat
    active: bool

    def messages(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The messages as the chat template gets them (:meth:`ToolFormat.prepare`)."""
        return self.fmt.prepare(messages, self.tools if self.active else [], self.choice)

    @property
    def template_tools(self) -> list[dict[str, Any]] | None:
        """The template's ``tools`` variable (None when the answer may not call)."""
        return self.tools if self.active else None


def tool_format(template: str | None, parser: str) -> ToolFormat:
    """The format ``--tool-call-parser`` names, or (``auto``) the template's."""
    return detect_format(template) if parser == "auto" else FORMATS[parser]


def reasoning_on(template: str | None, parser: str) -> bool:
    """``<think>`` blocks are split off: ``--reasoning-parser`` or (``auto``) a thinking
    template."""
    return detect_reasoning(template) if parser == "auto" else parser != "none"


def _check_schema(schema: Any, param: str) -> None:
    """400 naming ``param`` unless ``schema`` is a JSON schema (an object) llguidance can
    honor (checked without the vocabulary: unknown types, unsupported keywords and
    formats, bad references and regexes)."""
    import llguidance as L

    if not isinstance(schema, dict):
        raise bad_request(param, f"'{param}' must be a JSON schema (an object)")
    if schema.get("type", "object") != "object":
        raise bad_request(param, f"'{param}' must describe an object (type \"object\")")
    try:
        grammar = L.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_DEFAULTS)
        bad, messages = L.LLMatcher.validate_grammar_with_warnings(grammar, None)
    except Exception as e:  # noqa: BLE001  (llguidance's conversion errors: the user's schema)
        bad, messages = True, [str(e)]
    if bad:
        why = "; ".join(first_line(m) for m in messages) or "invalid"
        raise bad_request(param, f"invalid '{param}': {why}", "invalid_tool_schema")


def _check_tools(tools: Any) -> list[dict[str, Any]]:
    if len(tools) > MAX_TOOLS:
        raise bad_request("tools", f"{len(tools)} tools; this server allows at most "
                          f"{MAX_TOOLS}")
    seen: set[str] = set()
    for i, t in enumerate(tools):
        p = f"tools[{i}]"
        if t.get("type") != "function":
            raise bad_request(f"{p}.type", "only function tools are supported "
                              "(type \"function\")")
        fn = t.get("function")
        if not isinstance(fn, dict):
            raise bad_request(f"{p}.function", "a function tool needs a 'function' object")
        unknown = sorted(set(fn) - {"name", "description", "parameters", "strict"})
        if unknown:
            raise bad_request(f"{p}.function.{unknown[0]}", "unknown field of a function")
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise bad_request(f"{p}.function.name", "a function name is 1-64 letters, "
                              "digits, '_' or '-'")
        if name in seen:
            raise bad_request(f"{p}.function.name", f"two tools are named {name!r}")
        seen.add(name)
        if not isinstance(fn.get("description", ""), str):
            raise bad_request(f"{p}.function.description", "must be a string")
        if "parameters" in fn:
            _check_schema(fn["parameters"], f"{p}.function.parameters")
    return tools


def _choice(value: Any, names: list[str]) -> str | None:
    """``tool_choice`` -> None (auto), ``"none"``, ``"required"`` or a tool's name."""
    if value is None or value == "auto":
        return None
    if value in ("none", "required"):
        if value == "required" and not names:
            raise bad_request("tool_choice", "tool_choice \"required\" needs tools")
        return value
    fn = value.get("function") if isinstance(value, dict) else None
    if not isinstance(value, dict) or value.get("type") != "function" or \
            not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise bad_request("tool_choice", "tool_choice must be \"none\", \"auto\", "
                          "\"required\" or {\"type\": \"function\", \"function\": "
                          "{\"name\": ...}}")
    if fn["name"] not in names:
        raise bad_request("tool_choice", f"tool_choice names {fn['name'][:64]!r}, which is "
                          f"not one of the tools")
    return fn["name"]


def check_tool_messages(messages) -> None:
    """400 naming the message: an assistant ``tool_calls`` entry that is not OpenAI's shape,
    or a ``tool`` message whose ``tool_call_id`` matches no earlier call."""
    ids: set[str] = set()
    for i, m in enumerate(messages):
        extra = m.model_extra or {}
        calls = extra.get("tool_calls")
        if calls is not None:
            if m.role != "assistant" or not isinstance(calls, list):
                raise bad_request(f"messages[{i}].tool_calls", "tool_calls is a list, on an "
                                  "assistant message")
            for k, c in enumerate(calls):
                p = f"messages[{i}].tool_calls[{k}]"
                fn = c.get("function") if isinstance(c, dict) else None
                if not isinstance(c, dict) or not isinstance(c.get("id"), str) or \
                        not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or \
                        not isinstance(fn.get("arguments"), str):
                    raise bad_request(p, "a tool call is {\"id\", \"type\": \"function\", "
                                      "\"function\": {\"name\", \"arguments\": <JSON text>}}")
                ids.add(c["id"])
        if m.role == "tool":
            tid = extra.get("tool_call_id")
            if not isinstance(tid, str) or tid not in ids:
                raise bad_request(f"messages[{i}].tool_call_id",
                                  "a tool message's tool_call_id must be the id of a call "
                                  "in an earlier assistant message")


def tool_request(req, template: str | None, parser: str) -> ToolRequest:
    """The request's checked tool fields (400s naming the field)."""
    tools = _check_tools(req.tools or [])
    names = [t["function"]["name"] for t in tools]
    choice = _choice(req.tool_choice, names)
    if not tools and choice is not None and choice != "none":
        raise bad_request("tool_choice", "tool_choice needs tools")
    check_tool_messages(req.messages)
    return ToolRequest(tools, None if choice == "none" else choice,
                       req.parallel_tool_calls is not False, tool_format(template, parser),
                       bool(tools) and choice != "none")


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


def tool_guide(tr: ToolRequest, tokenizer) -> Guide | None:
    """The constraint of the request's answer (None: unconstrained)."""
    if not tr.active:
        return None

    def special_id(text: str) -> int | None:
        tid = tokenizer.token_to_id(text)
        return tid if tid is not None and tid in tokenizer.special_ids else None

    made = tr.fmt.guide(tr.tools, tr.choice, tr.parallel, special_id, CALL_JSON)
    if made is None:
        return None
    kind, spec = made
    if kind == "json_schema":
        return Guide(kind, {**spec, "x-guidance": CALL_JSON})
    return Guide(kind, spec)


def output_parser(tr: ToolRequest, reasoning: bool, in_thought: bool) -> OutputParser:
    """How the request's answers are split (content, reasoning, calls)."""
    return OutputParser(tr.fmt if tr.active else None, reasoning, in_thought)


__all__ = ["CALL_JSON", "MAX_TOOLS", "ToolRequest", "allow_thought",
           "check_tool_messages", "output_parser", "reasoning_on", "tool_format",
           "tool_guide", "tool_request"]
