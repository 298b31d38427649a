"""The traced Llama step graphs, evaluated by the oracle, match HF transformers on the tiny
fixtures: one 12-token prefill, and 4 cached decode steps after an 8-token prefill."""

from __future__ import annotations

import numpy as np
import pytest

from poot.dialects.types import DType, PackedType
from poot.models import load_model
from poot.models.llama import Llama
from model_steps import fixture_path, prefill_then_decode, reference

HF_FIXTURES = ["llama", "llama_llama3rope_tied", "mistral_swa4"]
TOL_HF = 1e-4     # f32 vs f32 (HF eager attention)
TOL_GGUF = 1e-3   # same math on dequantized weights; HF ran on the dequantized values
# a GGUF checkpoint's default KV dtype is f16 (llama.cpp's): K/V rounded to f16 move these
# logits by up to ~8e-3
TOL_GGUF_F16_KV = 2e-2


def _check(name: str, model, weights, tol: float, kv_dtype=DType.F32):
    ref = reference(name)
    ids = ref["prompt_ids"]
    prefill, _ = prefill_then_decode(model, weights, ids, n_prefill=12, kv_dtype=kv_dtype)
    err_prefill = np.abs(prefill - ref["prefill_logits"]).max()
    _, decode = prefill_then_decode(model, weights, ids, n_prefill=8, kv_dtype=kv_dtype)
    err_decode = np.abs(decode - ref["decode_logits"]).max()
    print(f"{name}: prefill max abs diff {err_prefill:.3g}, decode {err_decode:.3g}")
    assert err_prefill <= tol, f"{name} prefill logits off by {err_prefill}"
    assert err_decode <= tol, f"{name} decode logits off by {err_decode}"


@pytest.mark.parametrize("name", HF_FIXTURES)
def test_hf_fixture_matches_transformers(name):
    model, weights = load_model(fixture_path(name))
    assert isinstance(model, Llama)
    _check(name, model, weights, TOL_HF)


def test_tied_head_reads_the_embedding_table():
    model, weights = load_model(fixture_path("llama_llama3rope_tied"))
    assert model.config.tie_word_embeddings and "lm_head" not in weights
    assert model.config.rope_scaling.kind == "llama3"


def test_mistral_sliding_window_is_read():
    model, _ = load_model(fixture_path("mistral_swa4"))
    assert model.config.sliding_window == 4


@pytest.mark.parametrize("gguf_qk", ["interleaved", "unpermute"])
def test_gguf_q4_1_matches_transformers(gguf_qk):
    """GGUF with llama.cpp-permuted Q/K: traced interleaved RoPE over the rows as stored
    (default) and half RoPE over rows permuted back with take_rows both match HF."""
    model, weights = load_model(fixture_path("llama_gguf_q4_1"), gguf_qk=gguf_qk)
    assert isinstance(weights.types["blk.0.attn.q"], PackedType)
    assert weights.types["blk.0.attn.q"].format.name == "q4_1"
    assert model.config.rope_layout == ("interleaved" if gguf_qk == "interleaved" else "half")
    _check("llama_gguf_q4_1", model, weights, TOL_GGUF)


def test_gguf_default_kv_dtype_is_f16_within_tolerance():
    """A quantized GGUF checkpoint keeps its KV pools in f16 by default (llama.cpp's KV
    type): the pools are declared f16 and the logits stay within TOL_GGUF_F16_KV of HF."""
    from poot.models import StepSpec, default_kv_dtype

    model, weights = load_model(fixture_path("llama_gguf_q4_1"))
    assert default_kv_dtype(weights.types) is DType.F16
    g = model.trace(StepSpec.decode(kv_capacity=16), weights.types)
    assert dict(g.inputs)["kv.0.k"].dtype is DType.F16
    _check("llama_gguf_q4_1", model, weights, TOL_GGUF_F16_KV, kv_dtype=None)


def test_gguf_rope_spellings_agree():
    """The two GGUF Q/K treatments give the same logits (they differ only by a per-head
    channel permutation shared by Q and K)."""
    from poot.load import load_config, open_weights

    path = fixture_path("llama_gguf_q4_1")
    ids = reference("llama_gguf_q4_1")["prompt_ids"]
    logits = []
    for mode in ("interleaved", "unpermute"):
        store = open_weights(path)
        model = Llama.from_config(load_config(path), store, gguf_qk=mode)
        logits.append(prefill_then_decode(model, model.bind(store), ids, n_prefill=12,
                                          kv_dtype=DType.F32)[0])
    assert np.abs(logits[0] - logits[1]).max() <= 1e-5


def test_packed_weights_stay_packed_in_the_graph():
    from poot.models import StepSpec

    model, weights = load_model(fixture_path("llama_gguf_q4_1"))
    g = model.trace(StepSpec.decode(kv_capacity=16), weights.types)
    assert isinstance(g.params["blk.0.ffn.down"], PackedType)
    assert isinstance(g.params["tok_embed"], PackedType)  # Q8_0 table, decoded in-graph
    for role, arr in weights.arrays.items():
        if isinstance(weights.types[role], PackedType):
            assert arr.dtype == np.uint8
    assert "!poot.packed<#poot.q4_1" in g.text()


def test_gguf_qk_rows_as_stored_or_permuted_back():
    """Interleaved (default) binds the stored, memory-mapped Q/K bytes as they are; unpermute
    binds whole packed rows reordered with llama_rotary_unpermute_rows."""
    from poot.load import llama_rotary_unpermute_rows

    path = fixture_path("llama_gguf_q4_1")
    lm = load_model(path)
    stored = lm.store["blk.0.attn_k.weight"]
    assert lm.weights["blk.0.attn.k"] is stored.data
    _, weights = load_model(path, gguf_qk="unpermute")
    rows = llama_rotary_unpermute_rows(stored.shape[0], 2)
    assert np.array_equal(weights["blk.0.attn.k"], stored.data[rows])
    assert not np.array_equal(weights["blk.0.attn.k"], stored.data)
