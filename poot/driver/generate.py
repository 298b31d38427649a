"""The token loop: prompt -> prefill -> decode with on-device sampling -> stops -> stats.

    for ev in generate(runner, prompt_ids, params, tokenizer):
        if isinstance(ev, TokenEvent): print(ev.text, end="")
        else: print(ev.stats)                                  # the final Finished event

Rules:

* **Context.** The cache holds ``kv_capacity`` positions per sequence. A request is refused
  with :class:`ContextOverflow` when ``len(prompt) + max_tokens > kv_capacity`` (the prompt
  alone past the capacity is the same error, its message saying so). The message states the
  prompt length, the requested ``max_tokens`` and the capacity, and how far ``--kv-capacity``
  may be raised (the model's trained context, when the runner knows it).
  This is checked before any step runs.
* **Stops**, checked per generated token in this order: a stop token id (the tokenizer's EOS /
  end-of-turn ids, unless ``params.ignore_eos``, plus ``params.stop_token_ids``) ends
  generation with reason ``"stop"``; the stop token's text is not emitted. A stop string
  (:class:`~poot.driver.stops.StopMatcher`) ends generation with ``"stop"``; text that may
  begin a stop string is held back and never emitted if it turns out to be part of one.
  ``max_tokens`` generated tokens end it with ``"length"``.
* **Pipelining** (:func:`pipelining`): the decode step copies its sampled token into its own
  token input on the device, so step n+1 can be issued (its position and uniform queued, the
  replay, a queued read of its token) before the host waits for token n; the device then runs
  step n+1 while the host detokenizes, checks stops and yields token n. Step n+1 is issued only
  when token n+2 could still be wanted (``max_tokens`` not reached), so the one wasted step is
  the step after a stop token / stop string: its token is discarded and its writes are
  harmless (it writes K/V at position ``pos + 1`` of the slot, beyond the request's last
  position, which every later request rewrites before attention can see it: attention masks
  keys by position, causal, and every request prefills from position 0; it bumps the token
  history ``sampling.token_counts``, which every request resets before its first step). The
  tokens are those of the sequential loop, token for token (same steps, same uniforms in the
  same order). ``POOT_PIPELINE=0`` (or ``pipeline=False``) runs the sequential loop: host
  writes of token and position, then wait, per step.
* **Text** is detokenized incrementally (:class:`~poot.text.stream.StreamDecoder`, special
  tokens skipped, the prompt's tail as context). Without a tokenizer (token-id checkpoints)
  text is empty and stop strings are an :class:`InvalidRequest`.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from typing import Iterator, Sequence

import numpy as np

from poot.driver.params import InvalidRequest, SamplingParams, history_row
from poot.driver.runner import StepRunner, sampler_spec
from poot.driver.stops import StopMatcher
from poot.errors import PootError
from poot.graph import sampling


def _tokens(n: int) -> str:
    return f"{n} token" if n == 1 else f"{n} tokens"


class ContextOverflow(PootError):
    """The prompt plus the requested tokens do not fit the KV capacity.

    Attributes: prompt_tokens, max_tokens (as requested), capacity, model_context (the
    model's trained context, when known: how far the capacity may be raised).
    """

    def __init__(self, prompt_tokens: int, max_tokens: int, capacity: int,
                 model_context: int | None = None):
        self.prompt_tokens, self.max_tokens, self.capacity = prompt_tokens, max_tokens, capacity
        self.model_context = model_context
        if model_context is not None and capacity >= model_context:
            raise_it = (f" (the capacity is already the model's context of "
                        f"{_tokens(model_context)})")
        else:
            upto = f"up to {model_context}" if model_context else "up to the model's context"
            raise_it = f" or raise --kv-capacity ({upto})"
        if prompt_tokens > capacity:
            msg = (f"the prompt alone is {_tokens(prompt_tokens)} and exceeds the context "
                   f"capacity of {_tokens(capacity)} (max_tokens {max_tokens} requested); "
                   f"shorten the prompt{raise_it}")
        else:
            msg = (f"prompt of {_tokens(prompt_tokens)} + max_tokens {max_tokens} = "
                   f"{prompt_tokens + max_tokens} exceeds the context capacity of "
                   f"{_tokens(capacity)}; lower max_tokens{raise_it}")
        super().__init__(msg)


@dataclass
class GenerationStats:
    """Final numbers of one request (seconds; ``decode_tokens_per_s`` over tokens after the
    first, None when fewer than two were generated; ``pipelined``: whether the decode loop
    issued each step before reading the previous one's token)."""

    prompt_tokens: int = 0
    generated_tokens: int = 0
    ttft_s: float = 0.0
    decode_tokens_per_s: float | None = None
    total_s: float = 0.0
    prefill_steps: int = 0
    finish_reason: str = ""
    pipelined: bool = False

    def to_dict(self) -> dict:
        return asdict(self)


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
    """The last event: every generated id (a stop token excluded), the full text, stats."""

    token_ids: list[int]
    text: str
    stats: GenerationStats
    final_text: str = ""        # text released at the end (held-back text, flushed)
    stop: str | None = None     # the stop string matched, if any

    def to_dict(self) -> dict:
        return {"token_ids": self.token_ids, "text": self.text, "stats": self.stats.to_dict()}


def check_context(n_prompt: int, max_tokens: int, capacity: int,
                  model_context: int | None = None) -> None:
    """Raise :class:`ContextOverflow` unless ``n_prompt + max_tokens <= capacity``."""
    if n_prompt + max_tokens > capacity:
        raise ContextOverflow(n_prompt, max_tokens, capacity, model_context)


def pipelining(runner, override: bool | None = None) -> bool:
    """Whether the decode loop pipelines: ``override`` if given, else ``runner.pipeline`` if
    set, else ``POOT_PIPELINE`` if set (``0``/``false``/``off``/``no``: off, anything else:
    on), else whether the runner's engine overlaps host and device work (a synchronous
    device, the CPU, gains nothing from it and runs the sequential loop)."""
    if override is not None:
        return bool(override)
    if getattr(runner, "pipeline", None) is not None:
        return bool(runner.pipeline)
    env = os.environ.get("POOT_PIPELINE", "").strip().lower()
    if env:
        return env not in ("0", "false", "off", "no")
    return bool(getattr(runner.engine, "overlaps", False))


def generate(runner: StepRunner, prompt_ids: Sequence[int], params: SamplingParams,
             tokenizer=None, slot: int = 0, pipeline: bool | None = None
             ) -> Iterator[TokenEvent | Finished]:
    """Run one request; yields :class:`TokenEvent` per generated token, then one
    :class:`Finished`. Errors (:class:`ContextOverflow`, :class:`InvalidRequest`) are raised
    before any step runs. ``pipeline``: see :func:`pipelining` (None: the default)."""
    ids = [int(i) for i in prompt_ids]
    vocab = runner.vocab_size
    if not ids:
        raise InvalidRequest("prompt", "", "the prompt has no tokens")
    bad = [i for i in ids if not 0 <= i < vocab]
    if bad:
        raise InvalidRequest("prompt", bad[0], f"token id out of the vocabulary [0, {vocab})")
    params.check(vocab)
    if params.stop and tokenizer is None:
        raise InvalidRequest("stop", params.stop, "stop strings need a tokenizer")
    check_context(len(ids), params.max_tokens, runner.kv_capacity,
                  getattr(runner, "model_context", None))
    return _loop(runner, ids, params, tokenizer, slot, pipelining(runner, pipeline))


def _loop(runner, ids, params, tokenizer, slot, pipelined=False):
    from poot.text.stream import StreamDecoder

    engine, vocab = runner.engine, runner.vocab_size
    spec = sampler_spec(params)
    decode = runner.decode_entry(spec)          # compiled before the clock starts
    if len(ids) > 1:
        runner.prefill_entry()
    stop_ids = set(params.stop_token_ids)
    if tokenizer is not None and not getattr(params, "ignore_eos", False):
        stop_ids |= set(tokenizer.stop_ids)
    decoder = StreamDecoder(tokenizer, skip_special_tokens=True, context=ids) \
        if tokenizer is not None else None
    matcher = StopMatcher(params.stop)
    uniforms = params.uniforms()
    read = [sampling.OUTPUTS["token"]]
    if spec.logprobs is not None:
        read.append(sampling.OUTPUTS["logprob"])
        if spec.logprobs > 0:
            read += [sampling.OUTPUTS["top_logprobs"], sampling.OUTPUTS["top_ids"]]

    stats = GenerationStats(prompt_tokens=len(ids), pipelined=pipelined)
    t0 = time.perf_counter()
    stats.prefill_steps = runner.prefill(ids[:-1], 0, slot)
    packed = params.pack([params], vocab, spec=spec)
    packed.pop(sampling.INPUTS["uniform"], None)
    tok_buf = np.array([[ids[-1]]], np.int32)
    # the first token input; later ones are fed back on the device (or written per step when
    # not pipelined)
    engine.write_inputs(decode, {**packed, "slots": np.array([slot], np.int32),
                                 "tokens": tok_buf})
    engine.write_state(sampling.INPUTS["token_counts"], history_row(vocab)[None, :])
    out_ids: list[int] = []
    tok, pos = ids[-1], len(ids) - 1
    t_first = None
    finish, stop_str = "length", None
    u = np.zeros((1,), np.float32)
    pos_buf = np.zeros((1, 1), np.int32)

    def step_inputs(p: int) -> dict:
        pos_buf[0, 0] = p
        step_in = {"positions": pos_buf}
        if spec.stochastic:                  # a greedy entry has no uniform input
            u[0] = uniforms.next()
            step_in[sampling.INPUTS["uniform"]] = u
        return step_in

    pending = nxt = None
    if pipelined:           # the device copies pos_buf / u at once: reusing them is safe
        pending = engine.submit(decode, step_inputs(pos), read=read)
    try:
        while True:
            if pipelined:
                # issue the step after this one before waiting for this one's token; only
                # when its token could be wanted (max_tokens not reached after this one)
                nxt = engine.submit(decode, step_inputs(pos + 1), read=read) \
                    if stats.generated_tokens + 1 < params.max_tokens else None
                out, pending = engine.collect(pending), None
            else:
                tok_buf[0, 0] = tok
                out = engine.step(decode, {"tokens": tok_buf, **step_inputs(pos)}, read=read)
            new = int(out[sampling.OUTPUTS["token"]][0])
            if t_first is None:
                t_first = time.perf_counter()
                stats.ttft_s = t_first - t0
            stats.generated_tokens += 1
            if new in stop_ids:
                finish = "stop"
                break
            out_ids.append(new)
            text = ""
            if decoder is not None:
                upd = matcher.feed(decoder.push(new))
                text = upd.text
            ev = TokenEvent(new, text)
            if spec.logprobs is not None:
                ev.logprob = float(out[sampling.OUTPUTS["logprob"]][0])
                if spec.logprobs > 0:
                    ev.top = [(int(i), float(v)) for i, v in
                              zip(out[sampling.OUTPUTS["top_ids"]][0],
                                  out[sampling.OUTPUTS["top_logprobs"]][0])]
            yield ev
            if matcher.stopped:
                finish, stop_str = "stop", matcher.stop
                break
            if stats.generated_tokens >= params.max_tokens:
                break
            tok, pos = new, pos + 1
            pending, nxt = nxt, None
    finally:
        # a step issued past the end (after a stop): its token is not wanted (see above)
        for s in (pending, nxt):
            if s is not None:
                engine.discard(s)
    t_end = time.perf_counter()
    final = ""
    if decoder is not None and not matcher.stopped:
        upd = matcher.feed(decoder.finish())
        final = upd.text
        if matcher.stopped:
            stop_str, finish = matcher.stop, "stop"
        else:
            final += matcher.flush()
    stats.total_s = t_end - t0
    if stats.generated_tokens > 1:
        stats.decode_tokens_per_s = (stats.generated_tokens - 1) / max(t_end - t_first, 1e-9)
    stats.finish_reason = finish
    yield Finished(out_ids, matcher.text, stats, final, stop_str)


__all__ = ["ContextOverflow", "Finished", "GenerationStats", "TokenEvent", "check_context",
           "generate", "pipelining"]
