"""LoRA on Vulkan (lavapipe in CI): the shared GPU plan's LoRA terms (the k/v expands
folded into the KV write, the q expand with its RoPE fused beside it, the gate and up
expands one per-element kernel,
split-K shrinks beside their base projections on tensor-core targets) give a batch of the base
model and two PEFT adapters the greedy tokens HF + PEFT recorded for each
(test/fixtures/tiny/llama_lora), at decode batches 3 and 6."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))

from model_steps import FIXTURES, fixture_path, reference  # noqa: E402
from poot.api import ModelHandle  # noqa: E402
from poot.compiler import CompileOptions  # noqa: E402
from poot.engine import EngineConfig  # noqa: E402
from poot.sampling_params import SamplingParams  # noqa: E402

LORA = FIXTURES / "llama_lora"
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def handle(vk_device, tmp_path_factory):
    return ModelHandle.load(fixture_path("llama"), backend="vulkan", kv_capacity=64,
                            max_batch=8, prefill_chunk=8,
                            # every prompt in one ragged step (rows of three adapters mixed):
                            # the requests then decode together
                            engine_config=EngineConfig(max_batch=8, max_prefill_tokens=64),
                            cache_dir=tmp_path_factory.mktemp("poot-cache"), max_loras=2,
                            max_lora_rank=8, compile_options=CompileOptions(precision="exact"),
                            loras={"a": LORA / "adapter_a", "b": LORA / "adapter_b"})


def _want(name):
    return list(reference("llama_lora")[f"{name}.greedy_ids"]) if name else \
        list(reference("llama")["greedy_ids"])


@pytest.mark.parametrize("copies", [1, 2])
def test_batch_of_base_and_two_adapters_equals_hf_peft(handle, copies):
    eng = handle.engine
    ids = [int(x) for x in reference("llama")["prompt_ids"]]
    rids = {eng.add_request(ids, GREEDY, lora=lora): name for _ in range(copies)
            for lora, name in ((None, None), ("a", "adapter_a"), ("b", "adapter_b"))}
    done = {o.request_id: o for o in eng.run_until_done() if o.finished}
    assert eng.stats().max_decode_batch >= 3 * copies
    for rid, name in rids.items():
        assert list(done[rid].output_ids) == _want(name), name
