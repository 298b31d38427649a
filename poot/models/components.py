"""The shared pre-norm decoder: :class:`DecoderOptions`, its step tracer and weight names.

Families whose layers are "x += attn(norm(x)); x += ffn(norm(x))" with small variations
describe themselves with :class:`DecoderOptions` and a weight-name table over the roles below;
the tracer is family-neutral, built of :mod:`poot.models.blocks` (the step inputs, the paged KV
cache, projections, the output head).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Mapping, Sequence

import numpy as np

from poot.dialects.types import DType, PootType, TensorType
from poot.graph import ops
from poot.graph.builder import Builder, Graph, Tensor
from poot.models import pooling as P
from poot.models.base import (DecoderShape, ModelError, StepDims, StepSpec, WeightBinding,
                              WeightName, WeightTable, bind_weights, default_kv_dtype)
from poot.models.blocks import (StepInputs, cached_attention, finish_step, lora_row_mask, param,
                                proj, projs, step_inputs)
from poot.models.lora import COLUMN_SLOT
from poot.models.mla import MlaOptions, mla_attention
from poot import settings
from poot.models.role_shapes import check_bound_shapes


# --- a shared pre-norm decoder -----------------------------------------------------------------
#
# Families whose layers are "x += attn(norm(x)); x += ffn(norm(x))" with small variations
# (Llama/Mistral, Qwen2/3, Gemma 1/2, Phi-3, Mixtral, Qwen3-MoE) describe themselves with
# DecoderOptions and a weight-name table over the roles below; the tracer here is family-neutral.
#
# Roles: tok_embed, out_norm, lm_head (absent when tied); per layer blk.{i}.:
#   attn_norm, attn.q / attn.k / attn.v (or attn.qkv fused), attn.o, attn.{q,k,v,o}_bias
#   (optional), attn.q_norm / attn.k_norm (qk_norm), post_attn_norm (sandwich), ffn_norm,
#   ffn.gate / ffn.up (or ffn.gate_up fused), ffn.down, ffn.{gate,up,down}_bias (optional),
#   post_ffn_norm (sandwich);
#   MoE layers: ffn.router [E, H] (ffn.router_bias [E]: a score-correction bias), stacked
#   ffn.exps.gate/up [E, F, H] and ffn.exps.down [E, H, F] (HF's per-expert tensors stacked
#   at bind), ffn.shexp.gate/up/down (shared experts).

@dataclass(frozen=True)
class MoeOptions:
    """Sparse MoE FFN: ``num_experts`` gated experts of width ``expert_ffn``, top ``top_k``
    by router score (``scoring``: softmax or sigmoid), renormalized over the selection when
    ``normalize``; ``dense_layers`` keep a dense MLP (width ``intermediate_size``).

    DeepSeek-style routing (:func:`poot.graph.ops.topk_routing`): ``score_bias`` (the
    router's ``router_bias`` weight, ``e_score_correction_bias``, picks but never weighs),
    ``groups`` / ``topk_groups`` / ``group_score`` (group-limited choice), ``scale``
    (``routed_scaling_factor``); ``shared_ffn``: the width of the shared experts' gated MLP
    that every token also goes through (0: none); ``spelling``: :func:`moe_spelling`."""

    num_experts: int
    top_k: int
    normalize: bool
    expert_ffn: int
    dense_layers: tuple[int, ...] = ()
    scoring: str = "softmax"
    score_bias: bool = False
    groups: int = 1
    topk_groups: int | None = None
    group_score: str = "top2_sum"
    scale: float = 1.0
    shared_ffn: int = 0
    spelling: str = field(default_factory=lambda: moe_spelling())


def moe_spelling() -> str:
    """How MoE blocks are traced (:func:`poot.graph.ops.moe`'s ``sparse``): ``auto`` (by
    shape), or ``dense`` / ``sparse`` from ``POOT_MOE`` (to compare the two spellings; part
    of the options, so of every compile-cache key). Raises ModelError for another value."""
    v = settings.get_str("POOT_MOE")
    if v not in ("auto", "dense", "sparse"):
        raise ModelError(f"POOT_MOE must be 'auto', 'dense' or 'sparse', got {v!r}")
    return v


@dataclass(frozen=True)
class DecoderOptions(DecoderShape):
    """A pre-norm decoder's shape and per-family variations (see the roles above).

    Attributes (beside the :class:`~poot.models.base.DecoderShape`):
        source: ``"hf"`` or ``"gguf"`` (which weight names the family's table uses).
        norm_eps, norm_unit_offset: RMSNorm epsilon; scale by ``(1 + w)`` (Gemma, HF).
        inv_freq: RoPE inverse frequencies (``R/2`` values; ``R < head_dim`` is partial
            rotary); rope_attention_scaling multiplies cos/sin (yarn); rope_layout as
            :func:`poot.graph.ops.apply_rope`. sliding_inv_freq,
            sliding_rope_attention_scaling: the same for the sliding-window layers where
            they rotate apart (Gemma 3's local base), else None (every layer uses inv_freq).
        embed_scale: multiplies the embeddings (Gemma: ``sqrt(hidden)``), or None.
        qk_norm: per-head RMSNorm of q and k before RoPE (Qwen3).
        fused_qkv, fused_gate_up: Phi-3 style stacked projections (rows q|k|v, gate|up).
        sandwich_norms: post-attention and post-FFN norms on the branch outputs (Gemma 2).
        act: the GLU activation. attn_scale, attn_softcap, final_softcap: as
            :func:`poot.graph.ops.attention` / :func:`~poot.models.blocks.finish_step`.
        layer_windows: per layer sliding window or None (empty: no sliding window).
        moe: :class:`MoeOptions` or None (dense).
        mla: :class:`~poot.models.mla.MlaOptions` (multi-head latent attention: every
            layer's attention, and its KV pools, are MLA's; ``num_kv_heads`` and
            ``head_dim`` are then unused) or None (GQA).
    """

    norm_eps: float
    inv_freq: tuple[float, ...]
    tie_word_embeddings: bool
    source: str = "hf"
    rope_attention_scaling: float = 1.0
    rope_layout: str = "half"
    norm_unit_offset: bool = False
    embed_scale: float | None = None
    qk_norm: bool = False
    fused_qkv: bool = False
    fused_gate_up: bool = False
    sandwich_norms: bool = False
    act: str = "silu"
    attn_scale: float | None = None
    attn_softcap: float | None = None
    final_softcap: float | None = None
    layer_windows: tuple[int | None, ...] = ()
    moe: MoeOptions | None = None
    sliding_inv_freq: tuple[float, ...] | None = None
    sliding_rope_attention_scaling: float = 1.0
    mla: MlaOptions | None = None

    def window(self, i: int) -> int | None:
        return self.layer_windows[i] if self.layer_windows else None

    def is_moe(self, i: int) -> bool:
        return self.moe is not None and i not in self.moe.dense_layers


def ops_rope_scaling(cfg: Any, family: str, rs: Any = None) -> ops.RopeScaling:
    """The loader's :class:`~poot.load.config.RopeScaling` (``rs``, else the config's
    ``rope_scaling``) as :class:`ops.RopeScaling`; kinds ops cannot compute (dynamic,
    longrope) raise ModelError naming ``family``."""
    rs = cfg.rope_scaling if rs is None else rs
    if rs.kind == "none":
        return ops.RopeScaling()
    if rs.kind not in ("linear", "llama3", "yarn"):
        raise ModelError(f"{family}: rope scaling {rs.kind!r} is not supported (supported: "
                         f"none, linear, llama3, yarn)")
    d = ops.RopeScaling()
    pick = lambda v, dflt: dflt if v is None else v  # noqa: E731
    return ops.RopeScaling(
        kind=rs.kind, factor=float(rs.factor),
        low_freq_factor=pick(rs.low_freq_factor, d.low_freq_factor),
        high_freq_factor=pick(rs.high_freq_factor, d.high_freq_factor),
        original_max_position=pick(rs.original_max_position_embeddings,
                                   cfg.max_position_embeddings),
        beta_fast=pick(rs.beta_fast, d.beta_fast), beta_slow=pick(rs.beta_slow, d.beta_slow),
        mscale=pick(rs.mscale, 0.0), mscale_all_dim=pick(rs.mscale_all_dim, 0.0),
        attention_factor=rs.attn_factor)


def rope_inv_freq(head_dim: int, theta: float, scaling: ops.RopeScaling | None = None,
                  rotary_dim: int | None = None,
                  freq_factors: Sequence[float] | None = None) -> np.ndarray:
    """:func:`poot.graph.ops.rope_inv_freq`, then each inverse frequency divided by its
    ``freq_factors`` entry when given (GGUF ``rope_freqs.weight``, llama.cpp's spelling of
    llama3 scaling; divided in f64, rounded to f32)."""
    inv = ops.rope_inv_freq(head_dim, theta, scaling, rotary_dim=rotary_dim)
    if freq_factors is not None:
        ff = np.asarray(freq_factors, dtype=np.float64)
        inv = (inv.astype(np.float64) / ff).astype(np.float32)
    return inv


def decoder_options(cfg: Any, family: str, **overrides: Any) -> DecoderOptions:
    """:class:`DecoderOptions` from a :class:`~poot.load.config.ModelConfig`: shape, eps,
    RoPE (scaling and ``partial_rotary_factor``; the sliding-window layers' own where the
    config gives it), tying and source; ``overrides`` set the
    family's variations. Raises ModelError for heads that do not group."""
    if cfg.num_kv_heads <= 0 or cfg.num_heads % cfg.num_kv_heads:
        raise ModelError(f"{family}: {cfg.num_heads} heads do not group over "
                         f"{cfg.num_kv_heads} KV heads")
    extra = cfg.extra or {}
    rp = extra.get("rope_parameters") if isinstance(extra.get("rope_parameters"), dict) else {}
    partial = float(rp.get("partial_rotary_factor", extra.get("partial_rotary_factor", 1.0)))
    scaling = ops_rope_scaling(cfg, family)
    inv = rope_inv_freq(cfg.head_dim, cfg.rope_theta, scaling,
                        rotary_dim=int(cfg.head_dim * partial))
    opts = dict(**DecoderShape.of(cfg), norm_eps=float(cfg.rms_norm_eps),
                inv_freq=tuple(float(x) for x in inv),
                rope_attention_scaling=ops.rope_attention_scaling(scaling),
                tie_word_embeddings=cfg.tie_word_embeddings, source=cfg.source)
    local_theta = getattr(cfg, "sliding_rope_theta", None)
    if local_theta is not None:
        local = ops_rope_scaling(cfg, family, cfg.sliding_rope_scaling)
        opts.update(sliding_inv_freq=tuple(float(x) for x in rope_inv_freq(
                        cfg.head_dim, local_theta, local, rotary_dim=int(cfg.head_dim * partial))),
                    sliding_rope_attention_scaling=ops.rope_attention_scaling(local))
    opts.update(overrides)
    return DecoderOptions(**opts)


def layer_windows(cfg: Any, default_sliding: Callable[[int], bool] | None = None
                  ) -> tuple[int | None, ...]:
    """Per-layer sliding windows: ``cfg.sliding_window`` on the layers HF ``layer_types``
    marks ``sliding_attention`` (else on the layers ``default_sliding(i)`` picks, else on
    every layer); empty when there is no window."""
    w = cfg.sliding_window
    if not w:
        return ()
    types = (cfg.extra or {}).get("layer_types")
    if isinstance(types, list) and len(types) == cfg.num_layers:
        return tuple(w if t == "sliding_attention" else None for t in types)
    pick = default_sliding or (lambda i: True)
    return tuple(w if pick(i) else None for i in range(cfg.num_layers))


def decoder_dims(o: DecoderOptions) -> StepDims:
    """:class:`StepDims` for a decoder. MoE experts are counted as the graph computes them:
    every expert on every token (``E * (4 * f + 2 * h)`` activations a token), and every
    expert weight five times (the param, and the reshape, concat, transpose and cast results
    of stacking HF's per-expert tensors in the graph). Traced MoE steps measured at most 0.55
    of the resulting bound (test/models/test_trace_limits.py's sweep)."""
    qkv_o = o.hidden_size * o.head_dim * (2 * o.num_heads + 2 * o.num_kv_heads)
    ffn = 3 * o.hidden_size * o.intermediate_size
    moe_tokens = 0
    m = o.moe
    if m is not None:
        e, f, h = m.num_experts, m.expert_ffn, o.hidden_size
        ffn = max(ffn, 5 * e * (3 * h * f) + e * h + 3 * h * m.shared_ffn)
        moe_tokens = e * (4 * f + 2 * h) + 4 * e + 4 * m.shared_ffn
    head = 0 if o.tie_word_embeddings else o.vocab_size * o.hidden_size
    ffn_width = max(o.intermediate_size, m.num_experts * m.expert_ffn + m.shared_ffn if m else 0)
    # routing: ~24 ops a top-k round (experts, then the two best of each group and the
    # best groups when group-limited)
    rounds = (m.top_k + (2 + (m.topk_groups or m.groups) if m.groups > 1 else 0)) if m else 0
    ops_per_layer = 320 + (40 * m.num_experts + 24 * rounds + 60 if m else 0)
    kv_heads, head_dim, kv_elems = o.num_kv_heads, o.head_dim, None
    if o.mla is not None:   # one KV head of the absorbed width R + P; the pools hold R + P
        a = o.mla
        qkv_o = a.weight_elems(o.hidden_size, o.num_heads)
        kv_heads, kv_elems = 1, a.kv_token_elems
        head_dim = max(a.qk_head_dim, a.kv_token_elems)
        moe_tokens += a.token_elems(o.num_heads)
        ops_per_layer += 60
    return StepDims(o.num_layers, o.hidden_size, ffn_width, o.vocab_size, o.num_heads,
                    kv_heads, head_dim, ops_per_layer=ops_per_layer,
                    token_elems_per_layer=moe_tokens, kv_elems_per_token=kv_elems,
                    n_weight_elems=o.vocab_size * o.hidden_size + head
                    + o.num_layers * (qkv_o + ffn + 6 * o.hidden_size + 2 * o.head_dim)
                    + o.hidden_size)


def trace_decoder(o: DecoderOptions, spec: StepSpec, weight_types: Mapping[str, PootType],
                  name: str) -> Graph:
    """The step graph (interface in :mod:`poot.models.base`) of the decoder ``o``."""
    b = Builder(spec.limits(decoder_dims(o)), name=f"{name}_{spec.kind}")
    types = dict(weight_types)
    inp = step_inputs(b, spec, o.num_layers, o.num_kv_heads, o.head_dim,
                      default_kv_dtype(weight_types),
                      pools=o.mla.pools() if o.mla is not None else None)
    if COLUMN_SLOT in types:                           # LoRA slots bound: per-row slot input
        inp.lora_mask = lora_row_mask(
            b, types, b.input("lora_index", TensorType((spec.batch,), DType.I32)))
    h, caches = decoder_body(b, o, types, inp)
    head = None
    if spec.outputs == "logits":
        head = param(b, types, "tok_embed" if o.tie_word_embeddings else "lm_head")
    return finish_step(b, spec, h, head, caches, final_softcap=o.final_softcap,
                       cache_names=inp.cache_names)


def trace_decoder_pooled(o: DecoderOptions, spec: Any, weight_types: Mapping[str, PootType],
                         name: str) -> Graph:
    """The pooled step (:class:`poot.models.pooling.PoolSpec`: no KV cache, rows
    right-padded) of the decoder ``o``: ``embeddings``, the final-normed hidden states pooled;
    or ``scores`` f32 [B, L], the role ``score`` [L, H] applied to each row's last token (HF
    ``...ForSequenceClassification``; a yes/no reranker's head is made at bind:
    :meth:`DecoderModel.bind_headless`). ModelError: scores without a ``score`` weight."""
    types = dict(weight_types)
    if spec.outputs == "scores" and "score" not in types:
        raise ModelError(f"{name}: no classification head (a ...ForSequenceClassification "
                         f"checkpoint's score.weight, or classifier tokens) for scores")
    b = Builder(P.pool_limits(spec, decoder_dims(o)), name=f"{name}_pooled")
    pin = P.pool_inputs(b, spec)
    with b.scope("mask"):
        mask = P.key_mask(b, pin.lengths, spec.tokens)
    inp = StepInputs(pin.tokens, pin.positions, None, None, None, mask)
    h, _ = decoder_body(b, o, types, inp)
    if spec.outputs == "embeddings":
        return P.finish_pooled(b, spec, h, pin.lengths)
    with b.scope("score"):     # HF ...ForSequenceClassification: the last token's logits
        last = P.pool(b, h, pin.lengths, "last", False)
        return b.finish({"scores": ops.linear(b, last, param(b, types, "score"))})


def decoder_body(b: Builder, o: DecoderOptions, types: dict[str, PootType], inp: StepInputs
                 ) -> tuple[Tensor, list[tuple[Tensor, ...]]]:
    """Embedding, every layer and the final norm of the decoder ``o`` over ``inp``:
    (final-normed hidden f32 [B, T, H], the updated caches per layer; empty without
    caches)."""
    with b.scope("embed"):
        x = ops.embedding(b, param(b, types, "tok_embed"), inp.tokens)
        if o.embed_scale is not None:
            x = x * float(o.embed_scale)
    with b.scope("rope"):
        rope = ops.rope_cos_sin(b, inp.positions, np.asarray(o.inv_freq, np.float32),
                                o.rope_attention_scaling)
    local_rope = rope
    if o.sliding_inv_freq is not None and any(o.window(i) for i in range(o.num_layers)):
        with b.scope("rope_sliding"):
            local_rope = ops.rope_cos_sin(b, inp.positions,
                                          np.asarray(o.sliding_inv_freq, np.float32),
                                          o.sliding_rope_attention_scaling)
    norm = lambda role, y: ops.rmsnorm(b, y, param(b, types, role), o.norm_eps,  # noqa: E731
                                       unit_offset=o.norm_unit_offset)
    caches = []
    for i in range(o.num_layers):
        p = f"blk.{i}."
        with b.scope(f"blk.{i}"):
            with b.scope("attn"):
                a, kv = decoder_attention(b, o, types, i, norm(p + "attn_norm", x),
                                          local_rope if o.window(i) else rope, inp)
                if o.sandwich_norms:
                    a = norm(p + "post_attn_norm", a)
            x = x + a
            with b.scope("ffn"):
                f = decoder_ffn(b, o, types, i, norm(p + "ffn_norm", x), inp.lora_mask)
                if o.sandwich_norms:
                    f = norm(p + "post_ffn_norm", f)
            x = x + f
        if kv is not None:
            caches.append(kv)
    with b.scope("out_norm"):
        h = norm("out_norm", x)
    return h, caches


def decoder_attention(b: Builder, o: DecoderOptions, types: dict[str, PootType], i: int,
                      h: Tensor, rope: tuple[Tensor, Tensor], inp: StepInputs
                      ) -> tuple[Tensor, tuple[Tensor, ...]]:
    """Layer ``i``'s GQA self-attention of h f32 [B, T, H] over its cache -> (f32 [B, T, H],
    updated (k, v) caches); without caches (a pooled step) over the step's own keys ->
    (f32 [B, T, H], None)."""
    if o.mla is not None:
        return mla_attention(b, o.mla, o.num_heads, o.norm_eps, types, i, h, rope, inp)
    bsz, t, _ = h.shape
    p, d = f"blk.{i}.attn.", o.head_dim
    nq, nkv = o.num_heads * d, o.num_kv_heads * d
    if o.fused_qkv:
        qkv = proj(b, types, p + "qkv", h)
        q, k, v = (b.slice_axis(qkv, 2, s, e) for s, e in
                   ((0, nq), (nq, nq + nkv), (nq + nkv, nq + 2 * nkv)))
    else:
        q, k, v = projs(b, types, [p + r for r in ("q", "k", "v")], h, inp.lora_mask)
    q = b.reshape(q, (bsz, t, o.num_heads, d))
    k = b.reshape(k, (bsz, t, o.num_kv_heads, d))
    v = b.reshape(v, (bsz, t, o.num_kv_heads, d))
    if o.qk_norm:
        q = ops.rmsnorm(b, q, param(b, types, p + "q_norm"), o.norm_eps,
                        unit_offset=o.norm_unit_offset)
        k = ops.rmsnorm(b, k, param(b, types, p + "k_norm"), o.norm_eps,
                        unit_offset=o.norm_unit_offset)
    q = ops.apply_rope(b, q, *rope, layout=o.rope_layout)
    k = ops.apply_rope(b, k, *rope, layout=o.rope_layout)
    if inp.caches is None:      # a pooled step: the step's own keys, padding masked
        out = ops.attention(b, q, k, v, q_pos=inp.positions, k_pos=inp.positions,
                            causal=True, sliding_window=o.window(i), softcap=o.attn_softcap,
                            scale=o.attn_scale, mask=inp.mask)
        kv = None
    else:
        out, k_cache, v_cache = cached_attention(b, q, k, v, inp.caches[i], inp,
                                                 sliding_window=o.window(i),
                                                 softcap=o.attn_softcap, scale=o.attn_scale)
        kv = (k_cache, v_cache)
    out = b.reshape(out, (bsz, t, nq))
    return proj(b, types, p + "o", out, inp.lora_mask), kv


def decoder_ffn(b: Builder, o: DecoderOptions, types: dict[str, PootType], i: int,
                h: Tensor, lora_mask: Tensor | None = None) -> Tensor:
    """Layer ``i``'s FFN on h f32 [B, T, H]: gated MLP (separate or fused gate|up, optional
    biases, LoRA terms when ``lora_mask`` is given) or, on MoE layers,
    :func:`poot.graph.ops.moe` over the layer's experts."""
    p = f"blk.{i}.ffn."
    if o.is_moe(i):
        m = o.moe
        # stacked [E, F, H] / [E, H, F] (GGUF's as stored, HF's per-expert ones at bind)
        gate, up, down = (param(b, types, p + f"exps.{r}") for r in ("gate", "up", "down"))
        y = ops.moe(b, h, param(b, types, p + "router"), gate, up, down, m.top_k,
                    m.normalize, act=o.act, scoring=m.scoring,
                    bias=param(b, types, p + "router_bias") if m.score_bias else None,
                    groups=m.groups, topk_groups=m.topk_groups, group_score=m.group_score,
                    scale=m.scale, sparse={"auto": None, "dense": False,
                                           "sparse": True}[m.spelling])
        if m.shared_ffn:
            y = y + ops.mlp_glu(b, h, *(param(b, types, p + f"shexp.{r}")
                                        for r in ("gate", "up", "down")), act=o.act)
        return y
    if o.fused_gate_up:
        gu = proj(b, types, p + "gate_up", h)
        f = gu.shape[-1] // 2
        gate, up = b.slice_axis(gu, gu.rank - 1, 0, f), b.slice_axis(gu, gu.rank - 1, f, 2 * f)
        return proj(b, types, p + "down", ops.activation(b, gate, o.act) * up)
    lora = lora_mask is not None and any(f"lora.{p}{r}.b" in types
                                          for r in ("gate", "up", "down"))
    if not lora and not any(p + f"{r}_bias" in types for r in ("gate", "up", "down")):
        return ops.mlp_glu(b, h, param(b, types, p + "gate"), param(b, types, p + "up"),
                           param(b, types, p + "down"), act=o.act)
    gate, up = projs(b, types, [p + "gate", p + "up"], h, lora_mask)
    return proj(b, types, p + "down", ops.activation(b, gate, o.act) * up, lora_mask)


class DecoderModel(abc.ABC):
    """Base of the families traced by :func:`trace_decoder`: ``config`` is their
    :class:`DecoderOptions` (or a family config whose :meth:`options` gives them); a subclass
    sets ``family``/``architectures`` and supplies ``from_config`` and ``weight_table``."""

    family: ClassVar[str] = "decoder"
    architectures: ClassVar[tuple[str, ...]] = ()

    def __init__(self, config: DecoderOptions):
        self.config = config

    def options(self) -> DecoderOptions:
        """The traced decoder: ``config`` itself; a family keeping its own config type
        overrides this to derive them."""
        return self.config

    @abc.abstractmethod
    def weight_table(self) -> WeightTable:
        """Role name -> stored names (HF and GGUF) for this family."""

    def bind(self, store: Mapping[str, Any],
             rename: Callable[[str, Any], Any] | None = None) -> WeightBinding:
        """Bind every role from ``store`` (packed stays packed; ``rename`` as
        :func:`~poot.models.base.bind_weights`). Raises ModelError naming a missing tensor."""
        o = self.options()
        out = bind_weights(self.weight_table(), store, o.source, o.num_layers, rename)
        check_bound_shapes(out, o, self.family)
        return out

    def dims(self) -> StepDims:
        return decoder_dims(self.options())

    def trace(self, spec: StepSpec, weight_types: Mapping[str, PootType]) -> Graph:
        return trace_decoder(self.options(), spec, weight_types, self.family)

    def trace_pooled(self, spec: Any, weight_types: Mapping[str, PootType]) -> Graph:
        """The pooled embedding step (:func:`trace_decoder_pooled`)."""
        return trace_decoder_pooled(self.options(), spec, weight_types, self.family)

    def bind_headless(self, store: Mapping[str, Any]) -> WeightBinding:
        """Bind every role a pooled step reads (no ``lm_head``) from ``store``, whose names
        may lack the ``model.`` prefix (a checkpoint saved from the bare ``...Model``
        class, as Qwen3-Embedding and gte-Qwen2 are). Raises ModelError naming a missing
        tensor."""
        o = self.options()
        table = {r: w for r, w in self.weight_table().items() if r != "lm_head"}
        if o.source == "hf" and "model.embed_tokens.weight" not in store \
                and "embed_tokens.weight" in store:
            table = {r: WeightName(w.hf.removeprefix("model.") if w.hf else w.hf, w.gguf,
                                   w.optional) for r, w in table.items()}
        out = bind_weights(table, store, o.source, o.num_layers)
        check_bound_shapes(out, o, self.family)
        if o.source == "hf" and "score.weight" in store:   # ...ForSequenceClassification
            out.add("score", store["score.weight"])
        return out

    def bind_token_classifier(self, store: Mapping[str, Any], weights: WeightBinding,
                              tokens: Sequence[int]) -> None:
        """Add role ``score`` f32 [1, H] to ``weights``: for ``tokens = (no, yes)``, the LM
        head's row of ``yes`` minus that of ``no``, so ``sigmoid(score) = softmax(yes, no)``
        of the last token (a Qwen3-Reranker-style yes/no reranker; vLLM's
        ``classifier_from_token`` conversion). Raises ModelError for another number of
        tokens, an id outside the vocabulary or a quantized head."""
        o = self.options()
        if len(tokens) != 2:
            raise ModelError(f"{self.family}: classifier tokens must be two ids (no, yes), "
                             f"got {list(tokens)}")
        head = None
        for role in ("lm_head", "tok_embed"):
            name = self.weight_table().get(role)
            n = name.stored(o.source) if name is not None else None
            for cand in ((n, n.removeprefix("model.")) if n else ()):
                if cand in store:
                    head = store[cand]
                    break
            if head is not None:
                break
        if head is None:
            raise ModelError(f"{self.family}: no LM head or embedding table to build the "
                             f"yes/no classifier from")
        if head.quant is not None:
            raise ModelError(f"{self.family}: a quantized LM head cannot give classifier "
                             f"rows")
        rows = np.asarray(head.data, dtype=np.float32)
        for t in tokens:
            if not 0 <= int(t) < rows.shape[0]:
                raise ModelError(f"{self.family}: classifier token id {t} is outside the "
                                 f"vocabulary [0, {rows.shape[0]})")
        w = (rows[int(tokens[1])] - rows[int(tokens[0])])[None, :].astype(np.float32)

        weights.arrays["score"], weights.types["score"] = w, TensorType(w.shape, DType.F32)
        weights.stored["score"] = f"{head.name}[{tokens[1]}] - [{tokens[0]}]"


def decoder_weight_names(o: DecoderOptions, attn_bias: bool = False) -> dict[str, WeightName]:
    """The role -> name entries most decoders share (HF ``model.layers.{i}.`` / GGUF
    ``blk.{i}.`` naming): embedding, norms, separate q/k/v/o (biases optional when
    ``attn_bias``), qk-norm weights when ``o.qk_norm``, the head unless tied. Families add
    their FFN roles and any differences."""
    hb = "model.layers.{i}."
    t = {"tok_embed": WeightName("model.embed_tokens.weight", "token_embd.weight"),
         "out_norm": WeightName("model.norm.weight", "output_norm.weight"),
         "blk.{i}.attn_norm": WeightName(hb + "input_layernorm.weight",
                                         "blk.{i}.attn_norm.weight"),
         "blk.{i}.ffn_norm": WeightName(hb + "post_attention_layernorm.weight",
                                        "blk.{i}.ffn_norm.weight")}
    for r, g in (("q", "q"), ("k", "k"), ("v", "v"), ("o", "output")):
        t[f"blk.{{i}}.attn.{r}"] = WeightName(hb + f"self_attn.{r}_proj.weight",
                                              f"blk.{{i}}.attn_{g}.weight")
        if attn_bias:
            t[f"blk.{{i}}.attn.{r}_bias"] = WeightName(hb + f"self_attn.{r}_proj.bias",
                                                       f"blk.{{i}}.attn_{g}.bias", True)
    if o.qk_norm:
        for r in ("q", "k"):
            t[f"blk.{{i}}.attn.{r}_norm"] = WeightName(hb + f"self_attn.{r}_norm.weight",
                                                       f"blk.{{i}}.attn_{r}_norm.weight")
    if not o.tie_word_embeddings:
        t["lm_head"] = WeightName("lm_head.weight", "output.weight")
    return t


def dense_ffn_names(bias: bool = False) -> dict[str, WeightName]:
    """HF ``mlp.{gate,up,down}_proj`` / GGUF ``ffn_{gate,up,down}`` roles (with optional
    ``_bias`` roles when ``bias``)."""
    t = {f"blk.{{i}}.ffn.{r}": WeightName(f"model.layers.{{i}}.mlp.{r}_proj.weight",
                                          f"blk.{{i}}.ffn_{r}.weight")
         for r in ("gate", "up", "down")}
    if bias:
        t.update({f"blk.{{i}}.ffn.{r}_bias": WeightName(f"model.layers.{{i}}.mlp.{r}_proj.bias",
                                                        f"blk.{{i}}.ffn_{r}.bias", True)
                  for r in ("gate", "up", "down")})
    return t
