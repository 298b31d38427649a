"""Multi-head latent attention (MLA; DeepSeek-V2 §2.1, arXiv:2405.04434), as a composition
of primitives over the paged KV cache.

Per token, with ``H`` heads, latent rank ``R`` (``kv_lora_rank``), no-position part ``Dn``
(``qk_nope_head_dim``), rope part ``P`` (``qk_rope_head_dim``) and value width ``Dv``
(``v_head_dim``)::

    q        = q_b(rmsnorm(q_a(x)))  or  q(x)             [H, Dn + P]  (q LoRA or plain q)
    c, k_pe  = split(kv_a(x), [R, P]);  c = rmsnorm(c)    the latent and the rope key
    q_pe, k_pe rotated (RoPE over P channels; k_pe is one head every query head shares)
    k[h] = [W_UK[h] c, k_pe],  v[h] = W_UV[h] c            W_UK [H, Dn, R], W_UV [H, Dv, R]:
                                                            rows of kv_b [H * (Dn + Dv), R]

The KV cache holds what a position needs and nothing expanded: each layer has one pool,
``kv.{i}.latent`` [NB, bs, 1, R + P], a position's row being the normed ``c`` then the rotated
``k_pe``: ``R + P`` values a position a layer (:data:`POOL`), written once and read as both the
key (all ``R + P``) and the value (the first R).

Attention runs in the weight-absorbed form (the paper's §2.1.3; vLLM/SGLang's MLA decode):
``q_nope[h] . W_UK[h] c = (W_UK[h]^T q_nope[h]) . c``, so the queries are absorbed into the
latent space, ``q_lat[h] = q_nope[h] W_UK[h]`` [R], and attention is multi-query attention
(one KV head for all H query heads) with key ``[c, k_pe]`` (width ``R + P``: a split key, a
latent part and a rope part shared by every head) and value ``c`` (width R, narrower than the
key); each head's latent output ``o_lat[h]`` [R] leaves through ``W_UV[h]``:
``o[h] = W_UV[h] o_lat[h]`` [Dv]. That is :func:`poot.graph.ops.attention` with ``Hkv = 1``,
``D = R + P`` and, as values, the gathered keys' first R channels; the flash-attention rewrite
turns it into ``poot.paged_attention`` reading the one pool in place, as keys and, through a
slice of its channels, as values (no gathered copy). Prefill uses the same form (one
spelling; it costs ``(R + P) / (Dn + P)`` times the score FLOPs of expanded heads).

Equal to HF ``DeepseekV2Attention`` / ``DeepseekV3Attention`` (which expand K and V per
head) up to f32 summation order.
"""

from __future__ import annotations

from dataclasses import dataclass

from poot.dialects.types import PootType
from poot.graph import ops
from poot.graph.builder import Builder, Tensor
from poot.models.blocks import StepInputs, cached_kv, param, proj

#: The name of a layer's one pool (``kv.{i}.latent``): see :meth:`MlaOptions.pools`.
POOL = "latent"


@dataclass(frozen=True)
class MlaOptions:
    """The MLA shape of a decoder (HF ``DeepseekV2Config``/``DeepseekV3Config`` names).

    Attributes:
        q_lora_rank: the query's low rank (``q_a`` -> RMSNorm -> ``q_b``); 0: a plain ``q``
            projection (DeepSeek-V2-Lite).
        kv_lora_rank: R, the latent width (the cache's first pool).
        qk_nope_head_dim: Dn, the per-head key/query part without position.
        qk_rope_head_dim: P, the rotated part; the key's is one head shared by all heads.
        v_head_dim: Dv, the value head width (may be narrower than ``Dn + P``).
        scale: the softmax scale (``(Dn + P) ** -0.5``, times YaRN's ``mscale_all_dim``
            factor squared).
        rope_layout: :func:`poot.graph.ops.apply_rope`'s layout of the P channels
            (``interleaved``: DeepSeek's pairs ``(2i, 2i + 1)``).
    """

    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    scale: float
    rope_layout: str = "interleaved"

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def pools(self) -> tuple[tuple[str, int, int]]:
        """The layer's KV pools (name, heads, width): one, the latent and the rope key
        (1, R + P)."""
        return ((POOL, 1, self.kv_token_elems),)

    @property
    def kv_token_elems(self) -> int:
        """Cached values a position holds in one layer: ``R + P``."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    def weight_elems(self, hidden: int, heads: int) -> int:
        """Elements of one layer's attention weights (projections and norms)."""
        m = self
        q = (hidden * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * heads * m.qk_head_dim
             if m.q_lora_rank else hidden * heads * m.qk_head_dim)
        kv = (hidden * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank
              + m.kv_lora_rank * heads * (m.qk_nope_head_dim + m.v_head_dim))
        return q + kv + heads * m.v_head_dim * hidden

    def token_elems(self, heads: int) -> int:
        """f32 activations one token holds in one layer's attention (q, the absorbed query,
        its concatenation with q_pe, the latent output, the values) beyond a GQA layer's."""
        m, r = self, self.kv_lora_rank
        return 2 * (heads * m.qk_head_dim + 3 * heads * (r + m.qk_rope_head_dim)
                    + heads * m.v_head_dim + 2 * (r + m.qk_rope_head_dim))


