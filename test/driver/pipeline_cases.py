"""Pipelined vs sequential engine loops, device-neutral (the CPU, Vulkan and CUDA tests run
these).

Each case takes a loaded :class:`~poot.api.ModelHandle` (``h``) and, where a run must be
compared with one on an untouched engine, a ``fresh()`` that loads another handle of the same
model. ``pipeline=True`` forces the pipelined loop (decode step n+1 issued before step n's
tokens are read, tokens fed back on the device) even where the device does not overlap;
``False`` is the sequential loop (issue, read, then the next step)."""

from __future__ import annotations

import dataclasses

from poot.api import Driver
from poot.api.generate import Finished, generate
from poot.sampling_params import SamplingParams


def greedy(n=8, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, **kw)


def sampled(n=6, seed=7, **kw) -> SamplingParams:
    return SamplingParams(temperature=1.5, top_k=50, top_p=0.95, seed=seed, max_tokens=n,
                          ignore_eos=True, **kw)


PENALIZED = dict(frequency_penalty=1.5, presence_penalty=0.5, repetition_penalty=1.3)


def events(h, prompt, params, pipeline: bool):
    """One request's events on ``h``'s engine run with the loop ``pipeline`` says (the engine
    is idle between requests, so its mode may change)."""
    eng = h.engine
    old, eng.pipelined = eng.pipelined, pipeline
    try:
        return list(generate(eng, list(prompt), params))
    finally:
        eng.pipelined = old


def run(h, prompt, params, pipeline: bool) -> Finished:
    done = events(h, prompt, params, pipeline)[-1]
    assert done.stats.pipelined is pipeline
    return done


def decode_steps(h, params=None) -> int:
    """Decode steps issued on ``h`` so far (a request's first token comes from the ragged
    step that computes its prompt's last chunk, the others from decode steps)."""
    return h.runner.decode_steps


def same_run(h, prompt, params) -> tuple[Finished, Finished]:
    """The sequential and the pipelined run of one request: same ids, text, finish, and the
    same log-probs event by event."""
    ev_seq = events(h, prompt, params, False)
    ev_pipe = events(h, prompt, params, True)
    a, b = ev_seq[-1], ev_pipe[-1]
    assert b.token_ids == a.token_ids
    assert (b.text, b.stats.finish_reason, b.stats.generated_tokens, b.stop) == \
        (a.text, a.stats.finish_reason, a.stats.generated_tokens, a.stop)
    for x, y in zip(ev_seq[:-1], ev_pipe[:-1]):
        assert (x.token_id, x.text, x.logprob, x.top) == (y.token_id, y.text, y.logprob, y.top)
    return a, b


# ---- cases ------------------------------------------------------------------------------------
def case_greedy_and_logprobs(h, prompt):
    a, _ = same_run(h, prompt, greedy(8))
    assert a.stats.generated_tokens == 8
    same_run(h, prompt, greedy(5, logprobs=3))


def case_seeded_sampling(h, prompt, seeds=(7, 8), n=6):
    for seed in seeds:
        a, _ = same_run(h, prompt, sampled(n, seed=seed))
        assert a.stats.generated_tokens == n


def case_max_tokens_one(h, prompt):
    """One token: nothing is issued past it (no speculative step)."""
    p = greedy(1)
    n0 = decode_steps(h, p)
    a, b = same_run(h, prompt, p)
    assert len(a.token_ids) == 1
    assert decode_steps(h, p) - n0 == 0           # the prompt's ragged step samples it


def case_stop_token_then_next_request(h, fresh, prompt, other, params=None):
    """A stop token in the middle: the pipelined run has issued one step past the step that
    sampled it (it runs and its token is discarded); ids equal the sequential run's. The next request on the same
    engine (a shorter prompt whose decode passes over the position the extra step wrote) then
    equals the same request on an untouched engine."""
    params = params or greedy(8)
    full = run(h, prompt, params, False).token_ids
    stop = full[2]
    first = full.index(stop)
    p = dataclasses.replace(params, stop_token_ids=[stop])
    n0 = decode_steps(h, p)
    seq = run(h, prompt, p, False)
    n1 = decode_steps(h, p)
    pipe = run(h, prompt, p, True)
    n2 = decode_steps(h, p)
    assert seq.token_ids == pipe.token_ids == full[:first]
    assert pipe.stats.finish_reason == seq.stats.finish_reason == "stop"
    # the decode steps up to the stop token (the first token comes from the ragged step)
    assert n1 - n0 == first
    # ... and the one issued past it (also when the stop is the first token: the ragged
    # step that samples it is in flight when the first decode step is issued)
    assert n2 - n1 == first + 1
    # the extra step wrote K/V at position len(prompt) + first and bumped the history
    nxt = greedy(len(prompt) + first + 2 - len(other), **_penalties(params))
    after = run(h, other, nxt, True)
    assert after.token_ids == run(fresh(), other, nxt, False).token_ids


def _penalties(params) -> dict:
    return {k: getattr(params, k) for k in PENALIZED}


def case_penalties(h, fresh, prompt, other):
    """Penalties read the device-resident token history: pipelined == sequential, and the
    extra step after a stop does not leak into the next request's history."""
    same_run(h, prompt, greedy(8, **PENALIZED))
    case_stop_token_then_next_request(h, fresh, prompt, other, greedy(8, **PENALIZED))


def case_back_to_back(h, fresh, prompt, other, second=None):
    """Two pipelined requests back to back equal each on an untouched engine."""
    second = second or sampled(5, seed=11)
    a = run(h, prompt, greedy(6), True)
    b = run(h, other, second, True)
    f = fresh()
    assert a.token_ids == run(f, prompt, greedy(6), False).token_ids
    assert b.token_ids == run(f, other, second, False).token_ids


def case_abandoned_stream(h, fresh, prompt, other):
    """A consumer that stops reading mid-stream leaves a step in flight; the next request
    still equals a fresh run."""
    eng = h.engine
    old, eng.pipelined = eng.pipelined, True
    try:
        gen = generate(eng, list(prompt), greedy(8))
        next(gen), next(gen)
        gen.close()
    finally:
        eng.pipelined = old
    assert not eng.has_unfinished() and eng.blocks.stats().used == 0
    b = run(h, other, greedy(6), True)
    assert b.token_ids == run(fresh(), other, greedy(6), False).token_ids


def case_feedback_lands_in_token_input(h, prompt):
    """After a decode step the entry's token input holds the sampled token (the recorded
    device-to-device copy), for the sequential loop as well."""
    p = greedy(3)
    done = Driver(h).complete(list(prompt), p)
    entry = h.runner.decode_entry(1)
    dev = h.runner.session.device
    assert int(dev.download(entry.slots["tokens"]).reshape(-1)[0]) == done.token_ids[-1]
