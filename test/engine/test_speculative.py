"""Speculative decoding (:mod:`poot.engine.spec`): the n-gram proposer, the settings, the
adaptive controller, and the engine's verify step. Greedy requests must get exactly the
tokens they get without speculation (alone, batched, preempted), seeded sampled requests
too (uniforms are indexed by generated token), and the sampled distribution must be the
target's (a chi-square test against the same engine without speculation, other seeds)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))

from engine_cases import alone, prompts, staggered  # noqa: E402
from model_steps import fixture_path  # noqa: E402
from poot.api import LLM, ModelHandle  # noqa: E402
from poot.engine import EngineConfig  # noqa: E402
from poot.engine.llm_engine import EngineError  # noqa: E402
from poot.engine.spec import SpeculativeConfig, SpeculativeConfigError, parse_speculative  # noqa: E402,E501
from poot.engine.spec.adaptive import Acceptance, StepCosts, choose, expected_tokens  # noqa: E402,E501
from poot.engine.spec.ngram import NgramIndex  # noqa: E402
from poot.sampling_params import SamplingParams  # noqa: E402
from spec_cases import sampled_tokens, timed_shapes  # noqa: E402


# ---- the proposer ------------------------------------------------------------------------
def test_ngram_proposes_what_followed_the_longest_latest_match():
    idx = NgramIndex(1, 3)
    toks = [5, 6, 7, 8, 9, 1, 6, 7, 2, 3, 6, 7]
    # "6 7" occurred twice before; the 3-gram "3 6 7" never: the latest "6 7" is followed
    # by 2 3 6 7
    assert idx.propose(toks, 3) == [2, 3, 6]
    toks2 = toks + [8]                      # "6 7 8" occurred at the start: 9 1 6 follow
    assert idx.propose(toks2, 3) == [9, 1, 6]
    assert idx.propose(toks2, 0) == []
    assert NgramIndex(2, 3).propose([1, 2, 3, 4], 2) == []            # no earlier match
    assert NgramIndex(1, 1).propose([4, 1, 2, 4], 5) == [1, 2, 4]      # runs to the end


def test_ngram_index_is_incremental():
    """Growing the sequence a token at a time proposes what a fresh index proposes."""
    rng = np.random.default_rng(0)
    toks = rng.integers(0, 6, 300).tolist()
    grown = NgramIndex(1, 4)
    for n in range(2, len(toks)):
        assert grown.propose(toks[:n], 4) == NgramIndex(1, 4).propose(toks[:n], 4)


# ---- settings ----------------------------------------------------------------------------
def test_parse_speculative():
    assert parse_speculative("ngram") == SpeculativeConfig()
    assert parse_speculative("ngram:7").num_speculative_tokens == 7
    assert parse_speculative(None) is None and parse_speculative("off") is None


@pytest.mark.parametrize("text,field", [("ngram:0", "num_speculative_tokens"),
                                        ("ngram:99", "num_speculative_tokens"),
                                        ("ngram:x", "num_speculative_tokens"),
                                        ("ngram:", "num_speculative_tokens"),
                                        ("eagle", "method"), (3, "config")])
def test_bad_speculative_settings_are_typed_errors(text, field):
    with pytest.raises(SpeculativeConfigError) as e:
        parse_speculative(text)
    assert e.value.field == field
    with pytest.raises(SpeculativeConfigError):
        SpeculativeConfig(prompt_lookup_min=4, prompt_lookup_max=2)


def test_bad_speculative_setting_refused_before_compiling(tmp_path):
    """An engine config with a bad speculative setting fails at load, before a step
    compiles; speculation without the ragged step is refused."""
    compiled = []
    with pytest.raises(SpeculativeConfigError):
        ModelHandle.load(fixture_path("llama"), kv_capacity=64, max_batch=2,
                         engine_config=EngineConfig(max_batch=2, speculative="ngram:16"),
                         progress=lambda *a: compiled.append(a))
    assert not [a for a in compiled if "step" in str(a[0])]
    with pytest.raises(EngineError, match="ragged"):
        ModelHandle.load(fixture_path("llama"), kv_capacity=64, max_batch=2, warm_up=False,
                         engine_config=EngineConfig(max_batch=2, ragged=False,
                                                    speculative="ngram"))


# ---- adaptive k and the cost model ---------------------------------------------------------
def test_adaptive_k_grows_with_acceptance_and_switches_off_on_misses():
    a = Acceptance()
    assert a.k(8) == 1                                     # prior alpha 1/2: one token
    for _ in range(6):
        a.observe(4, 4)
    assert a.k(8) >= 4
    for _ in range(10):
        a.observe(4, 0)
    assert a.k(8) == 0                                     # keeps missing: off
    steps = 0
    while a.k(8) == 0:
        a.idle()
        steps += 1
    assert 3 <= steps <= 40                                # and tries again later


def test_cost_model_turns_batch_speculation_off_where_rows_cost_a_step():
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)
    cheap, dear = StepCosts(0.25), StepCosts(0.25)
    for c in (cheap, dear):
        c.observe(("decode", 8), 0.010)
        c.observe(("decode", 1), 0.005)
    cheap.observe(("verify", 32), 0.012)      # extra rows nearly free (a GPU)
    dear.observe(("verify", 32), 0.040)       # each row a GEMV (a CPU)
    drafts = [(0.6, 3)] * 8
    assert choose(cheap, 8, drafts) == [3] * 8
    assert choose(dear, 8, drafts) is None
    assert choose(StepCosts(0.25), 8, drafts) == [3] * 8       # untimed: try


# ---- the engine ----------------------------------------------------------------------------
def _load(name="llama", spec=None, max_batch=4, budget=8, **kw):
    cfg = EngineConfig(max_batch=max_batch, speculative=spec, max_prefill_tokens=budget)
    opts = dict(kv_capacity=96, max_batch=max_batch, prefill_chunk=8, engine_config=cfg)
    opts.update(kw)
    return ModelHandle.load(fixture_path(name), **opts)


def _oracle(engine, refs: dict, seed=0, wrong=0.35):
    """Replace the engine's proposer by one that proposes each request's reference
    continuation (``refs``: prompt tuple -> its tokens without speculation), one token of it
    wrong with probability ``wrong``: full accepts, bonus tokens, partial accepts and
    roll-backs all happen."""
    rng = np.random.default_rng(seed)
    vocab = engine.vocab

    def propose(seq, k):
        ref = refs[tuple(seq.prompt)]
        g = len(seq.output_ids)
        draft = list(ref[g:g + k])
        if draft and rng.random() < wrong:
            j = int(rng.integers(len(draft)))
            draft[j] = (draft[j] + 1 + int(rng.integers(vocab - 1))) % vocab
        return draft

    engine.speculator.propose = propose


NO_ADAPT = SpeculativeConfig(num_speculative_tokens=5, adaptive=False)


@pytest.fixture(scope="module")
def plain():
    return _load()


@pytest.mark.parametrize("name", ["llama", "gemma2", "qwen3", "mistral_swa4"])
def test_greedy_speculation_equals_plain_alone_and_batched(name, plain, monkeypatch):
    """Alone, then arriving two steps apart: verify steps that also carry prompt chunks of
    the newcomers (a chunk ending its prompt sampled with them)."""
    import poot.engine.llm_engine as le

    ref_h = plain if name == "llama" else _load(name)
    h = _load(name, spec=NO_ADAPT)
    ps = prompts(h.runner.vocab, 8, seed=5, lo=3, hi=30)
    sp = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    want = [alone(ref_h.engine, p, sp) for p in ps]
    _oracle(h.engine, {tuple(p): w for p, w in zip(ps, want)})
    assert [alone(h.engine, p, sp) for p in ps] == want
    mixed = []
    issue = le.issue_verify
    monkeypatch.setattr(le, "issue_verify", lambda spec, groups, guided, chunks: (
        mixed.append([c.sample for c in chunks]), issue(spec, groups, guided, chunks))[1])
    got = staggered(h.engine, [(p, sp) for p in ps], every=2)
    assert any(True in m for m in mixed) and any(False in m for m in mixed)
    assert [got["final"][r].output_ids for r in got["ids"]] == want
    st = h.engine.stats()
    assert st.spec_accepted_tokens > 0 and st.spec_accepted_tokens < st.spec_draft_tokens
    assert st.max_decode_batch > 1
    assert h.engine.blocks.stats().used == 0
    h.engine.blocks.check()
    fin = got["final"][got["ids"][0]].stats
    assert fin.verify_steps > 0 and 0 < fin.acceptance_rate <= 1
    assert fin.mean_accepted_length == pytest.approx(1 + fin.accepted_tokens / fin.verify_steps)


def test_ngram_speculation_equals_plain(plain):
    """The n-gram proposer itself (adaptive), on prompts that repeat themselves."""
    h = _load(spec="ngram:4")
    ps = [p * 3 for p in prompts(h.runner.vocab, 4, seed=9, lo=4, hi=9)]
    sp = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    want = [alone(plain.engine, p, sp) for p in ps]
    assert [alone(h.engine, p, sp) for p in ps] == want
    res = LLM(handle=h).generate(ps, sp)
    assert [r.token_ids for r in res] == want
    assert h.engine.stats().spec_verify_steps > 0


def test_speculation_with_preemption_equals_plain(plain):
    """A pool of 5 blocks for 8 growing requests: preemptions in the middle of speculating
    (drafts take only free blocks; rejected ones give theirs back)."""
    h = _load(spec=NO_ADAPT, kv_blocks=5, max_batch=4, budget=128)
    ps = prompts(h.runner.vocab, 8, seed=7, lo=28, hi=31)       # a block edge ahead
    sp = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    want = [alone(plain.engine, p, sp) for p in ps]
    _oracle(h.engine, {tuple(p): w for p, w in zip(ps, want)}, wrong=0.5)
    res = LLM(handle=h).generate(ps, sp)
    assert [r.token_ids for r in res] == want
    st = h.engine.stats()
    assert st.preemptions > 0 and st.spec_accepted_tokens > 0
    assert h.engine.blocks.stats().used == 0


def test_seeded_sampling_with_speculation_is_token_for_token_plain(plain):
    """Seeded top-p + logit bias, log-probs: the same tokens as without speculation (the
    uniform of a row is its generated token's), log-probs within 1e-4."""
    h = _load(spec=NO_ADAPT)
    ps = prompts(h.runner.vocab, 4, seed=13, lo=4, hi=12)
    sps = [SamplingParams(temperature=0.8, top_p=0.9, seed=s, max_tokens=24, ignore_eos=True,
                          logit_bias={7: 3.0}, logprobs=5 if s == 1 else None)
           for s in range(4)]
    want = LLM(handle=plain).generate(ps, sps)
    _oracle(h.engine, {tuple(p): w.token_ids for p, w in zip(ps, want)})
    got = LLM(handle=h).generate(ps, sps)
    assert [r.token_ids for r in got] == [r.token_ids for r in want]
    assert np.allclose([t.logprob for t in got[1].logprobs],
                       [t.logprob for t in want[1].logprobs], atol=1e-4)
    assert h.engine.stats().spec_accepted_tokens > 0


def _chi2_sf(x: float, dof: int) -> float:
    """P(chi2_dof >= x), Wilson-Hilferty (accurate to ~1e-3 here; no scipy)."""
    z = ((x / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))
    return 0.5 * math.erfc(z / math.sqrt(2))


def _homogeneity(a: np.ndarray, b: np.ndarray) -> float:
    """p-value of the chi-square two-sample test that samples ``a`` and ``b`` (token ids)
    come from one distribution (categories expected below 5 pooled)."""
    cats = np.union1d(a, b)
    ca = np.array([(a == c).sum() for c in cats], float)
    cb = np.array([(b == c).sum() for c in cats], float)
    small = (ca + cb) / 2 < 5
    ca = np.append(ca[~small], ca[small].sum())
    cb = np.append(cb[~small], cb[small].sum())
    keep = ca + cb > 0
    ca, cb = ca[keep], cb[keep]
    tot = ca + cb
    ea, eb = tot * ca.sum() / tot.sum(), tot * cb.sum() / tot.sum()
    x = float(((ca - ea) ** 2 / ea).sum() + ((cb - eb) ** 2 / eb).sum())
    return _chi2_sf(x, len(ca) - 1)


def test_sampled_distribution_with_speculation_is_the_targets(plain):
    """Chi-square: tokens 2..4 of a temperature + top-p + logit-bias request, sampled 1200
    times with speculation (drafts of 2 tokens: the most frequent tokens there, the biased
    one, so a fair share is accepted) against 1200 samples without it, other seeds. Fixed seeds: the
    outcome is deterministic. Requests come in waves of 8, prefilled in one step (an
    iteration that prefills does not speculate)."""
    n, wave = 1200, 8
    p = prompts(plain.runner.vocab, 1, seed=21, lo=6, hi=6)[0]
    base = sampled_tokens(plain, p, range(n))
    modal = [int(np.bincount(base[:, j]).argmax()) for j in (1, 2)]
    h = _load(spec=SpeculativeConfig(num_speculative_tokens=2, adaptive=False), max_batch=8,
              budget=64)
    h.engine.speculator.propose = lambda seq, k: modal[len(seq.output_ids) - 1:][:k]
    spec = sampled_tokens(h, p, range(n, 2 * n), wave)
    st = h.engine.stats()
    assert 0.1 < st.spec_acceptance_rate < 0.95
    for j in (1, 2, 3):
        assert _homogeneity(base[:, j], spec[:, j]) > 1e-3, j


def test_choose_cuts_proposals_to_the_verify_size_that_pays_best():
    """Batch 1 on a device where 8 rows cost 4 one-row steps and 4 rows cost 2: four
    proposals (5 rows, an 8-row step) are cut to three (a 4-row step); with poor acceptance
    nothing is verified."""
    c = StepCosts(0.25)
    c.observe(("decode", 1), 1.0)
    c.observe(("verify", 2), 1.6)
    c.observe(("verify", 4), 2.0)
    c.observe(("verify", 8), 4.0)
    assert choose(c, 1, [(0.95, 4)]) == [3]
    assert choose(c, 1, [(0.3, 4)]) is None
    assert choose(StepCosts(0.25), 1, [(0.3, 4)]) == [4]         # untimed: all
    assert choose(c, 2, [(0.9, 2), (0.9, 0)]) is None            # time a plain decode[2]


# ---- interfaces ------------------------------------------------------------------------------
@pytest.mark.parametrize("cmd", ["generate", "bench", "serve"])
def test_cli_bad_speculative_is_one_error_line(cmd, capsys):
    from poot.cli import main

    argv = [cmd, "--speculative", "ngram:0", "--model", str(fixture_path("llama"))]
    if cmd == "generate":
        argv += ["--prompt", "hi"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("poot: error: speculative "
                                               "num_speculative_tokens 0"), err


def test_llm_speculative_option_and_stats():
    from poot.serve.metrics import _EngineCollector
    from types import SimpleNamespace

    compiled = []
    with pytest.raises(SpeculativeConfigError):
        LLM(str(fixture_path("llama")), speculative="ngram:x", progress=compiled.append)
    assert not compiled                             # refused before anything was opened
    llm = LLM(str(fixture_path("llama")), speculative="ngram:3", kv_capacity=96, max_batch=2)
    p = [5, 6, 7, 8] * 6
    out = llm.generate([p], SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True))[0]
    st = llm.engine.stats()
    assert st.spec_verify_steps > 0 and out.stats.verify_steps > 0
    assert out.stats.to_dict()["mean_accepted_length"] >= 1.0
    state = SimpleNamespace(pool=None, aengine=SimpleNamespace(engine=llm.engine, inflight=0,
                                                               fault=None))
    names = {m.name: m.samples[0].value for m in _EngineCollector(lambda: state).collect()}
    assert names["poot_spec_verify_steps"] == st.spec_verify_steps
    assert names["poot_spec_acceptance_rate"] == pytest.approx(st.spec_acceptance_rate)


def test_penalties_with_speculation_equal_plain(plain):
    """Repetition, frequency and presence penalties (greedy and seeded): each proposal row
    sees its own history (a history row of its own), the tokens equal plain's."""
    h = _load(spec=NO_ADAPT)
    ps = prompts(h.runner.vocab, 4, seed=31, lo=4, hi=12)
    sps = [SamplingParams(temperature=0.0, repetition_penalty=1.3, max_tokens=30,
                          ignore_eos=True),
           SamplingParams(temperature=0.0, frequency_penalty=0.8, presence_penalty=0.5,
                          max_tokens=30, ignore_eos=True),
           SamplingParams(temperature=0.9, top_k=20, frequency_penalty=0.4, seed=3,
                          max_tokens=30, ignore_eos=True),
           SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)]
    want = LLM(handle=plain).generate(ps, sps)
    _oracle(h.engine, {tuple(p): w.token_ids for p, w in zip(ps, want)}, wrong=0.3)
    got = LLM(handle=h).generate(ps, sps)
    assert [r.token_ids for r in got] == [r.token_ids for r in want]
    assert [r.stats.accepted_tokens > 0 for r in got] == [True] * 4


