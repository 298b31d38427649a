"""The Qwen2 and Qwen3 families (dense).

Both are Llama-shaped pre-norm decoders (RMSNorm, GQA over the KV cache, half-layout RoPE,
SwiGLU), traced by :func:`poot.models.components.trace_decoder`:

* **Qwen2** (``Qwen2ForCausalLM``, GGUF ``qwen2``): q/k/v projections carry biases (bound
  when the checkpoint has them). HF's ``use_sliding_window`` is honoured through
  ``layer_types`` (the loader drops the window when it is off).
* **Qwen3** (``Qwen3ForCausalLM``, GGUF ``qwen3``): no biases by default; a per-head RMSNorm
  (``q_norm``/``k_norm``, weight [head_dim]) on q and k before RoPE.

GGUF: llama.cpp stores Qwen Q/K rows unpermuted and applies NEOX (half) RoPE, so the rows
are used as stored. No GGUF fixture exists for these architectures; the GGUF names are
untested.
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping

from poot.models import components as C
from poot.models.base import REGISTRY, WeightTable


def qwen_options(cfg: Any, family: str, qk_norm: bool, **overrides: Any) -> C.DecoderOptions:
    """:class:`~poot.models.components.DecoderOptions` of a Qwen checkpoint."""
    extra = cfg.extra or {}
    return C.decoder_options(cfg, family, qk_norm=qk_norm,
                             act=str(extra.get("hidden_act", "silu")),
                             layer_windows=C.layer_windows(cfg), **overrides)


@REGISTRY.register
class Qwen2(C.DecoderModel):
    """Qwen2 / Qwen2.5 (dense): Llama with q/k/v biases."""

    family: ClassVar[str] = "qwen2"
    architectures: ClassVar[tuple[str, ...]] = ("Qwen2ForCausalLM", "qwen2",
                                                 "Qwen2Model",  # headless (gte-Qwen2)
                                                 "Qwen2ForSequenceClassification")

    @classmethod
    def from_config(cls, cfg: Any, store: Mapping[str, Any] | None = None) -> "Qwen2":
        return cls(qwen_options(cfg, cls.family, qk_norm=False))

    def weight_table(self) -> WeightTable:
        return {**C.decoder_weight_names(self.config, attn_bias=True), **C.dense_ffn_names()}


@REGISTRY.register
class Qwen3(C.DecoderModel):
    """Qwen3 (dense): per-head q/k RMSNorm before RoPE; optional attention biases."""

    family: ClassVar[str] = "qwen3"
    architectures: ClassVar[tuple[str, ...]] = ("Qwen3ForCausalLM", "qwen3",
                                                 "Qwen3Model",  # headless (embeddings)
                                                 "Qwen3ForSequenceClassification")

    @classmethod
    def from_config(cls, cfg: Any, store: Mapping[str, Any] | None = None) -> "Qwen3":
        return cls(qwen_options(cfg, cls.family, qk_norm=True))

    def weight_table(self) -> WeightTable:
        return {**C.decoder_weight_names(self.config, attn_bias=True), **C.dense_ffn_names()}
