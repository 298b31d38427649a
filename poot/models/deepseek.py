"""The DeepSeek-V2 and DeepSeek-V3 families: multi-head latent attention and DeepSeek MoE.

Pre-norm decoders traced by :func:`poot.models.components.trace_decoder` whose attention is
MLA (:mod:`poot.models.mla`: q LoRA or a plain q, the KV latent and its RMSNorm, one rotated
key shared by all heads, values narrower than keys; the cache holds the latent and the rope
key) and whose FFN, past the first ``first_k_dense_replace`` dense layers, is a routed MoE
(:func:`poot.graph.ops.moe`, experts read in place) plus ``n_shared_experts`` shared experts.

* **DeepSeek-V2 / V2-Lite** (``DeepseekV2ForCausalLM``): softmax router scores;
  ``topk_method`` ``greedy`` (top-k of all experts) or ``group_limited_greedy`` (``n_group``
  groups, each scored by its best expert, ``topk_group`` of them eligible); as DeepSeek's
  reference code, the selection is renormalized when ``norm_topk_prob`` (HF 5.x ignores the
  flag; the released configs set it false) and otherwise multiplied by
  ``routed_scaling_factor``. RoPE over complex pairs (the interleaved layout).
* **DeepSeek-V3** (``DeepseekV3ForCausalLM``; also V3.1/R1 checkpoints): sigmoid scores,
  the ``e_score_correction_bias`` choosing experts (``noaux_tc``), groups scored by their two
  best, renormalized when ``norm_topk_prob``, times ``routed_scaling_factor``; RoPE pairs
  interleaved (``rope_interleave``, default) or halves.

Both: RoPE over ``qk_rope_head_dim`` channels with the config's scaling (YaRN: its attention
factor from ``mscale`` / ``mscale_all_dim`` multiplies cos and sin) and the softmax scale
``(qk_nope_head_dim + qk_rope_head_dim) ** -0.5``, times ``mscale(factor,
mscale_all_dim) ** 2`` under YaRN (HF ``yarn_apply_mscale``).

GGUF ``deepseek2`` (llama.cpp's converter, V2 and V3 alike: :class:`DeepseekGguf`): the
metadata gives the MLA widths (``kv_lora_rank``, ``key_length_mla`` = nope + rope,
``value_length_mla``, ``rope.dimension_count``), the routing (``expert_gating_func``: 2 is
sigmoid with ``exp_probs_b`` as the score-correction bias, 1 or absent softmax;
``expert_group_count``/``expert_group_used_count``, ``expert_weights_norm``,
``expert_weights_scale``, ``expert_shared_count``, ``leading_dense_block_count``) and YaRN's
``mscale_all_dim`` as ``rope.scaling.yarn_log_multiplier / 0.1`` (``mscale`` taken equal to
it, as llama.cpp does); ``kv_b`` comes split as ``attn_k_b`` [H, R, Dn] / ``attn_v_b``
[H, Dv, R] (converters before mid-2025 wrote one ``attn_kv_b``: such files are refused,
naming the missing ``attn_k_b``). Multi-token-prediction layers (``num_nextn_predict_layers``)
are not run: they serve speculative decoding, not the next-token logits.
"""

from __future__ import annotations

import abc
import dataclasses
import math
from types import MappingProxyType
from typing import Any, ClassVar, Mapping

from poot.graph import ops
from poot.models import components as C
from poot.models.base import REGISTRY, ModelError, WeightName, WeightTable
from poot.models.mla import MlaOptions
from poot.models.moe import deepseek_ffn_table, deepseek_moe


def _dim(extra: Mapping[str, Any], key: str, family: str, *, zero_ok: bool = False) -> int:
    v = extra.get(key)
    if v is None and zero_ok:
        return 0
    if isinstance(v, bool) or not isinstance(v, int) or v < (0 if zero_ok else 1):
        raise ModelError(f"{family}: config {key} must be a "
                         f"{'non-negative' if zero_ok else 'positive'} integer, found {v!r}")
    return v


