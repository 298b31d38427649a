"""One generation request's response (:class:`GenerationRun`): the engine's outputs fed into
choice states, answered as one JSON object or as a server-sent event stream (OpenAI's chat
and completion shapes), with the request's metrics and log fields."""

from __future__ import annotations

import time
from typing import Any, Callable

from fastapi.responses import Response, StreamingResponse

from poot.serve import errors
from poot.serve.engine_client import (ClientGone, ConstraintFailed, EngineFault,
                                      RequestTimeout, ShuttingDown)
from poot.serve.errors import APIError
from poot.serve.responses import (SSE_DONE, ChoiceState, CompletionLogprobs, chat_logprobs,
                                  sse, sse_json, usage)
from poot.serve.state import ServerState, shutting_down
from poot.text.tool_calls import StreamParser


class SSEResponse(StreamingResponse):
    """A streaming response that runs ``on_close`` however it ends -- also when the client
    went away before the first chunk, so the body generator never started (and its own
    ``finally`` never runs)."""

    def __init__(self, content, on_close: Callable[[], None], **kw):
        super().__init__(content, **kw)
        self.on_close = on_close

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()


#: the log's ``finish=`` of a request that ended with one of these
_ABORTED = {RequestTimeout: "timeout", ShuttingDown: "shutdown"}


