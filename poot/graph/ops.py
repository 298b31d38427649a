"""Compositions over poot primitives: linear, embedding, norms, RoPE, activations, attention, MoE.

Every function takes the :class:`~poot.graph.builder.Builder` first and records only primitive
ops (elementwise, compare/select, cast, reduce, matmul, gather, dequantize, broadcast and views).
None of them adds an op to the dialect: attention, norms, RoPE and MoE routing are spelled here,
once, and the compiler's passes (RoPE fusion, the flash-attention rewrite, pointwise/reduction
fusion) recognise them by their semantics.

Conventions (shared by every function here):

* Compute is f32. Half-precision (f16/bf16) inputs and weights are cast to f32 first; results
  are f32 unless stated otherwise.
* Packed weights (``!poot.packed``) are decoded with ``poot.dequantize`` to f32 where they are
  used; a lowering fuses the decode into the consuming matmul/gather.
* Shapes follow HF transformers: activations ``[..., features]``, linear weights ``[N, K]``
  (out, in: HF ``nn.Linear`` / GGUF row layout), attention tensors ``[B, T, H, D]``.
* Shape or dtype errors are :class:`~poot.graph.builder.BuilderError` naming the function and
  the offending shapes, raised before any op of the composition is created where possible.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from poot.dialects.types import DType, PackedType, TensorType
from poot.graph.builder import Builder, BuilderError, Tensor

__all__ = [
    "as_f32", "linear", "embedding", "rmsnorm", "layernorm",
    "RopeScaling", "rope_inv_freq", "rope_attention_scaling", "rope_cos_sin", "apply_rope",
    "softmax", "masked_softmax", "relu", "sigmoid", "silu", "gelu_tanh", "gelu_erf",
    "activation", "swiglu", "geglu", "mlp_glu", "mlp",
    "MASKED_SCORE", "attention",
    "topk_mask", "topk_routing", "moe",
]

#: The score a masked attention/routing entry takes before the softmax: finite, so that no
#: ``inf - inf`` can appear, and far below any real score.
MASKED_SCORE = -1e30


def _fail(fn: str, problem: str):
    raise BuilderError(f"ops.{fn}: {problem}")


# ---------------------------------------------------------------------------------------------
# dense / packed projections
# ---------------------------------------------------------------------------------------------
def as_f32(b: Builder, x: Tensor) -> Tensor:
    """``x`` as a dense f32 tensor: packed -> ``dequantize`` (f32); f16/bf16/int -> ``cast``;
    f32 unchanged."""
    raise NotImplementedError


def linear(b: Builder, x: Tensor, w: Tensor, bias: Tensor | None = None) -> Tensor:
    """``y = x @ w^T + bias`` (HF ``nn.Linear``; GGUF/ggml rows).

    Args:
        x: ``[..., K]`` float (f32/f16/bf16).
        w: ``[N, K]`` dense float or packed (dequantized to f32 first).
        bias: optional ``[N]`` float.
    Returns:
        ``[..., N]`` f32. Spelled as reshape x to ``[M, K]``, ``matmul(x, transpose(w))``
        (f32 accumulation), reshape back, add bias.
    """
    raise NotImplementedError


def embedding(b: Builder, table: Tensor, ids: Tensor) -> Tensor:
    """``table[ids]``: table ``[V, D]`` dense float or packed (dequantized, then gathered),
    ids integer ``[...]`` -> ``[..., D]`` f32. Out-of-range ids are clamped to ``[0, V-1]``
    (``poot.gather`` semantics)."""
    raise NotImplementedError


# ---------------------------------------------------------------------------------------------
# normalization
# ---------------------------------------------------------------------------------------------
def rmsnorm(b: Builder, x: Tensor, w: Tensor | None, eps: float,
            unit_offset: bool = False) -> Tensor:
    """RMSNorm over the last axis (HF ``LlamaRMSNorm``):
    ``y = x * rsqrt(mean(x^2, -1) + eps) * w``; with ``unit_offset`` (Gemma) the scale is
    ``(1 + w)``. ``w=None`` means no scale.

    x ``[..., D]`` float, w ``[D]`` float -> ``[..., D]`` f32 (computed in f32).
    """
    raise NotImplementedError


def layernorm(b: Builder, x: Tensor, w: Tensor | None, bias: Tensor | None,
              eps: float) -> Tensor:
    """LayerNorm over the last axis (``torch.nn.LayerNorm``, biased variance):
    ``y = (x - mean) * rsqrt(mean((x - mean)^2) + eps) * w + bias``.

    x ``[..., D]`` float; w, bias ``[D]`` float or None -> ``[..., D]`` f32.
    """
    raise NotImplementedError


# ---------------------------------------------------------------------------------------------
# rotary position embedding
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling (HF ``rope_scaling`` / ``rope_parameters``).

    Attributes:
        kind: ``"none"`` (default RoPE), ``"linear"`` (inv_freq / factor: position
            interpolation), ``"llama3"`` (Llama 3.1 wavelength-banded scaling) or ``"yarn"``
            (HF ``_compute_yarn_parameters``).
        factor: the scaling factor (linear, llama3, yarn).
        low_freq_factor, high_freq_factor: llama3 band edges.
        original_max_position: ``original_max_position_embeddings`` (llama3, yarn).
        beta_fast, beta_slow: yarn ramp bounds (HF defaults 32 and 1).
        mscale, mscale_all_dim: yarn attention-factor inputs (DeepSeek style); 0 = unset.
        attention_factor: yarn's explicit attention factor; None = derived.
        truncate: yarn's ``truncate`` flag (HF default True).
    """

    kind: str = "none"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 0.0
    mscale_all_dim: float = 0.0
    attention_factor: float | None = None
    truncate: bool = True

    def __post_init__(self):
        if self.kind not in ("none", "linear", "llama3", "yarn"):
            raise BuilderError(f"ops.RopeScaling: unknown kind {self.kind!r} (expected none, "
                               f"linear, llama3 or yarn)")

    @staticmethod
    def from_hf(cfg: Mapping[str, Any] | None, max_position: int | None = None
                ) -> "RopeScaling":
        """From an HF config's ``rope_scaling`` dict (``rope_type`` or legacy ``type`` key);
        None or ``rope_type == "default"`` gives ``kind="none"``. ``max_position`` is the
        config's ``max_position_embeddings``, the fallback for ``original_max_position``."""
        raise NotImplementedError


