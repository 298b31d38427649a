"""The ragged step (:mod:`poot.engine.scheduler`, ``EngineConfig.ragged``): decode rows and
prompt chunks of several requests in one step. Each request's tokens are checked against the
same request run alone on an engine that prefills in steps of its own (``ragged=False``: the
prefill entry, one sequence per step, then decode), an independent path through other
compiled programs."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))

from engine_cases import alone, prompts, staggered  # noqa: E402
from model_steps import fixture_path  # noqa: E402
from poot.api import LLM, ModelHandle  # noqa: E402
from poot.engine import EngineConfig  # noqa: E402
from poot.models import ModelError, StepSpec  # noqa: E402
from poot.sampling_params import SamplingParams  # noqa: E402

#: a small token budget so prompts span several ragged steps and chunks cross block edges
BUDGET = 6


def _load(ragged: bool, name: str = "llama", max_batch: int = 8, prefix_caching=True, **kw):
    cfg = EngineConfig(max_batch=max_batch, ragged=ragged, max_prefill_tokens=BUDGET,
                       idle_prefill_tokens=BUDGET, prefix_caching=prefix_caching)
    opts = dict(kv_capacity=64, max_batch=max_batch, prefill_chunk=4, engine_config=cfg)
    opts.update(kw)
    return ModelHandle.load(fixture_path(name), **opts)


def _record(engine) -> list[tuple[int, list[tuple[int, int, bool]]]]:
    """Record every ragged step the engine issues: (decode rows, [(chunk start, chunk
    tokens, samples)])."""
    log = []
    issue = engine.issuer.issue_ragged

    def spy(decode, chunks, source=None):
        log.append((len(decode), [(c.start, len(c.token_ids), c.sample) for c in chunks]))
        return issue(decode, chunks, source)

    engine.issuer.issue_ragged = spy
    return log


@pytest.fixture(scope="module")
def separate():
    return _load(ragged=False)


@pytest.mark.parametrize("name", ["llama", "gemma2"])
def test_staggered_ragged_steps_equal_alone(name, separate):
    """Ten prompts of 3..44 tokens arriving one step apart: the ragged steps mix decode rows
    with chunks of several prompts (a prompt split over steps, chunks starting inside a
    block and crossing into the next), and every request gets exactly its tokens alone on
    the separate-prefill engine and alone on the ragged one."""
    ref = separate if name == "llama" else _load(ragged=False, name=name)
    h = _load(ragged=True, name=name, prefix_caching=False)   # every prompt computed
    bs = h.runner.kv.block_size
    ps = prompts(h.runner.vocab, 10, seed=11, lo=3, hi=44)
    ps[0] = prompts(h.runner.vocab, 1, seed=12, lo=40, hi=40)[0]   # 40 tokens: past a block
    sps = [SamplingParams(temperature=0.0, max_tokens=int(n), ignore_eos=True)
           for n in np.random.default_rng(4).integers(4, 16, len(ps))]
    want = [alone(ref.engine, p, sp) for p, sp in zip(ps, sps)]
    assert [alone(h.engine, p, sp) for p, sp in zip(ps, sps)] == want
    log = _record(h.engine)
    got = staggered(h.engine, list(zip(ps, sps)), every=1)
    for rid, w in zip(got["ids"], want):
        assert got["final"][rid].output_ids == w, rid
    chunks = [c for _, cs in log for c in cs]
    assert any(d > 0 and cs for d, cs in log)                  # decode rows + a prompt chunk
    assert any(len(cs) >= 2 for _, cs in log)                  # chunks of several prompts
    assert any(not sample for _, _, sample in chunks)          # a prompt split over steps
    assert any(start % bs for start, _, _ in chunks)           # a chunk starting mid-block
    assert any(start // bs != (start + n - 1) // bs
               for start, n, _ in chunks)                      # a chunk crossing a block edge
    # the budget, plus the rows the step's bucket would otherwise pad
    bucket = h.runner.ragged_bucket
    assert all(sum(n for _, n, _ in cs) <= bucket(d + BUDGET) - d for d, cs in log)
    assert h.engine.blocks.stats().used == 0
    h.engine.blocks.check()


def test_mixed_bucket_steps_equal_alone(separate):
    """max batch 2, prompt chunks of 8: steps of two decode rows and up to two prompt
    tokens (a prompt's last tokens, most of it in the prefix cache) run on the 4-row mixed
    bucket instead of padding to a chunk, and every request still gets its alone tokens."""
    h = _load(ragged=True, max_batch=2, prefill_chunk=8)
    assert h.runner.ragged_bucket(3) == 4 and h.runner.ragged_bucket(5) == 8
    bs = h.runner.kv.block_size
    shared = prompts(h.runner.vocab, 1, seed=31, lo=bs, hi=bs)[0]   # a block, cached once seen
    tails = prompts(h.runner.vocab, 6, seed=32, lo=1, hi=3)
    ps = [shared + t for t in tails]
    sps = [SamplingParams(temperature=0.0, max_tokens=int(n), ignore_eos=True)
           for n in np.random.default_rng(5).integers(6, 14, len(ps))]
    want = [alone(separate.engine, p, sp) for p, sp in zip(ps, sps)]
    buckets = []
    entry = h.runner.ragged_entry

    def spy(tokens):
        buckets.append(tokens)
        return entry(tokens)

    h.runner.ragged_entry = spy
    log = _record(h.engine)
    got = staggered(h.engine, list(zip(ps, sps)), every=3)
    for rid, w in zip(got["ids"], want):
        assert got["final"][rid].output_ids == w, rid
    assert h.engine.blocks.stats().hit_blocks > 0
    # steps of decode rows and a prompt tail that fit 4 rows ran, on the 4-row entry
    assert any(d > 0 and cs and d + sum(n for _, n, _ in cs) <= 4 for d, cs in log), log
    assert 4 in buckets and 8 in buckets, buckets


def test_ragged_steps_with_preemption_equal_alone(separate):
    """A pool of 4 blocks for 8 requests growing to ~50 positions: requests are preempted
    and recomputed through ragged steps, and each still gets its alone tokens."""
    h = _load(ragged=True, kv_blocks=4)
    ps = prompts(h.runner.vocab, 8, seed=7, lo=20, hi=30)
    sp = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    want = [alone(separate.engine, p, sp) for p in ps]
    log = _record(h.engine)
    res = LLM(handle=h).generate(ps, sp)
    assert [r.token_ids for r in res] == want
    assert h.engine.stats().preemptions > 0 and log


def test_sampled_rows_of_a_ragged_step_equal_alone(separate):
    """Seeded top-p, penalties and log-probs on rows whose first token comes from the
    ragged step that finishes their prompt: the tokens equal each request's alone run on
    the separate-prefill engine, the log-probs within 1e-4."""
    h = _load(ragged=True)
    ps = prompts(h.runner.vocab, 4, seed=23, lo=5, hi=14)
    sps = [SamplingParams(temperature=0.8, top_p=0.9, seed=5, max_tokens=8, ignore_eos=True),
           SamplingParams(temperature=0.0, repetition_penalty=1.4, frequency_penalty=0.5,
                          max_tokens=8, ignore_eos=True),
           SamplingParams(temperature=0.0, logprobs=2, max_tokens=8, ignore_eos=True),
           SamplingParams(temperature=1.0, top_k=5, seed=9, max_tokens=8, ignore_eos=True)]
    ref = LLM(handle=separate)
    want = [ref.generate([p], sp)[0] for p, sp in zip(ps, sps)]
    log = _record(h.engine)
    got = LLM(handle=h).generate(ps, sps)
    assert any(sample for _, cs in log for _, _, sample in cs)
    assert [r.token_ids for r in got] == [r.token_ids for r in want]
    lp_got = [t.logprob for t in got[2].logprobs]
    lp_want = [t.logprob for t in want[2].logprobs]
    assert np.allclose(lp_got, lp_want, atol=1e-4)


def test_ragged_spec_checks_its_logit_rows():
    """StepSpec.ragged: S logit rows in [1, B]; a spec with a sampler suffix or prefill
    kind cannot carry them."""
    spec = StepSpec.ragged(16, logit_rows=4, kv_capacity=64, block_size=16)
    assert (spec.batch, spec.tokens, spec.logit_rows) == (16, 1, 4)
    for bad in (0, 17, True):
        with pytest.raises(ModelError, match="logit_rows"):
            StepSpec.ragged(16, logit_rows=bad, kv_capacity=64, block_size=16)
    with pytest.raises(ModelError, match="logit_rows"):
        StepSpec("prefill", 1, 4, 64, logit_rows=2)
