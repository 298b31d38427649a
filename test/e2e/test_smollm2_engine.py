"""The serving engine on SmolLM2 (CPU): 32 prompts, the shared reference prompts among them,
arriving at staggered times and batched up to 8 at once, each produce exactly the tokens they
produce alone; the reference prompts also match HF transformers' tokens (up to a near-tie)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine_cases import alone, staggered  # noqa: E402
from smollm2_ref import agreeing_prefix  # noqa: E402

REF = Path(__file__).resolve().parents[1] / "reference" / "smollm2"
CASES = sorted(REF.glob("[0-9][0-9]_*.json")) if REF.is_dir() else []

TEXTS = [
    "The three primary colors are", "Write a haiku about the sea.", "def fibonacci(n):",
    "The capital of Japan is", "List three uses of copper:", "Once upon a time, a robot",
    "Translate 'good morning' to French:", "The speed of light is", "import numpy as np\n",
    "Why is the sky blue?", "A recipe for pancakes:", "The first man on the moon was",
    "SELECT name FROM users WHERE", "Dear hiring manager,", "The largest planet is",
    "In 1492, Columbus", "Photosynthesis converts", "The opposite of hot is",
    "Water boils at", "My favourite book is", "To be or not to be,", "2 + 2 =",
    "The quick brown fox", "Mount Everest is", "The chemical symbol for gold is",
    "Shakespeare wrote", "A prime number is", "The heart pumps",
]


@pytest.mark.skipif(not CASES, reason=f"no SmolLM2 reference outputs at {REF}")
def test_32_staggered_prompts_equal_alone_and_reference(smollm2):
    from poot.sampling_params import SamplingParams

    eng = smollm2.engine
    refs = [json.loads(c.read_text()) for c in CASES]
    prompts = [r["prompt_ids"] for r in refs]
    prompts += [smollm2.encode(t) for t in TEXTS[:32 - len(prompts)]]
    assert len(prompts) == 32 and len({tuple(p) for p in prompts}) == 32
    params = [SamplingParams(temperature=0.0, max_tokens=32 if i < len(refs) else 12,
                             ignore_eos=True) for i in range(len(prompts))]
    want = [alone(eng, p, sp) for p, sp in zip(prompts, params)]
    for r, w in zip(refs, want):
        n = agreeing_prefix(r)
        assert w[:n] == r["generated_ids"][:n]
    got = staggered(eng, list(zip(prompts, params)), every=3)
    assert eng.stats().max_decode_batch == 8
    for rid, w in zip(got["ids"], want):
        assert got["final"][rid].output_ids == w, rid
    assert eng.blocks.stats().used == 0
