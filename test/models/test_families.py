"""The non-Llama families (Qwen2, Qwen3, Gemma, Gemma2, Gemma3, Phi3, Mixtral, Qwen3-MoE,
GLM-4.5, DeepSeek-V2, DeepSeek-V3): their
traced step graphs, evaluated by the oracle, match HF transformers on the tiny fixtures (one
12-token prefill; 4 cached decode steps after an 8-token prefill); registry lookups; a missing
tensor is a typed error naming it."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from poot.models import REGISTRY, ModelError, StepSpec, UnknownArchitecture, load_model
from model_steps import fixture_path, prefill_then_decode, reference

TOL = 1e-4  # f32 vs f32 (HF eager attention)

# fixture -> (HF architecture, family name)
FAMILIES = {
    "qwen2": ("Qwen2ForCausalLM", "qwen2"),
    "qwen3": ("Qwen3ForCausalLM", "qwen3"),
    "gemma": ("GemmaForCausalLM", "gemma"),
    "gemma2": ("Gemma2ForCausalLM", "gemma2"),
    "gemma3": ("Gemma3ForCausalLM", "gemma3"),
    "phi3": ("Phi3ForCausalLM", "phi3"),
    "mixtral": ("MixtralForCausalLM", "mixtral"),
    "qwen3_moe": ("Qwen3MoeForCausalLM", "qwen3_moe"),
    "glm4_moe": ("Glm4MoeForCausalLM", "glm4_moe"),
    "deepseek_v3": ("DeepseekV3ForCausalLM", "deepseek_v3"),
    "deepseek_v2_lite": ("DeepseekV2ForCausalLM", "deepseek_v2"),
    "deepseek_v2_lite_gguf": ("deepseek2", "deepseek2"),      # llama.cpp's conversion
}
GGUF_NAMES = {"qwen2": "qwen2", "qwen3": "qwen3", "gemma": "gemma", "phi3": "phi3",
              "qwen3_moe": "qwen3moe"}


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_fixture_matches_transformers(name):
    model, weights = load_model(fixture_path(name))
    assert model.family == FAMILIES[name][1]
    ref = reference(name)
    ids = ref["prompt_ids"]
    prefill, _ = prefill_then_decode(model, weights, ids, n_prefill=12)
    _, decode = prefill_then_decode(model, weights, ids, n_prefill=8)
    err_prefill = np.abs(prefill - ref["prefill_logits"]).max()
    err_decode = np.abs(decode - ref["decode_logits"]).max()
    print(f"{name}: prefill max abs diff {err_prefill:.3g}, decode {err_decode:.3g}")
    assert err_prefill <= TOL, f"{name} prefill logits off by {err_prefill}"
    assert err_decode <= TOL, f"{name} decode logits off by {err_decode}"


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_registry_finds_the_family_by_hf_name(name):
    arch, family = FAMILIES[name]
    assert REGISTRY.lookup(arch).family == family
    if name in GGUF_NAMES:
        assert REGISTRY.lookup(GGUF_NAMES[name]) is REGISTRY.lookup(arch)


def test_unknown_architecture_is_typed():
    with pytest.raises(UnknownArchitecture) as e:
        REGISTRY.lookup("Qwen2MoeForCausalLM")
    assert "Qwen3ForCausalLM" in e.value.registered


def _without(name: str, tensor: str, tmp_path):
    """A copy of fixture ``name`` whose safetensors lacks ``tensor``."""
    from safetensors.numpy import load_file, save_file

    src = fixture_path(name)
    dst = tmp_path / name
    dst.mkdir()
    for f in ("config.json", "generation_config.json"):
        if (src / f).exists():
            shutil.copy(src / f, dst / f)
    tensors = load_file(str(src / "model.safetensors"))
    del tensors[tensor]
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


MISSING = {
    "qwen2": "model.layers.0.self_attn.q_proj.weight",
    "qwen3": "model.layers.1.self_attn.k_norm.weight",
    "gemma": "model.norm.weight",
    "gemma2": "model.layers.1.post_feedforward_layernorm.weight",
    "gemma3": "model.layers.2.self_attn.q_norm.weight",
    "phi3": "model.layers.0.self_attn.qkv_proj.weight",
    "mixtral": "model.layers.1.block_sparse_moe.experts.3.w2.weight",
    "qwen3_moe": "model.layers.0.mlp.gate.weight",
    "glm4_moe": "model.layers.1.mlp.gate.e_score_correction_bias",
    "deepseek_v3": "model.layers.1.self_attn.kv_a_layernorm.weight",
    "deepseek_v2_lite": "model.layers.0.self_attn.q_proj.weight",
}


@pytest.mark.parametrize("name", sorted(MISSING))
def test_missing_tensor_is_a_typed_error_naming_it(name, tmp_path):
    with pytest.raises(ModelError, match=MISSING[name].replace(".", r"\.")):
        load_model(_without(name, MISSING[name], tmp_path))


@pytest.mark.parametrize("name", sorted(MISSING))
@pytest.mark.parametrize("key,factor", [("hidden_size", 2), ("vocab_size", 10 ** 9)])
def test_config_disagreeing_with_the_tensors_is_refused_at_bind(name, key, factor, tmp_path):
    """A config.json edited so its sizes no longer match the tensors (twice the hidden size;
    a vocabulary of 10^11 and more) is refused while binding, naming a tensor with its shape
    and the config's, before anything is traced or allocated."""
    import json

    cfg = json.loads((fixture_path(name) / "config.json").read_text())
    with pytest.raises(ModelError, match=r"checkpoint tensor '.+' has shape \[[\d, ]+\], but "
                                         r"the config implies \[[\d, ]+\]"):
        load_model(_edited_copy(tmp_path, name, {key: cfg[key] * factor}))


