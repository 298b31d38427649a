"""Sparse mixture-of-experts families: Mixtral, Qwen3-MoE and GLM-4.5 (GLM-4-MoE).

Pre-norm decoders traced by :func:`poot.models.components.trace_decoder` whose FFN is
:func:`poot.graph.ops.moe`: router ``linear(x, gate)`` -> softmax over all experts -> top-k
(ties to the lowest expert) -> optionally renormalized over the selection -> weighted sum of
SwiGLU experts (evaluated densely; a sparse lowering is the compiler's job).

* **Mixtral** (``MixtralForCausalLM``): Llama attention (optional sliding window on every
  layer), experts ``block_sparse_moe.experts.{e}.w1/w3/w2`` (gate/up/down) of width
  ``intermediate_size``, always renormalized. Mixtral GGUF files say ``llama`` and are not
  mapped here.
* **Qwen3-MoE** (``Qwen3MoeForCausalLM``, GGUF ``qwen3moe``): Qwen3 attention (per-head q/k
  RMSNorm), experts ``mlp.experts.{e}.gate_proj/up_proj/down_proj`` of width
  ``moe_intermediate_size``, renormalized iff ``norm_topk_prob`` (llama.cpp always
  renormalizes qwen3moe); layers in ``mlp_only_layers`` or off ``decoder_sparse_step`` keep
  a dense MLP. GGUF stores the experts stacked (``ffn_{gate,up,down}_exps``); those names are
  mapped but untested (no GGUF fixture).
* **GLM-4.5** (``Glm4MoeForCausalLM``): Llama-style GQA with q/k/v biases, partial rotary
  (``partial_rotary_factor``), optional q/k norms (``use_qk_norm``); DeepSeek-V3 routing:
  sigmoid scores, the ``e_score_correction_bias`` choosing (not weighing), ``n_group``
  groups of which ``topk_group`` stay eligible (each scored by its two best), renormalized
  when ``norm_topk_prob``, times ``routed_scaling_factor``; ``n_shared_experts`` shared
  experts as one gated MLP of width ``n_shared_experts * moe_intermediate_size``; the first
  ``first_k_dense_replace`` layers dense. GGUF ``glm4moe`` is not mapped (no fixture).

HF checkpoints store one tensor per expert; binding stacks them into one ``[E, ...]`` weight
per layer and projection (one host copy), so the MoE block reads the selected experts in
place (``poot.indexed_matmul``), as it reads GGUF's stacked ``ffn_*_exps``.
"""

from __future__ import annotations

import math

from typing import Any, ClassVar, Mapping

from poot.models import components as C
from poot.models.base import REGISTRY, ModelError, WeightName, WeightTable


def _check_moe(cfg: Any, family: str, expert_ffn: int | None) -> None:
    if cfg.num_experts <= 0 or not 1 <= cfg.experts_per_token <= cfg.num_experts:
        raise ModelError(f"{family}: needs num_experts > 0 and 1 <= experts per token <= "
                         f"num_experts, got {cfg.num_experts} / {cfg.experts_per_token}")
    if not expert_ffn:
        raise ModelError(f"{family}: the expert FFN width is missing")


def _moe_table(o: C.DecoderOptions, hf_router: str, hf_expert: dict[str, str],
               hf_dense: str = "model.layers.{i}.mlp.{r}_proj.weight") -> dict[str, WeightName]:
    """FFN roles per layer (concrete layer indices: MoE and dense layers may mix). HF names:
    ``hf_router`` and ``hf_expert[r]`` (with ``{i}``, ``{e}``); GGUF: router
    ``ffn_gate_inp``, stacked ``ffn_{r}_exps``."""
    t: dict[str, WeightName] = {}
    for i in range(o.num_layers):
        p = f"blk.{i}.ffn."
        if not o.is_moe(i):
            for r in ("gate", "up", "down"):
                t[p + r] = WeightName(hf_dense.format(i=i, r=r), f"blk.{i}.ffn_{r}.weight")
            continue
        t[p + "router"] = WeightName(hf_router.format(i=i), f"blk.{i}.ffn_gate_inp.weight")
        for r, name in hf_expert.items():
            if o.source == "gguf":
                t[p + f"exps.{r}"] = WeightName(None, f"blk.{i}.ffn_{r}_exps.weight")
            else:       # one tensor per expert, stacked at bind time
                t[p + f"exps.{r}"] = WeightName(name.format(i=i, e="{e}"), None,
                                                stack=o.moe.num_experts)
    return t