def mla_attention(b: Builder, m: MlaOptions, num_heads: int, norm_eps: float,
                  types: dict[str, PootType], i: int, h: Tensor, rope: tuple[Tensor, Tensor],
                  inp: StepInputs) -> tuple[Tensor, tuple[Tensor] | None]:
    """Layer ``i``'s MLA (``m``; ``num_heads`` query heads, RMSNorms of epsilon ``norm_eps``)
    of h f32 [B, T, hidden] over its latent pool -> (f32 [B, T, hidden], the updated
    ``(latent,)`` pool); without caches (a pooled step) over the step's own positions ->
    (f32 [B, T, hidden], None).

    Roles (``blk.{i}.attn.``): ``q`` or ``q_a``/``q_a_norm``/``q_b``; ``kv_a`` [R + P,
    hidden], ``kv_a_norm`` [R], ``kv_b`` [H * (Dn + Dv), R] (HF; its rows split per head) or
    ``k_b`` [H, R, Dn] and ``v_b`` [H, Dv, R] (llama.cpp's split, ``W_UK`` stored
    transposed), ``o`` [hidden, H * Dv]; ``_bias`` roles where bound."""
    bsz, t, _ = h.shape
    n, nh = bsz * t, num_heads
    dn, dr, dv, r = m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim, m.kv_lora_rank
    p = f"blk.{i}.attn."
    norm = lambda role, y: ops.rmsnorm(b, y, param(b, types, role), norm_eps)  # noqa: E731
    with b.scope("q"):
        if m.q_lora_rank:
            q = proj(b, types, p + "q_b", norm(p + "q_a_norm", proj(b, types, p + "q_a", h)))
        else:
            q = proj(b, types, p + "q", h)
        q = b.reshape(q, (bsz, t, nh, dn + dr))
        q_nope, q_pe = b.slice_axis(q, 3, 0, dn), b.slice_axis(q, 3, dn, dn + dr)
        q_pe = ops.apply_rope(b, q_pe, *rope, layout=m.rope_layout)
    with b.scope("kv_a"):
        kv = proj(b, types, p + "kv_a", h)                                   # [B, T, R + P]
        latent = b.reshape(norm(p + "kv_a_norm", b.slice_axis(kv, 2, 0, r)), (bsz, t, 1, r))
        k_pe = b.reshape(b.slice_axis(kv, 2, r, r + dr), (bsz, t, 1, dr))
        k_pe = ops.apply_rope(b, k_pe, *rope, layout=m.rope_layout)
    with b.scope("absorb"):
        if p + "kv_b" in types:
            w = b.reshape(ops.as_f32(b, param(b, types, p + "kv_b")), (nh, dn + dv, r))
            w_uk, w_uv = b.slice_axis(w, 1, 0, dn), b.slice_axis(w, 1, dn, dn + dv)
        else:
            w_uk = b.transpose(ops.as_f32(b, param(b, types, p + "k_b")), (0, 2, 1))
            w_uv = ops.as_f32(b, param(b, types, p + "v_b"))
        qn = b.transpose(b.reshape(q_nope, (n, nh, dn)), (1, 0, 2))          # [H, N, Dn]
        q_lat = b.transpose(b.matmul(qn, w_uk), (1, 0, 2))                   # [N, H, R]
        q_full = b.concat([b.reshape(q_lat, (bsz, t, nh, r)), q_pe], axis=3)
    row = b.concat([latent, k_pe], axis=3)                                  # [B, T, 1, R + P]
    if inp.caches is None:      # a pooled step: the step's own keys, padding masked
        out = ops.attention(b, q_full, row, latent, q_pos=inp.positions, k_pos=inp.positions,
                            causal=True, scale=m.scale, mask=inp.mask)
        kv_out = None
    else:
        pool, keys = cached_kv(b, inp.caches[i][0], row, inp.kv_index, inp.block_table)
        out = ops.attention(b, q_full, keys, b.slice_axis(keys, 3, 0, r), q_pos=inp.positions,
                            causal=True, scale=m.scale)
        kv_out = (pool,)
    with b.scope("unabsorb"):                                                # out [B, T, H, R]
        o_lat = b.transpose(b.reshape(out, (n, nh, r)), (1, 0, 2))           # [H, N, R]
        heads = b.matmul(o_lat, b.transpose(w_uv, (0, 2, 1)))                # [H, N, Dv]
        heads = b.reshape(b.transpose(heads, (1, 0, 2)), (bsz, t, nh * dv))
    return proj(b, types, p + "o", heads, inp.lora_mask), kv_out