def test_qwen2_binds_qkv_biases_not_o():
    _, weights = load_model(fixture_path("qwen2"))
    assert {"blk.0.attn.q_bias", "blk.0.attn.k_bias", "blk.0.attn.v_bias"} <= set(weights.types)
    assert "blk.0.attn.o_bias" not in weights


def test_batched_decode_matches_single():
    """Two slots decoded in one batch give each sequence's own logits."""
    model, weights = load_model(fixture_path("qwen3"))
    from model_steps import empty_caches, run_step
    ids = reference("qwen3")["prompt_ids"]
    pre = model.trace(StepSpec.prefill(8, batch=2, kv_capacity=16, kv_slots=2), weights.types)
    dec = model.trace(StepSpec.decode(batch=2, kv_capacity=16, kv_slots=2), weights.types)
    seqs = [ids[:8], ids[4:12]]
    _, caches = run_step(pre, weights, seqs, [list(range(8))] * 2, [1, 0], empty_caches(pre))
    out, _ = run_step(dec, weights, [[5], [9]], [[8], [8]], [1, 0], caches)
    for row, seq, tok in ((0, seqs[0], 5), (1, seqs[1], 9)):
        single, dec1 = prefill_then_decode(model, weights, list(seq) + [tok], n_prefill=8)
        assert np.abs(out["logits"][row, 0] - dec1[0]).max() <= 1e-5


def test_gemma2_settings_are_read():
    model, _ = load_model(fixture_path("gemma2"))
    c = model.config
    assert c.layer_windows == (4, None)  # layer_types: sliding, full
    assert (c.attn_softcap, c.final_softcap) == (10.0, 5.0)
    assert c.attn_scale == pytest.approx(32 ** -0.5)
    assert c.sandwich_norms and c.norm_unit_offset and c.embed_scale == 8.0
    assert c.act == "gelu_pytorch_tanh"


