#!/usr/bin/env python3
"""Make the tiny random-init test fixtures in test/fixtures/tiny/ and their reference outputs.

Each fixture is a small HF checkpoint (random init, float32) plus the logits that HF
`transformers` computes for it, so poot's tests can compare against an independent
reference without needing torch. One extra fixture is a Q8_0/Q4_1 GGUF of the Llama
fixture for the GGUF llama path.

This script is NOT part of poot's runtime or CI; torch/transformers are not project
dependencies. To run it, install (CPU torch only; do not pull a CUDA build):

    pip install torch==2.13.0            # the +cpu wheel
    pip install transformers==5.24.0     # pinned: accepts torch 2.13
    pip install gguf numpy safetensors   # gguf 0.19.0 was used

    python scripts/make_fixtures.py [--out test/fixtures/tiny] [--only NAME ...] [--list]

The `deepseek_v2_lite_gguf` fixture is converted by llama.cpp's own `convert_hf_to_gguf.py`
code (an independent converter, so poot's GGUF mapping is checked against llama.cpp's
layout): point LLAMA_CPP at a llama.cpp source tree, e.g. the one inside the
llama-cpp-python 0.3.36 sdist (`pip download --no-deps --no-binary :all:
llama-cpp-python==0.3.36`, unpack, `LLAMA_CPP=.../vendor/llama.cpp`).

NAME is a fixture name (see --list), e.g. `llama`, `mistral_swa4`, `llama_gguf_q4_1`.
Output is deterministic (fixed seeds, fixed prompt). Every fixture is reloaded from disk
and must reproduce its prefill logits exactly (max abs diff 0; cached decode within 1e-5), and the GGUF is read back with
gguf.GGUFReader; the script fails loudly otherwise. See test/fixtures/README.md.
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import shutil
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "test" / "fixtures" / "tiny"

PROMPT_IDS = [1, 17, 42, 100, 7, 255, 3, 128, 64, 9, 200, 31]
DECODE_PREFIX = 8  # prefill this many prompt tokens with a cache, then decode the rest one by one
N_GREEDY = 8
INIT_SEED = 0  # torch.manual_seed before Cls(config)
NOISE_SEED = 1  # torch.Generator seed for the N(0, NOISE_STD) noise on 1-D params
NOISE_STD = 0.1
BIAS_SEED, BIAS_STD = 2, 0.1  # MoE routers' e_score_correction_bias (sigmoid scores: 0..1)
RELOAD_DECODE_TOL = 1e-5  # reloaded cached-decode logits vs the built model's (prefill: exact)

COMMON = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=128,
    initializer_range=0.2,  # default 0.02 gives near-uniform logits
    rms_norm_eps=1e-6,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
    tie_word_embeddings=False,
)

# name -> (architecture class, config class, overrides on top of COMMON, description)
SPECS: dict[str, tuple[str, str, dict, str]] = {
    "llama": ("LlamaForCausalLM", "LlamaConfig", {}, "Llama, untied embeddings, default RoPE (theta 10000)"),
    "llama_llama3rope_tied": (
        "LlamaForCausalLM",
        "LlamaConfig",
        dict(
            tie_word_embeddings=True,
            rope_theta=500000.0,
            rope_scaling=dict(
                rope_type="llama3",
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                # with theta 5e5 and head_dim 16 this keeps the highest frequency, smooths
                # the next one and divides the other 6 by `factor`
                original_max_position_embeddings=64,
            ),
        ),
        "Llama, tied embeddings (no lm_head.weight in the file), llama3 rope scaling",
    ),
    "mistral_swa4": (
        "MistralForCausalLM",
        "MistralConfig",
        dict(sliding_window=4),
        "Mistral, sliding_window 4 on every layer (query i sees keys j with i-4 < j <= i)",
    ),
    "qwen2": (
        "Qwen2ForCausalLM",
        "Qwen2Config",
        dict(use_sliding_window=False),
        "Qwen2, q/k/v projection biases",
    ),
    "qwen3": ("Qwen3ForCausalLM", "Qwen3Config", dict(use_sliding_window=False), "Qwen3, per-head q/k RMSNorm"),
    "gemma": (
        "GemmaForCausalLM",
        "GemmaConfig",
        dict(tie_word_embeddings=True, hidden_activation="gelu_pytorch_tanh"),
        "Gemma, tied, (1+w) RMSNorm, embeddings scaled by sqrt(hidden), GeGLU (tanh gelu)",
    ),
    "gemma2": (
        "Gemma2ForCausalLM",
        "Gemma2Config",
        dict(
            tie_word_embeddings=True,
            hidden_activation="gelu_pytorch_tanh",
            sliding_window=4,
            layer_types=["sliding_attention", "full_attention"],
            # small caps so that soft-capping changes the result materially
            attn_logit_softcapping=10.0,
            final_logit_softcapping=5.0,
            query_pre_attn_scalar=32,  # != head_dim, so the scale must come from the config
        ),
        "Gemma2, soft-capping (attn 10, final 5), layer 0 sliding_window 4, layer 1 full, "
        "query_pre_attn_scalar 32, pre+post norms",
    ),
    "gemma3": (
        "Gemma3ForCausalLM",
        "Gemma3TextConfig",
        dict(
            num_hidden_layers=3,
            # untied: with the tied table (Gemma 2's fixture) the sqrt(hidden)-scaled
            # embedding dominates the residual and greedy decoding repeats the last token
            tie_word_embeddings=False,
            hidden_activation="gelu_pytorch_tanh",
            sliding_window=4,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            # local and global layers rotate with different bases; the global one is also
            # linearly scaled (as Gemma 3 4B and larger are)
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "rope_theta": 1000000.0, "factor": 8.0},
            },
            query_pre_attn_scalar=24,  # != head_dim, so the scale must come from the config
        ),
        "Gemma3 (text), untied, q/k (1+w) RMSNorm, layers 0 and 2 sliding_window 4 with RoPE base 1e4, "
        "layer 1 full with base 1e6 and linear scaling 8, query_pre_attn_scalar 24, pre+post norms",
    ),
    "phi3": (
        "Phi3ForCausalLM",
        "Phi3Config",
        dict(hidden_act="silu", sliding_window=None),
        "Phi3, fused qkv_proj and gate_up_proj",
    ),
    "mixtral": (
        "MixtralForCausalLM",
        "MixtralConfig",
        # ffn 32 per expert (not 128) to keep the file under ~600 KB
        dict(intermediate_size=32, num_local_experts=4, num_experts_per_tok=2, sliding_window=None),
        "Mixtral MoE, 4 experts top-2 (softmax then top-k, renormalised), expert ffn 32",
    ),
    "glm4_moe": (
        "Glm4MoeForCausalLM",
        "Glm4MoeConfig",
        dict(
            first_k_dense_replace=1,  # layer 0 dense (intermediate 128), layer 1 MoE
            n_routed_experts=8,
            num_experts_per_tok=2,
            n_group=4,
            topk_group=2,
            moe_intermediate_size=32,
            n_shared_experts=1,
            routed_scaling_factor=2.5,
            norm_topk_prob=True,
            partial_rotary_factor=0.5,
            attention_bias=True,
            use_qk_norm=False,
        ),
        "GLM-4.5 MoE (DeepSeek-V3 routing): sigmoid scores, score-correction bias (random, "
        "not HF's zeros), 8 experts in 4 groups, top-2 groups, top-2 experts, routed scaling "
        "2.5, one shared expert, first layer dense, partial rotary 0.5, q/k/v biases",
    ),
    "deepseek_v3": (
        "DeepseekV3ForCausalLM",
        "DeepseekV3Config",
        dict(
            num_key_value_heads=4,  # MLA: every head reads the one latent
            q_lora_rank=48,
            kv_lora_rank=32,
            qk_nope_head_dim=16,
            qk_rope_head_dim=8,
            head_dim=8,  # HF's rotary width: the rope part
            v_head_dim=12,  # value heads narrower than the 24-wide query/key heads
            rope_interleave=True,
            # YaRN over the rope part, attention factor from mscale / mscale_all_dim and the
            # softmax scale times mscale(mscale_all_dim)^2, as DeepSeek-V3's config has
            rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                             "original_max_position_embeddings": 32, "beta_fast": 32.0,
                             "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 0.8},
            intermediate_size=112,  # (not 128: keeps the folder under 600 KiB)
            first_k_dense_replace=1,  # layer 0 dense (intermediate 112), layer 1 MoE
            n_routed_experts=8,
            num_experts_per_tok=2,
            n_group=4,
            topk_group=2,
            moe_intermediate_size=32,
            n_shared_experts=1,
            routed_scaling_factor=2.5,
            norm_topk_prob=True,
        ),
        "DeepSeek-V3 MLA: q LoRA 48, KV latent 32 (+ RMSNorm), decoupled rope key 8 shared by the "
        "4 heads (interleaved, YaRN x4 with mscale 1 / mscale_all_dim 0.8), nope 16, value 12; "
        "MoE: sigmoid scores, score-correction bias (random), 8 experts in 4 groups, top-2 groups, "
        "top-2, routed scaling 2.5, one shared expert, layer 0 dense",
    ),
    "deepseek_v2_lite": (
        "DeepseekV2ForCausalLM",
        "DeepseekV2Config",
        dict(
            num_key_value_heads=4,
            q_lora_rank=None,  # V2-Lite: plain q projection
            intermediate_size=96,
            kv_lora_rank=32,
            qk_nope_head_dim=16,
            qk_rope_head_dim=8,
            head_dim=8,  # HF's rotary width: the rope part
            v_head_dim=12,
            rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                             "original_max_position_embeddings": 32, "beta_fast": 32.0,
                             "beta_slow": 1.0, "mscale": 0.707, "mscale_all_dim": 0.707},
            first_k_dense_replace=1,
            n_routed_experts=8,
            num_experts_per_tok=2,
            topk_method="greedy",
            moe_intermediate_size=32,
            n_shared_experts=2,
            routed_scaling_factor=1.0,
            norm_topk_prob=False,
        ),
        "DeepSeek-V2-Lite MLA: plain q, KV latent 32 (+ RMSNorm), decoupled rope key 8 (complex "
        "pairs, YaRN x4, mscale = mscale_all_dim = 0.707), nope 16, value 12; MoE: softmax "
        "scores, greedy top-2 of 8, not renormalized, two shared experts, layer 0 dense",
    ),
    "qwen3_moe": (
        "Qwen3MoeForCausalLM",
        "Qwen3MoeConfig",
        dict(
            moe_intermediate_size=32,
            num_experts=4,
            num_experts_per_tok=2,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            norm_topk_prob=True,
            use_sliding_window=False,
        ),
        "Qwen3-MoE, q/k norm, 4 experts top-2, norm_topk_prob True, expert ffn 32, every layer sparse",
    ),
}
GGUF_NAME = "llama_gguf_q4_1"
GGUF_SOURCE = "llama"
# GGUF made by llama.cpp's own converter (not this script's writer) from an HF fixture:
# made by make_llamacpp_gguf_fixture; needs LLAMA_CPP (see the module doc)
LLAMACPP_GGUF = {"deepseek_v2_lite_gguf": ("deepseek_v2_lite", "DeepseekV2Model", "DEEPSEEK2")}
# pooled-step fixtures (embeddings, cross-encoder scores): made by make_pooled_fixture
POOLED = ("qwen3_embed", "bert_embed", "bert_cross_encoder")
# PEFT LoRA adapters of the `llama` fixture: made by make_lora_fixture
LORA_NAME = "llama_lora"
ALL_NAMES = list(SPECS) + [GGUF_NAME] + list(POOLED) + [LORA_NAME] + list(LLAMACPP_GGUF)


# ---------------------------------------------------------------------------------------
# helpers


def versions() -> dict:
    import safetensors
    import torch
    import transformers

    out = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "numpy": np.__version__,
        "safetensors": safetensors.__version__,
    }
    try:
        from importlib.metadata import version

        out["gguf"] = version("gguf")
    except Exception:  # pragma: no cover
        pass
    return out


def make_config(name: str):
    import transformers

    arch, cfg_cls, overrides, _ = SPECS[name]
    kw = dict(COMMON)
    kw.update(overrides)
    cfg = getattr(transformers, cfg_cls)(**kw)
    cfg.architectures = [arch]
    cfg._attn_implementation = "eager"
    try:
        cfg._experts_implementation = "eager"
    except Exception:  # older transformers: no such switch
        pass
    return cfg


def perturb_vectors(model) -> None:
    """Add N(0, NOISE_STD) noise (seed NOISE_SEED, parameters in name order) to every 1-D
    parameter (norm weights, biases), so that HF's init of ones and zeros does not hide a
    mix-up of them; then switch the model to eval mode."""
    import torch

    gen = torch.Generator().manual_seed(NOISE_SEED)
    with torch.no_grad():
        for _, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            if p.dim() == 1:
                p.add_(torch.randn(p.shape, generator=gen, dtype=torch.float32) * NOISE_STD)
    model.eval()


def build_model(name: str, cfg=None):
    import torch
    import transformers

    arch = SPECS[name][0]
    cfg = cfg if cfg is not None else make_config(name)
    torch.manual_seed(INIT_SEED)
    model = getattr(transformers, arch)(cfg).to(torch.float32)
    perturb_vectors(model)
    # routers' score-correction biases (DeepSeek-V3 style) are buffers HF initializes to
    # zero: give them values that change which experts win, or the fixture cannot tell
    gen = torch.Generator().manual_seed(BIAS_SEED)
    with torch.no_grad():
        for n, buf in sorted(model.named_buffers(), key=lambda kv: kv[0]):
            if n.endswith("e_score_correction_bias"):
                buf.copy_(torch.randn(buf.shape, generator=gen, dtype=torch.float32) * BIAS_STD)
    return model


def clone_with_config(model, name: str, **changes):
    """Same weights, config tweaked (for the ablation checks)."""
    import transformers

    cfg = copy.deepcopy(model.config)
    for k, v in changes.items():
        setattr(cfg, k, v)
    other = getattr(transformers, SPECS[name][0])(cfg).to("cpu")
    other.load_state_dict(model.state_dict())
    other.eval()
    return other


def prefill_logits(model) -> np.ndarray:
    import torch

    ids = torch.tensor([PROMPT_IDS], dtype=torch.long)
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=False)
    return out.logits[0].float().numpy().copy()


def decode_logits(model) -> np.ndarray:
    """Prefill PROMPT_IDS[:DECODE_PREFIX] with a cache, then feed the rest one token a step."""
    import torch

    ids = torch.tensor([PROMPT_IDS], dtype=torch.long)
    rows = []
    with torch.no_grad():
        out = model(input_ids=ids[:, :DECODE_PREFIX], use_cache=True)
        pkv = out.past_key_values
        for t in range(DECODE_PREFIX, len(PROMPT_IDS)):
            out = model(input_ids=ids[:, t : t + 1], past_key_values=pkv, use_cache=True)
            pkv = out.past_key_values
            rows.append(out.logits[0, -1].float().numpy().copy())
    return np.stack(rows).astype(np.float32)


def greedy(model) -> dict:
    import torch

    ids = torch.tensor([PROMPT_IDS], dtype=torch.long)
    with torch.no_grad():
        g = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            min_new_tokens=N_GREEDY,
            max_new_tokens=N_GREEDY,
            output_scores=True,
            output_logits=True,
            return_dict_in_generate=True,
        )
    new = g.sequences[0, len(PROMPT_IDS) :].numpy().astype(np.int64)
    assert new.shape == (N_GREEDY,), new.shape
    margins, raw_argmax = [], []
    for s, raw in zip(g.scores, g.logits):
        top2 = torch.topk(s[0].float(), 2).values
        margins.append(float(top2[0] - top2[1]))
        raw_argmax.append(int(raw[0].argmax()))
    # the same tokens from plain no-cache forwards (argmax of raw logits)
    full = torch.cat([ids, torch.tensor(new[None, :-1])], dim=1)
    with torch.no_grad():
        lg = model(input_ids=full, use_cache=False).logits[0]
    nocache_argmax = lg[len(PROMPT_IDS) - 1 :].argmax(-1).numpy().astype(np.int64)
    return {
        "greedy_ids": new,
        "greedy_margins": np.asarray(margins, dtype=np.float32),
        "raw_logits_argmax": raw_argmax,
        "nocache_argmax_matches": bool((nocache_argmax == new).all()),
        "eos_suppressed_changed_choice": bool(any(a != int(b) for a, b in zip(raw_argmax, new))),
    }


def reference_for(model) -> tuple[dict, dict]:
    """Arrays for reference.npz and a summary for reference.json."""
    pre = prefill_logits(model)
    dec = decode_logits(model)
    gr = greedy(model)
    arrays = {
        "prompt_ids": np.asarray(PROMPT_IDS, dtype=np.int64),
        "prefill_logits": pre.astype(np.float32),
        "decode_logits": dec.astype(np.float32),
        "greedy_ids": gr["greedy_ids"],
        "greedy_margins": gr["greedy_margins"],
    }
    info = {
        "prefill_argmax": [int(x) for x in pre.argmax(-1)],
        "prefill_logit_std": float(pre.std()),
        "decode_argmax": [int(x) for x in dec.argmax(-1)],
        "decode_vs_prefill_max_abs_diff": float(np.abs(dec - pre[DECODE_PREFIX:]).max()),
        "greedy_ids": [int(x) for x in gr["greedy_ids"]],
        "greedy_margins": [float(x) for x in gr["greedy_margins"]],
        "greedy_min_margin": float(gr["greedy_margins"].min()),
        "greedy_raw_logits_argmax": gr["raw_logits_argmax"],
        "greedy_nocache_argmax_matches": gr["nocache_argmax_matches"],
        "greedy_eos_suppression_changed_a_choice": gr["eos_suppressed_changed_choice"],
    }
    return arrays, info


REFERENCE_DOC = {
    "prompt_ids": "int64 [12]: the fixed prompt",
    "prefill_logits": "float32 [12, vocab]: one forward over the whole prompt, no cache",
    "decode_logits": (
        f"float32 [{len(PROMPT_IDS) - DECODE_PREFIX}, vocab]: prefill prompt[:{DECODE_PREFIX}] with "
        f"use_cache=True, then feed prompt[{DECODE_PREFIX}], prompt[{DECODE_PREFIX + 1}], ... one token per "
        "step through past_key_values; row k = logits of step k (should equal prefill_logits[8+k] up to fp noise)"
    ),
    "greedy_ids": (
        f"int64 [{N_GREEDY}]: generate(do_sample=False, min_new_tokens={N_GREEDY}, max_new_tokens={N_GREEDY}) "
        "after the 12-token prompt (min_new_tokens masks eos to -inf until the last step)"
    ),
    "greedy_margins": "float32 [8]: top1 - top2 of the (processed) scores at each greedy step",
}


def save_reference(d: Path, arrays: dict, info: dict, extra: dict) -> None:
    np.savez(d / "reference.npz", **arrays)
    doc = {
        **extra,
        "prompt_ids": PROMPT_IDS,
        "decode_prefix_len": DECODE_PREFIX,
        "decode_step_token_ids": PROMPT_IDS[DECODE_PREFIX:],
        "arrays": {k: {"shape": list(v.shape), "dtype": str(v.dtype), "doc": REFERENCE_DOC[k]} for k, v in arrays.items()},
        **info,
        "seeds": {"torch.manual_seed(init)": INIT_SEED, "noise_generator": NOISE_SEED, "noise_std_1d_params": NOISE_STD},
        "versions": versions(),
        "script": "scripts/make_fixtures.py",
    }
    (d / "reference.json").write_text(json.dumps(doc, indent=1) + "\n")


def dir_size(d: Path) -> int:
    return sum(p.stat().st_size for p in d.iterdir() if p.is_file())


# ---------------------------------------------------------------------------------------
# HF fixtures


def make_hf_fixture(name: str, out: Path) -> dict:
    import torch
    import transformers

    arch, _, _, desc = SPECS[name]
    d = out / name
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)

    model = build_model(name)
    arrays, info = reference_for(model)

    # ablations: prove the feature under test changes the output for this prompt
    ablations = {}
    if name == "mistral_swa4":
        nowin = clone_with_config(model, name, sliding_window=None)
        ablations["no_sliding_window_prefill_max_abs_diff"] = float(
            np.abs(prefill_logits(nowin) - arrays["prefill_logits"]).max()
        )
    if name == "gemma2":
        nowin = clone_with_config(model, name, sliding_window=4096)
        ablations["no_sliding_window_prefill_max_abs_diff"] = float(
            np.abs(prefill_logits(nowin) - arrays["prefill_logits"]).max()
        )
        nocap = clone_with_config(model, name, attn_logit_softcapping=None, final_logit_softcapping=None)
        ablations["no_softcapping_prefill_max_abs_diff"] = float(
            np.abs(prefill_logits(nocap) - arrays["prefill_logits"]).max()
        )
    if name == "gemma3":
        nowin = clone_with_config(model, name, sliding_window=4096)
        ablations["no_sliding_window_prefill_max_abs_diff"] = float(
            np.abs(prefill_logits(nowin) - arrays["prefill_logits"]).max()
        )
        full = model.config.rope_parameters["full_attention"]
        one_rope = clone_with_config(
            model, name, rope_parameters={"sliding_attention": dict(full), "full_attention": dict(full)}
        )
        ablations["global_rope_on_local_layers_prefill_max_abs_diff"] = float(
            np.abs(prefill_logits(one_rope) - arrays["prefill_logits"]).max()
        )
    if name == "glm4_moe":
        state = {k: (v * 0 if k.endswith("e_score_correction_bias") else v)
                 for k, v in model.state_dict().items()}
        nobias = clone_with_config(model, name)
        nobias.load_state_dict(state)
        ablations["no_score_correction_bias_prefill_max_abs_diff"] = float(
            np.abs(prefill_logits(nobias) - arrays["prefill_logits"]).max()
        )
        nogroups = clone_with_config(model, name, n_group=1, topk_group=1)
        ablations["no_group_limit_prefill_max_abs_diff"] = float(
            np.abs(prefill_logits(nogroups) - arrays["prefill_logits"]).max()
        )
        noscale = clone_with_config(model, name, routed_scaling_factor=1.0)
        ablations["no_routed_scaling_prefill_max_abs_diff"] = float(
            np.abs(prefill_logits(noscale) - arrays["prefill_logits"]).max()
        )
    if name in ("deepseek_v3", "deepseek_v2_lite"):
        plain = dict(model.config.rope_parameters, rope_type="default")
        for k in ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale",
                  "mscale_all_dim"):
            plain.pop(k, None)
        norope = clone_with_config(model, name, rope_parameters=plain)
        ablations["no_yarn_prefill_max_abs_diff"] = float(
            np.abs(prefill_logits(norope) - arrays["prefill_logits"]).max()
        )
    if name == "llama_llama3rope_tied":
        plain = clone_with_config(model, name, rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
        ablations["default_rope_prefill_max_abs_diff"] = float(
            np.abs(prefill_logits(plain) - arrays["prefill_logits"]).max()
        )
    for k, v in ablations.items():
        if not v > 1e-3:
            raise SystemExit(f"{name}: ablation {k}={v}: the feature does not matter for this prompt")

    model.save_pretrained(d, safe_serialization=True)

    # reload from disk: logits must reproduce exactly
    re = getattr(transformers, arch).from_pretrained(
        d, attn_implementation="eager", dtype=torch.float32
    ).eval()
    reload_pre = float(np.abs(prefill_logits(re) - arrays["prefill_logits"]).max())
    reload_dec = float(np.abs(decode_logits(re) - arrays["decode_logits"]).max())
    # (cached decode after a reload may differ in the last float bits: Gemma 3's did by 2e-6,
    # with equal weights, buffers and configs; the tests' tolerance is 1e-4)
    if reload_pre != 0.0 or reload_dec > RELOAD_DECODE_TOL:
        raise SystemExit(f"{name}: reload mismatch prefill {reload_pre} decode {reload_dec}")
    if info["decode_vs_prefill_max_abs_diff"] > 1e-4:
        raise SystemExit(f"{name}: cached decode disagrees with prefill: {info['decode_vs_prefill_max_abs_diff']}")

    extra = {
        "name": name,
        "architecture": arch,
        "model_type": model.config.model_type,
        "description": desc,
        "n_params": int(sum(p.numel() for p in model.parameters())),
        "reload_prefill_max_abs_diff": reload_pre,
        "reload_decode_max_abs_diff": reload_dec,
        "ablations": ablations,
    }
    save_reference(d, arrays, info, extra)
    return {"name": name, "bytes": dir_size(d), "logit_std": info["prefill_logit_std"], **ablations}


# ---------------------------------------------------------------------------------------
# GGUF by llama.cpp's converter


def make_llamacpp_gguf_fixture(name: str, out: Path) -> dict:
    """Convert HF fixture ``src`` (made first) to an F32 GGUF with llama.cpp's converter class
    (its tensor names, splits and metadata; only the vocabulary is this script's: the
    fixtures have no tokenizer, so the byte-level one of the llama GGUF fixture is written).
    F32 keeps the weights exact, so the HF fixture's reference logits are this file's too."""
    import os

    import torch

    src, cls_name, arch = LLAMACPP_GGUF[name]
    root = Path(os.environ.get("LLAMA_CPP", ""))
    if not (root / "conversion").is_dir():
        raise SystemExit(f"{name}: set LLAMA_CPP to a llama.cpp source tree (with conversion/)")
    src_tree = "/".join(root.resolve().parts[-3:])     # e.g. the sdist's vendor/llama.cpp
    sys.path[:0] = [str(root), str(root / "gguf-py")]
    import gguf
    from conversion import deepseek as conv

    base = getattr(conv, cls_name)

    class Fixture(base):
        model_arch = getattr(gguf.MODEL_ARCH, arch)

        def set_vocab(self):
            tokens, types, merges = byte_bpe_vocab()
            w = self.gguf_writer
            w.add_tokenizer_model("gpt2")
            w.add_tokenizer_pre("default")
            w.add_token_list(tokens)
            w.add_token_types(types)
            w.add_token_merges(merges)
            w.add_bos_token_id(1)
            w.add_eos_token_id(2)

    d = out / name
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    with torch.inference_mode():
        Fixture(out / src, gguf.LlamaFileType.ALL_F32, d / "model.gguf", eager=True).write()
    reader = gguf.GGUFReader(str(d / "model.gguf"))
    shutil.copy(out / src / "reference.npz", d / "reference.npz")
    ref = json.loads((out / src / "reference.json").read_text())
    ref.update(name=name, source_fixture=src,
               description=f"`{src}` converted to an F32 GGUF by llama.cpp's {cls_name} "
                           f"(convert_hf_to_gguf.py's code); reference arrays copied from `{src}`",
               gguf_tensors={t.name: {"type": t.tensor_type.name, "shape": [int(x) for x in t.data.shape]}
                             for t in reader.tensors},
               llama_cpp=src_tree)
    ref["versions"]["gguf_py"] = "llama.cpp " + src_tree
    (d / "reference.json").write_text(json.dumps(ref, indent=1) + "\n")
    return {"name": name, "bytes": dir_size(d), "tensors": len(reader.tensors)}


# ---------------------------------------------------------------------------------------
# GGUF fixture


def gguf_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf's Q/K permutation (HF rotate-half -> GGML interleaved rope)."""
    rows, cols = w.shape
    return w.reshape(n_head, 2, rows // n_head // 2, cols).swapaxes(1, 2).reshape(rows, cols)


def gguf_unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    rows, cols = w.shape
    return w.reshape(n_head, rows // n_head // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def byte_bpe_vocab() -> tuple[list[str], list[int], list[str]]:
    """A minimal, self-consistent GPT-2-style byte-level BPE vocab of exactly 256 tokens.

    0..2 control (<pad>, <s>, </s>); 3..99 printable ASCII + '\\n' + '\\t' (as GPT-2 byte
    chars, so ' ' is 'Ġ'); 100..227 bytes 0x80..0xFF; 228..255 the results of 28 merges.
    """
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    b2u = {b: chr(c) for b, c in zip(bs, cs)}
    tokens = ["<pad>", "<s>", "</s>"]
    tokens += [b2u[b] for b in range(0x20, 0x7F)] + [b2u[0x0A], b2u[0x09]]
    tokens += [b2u[b] for b in range(0x80, 0x100)]
    merges = [
        "Ġ t", "Ġ a", "h e", "i n", "r e", "o n", "Ġ s", "e r", "Ġ c", "a t", "e n", "o r", "Ġ w", "e s",
        "Ġ o", "i s", "Ġ b", "i t", "a n", "Ġ p", "Ġ f", "e d", "a r", "Ġ m", "o u", "a l", "Ġ d", "l e",
    ]  # fmt: skip
    tokens += [m.replace(" ", "") for m in merges]
    assert len(tokens) == 256 and len(set(tokens)) == 256, (len(tokens), len(set(tokens)))
    types = [3, 3, 3] + [1] * 253  # CONTROL, NORMAL
    return tokens, types, merges


def make_gguf_fixture(out: Path) -> dict:
    import gguf
    import torch
    import transformers
    from gguf import GGMLQuantizationType as QT

    name = GGUF_NAME
    d = out / name
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)

    cfg = make_config(GGUF_SOURCE)
    src = build_model(GGUF_SOURCE, cfg)  # same weights as the `llama` fixture
    sd = {k: v.detach().numpy().astype(np.float32) for k, v in src.state_dict().items()}
    n_head, n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
    L = cfg.num_hidden_layers

    # (gguf name, hf name, qtype, permute-heads or None)
    plan = [("token_embd.weight", "model.embed_tokens.weight", QT.Q8_0, None)]
    for i in range(L):
        p = f"model.layers.{i}."
        plan += [
            (f"blk.{i}.attn_norm.weight", p + "input_layernorm.weight", QT.F32, None),
            (f"blk.{i}.attn_q.weight", p + "self_attn.q_proj.weight", QT.Q4_1, n_head),
            (f"blk.{i}.attn_k.weight", p + "self_attn.k_proj.weight", QT.Q4_1, n_kv),
            (f"blk.{i}.attn_v.weight", p + "self_attn.v_proj.weight", QT.Q4_1, None),
            (f"blk.{i}.attn_output.weight", p + "self_attn.o_proj.weight", QT.Q4_1, None),
            (f"blk.{i}.ffn_norm.weight", p + "post_attention_layernorm.weight", QT.F32, None),
            (f"blk.{i}.ffn_gate.weight", p + "mlp.gate_proj.weight", QT.Q4_1, None),
            (f"blk.{i}.ffn_up.weight", p + "mlp.up_proj.weight", QT.Q4_1, None),
            (f"blk.{i}.ffn_down.weight", p + "mlp.down_proj.weight", QT.Q4_1, None),
        ]
    plan += [
        ("output_norm.weight", "model.norm.weight", QT.F32, None),
        ("output.weight", "lm_head.weight", QT.Q4_1, None),
    ]
    assert {h for _, h, _, _ in plan} == set(sd), set(sd) ^ {h for _, h, _, _ in plan}

    w = gguf.GGUFWriter(d / "model.gguf", "llama")
    w.add_name("poot tiny llama (random init) Q4_1")
    w.add_block_count(L)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(float(cfg.rms_norm_eps))
    w.add_rope_dimension_count(cfg.head_dim)
    w.add_vocab_size(cfg.vocab_size)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_1)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    tokens, types, merges = byte_bpe_vocab()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(cfg.bos_token_id)
    w.add_eos_token_id(cfg.eos_token_id)
    w.add_pad_token_id(cfg.pad_token_id)
    w.add_add_bos_token(False)

    deq_sd = {}
    written = {}
    for gname, hname, qt, heads in plan:
        t = sd[hname]
        if heads is not None:
            t = gguf_permute(t, heads)
            assert np.array_equal(gguf_unpermute(t, heads), sd[hname])
        t = np.ascontiguousarray(t, dtype=np.float32)
        if qt == QT.F32:
            w.add_tensor(gname, t)
            deq = t
        else:
            q = gguf.quants.quantize(t, qt)
            w.add_tensor(gname, q, raw_dtype=qt)
            deq = gguf.quants.dequantize(q, qt).reshape(t.shape).astype(np.float32)
        written[gname] = (qt, deq)
        if heads is not None:
            deq = gguf_unpermute(deq, heads)
        deq_sd[hname] = torch.from_numpy(np.ascontiguousarray(deq))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    # read back
    r = gguf.GGUFReader(d / "model.gguf")
    got = {t.name: t for t in r.tensors}
    if set(got) != set(written):
        raise SystemExit(f"gguf read-back tensor names differ: {set(got) ^ set(written)}")
    for gname, (qt, deq) in written.items():
        t = got[gname]
        if t.tensor_type != qt:
            raise SystemExit(f"{gname}: type {t.tensor_type} != {qt}")
        back = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).reshape(deq.shape)
        if not np.array_equal(back, deq):
            raise SystemExit(f"{gname}: read-back data differs")
        # GGUF lists dims fastest-first
        if list(map(int, t.shape)) != list(deq.shape[::-1]):
            raise SystemExit(f"{gname}: shape {list(t.shape)} vs {deq.shape}")
    arch_field = r.fields["general.architecture"]
    if bytes(arch_field.parts[arch_field.data[0]]).decode() != "llama":
        raise SystemExit("gguf: general.architecture is not llama")
    if int(r.fields["llama.attention.head_count_kv"].parts[-1][0]) != n_kv:
        raise SystemExit("gguf: head_count_kv read back wrong")

    # reference: HF Llama with the dequantized (and un-permuted) weights
    deq_model = transformers.LlamaForCausalLM(copy.deepcopy(cfg)).eval()
    deq_model.load_state_dict(deq_sd, strict=True)
    arrays, info = reference_for(deq_model)
    src_pre = prefill_logits(src)
    meta = {
        k: (f.contents() if hasattr(f, "contents") else None)
        for k, f in r.fields.items()
        if not k.startswith("tokenizer.ggml.") or k in ("tokenizer.ggml.model", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id")
    }
    extra = {
        "name": name,
        "architecture": "LlamaForCausalLM (reference) / GGUF llama",
        "description": (
            "GGUF v3 of the `llama` fixture's weights: token_embd Q8_0; attn_q/k/v/output, ffn_gate/up/down, "
            "output Q4_1; norms F32; attn_q/attn_k permuted like llama.cpp convert_hf_to_gguf before quantizing. "
            "Reference logits come from HF LlamaForCausalLM loaded with the dequantized, un-permuted weights."
        ),
        "source_fixture": GGUF_SOURCE,
        "hf_config": json.loads(cfg.to_json_string()),
        "tensors": {
            t.name: {"type": t.tensor_type.name, "gguf_shape": [int(x) for x in t.shape]} for t in r.tensors
        },
        "gguf_metadata": {k: v for k, v in meta.items() if not k.startswith("GGUF.")},
        "gguf_version": int(r.fields["GGUF.version"].parts[-1][0]),
        "quantization_vs_f32_prefill_max_abs_diff": float(np.abs(arrays["prefill_logits"] - src_pre).max()),
    }
    save_reference(d, arrays, info, extra)
    return {"name": name, "bytes": dir_size(d), "logit_std": info["prefill_logit_std"]}


# ---------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------
# pooled fixtures: embeddings and cross-encoder scores

# Rows of different lengths, so padding and per-row pooling are exercised (pad id 0).
POOL_IDS = [
    [17, 42, 100, 7, 255, 3, 128, 64, 9, 200, 31, 5],
    [11, 250, 6, 99, 4],
    [23, 8, 140, 77, 13, 201, 66, 90, 18],
]
BERT_COMMON = dict(
    vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, max_position_embeddings=64, type_vocab_size=2,
    initializer_range=0.2, layer_norm_eps=1e-12, hidden_act="gelu", pad_token_id=0,
)
BERT_SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
BERT_WORDS = (
    "the of and to in is a what which city capital france paris germany berlin italy rome "
    "spain madrid cat dog cats dogs animal pet river mountain largest country europe language "
    "spoken french german people live lives there here how many who when where why sun moon "
    "star planet earth water fire tree forest sea ocean fish bird eat eats food good bad "
    "big small old new red blue green color music song play plays game team sport ball run "
    "runs fast slow book read reads write code program computer machine learning model "
    "search query document answer question rank score"
).split()
# sentence-transformers texts for bert_embed (encoded by SentenceTransformer itself)
EMBED_TEXTS = ["What is the capital of France?", "Paris is the capital of France.",
               "The cat eats fish.", "zzz qqq"]
RERANK_QUERY = "What is the capital of France?"
RERANK_DOCS = ["Paris is the capital of France.", "Berlin is the capital of Germany.",
               "The cat eats fish.", "France is a country in Europe where people speak French.",
               "How many planets are there?"]


def bert_vocab() -> list[str]:
    """A 256-entry WordPiece vocab: specials, words, single characters and their ## forms."""
    chars = [chr(c) for c in range(ord("a"), ord("z") + 1)] + list("0123456789") + list(".,?!'-")
    vocab = BERT_SPECIAL + BERT_WORDS + chars + ["##" + c for c in chars[:26]]
    seen, out = set(), []
    for v in vocab:
        if v not in seen:
            seen.add(v)
            out.append(v)
    filler = 0
    while len(out) < 256:
        out.append(f"[unused{filler}]")
        filler += 1
    assert len(out) == 256, len(out)
    return out


def write_bert_tokenizer(d: Path) -> None:
    """tokenizer.json (WordPiece, BERT normalizer and pre-tokenizer, [CLS] A [SEP] B [SEP]
    with token types 0/1) plus the configs transformers' BertTokenizerFast loads."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    vocab = {t: i for i, t in enumerate(bert_vocab())}
    tk = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    tk.normalizer = normalizers.BertNormalizer(lowercase=True)
    tk.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tk.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
    tk.decoder = decoders.WordPiece(prefix="##")
    from tokenizers import AddedToken
    tk.add_special_tokens([AddedToken(t, special=True) for t in BERT_SPECIAL])
    tk.save(str(d / "tokenizer.json"))
    (d / "vocab.txt").write_text("\n".join(bert_vocab()) + "\n")
    cfg = {"tokenizer_class": "BertTokenizer", "do_lower_case": True, "model_max_length": 64,
           "cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]",
           "unk_token": "[UNK]", "mask_token": "[MASK]"}
    (d / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1) + "\n")


def write_st_config(d: Path, mode: str, normalize: bool) -> None:
    """modules.json + 1_Pooling/config.json (+ 2_Normalize) as SentenceTransformer.save."""
    from sentence_transformers.models import Pooling

    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize",
                        "type": "sentence_transformers.models.Normalize"})
        (d / "2_Normalize").mkdir(exist_ok=True)
    (d / "modules.json").write_text(json.dumps(modules, indent=2) + "\n")
    (d / "1_Pooling").mkdir(exist_ok=True)
    Pooling(64, pooling_mode=mode).save(str(d / "1_Pooling"))
    (d / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 64, "do_lower_case": False}) + "\n")


def padded(rows: list[list[int]]):
    import torch

    n = max(map(len, rows))
    ids = torch.zeros((len(rows), n), dtype=torch.long)
    mask = torch.zeros((len(rows), n), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = 1
    return ids, mask


def st_pool(hidden, mask, mode: str, normalize: bool) -> np.ndarray:
    """sentence-transformers' own Pooling (and Normalize) modules on HF hidden states."""
    from sentence_transformers.models import Normalize, Pooling

    feats = {"token_embeddings": hidden, "attention_mask": mask}
    feats = Pooling(hidden.shape[-1], pooling_mode=mode)(feats)
    if normalize:
        feats = Normalize()(feats)
    return feats["sentence_embedding"].detach().float().numpy().copy()


def make_pooled_fixture(name: str, out: Path) -> dict:
    import torch
    import transformers

    d = out / name
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    torch.manual_seed(INIT_SEED)
    arrays: dict = {}
    info: dict = {}
    if name == "qwen3_embed":
        # Qwen3-Embedding layout: the bare Qwen3Model's tensors (no "model." prefix, no
        # lm_head), architectures still Qwen3ForCausalLM; last-token pooling + normalize
        kw = dict(COMMON)
        kw.update(use_sliding_window=False, tie_word_embeddings=False)
        cfg = transformers.Qwen3Config(**kw)
        cfg._attn_implementation = "eager"
        model = transformers.Qwen3Model(cfg).to(torch.float32)
        mode, normalize, rows = "lasttoken", True, [[1] + r[:-1] for r in POOL_IDS]
        desc = "Qwen3Model (Qwen3-Embedding layout), last-token pooling, normalized"
    elif name in ("bert_embed", "bert_cross_encoder"):
        cls = "BertModel" if name == "bert_embed" else "BertForSequenceClassification"
        cfg = transformers.BertConfig(**BERT_COMMON, num_labels=1)
        cfg._attn_implementation = "eager"
        model = getattr(transformers, cls)(cfg).to(torch.float32)
        mode, normalize = "mean", True
        rows = [[2] + r[:-2] + [3] for r in POOL_IDS]
        desc = ("BertModel, mean pooling, normalized" if name == "bert_embed" else
                "BertForSequenceClassification, 1 label (cross-encoder)")
    else:
        raise SystemExit(f"unknown pooled fixture {name}")
    perturb_vectors(model)
    ids, mask = padded(rows)
    lengths = [len(r) for r in rows]
    flat = np.zeros((len(rows), ids.shape[1]), np.int64)
    flat[:, :] = ids.numpy()
    arrays["input_ids"] = flat
    arrays["lengths"] = np.asarray(lengths, np.int64)
    with torch.no_grad():
        if name == "bert_cross_encoder":
            model.config.architectures = ["BertForSequenceClassification"]
            model.save_pretrained(d, safe_serialization=True)
            write_bert_tokenizer(d)
            types = torch.zeros_like(ids)
            for i, r in enumerate(rows):      # second segment: from the first [SEP] on
                sep = r.index(3) if 3 in r[:-1] else len(r) // 2
                types[i, sep + 1 : len(r)] = 1
            arrays["token_type_ids"] = types.numpy().astype(np.int64)
            logits = model(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
            arrays["scores"] = logits.float().numpy().copy()
            # the rerank texts, tokenized as pairs by transformers' tokenizer
            tok = transformers.AutoTokenizer.from_pretrained(d)
            enc = tok([RERANK_QUERY] * len(RERANK_DOCS), RERANK_DOCS, padding=True,
                      return_tensors="pt")
            rl = model(**enc).logits[:, 0]
            arrays["rerank_logits"] = rl.float().numpy().copy()
            arrays["rerank_scores"] = torch.sigmoid(rl).float().numpy().copy()
            info["rerank_query"] = RERANK_QUERY
            info["rerank_documents"] = RERANK_DOCS
            info["rerank_pair_ids"] = [[int(x) for x, m in zip(row, mm) if m]
                                       for row, mm in zip(enc["input_ids"].tolist(),
                                                          enc["attention_mask"].tolist())]
            re = transformers.BertForSequenceClassification.from_pretrained(d, attn_implementation="eager")
            reload = float((re(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
                            - logits).abs().max())
        else:
            hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
            arrays["embeddings"] = st_pool(hidden, mask, mode, normalize)
            unnorm = st_pool(hidden, mask, mode, False)
            arrays["embeddings_unnormalized"] = unnorm
            # each row alone (no padding) must pool to the same vector
            alone = np.concatenate([
                st_pool(model(input_ids=ids[i : i + 1, :n]).last_hidden_state,
                        mask[i : i + 1, :n], mode, normalize) for i, n in enumerate(lengths)])
            info["alone_vs_padded_max_abs_diff"] = float(np.abs(alone - arrays["embeddings"]).max())
            model.config.architectures = ["Qwen3ForCausalLM" if name == "qwen3_embed" else "BertModel"]
            if name == "bert_embed":     # lets the server tests truncate (``dimensions``)
                model.config.is_matryoshka = True
            model.save_pretrained(d, safe_serialization=True)
            write_st_config(d, mode, normalize)
            if name == "bert_embed":
                write_bert_tokenizer(d)
                from sentence_transformers import SentenceTransformer

                st = SentenceTransformer(str(d), device="cpu")
                arrays["text_embeddings"] = st.encode(EMBED_TEXTS, convert_to_numpy=True).astype(np.float32)
                info["texts"] = EMBED_TEXTS
                info["text_ids"] = [st.tokenizer(t)["input_ids"] for t in EMBED_TEXTS]
            re = type(model).from_pretrained(d, attn_implementation="eager")
            h2 = re(input_ids=ids, attention_mask=mask).last_hidden_state
            reload = float(np.abs(st_pool(h2, mask, mode, normalize) - arrays["embeddings"]).max())
    if reload != 0.0:
        raise SystemExit(f"{name}: reload mismatch {reload}")
    np.savez(d / "reference.npz", **arrays)
    doc = {"name": name, "description": desc, "pooling": mode, "normalize": normalize,
           "input_ids": rows, "lengths": lengths,
           "arrays": {k: {"shape": list(v.shape), "dtype": str(v.dtype)} for k, v in arrays.items()},
           "reload_max_abs_diff": reload, **info,
           "seeds": {"torch.manual_seed(init)": INIT_SEED, "noise_generator": NOISE_SEED,
                     "noise_std_1d_params": NOISE_STD},
           "versions": versions(), "script": "scripts/make_fixtures.py"}
    (d / "reference.json").write_text(json.dumps(doc, indent=1) + "\n")
    size = sum(p.stat().st_size for p in d.rglob("*") if p.is_file())
    return {"name": name, "bytes": size}


# ---------------------------------------------------------------------------------------
# LoRA adapters (PEFT format) of the `llama` fixture

# name -> LoraConfig fields; B is random (PEFT's default init sets it to 0: no effect)
LORA_ADAPTERS = {
    "adapter_a": dict(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]),
    "adapter_b": dict(r=8, lora_alpha=16, use_rslora=True,
                      target_modules=["q_proj", "v_proj", "gate_proj", "up_proj", "down_proj"]),
}
LORA_SEED = 2


def make_lora_fixture(out: Path) -> dict:
    """Two PEFT adapters over test/fixtures/tiny/llama (read from `out`/llama), with HF + PEFT
    prefill logits and greedy ids for each."""
    import torch
    import transformers
    from peft import LoraConfig, PeftModel, get_peft_model

    d = out / LORA_NAME
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    base_dir = out / "llama"
    arrays, info = {}, {"base": "../llama", "adapters": {}}
    gen = torch.Generator().manual_seed(LORA_SEED)
    for name, kw in LORA_ADAPTERS.items():
        base = transformers.LlamaForCausalLM.from_pretrained(base_dir, attn_implementation="eager",
                                                            dtype=torch.float32).eval()
        model = get_peft_model(base, LoraConfig(task_type="CAUSAL_LM", lora_dropout=0.0, **kw))
        with torch.no_grad():
            for pname, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
                if "lora_" in pname:
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
        model.eval()
        model.save_pretrained(d / name)
        (d / name / "README.md").unlink(missing_ok=True)        # PEFT's model card
        acfg = json.loads((d / name / "adapter_config.json").read_text())
        acfg["base_model_name_or_path"] = "../../llama"          # no machine path
        (d / name / "adapter_config.json").write_text(json.dumps(acfg, indent=2, sort_keys=True) + "\n")
        ref, _ = reference_for(model)
        # reload (unmerged) from disk: the same logits; merged: within fp noise
        re = PeftModel.from_pretrained(
            transformers.LlamaForCausalLM.from_pretrained(base_dir, attn_implementation="eager",
                                                          dtype=torch.float32), d / name).eval()
        reload = float(np.abs(prefill_logits(re) - ref["prefill_logits"]).max())
        merged = float(np.abs(prefill_logits(re.merge_and_unload()) - ref["prefill_logits"]).max())
        base_ref = np.load(base_dir / "reference.npz")["prefill_logits"]
        effect = float(np.abs(ref["prefill_logits"] - base_ref).max())
        if reload != 0.0 or merged > 1e-4 or effect < 1e-2:
            raise SystemExit(f"{name}: reload {reload} merged {merged} effect {effect}")
        for k in ("prefill_logits", "greedy_ids", "greedy_margins"):
            arrays[f"{name}.{k}"] = ref[k]
        info["adapters"][name] = {**{k: v for k, v in kw.items()},
                                  "reload_max_abs_diff": reload,
                                  "merged_vs_unmerged_max_abs_diff": merged,
                                  "max_abs_logit_change_vs_base": effect,
                                  "greedy_ids": [int(x) for x in ref["greedy_ids"]],
                                  "greedy_min_margin": float(ref["greedy_margins"].min())}
    arrays["prompt_ids"] = np.asarray(PROMPT_IDS, np.int64)
    np.savez(d / "reference.npz", **arrays)
    doc = {"name": LORA_NAME, "description": "PEFT LoRA adapters of the llama fixture", **info,
           "prompt_ids": PROMPT_IDS, "lora_init_seed": LORA_SEED, "lora_init_std": 0.2,
           "arrays": {k: {"shape": list(v.shape), "dtype": str(v.dtype)} for k, v in arrays.items()},
           "versions": {**versions(), "peft": __import__("peft").__version__},
           "script": "scripts/make_fixtures.py"}
    (d / "reference.json").write_text(json.dumps(doc, indent=1) + "\n")
    return {"name": LORA_NAME, "bytes": sum(p.stat().st_size for p in d.rglob("*") if p.is_file())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--only", nargs="+", metavar="NAME", choices=ALL_NAMES)
    ap.add_argument("--list", action="store_true", help="list fixture names and exit")
    args = ap.parse_args(argv)
    if args.list:
        for n in SPECS:
            print(f"{n:24s} {SPECS[n][0]:22s} {SPECS[n][3]}")
        print(f"{GGUF_NAME:24s} {'GGUF llama':22s} Q8_0/Q4_1 GGUF of `{GGUF_SOURCE}`")
        for n in POOLED:
            print(f"{n:24s} {'pooled':22s} embeddings / cross-encoder scores")
        return 0

    import torch

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    names = args.only or ALL_NAMES
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for n in names:
        if n == GGUF_NAME:
            res = make_gguf_fixture(args.out)
        elif n in LLAMACPP_GGUF:
            res = make_llamacpp_gguf_fixture(n, args.out)
        elif n in POOLED:
            res = make_pooled_fixture(n, args.out)
        elif n == LORA_NAME:
            res = make_lora_fixture(args.out)
        else:
            res = make_hf_fixture(n, args.out)
        results.append(res)
        print(json.dumps(res), flush=True)
    big = [r for r in results if r["bytes"] > 600 * 1024]
    if big:
        print(f"WARNING: fixtures over 600 KiB: {[r['name'] for r in big]}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
