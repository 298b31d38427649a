"""The serving engine on the CPU backend with the tiny fixtures: continuous batching, paged KV,
prefix caching and preemption, each checked against the request run alone (greedy tokens
identical; seeded samples identical)."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))

from engine_cases import alone, prompts, staggered  # noqa: E402
from model_steps import fixture_path  # noqa: E402
from poot.api import LLM, ModelHandle  # noqa: E402
from poot.sampling_params import InvalidRequest, SamplingParams  # noqa: E402
from poot.engine.llm_engine import EngineError  # noqa: E402
from poot.engine import ContextOverflow, EngineConfig, KVCapacityExceeded  # noqa: E402

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


def _load(name="llama", **kw):
    opts = dict(kv_capacity=64, max_batch=32, prefill_chunk=16)
    opts.update(kw)
    return ModelHandle.load(fixture_path(name), **opts)


@pytest.fixture(scope="module")
def llama():
    return _load()


@pytest.mark.parametrize("name", ["llama", "qwen3", "gemma2", "mixtral", "deepseek_v3"])
def test_32_staggered_prompts_equal_alone(name):
    """32 different prompts arriving one step apart (batches grow and shrink through every
    bucket up to 32) each produce exactly the tokens they produce alone."""
    # two chunks of prompt tokens a step: prompts (3..24 tokens, one a step) are admitted as
    # fast as they arrive
    h = _load(name, engine_config=EngineConfig(max_batch=32, max_prefill_tokens=32))
    eng = h.engine
    ps = prompts(h.runner.vocab, 32, seed=1, lo=3, hi=24)
    params = [SamplingParams(temperature=0.0, max_tokens=int(n), ignore_eos=True)
              for n in np.random.default_rng(2).integers(16, 40, len(ps))]
    want = [alone(eng, p, sp) for p, sp in zip(ps, params)]
    got = staggered(eng, list(zip(ps, params)), every=1)
    assert eng.stats().max_decode_batch >= 16          # it did batch
    for rid, w in zip(got["ids"], want):
        assert got["final"][rid].output_ids == w, rid
    assert eng.blocks.stats().used == 0                # every block released
    eng.blocks.check()


def test_prefix_cache_on_off_identical(llama):
    """A workload sharing a 40-token system prompt (one request first, then 7 together):
    with the prefix cache the shared blocks are reused (hit rate > 0, fewer prefill steps)
    and every request's tokens are those without it."""
    h_off = _load(prefix_caching=False)
    rng = np.random.default_rng(5)
    system = rng.integers(3, 256, 40).tolist()
    users = [system + rng.integers(3, 256, int(n)).tolist() for n in rng.integers(2, 12, 8)]
    out = {}
    for tag, h in (("on", llama), ("off", h_off)):
        before = h.engine.stats()
        res = LLM(handle=h).generate(users[:1], GREEDY) + \
            LLM(handle=h).generate(users[1:], GREEDY)
        after = h.engine.stats()
        out[tag] = ([r.token_ids for r in res], after.prefill_steps - before.prefill_steps,
                    [r.stats.cached_tokens for r in res])
    assert out["on"][0] == out["off"][0]
    assert out["on"][1] < out["off"][1]
    # the full blocks of the 40 shared tokens come from the cache
    bs = llama.runner.kv.block_size
    assert max(out["on"][2]) >= (40 // bs) * bs > 0 and max(out["off"][2]) == 0
    assert llama.engine.stats().prefix_cache_hit_rate > 0


def test_preemption_completes_every_request():
    """A pool of 4 blocks (two sequences at full length) serving 8 concurrent requests that
    each grow to 60 positions: sequences are preempted and recomputed, and every request
    still gets its alone tokens; a request needing more than the pool is refused."""
    h = _load(kv_blocks=4, max_batch=8)
    eng = h.engine
    ps = prompts(h.runner.vocab, 8, seed=7, lo=20, hi=30)
    sp = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    want = [alone(eng, p, sp) for p in ps]
    res = LLM(handle=h).generate(ps, sp)
    assert [r.token_ids for r in res] == want
    assert eng.stats().preemptions > 0
    assert sum(r.stats.preemptions for r in res) == eng.stats().preemptions
    with pytest.raises(ContextOverflow, match="exceeds the context capacity of 64 tokens"):
        eng.add_request(ps[0], SamplingParams(max_tokens=60))


def test_request_larger_than_the_pool_is_refused():
    """A pool of one block: a request whose prompt + max_tokens need two is refused at once
    with the typed error naming both numbers; one that fits runs."""
    h = _load(kv_blocks=1, max_batch=1)
    bs = h.runner.kv.block_size
    with pytest.raises(KVCapacityExceeded, match=rf"needs 2 KV blocks \({bs + 2} tokens.*"
                                                 rf"holds 1 blocks \({bs} tokens\)"):
        h.engine.add_request([5] * 10, SamplingParams(max_tokens=bs - 8))
    r = LLM(handle=h).generate([[5] * 10], SamplingParams(temperature=0, max_tokens=bs - 9))
    assert len(r[0].token_ids) == bs - 9


def test_mixed_sampling_settings_one_batch(llama):
    """Greedy rows beside sampled rows (top-k/top-p/min-p, penalties, bias, log-probs) in one
    batch: greedy rows get their alone tokens, seeded rows their alone samples."""
    eng = llama.engine
    ps = prompts(llama.runner.vocab, 6, seed=11)
    sps = [GREEDY,
           SamplingParams(temperature=0.9, top_k=20, seed=3, max_tokens=12, ignore_eos=True),
           SamplingParams(temperature=0.7, top_p=0.8, min_p=0.05, seed=4, max_tokens=12,
                          ignore_eos=True),
           SamplingParams(temperature=0.0, repetition_penalty=1.3, frequency_penalty=0.5,
                          presence_penalty=0.2, max_tokens=12, ignore_eos=True),
           SamplingParams(temperature=1.0, logit_bias={5: 5.0, 9: -100}, seed=5, max_tokens=12,
                          ignore_eos=True),
           SamplingParams(temperature=0.0, logprobs=3, max_tokens=12, ignore_eos=True)]
    want = [alone(eng, p, sp) for p, sp in zip(ps, sps)]
    res = LLM(handle=llama).generate(ps, sps)
    assert [r.token_ids for r in res] == want
    lp = res[5].logprobs
    assert len(lp) == 12 and all(len(t.top) == 3 for t in lp)
    assert all(t.top[0][0] == t.token_id for t in lp)        # greedy: the top-1 is chosen
    assert all(t.logprob <= 0 for t in lp)


def test_abort_frees_blocks_and_others_continue(llama):
    eng = llama.engine
    ps = prompts(llama.runner.vocab, 3, seed=13, hi=20)
    want = alone(eng, ps[1], GREEDY)
    a = eng.add_request(ps[0], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
    b = eng.add_request(ps[1], GREEDY)
    finals = {}
    for i in range(200):
        if i == 3:
            eng.abort(a)
        for out in eng.step():
            if out.finished:
                finals[out.request_id] = out
        if not eng.has_unfinished():
            break
    assert finals[a].finish_reason == "abort"
    assert finals[b].output_ids == want
    assert eng.blocks.stats().used == 0


def test_submission_from_threads_with_background_loop(llama):
    """Requests added from 6 threads while the loop runs on its own thread: every stream is
    complete and equals its alone tokens."""
    eng = llama.engine
    ps = prompts(llama.runner.vocab, 6, seed=17)
    want = [alone(eng, p, GREEDY) for p in ps]
    got = [None] * len(ps)
    eng.start()
    try:
        def client(i):
            rid = eng.add_request(ps[i], GREEDY, stream=True)
            toks = []
            for out in eng.stream(rid, timeout=120):
                toks += out.token_ids
            got[i] = toks

        threads = [threading.Thread(target=client, args=(i,)) for i in range(len(ps))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(180)
    finally:
        eng.shutdown(10)
    assert got == want


def test_sinks_sharing_a_batch_get_each_steps_outputs_in_one_call(llama):
    """Sinks with a ``batch`` (the HTTP server's: one event-loop wake-up a step) get every
    output through ``batch.put_all``, one call per step holding all that step's outputs of
    those sinks, each request's outputs in order and complete; a sink without one still gets
    ``put`` per output."""
    eng = llama.engine
    ps = prompts(llama.runner.vocab, 4, seed=29)
    want = [alone(eng, p, GREEDY) for p in ps]

    class Batch:
        def __init__(self):
            self.calls = []

        def put_all(self, items):
            self.calls.append([(s.index, ev) for s, ev in items])

    class Sink:
        def __init__(self, index, batch):
            self.index, self.batch, self.own = index, batch, []

        def put(self, ev):
            self.own.append(ev)

    batch = Batch()
    sinks = [Sink(i, batch) for i in range(3)] + [Sink(3, None)]
    for p, sink in zip(ps, sinks):
        eng.add_request(p, GREEDY, sink=sink)
    def steps_run():
        st = eng.stats()
        return st.decode_steps + st.prefill_steps + st.ragged_steps

    steps_before = steps_run()
    eng.run_until_done()
    steps = steps_run() - steps_before
    assert batch.calls and len(batch.calls) <= steps
    assert max(len(c) for c in batch.calls) == 3           # the three decoded together
    for i in range(3):
        outs = [ev for call in batch.calls for j, ev in call if j == i]
        assert [t for o in outs for t in o.token_ids] == want[i] and outs[-1].finished
        assert not sinks[i].own
    assert [t for o in sinks[3].own for t in o.token_ids] == want[3]


def test_stream_of_a_request_that_already_finished(llama):
    """A streamed request that finishes before its client calls stream() (a fast engine
    thread) still yields all its outputs, once; a second read is a typed error."""
    eng = llama.engine
    p = prompts(llama.runner.vocab, 1, seed=23)[0]
    want = alone(eng, p, GREEDY)
    rid = eng.add_request(p, GREEDY, stream=True)
    eng.run_until_done()                                 # finished, nobody streaming yet
    outs = list(eng.stream(rid, timeout=10))
    assert outs[-1].finished and [t for o in outs for t in o.token_ids] == want
    with pytest.raises(EngineError, match="already read"):
        list(eng.stream(rid, timeout=10))


def test_request_errors_are_typed(llama):
    eng = llama.engine
    with pytest.raises(InvalidRequest, match="out of the vocabulary"):
        eng.add_request([1, 100000], GREEDY)
    with pytest.raises(InvalidRequest, match="no tokens"):
        eng.add_request([], GREEDY)
    with pytest.raises(InvalidRequest, match=r"prompts\[1\]\.prompt"):
        LLM(handle=llama).generate([[1, 2], [1, -5]], GREEDY)
    assert not eng.has_unfinished()


def test_stop_strings_need_a_tokenizer(llama):
    with pytest.raises(InvalidRequest, match="stop strings need a tokenizer"):
        llama.engine.add_request([1, 2, 3], SamplingParams(stop=["x"]))


def test_pipelined_loop_equals_alone():
    """The pipelined loop (decode step n+1 issued before step n's tokens are read, the
    sampled tokens fed back on the device; forced on here, the CPU device being synchronous)
    gives every request its alone tokens, with stops by length and by a stop token id landing
    on a step that already ran ahead, and seeded sampled rows beside greedy ones."""
    from poot.engine import EngineConfig

    h = _load(engine_config=EngineConfig(max_batch=32, pipeline=True))
    eng = h.engine
    assert eng.pipelined
    ps = prompts(h.runner.vocab, 12, seed=23, hi=24)
    sps = []
    for i in range(len(ps)):
        if i % 3 == 0:
            sps.append(SamplingParams(temperature=0.8, top_p=0.9, seed=i, max_tokens=10 + i,
                                      ignore_eos=True))
        else:
            sps.append(SamplingParams(temperature=0.0, max_tokens=6 + 2 * i, ignore_eos=True))
    want = [alone(eng, p, sp) for p, sp in zip(ps, sps)]
    # a stop token id taken from a greedy result ends that request mid-stream
    stop_at = want[1][3]
    sps[1] = SamplingParams(temperature=0.0, max_tokens=sps[1].max_tokens,
                            stop_token_ids=[stop_at], ignore_eos=True)
    want[1] = want[1][:want[1].index(stop_at)]
    got = staggered(eng, list(zip(ps, sps)), every=1)
    for rid, w in zip(got["ids"], want):
        assert got["final"][rid].output_ids == w, rid
    assert got["final"][got["ids"][1]].finish_reason == "stop"
    assert eng.blocks.stats().used == 0


def test_a_loaded_superset_sampler_serves_without_compiling(tmp_path):
    """With the FULL sampler of batch 1 loaded (what the CLI warms up), single requests using
    any sampling options but log-probs run without compiling a sampler, and get the tokens
    the exact sampler program gives (a feature a row does not use is neutral)."""
    from poot.graph.sampling import FULL

    kw = dict(kv_capacity=64, max_batch=4, prefill_chunk=16)
    full = ModelHandle.load(fixture_path("llama"), cache_dir=tmp_path / "a",
                            warm_samplers=(FULL,), **kw)
    exact = ModelHandle.load(fixture_path("llama"), cache_dir=tmp_path / "b", **kw)
    full.finish_compiling()          # FULL loaded (a cold load may leave it to a worker)
    ps = prompts(full.runner.vocab, 3, seed=41, hi=20)
    sps = [SamplingParams(temperature=0.9, top_p=0.8, seed=5, max_tokens=8, ignore_eos=True),
           SamplingParams(temperature=0.0, presence_penalty=0.5, max_tokens=8,
                          ignore_eos=True),
           SamplingParams(temperature=0.7, top_k=9, min_p=0.1, seed=6, max_tokens=8,
                          ignore_eos=True)]
    before = set(full.runner.compile_s)
    got = [LLM(handle=full).generate([p], sp)[0].token_ids for p, sp in zip(ps, sps)]
    assert set(full.runner.compile_s) == before               # nothing compiled
    want = [LLM(handle=exact).generate([p], sp)[0].token_ids for p, sp in zip(ps, sps)]
    # warm-up: the ragged entries of a chunk's bucket and of the mixed bucket (8 rows: twice
    # max batch 4), the decode entry of batch 1, a greedy sampler for each batch (4 sampled
    # rows in both ragged steps, 1); then each exact sampler, for the ragged step's rows
    # (the first token) and for decode batch 1
    assert len(exact.runner.compile_s) == 5 + 2 * len(sps)
    assert got == want


@pytest.mark.parametrize("field,value", [("idle_prefill_tokens", 0), ("max_prefill_tokens", -4),
                                         ("idle_prefill_tokens", 2.5)])
def test_prefill_budgets_must_be_positive_integers(llama, field, value):
    from poot.engine import LLMEngine

    with pytest.raises(EngineError, match=field):
        LLMEngine(llama.runner, llama.tokenizer, EngineConfig(max_batch=2, **{field: value}))


def test_a_decode_stall_bound_times_its_steps_and_keeps_every_requests_tokens():
    """``max_decode_stall=1.5``: the ladder gains the 1.5x mixed bucket (max batch 8, chunk
    16: 12 rows) and the warm-up times the ragged steps of 12 and 16 rows. With step costs
    that grow with the rows (the 2-core Xeon's, set here so that the plan does not hang on
    this machine's timing) every step that decodes takes at most the 12-row bucket's prompt
    tokens, prompts do arrive beside decoding sequences, and every request's greedy tokens
    are its tokens alone."""
    h = _load(max_batch=8, prefill_chunk=16, max_decode_stall=1.5)
    assert h.runner.stall_bounded and sorted(h.runner.ragged_costs) == [12, 16]
    assert all(c > 0 for c in h.runner.ragged_costs.values())
    h.runner.ragged_costs = {12: 0.0116, 16: 0.0145}
    eng, plans = h.engine, []
    plan_chunks = eng.scheduler._plan_chunks

    def recorded(n_decode):
        chunks = plan_chunks(n_decode)
        plans.append((n_decode, sum(len(c.token_ids) for c in chunks)))
        return chunks

    eng.scheduler._plan_chunks = recorded
    ps = prompts(h.runner.vocab, 12, seed=3, lo=10, hi=30)
    want = [alone(eng, p, GREEDY) for p in ps]
    plans.clear()
    got = staggered(eng, [(p, GREEDY) for p in ps], every=2)
    busy = [(n, t) for n, t in plans if n and t]
    assert len(busy) >= 6, plans                      # arrivals beside decoding sequences
    assert all(n + t <= 12 for n, t in busy), busy
    for rid, w in zip(got["ids"], want):
        assert got["final"][rid].output_ids == w, rid


@pytest.mark.parametrize("value", [1.0, 0.5, True, "2"])
def test_the_decode_stall_bound_must_be_a_number_above_one(llama, value):
    from poot.engine import LLMEngine

    with pytest.raises(EngineError, match="max_decode_stall"):
        LLMEngine(llama.runner, llama.tokenizer, EngineConfig(max_batch=2,
                                                             max_decode_stall=value))