def test_guided_with_speculation_equals_plain():
    """JSON-schema and regex constraints (greedy and seeded) on the tiny GGUF model (a
    byte-level tokenizer): each proposal row is masked by the matcher after the proposals
    before it (proposals the constraint refuses included), the outputs equal plain's."""
    from poot.sampling_params import Guide

    gguf = fixture_path("llama_gguf_q4_1")
    plain_h = ModelHandle.load(str(gguf), kv_capacity=128, max_batch=4, prefill_chunk=16)
    h = ModelHandle.load(str(gguf), kv_capacity=128, max_batch=4, prefill_chunk=16,
                         speculative=NO_ADAPT)
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
                                               "age": {"type": "integer", "minimum": 0,
                                                       "maximum": 120}},
              "required": ["name", "age"], "additionalProperties": False}
    guides = [Guide.json_schema(schema), Guide.regex(r"[a-z]{3}-[0-9]{2,4}")]
    sps = [SamplingParams(temperature=t, seed=5, max_tokens=60, guided=g)
           for g in guides for t in (0.0, 1.0)]
    ps = [plain_h.encode("hello")] * len(sps)
    want = LLM(handle=plain_h).generate(ps, sps)

    def propose(seq, k):
        i = int(seq.id.split("-")[1]) % len(sps)
        ref = want[i].token_ids + [2]
        g = len(seq.output_ids)
        draft = list(ref[g:g + k])
        if draft and g % 3 == 1:
            draft[-1] = (draft[-1] + 7) % h.runner.vocab      # often refused by the guide
        return draft

    h.engine.speculator.propose = propose
    got = LLM(handle=h).generate(ps, sps)
    assert [r.token_ids for r in got] == [r.token_ids for r in want]
    assert [r.finish_reason for r in got] == [r.finish_reason for r in want]
    assert h.engine.stats().spec_accepted_tokens > 0