def rope_inv_freq(head_dim: int, theta: float, scaling: RopeScaling | None = None,
                  rotary_dim: int | None = None) -> np.ndarray:
    """Host-side inverse frequencies, ``float32 [rotary_dim // 2]``.

    ``inv_freq[i] = theta ** -(2i / rotary_dim)`` (HF ``_compute_default_rope_parameters``;
    ``rotary_dim`` defaults to ``head_dim``; partial rotary passes ``int(head_dim *
    partial_rotary_factor)``), then scaled:

    * linear: ``inv_freq / factor``;
    * llama3 (HF ``_compute_llama3_parameters``): with ``wavelen = 2 pi / inv_freq``,
      ``low_wl = orig / low_freq_factor``, ``high_wl = orig / high_freq_factor``:
      ``wavelen > low_wl`` -> ``inv_freq / factor``; ``wavelen < high_wl`` -> unchanged;
      otherwise ``(1 - s) * inv_freq / factor + s * inv_freq`` with
      ``s = (orig / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)``;
    * yarn (HF ``_compute_yarn_parameters``): linear-ramp blend of interpolated and
      extrapolated frequencies between the beta_fast / beta_slow correction dims.

    Computed in float64 and rounded once to float32.
    """
    raise NotImplementedError


def rope_attention_scaling(scaling: RopeScaling | None) -> float:
    """The factor HF multiplies cos and sin by (``attention_scaling``): 1.0 except for yarn,
    where it is ``attention_factor`` or ``0.1 * ln(factor) + 1`` (or the DeepSeek mscale
    ratio when ``mscale``/``mscale_all_dim`` are set)."""
    raise NotImplementedError


def rope_cos_sin(b: Builder, positions: Tensor, inv_freq: np.ndarray,
                 attention_scaling: float = 1.0) -> tuple[Tensor, Tensor]:
    """``cos, sin`` of ``positions * inv_freq`` (HF ``*RotaryEmbedding.forward``, one half).

    Args:
        positions: integer ``[B, T]`` token positions.
        inv_freq: host array ``[R/2]`` from :func:`rope_inv_freq` (embedded as a constant).
        attention_scaling: multiplies both results (yarn).
    Returns:
        ``cos, sin``: f32 ``[B, T, R/2]``; ``angle[b, t, i] = f32(positions[b, t]) *
        inv_freq[i]`` in f32, as HF does.
    """
    raise NotImplementedError


