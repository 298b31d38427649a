"""Speculative decoding on SmolLM2 (CPU): the shared reference prompts and input-grounded
chat prompts, greedy, alone and batched, give exactly the tokens they give without it, and
the n-gram proposer is accepted on the grounded ones."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))

from engine_cases import alone, staggered  # noqa: E402

REF = Path(__file__).resolve().parents[1] / "reference" / "smollm2"
CASES = sorted(REF.glob("[0-9][0-9]_*.json")) if REF.is_dir() else []
GROUNDED = [
    "Repeat the list with each item numbered: apples, pears, plums, cherries, grapes, lemons",
    "Rewrite this with x renamed to total:\n\ndef f(a, b):\n    x = a + b\n    x = x * 2\n"
    "    return x\n",
]


@pytest.mark.skipif(not CASES, reason=f"no SmolLM2 reference outputs at {REF}")
def test_speculative_greedy_equals_plain_on_smollm2(smollm2):
    from poot.api import ModelHandle
    from poot.sampling_params import SamplingParams

    # a handle of its own (its own KV pool: the session's engine keeps its prefix cache);
    # its steps come from the session handle's compile cache
    spec = ModelHandle.load(None, kv_capacity=256, prefill_chunk=32, max_batch=8,
                            cache_dir=str(smollm2.compile_cache.dir),
                            speculative="ngram:4").engine
    prompts = [json.loads(c.read_text())["prompt_ids"] for c in CASES]
    prompts += [smollm2.encode([{"role": "user", "content": t}]) for t in GROUNDED]
    sp = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    want = [alone(smollm2.engine, p, sp) for p in prompts]
    assert [alone(spec, p, sp) for p in prompts] == want
    assert spec.stats().spec_accepted_tokens > 0
    got = staggered(spec, [(p, sp) for p in prompts], every=2)
    assert [got["final"][r].output_ids for r in got["ids"]] == want
    assert spec.blocks.stats().used == 0
    spec.blocks.check()


@pytest.mark.skipif(not CASES, reason=f"no SmolLM2 reference outputs at {REF}")
def test_smollm2_as_its_own_draft_equals_plain(smollm2):
    """SmolLM2 drafting for itself (its own runner and KV pool, greedy): two reference
    prompts and a grounded one, alone and batched, give the tokens they give without
    speculation, nearly every proposal accepted."""
    from poot.api import ModelHandle
    from poot.engine.spec import SpeculativeConfig
    from poot.sampling_params import SamplingParams

    spec = ModelHandle.load(None, kv_capacity=256, prefill_chunk=32, max_batch=8,
                            cache_dir=str(smollm2.compile_cache.dir),
                            speculative=SpeculativeConfig(method="draft",
                                                          draft_model=str(smollm2.path),
                                                          num_speculative_tokens=3,
                                                          adaptive=False)).engine
    prompts = [json.loads(c.read_text())["prompt_ids"] for c in CASES[:2]]
    prompts += [smollm2.encode([{"role": "user", "content": GROUNDED[0]}])]
    sp = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    want = [alone(smollm2.engine, p, sp) for p in prompts]
    assert [alone(spec, p, sp) for p in prompts] == want
    got = staggered(spec, [(p, sp) for p in prompts], every=2)
    assert [got["final"][r].output_ids for r in got["ids"]] == want
    assert spec.stats().spec_acceptance_rate > 0.8
    assert spec.blocks.stats().used == 0 and spec.speculator.draft.blocks.stats().used == 0
