"""Chat completion results -> OpenAI Responses objects and their typed stream events.

:class:`ResponseBuilder` reads what the chat path answers, in OpenAI's public chat shapes --
a ``chat.completion`` (``message.content``, ``message.reasoning_content`` (vLLM's field),
``message.tool_calls``) or its ``chat.completion.chunk`` stream (``delta.content``,
``delta.reasoning_content``, ``delta.tool_calls`` with ``index`` / ``id`` /
``function.name`` / ``function.arguments`` pieces, ``finish_reason``, the usage chunk) --
and builds the Response's ``output`` items: a ``reasoning`` item (its text as a
``reasoning_text`` part), a ``message`` item (one ``output_text`` part) and one
``function_call`` item per call, in the order they began. While it builds it gives the
stream's events: ``response.created``, ``response.in_progress``,
``response.output_item.added``, ``response.content_part.added``,
``response.reasoning_text.delta`` / ``.done``, ``response.output_text.delta`` / ``.done``,
``response.function_call_arguments.delta`` / ``.done``, ``response.content_part.done``,
``response.output_item.done`` and at the end ``response.completed`` (``response.incomplete``
when the output ran into ``max_output_tokens``, ``response.failed`` on an error), each with
its ``sequence_number``. A non-streamed completion is fed through the same builder (its
message as one delta), so both give the same ``output``.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, AsyncIterator

from poot.serve.responses import sse
from poot.serve.responses_request import ResponsesRequest


def item_id(prefix: str) -> str:
    """An output item id: ``msg_...``, ``fc_...``, ``rs_...`` (and ``resp_...``)."""
    return f"{prefix}_{uuid.uuid4().hex}"


def responses_usage(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    """A chat ``usage`` object in the Responses shape (``input_tokens``, ``output_tokens``,
    their details, ``total_tokens``)."""
    if usage is None:
        return None
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    reasoning = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0
    return {"input_tokens": usage["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
            "output_tokens": usage["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": reasoning},
            "total_tokens": usage["total_tokens"]}


class ResponseBuilder:
    """One Response built from a chat completion's message or chunks (module doc). Each
    method that changes it returns the stream events the change makes (dicts with ``type``
    and ``sequence_number``)."""

    def __init__(self, rid: str, req: ResponsesRequest):
        self.rid, self.req = rid, req
        self.created_at = int(time.time())
        self.output: list[dict[str, Any]] = []
        self.seq = 0
        self.open: list[int] = []                # output indexes of items not yet done
        self.reasoning: int | None = None        # the open reasoning item's index
        self.message: int | None = None          # the open message item's index
        self.calls: dict[int, int] = {}          # chat tool-call index -> output index
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.error: dict[str, Any] | None = None

    # ---- the Response object -----------------------------------------------------------------
    def status(self) -> str:
        """``failed``, ``incomplete`` (the output hit ``max_output_tokens``), ``completed``
        (finished) or ``in_progress``."""
        if self.error is not None:
            return "failed"
        if self.finish_reason == "length":
            return "incomplete"
        return "completed" if self.finish_reason is not None else "in_progress"

    def response(self) -> dict[str, Any]:
        """The Response object as it stands."""
        req, status = self.req, self.status()
        fmt = req.text.format if req.text is not None and req.text.format is not None \
            else None
        return {
            "id": self.rid, "object": "response", "created_at": self.created_at,
            "status": status, "background": False, "error": self.error,
            "incomplete_details": {"reason": "max_output_tokens"}
            if status == "incomplete" else None,
            "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
            "model": req.model, "output": self.output if status != "in_progress" else [],
            "parallel_tool_calls": req.parallel_tool_calls is not False,
            "previous_response_id": None,
            "reasoning": req.reasoning or {"effort": None, "summary": None},
            "store": False,
            "temperature": 1.0 if req.temperature is None else req.temperature,
            "text": {"format": fmt.model_dump(by_alias=True, exclude_none=True)
                     if fmt is not None else {"type": "text"}},
            "tool_choice": "auto" if req.tool_choice is None else req.tool_choice,
            "tools": list(req.tools or []),
            "top_p": 1.0 if req.top_p is None else req.top_p,
            "truncation": "disabled", "usage": responses_usage(self.usage),
            "user": req.user, "metadata": dict(req.metadata or {})}

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        ev = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return ev

    def start(self) -> list[dict[str, Any]]:
        """``response.created`` and ``response.in_progress``."""
        return [self._event("response.created", response=self.response()),
                self._event("response.in_progress", response=self.response())]

    # ---- items -------------------------------------------------------------------------------
    def _add(self, item: dict[str, Any], part: dict[str, Any] | None) -> list[dict[str, Any]]:
        """Open ``item`` (and its first content ``part``): its index is the new last one."""
        self.output.append(item)
        idx = len(self.output) - 1
        self.open.append(idx)
        evs = [self._event("response.output_item.added", output_index=idx,
                           item=json.loads(json.dumps(item)))]
        if part is not None:
            item["content"].append(part)
            evs.append(self._event("response.content_part.added", item_id=item["id"],
                                   output_index=idx, content_index=0, part=dict(part)))
        return evs

    def _done(self, idx: int) -> list[dict[str, Any]]:
        """Close item ``idx``: its ``.done`` events."""
        self.open.remove(idx)
        item = self.output[idx]
        item["status"] = "incomplete" if self.finish_reason == "length" else "completed"
        where = dict(item_id=item["id"], output_index=idx)
        evs = []
        if item["type"] == "function_call":
            evs.append(self._event("response.function_call_arguments.done",
                                   arguments=item["arguments"], name=item["name"], **where))
        else:
            part = item["content"][0]
            if item["type"] == "message":
                evs.append(self._event("response.output_text.done", content_index=0,
                                       text=part["text"], logprobs=[], **where))
            else:
                evs.append(self._event("response.reasoning_text.done", content_index=0,
                                       text=part["text"], **where))
            evs.append(self._event("response.content_part.done", content_index=0,
                                   part=dict(part), **where))
        evs.append(self._event("response.output_item.done", output_index=idx,
                               item=json.loads(json.dumps(item))))
        if idx == self.message:
            self.message = None
        if idx == self.reasoning:
            self.reasoning = None
        return evs

    def _close(self, *indexes: int | None) -> list[dict[str, Any]]:
        evs: list[dict[str, Any]] = []
        for idx in indexes:
            if idx is not None:
                evs += self._done(idx)
        return evs

    def _reasoning_delta(self, text: str) -> list[dict[str, Any]]:
        evs = []
        if self.reasoning is None:
            evs += self._close(self.message)
            evs += self._add({"type": "reasoning", "id": item_id("rs"), "summary": [],
                              "content": [], "status": "in_progress"},
                             {"type": "reasoning_text", "text": ""})
            self.reasoning = len(self.output) - 1
        idx = self.reasoning
        item = self.output[idx]
        item["content"][0]["text"] += text
        return evs + [self._event("response.reasoning_text.delta", item_id=item["id"],
                                  output_index=idx, content_index=0, delta=text)]

    def _open_message(self) -> list[dict[str, Any]]:
        """A new message item (a thought before it is done)."""
        evs = self._close(self.reasoning)
        evs += self._add({"type": "message", "id": item_id("msg"), "status": "in_progress",
                          "role": "assistant", "content": []},
                         {"type": "output_text", "text": "", "annotations": [],
                          "logprobs": []})
        self.message = len(self.output) - 1
        return evs

    def _text_delta(self, text: str) -> list[dict[str, Any]]:
        evs = self._open_message() if self.message is None else []
        idx = self.message
        item = self.output[idx]
        item["content"][0]["text"] += text
        return evs + [self._event("response.output_text.delta", item_id=item["id"],
                                  output_index=idx, content_index=0, delta=text, logprobs=[])]

    def _call_delta(self, tc: dict[str, Any]) -> list[dict[str, Any]]:
        """One ``delta.tool_calls`` entry: a new call opens a ``function_call`` item (text or
        thought before it is done); its argument pieces are deltas."""
        evs = []
        k = tc.get("index", 0)
        fn = tc.get("function") or {}
        if k not in self.calls:
            evs += self._close(self.reasoning, self.message)
            evs += self._add({"type": "function_call", "id": item_id("fc"),
                              "call_id": tc.get("id") or item_id("call"),
                              "name": fn.get("name") or "", "arguments": "",
                              "status": "in_progress"}, None)
            self.calls[k] = len(self.output) - 1
        idx = self.calls[k]
        item = self.output[idx]
        if fn.get("name") and not item["name"]:
            item["name"] = fn["name"]
        args = fn.get("arguments") or ""
        if args:
            item["arguments"] += args
            evs.append(self._event("response.function_call_arguments.delta",
                                   item_id=item["id"], output_index=idx, delta=args))
        return evs

    # ---- feeding -----------------------------------------------------------------------------
    def delta(self, delta: dict[str, Any]) -> list[dict[str, Any]]:
        """One chat ``delta`` (thought, then text, then tool-call pieces); its events."""
        evs = []
        if delta.get("reasoning_content"):
            evs += self._reasoning_delta(delta["reasoning_content"])
        if delta.get("content"):
            evs += self._text_delta(delta["content"])
        for tc in delta.get("tool_calls") or []:
            evs += self._call_delta(tc)
        return evs

    def finish(self, reason: str | None) -> list[dict[str, Any]]:
        """The choice finished (``stop``, ``length``, ``tool_calls``): every open item is
        done; an empty answer is one empty message."""
        self.finish_reason = reason or "stop"
        evs = [] if self.output else self._open_message()
        return evs + self._close(*list(self.open))

    def fail(self, error: dict[str, Any]) -> list[dict[str, Any]]:
        """The chat path reported ``error`` (``{"message", "type", "param", "code"}``)
        mid-stream: ``response.failed``."""
        self.error = {"code": "server_error" if error.get("type") != "invalid_request_error"
                      else "invalid_prompt", "message": error.get("message", "error"),
                      "type": error.get("type"), "param": error.get("param")}
        return [self._event("response.failed", response=self.response())]

    def end(self) -> list[dict[str, Any]]:
        """The last event: ``response.completed`` (or ``response.incomplete``)."""
        kind = "response.incomplete" if self.status() == "incomplete" else \
            "response.completed"
        return [self._event(kind, response=self.response())]

    def from_completion(self, completion: dict[str, Any]) -> dict[str, Any]:
        """The Response of a non-streamed ``chat.completion``."""
        choice = completion["choices"][0]
        msg = choice["message"]
        self.delta({"reasoning_content": msg.get("reasoning_content"),
                    "content": msg.get("content"),
                    "tool_calls": [dict(tc, index=i)
                                   for i, tc in enumerate(msg.get("tool_calls") or [])]})
        self.finish(choice.get("finish_reason"))
        self.usage = completion.get("usage")
        return self.response()

    def feed_chunk(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        """One ``chat.completion.chunk`` (or an ``{"error"}`` event); its events."""
        if "error" in chunk:
            return self.fail(chunk["error"])
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        evs = []
        for choice in chunk.get("choices") or []:
            evs += self.delta(choice.get("delta") or {})
            if choice.get("finish_reason") is not None:
                evs += self.finish(choice["finish_reason"])
        return evs


def sse_event(event: dict[str, Any]) -> str:
    """One typed server-sent event: ``event: <type>`` and its JSON ``data:`` line."""
    return f"event: {event['type']}\n" + sse(event)


def chat_chunks(raw: str) -> list[dict[str, Any] | None]:
    """The JSON payloads of chat SSE text (``data: {...}`` events; ``[DONE]`` -> None)."""
    out: list[dict[str, Any] | None] = []
    for block in raw.split("\n\n"):
        if block.startswith("data: "):
            data = block[len("data: "):]
            out.append(None if data == "[DONE]" else json.loads(data))
    return out


async def response_events(builder: ResponseBuilder,
                          chat_body: AsyncIterator[str]) -> AsyncIterator[str]:
    """The Responses SSE body of a streamed chat completion's SSE body ``chat_body``."""
    try:
        yield "".join(sse_event(e) for e in builder.start())
        ended = False
        async for raw in chat_body:
            evs = []
            for chunk in chat_chunks(raw):
                if chunk is None:
                    if builder.error is None and not ended:
                        evs += builder.end()
                    ended = True
                else:
                    evs += builder.feed_chunk(chunk)
            if evs:
                yield "".join(sse_event(e) for e in evs)
    finally:
        close = getattr(chat_body, "aclose", None)
        if close is not None:
            await close()


__all__ = ["ResponseBuilder", "chat_chunks", "item_id", "response_events", "responses_usage",
           "sse_event"]