def _yarn_mscale(factor: float, mscale: float) -> float:
    """DeepSeek's ``yarn_get_mscale``: ``0.1 * mscale * ln(factor) + 1`` for factor > 1."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def mla_options(cfg: Any, family: str, rope_layout: str) -> tuple[MlaOptions, dict[str, Any]]:
    """The :class:`MlaOptions` of a DeepSeek config, and the decoder options' RoPE overrides
    (inverse frequencies over ``qk_rope_head_dim`` channels with the config's scaling).
    Raises ModelError naming a missing or malformed MLA dimension."""
    extra = cfg.extra or {}
    q_rank = _dim(extra, "q_lora_rank", family, zero_ok=True)
    r = _dim(extra, "kv_lora_rank", family)
    dn = _dim(extra, "qk_nope_head_dim", family)
    dr = _dim(extra, "qk_rope_head_dim", family)
    dv = _dim(extra, "v_head_dim", family)
    if dr % 2:
        raise ModelError(f"{family}: qk_rope_head_dim must be even (RoPE rotates pairs), "
                         f"found {dr}")
    scaling = C.ops_rope_scaling(cfg, family)
    scale = (dn + dr) ** -0.5
    if scaling.kind != "none" and scaling.mscale_all_dim:
        scale *= _yarn_mscale(scaling.factor, scaling.mscale_all_dim) ** 2
    inv = C.rope_inv_freq(dr, cfg.rope_theta, scaling)

    rope = dict(inv_freq=tuple(float(x) for x in inv),
                rope_attention_scaling=ops.rope_attention_scaling(scaling))
    return MlaOptions(q_rank, r, dn, dr, dv, float(scale), rope_layout), rope


def _mla_weight_table(o: C.DecoderOptions) -> dict[str, WeightName]:
    """Embedding, norms, head, and the MLA projections (HF ``self_attn.`` names, the
    ``q_a``/``kv_a``/``o`` biases optional as ``attention_bias``; GGUF ``attn_q``,
    ``attn_q_a``/``attn_q_a_norm``/``attn_q_b``, ``attn_kv_a_mqa``, ``attn_kv_a_norm``,
    ``attn_k_b``/``attn_v_b``, ``attn_output``)."""
    a = "model.layers.{i}.self_attn."
    t = {r: w for r, w in C.decoder_weight_names(o).items()
         if not any(r == f"blk.{{i}}.attn.{x}" for x in ("q", "k", "v"))}
    roles = {"kv_a": ("kv_a_proj_with_mqa", "attn_kv_a_mqa"),
             "kv_a_norm": ("kv_a_layernorm", "attn_kv_a_norm")}
    roles.update({"kv_b": ("kv_b_proj", None)} if o.source == "hf" else
                 {"k_b": (None, "attn_k_b"), "v_b": (None, "attn_v_b")})
    roles.update({"q_a": ("q_a_proj", "attn_q_a"), "q_a_norm": ("q_a_layernorm", "attn_q_a_norm"),
                  "q_b": ("q_b_proj", "attn_q_b")} if o.mla.q_lora_rank
                 else {"q": ("q_proj", "attn_q")})
    for role, (hf, gg) in roles.items():
        t[f"blk.{{i}}.attn.{role}"] = WeightName(hf and a + f"{hf}.weight",
                                                 gg and f"blk.{{i}}.{gg}.weight")
    for role, name in (("q_a", "q_a_proj"), ("kv_a", "kv_a_proj_with_mqa"), ("o", "o_proj")):
        if role in roles or role == "o":
            t[f"blk.{{i}}.attn.{role}_bias"] = WeightName(a + f"{name}.bias", None, True)
    return t


def hf_view_of_gguf(cfg: Any, family: str) -> Any:
    """The :class:`~poot.load.config.ModelConfig` of a GGUF ``deepseek2`` file with the HF
    config keys this module reads (``kv_lora_rank`` ..., the routing's) in ``extra``, RoPE
    scaling's ``mscale``/``mscale_all_dim`` from ``yarn_log_multiplier`` and the head count
    for KV heads (llama.cpp writes 1: MLA as MQA). Raises ModelError naming a missing key."""
    meta, k = cfg.extra or {}, cfg.architecture + "."

    def get(key: str, default: Any = KeyError) -> Any:
        v = meta.get(k + key, default)
        if v is KeyError:
            raise ModelError(f"{family}: GGUF metadata {k + key} is missing")
        return v

    rope = int(get("rope.dimension_count"))
    gating = int(get("expert_gating_func", 1))           # llama.cpp: 1 softmax, 2 sigmoid
    if gating not in (1, 2):
        raise ModelError(f"{family}: GGUF {k}expert_gating_func {gating} is not supported "
                         f"(1: softmax, 2: sigmoid)")
    groups = int(get("expert_group_count", 1) or 1)
    key_len = int(get("attention.key_length_mla"))
    if key_len <= rope:
        raise ModelError(f"{family}: GGUF {k}attention.key_length_mla ({key_len}) must exceed "
                         f"{k}rope.dimension_count ({rope}): a key is its no-RoPE part then "
                         f"its RoPE part")
    extra = dict(meta)
    extra.update(
        q_lora_rank=int(get("attention.q_lora_rank", 0)) or None,
        kv_lora_rank=int(get("attention.kv_lora_rank")),
        qk_rope_head_dim=rope, qk_nope_head_dim=key_len - rope,
        v_head_dim=int(get("attention.value_length_mla")),
        n_shared_experts=int(get("expert_shared_count", 0)),
        first_k_dense_replace=int(get("leading_dense_block_count", 0)),
        routed_scaling_factor=float(get("expert_weights_scale", 1.0)),
        norm_topk_prob=bool(get("expert_weights_norm", False)),
        n_group=groups, topk_group=int(get("expert_group_used_count", groups) or groups),
        scoring_func="sigmoid" if gating == 2 else "softmax",
        topk_method="noaux_tc" if gating == 2 else
        ("group_limited_greedy" if groups > 1 else "greedy"),
        hidden_act="silu")
    rs = cfg.rope_scaling
    log_mul = get("rope.scaling.yarn_log_multiplier", None)
    if rs.kind == "yarn" and log_mul:
        rs = dataclasses.replace(rs, mscale=float(log_mul) / 0.1,
                                 mscale_all_dim=float(log_mul) / 0.1)
    return dataclasses.replace(cfg, extra=MappingProxyType(extra), rope_scaling=rs,
                               num_kv_heads=cfg.num_heads, head_dim=rope)


class _DeepSeek(C.DecoderModel):
    """Shared by V2 and V3: MLA attention, DeepSeek MoE (the routing is the subclass's)."""

    @classmethod
    @abc.abstractmethod
    def _routing(cls, cfg: Any) -> C.MoeOptions:
        """The MoE routing of ``cfg`` (each version's scoring and top-k method)."""

    @classmethod
    def _rope_layout(cls, cfg: Any) -> str:
        return "interleaved"

    @classmethod
    def from_config(cls, cfg: Any, store: Mapping[str, Any] | None = None) -> "_DeepSeek":
        if cfg.source == "gguf":
            cfg = hf_view_of_gguf(cfg, cls.family)
        mla, rope = mla_options(cfg, cls.family, cls._rope_layout(cfg))
        extra = cfg.extra or {}
        return cls(C.decoder_options(cfg, cls.family, moe=cls._routing(cfg), mla=mla,
                                     num_kv_heads=cfg.num_heads, head_dim=mla.qk_head_dim,
                                     act=str(extra.get("hidden_act", "silu")), **rope))

    def weight_table(self) -> WeightTable:
        return {**_mla_weight_table(self.config), **deepseek_ffn_table(self.config)}


@REGISTRY.register
class DeepseekV2(_DeepSeek):
    """DeepSeek-V2 / V2-Lite: MLA; softmax-routed experts (greedy or group-limited)."""

    family: ClassVar[str] = "deepseek_v2"
    architectures: ClassVar[tuple[str, ...]] = ("DeepseekV2ForCausalLM",)

    @classmethod
    def _routing(cls, cfg: Any) -> C.MoeOptions:
        extra = cfg.extra or {}
        method = extra.get("topk_method") or "greedy"
        if method not in ("greedy", "group_limited_greedy"):
            raise ModelError(f"{cls.family}: topk_method {method!r} is not supported "
                             f"(supported: greedy, group_limited_greedy)")
        normalize = bool(extra.get("norm_topk_prob", False)) and cfg.experts_per_token > 1
        return deepseek_moe(cfg, cls.family, scoring="softmax", group_score="max",
                            score_bias=False, grouped=method == "group_limited_greedy",
                            normalize=normalize, scale=1.0 if normalize else None)


@REGISTRY.register
class DeepseekV3(_DeepSeek):
    """DeepSeek-V3: MLA; sigmoid-routed experts with the score-correction bias, groups."""

    family: ClassVar[str] = "deepseek_v3"
    architectures: ClassVar[tuple[str, ...]] = ("DeepseekV3ForCausalLM",)

    @classmethod
    def _routing(cls, cfg: Any) -> C.MoeOptions:
        extra = cfg.extra or {}
        scoring = extra.get("scoring_func") or "sigmoid"
        if scoring != "sigmoid":
            raise ModelError(f"{cls.family}: scoring_func {scoring!r} is not supported "
                             f"(DeepSeek-V3 routes by sigmoid)")
        return deepseek_moe(cfg, cls.family, scoring="sigmoid", group_score="top2_sum",
                            score_bias=True)

    @classmethod
    def _rope_layout(cls, cfg: Any) -> str:
        return "interleaved" if (cfg.extra or {}).get("rope_interleave", True) else "half"


@REGISTRY.register
class DeepseekGguf(_DeepSeek):
    """GGUF ``deepseek2`` (DeepSeek-V2, V2-Lite, V3 as llama.cpp converts them): MLA; the
    routing the metadata names (softmax as V2, sigmoid with the bias as V3)."""

    family: ClassVar[str] = "deepseek2"
    architectures: ClassVar[tuple[str, ...]] = ("deepseek2",)

    def bind(self, store: Mapping[str, Any], rename=None):
        """As every decoder binds, after refusing the older ``deepseek2`` layout: one
        ``attn_kv_b`` a layer where current llama.cpp converters write the absorbed form's
        ``attn_k_b`` / ``attn_v_b`` (ModelError saying to reconvert)."""
        if "blk.0.attn_kv_b.weight" in store and "blk.0.attn_k_b.weight" not in store:
            raise ModelError(f"{self.family}: this GGUF holds each layer's combined "
                             f"attn_kv_b (an older llama.cpp conversion); poot reads the "
                             f"split attn_k_b / attn_v_b that current convert_hf_to_gguf.py "
                             f"writes: reconvert the checkpoint")
        return super().bind(store, rename)

    @classmethod
    def _routing(cls, cfg: Any) -> C.MoeOptions:
        sigmoid = (cfg.extra or {}).get("scoring_func") == "sigmoid"
        return (DeepseekV3 if sigmoid else DeepseekV2)._routing(cfg)