def _edited_copy(tmp_path, name: str, changes: dict):
    """A copy of fixture ``name`` whose config.json has ``changes`` (None: key removed)."""
    import json

    d = tmp_path / name
    shutil.copytree(fixture_path(name), d)
    cfg = json.loads((d / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def test_gemma3_settings_are_read():
    """Gemma 3's layer types, q/k norms and the local layers' own RoPE (base 1e4, unscaled)
    next to the global layer's (base 1e6, linear factor 8), as the fixture's config says."""
    model, weights = load_model(fixture_path("gemma3"))
    c = model.config
    assert c.layer_windows == (4, None, 4)
    assert c.qk_norm and c.sandwich_norms and c.norm_unit_offset and c.embed_scale == 8.0
    assert (c.attn_softcap, c.final_softcap) == (None, None)
    assert c.attn_scale == pytest.approx(24 ** -0.5)
    d = np.arange(0, 16, 2) / 16
    np.testing.assert_allclose(c.sliding_inv_freq, 1e4 ** -d, rtol=1e-6)
    np.testing.assert_allclose(c.inv_freq, 1e6 ** -d / 8, rtol=1e-6)
    assert "blk.2.attn.k_norm" in weights.types


@pytest.mark.parametrize("changes,layers", [
    ({"layer_types": None, "sliding_window_pattern": 2}, (4, None, 4)),
    ({"layer_types": None}, (4, 4, 4)),          # HF's default pattern: 6
])
def test_gemma3_default_layer_pattern(tmp_path, changes, layers):
    """Without ``layer_types``, every ``sliding_window_pattern``-th layer is global (HF's
    Gemma3TextConfig rule, pattern 6 by default)."""
    model, _ = load_model(_edited_copy(tmp_path, "gemma3", changes))
    assert model.config.layer_windows == layers


@pytest.mark.parametrize("changes,match", [
    ({"use_bidirectional_attention": True}, "use_bidirectional_attention"),
    ({"layer_types": None, "sliding_window_pattern": 0}, "sliding_window_pattern"),
    ({"rope_parameters": {"sliding_attention": {"rope_type": "dynamic", "factor": 2.0,
                                                "rope_theta": 1e4},
                          "full_attention": {"rope_type": "default", "rope_theta": 1e6}}},
     "dynamic"),
])
def test_gemma3_bad_settings_are_typed(tmp_path, changes, match):
    with pytest.raises(ModelError, match=match):
        load_model(_edited_copy(tmp_path, "gemma3", changes))


def test_glm4_moe_settings_are_read():
    """GLM-4.5's DeepSeek-V3 routing settings, shared expert and leading dense layer, as the
    fixture's config says; the router bias and shared expert weights are bound."""
    model, weights = load_model(fixture_path("glm4_moe"))
    m = model.config.moe
    assert (m.num_experts, m.top_k, m.groups, m.topk_groups) == (8, 2, 4, 2)
    assert (m.scoring, m.score_bias, m.scale, m.normalize) == ("sigmoid", True, 2.5, True)
    assert m.shared_ffn == 32 and m.dense_layers == (0,)
    assert len(model.config.inv_freq) == 4          # partial rotary 0.5 of head_dim 16
    assert {"blk.1.ffn.router_bias", "blk.1.ffn.shexp.down", "blk.0.ffn.gate",
            "blk.0.attn.q_bias"} <= set(weights.types)
    assert "blk.0.ffn.router" not in weights.types and "blk.0.attn.o_bias" not in weights.types


@pytest.mark.parametrize("changes,match", [
    ({"n_group": 3}, "n_group=3"),
    ({"topk_group": 1, "num_experts_per_tok": 3}, "topk_group=1"),
    ({"first_k_dense_replace": -1}, "first_k_dense_replace"),
    ({"routed_scaling_factor": "x"}, "routed_scaling_factor"),
])
def test_glm4_moe_bad_routing_settings_are_typed(tmp_path, changes, match):
    with pytest.raises(ModelError, match=match):
        load_model(_edited_copy(tmp_path, "glm4_moe", changes))


def test_gemma_is_tied():
    model, weights = load_model(fixture_path("gemma"))
    assert model.config.tie_word_embeddings and "lm_head" not in weights


def test_moe_settings_and_per_expert_weights():
    mix, w = load_model(fixture_path("mixtral"))
    assert (mix.config.moe.num_experts, mix.config.moe.top_k, mix.config.moe.expert_ffn) == \
        (4, 2, 32)
    # HF's per-expert tensors, stacked at bind time into one [E, F, H] weight per projection
    assert w.stored["blk.1.ffn.exps.up"] == "model.layers.1.block_sparse_moe.experts.{e}.w3.weight"
    assert w.types["blk.1.ffn.exps.up"].shape == (4, 32, 64)
    assert w.types["blk.1.ffn.exps.down"].shape == (4, 64, 32)
    q, _ = load_model(fixture_path("qwen3_moe"))
    assert q.config.moe.normalize and q.config.qk_norm and q.config.moe.dense_layers == ()


def test_gguf_names_for_stacked_experts():
    """GGUF qwen3moe stores experts stacked (no fixture: names only)."""
    import dataclasses
    from poot.models.moe import Qwen3Moe

    q, _ = load_model(fixture_path("qwen3_moe"))
    table = Qwen3Moe(dataclasses.replace(q.config, source="gguf")).weight_table()
    assert table["blk.0.ffn.exps.down"].gguf == "blk.0.ffn_down_exps.weight"
    assert table["blk.1.ffn.router"].gguf == "blk.1.ffn_gate_inp.weight"
    assert not any(".exp.0." in r for r in table)


def test_longrope_is_refused():
    import dataclasses
    from poot.load import load_config
    from poot.load.config import RopeScaling
    from poot.models.phi3 import Phi3

    cfg = dataclasses.replace(load_config(fixture_path("phi3")),
                              rope_scaling=RopeScaling(kind="longrope", factor=32.0))
    with pytest.raises(ModelError, match="longrope"):
        Phi3.from_config(cfg)


@pytest.mark.parametrize("name", ["gemma2", "gemma3", "mixtral", "glm4_moe", "deepseek_v3",
                                  "deepseek_v2_lite", "deepseek_v2_lite_gguf"])
def test_cpu_backend_greedy_matches_reference(name, tmp_path):
    """The same pipeline as Llama: compile for the CPU backend, Engine, Driver; greedy ids
    equal HF's up to the first step whose top-2 margin is under 1e-3. (All seven fixtures
    pass this; two are run to keep the suite fast: ~6 s each.)"""
    from poot.api import Driver, ModelHandle
    from poot.sampling_params import SamplingParams

    ref = reference(name)
    h = ModelHandle.load(fixture_path(name), kv_capacity=48, prefill_chunk=5,
                         cache_dir=tmp_path)
    r = Driver(h).complete(list(ref["prompt_ids"]),
                           SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
    margins = ref["greedy_margins"]
    n = next((i + 1 for i, m in enumerate(margins) if m < 1e-3), len(margins))
    assert list(r.token_ids[:n]) == [int(x) for x in ref["greedy_ids"][:n]]
