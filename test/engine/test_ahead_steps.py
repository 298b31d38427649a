"""Steps issued ahead across a change of rows (``LLMEngine._issue_ahead``,
:meth:`~poot.engine.scheduler.Scheduler.plan_ahead`): where the engine pipelines, the step
after the one in flight is issued before that one is read even when its rows differ (an
arrival's prompt chunk, a row ending by length, an abort), its decode rows' tokens copied on
the device from the rows the step in flight samples (``Device.copy_rows_async``).

Forced on here (``pipeline=True``; the CPU device is synchronous, so the order of issue and
read is what is tested, not overlap). Every request's tokens are checked against the same
request alone on an engine that reads each step before issuing the next (``pipeline=False``),
so an off-by-one row in a copy, a stale token input or a position one off changes tokens.
The Vulkan and wgpu engine tests run the same loop on devices that pipeline by default."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))

from engine_cases import alone, prompts, staggered  # noqa: E402
from model_steps import fixture_path  # noqa: E402
from poot.api import LLM, ModelHandle  # noqa: E402
from poot.engine import EngineConfig  # noqa: E402
from poot.sampling_params import SamplingParams  # noqa: E402

#: a small prompt budget, so prompts take several ragged steps while others decode
BUDGET = 6


def _load(pipeline: bool, max_batch: int = 8, **kw):
    cfg = EngineConfig(max_batch=max_batch, pipeline=pipeline, max_prefill_tokens=BUDGET,
                       idle_prefill_tokens=BUDGET)
    opts = dict(kv_capacity=64, max_batch=max_batch, prefill_chunk=4, engine_config=cfg)
    opts.update(kw)
    return ModelHandle.load(fixture_path("llama"), **opts)


def _spy(engine) -> dict[str, int]:
    """Count the steps issued with a source (ahead or chained through a row copy): ragged
    ones with prompt chunks, and decode ones whose rows differ from their source's."""
    seen = {"ragged": 0, "decode": 0}
    issuer = engine.issuer
    ragged, decode = issuer.issue_ragged, issuer.issue

    def issue_ragged(d, c, source=None):
        if source is not None and c:
            seen["ragged"] += 1
        return ragged(d, c, source)

    def issue(rows, chained, lane=0, source=None):
        if source is not None and [s.id for s in rows] != [s.id for s in source.rows]:
            seen["decode"] += 1
        return decode(rows, chained, lane, source)

    issuer.issue_ragged, issuer.issue = issue_ragged, issue
    return seen


@pytest.fixture(scope="module")
def sequential():
    return _load(pipeline=False)


def _params(n: int) -> list[SamplingParams]:
    """Greedy rows with lengths from 3 to 20 (rows end by length at many steps), seeded
    top-p rows and a penalized row."""
    lengths = np.random.default_rng(5).integers(3, 20, n)
    out = []
    for i, m in enumerate(lengths):
        if i % 4 == 1:
            out.append(SamplingParams(temperature=0.9, top_p=0.9, seed=i, max_tokens=int(m),
                                      ignore_eos=True))
        elif i == 6:
            out.append(SamplingParams(temperature=0.0, max_tokens=int(m), ignore_eos=True,
                                      frequency_penalty=1.2, presence_penalty=0.4))
        else:
            out.append(SamplingParams(temperature=0.0, max_tokens=int(m), ignore_eos=True))
    return out


def test_steps_issued_ahead_equal_alone(sequential):
    """Twelve prompts arriving one step apart, rows ending by length, by a stop token id
    and by sampling: the engine issues ragged and decode steps ahead of reading the step in
    flight, and every request gets exactly its tokens alone on the sequential engine."""
    h = _load(pipeline=True)
    eng = h.engine
    ps = prompts(h.runner.vocab, 12, seed=29, lo=3, hi=30)
    sps = _params(len(ps))
    want = [alone(sequential.engine, p, sp) for p, sp in zip(ps, sps)]
    stop_at = want[2][2]                      # a stop token id ends request 2 mid-stream
    sps[2] = SamplingParams(temperature=0.0, max_tokens=sps[2].max_tokens,
                            stop_token_ids=[stop_at], ignore_eos=True)
    want[2] = want[2][:want[2].index(stop_at)]
    seen = _spy(eng)
    got = staggered(eng, list(zip(ps, sps)), every=1)
    for rid, w in zip(got["ids"], want):
        assert got["final"][rid].output_ids == w, rid
    assert got["final"][got["ids"][2]].finish_reason == "stop"
    assert seen["ragged"] >= 3 and seen["decode"] >= 1, seen
    assert eng.ahead_steps >= seen["ragged"] + seen["decode"] - 1
    assert eng.stats().ahead_steps == eng.ahead_steps
    assert eng.blocks.stats().used == 0
    eng.blocks.check()


