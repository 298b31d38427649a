"""Shared by the speculative-decoding tests of the GPU backends: greedy with verify steps
(an oracle proposer: the plain run's tokens, one wrong every other step) equals plain
decoding on ``backend``, alone and batched."""

from __future__ import annotations

from engine_cases import alone, prompts, staggered
from model_steps import fixture_path


def check_speculative_equals_plain(backend: str, cache_dir) -> None:
    from poot.api import ModelHandle
    from poot.compiler import CompileOptions
    from poot.engine import EngineConfig
    from poot.engine.spec import SpeculativeConfig
    from poot.sampling_params import SamplingParams

    def load(spec):
        return ModelHandle.load(fixture_path("llama"), backend=backend, kv_capacity=48,
                                max_batch=2, prefill_chunk=4, cache_dir=cache_dir,
                                compile_options=CompileOptions(precision="exact"),
                                engine_config=EngineConfig(max_batch=2, speculative=spec))

    plain = load(None).engine
    spec = load(SpeculativeConfig(num_speculative_tokens=3, adaptive=False)).engine
    ps = prompts(plain.vocab, 3, seed=5, lo=3, hi=10)
    sp = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    want = [alone(plain, p, sp) for p in ps]
    refs = {tuple(p): w for p, w in zip(ps, want)}

    def propose(seq, k):
        g = len(seq.output_ids)
        draft = list(refs[tuple(seq.prompt)][g:g + k])
        if draft and g % 2:
            draft[-1] = (draft[-1] + 1) % plain.vocab
        return draft

    spec.speculator.propose = propose
    assert [alone(spec, p, sp) for p in ps] == want
    got = staggered(spec, [(p, sp) for p in ps], every=1)
    assert [got["final"][r].output_ids for r in got["ids"]] == want
    st = spec.stats()
    assert 0 < st.spec_accepted_tokens < st.spec_draft_tokens


def check_draft_equals_plain(backend: str, cache_dir) -> None:
    """A draft model on ``backend`` (its own runner and KV pool on the same device): the
    target's own weights as the draft (nearly every proposal accepted: the draft's K/V are
    right) and random weights of the same shapes (nearly every proposal rejected: its K/V
    rolled back every step) give the plain tokens, alone and batched."""
    from poot.api import ModelHandle
    from poot.compiler import CompileOptions
    from poot.engine import EngineConfig
    from poot.engine.spec import SpeculativeConfig
    from poot.sampling_params import SamplingParams

    path = fixture_path("llama")

    def load(spec):
        return ModelHandle.load(path, backend=backend, kv_capacity=48, max_batch=2,
                                prefill_chunk=4, cache_dir=cache_dir,
                                compile_options=CompileOptions(precision="exact"),
                                engine_config=EngineConfig(max_batch=2, speculative=spec))

    plain = load(None).engine
    ps = prompts(plain.vocab, 3, seed=5, lo=3, hi=10)
    sp = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    want = [alone(plain, p, sp) for p in ps]
    for draft, lo, hi in [(dict(draft_model=str(path)), 0.9, 1.0),
                          (dict(draft_model=str(path / "config.json"),
                                draft_random_weights="f32", draft_seed=3), 0.0, 0.3)]:
        spec = load(SpeculativeConfig(method="draft", num_speculative_tokens=3,
                                      adaptive=False, **draft)).engine
        assert [alone(spec, p, sp) for p in ps] == want
        got = staggered(spec, [(p, sp) for p in ps], every=1)
        assert [got["final"][r].output_ids for r in got["ids"]] == want
        assert lo <= spec.stats().spec_acceptance_rate <= hi, draft
        assert spec.speculator.draft.blocks.stats().used == 0
