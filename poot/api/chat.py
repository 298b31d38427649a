"""Chat with tools from Python: the conversation (with ``tools``, assistant ``tool_calls`` and
``tool`` messages, in OpenAI's chat shapes) through the model's chat template, one reply,
and that reply split into ``content`` and parsed ``tool_calls``.

    llm = LLM()
    r = llm.chat([{"role": "user", "content": "Weather in Paris?"}], tools=TOOLS)
    for call in r.tool_calls:              # OpenAI's shape: {"id", "type", "function"}
        messages += [r.message(), {"role": "tool", "tool_call_id": call["id"],
                                   "content": run(call)}]

The template receives ``tools`` as HF's ``apply_chat_template`` gives them (its ``tools``
variable, OpenAI's ``{"type": "function", "function": {...}}`` objects), and an assistant
message's ``tool_calls[i].function.arguments`` as an object (the JSON string decoded, as HF
templates expect).

What the model family writes around a call (Hermes ``<tool_call>``, Llama 3 JSON, Mistral
``[TOOL_CALLS]``, or for a template with no tool support a generic JSON answer described in a
system message) is the model's tool-call format, chosen from its chat template
(:func:`tool_call_parser`; the formats are :mod:`poot.text.tool_calls`). The checks of
``tools``, ``tool_choice`` and tool messages are the server's (:mod:`poot.engine.tool_calls`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol, Sequence

from poot.engine.tool_calls import (ModelToolCalls, check_tool_choice, check_tool_messages,
                                    check_tools)
from poot.sampling_params import InvalidRequest
from poot.text.chat import encode_chat


class ToolCallParser(Protocol):
    """What chat with tools needs of a model's tool-call format."""

    def prepare(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                choice: str | None) -> list[dict[str, Any]]:
        """The messages as the chat template gets them (a format may add a system message
        describing the tools); ``choice``: None (auto), ``"required"`` or a tool's name."""

    def guide(self, tools: list[dict[str, Any]], choice: str | None) -> Any:
        """The constraint on the reply (a :class:`~poot.sampling_params.Guide`; None: no
        constraint): with ``choice`` ``"required"`` or a tool's name, a call to it whose
        arguments follow the tool's schema."""

    def parse(self, text: str) -> dict[str, Any]:
        """A whole reply as OpenAI's chat ``message``: ``content``, ``tool_calls`` (only
        when there are calls), ``reasoning_content`` (only for a thinking model)."""


def tool_call_parser(handle) -> ToolCallParser:
    """The tool-call parser of ``handle``'s model: its format (Hermes, Llama 3 JSON,
    Mistral, or the generic JSON answer) and reasoning split, chosen from its chat template
    (:class:`~poot.engine.tool_calls.ModelToolCalls`).

    Raises:
        InvalidRequest: the checkpoint has no tokenizer.
    """
    if handle.tokenizer is None:
        raise InvalidRequest("tools", "...", "this checkpoint has no tokenizer")
    return ModelToolCalls.of(handle.tokenizer)


def _decoded_arguments(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages with each ``tool_calls[i].function.arguments`` JSON string decoded to an
    object (what HF chat templates expect); text that is not JSON stays as it is."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"]:
                fn = dict(c.get("function") or {})
                if isinstance(fn.get("arguments"), str):
                    try:
                        fn["arguments"] = json.loads(fn["arguments"])
                    except json.JSONDecodeError:
                        pass
                calls.append({**c, "function": fn})
            m["tool_calls"] = calls
        out.append(m)
    return out


def chat_prompt(handle, messages: Sequence[Mapping[str, Any]],
                tools: list[dict[str, Any]] | None = None,
                parser: ToolCallParser | None = None, choice: str | None = None) -> list[int]:
    """Prompt ids of ``messages`` (and ``tools``) through ``handle``'s chat template (the
    ``parser`` prepares the messages when given; module doc)."""
    if handle.tokenizer is None:
        raise InvalidRequest("messages", "...", "this checkpoint has no tokenizer")
    msgs = _decoded_arguments(messages)
    if parser is not None and tools:
        msgs = parser.prepare(msgs, tools, choice)
    return encode_chat(handle.tokenizer, msgs, tools=tools or None)


def _tool_choice(choice: Any) -> Any:
    """``tool_choice`` in OpenAI's shape (a bare tool name, allowed from Python, becomes
    ``{"type": "function", "function": {"name": ...}}``)."""
    if isinstance(choice, str) and choice not in ("auto", "none", "required"):
        return {"type": "function", "function": {"name": choice}}
    return choice


def prepare_chat(handle, messages: Sequence[Mapping[str, Any]],
                 tools: list[dict[str, Any]] | None = None, tool_choice: Any = None
                 ) -> tuple[list[int], ToolCallParser | None, Any]:
    """A chat request's prompt ids, the parser of its reply (None without ``tools``) and
    the constraint its ``tool_choice`` puts on the reply (None: none): ``tools`` checked,
    the model's parser found (:func:`tool_call_parser`), the messages through the chat
    template. ``tool_choice="none"`` leaves the tools out.

    Raises:
        InvalidRequest: bad ``tools``, ``tool_choice`` or tool messages (naming the field:
            :func:`~poot.engine.tool_calls.check_tools` and its peers), no tokenizer.
        ChatTemplateError: the template refuses the messages.
    """
    tools = check_tools(tools)
    choice = check_tool_choice(_tool_choice(tool_choice), tools)
    check_tool_messages(messages)
    if not tools or choice == "none":
        return chat_prompt(handle, messages), None, None
    parser = tool_call_parser(handle)
    ids = chat_prompt(handle, messages, tools, parser, choice)
    return ids, parser, parser.guide(tools, choice)


@dataclass
class ChatResult:
    """One reply: ``content`` (None when the reply is only calls), ``tool_calls`` (OpenAI's
    ``{"id", "type": "function", "function": {"name", "arguments"}}``, arguments a JSON
    string), ``reasoning_content`` (a thinking model's thought), the raw ``text``, the
    finish reason and the request's stats."""

    content: str | None
    text: str
    finish_reason: str
    stats: Any
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    reasoning_content: str | None = None

    def message(self) -> dict[str, Any]:
        """The reply as the conversation's next (assistant) message."""
        out: dict[str, Any] = {"role": "assistant", "content": self.content or ""}
        if self.tool_calls:
            out["tool_calls"] = [dict(c) for c in self.tool_calls]
        return out


def chat_result(text: str, finish_reason: str, stats: Any,
                parser: ToolCallParser | None) -> ChatResult:
    """A reply's :class:`ChatResult` (without a parser the text is the content)."""
    if parser is None:
        return ChatResult(text, text, finish_reason, stats)
    msg = parser.parse(text)
    return ChatResult(msg.get("content"), text, finish_reason, stats,
                      list(msg.get("tool_calls") or []), msg.get("reasoning_content"))


__all__ = ["ChatResult", "ToolCallParser", "chat_prompt", "chat_result", "prepare_chat",
           "tool_call_parser"]