def test_new_sequence_starts_from_the_engines_recent_acceptance():
    good, bad = Acceptance(), Acceptance()
    for _ in range(10):
        good.observe(4, 4)
        bad.observe(4, 0)
    assert Acceptance.seeded(good).k(8) >= 3
    assert Acceptance.seeded(bad).k(8) == 0
    assert Acceptance.seeded(Acceptance()).k(8) == Acceptance().k(8)


def test_steady_rate_counts_the_tokens_of_verify_steps():
    """A verify step logs the tokens it yielded: the bench's decode rate counts them."""
    from poot.cli.bench_cmd import steady_rate

    log = [(0.0, 2, 0), (1.0, 2, 0, 7), (2.0, 2, 0), (3.0, 2, 0, 5)]
    assert steady_rate(log, 2) == (pytest.approx((7 + 2 + 5) / 3), 3)


def test_cli_generate_with_speculation(capsys):
    from poot.cli import main

    gguf = str(fixture_path("llama_gguf_q4_1"))
    outs = []
    for spec in ([], ["--speculative", "ngram:3"]):
        assert main(["generate", "--model", gguf, "--prompt", "ab ab ab ab ab", "-q",
                     "--max-tokens", "24", "--ignore-eos", "--json", *spec]) == 0
        outs.append(json.loads(capsys.readouterr().out))
    assert outs[0]["token_ids"] == outs[1]["token_ids"] and outs[0]["text"] == outs[1]["text"]
    assert outs[1]["stats"]["verify_steps"] > 0


