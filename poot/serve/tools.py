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

from dataclasses import dataclass
from typing import Any

from poot.engine.tool_calls import (InvalidToolSchema, allow_thought, call_guide,
                                    check_tool_choice, check_tool_messages, check_tools,
                                    reasoning_on, tool_format)
from poot.sampling_params import Guide, InvalidRequest
from poot.serve.errors import bad_request
from poot.text.tool_calls import OutputParser, ToolFormat


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


def tool_request(req, template: str | None, parser: str) -> ToolRequest:
    """The request's checked tool fields (:func:`~poot.engine.tool_calls.check_tools` and
    its peers; each fault a 400 naming the field)."""
    try:
        tools = check_tools(req.tools)
        choice = check_tool_choice(req.tool_choice, tools)
        check_tool_messages([{"role": m.role, **(m.model_extra or {})}
                             for m in req.messages])
    except InvalidRequest as e:
        code = "invalid_tool_schema" if isinstance(e, InvalidToolSchema) else "invalid_value"
        raise bad_request(e.field, f"invalid '{e.field}': {e.reason}", code) from None
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


__all__ = ["ToolRequest", "allow_thought", "output_parser", "reasoning_on", "tool_guide",
           "tool_request"]
