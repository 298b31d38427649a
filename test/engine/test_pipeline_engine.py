"""The layer pipeline through the serving engine on CPU devices (``pipeline_parallel``):
every request's greedy tokens equal the one-device run's and the independent references
(HF, HF + PEFT); each device holds only its stages' weights and KV pools; the sampled token
and the boundary activations move between devices every step.

The CPU devices copy through the host (they have no queue); the CUDA device's queued peer
copies and event ordering are tested with the fake driver (test/gpu/test_cuda_peer.py) and
on the GPU machine (bench/gpu_run/pipeline_tokens.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))

from engine_cases import alone, prompts, staggered  # noqa: E402
from model_steps import FIXTURES, fixture_path, reference  # noqa: E402
from poot.api import ModelHandle  # noqa: E402
from poot.compiler.pipeline_parallel import PipelineRefusal  # noqa: E402
from poot.sampling_params import InvalidRequest, SamplingParams  # noqa: E402
from poot.runtime.pipeline_parallel import PipelineDevice  # noqa: E402

GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """CI's compile cache when set (shared with the other tests), else a temp one."""
    return os.environ.get("POOT_CACHE_DIR") or tmp_path_factory.mktemp("poot-cache")


def _load(cache, name="llama", n=2, **kw):
    opts = dict(kv_capacity=64, max_batch=8, prefill_chunk=8, cache_dir=cache,
                pipeline_parallel=n)
    opts.update(kw)
    return ModelHandle.load(fixture_path(name), **opts)


@pytest.mark.parametrize("name,n", [("llama", 2), ("llama", 3), ("mixtral", 2),
                                    ("deepseek_v3", 2)])
def test_staggered_batch_equals_one_device(cache, name, n):
    """Eight prompts arriving two steps apart through an N-stage pipeline each get exactly
    the tokens the one-device engine gives them alone."""
    one = _load(cache, name, 1)
    pipe = _load(cache, name, n)
    assert isinstance(pipe.runner.session.device, PipelineDevice)
    ps = prompts(one.runner.vocab, 8, seed=3, lo=3, hi=20)
    want = [alone(one.engine, p, GREEDY) for p in ps]
    got = staggered(pipe.engine, [(p, GREEDY) for p in ps], every=2)
    assert pipe.engine.stats().max_decode_batch >= 2
    for rid, w in zip(got["ids"], want):
        assert got["final"][rid].output_ids == w
    dev = pipe.runner.session.device
    assert dev.peer_copies >= pipe.runner.decode_steps * (n - 1)


def test_reference_tokens_through_two_stages(cache):
    """The fixture's prompt generates HF's greedy tokens on a two-stage pipeline."""
    h = _load(cache)
    ref = reference("llama")
    ids = [int(x) for x in ref["prompt_ids"]]
    want = [int(x) for x in ref["greedy_ids"]]
    out = alone(h.engine, ids, SamplingParams(temperature=0.0, max_tokens=len(want),
                                              ignore_eos=True))
    assert out == want


def test_each_device_holds_its_stage(cache):
    """Every KV pool lives on one device, the same for the prefill and the decode steps (the
    prefill, which has no LM head, is cut where the decode step puts the pools); layer 0's
    projections and the embedding on the first device, the LM head on the last."""
    h = _load(cache)
    alone(h.engine, [5, 6, 7], GREEDY)
    eng = h.runner.session
    where = {n: set(b.copies) for n, b in eng._weights.items()}
    assert where["tok_embed"] == {0} and where["lm_head"] == {1}
    for n, devs in where.items():
        if n.startswith("blk.0.") and "norm" not in n:
            assert devs == {0}, n
    for n, st in eng._state.items():
        if n.startswith("kv."):
            devs = set().union(*(set(b.copies) for b in st.buffers))
            assert len(devs) == 1, (n, devs)


