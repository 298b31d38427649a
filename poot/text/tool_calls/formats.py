"""Tool-call formats: how a model writes a function call in its output, how to find the calls
in that text (whole, or any prefix of it while it streams), and the grammar that constrains
a model to write a valid call.

Formats (:data:`FORMATS`, chosen by :func:`detect_format` from the chat template's text):

* ``hermes`` -- Hermes 2 Pro, Qwen 2.5, Qwen 3: ``<tool_call>\\n{"name": ..., "arguments":
  {...}}\\n</tool_call>``, one block per call, text may come before;
* ``llama3_json`` -- Llama 3.1 / 3.2 / 3.3: ``{"name": ..., "parameters": {...}}`` as the
  whole answer, after an optional ``<|python_tag|>``; several calls separated by ``;``;
* ``mistral`` -- ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]``;
* ``generic`` -- for a template without tool support (SmolLM2-Instruct's): the tools and the
  answer's shape are described in a system message (:meth:`ToolFormat.prepare`) and the
  answer is one JSON object, ``{"tool_calls": [{"name": ..., "arguments": {...}}]}`` or
  ``{"response": "..."}``, constrained to that shape (llama.cpp's server has the same idea).

A format's :meth:`ToolFormat.scan` reads a text that may be cut anywhere and returns what is
certain in it: the content so far and the calls so far (a call's name once complete, its
arguments' JSON text as far as written). As the text grows every field only grows, so a
stream's deltas are differences of successive scans (:mod:`poot.text.tool_calls.stream`).
Arguments are the model's own JSON text of the arguments object (not re-serialized), so a
streamed call reassembles to exactly the non-streamed one.
"""

from __future__ import annotations

import abc
import json
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

from poot.text.tool_calls.scan import (Malformed, array_elements, loads, object_members, skip_ws,
                                       string_prefix)


@dataclass
class ToolCall:
    """One parsed call: ``arguments`` is the JSON text of the arguments object."""

    id: str
    name: str
    arguments: str

    def openai(self) -> dict[str, Any]:
        """OpenAI's ``message.tool_calls[i]`` shape."""
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class PartialCall:
    """A call as far as the text goes: ``name`` None until its string is complete;
    ``arguments`` the arguments' JSON text so far; ``done`` once the call is closed."""

    name: str | None
    arguments: str = ""
    done: bool = False


@dataclass
class Scan:
    """What a (possibly cut) text certainly holds: its content text and calls so far."""

    content: str = ""
    calls: list[PartialCall] = field(default_factory=list)


def new_call_id() -> str:
    """A tool-call id, ``call_`` and 24 hex digits (OpenAI's form)."""
    return "call_" + uuid.uuid4().hex[:24]


def held_back(tail: str, markers: tuple[str, ...]) -> str:
    """``tail`` less its longest suffix that may be the start of one of ``markers``."""
    for k in range(min(len(tail), max(len(m) for m in markers) - 1), 0, -1):
        if any(m.startswith(tail[-k:]) for m in markers):
            return tail[:-k]
    return tail


def _call_at(s: str, i: int) -> tuple[PartialCall, int | None]:
    """The call object starting at ``s[i]`` as far as written, and its end (None: open).
    Raises :class:`Malformed` for an object that is no call."""
    members, end = object_members(s, i)
    call = PartialCall(None)
    for m in members:
        if m.key == "name" and m.end is not None:
            name = loads(s[m.start:m.end])
            if not isinstance(name, str) or not name:
                raise Malformed("the call's name is not a string")
            call.name = name
        elif m.key in ("arguments", "parameters"):
            if s[m.start] == "{":
                call.arguments = s[m.start:len(s) if m.end is None else m.end]
            elif s[m.start] == '"' and m.end is not None:   # arguments as a JSON string
                call.arguments = loads(s[m.start:m.end])
            elif s[m.start] != '"':
                raise Malformed("the call's arguments are not an object")
    if end is not None:
        obj = loads(s[i:end])
        args = loads(call.arguments) if call.arguments else {}
        if call.name is None or not isinstance(args, dict) or \
                set(obj) - {"name", "arguments", "parameters", "id"}:
            raise Malformed("not a call object")
        call.arguments = call.arguments or "{}"
        call.done = True
    return call, end


