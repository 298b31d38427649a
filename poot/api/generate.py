"""One request as a token stream: a client of the serving engine (:mod:`poot.engine`).

    for ev in generate(engine, prompt_ids, params):
        if isinstance(ev, TokenEvent): print(ev.text, end="")
        else: print(ev.stats)                                  # the final Finished event

The rules (context, stops, stop-string hold-back, EOS, ``max_tokens``, log-probs, seeds) are
the engine's (:mod:`poot.engine.llm_engine`); this module turns its per-step
:class:`~poot.engine.RequestOutput` into one :class:`TokenEvent` per generated token and a
final :class:`Finished`. Every check that needs no step (vocabulary, parameters, context,
KV capacity) runs when :func:`generate` is called, before any step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

from poot.sampling_params import SamplingParams
from poot.engine import ContextOverflow, RequestStats

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


__all__ = ["ContextOverflow", "Finished", "GenerationStats", "TokenEvent", "check_context",
           "generate"]
