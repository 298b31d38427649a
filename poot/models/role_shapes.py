"""The shape each shared-decoder role has under a config (HF ``nn.Linear`` layout
``[out_features, in_features]``): what :mod:`poot.models.random_init` makes random weights
of, and what a checkpoint's tensors are checked against when a family binds them
(:func:`check_bound_shapes`: a config and weights that disagree are refused before tracing).
"""

from __future__ import annotations

from typing import Any

from poot.models.base import ModelError


def role_shape(role: str, o: Any) -> tuple[int, ...]:
    """The HF shape of a shared-decoder ``role`` (``{i}`` already expanded; MoE routers, their
    score-correction biases, shared experts ``ffn.shexp.*`` and the stacked experts
    ``ffn.exps.{gate,up,down}`` included) for decoder options ``o``
    (:class:`~poot.models.components.DecoderOptions`; multi-head latent attention's
    projections when ``o.mla``); ModelError if none."""
    h, d = o.hidden_size, o.head_dim
    q, kv, ffn = o.num_heads * d, o.num_kv_heads * d, o.intermediate_size
    leaf = role.split(".", 2)[-1] if role.startswith("blk.") else role
    shapes = {"tok_embed": (o.vocab_size, h), "lm_head": (o.vocab_size, h), "out_norm": (h,),
              "attn_norm": (h,), "ffn_norm": (h,), "post_attn_norm": (h,),
              "post_ffn_norm": (h,), "attn.q": (q, h), "attn.k": (kv, h), "attn.v": (kv, h),
              "attn.o": (h, q), "attn.qkv": (q + 2 * kv, h), "attn.q_norm": (d,),
              "attn.k_norm": (d,), "ffn.gate": (ffn, h), "ffn.up": (ffn, h),
              "ffn.down": (h, ffn), "ffn.gate_up": (2 * ffn, h)}
    mla = getattr(o, "mla", None)
    if mla is not None:                       # multi-head latent attention's projections
        nh, ql, r = o.num_heads, mla.q_lora_rank, mla.kv_lora_rank
        shapes.update({"attn.q": (nh * mla.qk_head_dim, h), "attn.q_a": (ql, h),
                       "attn.q_a_norm": (ql,), "attn.q_b": (nh * mla.qk_head_dim, ql),
                       "attn.kv_a": (r + mla.qk_rope_head_dim, h), "attn.kv_a_norm": (r,),
                       "attn.kv_b": (nh * (mla.qk_nope_head_dim + mla.v_head_dim), r),
                       "attn.o": (h, nh * mla.v_head_dim)})
    moe = getattr(o, "moe", None)
    if moe is not None:                       # MoE layers: the router and each expert
        shapes["ffn.router"] = (moe.num_experts, h)
        shapes["ffn.router_bias"] = (moe.num_experts,)
        sf = moe.shared_ffn
        shapes.update({"ffn.shexp.gate": (sf, h), "ffn.shexp.up": (sf, h),
                       "ffn.shexp.down": (h, sf)})
        part = leaf.split(".")
        f = moe.expert_ffn
        if len(part) == 3 and part[:2] == ["ffn", "exps"] and part[2] in ("gate", "up", "down"):
            return (moe.num_experts,) + ((h, f) if part[2] == "down" else (f, h))
    if leaf not in shapes:
        raise ModelError(f"random weights: no shape rule for role {role!r} (random init "
                         f"covers the decoder and MoE roles)")
    return shapes[leaf]



def check_bound_shapes(binding: Any, o: Any, family: str) -> None:
    """Check every bound role of ``binding`` that :func:`role_shape` has a rule for against
    the shape the config implies (decoder options ``o``): a checkpoint whose tensors disagree
    with its config (an edited ``kv_lora_rank``, a wrong head count) is refused here, before
    tracing, instead of surfacing as a verifier error of some op deep in the step. Raises
    :class:`ModelError` naming the tensor, its shape and the config's."""
    for role, t in binding.types.items():
        try:
            want = role_shape(role, o)
        except ModelError:
            continue                              # (a role without a rule: not checked)
        got = tuple(int(d) for d in t.shape)
        if got != tuple(want):
            raise ModelError(f"{family}: checkpoint tensor {binding.stored.get(role, role)!r} "
                             f"has shape {list(got)}, but the config implies {list(want)} "
                             f"(role {role!r}): the config and the weights disagree")