def apply_rope(b: Builder, x: Tensor, cos: Tensor, sin: Tensor,
               layout: str = "half") -> Tensor:
    """Rotate pairs of ``x``'s first ``R = 2 * cos.shape[-1]`` channels; the tail
    ``x[..., R:]`` (partial rotary) passes through unchanged.

    Args:
        x: ``[B, T, H, D]`` float, ``R <= D``.
        cos, sin: f32 ``[B, T, R/2]`` from :func:`rope_cos_sin` (shared by all heads).
        layout: ``"half"`` (HF ``rotate_half``, GPT-NeoX, llama.cpp NEOX): pair
            ``(i, i + R/2)``; ``"interleaved"`` (GPT-J, llama.cpp NORM, Meta checkpoints):
            pair ``(2i, 2i + 1)``. Pair ``(a, b)`` with frequency ``i`` becomes
            ``(a cos_i - b sin_i, b cos_i + a sin_i)``.
    Returns:
        ``[B, T, H, D]`` f32.
    """
    raise NotImplementedError


# ---------------------------------------------------------------------------------------------
# softmax and activations
# ---------------------------------------------------------------------------------------------
def softmax(b: Builder, x: Tensor, axis: int = -1) -> Tensor:
    """``exp(x - max(x)) / sum(exp(x - max(x)))`` along ``axis``; f32."""
    raise NotImplementedError


def masked_softmax(b: Builder, x: Tensor, visible: Tensor, axis: int = -1) -> Tensor:
    """Softmax of ``x`` over the entries where ``visible`` (i1, broadcastable to ``x``) is
    true; masked entries get probability 0. A slice with no visible entry yields all zeros
    (never NaN). f32."""
    raise NotImplementedError


def relu(b: Builder, x: Tensor) -> Tensor:
    """``max(x, 0)``; f32."""
    raise NotImplementedError


def sigmoid(b: Builder, x: Tensor) -> Tensor:
    """``1 / (1 + exp(-x))``; f32."""
    raise NotImplementedError


def silu(b: Builder, x: Tensor) -> Tensor:
    """``x * sigmoid(x)`` (SiLU / swish); f32."""
    raise NotImplementedError


def gelu_tanh(b: Builder, x: Tensor) -> Tensor:
    """``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`` (HF ``gelu_pytorch_tanh``,
    ``gelu_new``); f32."""
    raise NotImplementedError


def gelu_erf(b: Builder, x: Tensor) -> Tensor:
    """``0.5 x (1 + erf(x / sqrt(2)))`` (exact GELU, HF ``gelu``); f32."""
    raise NotImplementedError


def activation(b: Builder, x: Tensor, act: str) -> Tensor:
    """Apply the activation named ``act``: ``silu``/``swish``, ``gelu_tanh`` (also HF's
    ``gelu_pytorch_tanh``, ``gelu_new``, ``gelu_fast``), ``gelu_erf`` (also ``gelu``),
    ``relu``, ``sigmoid``. Unknown names raise BuilderError."""
    raise NotImplementedError


def swiglu(b: Builder, gate: Tensor, up: Tensor) -> Tensor:
    """``silu(gate) * up``; equal shapes; f32."""
    raise NotImplementedError


def geglu(b: Builder, gate: Tensor, up: Tensor, approximate: str = "tanh") -> Tensor:
    """``gelu(gate) * up``, ``approximate`` ``"tanh"`` (:func:`gelu_tanh`) or ``"none"``
    (:func:`gelu_erf`); f32."""
    raise NotImplementedError


def mlp_glu(b: Builder, x: Tensor, w_gate: Tensor, w_up: Tensor, w_down: Tensor,
            act: str = "silu") -> Tensor:
    """Gated MLP (HF ``LlamaMLP``): ``down(act(gate(x)) * up(x))``.

    x ``[..., D]``; w_gate, w_up ``[F, D]``; w_down ``[D, F]`` (dense or packed) -> ``[..., D]``
    f32. ``act`` as in :func:`activation`.
    """
    raise NotImplementedError


def mlp(b: Builder, x: Tensor, w_up: Tensor, w_down: Tensor, act: str = "gelu_tanh",
        b_up: Tensor | None = None, b_down: Tensor | None = None) -> Tensor:
    """Plain two-layer MLP (GPT-2, Phi): ``down(act(up(x) + b_up)) + b_down``.

    x ``[..., D]``; w_up ``[F, D]``; w_down ``[D, F]``; biases ``[F]``/``[D]`` or None ->
    ``[..., D]`` f32.
    """
    raise NotImplementedError


