"""``POST /v1/responses`` requests (OpenAI's Responses API) and their translation into chat
completion requests.

The Responses route is a translation layer over ``/v1/chat/completions``: a request becomes
a chat completion request in OpenAI's public chat shapes (:func:`to_chat`), and errors the
chat path reports about its fields are renamed back to the Responses fields that carried
them (:class:`FieldNames`).

What maps to what:

* ``instructions`` -> a leading ``system`` message; ``input`` as a string -> one ``user``
  message; ``input`` items: ``message`` items (``input_text`` / ``output_text`` /
  ``refusal`` parts joined) -> messages of their role; ``function_call`` items -> the
  ``tool_calls`` of an assistant message (consecutive calls, and a call right after an
  assistant message, share one); ``function_call_output`` items -> ``tool`` messages
  (``call_id`` -> ``tool_call_id``); ``reasoning`` items are dropped (the chat template
  renders no earlier thought).
* ``tools`` (function tools, flattened) -> chat ``tools`` (``{"type": "function",
  "function": {...}}``); ``tool_choice`` (``{"type": "function", "name"}`` -> ``{"type":
  "function", "function": {"name"}}``); ``parallel_tool_calls``.
* ``text.format`` -> ``response_format``; ``max_output_tokens`` ->
  ``max_completion_tokens``; ``temperature``, ``top_p``, ``user`` as they are.

The server keeps no state. A request that needs it is a 400 naming the field:
``previous_response_id``, ``conversation``, ``prompt`` (stored prompts), ``background:
true``, ``store: true``, an ``item_reference`` input item, and built-in (hosted) tools. An
absent ``store`` is accepted and the response is not stored: OpenAI's default is ``true``,
but the official clients send no ``store`` unless the caller sets it, so refusing an absent
one would refuse every default request; every response says ``"store": false``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Union

from pydantic import ConfigDict, Discriminator, Field, Tag, ValidationError

from poot.serve.errors import APIError, bad_request, field_path
from poot.serve.protocol import _Strict

#: most input items, tools and content parts one request may give
MAX_ITEMS = 2048
MAX_TOOLS = 128


class InputText(_Strict):
    """An ``input_text`` content part."""

    type: Literal["input_text"]
    text: str


class OutputText(_Strict):
    """An ``output_text`` content part (an earlier assistant answer sent back)."""

    type: Literal["output_text"]
    text: str
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None


class RefusalPart(_Strict):
    """A ``refusal`` content part (an earlier assistant refusal sent back)."""

    type: Literal["refusal"]
    refusal: str


def _by_type(kinds: dict[str, type], default: str | None = None) -> Any:
    """A union of the models in ``kinds`` (``type`` value -> model) told apart by the
    ``type`` field (``default`` when absent). Tags are the models' names, which
    :func:`~poot.serve.errors.field_path` leaves out of an error's field, and an unknown
    ``type`` is an error naming the item."""
    tags = {k: m.__name__ for k, m in kinds.items()}

    def kind(v: Any) -> str | None:
        t = v.get("type", default) if isinstance(v, dict) else getattr(v, "type", None)
        return tags.get(t) if isinstance(t, str) else None

    expected = ", ".join(kinds)
    return Annotated[Union[tuple(Annotated[m, Tag(m.__name__)] for m in kinds.values())],
                     Discriminator(kind, custom_error_type="unsupported_type",
                                   custom_error_message=f"unsupported 'type' (this server "
                                   f"takes {expected})")]


def _text_or(items: Any) -> Any:
    """``str | list[items]`` told apart by the value's kind, so that an error inside the
    list names its element (not "should be a valid string")."""
    def kind(v: Any) -> str | None:
        return "str" if isinstance(v, str) else "list[items]" if isinstance(v, list) else None

    return Annotated[Union[Annotated[str, Tag("str")],
                           Annotated[list[items], Field(max_length=MAX_ITEMS),
                                     Tag("list[items]")]],
                     Discriminator(kind, custom_error_type="string_or_list",
                                   custom_error_message="must be a string or a list")]


ContentPart = _by_type({"input_text": InputText, "output_text": OutputText,
                        "refusal": RefusalPart})


def _part_text(part: InputText | OutputText | RefusalPart) -> str:
    return part.refusal if isinstance(part, RefusalPart) else part.text


class MessageItem(_Strict):
    """A ``message`` input item (``type`` may be left out, as OpenAI's easy input message)."""

    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: _text_or(ContentPart)
    id: str | None = Field(None, max_length=256)
    status: Literal["in_progress", "completed", "incomplete"] | None = None
    phase: Literal["commentary", "final_answer"] | None = None

    def text(self) -> str:
        """The content as one string (parts joined with no separator)."""
        if isinstance(self.content, str):
            return self.content
        return "".join(_part_text(p) for p in self.content)


class FunctionCallItem(_Strict):
    """A ``function_call`` input item: a call the model made, sent back."""

    type: Literal["function_call"]
    call_id: str = Field(min_length=1, max_length=256)
    name: str = Field(min_length=1, max_length=256)
    arguments: str
    id: str | None = Field(None, max_length=256)
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class FunctionCallOutputItem(_Strict):
    """A ``function_call_output`` input item: a call's result."""

    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1, max_length=256)
    output: _text_or(_by_type({"input_text": InputText}))
    id: str | None = Field(None, max_length=256)
    status: Literal["in_progress", "completed", "incomplete"] | None = None

    def text(self) -> str:
        """The output as one string."""
        if isinstance(self.output, str):
            return self.output
        return "".join(p.text for p in self.output)


