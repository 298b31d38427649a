"""The pipelined decode loop on the CPU device (compiled tiny fixtures): token for token the
sequential loop's, stops in the middle harmless to the next request (see pipeline_cases.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "models"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import pipeline_cases as pc  # noqa: E402
from model_steps import fixture_path, reference  # noqa: E402

from poot.api import ModelHandle  # noqa: E402
from poot.engine import EngineConfig, LLMEngine  # noqa: E402

NAME = "llama_gguf_q4_1"        # has a tokenizer: stop strings and text too
OTHER = [2, 40, 9, 77, 5]


@pytest.fixture(scope="module")
def load(tmp_path_factory):
    cache = tmp_path_factory.mktemp("poot-cache")
    return lambda: ModelHandle.load(fixture_path(NAME), kv_capacity=32, prefill_chunk=5,
                                    max_batch=1, cache_dir=cache)


@pytest.fixture(scope="module")
def h(load):
    return load()


@pytest.fixture(scope="module")
def prompt():
    return [int(i) for i in reference(NAME)["prompt_ids"]]


def test_cpu_does_not_pipeline_by_default(h, monkeypatch):
    def mode(**kw):
        return LLMEngine(h.runner, h.tokenizer, EngineConfig(max_batch=1, **kw)).pipelined

    monkeypatch.delenv("POOT_PIPELINE", raising=False)
    assert not h.runner.session.overlaps and not mode() and not h.engine.pipelined
    monkeypatch.setenv("POOT_PIPELINE", "1")
    assert mode()
    monkeypatch.setenv("POOT_PIPELINE", "0")
    assert not mode() and mode(pipeline=True)


def test_greedy_and_logprobs(h, prompt):
    pc.case_greedy_and_logprobs(h, prompt)


def test_seeded_sampling(h, prompt):
    pc.case_seeded_sampling(h, prompt)


def test_max_tokens_one(h, prompt):
    pc.case_max_tokens_one(h, prompt)


def test_stop_token_mid_stream_then_next_request(h, load, prompt):
    pc.case_stop_token_then_next_request(h, load, prompt, OTHER)


def test_penalties_history_stays_correct(h, load, prompt):
    pc.case_penalties(h, load, prompt, OTHER)


def test_back_to_back(h, load, prompt):
    pc.case_back_to_back(h, load, prompt, OTHER)


def test_abandoned_stream(h, load, prompt):
    pc.case_abandoned_stream(h, load, prompt, OTHER)


def test_stop_string_mid_stream(h, prompt):
    text = pc.run(h, prompt, pc.greedy(8), False).text
    assert text
    stop = text[len(text) // 2: len(text) // 2 + 2]
    a, b = pc.same_run(h, prompt, pc.greedy(8, stop=[stop]))
    assert a.stop == stop and a.stats.finish_reason == "stop"


def test_feedback_lands_in_token_input(h, prompt):
    pc.case_feedback_lands_in_token_input(h, prompt)
