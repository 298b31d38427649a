"""End to end on Vulkan (lavapipe in CI): the public API compiles the tiny Llama fixture for
the device's own target and generates; greedy tokens equal the CPU backend's and HF's."""

from pathlib import Path

import numpy as np

from poot.api import Driver, ModelHandle
from poot.driver.params import SamplingParams

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "tiny" / "llama"


def test_greedy_generation_on_vulkan_equals_cpu_and_reference(vk_device, tmp_path):
    ref = np.load(FIXTURE / "reference.npz")
    prompt = [int(i) for i in ref["prompt_ids"]]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    tokens = {}
    for backend in ("cpu", "vulkan"):
        handle = ModelHandle.load(FIXTURE, backend=backend, kv_capacity=32,
                                  cache_dir=tmp_path, use_cache=False)
        done = Driver(handle).complete(prompt, params)
        assert done.stats.generated_tokens == 8
        tokens[backend] = done.token_ids
    assert tokens["vulkan"] == tokens["cpu"]
    # the fixture's smallest greedy margin is far above numeric noise, so all 8 must match
    assert tokens["vulkan"] == [int(t) for t in ref["greedy_ids"]]