class ReasoningItem(_Strict):
    """A ``reasoning`` input item (an earlier thought sent back; dropped)."""

    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)

    type: Literal["reasoning"]
    id: str | None = Field(None, max_length=256)
    summary: list[Any] = Field(default_factory=list, max_length=MAX_ITEMS)


class ItemReference(_Strict):
    """An ``item_reference`` input item (names a stored item: refused, nothing is stored)."""

    type: Literal["item_reference"]
    id: str = Field(max_length=256)


#: one ``input`` item, told apart by its ``type`` (``message`` when absent)
InputItem = _by_type({"message": MessageItem, "function_call": FunctionCallItem,
                      "function_call_output": FunctionCallOutputItem,
                      "reasoning": ReasoningItem, "item_reference": ItemReference},
                     default="message")


class TextFormat(_Strict):
    """``text.format``: ``{"type": "text"}``, ``{"type": "json_object"}`` or ``{"type":
    "json_schema", "name", "schema", "description", "strict"}`` (the schema is always
    enforced)."""

    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False,
                              populate_by_name=True)

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = Field(None, max_length=256)
    json_schema: dict[str, Any] | None = Field(None, alias="schema")
    description: str | None = None
    strict: bool | None = None


class TextConfig(_Strict):
    """``text``: the output's ``format`` (and ``verbosity``, accepted and ignored)."""

    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ResponsesRequest(_Strict):
    """``POST /v1/responses`` (stateless; the module doc says what maps to what)."""

    model: str = Field(max_length=256)
    input: _text_or(InputItem)
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    stream: bool = False
    # need server-side state: refused unless absent (or false)
    store: bool | None = None
    background: bool | None = None
    previous_response_id: str | None = Field(None, max_length=256)
    conversation: Any = None
    prompt: Any = None
    truncation: Literal["disabled", "auto"] | None = None
    # accepted and ignored: they do not change what is generated
    reasoning: dict[str, Any] | None = Field(None, max_length=8)
    include: list[str] | None = Field(None, max_length=32)
    metadata: dict[str, str] | None = Field(None, max_length=16)
    user: str | None = Field(None, max_length=256)
    safety_identifier: str | None = Field(None, max_length=256)
    prompt_cache_key: str | None = Field(None, max_length=256)
    service_tier: str | None = Field(None, max_length=64)
    stream_options: dict[str, Any] | None = Field(None, max_length=8)


def _stateless(req: ResponsesRequest) -> None:
    """400 naming the first field that needs server-side state."""
    why = "this server is stateless: it stores no responses"
    if req.previous_response_id is not None:
        raise bad_request("previous_response_id", f"previous_response_id is not supported: "
                          f"{why}; send the conversation's items in 'input'",
                          "unsupported_parameter")
    if req.store:
        raise bad_request("store", f"store: true is not supported: {why} (leave store out "
                          f"or set it to false)", "unsupported_parameter")
    if req.background:
        raise bad_request("background", f"background responses are not supported: {why}",
                          "unsupported_parameter")
    if req.conversation is not None:
        raise bad_request("conversation", f"conversations are not supported: {why}; send "
                          f"the conversation's items in 'input'", "unsupported_parameter")
    if req.prompt is not None:
        raise bad_request("prompt", "stored prompt templates are not supported: this server "
                          "stores no prompts", "unsupported_parameter")
    if req.truncation == "auto":
        raise bad_request("truncation", "truncation: auto is not supported (only "
                          "\"disabled\": a request that does not fit the context is a 400)",
                          "unsupported_parameter")
    if req.stream_options is not None and not req.stream:
        raise bad_request("stream_options", "stream_options is only allowed when stream is "
                          "true")


