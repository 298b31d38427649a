"""ModelConfig from HF config.json (transformers 4.x and 5.x layouts) and GGUF metadata."""

from __future__ import annotations

import json
import os

import pytest
from broken import STR, U32, GGUFSpec, kv_scalar

from poot.load.config import ModelConfig, config_from_gguf, config_from_hf, load_config
from poot.load.errors import LoadError

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures", "tiny")

LLAMA4 = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 100,
          "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
          "max_position_embeddings": 4096, "rope_theta": 500000.0, "bos_token_id": 1,
          "eos_token_id": [2, 3], "tie_word_embeddings": False,
          "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                           "high_freq_factor": 4.0,
                           "original_max_position_embeddings": 8192}}


def test_hf_transformers4_layout_with_llama3_rope():
    c = config_from_hf(LLAMA4)
    assert isinstance(c, ModelConfig) and c.source == "hf"
    assert c.head_dim == 16 and c.num_kv_heads == 2 and c.rope_theta == 500000.0
    assert c.rope_scaling.kind == "llama3" and c.rope_scaling.factor == 8.0
    assert c.rope_scaling.original_max_position_embeddings == 8192
    assert c.eos_token_ids == (2, 3) and c.extra["model_type"] == "llama"
    with pytest.raises(TypeError):
        c.extra["x"] = 1  # read-only view of the raw config


def test_hf_transformers5_rope_parameters_yarn():
    raw = dict(LLAMA4, rope_scaling=None, rope_theta=None,
               rope_parameters={"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0,
                                "beta_fast": 32, "beta_slow": 1})
    c = config_from_hf(raw)
    assert c.rope_theta == 1e6 and c.rope_scaling.kind == "yarn"
    assert (c.rope_scaling.beta_fast, c.rope_scaling.beta_slow) == (32.0, 1.0)


def test_hf_sliding_layers_rope_both_layouts():
    """The sliding-window layers' own RoPE: transformers 5's per-layer-type
    ``rope_parameters`` and 4.x's ``rope_local_base_freq`` (Gemma 3); a single-type config
    has none."""
    five = dict(LLAMA4, rope_scaling=None, rope_theta=None, rope_parameters={
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
        "full_attention": {"rope_type": "linear", "rope_theta": 1e6, "factor": 8.0}})
    c = config_from_hf(five)
    assert (c.rope_theta, c.rope_scaling.kind, c.rope_scaling.factor) == (1e6, "linear", 8.0)
    assert (c.sliding_rope_theta, c.sliding_rope_scaling.kind) == (1e4, "none")
    four = dict(LLAMA4, rope_theta=1e6, rope_local_base_freq=1e4,
                rope_scaling={"rope_type": "linear", "factor": 8.0})
    c = config_from_hf(four)
    assert (c.rope_theta, c.rope_scaling.kind) == (1e6, "linear")
    assert (c.sliding_rope_theta, c.sliding_rope_scaling.kind) == (1e4, "none")
    assert config_from_hf(LLAMA4).sliding_rope_theta is None
    bad = dict(five, rope_parameters={"sliding_attention": {"rope_theta": "big"},
                                      "full_attention": {"rope_theta": 1e6}})
    with pytest.raises(LoadError) as ei:
        config_from_hf(bad, "config.json")
    assert ei.value.field == "rope_parameters.sliding_attention.rope_theta"


def test_hf_unknown_rope_type_names_field():
    raw = dict(LLAMA4, rope_scaling={"rope_type": "wobbly", "factor": 2.0})
    with pytest.raises(LoadError) as ei:
        config_from_hf(raw, "config.json")
    assert ei.value.field == "rope_scaling.rope_type"


@pytest.mark.parametrize("missing", ["vocab_size", "hidden_size", "num_hidden_layers",
                                     "num_attention_heads", "rms_norm_eps",
                                     "max_position_embeddings", "intermediate_size"])
def test_hf_missing_required_field(missing):
    raw = {k: v for k, v in LLAMA4.items() if k != missing}
    with pytest.raises(LoadError) as ei:
        config_from_hf(raw, "cfg/config.json")
    assert ei.value.field == missing and ei.value.file == "cfg/config.json"


def test_hf_wrong_type_names_field():
    with pytest.raises(LoadError) as ei:
        config_from_hf(dict(LLAMA4, hidden_size="64"))
    assert ei.value.field == "hidden_size"


@pytest.mark.skipif(not os.path.isdir(FIXTURES), reason="test/fixtures/tiny not present")
def test_hf_fixture_folders():
    gemma2 = load_config(os.path.join(FIXTURES, "gemma2"))
    with open(os.path.join(FIXTURES, "gemma2", "config.json")) as f:
        raw = json.load(f)
    assert gemma2.attn_logit_softcap == raw["attn_logit_softcapping"]
    assert gemma2.final_logit_softcap == raw["final_logit_softcapping"]
    assert gemma2.tie_word_embeddings
    moe = load_config(os.path.join(FIXTURES, "qwen3_moe"))
    assert (moe.num_experts, moe.experts_per_token, moe.moe_intermediate_size) == (4, 2, 32)
    llama = load_config(os.path.join(FIXTURES, "llama"))
    assert not llama.tie_word_embeddings and llama.model_type == "llama"


def test_hf_tie_inferred_from_weights(tmp_path):
    from safetensors.numpy import save_file
    import numpy as np
    raw = {k: v for k, v in LLAMA4.items() if k != "tie_word_embeddings"}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    save_file({"model.embed_tokens.weight": np.zeros((100, 64), np.float32)},
              str(tmp_path / "model.safetensors"))
    assert load_config(tmp_path).tie_word_embeddings


def test_gguf_metadata_config(tmp_path):
    g = GGUFSpec()
    g.kvs.append(kv_scalar("llama.attention.head_count_kv", U32, 2))
    g.kvs.append(kv_scalar("llama.rope.scaling.type", STR, "linear"))
    c = load_config(g.write(tmp_path / "m.gguf"))
    assert (c.vocab_size, c.hidden_size, c.num_layers, c.num_heads, c.num_kv_heads,
            c.head_dim, c.intermediate_size) == (64, 64, 1, 4, 2, 16, 128)
    assert c.tie_word_embeddings and c.rope_scaling.kind == "linear"
    assert c.source == "gguf" and "tokenizer.ggml.tokens" not in c.extra


def test_gguf_missing_required_key():
    meta = {"general.architecture": "llama", "llama.embedding_length": 64}
    with pytest.raises(LoadError) as ei:
        config_from_gguf(meta, set(), "m.gguf")
    assert ei.value.field.startswith("llama.")


def test_gguf_untied_when_output_tensor_present():
    meta = {"general.architecture": "qwen2", "qwen2.embedding_length": 64,
            "qwen2.block_count": 1, "qwen2.attention.head_count": 4,
            "qwen2.feed_forward_length": 128, "qwen2.context_length": 32,
            "qwen2.attention.layer_norm_rms_epsilon": 1e-6, "qwen2.vocab_size": 10,
            "qwen2.attention.head_count_kv": [2, 2, 2]}
    c = config_from_gguf(meta, {"output.weight"})
    assert not c.tie_word_embeddings and c.num_kv_heads == 2 and c.vocab_size == 10
