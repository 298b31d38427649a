"""Speculative decoding with a draft model (:mod:`poot.engine.spec.draft`): greedy requests
get exactly the tokens they get without speculation, whatever the draft (the target's own
weights: every proposal accepted; the same weights perturbed: some; random weights: almost
none), alone, batched and preempted; seeded sampled requests too, and the sampled
distribution is the target's (chi-square); a draft the target cannot verify is a typed error
naming what differs, before anything compiles."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine_cases import alone, prompts, staggered  # noqa: E402
from model_steps import fixture_path  # noqa: E402
from poot.api import LLM, ModelHandle  # noqa: E402
from poot.engine import EngineConfig  # noqa: E402
from poot.engine.spec import SpeculativeConfig, SpeculativeConfigError, parse_speculative  # noqa: E402,E501
from poot.engine.spec.adaptive import StepCosts, choose  # noqa: E402
from poot.engine.spec.draft import tokenizer_difference  # noqa: E402
from poot.sampling_params import SamplingParams  # noqa: E402
from spec_cases import sampled_tokens, timed_shapes  # noqa: E402
from test_speculative import _homogeneity  # noqa: E402

LLAMA = fixture_path("llama")


def _copy_fixture(dst: Path, noise: float | None = None, **config) -> Path:
    """The llama fixture copied to ``dst``: its config with ``config`` changed, its weights
    plus Gaussian noise of ``noise`` times each tensor's spread (None: unchanged)."""
    from safetensors.numpy import load_file, save_file

    dst.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((LLAMA / "config.json").read_text())
    cfg.update(config)
    (dst / "config.json").write_text(json.dumps(cfg))
    shutil.copy(LLAMA / "generation_config.json", dst)
    weights = load_file(str(LLAMA / "model.safetensors"))
    if noise is not None:
        rng = np.random.default_rng(3)
        weights = {k: (v + noise * v.std() * rng.standard_normal(v.shape)).astype(v.dtype)
                   for k, v in weights.items()}
    save_file(weights, str(dst / "model.safetensors"))
    return dst


@pytest.fixture(scope="module")
def noisy(tmp_path_factory) -> Path:
    """The llama fixture's weights perturbed: a draft that agrees with it part of the time."""
    return _copy_fixture(tmp_path_factory.mktemp("noisy"), noise=0.03)


def _draft(path, k=3, adaptive=False, **kw) -> SpeculativeConfig:
    return SpeculativeConfig(method="draft", draft_model=str(path), num_speculative_tokens=k,
                             adaptive=adaptive, **kw)


def _load(spec=None, max_batch=4, budget=8, **kw):
    cfg = EngineConfig(max_batch=max_batch, speculative=spec, max_prefill_tokens=budget)
    opts = dict(kv_capacity=96, max_batch=max_batch, prefill_chunk=8, engine_config=cfg)
    opts.update(kw)
    return ModelHandle.load(LLAMA, **opts)


@pytest.fixture(scope="module")
def plain():
    return _load()


def _drafts(noisy):
    return {"same": _draft(LLAMA), "noisy": _draft(noisy),
            "random": _draft(LLAMA / "config.json", draft_random_weights="f32", draft_seed=5)}


@pytest.mark.parametrize("which,lo,hi", [("same", 0.9, 1.0), ("noisy", 0.05, 0.9),
                                         ("random", 0.0, 0.2)])
def test_greedy_with_draft_equals_plain_alone_and_batched(which, lo, hi, plain, noisy):
    h = _load(_drafts(noisy)[which])
    ps = prompts(h.runner.vocab, 6, seed=5, lo=3, hi=30)
    sp = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    want = [alone(plain.engine, p, sp) for p in ps]
    assert [alone(h.engine, p, sp) for p in ps] == want
    got = staggered(h.engine, [(p, sp) for p in ps], every=2)
    assert [got["final"][r].output_ids for r in got["ids"]] == want
    st = h.engine.stats()
    assert st.spec_verify_steps > 0 and st.max_decode_batch > 1
    assert lo <= st.spec_acceptance_rate <= hi, st.spec_acceptance_rate
    fin = got["final"][got["ids"][0]].stats
    assert fin.verify_steps > 0
    assert fin.mean_accepted_length == pytest.approx(1 + fin.accepted_tokens / fin.verify_steps)
    for bm in (h.engine.blocks, h.engine.speculator.draft.blocks):
        assert bm.stats().used == 0          # the draft's blocks go back with the request
        bm.check()