@dataclass
class FieldNames:
    """Where each chat message came from, so that an error about a chat field names the
    Responses field: ``messages[k]`` -> its item (``input[i]``, ``instructions``,
    ``input``), ``messages[k].tool_calls[j]`` -> the ``function_call`` item of call ``j``."""

    messages: list[str] = field(default_factory=list)
    calls: dict[int, list[str]] = field(default_factory=dict)
    #: indexes of the ``tool`` messages (their content is the item's ``output``)
    outputs: set[int] = field(default_factory=set)

    _MESSAGE = re.compile(r"^messages\[(\d+)\](?:\.tool_calls\[(\d+)\])?(.*)$")
    #: chat field suffix -> Responses field suffix, within one item
    _SUFFIX = {".tool_call_id": ".call_id", ".function.arguments": ".arguments",
               ".function.name": ".name", ".function": "", ".id": ".call_id"}
    _TOP = {"max_tokens": "max_output_tokens", "max_completion_tokens": "max_output_tokens",
            "messages": "input"}

    def param(self, chat_param: str | None) -> str | None:
        """The Responses field of chat field ``chat_param`` (None stays None)."""
        if chat_param is None:
            return None
        m = self._MESSAGE.match(chat_param)
        if m:
            k, j, rest = int(m[1]), m[2], m[3]
            if k >= len(self.messages):
                return "input"
            base = self.messages[k]
            if j is not None:
                calls = self.calls.get(k, [])
                return calls[int(j)] + self._SUFFIX.get(rest, "") if int(j) < len(calls) \
                    else base
            if base.startswith("input[") and rest.startswith(".content"):
                return base + (".output" if k in self.outputs else ".content")
            return base + self._SUFFIX.get(rest, "") if base.startswith("input[") else base
        if chat_param.startswith("response_format"):
            return "text.format.schema" if ".schema" in chat_param else "text.format"
        t = re.match(r"^tools\[(\d+)\](?:\.function)?(.*)$", chat_param)
        if t:
            return f"tools[{t[1]}]{t[2]}"
        if chat_param.startswith("tool_choice"):
            return "tool_choice.name" if chat_param.endswith(".name") else "tool_choice"
        return self._TOP.get(chat_param, chat_param)

    def rename(self, e: APIError) -> APIError:
        """``e`` (an error of the chat path) naming the Responses field instead."""
        new = self.param(e.param)
        if new == e.param:
            return e
        message = e.message
        if e.param and len(e.param) > 6:   # a distinctive name: say the Responses one
            message = message.replace(e.param, new)
        return APIError(e.status, message, e.type, new, e.code, e.headers)

    def validation_error(self, e: ValidationError) -> APIError:
        """A 400 for a chat request this translation made that the chat model refused."""
        err = e.errors()[0]
        param = self.param(field_path(err.get("loc", ())))
        return bad_request(param, f"invalid value for '{param}': {err.get('msg')}")


def _function_tool(i: int, tool: dict[str, Any]) -> dict[str, Any]:
    """A Responses function tool (flattened) as a chat tool."""
    kind = tool.get("type")
    if kind != "function":
        raise bad_request(f"tools[{i}].type", f"tools[{i}] is a built-in tool ({kind!r}): "
                          f"this server runs only function tools ({{\"type\": \"function\", "
                          f"\"name\", \"parameters\"}}); hosted tools need OpenAI's service",
                          "unsupported_parameter")
    unknown = sorted(set(tool) - {"type", "name", "description", "parameters", "strict"})
    if unknown:
        raise bad_request(f"tools[{i}].{unknown[0]}", f"unsupported parameter "
                          f"'tools[{i}].{unknown[0]}' of a function tool",
                          "unsupported_parameter")
    if not isinstance(tool.get("name"), str) or not tool["name"]:
        raise bad_request(f"tools[{i}].name", f"tools[{i}] needs a 'name' (a non-empty "
                          f"string)", "missing_required_parameter")
    return {"type": "function", "function": {k: v for k, v in tool.items()
                                             if k != "type" and v is not None}}