def test_adapters_through_two_stages_equal_hf_peft(cache):
    """A batch of the base model and two PEFT adapters on a two-stage pipeline: each gets
    the greedy tokens HF + PEFT recorded (LoRA slot weights live on their layer's
    device)."""
    lora = FIXTURES / "llama_lora"
    h = _load(cache, max_batch=4, max_loras=2, max_lora_rank=8,
              loras={"a": lora / "adapter_a", "b": lora / "adapter_b"})
    eng = h.engine
    ids = [int(x) for x in reference("llama")["prompt_ids"]]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    rids = {eng.add_request(ids, params, lora=lora_): name
            for lora_, name in ((None, None), ("a", "adapter_a"), ("b", "adapter_b"))}
    done = {o.request_id: o for o in eng.run_until_done() if o.finished}
    for rid, name in rids.items():
        want = list(reference("llama_lora")[f"{name}.greedy_ids"]) if name else \
            list(reference("llama")["greedy_ids"])
        assert list(done[rid].output_ids) == want, name


def test_too_many_stages_refused_before_compiling(cache):
    compiled = []
    with pytest.raises(PipelineRefusal, match="into 64 pipeline stages"):
        ModelHandle.load(fixture_path("llama"), kv_capacity=64, max_batch=1,
                         prefill_chunk=8, pipeline_parallel=64,
                         compile_fn=lambda g: compiled.append(g))
    assert compiled == []


@pytest.mark.parametrize("bad", [0, -2, 1.5, "2"])
def test_pipeline_parallel_must_be_positive_int(cache, bad):
    with pytest.raises(InvalidRequest, match="pipeline_parallel"):
        _load(cache, n=bad)


NO_MLIR_LOAD = """
import json, sys
sys.modules['mlir'] = None                        # this process cannot import MLIR
from types import SimpleNamespace
import numpy as np
from poot.api import ModelHandle
from poot.backends.gpu.artifact import host_of, kernel_args
from poot.runtime.pipeline_parallel import PipelineDevice

class Device:  # the executor's Device protocol, enough to load weights and programs
    name = "cuda"
    def __init__(self):
        self.loaded = []
    def alloc(self, t):
        return np.zeros(host_of(t)[2], np.uint8)
    def upload(self, buf, array):
        pass
    def load(self, program):
        self.loaded.append(program.executable.plan)
        return SimpleNamespace(args=kernel_args(program.executable.plan))

devs = [Device(), Device()]
h = ModelHandle.load(sys.argv[1], "cuda", kv_capacity=64, max_batch=1, prefill_chunk=8,
                     cache_dir=sys.argv[2], pipeline_parallel=2, device=PipelineDevice(devs))
print(json.dumps({"loaded": [[sorted(x["name"] for x in p["inputs"] + p["outputs"])
                              for p in d.loaded] for d in devs],
                  "hits": h.compile_cache.hits,
                  "mlir": sorted(m for m in sys.modules if m.startswith("mlir.")
                                 and sys.modules[m] is not None)}))
"""


def test_carried_cache_loads_the_pipeline_without_mlir(tmp_path):
    """``poot compile --backend cuda --pipeline-parallel 2`` here fills a cache from which a
    process that cannot import MLIR (the GPU machine) loads both stages of the ragged and
    decode steps, each on its own device (the sampler on the last), with the boundary
    between them."""
    import json
    import subprocess

    cache = tmp_path / "cache"
    env = dict(os.environ, POOT_CACHE_DIR=str(cache))
    root = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, "-m", "poot.cli", "compile", "--model",
                        str(fixture_path("llama")), "--backend", "cuda", "--kv-capacity", "64",
                        "--max-batch", "1", "--prefill-chunk", "8", "--pipeline-parallel", "2",
                        "--cache-dir", str(cache), "--quiet"],
                       capture_output=True, text=True, env=env, cwd=root, timeout=900)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([sys.executable, "-c", NO_MLIR_LOAD, str(fixture_path("llama")),
                        str(cache)], capture_output=True, text=True, env=env, cwd=root,
                       timeout=900)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["mlir"] == [] and got["hits"] >= 3
    first, last = got["loaded"]
    # the ragged and decode steps: stage 0 on device 0 sends one boundary that stage 1
    # receives
    assert len(first) == 2 and len(last) >= 3        # + the sampler(s) on the last device
    kv = lambda progs: {n for names in progs for n in names if n.startswith("kv.")}  # noqa
    assert kv(first) and not kv(first) & kv(last)        # each pool on one device
    for names in first:
        assert "kv.0.k" in names and "tokens" in names
        assert sum(n.startswith("pipeline.v") for n in names) == 1
    stages = [names for names in last if "sampling.token" not in names]
    assert len(stages) == 2
    for names in stages:
        assert sum(n.startswith("pipeline.v") for n in names) == 1