def _calls_seq(s: str, i: int, sep: str) -> tuple[list[PartialCall], int | None]:
    """Call objects from ``s[i]`` separated by whitespace or ``sep``; the end of the last
    complete one (None while one is open). Raises :class:`Malformed`."""
    calls: list[PartialCall] = []
    j = skip_ws(s, i)
    while j < len(s):
        call, end = _call_at(s, j)
        calls.append(call)
        if end is None:
            return calls, None
        j = skip_ws(s, end)
        if j < len(s) and sep and s[j] == sep:
            j = skip_ws(s, j + 1)
    return calls, j


def _calls_array(s: str, i: int) -> tuple[list[PartialCall], int | None]:
    """The call objects of the JSON array at ``s[i]``; the array's end (None while open)."""
    calls: list[PartialCall] = []
    elements, end = array_elements(s, i)
    for start, _ in elements:
        calls.append(_call_at(s, start)[0])
    if end is not None and not calls:
        raise Malformed("no calls")
    return calls, end


def _trimmed(segments: list[str], final: bool) -> str:
    """Content text of ``segments``: leading whitespace dropped, trailing whitespace held
    back until more text follows it (dropped at the end), so the content grows monotonically
    while the text streams and equals the whole text's content stripped."""
    text = "".join(segments).lstrip()
    return text.rstrip() if final or text.rstrip() != text else text


class ToolFormat(abc.ABC):
    """A tool-call format (base class). ``name``: its ``--tool-call-parser`` name."""

    name = ""
    #: the key of a call's arguments (``arguments``, or ``parameters`` for Llama)
    args_key = "arguments"

    @abc.abstractmethod
    def scan(self, text: str, final: bool) -> Scan:
        """Content and calls of ``text`` (``final``: the text is complete; calls that do
        not parse are then content)."""

    def prepare(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                choice: str | None) -> list[dict[str, Any]]:
        """Messages as the chat template gets them: an assistant message's
        ``tool_calls[i].function.arguments`` as an object (the JSON string decoded, as HF
        templates expect), the rest unchanged. ``choice``: None (auto), ``"required"`` or a
        tool's name."""
        out = []
        for m in messages:
            if m.get("tool_calls"):
                m = {**m, "tool_calls": [_decoded_call(c) for c in m["tool_calls"]]}
            out.append(m)
        return out

    @abc.abstractmethod
    def guide(self, tools: list[dict[str, Any]], choice: str | None, parallel: bool,
              special_id: Callable[[str], int | None], json_options: dict[str, Any]) \
            -> tuple[str, Any] | None:
        """The constraint on an answer, as ``(kind, spec)`` of a guided-decoding guide
        (``"grammar"``: Lark text; ``"json_schema"``: a schema); None for no constraint.
        ``choice``: None (auto), ``"required"`` or one tool's name; ``parallel``: several
        calls allowed; ``special_id(text)``: the id of a special token of that text, or
        None; ``json_options``: llguidance's JSON options for the schemas inside a grammar."""


def _decoded_call(call: dict[str, Any]) -> dict[str, Any]:
    fn = call.get("function") or {}
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            pass
    return {**call, "function": {**fn, "arguments": args}}


def call_schema(fn: dict[str, Any], args_key: str = "arguments") -> dict[str, Any]:
    """The JSON schema of one call of function ``fn`` (OpenAI's ``{"name", "parameters"}``):
    ``{"name": <its name>, args_key: <its parameters>}``, in that order."""
    params = fn.get("parameters") or {"type": "object", "properties": {}}
    return {"type": "object",
            "properties": {"name": {"const": fn["name"]}, args_key: params},
            "required": ["name", args_key], "additionalProperties": False}


def _calls_schema(tools: list[dict[str, Any]], choice: str | None, args_key: str) -> dict:
    fns = [t["function"] for t in tools
           if choice in (None, "required") or t["function"]["name"] == choice]
    schemas = [call_schema(f, args_key) for f in fns]
    return schemas[0] if len(schemas) == 1 else {"anyOf": schemas}


