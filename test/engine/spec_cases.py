"""Shared by the speculative-decoding tests. The GPU backends' runs (the tests assert on what
they return): greedy with verify steps (an oracle proposer: the plain run's tokens, one
wrong every other step) against plain decoding on ``backend``, alone and batched; a draft
model likewise. The CPU tests' pieces: the seeded samples of the chi-square tests, and the
step shapes an engine times while it speculates."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine_cases import alone, prompts, staggered
from model_steps import fixture_path


@dataclass
class SpecRun:
    """What one speculative run gave beside plain decoding: the plain tokens (``want``), the
    speculating engine's alone and batched, its draft and accepted token totals and
    acceptance rate, and the target's and the draft's blocks still used afterwards."""

    want: list
    alone: list
    batched: list
    proposed: int
    accepted: int
    acceptance: float
    blocks_used: int
    draft_blocks_used: int | None = None
    label: str = ""


def _load(backend: str, cache_dir, spec):
    from poot.api import ModelHandle
    from poot.compiler import CompileOptions
    from poot.engine import EngineConfig

    return ModelHandle.load(fixture_path("llama"), backend=backend, kv_capacity=48,
                            max_batch=2, prefill_chunk=4, cache_dir=cache_dir,
                            compile_options=CompileOptions(precision="exact"),
                            engine_config=EngineConfig(max_batch=2, speculative=spec))


def _greedy():
    from poot.sampling_params import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)


def _run(engine, ps, want, label="") -> SpecRun:
    sp = _greedy()
    solo = [alone(engine, p, sp) for p in ps]
    got = staggered(engine, [(p, sp) for p in ps], every=1)
    st = engine.stats()
    draft = getattr(engine.speculator, "draft", None)
    return SpecRun(want, solo, [got["final"][r].output_ids for r in got["ids"]],
                   st.spec_draft_tokens, st.spec_accepted_tokens, st.spec_acceptance_rate,
                   engine.blocks.stats().used,
                   None if draft is None else draft.blocks.stats().used, label)


def speculative_vs_plain(backend: str, cache_dir) -> SpecRun:
    """Verify steps of an oracle's proposals (the plain tokens, the last of every other
    proposal wrong) on ``backend``, alone and batched."""
    from poot.engine.spec import SpeculativeConfig

    plain = _load(backend, cache_dir, None).engine
    spec = _load(backend, cache_dir,
                 SpeculativeConfig(num_speculative_tokens=3, adaptive=False)).engine
    ps = prompts(plain.vocab, 3, seed=5, lo=3, hi=10)
    want = [alone(plain, p, _greedy()) for p in ps]
    refs = {tuple(p): w for p, w in zip(ps, want)}

    def propose(seq, k):
        g = len(seq.output_ids)
        draft = list(refs[tuple(seq.prompt)][g:g + k])
        if draft and g % 2:
            draft[-1] = (draft[-1] + 1) % plain.vocab
        return draft

    spec.speculator.propose = propose
    return _run(spec, ps, want)


def draft_vs_plain(backend: str, cache_dir) -> list[SpecRun]:
    """A draft model on ``backend`` (its own runner and KV pool on the same device): the
    target's own weights as the draft (``"same"``: nearly every proposal accepted, the
    draft's K/V are right) and random weights of the same shapes (``"random"``: nearly every
    proposal rejected, its K/V rolled back every step), alone and batched."""
    from poot.engine.spec import SpeculativeConfig

    path = fixture_path("llama")
    plain = _load(backend, cache_dir, None).engine
    ps = prompts(plain.vocab, 3, seed=5, lo=3, hi=10)
    want = [alone(plain, p, _greedy()) for p in ps]
    runs = []
    for label, draft in [("same", dict(draft_model=str(path))),
                         ("random", dict(draft_model=str(path / "config.json"),
                                         draft_random_weights="f32", draft_seed=3))]:
        spec = _load(backend, cache_dir, SpeculativeConfig(
            method="draft", num_speculative_tokens=3, adaptive=False, **draft)).engine
        runs.append(_run(spec, ps, want, label))
    return runs


def chi_square_params(seed: int):
    """The chi-square tests' request: temperature + top-p + a logit bias, seeded."""
    from poot.sampling_params import SamplingParams

    return SamplingParams(temperature=0.7, top_p=0.9, logit_bias={7: 3.0}, seed=seed,
                          max_tokens=4, ignore_eos=True)


def sampled_tokens(handle, prompt, seeds, wave: int | None = None) -> np.ndarray:
    """i64 [len(seeds), 4]: the tokens of :func:`chi_square_params` requests of ``prompt``,
    one per seed, ``wave`` at a time (None: all at once)."""
    from poot.api import LLM

    llm, seeds = LLM(handle=handle), list(seeds)
    wave = wave or len(seeds)
    return np.array([r.token_ids for w in range(0, len(seeds), wave)
                     for r in llm.generate([prompt] * len(seeds[w:w + wave]),
                                           [chi_square_params(s)
                                            for s in seeds[w:w + wave]])])


def timed_shapes(handle, plain, oracle: bool = False, busy_s: float = 10.0,
                 max_tokens: int = 80):
    """A prompt run greedily by ``handle``'s speculating engine after a plain decode step was
    timed at ``busy_s`` (a busy moment): the step shapes the engine timed, in order, and
    whether its tokens are ``plain``'s (an engine without speculation). ``oracle``: the
    proposals are the plain tokens (every one accepted)."""
    from poot.sampling_params import SamplingParams

    p = prompts(handle.runner.vocab, 1, seed=3, lo=5, hi=5)[0]
    sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    want = alone(plain.engine, p, sp)
    spec = handle.engine.speculator
    if oracle:
        spec.propose = lambda seq, k: list(want[len(seq.output_ids):][:k])
    spec.costs.observe(("decode", 1), busy_s)
    shapes = []
    observe = spec.costs.observe
    spec.costs.observe = lambda shape, s: (shapes.append(shape), observe(shape, s))
    return shapes, alone(handle.engine, p, sp) == want