def test_draft_with_preemption_equals_plain(plain, noisy):
    """A target pool of 5 blocks for 8 growing requests: preemptions in the middle of
    drafting (a preempted request gives its draft blocks back and catches the draft up on
    its whole sequence when it runs again)."""
    h = _load(_draft(noisy, k=4), kv_blocks=5, budget=128)
    ps = prompts(h.runner.vocab, 8, seed=7, lo=28, hi=31)
    sp = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    want = [alone(plain.engine, p, sp) for p in ps]
    res = LLM(handle=h).generate(ps, sp)
    assert [r.token_ids for r in res] == want
    st = h.engine.stats()
    assert st.preemptions > 0 and 0 < st.spec_accepted_tokens < st.spec_draft_tokens
    assert h.engine.blocks.stats().used == 0
    assert h.engine.speculator.draft.blocks.stats().used == 0


def test_proposals_are_the_drafts_own_greedy_continuation(noisy):
    """The draft's K/V stay right across catch-ups, rejections (roll-back) and batching:
    every proposal made while three requests decode together is what the draft model,
    run alone without speculation on the sequence so far, generates greedily."""
    h = _load(_draft(noisy, k=3))
    seen = []
    propose = h.engine.speculator.draft.propose

    def record(ks):
        out = propose(ks)
        seen.extend((list(s.tokens), d) for s, d in out.items())
        return out

    h.engine.speculator.draft.propose = record
    ps = prompts(h.runner.vocab, 3, seed=11, lo=5, hi=20)
    LLM(handle=h).generate(ps, SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True))
    st = h.engine.stats()
    assert 0 < st.spec_accepted_tokens < st.spec_draft_tokens    # rejections happened
    alone_draft = ModelHandle.load(noisy, kv_capacity=96, max_batch=4, prefill_chunk=8)
    assert len(seen) > 10
    for tokens, draft in seen[::3]:
        sp = SamplingParams(temperature=0.0, max_tokens=len(draft), ignore_eos=True)
        assert alone(alone_draft.engine, tokens, sp) == draft


def test_no_room_in_the_draft_pool_means_no_speculation(plain):
    """With every draft block taken, nobody speculates (a draft never preempts) and the
    output is unchanged."""
    h = _load(_draft(LLAMA))
    bm = h.engine.speculator.draft.blocks
    bm.allocate(bm.num_free())
    p = prompts(h.runner.vocab, 1, seed=2, lo=10, hi=10)[0]
    sp = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    assert alone(h.engine, p, sp) == alone(plain.engine, p, sp)
    assert h.engine.stats().spec_draft_tokens == 0


def test_seeded_sampling_with_draft_is_token_for_token_plain(plain, noisy):
    h = _load(_draft(noisy))
    ps = prompts(h.runner.vocab, 4, seed=13, lo=4, hi=12)
    sps = [SamplingParams(temperature=0.8, top_p=0.9, seed=s, max_tokens=24, ignore_eos=True,
                          logit_bias={7: 3.0}) for s in range(4)]
    want = LLM(handle=plain).generate(ps, sps)
    got = LLM(handle=h).generate(ps, sps)
    assert [r.token_ids for r in got] == [r.token_ids for r in want]
    assert h.engine.stats().spec_accepted_tokens > 0


def test_sampled_distribution_with_draft_is_the_targets(plain, noisy):
    """Chi-square: tokens 1..3 of a temperature + top-p + logit-bias request, sampled 800
    times with the perturbed draft proposing 2 tokens against 800 samples without it
    (other seeds). Fixed seeds: deterministic."""
    n, wave = 800, 8
    p = prompts(plain.runner.vocab, 1, seed=21, lo=6, hi=6)[0]
    base = sampled_tokens(plain, p, range(n))
    h = _load(_draft(noisy, k=2), max_batch=8, budget=64)
    spec = sampled_tokens(h, p, range(n, 2 * n), wave)
    st = h.engine.stats()
    assert 0.05 < st.spec_acceptance_rate < 0.95, st.spec_acceptance_rate
    for j in (1, 2, 3):
        assert _homogeneity(base[:, j], spec[:, j]) > 1e-3, j


def test_adaptive_draft_equals_plain_and_times_the_draft(plain):
    """Adaptive k with the cost model: the draft's catch-up and decode steps are timed
    beside the verify step, and reported in the step-time model (``poot bench``)."""
    from poot.cli.bench_cmd import _spec_stats

    h = _load(_draft(LLAMA, k=4, adaptive=True))
    ps = prompts(h.runner.vocab, 3, seed=4, lo=4, hi=12)
    sp = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    want = [alone(plain.engine, p, sp) for p in ps]
    assert [r.token_ids for r in LLM(handle=h).generate(ps, sp)] == want
    model = _spec_stats(h.engine)["spec_step_model"]
    for kind in ("draft_catchup[", "draft_decode[", "verify["):
        assert any(k.startswith(kind) for k in model["step_s"]), (kind, model)
    assert 0 < model["acceptance_rate"] <= 1