def _many(choice: str | None, parallel: bool) -> bool:
    """Several calls may come: parallel calls allowed and no one tool forced."""
    return parallel and choice in (None, "required")


def _lark_json(schema: dict[str, Any], json_options: dict[str, Any]) -> str:
    return "%json" + json.dumps({**schema, "x-guidance": json_options})


class HermesFormat(ToolFormat):
    """``<tool_call>{json}</tool_call>`` blocks (Hermes 2 Pro, Qwen 2.5, Qwen 3)."""

    name = "hermes"
    START, END = "<tool_call>", "</tool_call>"

    def scan(self, text: str, final: bool) -> Scan:
        segments: list[str] = []
        calls: list[PartialCall] = []
        pos = 0
        while True:
            i = text.find(self.START, pos)
            if i < 0:
                tail = text[pos:]
                segments.append(tail if final else held_back(tail, (self.START,)))
                break
            segments.append(text[pos:i])
            try:
                call, after = self._block(text, i + len(self.START), final)
            except Malformed:                  # up to the closing tag (or all) is content
                j = text.find(self.END, i + len(self.START))
                if j < 0 and not final:        # wait: at the end it will be content
                    return Scan(_trimmed(segments, False), calls)
                pos = len(text) if j < 0 else j + len(self.END)
                segments.append(text[i:pos])
                continue
            if call is not None:
                calls.append(call)
            if after is None:
                return Scan(_trimmed(segments, False), calls)
            pos = after
        return Scan(_trimmed(segments, final), calls)

    def _block(self, text: str, b: int, final: bool) -> tuple[PartialCall | None, int | None]:
        """The call of the block whose body starts at ``text[b]`` and where the text goes
        on after its closing tag (None: not there yet). Raises :class:`Malformed`."""
        k = skip_ws(text, b)
        if k >= len(text):
            if final:
                raise Malformed("an empty call block")
            return None, None
        call, end = _call_at(text, k)
        if end is None:
            if final:
                raise Malformed("an unfinished call")
            return call, None
        e = skip_ws(text, end)
        if text.startswith(self.END, e):
            return call, e + len(self.END)
        if e >= len(text) or (not final and self.END.startswith(text[e:])):
            return call, (len(text) if final else None)     # a missing closing tag at the end
        raise Malformed("text after the call in its block")

    def guide(self, tools, choice, parallel, special_id, json_options):
        body = _lark_json(_calls_schema(tools, choice, self.args_key), json_options)
        more = ' ("\\n" call)*' if _many(choice, parallel) else ""
        rules = f'call: "<tool_call>\\n" body "\\n</tool_call>"\nbody: {body}\n'
        if choice is not None:
            return "grammar", f"start: call{more}\n" + rules
        # auto: free text, or text up to a first <tool_call>, then only calls (constrained)
        return "grammar", (f"start: TEXT? | pre first{more}\n"
                           f'pre[lazy]: /(.|\\n)*/ "<tool_call>"\n'
                           f'first: "\\n" body "\\n</tool_call>"\n'
                           f"TEXT: /(.|\\n)+/\n" + rules)


class _LeadingFormat(ToolFormat):
    """Calls that are the whole answer, after an optional marker (``MARKER``; a special
    token the detokenizer may have dropped, so the bare JSON is accepted too)."""

    MARKER = ""
    #: how the calls' JSON starts (its first character opens them), and what that is
    OPEN, WHAT = "{", "a call object"

    def _body(self, text: str, b: int) -> tuple[list[PartialCall], int | None]:
        """The calls whose JSON starts at ``text[b]`` and where it ends (None: not yet).
        Raises :class:`Malformed`."""
        if text[b] != self.OPEN[0]:
            raise Malformed(f"not {self.WHAT}")
        return self._calls(text, b)

    @abc.abstractmethod
    def _calls(self, text: str, b: int) -> tuple[list[PartialCall], int | None]:
        """:meth:`_body` past its check of the first character."""

    def scan(self, text: str, final: bool) -> Scan:
        k = skip_ws(text, 0)
        rest = text[k:]
        m = text.find(self.MARKER)
        if m >= 0:
            b, before = skip_ws(text, m + len(self.MARKER)), text[:m]
        elif rest.startswith(self.OPEN):
            b, before = k, ""
        else:
            if not final and (self.MARKER.startswith(rest) or rest == ""):
                return Scan()
            return Scan(_trimmed([text if final else held_back(text, (self.MARKER,))], final))
        if b >= len(text):
            if final:
                return Scan(_trimmed([text], True))
            return Scan(_trimmed([before], False))
        try:
            calls, end = self._body(text, b)
            if final and (end is None or skip_ws(text, end) < len(text) or
                          not all(c.done for c in calls)):
                raise Malformed("not complete calls")
        except Malformed:
            return Scan(_trimmed([text], True) if final else _trimmed([before], False))
        return Scan(_trimmed([before], final), calls)