class GenerationRun:
    """One generation request's response: the choice states, metrics and log fields."""

    def __init__(self, state: ServerState, body, plan, rid: str, chat: bool, info: dict):
        self.state, self.body, self.plan, self.rid = state, body, plan, rid
        self.chat, self.info = chat, info
        self.model = state.config.served_model_name
        self.created = int(time.time())
        n = plan.n
        self.states = [ChoiceState(i, len(plan.prompts[i // n])) for i in range(plan.choices)]
        self.want_logprobs = plan.params[0].logprobs is not None
        tt = state.tokens
        self.tt = tt
        self.echo = (not chat) and body.echo
        self.prompt_texts: list[str] = []
        if self.echo:
            p = body.prompt
            for ids, src in zip(plan.prompts, [p] if isinstance(p, str) or
                                (p and isinstance(p[0], int)) else p):
                self.prompt_texts.append(src if isinstance(src, str) else
                                         (tt.tok.decode(ids, skip_special_tokens=True)
                                          if tt.tok is not None else ""))
        self.clp = [CompletionLogprobs(tt, plan.prompts[i // n]) for i in
                    range(plan.choices)] if not chat else []
        self.ttft_seen: set[int] = set()
        self.finished = False
        # the answers split into content, reasoning and tool calls, as they stream
        self.parsers = [StreamParser(plan.output) for _ in self.states] \
            if chat and plan.output is not None else None
        # vLLM's return_token_ids: prompt and generated ids beside the text
        self.ids = bool(body.return_token_ids)
        self.ids_sent: set[int] = set()
        self._chunk_head: str | None = None     # a chunk's JSON up to its choice

    def _prompt_ids(self, i: int) -> list[int]:
        return self.plan.prompts[i // self.plan.n]

    def _with_ids(self, choice: dict[str, Any], i: int, ids: list[int]) -> dict[str, Any]:
        """``choice`` with its ``token_ids`` (and, on a choice's first chunk of a completion,
        ``prompt_token_ids``) when the request asked for them."""
        if self.ids:
            choice["token_ids"] = list(ids)
            if not self.chat and i not in self.ids_sent:
                self.ids_sent.add(i)
                choice["prompt_token_ids"] = self._prompt_ids(i)
        return choice

    # ---- shared bookkeeping ------------------------------------------------------------------
    def _feed(self, i: int, ev):
        st = self.states[i]
        text, released, gaps = st.feed(ev)
        m = self.state.metrics
        if st.t_first is not None and i not in self.ttft_seen:
            self.ttft_seen.add(i)
            m.ttft.observe(st.t_first - self.info["t0"])
        for g in gaps:
            m.itl.observe(g)
        return st, text, released

    def _finish(self, status: str | None = None) -> None:
        if self.finished:
            return
        self.finished = True
        m = self.state.metrics
        gen = sum(s.completion_tokens or len(s.token_ids) for s in self.states)
        m.prompt_tokens.inc(self.info.get("prompt", 0))
        m.generation_tokens.inc(gen)
        m.e2e.observe(time.monotonic() - self.info["t0"])
        self.info["generated"] = gen
        self.info["cached"] = usage(self.states, [len(p) for p in self.plan.prompts])[
            "prompt_tokens_details"]["cached_tokens"]
        firsts = [s.t_first for s in self.states if s.t_first is not None]
        if firsts:
            self.info["ttft"] = min(firsts) - self.info["t0"]
        reasons = sorted({s.finish_reason for s in self.states if s.finish_reason})
        self.info["finish"] = status or ",".join(reasons) or None

    def _usage(self) -> dict[str, Any]:
        return usage(self.states, [len(p) for p in self.plan.prompts])

    def _error(self, e: BaseException) -> APIError:
        if isinstance(e, RequestTimeout):
            return APIError(504, f"the request ran past this server's limit of "
                            f"{self.state.config.request_timeout_s:g} s and was aborted",
                            errors.TIMEOUT, None, "request_timeout")
        if isinstance(e, ShuttingDown):
            return shutting_down(self.state.config)
        if isinstance(e, ConstraintFailed):
            field = self.plan.guided_field
            return APIError(400, f"invalid '{field}': {e}", errors.INVALID_REQUEST, field,
                            "guided_decoding_failed")
        return APIError(500, f"the engine failed while running this request ({e})",
                        errors.SERVER, None, "engine_error")

    # ---- non-streaming -----------------------------------------------------------------------
    async def complete(self, gen):
        """Run to the end; the response JSON."""
        try:
            async for i, ev in gen.events():
                self._feed(i, ev)
        except (RequestTimeout, EngineFault, ShuttingDown) as e:
            self._finish(_ABORTED.get(type(e), "error"))
            self.info["error"] = type(e).__name__
            self.state.metrics.aborted.inc(len(gen.unfinished))
            raise self._error(e) from None
        except ClientGone:
            self.state.metrics.aborted.inc(len(gen.unfinished))
            self._finish("disconnected")
            return Response(status_code=499)
        finally:
            gen.close()
        self._finish()
        choices = []
        for st in self.states:
            if self.chat:
                message, finish = self._message(st)
                choices.append(self._with_ids({
                    "index": st.index, "message": message,
                    "logprobs": chat_logprobs(st.logprobs, self.tt)
                    if self.want_logprobs else None,
                    "finish_reason": finish}, st.index, st.token_ids))
            else:
                p = st.index // self.plan.n
                text = (self.prompt_texts[p] if self.echo else "") + st.text
                lp = None
                if self.want_logprobs:
                    clp = self.clp[st.index]
                    lp = clp.prompt() if self.echo else None
                    lp = CompletionLogprobs.merge(lp, clp.generated(st.logprobs))
                choices.append(self._with_ids({"index": st.index, "text": text, "logprobs": lp,
                                               "finish_reason": st.finish_reason},
                                              st.index, st.token_ids))
        out = {"id": self.rid, "object": "chat.completion" if self.chat else
               "text_completion", "created": self.created, "model": self.model,
               "system_fingerprint": None, "choices": choices, "usage": self._usage()}
        if self.ids and self.chat:
            out["prompt_token_ids"] = self._prompt_ids(0)
        return out

    def _message(self, st) -> tuple[dict[str, Any], str | None]:
        """A chat choice's ``message`` and finish reason (``tool_calls`` when it ended by
        itself with calls)."""
        if self.plan.output is None:
            return {"role": "assistant", "content": st.text, "refusal": None}, \
                st.finish_reason
        parsed = self.plan.output.parse(st.text)
        return parsed.message(), _finish_reason(st, bool(parsed.tool_calls))

    def closed(self, gen) -> None:
        """The stream's response ended (any way): abort what still runs."""
        if not self.finished:
            self.state.metrics.aborted.inc(len(gen.unfinished))
            self._finish("disconnected")
        gen.close()

    # ---- streaming ---------------------------------------------------------------------------
    def _chunk(self, choice: dict[str, Any], top: dict[str, Any] | None = None) -> str:
        obj = {"id": self.rid, "object": "chat.completion.chunk" if self.chat else
               "text_completion", "created": self.created, "model": self.model,
               "system_fingerprint": None, "choices": []}
        opts = self.body.stream_options
        if top is None and (opts is None or not opts.include_usage):
            # the request's fields end up the same in every chunk: encoded once (a token's
            # chunk 6.7 -> 3.8 us on the event loop)
            if self._chunk_head is None:
                self._chunk_head = sse_json(obj)[:-2]
            return f"data: {self._chunk_head}{sse_json(choice)}]}}\n\n"
        obj["choices"] = [choice]
        obj.update(top or {})
        if opts is not None and opts.include_usage:
            obj["usage"] = None
            if opts.continuous_usage_stats:
                obj["usage"] = self._running_usage()
        return sse(obj)

    def _running_usage(self) -> dict[str, Any]:
        prompt = sum(len(p) for p in self.plan.prompts)
        gen = sum(len(s.token_ids) for s in self.states)
        return {"prompt_tokens": prompt, "completion_tokens": gen, "total_tokens": prompt + gen}

    def _event_chunks(self, i: int, ev) -> list[str]:
        """The SSE chunks of one engine output of choice ``i``: its text (and log-probs, token
        ids) when any is released, and the finish chunk when it finished."""
        st, text, released = self._feed(i, ev)
        new_ids = ev.token_ids if self.ids else []
        out = []
        delta: dict[str, Any] = {"content": text}
        if self.parsers is not None:             # content, reasoning and call pieces
            delta = self.parsers[i].push(text, final=ev.finished).openai()
        if (delta if self.parsers is not None else text) or released or new_ids:
            if self.chat:
                out.append(self._chunk(self._with_ids({
                    "index": i, "delta": delta,
                    "logprobs": chat_logprobs(released, self.tt)
                    if self.want_logprobs else None, "finish_reason": None}, i, new_ids)))
            else:
                out.append(self._chunk(self._with_ids({
                    "index": i, "text": text,
                    "logprobs": self.clp[i].generated(released)
                    if self.want_logprobs else None, "finish_reason": None}, i, new_ids)))
        if ev.finished:
            if self.chat:
                calls = self.parsers is not None and bool(self.parsers[i].result().tool_calls)
                out.append(self._chunk(self._with_ids(
                    {"index": i, "delta": {}, "logprobs": None,
                     "finish_reason": _finish_reason(st, calls)}, i, [])))
            else:
                out.append(self._chunk(self._with_ids(
                    {"index": i, "text": "", "logprobs": None,
                     "finish_reason": st.finish_reason}, i, [])))
        return out

    async def stream(self, gen):
        """The SSE body: chunks, the usage chunk when asked, ``data: [DONE]``. Chunks of
        outputs already queued are written together (one send when the front end has fallen
        behind the engine, instead of one per token). A client that goes away cancels this
        generator: its sequences are aborted (``gen.close``)."""
        done = False
        try:
            for st in self.states:
                if self.chat:
                    yield self._chunk({"index": st.index,
                                       "delta": {"role": "assistant", "content": ""},
                                       "logprobs": None, "finish_reason": None},
                                      {"prompt_token_ids": self._prompt_ids(st.index)}
                                      if self.ids else None)
                elif self.echo:
                    p = st.index // self.plan.n
                    lp = self.clp[st.index].prompt() \
                        if self.want_logprobs else None
                    yield self._chunk(self._with_ids(
                        {"index": st.index, "text": self.prompt_texts[p], "logprobs": lp,
                         "finish_reason": None}, st.index, []))
            out: list[str] = []         # chunks not yet written (see Generation.ready)
            try:
                async for i, ev in gen.events():
                    out += self._event_chunks(i, ev)
                    if out and not gen.ready():
                        yield "".join(out)
                        out.clear()
            except (RequestTimeout, EngineFault, ShuttingDown) as e:
                self.state.metrics.aborted.inc(len(gen.unfinished))
                self._finish(_ABORTED.get(type(e), "error"))
                self.info["error"] = type(e).__name__
                yield "".join(out) + sse(self._error(e).body()) + SSE_DONE
                done = True
                return
            if out:
                yield "".join(out)
            self._finish()
            opts = self.body.stream_options
            if opts is not None and opts.include_usage:
                yield sse({"id": self.rid, "object": "chat.completion.chunk" if self.chat
                           else "text_completion", "created": self.created,
                           "model": self.model, "system_fingerprint": None, "choices": [],
                           "usage": self._usage()})
            yield SSE_DONE
            done = True
        finally:
            if not done:                       # the client went away (or the server stops)
                self.state.metrics.aborted.inc(len(gen.unfinished))
                self._finish("disconnected")
            gen.close()


def _finish_reason(st, calls: bool) -> str | None:
    """OpenAI's ``tool_calls`` for a choice that stopped by itself after calls."""
    return "tool_calls" if calls and st.finish_reason == "stop" else st.finish_reason


__all__ = ["GenerationRun", "SSEResponse"]
