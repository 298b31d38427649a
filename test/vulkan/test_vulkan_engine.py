"""The serving engine on Vulkan (lavapipe in CI): paged KV pools written in place, decode
buckets, sampler programs; every request batched at staggered arrival times gets the tokens
it gets alone, and the same tokens as on the CPU."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))

from engine_cases import alone, prompts, staggered  # noqa: E402
from model_steps import fixture_path  # noqa: E402
from poot.api import LLM, ModelHandle  # noqa: E402
from poot.compiler import CompileOptions  # noqa: E402
from poot.engine import EngineConfig  # noqa: E402
from poot.sampling_params import SamplingParams  # noqa: E402

#: the CPU reference computes in f32 (precisions int16 and int8 would quantize its activations)
EXACT = CompileOptions(precision="exact")


@pytest.fixture(scope="module")
def handles(vk_device, tmp_path_factory):
    cache = tmp_path_factory.mktemp("poot-cache")
    return {b: ModelHandle.load(fixture_path("llama"), backend=b, kv_capacity=64,
                                max_batch=32, prefill_chunk=16, cache_dir=cache,
                                compile_options=EXACT,
                                # two chunks of prompt tokens a step: prompts (3..24 tokens,
                                # one a step) are admitted as fast as they arrive
                                engine_config=EngineConfig(max_batch=32, max_prefill_tokens=32))
            for b in ("vulkan", "cpu")}


def test_32_staggered_prompts_equal_alone_and_cpu(handles):
    h = handles["vulkan"]
    eng = h.engine
    ps = prompts(h.runner.vocab, 32, seed=31, lo=3, hi=24)
    sps = [SamplingParams(temperature=0.0, max_tokens=int(n), ignore_eos=True)
           for n in np.random.default_rng(3).integers(8, 24, len(ps))]
    want = [alone(eng, p, sp) for p, sp in zip(ps, sps)]
    mixed = []                       # ragged steps with decode rows and prompt chunks
    issue = eng.issuer.issue_ragged
    eng.issuer.issue_ragged = lambda d, c, s=None: (mixed.append(bool(d) and bool(c)),
                                                issue(d, c, s))[1]
    ahead = eng.ahead_steps
    got = staggered(eng, list(zip(ps, sps)), every=1)
    assert sum(mixed) >= 8
    assert eng.pipelined and eng.ahead_steps - ahead >= 8   # issued before the last was read
    assert eng.stats().max_decode_batch >= 16
    for rid, w in zip(got["ids"], want):
        assert got["final"][rid].output_ids == w, rid
    cpu = LLM(handle=handles["cpu"]).generate(ps, sps)
    assert [r.token_ids for r in cpu] == want
    assert eng.blocks.stats().used == 0


def test_mixed_sampling_with_penalties_on_vulkan(handles):
    """Greedy, seeded top-p and penalized rows in one batch (the token-history pool's rows
    reset per request on the device): each equals its alone run."""
    h = handles["vulkan"]
    eng = h.engine
    ps = prompts(h.runner.vocab, 4, seed=37, hi=20)
    sps = [SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True),
           SamplingParams(temperature=0.8, top_p=0.9, seed=2, max_tokens=10, ignore_eos=True),
           SamplingParams(temperature=0.0, repetition_penalty=1.5, frequency_penalty=0.7,
                          max_tokens=10, ignore_eos=True),
           SamplingParams(temperature=0.0, presence_penalty=1.0, max_tokens=10,
                          ignore_eos=True)]
    want = [alone(eng, p, sp) for p, sp in zip(ps, sps)]
    assert [r.token_ids for r in LLM(handle=h).generate(ps, sps)] == want


def test_guided_decoding_on_vulkan_matches_cpu(vk_device, tmp_path_factory):
    """Guided decoding with the tiny GGUF fixture (it has a tokenizer): JSON schemas, a regex
    and a grammar, greedy and seeded, batched on Vulkan: every output matches its constraint
    (``jsonschema`` / ``re``) and equals the CPU's tokens."""
    import json
    import re

    jsonschema = pytest.importorskip("jsonschema")
    pytest.importorskip("llguidance")
    from poot.sampling_params import Guide

    gguf = Path(fixture_path("llama")).parent / "llama_gguf_q4_1" / "model.gguf"
    cache = tmp_path_factory.mktemp("poot-cache-guided")
    hs = {b: ModelHandle.load(str(gguf), backend=b, kv_capacity=128, max_batch=8,
                              prefill_chunk=16, cache_dir=cache, compile_options=EXACT)
          for b in ("vulkan", "cpu")}
    schemas = [
        {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
                                          "age": {"type": "integer", "minimum": 0,
                                                  "maximum": 120}},
         "required": ["name", "age"], "additionalProperties": False},
        {"type": "array", "items": {"enum": ["a", "bb", "ccc"]}, "minItems": 1,
         "maxItems": 3},
        {"type": "object", "properties": {"v": {"anyOf": [
            {"type": "null"}, {"type": "string", "pattern": "^[0-9]{3}$"}]}},
         "required": ["v"], "additionalProperties": False},
    ]
    guides = [Guide.json_schema(s) for s in schemas] + [
        Guide.regex(r"[a-z]{2}-[0-9]{3}"),
        Guide.grammar('start: "<" word ("," word)? ">"\nword: /[a-z]{1,4}/\n')]
    checks = [lambda t, s=s: jsonschema.validate(json.loads(t), s) for s in schemas] + [
        lambda t: re.fullmatch(r"[a-z]{2}-[0-9]{3}", t) or 1 / 0,
        lambda t: re.fullmatch(r"<[a-z]{1,4}(,[a-z]{1,4})?>", t) or 1 / 0]
    params = [SamplingParams(temperature=t, seed=11, max_tokens=100, guided=g)
              for g in guides for t in (0.0, 1.0)]
    prompts = [[5, 6, 7, 8 + i] for i in range(len(params))]
    vk = LLM(handle=hs["vulkan"]).generate(prompts, params)
    cpu = LLM(handle=hs["cpu"]).generate(prompts, params)
    for i, (v, c) in enumerate(zip(vk, cpu)):
        assert v.finish_reason == "stop", (i, v.text)
        checks[i // 2](v.text)
        assert v.token_ids == c.token_ids, i
