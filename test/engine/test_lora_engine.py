"""LoRA adapters through the serving engine: requests of the base model and of two PEFT
adapters batched together each get the greedy tokens HF + PEFT recorded for their adapter
(test/fixtures/tiny/llama_lora); KV blocks are never shared across adapters; unloading an
adapter while its requests run loses none of them, and its slot is reused only after."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))

from engine_cases import prompts  # noqa: E402
from model_steps import FIXTURES, fixture_path, reference  # noqa: E402
from poot.api import ModelHandle  # noqa: E402
from poot.sampling_params import InvalidRequest, SamplingParams  # noqa: E402
from poot.models.lora import LoraError  # noqa: E402

LORA = FIXTURES / "llama_lora"
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """CI's compile cache when set (shared with the other tests), else a temp one."""
    return os.environ.get("POOT_CACHE_DIR") or tmp_path_factory.mktemp("poot-cache")


def _load(cache, **kw):
    return ModelHandle.load(fixture_path("llama"), kv_capacity=64, max_batch=4,
                            prefill_chunk=8, cache_dir=cache, max_loras=2, max_lora_rank=8,
                            **kw)


@pytest.fixture(scope="module")
def handle(cache):
    return _load(cache, loras={"a": LORA / "adapter_a", "b": LORA / "adapter_b"})


def _want(name):
    return list(reference("llama_lora")[f"{name}.greedy_ids"]) if name else \
        list(reference("llama")["greedy_ids"])


def test_batch_of_base_and_two_adapters_equals_hf_peft(handle):
    eng = handle.engine
    ids = [int(x) for x in reference("llama")["prompt_ids"]]
    rids = {eng.add_request(ids, GREEDY, lora=lora): name
            for lora, name in ((None, None), ("a", "adapter_a"), ("b", "adapter_b"))}
    done = {o.request_id: o for o in eng.run_until_done() if o.finished}
    assert eng.stats().max_decode_batch >= 3
    for rid, name in rids.items():
        assert list(done[rid].output_ids) == _want(name), name
    assert handle.loras() == {"a": 1, "b": 2}


def test_prefix_blocks_are_not_shared_across_adapters(handle, cache):
    """A long prompt run by the base model leaves cached blocks; the same prompt under an
    adapter must not reuse them: its tokens equal a run with prefix caching off."""
    eng = handle.engine
    long = prompts(handle.runner.vocab, 1, seed=5, lo=45, hi=45)[0]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    list(eng.generate(long, params))                           # caches the base's blocks
    rid = eng.add_request(long, params, lora="a")
    got = [o for o in eng.run_until_done() if o.request_id == rid and o.finished][0]
    assert got.stats.cached_tokens == 0
    fresh = _load(cache, prefix_caching=False, loras={"a": LORA / "adapter_a"})
    rid2 = fresh.engine.add_request(long, params, lora="a")
    want = [o for o in fresh.engine.run_until_done() if o.request_id == rid2 and o.finished][0]
    assert list(got.output_ids) == list(want.output_ids)


def test_unload_under_traffic_loses_no_request(cache):
    h = _load(cache, loras={"a": LORA / "adapter_a", "b": LORA / "adapter_b"})
    eng = h.engine
    eng.start()
    try:
        ids = [int(x) for x in reference("llama")["prompt_ids"]]
        rids = [eng.add_request(ids, GREEDY, stream=True, lora="a") for _ in range(3)]
        h.unload_lora("a")                                    # its requests keep running
        with pytest.raises(LoraError) as e:
            eng.add_request(ids, GREEDY, lora="a")
        assert e.value.field == "model"
        with pytest.raises(LoraError) as e:                  # slot 1 retired, 2 taken
            h.load_lora("c", LORA / "adapter_b")
        assert e.value.field == "lora_name" and "in use" in str(e.value)
        finals = [[o for o in eng.stream(r, timeout=120)][-1] for r in rids]
        assert all(f.finish_reason == "length" for f in finals)
        assert all(list(f.output_ids) == _want("adapter_a") for f in finals)
        assert h.load_lora("c", LORA / "adapter_b") == 1      # freed once they finished
        rid = eng.add_request(ids, GREEDY, stream=True, lora="c")
        assert list([o for o in eng.stream(rid, timeout=120)][-1].output_ids) == \
            _want("adapter_b")
    finally:
        eng.shutdown(timeout=30)


def test_lora_needs_slots(cache):
    h = ModelHandle.load(fixture_path("llama"), kv_capacity=64, max_batch=1, prefill_chunk=8,
                         cache_dir=cache, warm_up=False)
    with pytest.raises(InvalidRequest) as e:
        h.load_lora("a", LORA / "adapter_a")
    assert e.value.field == "max_loras"
    with pytest.raises(LoraError):
        h.engine.add_request([1, 2, 3], GREEDY, lora="a")
