"""End to end on Vulkan (lavapipe in CI): the public API compiles the tiny Llama, Gemma 3 and
DeepSeek-V3 / V2-Lite (MLA, MoE) fixtures for the device's own target and generates; greedy
tokens equal the CPU backend's and HF's."""

from pathlib import Path

import numpy as np
import pytest

from poot.api import Driver, ModelHandle
from poot.sampling_params import SamplingParams

TINY = Path(__file__).resolve().parents[1] / "fixtures" / "tiny"
FIXTURE = TINY / "llama"


@pytest.mark.parametrize("name", ["llama", "gemma3", "deepseek_v3", "deepseek_v2_lite"])
def test_greedy_generation_on_vulkan_equals_cpu_and_reference(vk_device, tmp_path, name):
    ref = np.load(TINY / name / "reference.npz")
    prompt = [int(i) for i in ref["prompt_ids"]]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    tokens = {}
    for backend in ("cpu", "vulkan"):
        handle = ModelHandle.load(TINY / name, backend=backend, kv_capacity=32,
                                  cache_dir=tmp_path, use_cache=False)
        done = Driver(handle).complete(prompt, params)
        assert done.stats.generated_tokens == 8
        tokens[backend] = done.token_ids
    assert tokens["vulkan"] == tokens["cpu"]
    # the fixtures' smallest greedy margins (llama's, gemma3's 0.34) are far above numeric
    # noise, so all 8 must match
    assert tokens["vulkan"] == [int(t) for t in ref["greedy_ids"]]


def test_vulkan_programs_come_from_the_compile_cache(vk_device, tmp_path):
    """A second load of the same model for the same device finds its four programs
    (the ragged step of one chunk, batch-1 decode, the greedy sampler of each) in the
    compile cache (SPIR-V + plan, no trace,
    no compile) and generates the same tokens (issue 24, item 9: Vulkan used to recompile
    every run)."""
    from poot.backends.vulkan.artifact import VulkanArtifact

    prompt = [int(i) for i in np.load(FIXTURE / "reference.npz")["prompt_ids"]]
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    runs = []
    for _ in range(2):
        handle = ModelHandle.load(FIXTURE, backend="vulkan", kv_capacity=32,
                                  cache_dir=tmp_path)
        runs.append((handle.compile_cache.hits, handle.compile_cache.misses,
                     Driver(handle).complete(prompt, params).token_ids))
    # the first load compiles all four (a compile worker's steps count as hits here)
    assert sum(runs[0][:2]) == 4 and runs[0][1] >= 1 and runs[1][:2] == (4, 0), runs
    assert runs[0][2] == runs[1][2]
    import pickle

    from poot.compiler.cache import unseal

    entries = list((tmp_path / "programs").glob("*.pkl"))
    assert len(entries) == 4 and not list((tmp_path / "programs").glob("*.so"))
    for e in entries:
        entry = pickle.loads(unseal(e.read_bytes(), "program", e.stem))
        assert entry["kind"] == "artifact" and isinstance(entry["artifact"], VulkanArtifact)
