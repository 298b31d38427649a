"""Trace limits follow from the config: random-init MoE decoders (Mixtral, Qwen3-MoE,
GLM-4.5, DeepSeek-V2/V3) and MLA attention shapes of a
sweep of shapes (few wide experts, many narrow ones, many wide ones on a narrow model, top-1
to top-4) trace every step the engine compiles (a 32-token prefill chunk, several rows of
prefill, a batch-8 decode) without reaching a builder limit. Before the MoE terms were
counted (every expert computed on every token, HF's per-expert weights stacked in the
graph), a Mixtral of hidden 64 with 8 experts of width 256 exceeded ``owned_bytes``. Every
dense family is swept the same way at a deep and a wide shape."""

from __future__ import annotations

import json

import pytest

from model_steps import FIXTURES
from poot.models.base import StepSpec
from poot.models.random_init import load_random_model

#: (family fixture, hidden, heads, kv heads, layers, experts, top-k, expert width)
SHAPES = [("mixtral", 96, 6, 2, 3, 4, 2, 160),          # the shape issue 20 reports
          ("mixtral", 64, 4, 2, 2, 8, 2, 256), ("mixtral", 32, 2, 1, 1, 16, 4, 512),
          ("mixtral", 128, 8, 8, 2, 2, 1, 32), ("qwen3_moe", 64, 4, 2, 2, 8, 2, 96),
          ("qwen3_moe", 48, 3, 1, 2, 32, 8, 64),
          ("glm4_moe", 64, 4, 2, 3, 16, 4, 64), ("glm4_moe", 48, 3, 1, 2, 64, 8, 32),
          ("deepseek_v3", 64, 4, 4, 3, 16, 4, 64), ("deepseek_v2_lite", 48, 3, 3, 2, 64, 8, 32)]

#: MLA shapes (fixture, hidden, heads, q_lora_rank, kv_lora_rank, nope, rope, value width):
#: a latent wider than the model (as DeepSeek-V2-Lite's 512 over 16 heads of 192), a plain q,
#: many narrow heads, a wide rope part
MLA = [("deepseek_v3", 64, 4, 48, 256, 32, 16, 32), ("deepseek_v3", 128, 16, 96, 64, 16, 8, 8),
       ("deepseek_v2_lite", 64, 2, 0, 512, 128, 64, 128),
       ("deepseek_v2_lite", 96, 8, 0, 32, 8, 32, 16)]

STEPS = [StepSpec.prefill(32, batch=1, kv_capacity=256, kv_slots=1),
         StepSpec.prefill(16, batch=4, kv_capacity=64, kv_slots=4),
         StepSpec.decode(batch=8, kv_capacity=256, kv_slots=8)]


def _config(tmp_path, family, hidden, heads, kv, layers, experts, top_k, width):
    cfg = json.loads((FIXTURES / family / "config.json").read_text())
    cfg.update(hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=kv,
               head_dim=16, num_hidden_layers=layers, num_experts_per_tok=top_k)
    if family == "mixtral":
        cfg.update(num_local_experts=experts, intermediate_size=width)
    elif family in ("glm4_moe", "deepseek_v3"):  # 4 groups, 2 eligible (V3 routing)
        cfg.update(n_routed_experts=experts, moe_intermediate_size=width, n_group=4,
                   topk_group=2)
    else:
        cfg.update(num_local_experts=experts, moe_intermediate_size=width)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return path


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "-".join(map(str, s)))
def test_moe_steps_trace_within_their_limits(tmp_path, shape):
    loaded = load_random_model(_config(tmp_path, *shape), "f32")
    for spec in STEPS:
        g = loaded.model.trace(spec, loaded.weights.types)
        assert "logits" in dict(g.outputs), spec


@pytest.mark.parametrize("shape", MLA, ids=lambda s: "-".join(map(str, s)))
def test_mla_steps_trace_within_their_limits(tmp_path, shape):
    """MLA decoders of a sweep of latent, rope, nope and value widths trace every step."""
    family, hidden, heads, q_rank, rank, nope, rope, dv = shape
    cfg = json.loads((FIXTURES / family / "config.json").read_text())
    cfg.update(hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=heads,
               q_lora_rank=q_rank or None, kv_lora_rank=rank, qk_nope_head_dim=nope,
               qk_rope_head_dim=rope, head_dim=rope, v_head_dim=dv, num_hidden_layers=3)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    loaded = load_random_model(path, "f32")
    assert loaded.model.options().mla.q_lora_rank == q_rank
    for spec in STEPS:
        g = loaded.model.trace(spec, loaded.weights.types)
        assert "logits" in dict(g.outputs), spec


#: dense families: (fixture, hidden, heads, kv heads, layers, ffn width, vocab): many layers,
#: wide layers with a large vocabulary, and head counts that group unevenly wide
DENSE = [(f, *s) for f in ("llama", "mistral_swa4", "qwen2", "qwen3", "gemma", "gemma2",
                           "gemma3", "phi3")
         for s in ((64, 4, 2, 12, 128, 256), (512, 8, 1, 2, 2048, 4096))]


@pytest.mark.parametrize("shape", DENSE, ids=lambda s: "-".join(map(str, s)))
def test_dense_steps_trace_within_their_limits(tmp_path, shape):
    """Every dense family's steps trace within the limits its config gives, at a deep and a
    wide shape (the limits scale with layers, width and vocabulary, not with a guess)."""
    family, hidden, heads, kv, layers, ffn, vocab = shape
    cfg = json.loads((FIXTURES / family / "config.json").read_text())
    cfg.update(hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=kv,
               head_dim=hidden // heads, num_hidden_layers=layers, intermediate_size=ffn,
               vocab_size=vocab)
    cfg.pop("layer_types", None)     # the family's default pattern over the new depth
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    loaded = load_random_model(path, "f32")
    for spec in STEPS:
        g = loaded.model.trace(spec, loaded.weights.types)
        assert "logits" in dict(g.outputs), spec
