"""Output processing: sampled tokens -> :class:`RequestOutput` (vLLM v1's output processor).

Per request and sampled token (:meth:`OutputProcessor.process`, in a step's row order): a
guided request's matcher consumes the token (a failure finishes it with ``"error"``,
:data:`GUIDED_ERROR`), a stop token id finishes it (``"stop"``), else the token is appended,
its newly full KV blocks are registered in the prefix cache, it is detokenized
incrementally (:mod:`poot.text.stream`) and held back while it may begin a stop string
(:mod:`poot.engine.stops`), and emitted with its log-probs; a stop string or ``max_tokens``
finishes it. :meth:`OutputProcessor.finish` ends a request for any reason: it releases the
held-back text (or drops it when it is a stop string), frees what the request holds through
the :class:`~poot.engine.scheduler.Scheduler`, and fills in its final
:class:`~poot.engine.request.RequestStats`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from poot.engine.request import RUNNING, Request, RequestStats
from poot.engine.scheduler import Scheduler
from poot.graph import sampling

#: How a request's ``RequestOutput.error`` begins when its guided-decoding constraint failed
#: while it ran (finish reason ``"error"``; the request's own failure, not the engine's).
GUIDED_ERROR = "guided decoding: "


@dataclass
class TokenLogprob:
    """A generated token's log-prob (of the raw model distribution; a guided request's after
    its mask) and the top ``n`` alternatives ``[(id, logprob), ...]`` when asked (a guided
    request lists only allowed tokens: fewer than ``n`` where fewer are allowed)."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] | None = None


@dataclass(slots=True)
class RequestOutput:
    """What one :meth:`~poot.engine.llm_engine.LLMEngine.step` produced for one request.

    Attributes:
        request_id: the id :meth:`~poot.engine.llm_engine.LLMEngine.add_request` returned.
        token_ids: tokens generated this step (a stop token is never included).
        text: text released this step (held-back text is released later, or dropped if it
            turns out to be a stop string).
        logprobs: one :class:`TokenLogprob` per token of ``token_ids`` when asked.
        finished: the request is done; then ``finish_reason`` is ``"stop"``, ``"length"``,
            ``"abort"`` or ``"error"``, ``stop`` the stop string or stop token id that ended
            it, ``output_ids``/``output_text`` everything generated, ``stats`` its numbers,
            ``error`` the message of an engine fault; ``flushed``: the end of ``text``
            released by the finish (held-back text that turned out not to be a stop string).
    """

    request_id: str
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    logprobs: list[TokenLogprob] | None = None
    finished: bool = False
    finish_reason: str | None = None
    stop: str | int | None = None
    output_ids: list[int] | None = None
    output_text: str | None = None
    stats: RequestStats | None = None
    error: str | None = None
    flushed: str = ""
    _seq: Any = field(default=None, repr=False, compare=False)


@dataclass
class SampledTokens:
    """What a decode step's sampler returned for its rows (row i = the step's i-th request).

    Attributes:
        tokens: i32 [n], the sampled tokens.
        logprobs: f32 [n], their log-probs (None: no row asked).
        top_logprobs, top_ids: f32 / i32 [n, k], the top-k alternatives (None: not asked).
    """

    tokens: np.ndarray
    logprobs: np.ndarray | None = None
    top_logprobs: np.ndarray | None = None
    top_ids: np.ndarray | None = None

    @classmethod
    def of(cls, out: Mapping[str, np.ndarray]) -> "SampledTokens":
        """From :meth:`~poot.engine.runner.ModelRunner.collect`'s arrays (sampler names)."""
        names = sampling.OUTPUTS
        return cls(out[names["token"]], out.get(names["logprob"]),
                   out.get(names["top_logprobs"]), out.get(names["top_ids"]))

    def logprob(self, i: int, n: int | None) -> TokenLogprob | None:
        """Row ``i``'s :class:`TokenLogprob` with ``n`` alternatives (a request's
        ``logprobs``; None: not asked, or the sampler computed none)."""
        if n is None or self.logprobs is None:
            return None
        top = None if n else []
        if n and self.top_ids is not None:
            top = [(int(a), float(b)) for a, b in zip(self.top_ids[i][:n],
                                                       self.top_logprobs[i][:n])
                   if b != -np.inf]
        return TokenLogprob(int(self.tokens[i]), float(self.logprobs[i]), top)