def test_plain_step_is_timed_again_while_drafting_pays(plain):
    """A plain decode step timed while the machine was busy does not keep speculation on
    for good: after a streak of drafting iterations one plain step runs and is timed."""
    h = _load(_draft(LLAMA, k=1, adaptive=True))
    shapes, equal = timed_shapes(h, plain)
    assert equal
    steps = [s for s in shapes if s[0] in ("decode", "verify")]
    assert ("decode", 1) in steps[:-2], steps          # not only at the end (k = 0 there)
    assert h.engine.speculator.costs.decode(1) < 10.0


@pytest.mark.parametrize("p", [1.0, 0.0])
def test_set_acceptance_hook_moves_only_the_acceptance(p, plain):
    """The benchmarks' hook (:mod:`poot.engine.spec.bench_acceptance`) over a random-weight
    draft: p = 1 proposes the target's own tokens (every proposal accepted), p = 0 is the
    draft's own acceptance (the same run as without the hook); the tokens are the plain
    greedy ones both times, batched."""
    from poot.engine.spec.bench_acceptance import set_acceptance

    ps = prompts(plain.runner.vocab, 4, seed=17, lo=3, hi=20)
    sp = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    want = [alone(plain.engine, q, sp) for q in ps]
    random = _drafts(None)["random"]
    hooked, bare = _load(random), _load(random)
    hook = set_acceptance(hooked.engine, {tuple(q): w for q, w in zip(ps, want)}, p, seed=1)
    for h in (hooked, bare):
        assert [r.token_ids for r in LLM(handle=h).generate(ps, sp)] == want
    st, own = hooked.engine.stats(), bare.engine.stats()
    assert st.spec_draft_tokens > 0 and hook.proposed == st.spec_draft_tokens
    if p == 1.0:
        assert st.spec_acceptance_rate == 1.0 and hook.replaced == hook.proposed
    else:
        assert own.spec_acceptance_rate < 0.2 and hook.replaced == 0
        assert (st.spec_draft_tokens, st.spec_accepted_tokens) == \
            (own.spec_draft_tokens, own.spec_accepted_tokens)
    with pytest.raises(ValueError, match="draft model"):
        set_acceptance(plain.engine, {}, 0.5)
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        set_acceptance(_load(random).engine, {}, 1.5)


def test_cost_model_counts_the_draft():
    """Verifying is cheap here, but a draft that costs a plain step per token makes
    speculating not pay at modest acceptance; a free draft does."""
    c = StepCosts(0.25)
    c.observe(("decode", 1), 1.0)
    c.observe(("verify", 4), 1.1)
    drafts = [(0.6, 3)]
    assert choose(c, 1, drafts, extra=lambda ks: 0.0) == [3]
    assert choose(c, 1, drafts, extra=lambda ks: 1.0 * max(ks)) is None
    assert choose(c, 1, drafts, extra=lambda ks: None) == [3]          # untimed: try


# ---- configuration -------------------------------------------------------------------------
def test_parse_draft():
    c = parse_speculative("draft:/m/small.gguf:3")
    assert (c.method, c.draft_model, c.num_speculative_tokens) == ("draft", "/m/small.gguf", 3)
    c = parse_speculative("draft:C:/m/small.gguf")
    assert (c.draft_model, c.num_speculative_tokens) == ("C:/m/small.gguf", 4)
    for text, field in [("draft:/m:0", "num_speculative_tokens"), ("draft:", "draft_model"),
                        ("draft:/m:99", "num_speculative_tokens")]:
        with pytest.raises(SpeculativeConfigError) as e:
            parse_speculative(text)
        assert e.value.field == field, text
    with pytest.raises(SpeculativeConfigError) as e:
        SpeculativeConfig(method="draft")
    assert e.value.field == "draft_model"
    with pytest.raises(SpeculativeConfigError) as e:
        SpeculativeConfig(method="ngram", draft_model="/m")
    assert e.value.field == "draft_model"


def _boom(*a, **k):
    raise AssertionError("a step was compiled")


def _refused(spec, path=LLAMA, **kw) -> SpeculativeConfigError:
    """The error of loading ``path`` with ``spec``, any compile failing the test."""
    with pytest.raises(SpeculativeConfigError) as e:
        ModelHandle.load(path, kv_capacity=kw.pop("kv_capacity", 96), max_batch=2,
                         compile_fn=_boom, speculative=spec, **kw)
    return e.value