def test_abort_of_a_row_in_flight_while_steps_go_ahead(sequential):
    """A request aborted while its row is in flight finishes ``"abort"`` at the next read
    and is left out of the step issued ahead; the others keep their alone tokens."""
    h = _load(pipeline=True)
    eng = h.engine
    ps = prompts(h.runner.vocab, 4, seed=31, lo=4, hi=16)
    sp = SamplingParams(temperature=0.0, max_tokens=14, ignore_eos=True)
    want = [alone(sequential.engine, p, sp) for p in ps]
    ids = [eng.add_request(p, sp) for p in ps]
    finals = {}
    for i in range(400):
        if i == 6:
            assert eng._in_flight(eng._find(ids[1]))     # aborted while in flight
            eng.abort(ids[1])
        for out in eng.step():
            if out.finished:
                finals[out.request_id] = out
        if not eng.has_unfinished():
            break
    assert finals[ids[1]].finish_reason == "abort"
    assert len(finals[ids[1]].output_ids) < 14
    for j in (0, 2, 3):
        assert finals[ids[j]].output_ids == want[j], j
    assert eng.ahead_steps > 0
    assert eng.blocks.stats().used == 0


def test_steps_ahead_stop_where_blocks_run_out(sequential):
    """A pool of 4 blocks for 8 requests growing to ~50 positions: where the rows in flight
    would need a block the pool does not have, the engine reads the step first and preempts;
    every request still gets its alone tokens."""
    h = _load(pipeline=True, kv_blocks=4)
    ps = prompts(h.runner.vocab, 8, seed=7, lo=20, hi=30)
    sp = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    want = [alone(sequential.engine, p, sp) for p in ps]
    res = LLM(handle=h).generate(ps, sp)
    assert [r.token_ids for r in res] == want
    assert h.engine.stats().preemptions > 0
    assert h.engine.ahead_steps > 0


def test_guided_rows_in_steps_issued_ahead(tmp_path):
    """Constrained and unconstrained requests arriving one step apart on the tiny GGUF (a
    byte-level tokenizer): a guided row's mask is computed after the step in flight is read
    (its matcher has consumed that token), so every output equals the request alone on the
    sequential engine and parses as JSON."""
    pytest.importorskip("llguidance")
    import json

    from poot.sampling_params import Guide

    gguf = Path(__file__).resolve().parents[1] / "fixtures" / "tiny" / "llama_gguf_q4_1" / \
        "model.gguf"
    handles = [ModelHandle.load(str(gguf), kv_capacity=128, max_batch=8, prefill_chunk=4,
                                cache_dir=tmp_path,
                                engine_config=EngineConfig(max_batch=8, pipeline=p,
                                                           max_prefill_tokens=BUDGET))
               for p in (False, True)]
    seq, pipe = (h.engine for h in handles)
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0,
                                                     "maximum": 99}},
              "required": ["n"], "additionalProperties": False}
    ps = prompts(handles[0].runner.vocab, 6, seed=37, lo=3, hi=14)
    sps = [SamplingParams(temperature=0.0, max_tokens=60, guided=Guide.json_schema(schema))
           if i % 2 == 0 else SamplingParams(temperature=0.0, max_tokens=4 + 3 * i,
                                             ignore_eos=True) for i in range(len(ps))]
    want = [alone(seq, p, sp) for p, sp in zip(ps, sps)]
    seen = _spy(pipe)
    got = staggered(pipe, list(zip(ps, sps)), every=1)
    for i, (rid, w) in enumerate(zip(got["ids"], want)):
        out = got["final"][rid]
        assert out.output_ids == w, i
        if i % 2 == 0:
            assert out.finish_reason == "stop"
            assert 0 <= json.loads(out.output_text)["n"] <= 99
    assert seen["ragged"] + seen["decode"] > 0, seen