class OutputProcessor:
    """Turns a decode step's sampled tokens into outputs and ends requests (module doc).

    Args:
        scheduler: registers full blocks in the prefix cache and frees what a finished
            request holds.
        pipelined: recorded in every request's stats.
    """

    def __init__(self, scheduler: Scheduler, pipelined: bool):
        self.scheduler = scheduler
        self.pipelined = pipelined

    def process(self, rows: Sequence[Request], sampled: SampledTokens, now: float
                ) -> list[RequestOutput]:
        """The outputs of a decode step over ``rows`` whose sampler returned ``sampled``
        (read at ``now``). A row no longer running (finished or preempted since the step was
        issued) is a wasted row: its token is discarded; an aborted row finishes
        (``"abort"``)."""
        events = []
        for i, seq in enumerate(rows):
            if seq.status != RUNNING:
                continue
            seq.n_computed = len(seq.tokens)
            if seq.aborted:
                events.append(self.finish(seq, "abort"))
                continue
            logprob = sampled.logprob(i, seq.params.logprobs)
            events.append(self.accept(seq, int(sampled.tokens[i]), logprob, now))
        return events

    def accept(self, seq: Request, token: int, logprob: TokenLogprob | None, now: float
               ) -> RequestOutput:
        """The output of ``seq`` sampling ``token`` (module doc); finishes it where the
        token ends it."""
        seq.generated += 1
        if seq.t_first is None:
            seq.t_first = now
        if seq.guide is not None and token in seq.stop_ids and not seq.guide.accepting:
            # llguidance's mask past a dead end (a lexeme no text matches, e.g. an empty
            # intersection ``&/[9]R/``) allows only EOS although the constraint is incomplete:
            # ending with "stop" would return text that does not match it
            return self.finish(seq, "error", error=f"{GUIDED_ERROR}the constraint cannot be "
                               f"completed after generated token {seq.generated - 1}: "
                               f"{seq.guide.error or 'no token can extend the output'}")
        if seq.guide is not None and not seq.guide.consume(token):
            # the mask allowed only what the matcher accepts, so the constraint itself failed
            # (llguidance's lexer or parser ran past a limit on this input: a{1000000})
            return self.finish(seq, "error", error=f"{GUIDED_ERROR}the constraint failed "
                               f"at generated token {seq.generated} (sampled {token}): "
                               f"{seq.guide.error}")
        if token in seq.stop_ids:
            return self.finish(seq, "stop", stop=token)
        seq.tokens.append(token)
        seq.output_ids.append(token)
        self.scheduler.register(seq)
        text = ""
        if seq.decoder is not None:
            text = seq.matcher.feed(seq.decoder.push(token)).text
        ev = RequestOutput(seq.id, [token], text, [logprob] if logprob is not None else None)
        ev._seq = seq
        if seq.matcher.stopped:
            return self.finish(seq, "stop", stop=seq.matcher.stop, last=ev)
        if seq.generated >= seq.params.max_tokens:
            return self.finish(seq, "length", last=ev)
        return ev

    def finish(self, seq: Request, reason: str, stop=None, last: RequestOutput | None = None,
               error: str | None = None) -> RequestOutput:
        """End ``seq`` with ``reason`` (``stop``: what stopped it; ``last``: this step's
        output to finish, else a new one; ``error``: the message of a failure): flush held
        text, free its blocks, history row and LoRA slot, and fill in its stats."""
        now = time.perf_counter()
        ev = last or RequestOutput(seq.id)
        ev._seq = seq
        if seq.decoder is not None and not seq.matcher.stopped and reason not in ("abort",
                                                                                "error"):
            upd = seq.matcher.feed(seq.decoder.finish())
            if upd.stopped:
                reason, stop = "stop", upd.stop
                ev.flushed = upd.text
            else:
                ev.flushed = upd.text + seq.matcher.flush()
            ev.text += ev.flushed
        self.scheduler.free(seq)
        ev.finished, ev.finish_reason, ev.stop, ev.error = True, reason, stop, error
        ev.output_ids = list(seq.output_ids)
        ev.output_text = seq.matcher.text if seq.decoder is not None else ""
        ev.stats = self._final_stats(seq, reason, now)
        return ev

    def _final_stats(self, seq: Request, reason: str, now: float) -> RequestStats:
        st = seq.stats
        st.generated_tokens, st.finish_reason = seq.generated, reason
        if seq.guide is not None:
            st.guided_masks, st.guided_mask_s = seq.guide.masks, seq.guide.mask_s
        st.total_s = now - seq.t_arrival
        st.pipelined = self.pipelined
        if seq.t_first is not None:
            st.ttft_s = seq.t_first - seq.t_arrival
            if seq.generated > 1:
                st.decode_tokens_per_s = (seq.generated - 1) / max(now - seq.t_first, 1e-9)
        return st


__all__ = ["GUIDED_ERROR", "OutputProcessor", "RequestOutput", "SampledTokens",
           "TokenLogprob"]