class Llama3JsonFormat(_LeadingFormat):
    """Llama 3.x JSON calls: ``{"name": ..., "parameters": {...}}`` (``;`` between calls)
    after an optional ``<|python_tag|>``."""

    name = "llama3_json"
    args_key = "parameters"
    MARKER = "<|python_tag|>"

    def _calls(self, text, b):
        return _calls_seq(text, b, ";")

    def guide(self, tools, choice, parallel, special_id, json_options):
        body = _lark_json(_calls_schema(tools, choice, self.args_key), json_options)
        calls = 'body ("; " body)*' if _many(choice, parallel) else "body"
        if choice is not None:
            return "grammar", f"start: {calls}\nbody: {body}\n"
        # auto: text that does not start with "{", or calls (constrained)
        return "grammar", (f"start: TEXT? | {calls}\nTEXT: /[^{{\\s](.|\\n)*/\n"
                           f"body: {body}\n")


class MistralFormat(_LeadingFormat):
    """Mistral's ``[TOOL_CALLS]`` followed by a JSON array of calls."""

    name = "mistral"
    MARKER = "[TOOL_CALLS]"
    OPEN, WHAT = "[{", "a call array"

    def _calls(self, text, b):
        return _calls_array(text, b)

    def guide(self, tools, choice, parallel, special_id, json_options):
        items = _calls_schema(tools, choice, self.args_key)
        arr = {"type": "array", "items": items, "minItems": 1}
        if not _many(choice, parallel):
            arr["maxItems"] = 1
        tid = special_id(self.MARKER)
        tag = f"<[{tid}]>" if tid is not None else json.dumps(self.MARKER)
        rules = f"body: {_lark_json(arr, json_options)}\n"
        if choice is not None:
            return "grammar", f'start: {tag} " "? body\n' + rules
        # auto: free text, or text up to the tag, then the calls (constrained)
        pre = f"TEXT? {tag}" if tid is not None else "pre"
        return "grammar", (f'start: TEXT? | {pre} " "? body\n'
                           f"pre[lazy]: /(.|\\n)*/ {tag}\nTEXT: /(.|\\n)+/\n" + rules)


GENERIC_PROMPT = (
    "You can call these tools (each with the JSON schema of its arguments):\n{tools}\n\n"
    "Answer with one JSON object and nothing else: {shape}")
_SHAPE_CALL = '{"tool_calls": [{"name": <tool name>, "arguments": <its arguments>}]} to ' \
              "call {which}"
_SHAPE_TEXT = ', or {"response": <your answer>} to answer the user directly'