def test_verify_steps_are_timed_by_their_entry():
    """The cost model's step times are keyed by the verify entry's token rows (the bucket
    its choice looks up): 5 rows (one sequence proposing 4 tokens) run on the 8-row entry,
    which samples 5 rows."""
    h = _load(spec=SpeculativeConfig(num_speculative_tokens=4, adaptive=False), max_batch=1)
    h.engine.speculator.propose = lambda seq, k: [5] * k
    LLM(handle=h).generate([[3, 4, 5, 6]], SamplingParams(temperature=0.0, max_tokens=16,
                                                         ignore_eos=True))
    shapes = set(h.engine.speculator.costs.seconds)
    assert ("verify", 8) in shapes and ("verify", 5) not in shapes, shapes


def test_step_time_is_the_fastest_recent_one():
    """A step timed while the machine was busy does not stick: the fastest of the recent
    times counts."""
    c = StepCosts(0.25)
    for t in (0.05, 0.40, 0.06):
        c.observe(("verify", 4), t)
    assert c.verify(4, 4) == 0.05
    for _ in range(20):
        c.observe(("verify", 4), 0.08)
    assert c.verify(4, 4) == 0.08                  # the window moved on


def test_engines_of_other_k_share_a_runner(plain):
    """Two speculating engines over one runner (``poot bench --batch 1,8``, a benchmark of
    several k): verify[4] samples 3 rows for k = 2 and 4 rows for k = 3, two entries."""
    from poot.engine import LLMEngine

    h = _load(max_batch=1)
    p = prompts(h.runner.vocab, 1, seed=3, lo=5, hi=5)[0]
    sp = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    want = alone(plain.engine, p, sp)
    for k in (2, 3):
        eng = LLMEngine(h.runner, h.tokenizer, EngineConfig(
            max_batch=1, speculative=SpeculativeConfig(num_speculative_tokens=k,
                                                       adaptive=False)))
        eng.speculator.propose = lambda seq, n: list(want[len(seq.output_ids):][:n])
        assert alone(eng, p, sp) == want, k
        assert eng.stats().spec_accepted_tokens > 0


def test_plain_step_is_timed_again_while_ngram_speculation_pays(plain):
    """As with a draft model: a plain decode step timed while the machine was busy does not
    keep n-gram speculation on for good; after a streak of speculating iterations one plain
    step runs and is timed."""
    h = _load(spec=SpeculativeConfig(num_speculative_tokens=1), max_batch=1)
    shapes, equal = timed_shapes(h, plain, oracle=True)
    assert equal
    steps = [s for s in shapes if s[0] in ("decode", "verify")]
    assert ("decode", 1) in steps[:-2], steps          # not only at the end (k = 0 there)
    assert h.engine.speculator.costs.decode(1) < 10.0
