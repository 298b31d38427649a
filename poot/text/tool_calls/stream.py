"""A model's answer split into reasoning, content and tool calls: whole
(:meth:`OutputParser.parse`) or streamed (:class:`StreamParser`: text deltas in, OpenAI's
delta fields out).

Streaming works by scanning the text so far after each delta (every field of a scan only
grows as the text grows: :mod:`poot.text.tool_calls.formats`) and sending what is new, so
the deltas of any split of a text reassemble to exactly its whole parse. Markup is held back
while it may still turn out to be markup (a ``<tool_`` at the end of a delta), so it never
leaks into ``content``. The one exception: a call whose text stops being a call after its
name or arguments were streamed (malformed JSON under ``tool_choice: auto``, or a call cut
by ``max_tokens``) is content in the whole parse, while its deltas were already sent as a
call (its text then follows as content at the end of the stream).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from poot.text.tool_calls.formats import Scan, ToolCall, ToolFormat, held_back, new_call_id

THINK_START, THINK_END = "<think>", "</think>"


def prompt_opens_thought(prompt: str) -> bool:
    """The rendered prompt ends inside a ``<think>`` block (DeepSeek-R1's and some Qwen 3
    templates open it in the generation prompt): the answer starts as reasoning."""
    return prompt.rfind(THINK_START) > prompt.rfind(THINK_END)


def split_reasoning(text: str, final: bool, in_thought: bool) -> tuple[str | None, str]:
    """``(reasoning, answer)`` of ``text``: the thought between ``<think>`` and
    ``</think>`` (``in_thought``: the text starts inside one), the rest the answer (leading
    whitespace dropped). Reasoning is None when the text has no thought. Not ``final``:
    markup that may still complete is held back."""
    k = 0
    if not in_thought:
        k = len(text) - len(text.lstrip())
        rest = text[k:]
        if not rest.startswith(THINK_START):
            if not final and THINK_START.startswith(rest):
                return None, ""
            return None, text.lstrip()
        k += len(THINK_START)
    end = text.find(THINK_END, k)
    if end < 0:
        return (text[k:] if final else held_back(text[k:], (THINK_END,))), ""
    return text[k:end], text[end + len(THINK_END):].lstrip()


@dataclass
class Parsed:
    """A whole answer: ``content`` (None when empty), ``reasoning`` (None without a
    reasoning parser or thought), ``tool_calls``."""

    content: str | None
    reasoning: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)

    def message(self) -> dict[str, Any]:
        """OpenAI's chat ``message`` (``tool_calls`` only when there are calls;
        ``reasoning_content`` only when reasoning is parsed)."""
        out: dict[str, Any] = {"role": "assistant", "content": self.content, "refusal": None}
        if self.reasoning is not None:
            out["reasoning_content"] = self.reasoning
        if self.tool_calls:
            out["tool_calls"] = [c.openai() for c in self.tool_calls]
        return out


@dataclass
class ToolCallDelta:
    """One piece of a streamed call: the first of each call carries ``id`` and ``name``."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""

    def openai(self) -> dict[str, Any]:
        """OpenAI's ``delta.tool_calls[i]`` shape."""
        fn: dict[str, Any] = {"arguments": self.arguments}
        if self.name is not None:
            fn = {"name": self.name, **fn}
        out: dict[str, Any] = {"index": self.index}
        if self.id is not None:
            out.update(id=self.id, type="function")
        out["function"] = fn
        return out


@dataclass
class Delta:
    """What one text delta added: content, reasoning and call pieces (all may be empty)."""

    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.content or self.reasoning or self.tool_calls)

    def openai(self) -> dict[str, Any]:
        """OpenAI's chat ``delta`` fields (only the non-empty ones)."""
        out: dict[str, Any] = {}
        if self.reasoning:
            out["reasoning_content"] = self.reasoning
        if self.content:
            out["content"] = self.content
        if self.tool_calls:
            out["tool_calls"] = [t.openai() for t in self.tool_calls]
        return out


class OutputParser:
    """How one request's answers are split. ``tools``: the tool-call format (None: no tool
    parsing); ``reasoning``: split ``<think>`` blocks; ``in_thought``: the prompt opened a
    thought (:func:`prompt_opens_thought`)."""

    def __init__(self, tools: ToolFormat | None = None, reasoning: bool = False,
                 in_thought: bool = False):
        self.tools, self.reasoning, self.in_thought = tools, reasoning, in_thought

    @property
    def active(self) -> bool:
        """Anything to parse (else the text is the content, as it streams)."""
        return self.tools is not None or self.reasoning

    def scan(self, text: str, final: bool) -> tuple[str | None, Scan]:
        """``(reasoning, scan of the answer)`` of ``text`` as far as it goes."""
        reasoning, answer = (split_reasoning(text, final, self.in_thought)
                             if self.reasoning else (None, text))
        if self.tools is None:
            return reasoning, Scan(answer)
        return reasoning, self.tools.scan(answer, final)

    def parse(self, text: str, new_id: Callable[[], str] = new_call_id) -> Parsed:
        """The whole answer ``text`` parsed."""
        sp = StreamParser(self, new_id)
        sp.push(text, final=True)
        return sp.result()


class StreamParser:
    """Text deltas in, :class:`Delta` out (one parser per choice)."""

    def __init__(self, parser: OutputParser, new_id: Callable[[], str] = new_call_id):
        self.parser, self.new_id = parser, new_id
        self.text = ""
        self.sent_content = 0
        self.sent_reasoning = 0
        self.sent_args: list[int] = []       # per call whose header went out: args sent
        self.ids: list[str] = []
        self.last: tuple[str | None, Scan] = (None, Scan())

    def push(self, text: str, final: bool = False) -> Delta:
        """Take the next text delta (``final``: the text is complete); what is new."""
        self.text += text
        reasoning, scan = self.last = self.parser.scan(self.text, final)
        out = Delta()
        if reasoning is not None and len(reasoning) > self.sent_reasoning:
            out.reasoning = reasoning[self.sent_reasoning:]
            self.sent_reasoning = len(reasoning)
        if len(scan.content) > self.sent_content:
            out.content = scan.content[self.sent_content:]
            self.sent_content = len(scan.content)
        for k, call in enumerate(scan.calls):
            if call.name is None:
                break
            if k == len(self.sent_args):
                self.ids.append(self.new_id())
                self.sent_args.append(len(call.arguments))
                out.tool_calls.append(ToolCallDelta(k, self.ids[k], call.name,
                                                    call.arguments))
            elif len(call.arguments) > self.sent_args[k]:
                out.tool_calls.append(ToolCallDelta(k, arguments=call.arguments[
                    self.sent_args[k]:]))
                self.sent_args[k] = len(call.arguments)
        return out

    def finish(self) -> Delta:
        """The text is complete: what was held back."""
        return self.push("", final=True)

    def result(self) -> Parsed:
        """The whole answer (after :meth:`finish`)."""
        reasoning, scan = self.last
        calls = [ToolCall(self.ids[k] if k < len(self.ids) else self.new_id(), c.name,
                          c.arguments) for k, c in enumerate(scan.calls)
                 if c.done and c.name is not None]
        return Parsed(scan.content or None, reasoning, calls)


__all__ = ["Delta", "OutputParser", "Parsed", "StreamParser", "THINK_END", "THINK_START",
           "ToolCallDelta", "prompt_opens_thought", "split_reasoning"]
