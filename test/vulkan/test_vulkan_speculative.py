"""Speculative decoding on vulkan (lavapipe in CI): verify steps (several rows of one sequence,
every row through the head) give the tokens plain decoding gives, alone and batched; so does
a draft model on its own runner and KV pool."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))

from spec_cases import draft_vs_plain, speculative_vs_plain  # noqa: E402


def test_speculative_greedy_equals_plain_on_vulkan(vk_device, tmp_path):
    r = speculative_vs_plain("vulkan", tmp_path)
    assert r.alone == r.want and r.batched == r.want
    assert 0 < r.accepted < r.proposed and r.blocks_used == 0


def test_draft_model_greedy_equals_plain_on_vulkan(vk_device, tmp_path):
    same, random = draft_vs_plain("vulkan", tmp_path)
    for r in (same, random):
        assert (r.alone, r.batched, r.draft_blocks_used) == (r.want, r.want, 0), r.label
    assert same.acceptance >= 0.9 and random.acceptance <= 0.3
