"""Generation, the clients of the serving engine (:mod:`poot.engine`): one request as a
token stream (:func:`generate`, :class:`Driver` over a loaded
:class:`~poot.api.model.ModelHandle`) and many batched offline (:class:`LLM`).

    for ev in generate(engine, prompt_ids, params):
        if isinstance(ev, TokenEvent): print(ev.text, end="")
        else: print(ev.stats)                                  # the final Finished event
    Driver(handle).complete("The capital of France is", SamplingParams(max_tokens=16))
    LLM(backend="cpu").generate(["Hi!", "Count to 5"], SamplingParams(max_tokens=32))
    LLM().chat(messages, tools=TOOLS)          # one reply; its tool_calls parsed

The rules (context, stops, stop-string hold-back, EOS, ``max_tokens``, log-probs, seeds) are
the engine's (:mod:`poot.engine.llm_engine`); this module turns its per-step
:class:`~poot.engine.RequestOutput` into one :class:`TokenEvent` per generated token and a
final :class:`Finished`. Every check that needs no step (vocabulary, parameters, context,
KV capacity) runs when :func:`generate` is called, before any step.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence

from poot.api.chat import ChatResult, chat_result, prepare_chat
from poot.api.model import ModelHandle
from poot.engine.llm_engine import ContextOverflow, LLMEngine
from poot.engine.request import RequestStats
from poot.sampling_params import InvalidRequest, SamplingParams

#: A finished request's numbers (:class:`poot.engine.RequestStats`).
GenerationStats = RequestStats


@dataclass
class TokenEvent:
    """One generated token: its id, the text released with it ("" while held back), and
    log-probs when the request asked (``logprob``; ``top`` = [(id, logprob), ...])."""

    token_id: int
    text: str
    logprob: float | None = None
    top: list[tuple[int, float]] | None = None


@dataclass
class Finished:
    """The last event: every generated id (a stop token excluded), the full text, stats;
    ``final_text``: text released at the end (held-back text, flushed); ``stop``: the stop
    string matched, if any."""

    token_ids: list[int]
    text: str
    stats: GenerationStats
    final_text: str = ""
    stop: str | None = None

    def to_dict(self) -> dict:
        return {"token_ids": self.token_ids, "text": self.text, "stats": self.stats.to_dict()}


def check_context(n_prompt: int, max_tokens: int, capacity: int,
                  model_context: int | None = None) -> None:
    """Raise :class:`ContextOverflow` unless ``n_prompt + max_tokens <= capacity``."""
    if n_prompt + max_tokens > capacity:
        raise ContextOverflow(n_prompt, max_tokens, capacity, model_context)


def generate(engine, prompt_ids: Sequence[int], params: SamplingParams
             ) -> Iterator[TokenEvent | Finished]:
    """Run one request through ``engine`` (an :class:`~poot.engine.LLMEngine`); yields a
    :class:`TokenEvent` per generated token, then one :class:`Finished`. Other requests in
    the engine advance meanwhile. Raises (before any step) what
    :meth:`~poot.engine.LLMEngine.check_request` raises."""
    outputs = engine.generate(prompt_ids, params)
    return _events(outputs)


def _events(outputs) -> Iterator[TokenEvent | Finished]:
    for out in outputs:
        own = out.text[:len(out.text) - len(out.flushed)] if out.flushed else out.text
        lps = out.logprobs or [None] * len(out.token_ids)
        for i, (tid, lp) in enumerate(zip(out.token_ids, lps)):
            ev = TokenEvent(tid, own if i == len(out.token_ids) - 1 else "")
            if lp is not None:
                ev.logprob, ev.top = lp.logprob, lp.top
            yield ev
        if out.finished:
            yield Finished(list(out.output_ids or []), out.output_text or "", out.stats,
                           out.flushed, out.stop if isinstance(out.stop, str) else None)
            return


class Driver:
    """Generation over a :class:`ModelHandle`: one request at a time through its engine
    (other requests added to the same engine are batched with it)."""

    def __init__(self, handle: ModelHandle):
        self.handle = handle

    def generate(self, prompt: str | Sequence[Mapping[str, Any]] | Sequence[int],
                 params: SamplingParams | None = None) -> Iterator[TokenEvent | Finished]:
        """A stream of :class:`TokenEvent` then one :class:`Finished` (ids, text, stats).
        ``prompt``: text, chat messages (``[{"role": ..., "content": ...}]``) or token ids.
        Raises :class:`ContextOverflow` / :class:`InvalidRequest` before running a step."""
        params = params or SamplingParams()
        ids = self.handle.encode(prompt)
        return generate(self.handle.engine, ids, params)

    def complete(self, prompt, params: SamplingParams | None = None) -> Finished:
        """Run to the end; the :class:`Finished` event."""
        last = None
        for last in self.generate(prompt, params):
            pass
        return last


@dataclass
class CompletionOutput:
    """One prompt's result from :meth:`LLM.generate`: the prompt's ids, the generated ids
    (a stop token excluded), the text, the finish reason (``stop``/``length``), the stop
    string or token id that ended it, per-token log-probs when asked, and its stats."""

    prompt_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str
    stop: str | int | None
    logprobs: list | None
    stats: Any


class LLM:
    """vLLM-style offline batching: every prompt is added to the engine at once and the
    engine runs them batched (continuous batching, prefix caching, preemption).

    ``LLM(model=None, backend="cpu", **load_options)``: ``model`` a checkpoint path (None: the
    bundled SmolLM2); ``load_options`` as :meth:`ModelHandle.load` (``max_batch``,
    ``kv_capacity``, ``kv_blocks``, ...). ``LLM(handle=...)`` wraps a loaded handle.
    """

    def __init__(self, model: str | os.PathLike | None = None, backend: str = "cpu", *,
                 handle: ModelHandle | None = None, **load_options: Any):
        self.handle = handle or ModelHandle.load(model, backend, **load_options)

    @property
    def engine(self) -> LLMEngine:
        return self.handle.engine

    def generate(self, prompts: Sequence[Any] | Any,
                 params: SamplingParams | Sequence[SamplingParams] | None = None,
                 on_output: Callable[[int, Any], None] | None = None
                 ) -> list[CompletionOutput]:
        """One :class:`CompletionOutput` per prompt, in order. ``prompts``: texts, chat
        message lists or token-id lists (one prompt alone is accepted too); ``params``: one
        :class:`SamplingParams` for all, or one per prompt. ``on_output(index, output)`` is
        called with every :class:`~poot.engine.RequestOutput` as it is produced (streaming).
        Every prompt is checked before any runs (a bad one raises, naming its index)."""
        if isinstance(prompts, (str, bytes)) or (prompts and isinstance(prompts[0], int)) or \
                (prompts and isinstance(prompts[0], Mapping)):
            prompts = [prompts]
        prompts = list(prompts)
        if params is None or isinstance(params, SamplingParams):
            plist = [params or SamplingParams()] * len(prompts)
        else:
            plist = list(params)
            if len(plist) != len(prompts):
                raise InvalidRequest("params", len(plist), f"one SamplingParams per prompt "
                                     f"({len(prompts)}) or one for all")
        eng = self.engine
        encoded = []
        for i, (p, sp) in enumerate(zip(prompts, plist)):
            try:
                encoded.append(eng.check_request(self.handle.encode(p), sp))
            except InvalidRequest as e:
                raise type(e)(f"prompts[{i}].{e.field}", e.value, e.reason) from None
        ids = [eng.add_request(x, sp) for x, sp in zip(encoded, plist)]
        index = {rid: i for i, rid in enumerate(ids)}
        results: dict[int, CompletionOutput] = {}
        lps: dict[int, list] = {i: [] for i in range(len(ids))}
        while len(results) < len(ids):
            for out in eng.step():
                i = index.get(out.request_id)
                if i is None:
                    continue
                if out.logprobs:
                    lps[i] += out.logprobs
                if on_output is not None:
                    on_output(i, out)
                if out.finished:
                    results[i] = CompletionOutput(encoded[i], list(out.output_ids or []),
                                                  out.output_text or "", out.finish_reason,
                                                  out.stop, lps[i] if plist[i].logprobs
                                                  is not None else None, out.stats)
        return [results[i] for i in range(len(ids))]

    def chat(self, messages: Sequence[Mapping[str, Any]], params: SamplingParams | None = None,
             tools: list[dict[str, Any]] | None = None, tool_choice: Any = None) -> ChatResult:
        """One reply to the conversation ``messages`` (OpenAI's chat shapes: ``tool``
        messages with ``tool_call_id``, assistant messages with ``tool_calls``), as a
        :class:`~poot.api.chat.ChatResult`. ``tools`` (OpenAI chat function tools) go to the
        chat template and the reply's calls are parsed into ``tool_calls``
        (:func:`~poot.api.chat.tool_call_parser`). ``tool_choice``: ``"auto"`` (default:
        the model may answer in text), ``"none"`` (no tools), ``"required"`` or a tool's
        name (the reply is constrained to a call whose arguments follow the schema).

        Raises (before anything runs): :class:`InvalidRequest` (bad ``tools`` or
        ``tool_choice``, naming the field; bad ``params``; a constrained ``tool_choice``
        with ``params.guided`` set), :class:`ContextOverflow`, or the chat template's :class:`~poot.text.chat.ChatTemplateError`."""
        params = params or SamplingParams()
        ids, parser, guide = prepare_chat(self.handle, messages, tools, tool_choice)
        if guide is not None:
            if params.guided is not None:
                raise InvalidRequest("tool_choice", tool_choice, "constrains the reply: "
                                     "params.guided must be None")
            params = dataclasses.replace(params, guided=guide)
        out = self.generate([ids], params)[0]
        return chat_result(out.text, out.finish_reason, out.stats, parser)


__all__ = ["LLM", "CompletionOutput", "ContextOverflow", "Driver", "Finished",
           "GenerationStats", "TokenEvent", "check_context", "generate"]