def test_bad_drafts_are_typed_errors_before_compiling(tmp_path):
    e = _refused(_draft(tmp_path / "missing"))
    assert e.field == "draft_model" and "no such file" in str(e)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text("{}")
    assert _refused(_draft(tmp_path / "bad")).field == "draft_model"
    small = _copy_fixture(tmp_path / "v128", vocab_size=128)
    e = _refused(_draft(small / "config.json", draft_random_weights="f32"))
    assert e.field == "draft_vocab" and "128" in str(e) and "256" in str(e)
    short = _copy_fixture(tmp_path / "ctx64", max_position_embeddings=64)
    e = _refused(_draft(short))
    assert e.field == "draft_context" and "64" in str(e) and "96" in str(e)
    e = _refused(_draft(LLAMA), path=fixture_path("llama_gguf_q4_1"))
    assert e.field == "draft_tokenizer" and "no tokenizer" in str(e)
    e = _refused("draft:%s:16" % LLAMA)
    assert e.field == "num_speculative_tokens"


def test_short_draft_context_is_fine_within_it(tmp_path):
    """A draft whose context covers the target's KV capacity loads."""
    short = _copy_fixture(tmp_path / "ctx64", max_position_embeddings=64)
    h = ModelHandle.load(LLAMA, kv_capacity=64, max_batch=2, speculative=_draft(short),
                         warm_up=False)
    assert h.engine.draft.kv.max_model_len == 64


def test_tokenizer_difference_names_what_differs():
    from types import SimpleNamespace as NS

    def tok(tokens, bos=1, eos=2, stops=frozenset({2})):
        return NS(vocab_size=len(tokens), bos_id=bos, eos_id=eos, stop_ids=stops,
                  special_ids=frozenset({1, 2}), id_to_token=tokens.__getitem__)

    a = ["<unk>", "<s>", "</s>", "a", "b"]
    assert tokenizer_difference(tok(a), tok(list(a))) is None
    assert tokenizer_difference(None, None) is None
    assert "token id 4" in tokenizer_difference(tok(a), tok(a[:4] + ["c"]))
    assert "eos_id" in tokenizer_difference(tok(a), tok(a, eos=3))
    assert "stop_ids" in tokenizer_difference(tok(a), tok(a, stops=frozenset({2, 3})))
    assert "5 tokens" in tokenizer_difference(tok(a + ["x"]), tok(a))
    assert "no tokenizer" in tokenizer_difference(tok(a), None)


# ---- interfaces ------------------------------------------------------------------------------
def test_cli_generate_with_draft_model(capsys):
    from poot.cli import main

    gguf = str(fixture_path("llama_gguf_q4_1"))
    outs = []
    for spec in ([], ["--draft-model", gguf, "--num-draft-tokens", "3"]):
        assert main(["generate", "--model", gguf, "--prompt", "ab ab ab ab ab", "-q",
                     "--max-tokens", "24", "--ignore-eos", "--json", *spec]) == 0
        outs.append(json.loads(capsys.readouterr().out))
    assert outs[0]["token_ids"] == outs[1]["token_ids"] and outs[0]["text"] == outs[1]["text"]
    assert outs[1]["stats"]["verify_steps"] > 0 and outs[1]["stats"]["acceptance_rate"] > 0


@pytest.mark.parametrize("cmd,extra,start", [
    ("generate", ["--draft-model", "/no/such/draft.gguf"], "speculative draft_model"),
    ("generate", ["--draft-model", str(LLAMA)], "speculative draft_tokenizer"),
    ("generate", ["--num-draft-tokens", "3"], "speculative num_speculative_tokens 3"),
    ("bench", ["--draft-model", str(LLAMA), "--num-draft-tokens", "0"],
     "speculative num_speculative_tokens 0"),
    ("serve", ["--draft-model", str(LLAMA), "--speculative", "ngram"], "speculative method"),
])
def test_cli_bad_draft_is_one_error_line(cmd, extra, start, capsys):
    from poot.cli import main

    argv = [cmd, "--model", str(fixture_path("llama_gguf_q4_1")), "-q", *extra]
    if cmd == "generate":
        argv += ["--prompt", "hi"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("poot: error: " + start), err


def test_llm_draft_option(plain):
    llm = LLM(str(LLAMA), speculative=f"draft:{LLAMA}:3", kv_capacity=96, max_batch=2)
    p = prompts(plain.runner.vocab, 1, seed=8, lo=5, hi=5)[0]
    sp = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    out = llm.generate([p], sp)[0]
    assert out.token_ids == alone(plain.engine, p, sp)
    assert out.stats.verify_steps > 0 and llm.engine.stats().spec_verify_steps > 0


def test_cli_random_weight_pair_checks_the_vocabulary(tmp_path, capsys):
    """``--random-weights`` with a draft config: both random, neither has a tokenizer (the
    pair is checked by vocabulary alone); another vocabulary size is one error line."""
    from poot.cli import main

    small = _copy_fixture(tmp_path / "v128", vocab_size=128)
    argv = ["bench", "--config", str(LLAMA / "config.json"), "--random-weights", "--dtype",
            "f32", "-q", "--draft-model", str(small / "config.json")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("poot: error: speculative draft_vocab 128"), err