@REGISTRY.register
class Mixtral(C.DecoderModel):
    """Mixtral: Llama attention, top-k of E SwiGLU experts, renormalized."""

    family: ClassVar[str] = "mixtral"
    architectures: ClassVar[tuple[str, ...]] = ("MixtralForCausalLM",)

    @classmethod
    def from_config(cls, cfg: Any, store: Mapping[str, Any] | None = None) -> "Mixtral":
        if cfg.source != "hf":
            raise ModelError("mixtral: only HF checkpoints are mapped")
        _check_moe(cfg, cls.family, cfg.intermediate_size)
        moe = C.MoeOptions(cfg.num_experts, cfg.experts_per_token, normalize=True,
                           expert_ffn=cfg.intermediate_size)
        extra = cfg.extra or {}
        return cls(C.decoder_options(cfg, cls.family, moe=moe,
                                     act=str(extra.get("hidden_act", "silu")),
                                     layer_windows=C.layer_windows(cfg)))

    def weight_table(self) -> WeightTable:
        blk = "model.layers.{i}.block_sparse_moe."
        return {**C.decoder_weight_names(self.config),
                **_moe_table(self.config, blk + "gate.weight",
                             {"gate": blk + "experts.{e}.w1.weight",
                              "up": blk + "experts.{e}.w3.weight",
                              "down": blk + "experts.{e}.w2.weight"})}


@REGISTRY.register
class Qwen3Moe(C.DecoderModel):
    """Qwen3-MoE: Qwen3 attention, top-k of E SwiGLU experts (norm_topk_prob)."""

    family: ClassVar[str] = "qwen3_moe"
    architectures: ClassVar[tuple[str, ...]] = ("Qwen3MoeForCausalLM", "qwen3moe")

    @classmethod
    def from_config(cls, cfg: Any, store: Mapping[str, Any] | None = None) -> "Qwen3Moe":
        extra = cfg.extra or {}
        _check_moe(cfg, cls.family, cfg.moe_intermediate_size)
        step = int(extra.get("decoder_sparse_step", 1) or 1)
        only = {int(i) for i in extra.get("mlp_only_layers", None) or ()}
        dense = tuple(i for i in range(cfg.num_layers) if i in only or (i + 1) % step)
        normalize = True if cfg.source == "gguf" else bool(extra.get("norm_topk_prob", False))
        moe = C.MoeOptions(cfg.num_experts, cfg.experts_per_token, normalize=normalize,
                           expert_ffn=cfg.moe_intermediate_size, dense_layers=dense)
        return cls(C.decoder_options(cfg, cls.family, moe=moe, qk_norm=True,
                                     act=str(extra.get("hidden_act", "silu")),
                                     layer_windows=C.layer_windows(cfg)))

    def weight_table(self) -> WeightTable:
        blk = "model.layers.{i}.mlp."
        return {**C.decoder_weight_names(self.config, attn_bias=True),
                **_moe_table(self.config, blk + "gate.weight",
                             {r: blk + f"experts.{{e}}.{r}_proj.weight"
                              for r in ("gate", "up", "down")})}


def _positive_int(extra: Mapping[str, Any], key: str, default: int, family: str) -> int:
    v = extra.get(key, default)
    v = default if v is None else v
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ModelError(f"{family}: {key} must be a non-negative integer, found {v!r}")
    return v


def _group_count(extra: Mapping[str, Any], key: str, default: int, family: str) -> int:
    """``extra[key]`` as a group count: absent or null is ``default``, else an integer >= 1."""
    v = extra.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ModelError(f"{family}: {key} must be an integer >= 1, found {v!r}")
    return v


