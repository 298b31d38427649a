"""The pipelined decode loop on Vulkan (lavapipe in CI): the sampled token is fed back by a copy
recorded in the step's command buffer; pipelined == sequential token for token, and a stop in
the middle leaves the next request equal to one on an untouched engine (test/driver's
pipeline_cases.py).

Seeded stochastic sampling is compared on the CPU only (test/driver/test_pipeline_cpu.py): the
stochastic decode entry takes about 8 minutes to compile for lavapipe, and what pipelining
changes for it (the order of the host's uniform draws) is device-neutral driver code."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "driver"))

import pipeline_cases as pc  # noqa: E402
from model_steps import fixture_path, reference  # noqa: E402

from poot.api import ModelHandle  # noqa: E402

NAME = "llama"
OTHER = [2, 40, 9, 77, 5]


@pytest.fixture(scope="module")
def load(vk_device, tmp_path_factory):
    cache = tmp_path_factory.mktemp("poot-cache")
    return lambda: ModelHandle.load(fixture_path(NAME), backend="vulkan", kv_capacity=32,
                                    prefill_chunk=5, cache_dir=cache)


@pytest.fixture(scope="module")
def h(load):
    return load()


@pytest.fixture(scope="module")
def prompt():
    return [int(i) for i in reference(NAME)["prompt_ids"]]


def test_vulkan_greedy_and_feedback(h, prompt):
    assert h.runner.session.overlaps            # queued submissions: pipelined by default
    pc.case_greedy_and_logprobs(h, prompt)
    pc.case_max_tokens_one(h, prompt)
    pc.case_feedback_lands_in_token_input(h, prompt)


def test_vulkan_stop_mid_stream_then_next_request(h, load, prompt):
    pc.case_stop_token_then_next_request(h, load, prompt, OTHER)
    pc.case_back_to_back(h, load, prompt, OTHER, second=pc.greedy(5, **pc.PENALIZED))


def test_vulkan_penalties_history_stays_correct(h, load, prompt):
    pc.case_penalties(h, load, prompt, OTHER)