def test_micro_batched_steps_on_a_pipeline(cache):
    """Six sequences on a two-stage pipeline decode as two micro-batches a step (both issued
    before either is read) and each gets its tokens alone."""
    from poot.engine import EngineConfig

    one = _load(cache, n=1)
    # every prompt in the first (ragged) step: the decode steps after it are micro-batched
    pipe = _load(cache, engine_config=EngineConfig(max_batch=8, max_prefill_tokens=80))
    assert pipe.engine.micro_batches == 2
    ps = prompts(one.runner.vocab, 6, seed=9, lo=3, hi=12)
    want = [alone(one.engine, p, GREEDY) for p in ps]
    rids = [pipe.engine.add_request(p, GREEDY) for p in ps]
    done = {o.request_id: o for o in pipe.engine.run_until_done() if o.finished}
    assert [list(done[r].output_ids) for r in rids] == want
    assert pipe.engine.micro_batched_steps >= GREEDY.max_tokens - 1
    assert ("decode", 4, 1) in pipe.runner._entries        # lane 1's own decode entry


@pytest.mark.parametrize("micro", [2, 3])
def test_micro_batches_on_one_device_equal_alone(cache, micro):
    """Micro-batching is the engine's, not the pipeline's: on one CPU device, requests with
    seeded sampling, penalties and greedy rows mixed decode as ``micro`` micro-batches and
    each gets exactly its tokens alone."""
    from poot.engine import EngineConfig, LLMEngine

    h = _load(cache, n=1)
    ps = prompts(h.runner.vocab, 7, seed=13, lo=3, hi=16)
    params = [SamplingParams(temperature=0.0, max_tokens=9, ignore_eos=True),
              SamplingParams(temperature=0.9, top_k=20, seed=3, max_tokens=9,
                             ignore_eos=True),
              SamplingParams(temperature=0.7, top_p=0.8, repetition_penalty=1.3, seed=5,
                             max_tokens=9, ignore_eos=True)]
    items = [(p, params[i % 3]) for i, p in enumerate(ps)]
    want = [alone(h.engine, p, sp) for p, sp in items]
    eng = LLMEngine(h.runner, h.tokenizer, EngineConfig(max_batch=8, micro_batches=micro))
    got = staggered(eng, items, every=1)
    for rid, w in zip(got["ids"], want):
        assert got["final"][rid].output_ids == w
    assert eng.micro_batched_steps > 0


def test_micro_batches_must_be_positive():
    from poot.engine import EngineConfig, LLMEngine
    from poot.engine.llm_engine import EngineError

    h = ModelHandle.load(fixture_path("llama"), kv_capacity=64, max_batch=2, prefill_chunk=8)
    with pytest.raises(EngineError, match="micro_batches"):
        LLMEngine(h.runner, h.tokenizer, EngineConfig(max_batch=2, micro_batches=0))


def test_bench_reports_the_pipeline(capsys):
    """``poot bench --pipeline-parallel 2 --batch 4`` says how it ran: two stages, two
    micro-batches a decode step, every request finished."""
    import json

    from poot.cli import main

    rc = main(["bench", "--model", str(fixture_path("llama")), "--pipeline-parallel", "2",
               "--batch", "4", "--num-prompts", "8", "--max-tokens", "8", "--kv-capacity",
               "64", "--quiet"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    b4 = out["throughput"]["batches"]["4"]
    assert out["pipeline_parallel"] == 2 and b4["micro_batches"] == 2
    assert b4["requests"] == 8 and b4["generated_tokens"] == 64
