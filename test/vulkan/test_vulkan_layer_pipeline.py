"""The layer pipeline over two Vulkan devices (lavapipe in CI): the partition and the
PipelineDevice are backend-neutral; Vulkan has no peer-copy queue operations, so boundary
values and the sampled token go through the host. Every request's greedy tokens equal the
one-device Vulkan run's, batched as two micro-batches."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))

from engine_cases import alone, prompts  # noqa: E402
from model_steps import fixture_path  # noqa: E402
from poot.api import ModelHandle  # noqa: E402
from poot.compiler import CompileOptions  # noqa: E402
from poot.sampling_params import SamplingParams  # noqa: E402
from poot.runtime.pipeline_parallel import PipelineDevice  # noqa: E402

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def second(vk_device):
    from poot.backends.vulkan.runtime import VulkanDevice

    dev = VulkanDevice()
    yield dev
    dev.close()


def test_two_vulkan_stages_equal_one_device(vk_device, second, tmp_path):
    opts = dict(backend="vulkan", kv_capacity=64, max_batch=4, prefill_chunk=8,
                cache_dir=tmp_path / "cache", compile_options=CompileOptions(precision="exact"))
    one = ModelHandle.load(fixture_path("llama"), **opts)
    pipe = ModelHandle.load(fixture_path("llama"), pipeline_parallel=2,
                            device=PipelineDevice([vk_device, second]), **opts)
    ps = prompts(one.runner.vocab, 4, seed=17, lo=3, hi=12)
    want = [alone(one.engine, p, GREEDY) for p in ps]
    rids = [pipe.engine.add_request(p, GREEDY) for p in ps]
    done = {o.request_id: o for o in pipe.engine.run_until_done() if o.finished}
    assert [list(done[r].output_ids) for r in rids] == want
    assert pipe.engine.micro_batched_steps > 0
    assert pipe.runner.session.device.peer_copies > 0