def deepseek_moe(cfg: Any, family: str, *, scoring: str, group_score: str, score_bias: bool,
                 grouped: bool = True, normalize: bool | None = None,
                 scale: float | None = None) -> C.MoeOptions:
    """DeepSeek-style :class:`~poot.models.components.MoeOptions` from the config's
    ``n_routed_experts``/``num_experts_per_tok``, ``n_group``/``topk_group`` (when
    ``grouped``), ``first_k_dense_replace``, ``n_shared_experts``, ``norm_topk_prob``
    (``normalize`` overrides) and ``routed_scaling_factor`` (``scale`` overrides). Raises
    ModelError naming a value of the wrong type or groups that leave too few experts."""
    extra = cfg.extra or {}
    _check_moe(cfg, family, cfg.moe_intermediate_size)
    groups = _group_count(extra, "n_group", 1, family) if grouped else 1
    topk_groups = _group_count(extra, "topk_group", groups, family) if grouped else 1
    if cfg.num_experts % groups:
        raise ModelError(f"{family}: n_group={groups} must divide the {cfg.num_experts} "
                         f"routed experts into equal groups")
    if topk_groups > groups:
        raise ModelError(f"{family}: topk_group={topk_groups} is more than the "
                         f"n_group={groups} groups")
    if topk_groups * (cfg.num_experts // groups) < cfg.experts_per_token:
        raise ModelError(f"{family}: n_group={groups} / topk_group={topk_groups} leave "
                         f"{topk_groups * (cfg.num_experts // groups)} of {cfg.num_experts} "
                         f"experts eligible, fewer than the {cfg.experts_per_token} a token "
                         f"chooses (num_experts_per_tok)")
    first_dense = _positive_int(extra, "first_k_dense_replace", 0, family)
    shared = _positive_int(extra, "n_shared_experts", 0, family)
    if scale is None:
        scale = extra.get("routed_scaling_factor", 1.0)
        scale = 1.0 if scale is None else scale
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or \
                not math.isfinite(scale) or scale <= 0:
            raise ModelError(f"{family}: routed_scaling_factor must be a positive finite "
                             f"number, found {scale!r}")
    if normalize is None:
        normalize = bool(extra.get("norm_topk_prob", True))
    return C.MoeOptions(cfg.num_experts, cfg.experts_per_token, normalize=normalize,
                        expert_ffn=cfg.moe_intermediate_size,
                        dense_layers=tuple(range(min(first_dense, cfg.num_layers))),
                        scoring=scoring, score_bias=score_bias, groups=groups,
                        topk_groups=topk_groups, group_score=group_score, scale=float(scale),
                        shared_ffn=shared * cfg.moe_intermediate_size)


def deepseek_ffn_table(o: C.DecoderOptions) -> dict[str, WeightName]:
    """FFN roles of a DeepSeek-style MoE decoder (HF ``model.layers.{i}.mlp.``): dense
    layers' ``{gate,up,down}_proj``; MoE layers' router ``gate.weight``, its
    ``gate.e_score_correction_bias`` when the routing has one, per-expert
    ``experts.{e}.{gate,up,down}_proj`` and ``shared_experts.{gate,up,down}_proj``; GGUF
    (llama.cpp's ``deepseek2``): ``ffn_gate_inp``, ``exp_probs_b.bias``, stacked
    ``ffn_{r}_exps`` and ``ffn_{r}_shexp``."""
    blk = "model.layers.{i}.mlp."
    t = _moe_table(o, blk + "gate.weight",
                   {r: blk + f"experts.{{e}}.{r}_proj.weight" for r in ("gate", "up", "down")})
    for i in range(o.num_layers):
        if not o.is_moe(i):
            continue
        p = f"blk.{i}.ffn."
        if o.moe.score_bias:
            t[p + "router_bias"] = WeightName(
                blk.format(i=i) + "gate.e_score_correction_bias", f"blk.{i}.exp_probs_b.bias")
        if o.moe.shared_ffn:
            for r in ("gate", "up", "down"):
                t[p + f"shexp.{r}"] = WeightName(
                    blk.format(i=i) + f"shared_experts.{r}_proj.weight",
                    f"blk.{i}.ffn_{r}_shexp.weight")
    return t


@REGISTRY.register
class Glm4Moe(C.DecoderModel):
    """GLM-4.5: GQA with biases and partial rotary; DeepSeek-V3-routed experts plus a shared
    expert; the first layers dense."""

    family: ClassVar[str] = "glm4_moe"
    architectures: ClassVar[tuple[str, ...]] = ("Glm4MoeForCausalLM",)

    @classmethod
    def from_config(cls, cfg: Any, store: Mapping[str, Any] | None = None) -> "Glm4Moe":
        if cfg.source != "hf":
            raise ModelError("glm4_moe: only HF checkpoints are mapped")
        extra = cfg.extra or {}
        moe = deepseek_moe(cfg, cls.family, scoring="sigmoid", group_score="top2_sum",
                           score_bias=True)
        return cls(C.decoder_options(cfg, cls.family, moe=moe,
                                     qk_norm=bool(extra.get("use_qk_norm", False)),
                                     act=str(extra.get("hidden_act", "silu"))))

    def weight_table(self) -> WeightTable:
        return {**C.decoder_weight_names(self.config, attn_bias=True),
                **deepseek_ffn_table(self.config)}