def _tool_choice(choice: Any) -> Any:
    """A Responses ``tool_choice`` in chat's shape."""
    if choice is None or choice in ("none", "auto", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        name = choice.get("name")
        if not isinstance(name, str) or set(choice) != {"type", "name"}:
            raise bad_request("tool_choice", "a function tool_choice is {\"type\": "
                              "\"function\", \"name\": \"<tool name>\"}")
        return {"type": "function", "function": {"name": name}}
    if isinstance(choice, dict):
        raise bad_request("tool_choice", f"tool_choice of type {choice.get('type')!r} is not "
                          f"supported: this server runs only function tools (\"none\", "
                          f"\"auto\", \"required\" or {{\"type\": \"function\", \"name\"}})",
                          "unsupported_parameter")
    raise bad_request("tool_choice", "tool_choice must be \"none\", \"auto\", \"required\" "
                      "or {\"type\": \"function\", \"name\": ...}")


def _response_format(fmt: TextFormat | None) -> dict[str, Any] | None:
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "json_object"}
    if fmt.json_schema is None:
        raise bad_request("text.format.schema", "a json_schema text format needs 'schema' "
                          "(the JSON schema)", "missing_required_parameter")
    js = {"name": fmt.name or "response", "schema": fmt.json_schema}
    if fmt.strict is not None:
        js["strict"] = fmt.strict
    return {"type": "json_schema", "json_schema": js}


def _messages(req: ResponsesRequest, names: FieldNames) -> list[dict[str, Any]]:
    """The chat messages of ``instructions`` and ``input`` (module doc)."""
    out: list[dict[str, Any]] = []

    def add(msg: dict[str, Any], source: str) -> None:
        out.append(msg)
        names.messages.append(source)

    if req.instructions is not None:
        add({"role": "system", "content": req.instructions}, "instructions")
    if isinstance(req.input, str):
        add({"role": "user", "content": req.input}, "input")
        return out
    call_ids: set[str] = set()
    for i, item in enumerate(req.input):
        where = f"input[{i}]"
        if isinstance(item, MessageItem):
            add({"role": item.role, "content": item.text()}, where)
        elif isinstance(item, FunctionCallItem):
            call = {"id": item.call_id, "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments}}
            call_ids.add(item.call_id)
            if not (out and out[-1]["role"] == "assistant"):
                add({"role": "assistant", "content": ""}, where)
            out[-1].setdefault("tool_calls", []).append(call)
            names.calls.setdefault(len(out) - 1, []).append(where)
        elif isinstance(item, FunctionCallOutputItem):
            if item.call_id not in call_ids:
                raise bad_request(f"{where}.call_id", f"no function_call item before "
                                  f"{where} has call_id {item.call_id!r}")
            names.outputs.add(len(out))
            add({"role": "tool", "tool_call_id": item.call_id, "content": item.text()}, where)
        elif isinstance(item, ItemReference):
            raise bad_request(where, "item references are not supported: this server is "
                              "stateless (it stores no items); send the item itself",
                              "unsupported_parameter")
        # ReasoningItem: dropped
    if not out:
        raise bad_request("input", "the input has no message")
    return out


def to_chat(req: ResponsesRequest) -> tuple[dict[str, Any], FieldNames]:
    """The chat completion request (a JSON object in OpenAI's chat shape) of Responses
    request ``req``, and the :class:`FieldNames` that renames the chat path's errors.

    Raises:
        APIError: 400 naming the field, for a request needing server-side state, a built-in
            tool, an unsupported ``tool_choice``, a ``function_call_output`` with no
            matching call, or a json_schema format without a schema.
    """
    _stateless(req)
    names = FieldNames()
    body: dict[str, Any] = {"model": req.model, "messages": _messages(req, names)}
    if req.tools:
        body["tools"] = [_function_tool(i, t) for i, t in enumerate(req.tools)]
    if req.tool_choice is not None:
        body["tool_choice"] = _tool_choice(req.tool_choice)
    fmt = _response_format(req.text.format if req.text is not None else None)
    optional = {"response_format": fmt, "parallel_tool_calls": req.parallel_tool_calls,
                "max_completion_tokens": req.max_output_tokens,
                "temperature": req.temperature, "top_p": req.top_p, "user": req.user}
    body.update({k: v for k, v in optional.items() if v is not None})
    if req.stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body, names


__all__ = ["FieldNames", "FunctionCallItem", "FunctionCallOutputItem", "InputItem",
           "InputText", "ItemReference", "MessageItem", "OutputText", "ReasoningItem",
           "RefusalPart", "ResponsesRequest", "TextConfig", "TextFormat", "to_chat"]
