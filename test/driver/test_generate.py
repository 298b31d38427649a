"""The token loop on tiny fixtures, over the executor contract with a test-side oracle device
(the loop's logic independently of the CPU code generator; test/e2e runs the CPU backend)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "runtime"))
sys.path.insert(0, str(ROOT / "models"))

from model_steps import fixture_path, reference  # noqa: E402
from oracle_device import OracleDevice, oracle_compile  # noqa: E402

from poot.api import Driver, ModelHandle  # noqa: E402
from poot.api.generate import ContextOverflow, Finished, TokenEvent  # noqa: E402
from poot.engine import EngineConfig  # noqa: E402
from poot.sampling_params import InvalidRequest, SamplingParams  # noqa: E402

FIXTURES = ["llama", "llama_gguf_q4_1"]


def _load(name, capacity=32, chunk=5):
    # one chunk a step even with nothing decoding, so prompts cross chunk boundaries
    return ModelHandle.load(fixture_path(name), kv_capacity=capacity, prefill_chunk=chunk,
                            compile_fn=oracle_compile, device=OracleDevice(), max_batch=8,
                            engine_config=EngineConfig(max_batch=8, idle_prefill_tokens=chunk))


@pytest.fixture(scope="module", params=FIXTURES)
def handle(request):
    return request.param, _load(request.param)


def _greedy(max_tokens=8, **kw):
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **kw)


def agree_until_tie(got, want, margins, tol=1e-3):
    """Token lists agree up to (and including) the first step whose margin is below tol."""
    n = len(want)
    for i, m in enumerate(margins):
        if m < tol:
            n = i + 1
            break
    assert list(got[:n]) == [int(x) for x in want[:n]]


def test_greedy_matches_reference(handle):
    name, h = handle
    ref = reference(name)
    r = Driver(h).complete(list(ref["prompt_ids"]), _greedy())
    agree_until_tie(r.token_ids, ref["greedy_ids"], ref["greedy_margins"])
    s = r.stats
    assert (s.prompt_tokens, s.generated_tokens, s.finish_reason) == (12, 8, "length")
    assert s.prefill_steps == 3 and s.ttft_s > 0 and s.decode_tokens_per_s > 0


@pytest.mark.parametrize("chunk", [1, 4, 11, 16])
def test_prefill_chunking_does_not_change_tokens(chunk):
    ref = reference("llama")
    h = _load("llama", capacity=24, chunk=chunk)
    r = Driver(h).complete(list(ref["prompt_ids"]), _greedy(4))
    assert r.token_ids == [int(x) for x in ref["greedy_ids"][:4]]


def test_events_stream_then_finish(handle):
    name, h = handle
    ref = reference(name)
    events = list(Driver(h).generate(list(ref["prompt_ids"]), _greedy(3)))
    assert all(isinstance(e, TokenEvent) for e in events[:-1]) and isinstance(events[-1],
                                                                              Finished)
    assert [e.token_id for e in events[:-1]] == events[-1].token_ids


def test_max_tokens_and_single_token_prompt(handle):
    _, h = handle
    r = Driver(h).complete([5], _greedy(2))
    # the one prompt token is one ragged step, which samples the first token
    assert r.stats.generated_tokens == 2 and r.stats.prefill_steps == 1


def test_stop_token_ids(handle):
    name, h = handle
    ref = reference(name)
    stop = int(ref["greedy_ids"][2])
    r = Driver(h).complete(list(ref["prompt_ids"]), _greedy(stop_token_ids=[stop]))
    first = [int(x) for x in ref["greedy_ids"]].index(stop)
    assert r.token_ids == [int(x) for x in ref["greedy_ids"][:first]]
    assert r.stats.finish_reason == "stop" and r.stats.generated_tokens == first + 1


def test_context_overflow(handle):
    _, h = handle
    with pytest.raises(ContextOverflow, match="exceeds the context capacity of 32"):
        Driver(h).generate(list(range(1, 30)), _greedy(4))
    with pytest.raises(ContextOverflow):
        Driver(h).generate(list(range(1, 40)), _greedy(1))
    Driver(h).complete(list(range(1, 29)), _greedy(4))        # exactly fits


def test_bad_prompts(handle):
    _, h = handle
    with pytest.raises(InvalidRequest):
        Driver(h).generate([], _greedy())
    with pytest.raises(InvalidRequest):
        Driver(h).generate([10 ** 6], _greedy())


def test_seeded_sampling_is_reproducible(handle):
    name, h = handle
    prompt = list(reference(name)["prompt_ids"])
    p = lambda seed: SamplingParams(temperature=1.5, top_k=50, top_p=0.95, seed=seed,  # noqa
                                    max_tokens=6, ignore_eos=True)
    a = Driver(h).complete(prompt, p(7)).token_ids
    b = Driver(h).complete(prompt, p(7)).token_ids
    c = [tuple(Driver(h).complete(prompt, p(s)).token_ids) for s in (1, 2, 3)]
    assert a == b
    assert len(set(c) | {tuple(a)}) > 1


def test_penalties_and_logprobs(handle):
    name, h = handle
    prompt = list(reference(name)["prompt_ids"])
    events = list(Driver(h).generate(prompt, _greedy(4, logprobs=3,
                                                     frequency_penalty=2.0)))
    toks = events[:-1]
    assert all(e.logprob is not None and e.logprob <= 0 and len(e.top) == 3 for e in toks)
    assert all(e.top[0][1] >= e.top[1][1] >= e.top[2][1] for e in toks)


def test_stop_strings_hold_back_text():
    h = _load("llama_gguf_q4_1")
    ref = reference("llama_gguf_q4_1")
    prompt = list(ref["prompt_ids"])
    full = Driver(h).complete(prompt, _greedy(8))
    text = full.text
    assert text
    stop = text[len(text) // 2: len(text) // 2 + 2]
    events = list(Driver(h).generate(prompt, _greedy(8, stop=[stop])))
    done = events[-1]
    assert done.stats.finish_reason == "stop" and done.stop == stop
    assert done.text == text[:text.index(stop)]
    emitted = "".join(e.text for e in events[:-1])
    assert emitted == done.text and stop not in emitted


def test_stop_strings_need_a_tokenizer():
    h = _load("llama")
    with pytest.raises(InvalidRequest, match="tokenizer"):
        Driver(h).generate([1, 2], _greedy(stop=["x"]))
