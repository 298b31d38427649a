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

import re
from dataclasses import dataclass
from typing import Any

from poot.engine.tool_calls import (CALL_JSON, allow_thought, call_guide, reasoning_on,
                                    schema_problem, tool_format)
from poot.sampling_params import Guide
from poot.serve.errors import bad_request
from poot.text.tool_calls import OutputParser, ToolFormat

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
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


def _check_schema(schema: Any, param: str) -> None:
    """400 naming ``param`` unless ``schema`` is a JSON schema of an object that llguidance
    can honor (:func:`~poot.engine.tool_calls.schema_problem`)."""
    why = schema_problem(schema)
    if why is not None:
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


def tool_guide(tr: ToolRequest, tokenizer) -> Guide | None:
    """The constraint of the request's answer (None: unconstrained)."""
    if not tr.active:
        return None
    return call_guide(tr.fmt, tr.tools, tr.choice, tr.parallel, tokenizer)


def output_parser(tr: ToolRequest, reasoning: bool, in_thought: bool) -> OutputParser:
    """How the request's answers are split (content, reasoning, calls)."""
    return OutputParser(tr.fmt if tr.active else None, reasoning, in_thought)


__all__ = ["CALL_JSON", "MAX_TOOLS", "ToolRequest", "allow_thought", "call_guide",
           "schema_problem",
           "check_tool_messages", "output_parser", "reasoning_on", "tool_format",
           "tool_guide", "tool_request"]