class GenericFormat(ToolFormat):
    """A JSON answer for templates without tool support: ``{"tool_calls": [...]}`` or
    ``{"response": "..."}``, described in a system message and always constrained."""

    name = "generic"

    def scan(self, text: str, final: bool) -> Scan:
        k = skip_ws(text, 0)
        if k >= len(text):
            return Scan(text if final else "")
        try:
            return self._scan_object(text, k, final)
        except Malformed:
            return Scan(text if final else "")

    def _scan_object(self, text: str, k: int, final: bool) -> Scan:
        members, end = object_members(text, k)
        if final and (end is None or skip_ws(text, end) < len(text) or len(members) != 1):
            raise Malformed("not one answer object")
        if not members:
            return Scan()
        m = members[0]
        if m.key == "response":
            if text[m.start] != '"':
                raise Malformed("the response is not a string")
            raw = text[m.start + 1:(m.end - 1) if m.end is not None else len(text)]
            return Scan(string_prefix(raw) if m.end is None else loads(text[m.start:m.end]))
        if m.key == "tool_calls" and text[m.start] == "[":
            calls, _ = _calls_array(text, m.start)
            return Scan("", calls)
        raise Malformed("neither tool_calls nor response")

    def prepare(self, messages, tools, choice):
        names: dict[str, str] = {}
        out = [self._plain(m, names) for m in messages]
        if not tools:
            return out
        fns = [t["function"] for t in tools
               if choice in (None, "required") or t["function"]["name"] == choice]
        listing = json.dumps([{k: f[k] for k in ("name", "description", "parameters")
                               if k in f} for f in fns], ensure_ascii=False, indent=1)
        which = f"the tool {choice}" if choice not in (None, "required") else \
            "one or more tools"
        shape = _SHAPE_CALL.replace("{which}", which) + ("" if choice else _SHAPE_TEXT)
        prompt = GENERIC_PROMPT.format(tools=listing, shape=shape + ".")
        if out and out[0].get("role") in ("system", "developer"):
            out[0] = {**out[0], "content": f"{out[0].get('content') or ''}\n\n{prompt}"}
        else:
            out.insert(0, {"role": "system", "content": prompt})
        return out

    @staticmethod
    def _plain(m: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
        """A message in the generic format: an assistant's calls as its ``{"tool_calls":
        [...]}`` answer, a tool result as a user message ``Tool result (<tool name>): ...``
        (``names``: call id -> tool name, filled from the assistant messages)."""
        if m.get("tool_calls"):
            calls = [_decoded_call(c)["function"] for c in m["tool_calls"]]
            names.update({c.get("id"): f.get("name") for c, f in zip(m["tool_calls"], calls)})
            m = {k: v for k, v in m.items() if k != "tool_calls"}
            m["content"] = json.dumps({"tool_calls": calls}, ensure_ascii=False)
        elif m.get("role") == "tool":
            name = names.get(m.get("tool_call_id")) or m.get("tool_call_id")
            m = {"role": "user", "content": f"Tool result ({name}): {m.get('content') or ''}"}
        return m

    def guide(self, tools, choice, parallel, special_id, json_options):
        arr: dict[str, Any] = {"type": "array",
                               "items": _calls_schema(tools, choice, self.args_key),
                               "minItems": 1}
        if not parallel:
            arr["maxItems"] = 1
        calls = {"type": "object", "properties": {"tool_calls": arr},
                 "required": ["tool_calls"], "additionalProperties": False}
        if choice is not None:
            return "json_schema", calls
        text = {"type": "object", "properties": {"response": {"type": "string"}},
                "required": ["response"], "additionalProperties": False}
        return "json_schema", {"anyOf": [calls, text]}


#: ``--tool-call-parser`` names -> formats
FORMATS: dict[str, ToolFormat] = {f.name: f for f in (HermesFormat(), Llama3JsonFormat(),
                                                      MistralFormat(), GenericFormat())}


def detect_format(template: str | None) -> ToolFormat:
    """The tool-call format a chat template's text implies: its own call markup
    (``<tool_call>``, ``[TOOL_CALLS]``, ``<|python_tag|>`` or Llama 3's ``"parameters"``
    with the ``ipython`` role), else ``generic``."""
    t = template or ""
    if "<tool_call>" in t:
        return FORMATS["hermes"]
    if "[TOOL_CALLS]" in t:
        return FORMATS["mistral"]
    if "<|python_tag|>" in t or ("ipython" in t and "parameters" in t):
        return FORMATS["llama3_json"]
    return FORMATS["generic"]


__all__ = ["FORMATS", "GENERIC_PROMPT", "GenericFormat", "HermesFormat", "Llama3JsonFormat",
           "MistralFormat", "PartialCall", "Scan", "ToolCall", "ToolFormat", "call_schema",
           "detect_format", "new_call_id"]
