"""The Gemma, Gemma 2 and Gemma 3 (text) families.

Pre-norm decoders traced by :func:`poot.models.components.trace_decoder`, differing from
Llama in:

* embeddings multiplied by ``sqrt(hidden_size)`` (HF casts the normalizer to the activation
  dtype; f32 here); the tied head reads the unscaled table;
* RMSNorm scales by ``(1 + w)`` (HF stores ``w``; llama.cpp's converter stores ``1 + w``, so
  GGUF norms are used as stored);
* a tanh-GELU gated MLP (``hidden_activation``, default ``gelu_pytorch_tanh``).

**Gemma 2** adds: ``post_attention_layernorm`` / ``post_feedforward_layernorm`` on the branch
outputs (the FFN's pre-norm is ``pre_feedforward_layernorm``), attention scale
``query_pre_attn_scalar ** -0.5``, attention-logit soft-capping (``attn_logit_softcapping``)
and final-logit soft-capping, and a sliding window on the ``sliding_attention`` layers of
``layer_types`` (the even layers when ``layer_types`` is absent, as HF 4.x did).

**Gemma 3** (text; ``Gemma3ForCausalLM``) adds to Gemma 2: per-head q/k RMSNorm (``(1 + w)``)
before RoPE, sliding-window ("local") layers rotating with their own base
(``rope_parameters["sliding_attention"]``, or 4.x's ``rope_local_base_freq``) while the global
layers take ``rope_theta`` and its scaling, five local layers to one global when
``layer_types`` is absent (``sliding_window_pattern``, default 6), and soft-capping only where
the config sets it (HF's default: none).

GGUF: ``gemma`` only (llama.cpp names; untested: no GGUF fixture). Gemma 2 GGUF is not mapped:
its metadata does not carry ``query_pre_attn_scalar``.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Mapping

from poot.models import components as C
from poot.models.base import REGISTRY, ModelError, WeightName, WeightTable


def _act(cfg: Any) -> str:
    extra = cfg.extra or {}
    return str(extra.get("hidden_activation") or "gelu_pytorch_tanh")


def _attn_scale(cfg: Any) -> float:
    """``query_pre_attn_scalar ** -0.5`` (Gemma 2 and 3), the head dim's when unset."""
    scalar = (cfg.extra or {}).get("query_pre_attn_scalar")
    return (float(scalar) if scalar is not None else float(cfg.head_dim)) ** -0.5


def _gemma_options(cfg: Any, family: str, **overrides: Any) -> C.DecoderOptions:
    return C.decoder_options(cfg, family, embed_scale=math.sqrt(cfg.hidden_size),
                             norm_unit_offset=cfg.source == "hf", act=_act(cfg), **overrides)


@REGISTRY.register
class Gemma(C.DecoderModel):
    """Gemma (1): (1 + w) RMSNorm, sqrt(hidden) embedding scale, GeGLU (tanh), tied head."""

    family: ClassVar[str] = "gemma"
    architectures: ClassVar[tuple[str, ...]] = ("GemmaForCausalLM", "gemma")

    @classmethod
    def from_config(cls, cfg: Any, store: Mapping[str, Any] | None = None) -> "Gemma":
        return cls(_gemma_options(cfg, cls.family, layer_windows=C.layer_windows(cfg)))

    def weight_table(self) -> WeightTable:
        return {**C.decoder_weight_names(self.config), **C.dense_ffn_names()}


@REGISTRY.register
class Gemma2(C.DecoderModel):
    """Gemma 2: Gemma plus sandwich norms, soft-capping, query_pre_attn_scalar and
    alternating sliding-window layers."""

    family: ClassVar[str] = "gemma2"
    architectures: ClassVar[tuple[str, ...]] = ("Gemma2ForCausalLM",)

    @classmethod
    def from_config(cls, cfg: Any, store: Mapping[str, Any] | None = None) -> "Gemma2":
        if cfg.source != "hf":
            raise ModelError("gemma2: only HF checkpoints are mapped (GGUF metadata has no "
                             "query_pre_attn_scalar)")
        return cls(_gemma_options(
            cfg, cls.family, sandwich_norms=True, attn_scale=_attn_scale(cfg),
            attn_softcap=cfg.attn_logit_softcap, final_softcap=cfg.final_logit_softcap,
            layer_windows=C.layer_windows(cfg, default_sliding=lambda i: i % 2 == 0)))

    def weight_table(self) -> WeightTable:
        hb = "model.layers.{i}."
        t = {**C.decoder_weight_names(self.config), **C.dense_ffn_names()}
        t["blk.{i}.post_attn_norm"] = WeightName(hb + "post_attention_layernorm.weight", None)
        t["blk.{i}.ffn_norm"] = WeightName(hb + "pre_feedforward_layernorm.weight", None)
        t["blk.{i}.post_ffn_norm"] = WeightName(hb + "post_feedforward_layernorm.weight", None)
        return t


@REGISTRY.register
class Gemma3(Gemma2):
    """Gemma 3 (text): Gemma 2's layers plus q/k norms, and local layers with their own RoPE
    base, five to each global one by default."""

    family: ClassVar[str] = "gemma3"
    architectures: ClassVar[tuple[str, ...]] = ("Gemma3ForCausalLM",)

    @classmethod
    def from_config(cls, cfg: Any, store: Mapping[str, Any] | None = None) -> "Gemma3":
        if cfg.source != "hf":
            raise ModelError("gemma3: only HF checkpoints are mapped (GGUF metadata has no "
                             "query_pre_attn_scalar or local RoPE base)")
        extra = cfg.extra or {}
        if extra.get("use_bidirectional_attention"):
            raise ModelError("gemma3: use_bidirectional_attention (an embedding model's "
                             "encoder attention) is not supported for causal generation")
        pattern = extra.get("sliding_window_pattern", 6)
        if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern < 1:
            raise ModelError(f"gemma3: sliding_window_pattern must be a positive integer, "
                             f"found {pattern!r}")
        return cls(_gemma_options(
            cfg, cls.family, sandwich_norms=True, qk_norm=True, attn_scale=_attn_scale(cfg),
            attn_softcap=cfg.attn_logit_softcap, final_softcap=cfg.final_logit_softcap,
            layer_windows=C.layer_windows(cfg, default_sliding=lambda i: (i + 1) % pattern)))