# ---------------------------------------------------------------------------------------------
# attention
# ---------------------------------------------------------------------------------------------
def attention(b: Builder, q: Tensor, k: Tensor, v: Tensor, *, q_pos: Tensor,
              k_pos: Tensor | None = None, causal: bool = True,
              sliding_window: int | None = None, softcap: float | None = None,
              scale: float | None = None, mask: Tensor | None = None) -> Tensor:
    """Scaled dot-product attention with GQA, position-based causal/sliding masks, softcap.

    Args:
        q: ``[B, T, Hq, D]`` float.
        k: ``[B, S, Hkv, D]`` float; ``Hq % Hkv == 0``.
        v: ``[B, S, Hkv, Dv]`` float.
        q_pos: integer ``[B, T]``, the position of each query.
        k_pos: integer ``[B, S]``, the position held by each key slot; default ``iota``
            ``0..S-1`` (slot i of a fixed-capacity KV cache holds position i).
        causal: key s is visible to query t iff ``k_pos[s] <= q_pos[t]``.
        sliding_window: W; additionally ``q_pos[t] - k_pos[s] < W`` (HF semantics: the
            query sees itself and the W-1 previous positions).
        softcap: c; ``scores = c * tanh(scores / c)`` after scaling, before masking (Gemma 2).
        scale: score scale, default ``D ** -0.5``.
        mask: optional i1 ``[B, T, S]``, True = may attend; ANDed with the above.
    Returns:
        f32 ``[B, T, Hq, Dv]``:
        ``out[b,t,h] = sum_s p[b,h,t,s] v[b,s,h // (Hq/Hkv)]`` with
        ``p = softmax_s(scale * q[b,t,h] . k[b,s,h // (Hq/Hkv)])`` over the visible keys
        (query head h reads kv head ``h // (Hq / Hkv)``, as HF ``repeat_kv``). A query with no
        visible key gets probability 0 everywhere and yields an all-zero output row (no NaN).

    Spelled with grouped batched matmuls (no KV repetition is materialized): q as
    ``[B, Hkv, G*T, D]`` times k as ``[B, Hkv, D, S]``, masked softmax over S, times v as
    ``[B, Hkv, S, Dv]``.
    """
    raise NotImplementedError


# ---------------------------------------------------------------------------------------------
# mixture of experts
# ---------------------------------------------------------------------------------------------
def topk_mask(b: Builder, scores: Tensor, k: int) -> Tensor:
    """i1 ``[N, E]``: True at the k largest entries of each row of ``scores`` ``[N, E]``.
    Ties are broken toward the lowest index. Spelled as k rounds of argmax (reduce max,
    compare, select over iota, reduce min)."""
    raise NotImplementedError


def topk_routing(b: Builder, logits: Tensor, k: int, normalize: bool, *,
                 softmax_after_topk: bool = False, scoring: str = "softmax") -> Tensor:
    """Dense routing weights f32 ``[N, E]`` from router logits ``[N, E]``: zero except at each
    row's top-k experts (chosen by logit; ties -> lowest expert index).

    * ``scoring="softmax"``, default (Qwen-MoE, OLMoE, Mixtral): ``p = softmax(logits)`` over
      all E; weight ``p`` at the selected experts; with ``normalize`` (HF ``norm_topk_prob``)
      divided by their sum.
    * ``softmax_after_topk=True``: ``softmax`` over the selected logits only (the Mixtral /
      llama.cpp spelling); mathematically equal to the renormalized softmax, so
      ``normalize`` is moot.
    * ``scoring="sigmoid"``: ``p = sigmoid(logits)`` (renormalized over the selection when
      ``normalize``).
    """
    raise NotImplementedError


def moe(b: Builder, x: Tensor, router_w: Tensor, experts_gate: Tensor, experts_up: Tensor,
        experts_down: Tensor, k: int, normalize: bool, act: str = "silu", *,
        softmax_after_topk: bool = False, scoring: str = "softmax") -> Tensor:
    """Sparse MoE block with gated experts, evaluated densely.

    Args:
        x: ``[N, D]`` float tokens.
        router_w: ``[E, D]`` router (``logits = linear(x, router_w)``).
        experts_gate, experts_up: ``[E, F, D]`` stacked, dense or packed.
        experts_down: ``[E, D, F]`` stacked, dense or packed.
        k, normalize, softmax_after_topk, scoring: as :func:`topk_routing`.
        act: as :func:`activation`.
    Returns:
        f32 ``[N, D]``: ``sum_e w[n, e] * down_e(act(gate_e(x_n)) * up_e(x_n))`` with ``w`` from
        :func:`topk_routing`. Every expert is computed for every token and weighted (zero
        for unselected experts); a sparse lowering is the compiler's job.
    """
    raise NotImplementedError
