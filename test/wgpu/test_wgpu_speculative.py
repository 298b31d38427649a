"""Speculative decoding on wgpu (lavapipe in CI): verify steps (several rows of one sequence,
every row through the head) give the tokens plain decoding gives, alone and batched."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))

from spec_cases import check_draft_equals_plain, check_speculative_equals_plain  # noqa: E402,E501


def test_speculative_greedy_equals_plain_on_wgpu(wg_device, tmp_path):
    check_speculative_equals_plain("wgpu", tmp_path)


def test_draft_model_greedy_equals_plain_on_wgpu(wg_device, tmp_path):
    check_draft_equals_plain("wgpu", tmp_path)
