"""The Phi-3 family (``Phi3ForCausalLM``, GGUF ``phi3``).

A Llama-shaped pre-norm decoder traced by :func:`poot.models.components.trace_decoder` whose
projections are stored fused: ``qkv_proj`` [(Hq + 2 Hkv) D, H] (rows q | k | v) and
``gate_up_proj`` [2F, H] (rows gate | up, HF ``chunk(2)``); the graph slices the fused
outputs. RoPE is half-layout with the checkpoint's ``partial_rotary_factor``; a configured
``sliding_window`` applies to every layer. ``longrope`` scaling (Phi-3 128k) is refused
with a ModelError.

GGUF: llama.cpp keeps the fused tensors (``attn_qkv``, ``ffn_up`` = gate | up); the names are
mapped but untested (no GGUF fixture).
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping

from poot.models import components as C
from poot.models.base import REGISTRY, WeightName, WeightTable


@REGISTRY.register
class Phi3(C.DecoderModel):
    """Phi-3 (mini/medium): fused qkv and gate|up projections."""

    family: ClassVar[str] = "phi3"
    architectures: ClassVar[tuple[str, ...]] = ("Phi3ForCausalLM", "phi3")

    @classmethod
    def from_config(cls, cfg: Any, store: Mapping[str, Any] | None = None) -> "Phi3":
        extra = cfg.extra or {}
        return cls(C.decoder_options(cfg, cls.family, fused_qkv=True, fused_gate_up=True,
                                     act=str(extra.get("hidden_act", "silu")),
                                     layer_windows=C.layer_windows(cfg)))

    def weight_table(self) -> WeightTable:
        hb = "model.layers.{i}."
        t = {r: n for r, n in C.decoder_weight_names(self.config).items()
             if r not in ("blk.{i}.attn.q", "blk.{i}.attn.k", "blk.{i}.attn.v")}
        t["blk.{i}.attn.qkv"] = WeightName(hb + "self_attn.qkv_proj.weight",
                                           "blk.{i}.attn_qkv.weight")
        t["blk.{i}.ffn.gate_up"] = WeightName(hb + "mlp.gate_up_proj.weight",
                                              "blk.{i}.ffn_up.weight")
        t["blk.{i}.ffn.down"] = WeightName(hb + "mlp.down_proj.weight",
                                           "blk.{i}.ffn_down.weight")
        return t
