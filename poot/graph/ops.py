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
from typing import Any, Mapping

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


def _float(fn: str, what: str, t) -> None:
    """``t`` must be a handle to a dense float tensor."""
    if not isinstance(t, Tensor):
        _fail(fn, f"{what} must be a Tensor, got {type(t).__name__}")
    if not isinstance(t.type, TensorType) or not t.type.dtype.is_float:
        _fail(fn, f"{what} must be a dense float tensor, got {t.type}")


def _int_shape(fn: str, what: str, t, shape: tuple[int, ...]) -> None:
    if (not isinstance(t, Tensor) or not isinstance(t.type, TensorType)
            or not t.type.dtype.is_int or t.shape != shape):
        got = t.type if isinstance(t, Tensor) else type(t).__name__
        _fail(fn, f"{what} must be an integer tensor of shape {list(shape)}, got {got}")


def _same(fn: str, a, c) -> None:
    _float(fn, "gate", a)
    _float(fn, "up", c)
    if a.shape != c.shape:
        _fail(fn, f"gate {a.type} and up {c.type} differ in shape")


# ---------------------------------------------------------------------------------------------
# dense / packed projections
# ---------------------------------------------------------------------------------------------
def as_f32(b: Builder, x: Tensor) -> Tensor:
    """``x`` as a dense f32 tensor: packed -> ``dequantize`` (f32); f16/bf16/int -> ``cast``;
    f32 unchanged."""
    x = b._own(x)
    if isinstance(x.type, PackedType):
        return b.dequantize(x, DType.F32)
    return b.cast(x, DType.F32)


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
    _float("linear", "x", x)
    if x.rank < 1:
        _fail("linear", f"x must have rank >= 1, got {x.type}")
    if w.rank != 2:
        _fail("linear", f"w must be [N, K], got {w.type}")
    n, kw = w.shape
    kx = x.shape[-1]
    if kw != kx:
        _fail("linear", f"x {x.type} has K={kx} but w {w.type} has K={kw} (w is [N, K])")
    if not isinstance(w.type, PackedType):
        _float("linear", "w", w)
    if bias is not None:
        _float("linear", "bias", bias)
        if bias.shape != (n,):
            _fail("linear", f"bias must be [{n}], got {bias.type}")
    lead = x.shape[:-1]
    m = int(np.prod(lead, dtype=np.int64))
    x2 = b.reshape(as_f32(b, x), [m, kx])
    y = b.matmul(x2, b.transpose(as_f32(b, w), [1, 0]))
    y = b.reshape(y, lead + (n,))
    if bias is not None:
        y = y + as_f32(b, bias)
    return y


def embedding(b: Builder, table: Tensor, ids: Tensor) -> Tensor:
    """``table[ids]``: table ``[V, D]`` dense float or packed (dequantized, then gathered),
    ids integer ``[...]`` -> ``[..., D]`` f32. Out-of-range ids are clamped to ``[0, V-1]``
    (``poot.gather`` semantics)."""
    if table.rank != 2:
        _fail("embedding", f"table must be [V, D], got {table.type}")
    if not isinstance(ids.type, TensorType) or not ids.dtype.is_int:
        _fail("embedding", f"ids must be an integer tensor, got {ids.type}")
    if isinstance(table.type, PackedType):
        return b.gather(b.dequantize(table, DType.F32), ids, axis=0)
    _float("embedding", "table", table)
    return b.cast(b.gather(table, ids, axis=0), DType.F32)


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
    _float("rmsnorm", "x", x)
    d = x.shape[-1] if x.rank else 0
    if x.rank < 1:
        _fail("rmsnorm", f"x must have rank >= 1, got {x.type}")
    if w is not None:
        _float("rmsnorm", "w", w)
        if w.shape != (d,):
            _fail("rmsnorm", f"w must be [{d}] for x {x.type}, got {w.type}")
    xf = as_f32(b, x)
    ms = b.reduce("sum", xf * xf, -1, keepdims=True) / float(d)
    y = xf * b.unary("rsqrt", ms + float(eps))
    if w is not None:
        wf = as_f32(b, w)
        y = y * ((wf + 1.0) if unit_offset else wf)
    return y


def layernorm(b: Builder, x: Tensor, w: Tensor | None, bias: Tensor | None,
              eps: float) -> Tensor:
    """LayerNorm over the last axis (``torch.nn.LayerNorm``, biased variance):
    ``y = (x - mean) * rsqrt(mean((x - mean)^2) + eps) * w + bias``.

    x ``[..., D]`` float; w, bias ``[D]`` float or None -> ``[..., D]`` f32.
    """
    _float("layernorm", "x", x)
    if x.rank < 1:
        _fail("layernorm", f"x must have rank >= 1, got {x.type}")
    d = x.shape[-1]
    for nm, t in (("w", w), ("bias", bias)):
        if t is not None:
            _float("layernorm", nm, t)
            if t.shape != (d,):
                _fail("layernorm", f"{nm} must be [{d}] for x {x.type}, got {t.type}")
    xf = as_f32(b, x)
    xc = xf - b.reduce("sum", xf, -1, keepdims=True) / float(d)
    var = b.reduce("sum", xc * xc, -1, keepdims=True) / float(d)
    y = xc * b.unary("rsqrt", var + float(eps))
    if w is not None:
        y = y * as_f32(b, w)
    if bias is not None:
        y = y + as_f32(b, bias)
    return y


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
        if not cfg:
            return RopeScaling()
        kind = cfg.get("rope_type", cfg.get("type", "default"))
        if kind == "default":
            return RopeScaling()
        if kind not in ("linear", "llama3", "yarn"):
            raise BuilderError(f"ops.RopeScaling.from_hf: rope_type {kind!r} is not supported "
                               f"(none, linear, llama3, yarn)")
        orig = cfg.get("original_max_position_embeddings") or max_position or 8192
        af = cfg.get("attention_factor")
        factor = cfg.get("factor")
        if factor is None:  # HF yarn: derived from the context extension when unset
            factor = max_position / orig if (kind == "yarn" and max_position) else 1.0
        return RopeScaling(
            kind=kind, factor=float(factor),
            low_freq_factor=float(cfg.get("low_freq_factor", 1.0)),
            high_freq_factor=float(cfg.get("high_freq_factor", 4.0)),
            original_max_position=int(orig),
            beta_fast=float(cfg.get("beta_fast") or 32.0),
            beta_slow=float(cfg.get("beta_slow") or 1.0),
            mscale=float(cfg.get("mscale") or 0.0),
            mscale_all_dim=float(cfg.get("mscale_all_dim") or 0.0),
            attention_factor=None if af is None else float(af),
            truncate=bool(cfg.get("truncate", True)))


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

    Computed in float32 in HF's operation order (what torch computes), so the constants match
    HF's bit for bit in the common cases: at position 1e5 one ulp of inv_freq is ~6e-3 rad.
    """
    r = head_dim if rotary_dim is None else int(rotary_dim)
    if r <= 0 or r % 2 or r > head_dim:
        raise BuilderError(f"ops.rope_inv_freq: rotary_dim {r} must be even and in "
                           f"(0, head_dim={head_dim}]")
    s = scaling or RopeScaling()
    f32 = np.float32
    # float32 throughout, in HF's operation order (torch computes these in f32): at large
    # positions one ulp of inv_freq moves the angle visibly, so we match HF's rounding.
    # torch evaluates ``float ** f32 tensor`` in double and rounds once to f32
    expo = np.arange(0, r, 2).astype(f32) / f32(r)
    pos_freqs = (float(theta) ** expo.astype(np.float64)).astype(f32)
    inv = f32(1.0) / pos_freqs
    if s.kind == "linear":
        inv = inv / f32(s.factor)
    elif s.kind == "llama3":
        factor, lo, hi = f32(s.factor), f32(s.low_freq_factor), f32(s.high_freq_factor)
        orig = float(s.original_max_position)
        low_wl = f32(orig / s.low_freq_factor)
        high_wl = f32(orig / s.high_freq_factor)
        wavelen = f32(2 * math.pi) / inv
        scaled = np.where(wavelen > low_wl, inv / factor, inv)
        smooth = (f32(orig) / wavelen - lo) / f32(s.high_freq_factor - s.low_freq_factor)
        smoothed = (f32(1) - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wl) & ~(wavelen > low_wl)
        inv = np.where(medium, smoothed, scaled)
    elif s.kind == "yarn":
        orig = float(s.original_max_position)

        def corr_dim(rot):
            return r * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(theta))

        low, high = corr_dim(s.beta_fast), corr_dim(s.beta_slow)
        if s.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, r - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(r // 2).astype(f32) - f32(low)) / f32(high - low), 0, 1)
        extra = f32(1) - ramp
        interp = f32(1.0) / (f32(s.factor) * pos_freqs)
        inv = interp * (f32(1) - extra) + inv * extra
    return np.asarray(inv, dtype=np.float32)


def rope_attention_scaling(scaling: RopeScaling | None) -> float:
    """The factor HF multiplies cos and sin by (``attention_scaling``): 1.0 except for yarn,
    where it is ``attention_factor`` or ``0.1 * ln(factor) + 1`` (or the DeepSeek mscale
    ratio when ``mscale``/``mscale_all_dim`` are set)."""
    if scaling is None or scaling.kind != "yarn":
        return 1.0
    if scaling.attention_factor is not None:
        return float(scaling.attention_factor)

    def get_mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if scaling.mscale and scaling.mscale_all_dim:
        return float(get_mscale(scaling.factor, scaling.mscale)
                     / get_mscale(scaling.factor, scaling.mscale_all_dim))
    return float(get_mscale(scaling.factor))


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
    positions = b._own(positions)
    if not isinstance(positions.type, TensorType) or not positions.dtype.is_int:
        _fail("rope_cos_sin", f"positions must be an integer tensor, got {positions.type}")
    inv = np.asarray(inv_freq, dtype=np.float32)
    if inv.ndim != 1 or inv.size == 0:
        _fail("rope_cos_sin", f"inv_freq must be a non-empty 1-D array, got shape "
              f"{list(inv.shape)}")
    pos = b.reshape(b.cast(positions, DType.F32), positions.shape + (1,))
    angle = pos * b.constant(inv)
    cos, sin = b.unary("cos", angle), b.unary("sin", angle)
    if attention_scaling != 1.0:
        cos, sin = cos * float(attention_scaling), sin * float(attention_scaling)
    return cos, sin


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
    _float("apply_rope", "x", x)
    if x.rank != 4:
        _fail("apply_rope", f"x must be [B, T, H, D], got {x.type}")
    bsz, t, h, d = x.shape
    if cos.rank != 3 or cos.shape != sin.shape or cos.shape[:2] != (bsz, t):
        _fail("apply_rope", f"cos/sin must be [{bsz}, {t}, R/2] for x {x.type}, got "
              f"{cos.type} and {sin.type}")
    half = cos.shape[-1]
    r = 2 * half
    if r > d:
        _fail("apply_rope", f"rotary dim {r} (2 * cos.shape[-1]) exceeds head dim {d}")
    if layout not in ("half", "interleaved"):
        _fail("apply_rope", f"layout must be 'half' or 'interleaved', got {layout!r}")
    xf = as_f32(b, x)
    c = b.reshape(as_f32(b, cos), [bsz, t, 1, half])
    s = b.reshape(as_f32(b, sin), [bsz, t, 1, half])
    if layout == "half":
        x1 = b.slice_axis(xf, 3, 0, half)
        x2 = b.slice_axis(xf, 3, half, r)
        rot = b.concat([x1 * c - x2 * s, x2 * c + x1 * s], axis=3)
    else:
        xe = b.slice_axis(xf, 3, 0, r, 2)
        xo = b.slice_axis(xf, 3, 1, r, 2)
        oe = b.reshape(xe * c - xo * s, [bsz, t, h, half, 1])
        oo = b.reshape(xo * c + xe * s, [bsz, t, h, half, 1])
        rot = b.reshape(b.concat([oe, oo], axis=4), [bsz, t, h, r])
    if r < d:
        rot = b.concat([rot, b.slice_axis(xf, 3, r, d)], axis=3)
    return rot


# ---------------------------------------------------------------------------------------------
# softmax and activations
# ---------------------------------------------------------------------------------------------
def softmax(b: Builder, x: Tensor, axis: int = -1) -> Tensor:
    """``exp(x - max(x)) / sum(exp(x - max(x)))`` along ``axis``; f32."""
    _float("softmax", "x", x)
    xf = as_f32(b, x)
    e = b.unary("exp", xf - b.reduce("max", xf, axis, keepdims=True))
    return e / b.reduce("sum", e, axis, keepdims=True)


def masked_softmax(b: Builder, x: Tensor, visible: Tensor, axis: int = -1) -> Tensor:
    """Softmax of ``x`` over the entries where ``visible`` (i1, broadcastable to ``x``) is
    true; masked entries get probability 0. A slice with no visible entry yields all zeros
    (never NaN). f32."""
    _float("masked_softmax", "x", x)
    if not isinstance(visible.type, TensorType) or not visible.dtype.is_bool:
        _fail("masked_softmax", f"visible must be an i1 tensor, got {visible.type}")
    xf = as_f32(b, x)
    vis = b.broadcast_to(visible, xf.shape) if visible.shape != xf.shape else visible
    xm = b.select(vis, xf, b.scalar(MASKED_SCORE))
    e = b.unary("exp", xm - b.reduce("max", xm, axis, keepdims=True))
    e = b.select(vis, e, b.scalar(0.0))
    # A row with a visible entry sums to >= 1 (its max contributes exp(0) = 1); a row with
    # none sums to 0 and, divided by 1, stays all zeros.
    denom = b.binary("max", b.reduce("sum", e, axis, keepdims=True), b.scalar(1.0))
    return e / denom


def relu(b: Builder, x: Tensor) -> Tensor:
    """``max(x, 0)``; f32."""
    _float("relu", "x", x)
    return b.binary("max", as_f32(b, x), b.scalar(0.0))


def sigmoid(b: Builder, x: Tensor) -> Tensor:
    """``1 / (1 + exp(-x))``; f32."""
    _float("sigmoid", "x", x)
    return 1.0 / (b.unary("exp", -as_f32(b, x)) + 1.0)


def silu(b: Builder, x: Tensor) -> Tensor:
    """``x * sigmoid(x)`` (SiLU / swish); f32."""
    _float("silu", "x", x)
    xf = as_f32(b, x)
    return xf * sigmoid(b, xf)


def gelu_tanh(b: Builder, x: Tensor) -> Tensor:
    """``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`` (HF ``gelu_pytorch_tanh``,
    ``gelu_new``); f32."""
    _float("gelu_tanh", "x", x)
    xf = as_f32(b, x)
    inner = (xf + xf * xf * xf * 0.044715) * math.sqrt(2.0 / math.pi)
    return xf * 0.5 * (b.unary("tanh", inner) + 1.0)


def gelu_erf(b: Builder, x: Tensor) -> Tensor:
    """``0.5 x (1 + erf(x / sqrt(2)))`` (exact GELU, HF ``gelu``); f32."""
    _float("gelu_erf", "x", x)
    xf = as_f32(b, x)
    return xf * 0.5 * (b.unary("erf", xf * (1.0 / math.sqrt(2.0))) + 1.0)


def activation(b: Builder, x: Tensor, act: str) -> Tensor:
    """Apply the activation named ``act``: ``silu``/``swish``, ``gelu_tanh`` (also HF's
    ``gelu_pytorch_tanh``, ``gelu_new``, ``gelu_fast``), ``gelu_erf`` (also ``gelu``),
    ``relu``, ``sigmoid``. Unknown names raise BuilderError."""
    fn = _ACTIVATIONS.get(act)
    if fn is None:
        _fail("activation", f"unknown activation {act!r} (known: {', '.join(_ACTIVATIONS)})")
    return fn(b, x)


_ACTIVATIONS = {
    "silu": silu, "swish": silu,
    "gelu_tanh": gelu_tanh, "gelu_pytorch_tanh": gelu_tanh, "gelu_new": gelu_tanh,
    "gelu_fast": gelu_tanh,
    "gelu_erf": gelu_erf, "gelu": gelu_erf,
    "relu": relu, "sigmoid": sigmoid,
}


def swiglu(b: Builder, gate: Tensor, up: Tensor) -> Tensor:
    """``silu(gate) * up``; equal shapes; f32."""
    _same("swiglu", gate, up)
    return silu(b, gate) * as_f32(b, up)


def geglu(b: Builder, gate: Tensor, up: Tensor, approximate: str = "tanh") -> Tensor:
    """``gelu(gate) * up``, ``approximate`` ``"tanh"`` (:func:`gelu_tanh`) or ``"none"``
    (:func:`gelu_erf`); f32."""
    _same("geglu", gate, up)
    if approximate == "tanh":
        g = gelu_tanh(b, gate)
    elif approximate == "none":
        g = gelu_erf(b, gate)
    else:
        _fail("geglu", f"approximate must be 'tanh' or 'none', got {approximate!r}")
    return g * as_f32(b, up)


def mlp_glu(b: Builder, x: Tensor, w_gate: Tensor, w_up: Tensor, w_down: Tensor,
            act: str = "silu") -> Tensor:
    """Gated MLP (HF ``LlamaMLP``): ``down(act(gate(x)) * up(x))``.

    x ``[..., D]``; w_gate, w_up ``[F, D]``; w_down ``[D, F]`` (dense or packed) -> ``[..., D]``
    f32. ``act`` as in :func:`activation`.
    """
    if w_gate.shape != w_up.shape:
        _fail("mlp_glu", f"w_gate {w_gate.type} and w_up {w_up.type} differ in shape")
    if w_gate.rank != 2 or w_down.shape != (w_gate.shape[1], w_gate.shape[0]):
        _fail("mlp_glu", f"w_down must be [D, F] = {[w_gate.shape[-1], w_gate.shape[0]]} "
              f"for w_gate {w_gate.type}, got {w_down.type}")
    h = activation(b, linear(b, x, w_gate), act) * linear(b, x, w_up)
    return linear(b, h, w_down)


def mlp(b: Builder, x: Tensor, w_up: Tensor, w_down: Tensor, act: str = "gelu_tanh",
        b_up: Tensor | None = None, b_down: Tensor | None = None) -> Tensor:
    """Plain two-layer MLP (GPT-2, Phi): ``down(act(up(x) + b_up)) + b_down``.

    x ``[..., D]``; w_up ``[F, D]``; w_down ``[D, F]``; biases ``[F]``/``[D]`` or None ->
    ``[..., D]`` f32.
    """
    h = activation(b, linear(b, x, w_up, b_up), act)
    return linear(b, h, w_down, b_down)


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
        Invisible keys enter the ``p @ v`` matmul with weight exactly 0, so unwritten cache slots
        may hold any finite values (a NaN/inf there would propagate: keep caches
        zero-initialised).

    Spelled with grouped batched matmuls (no KV repetition is materialized): q as
    ``[B, Hkv, G*T, D]`` times k as ``[B, Hkv, D, S]``, masked softmax over S, times v as
    ``[B, Hkv, S, Dv]``.
    """
    fn = "attention"
    for nm, t in (("q", q), ("k", k), ("v", v)):
        _float(fn, nm, t)
        if t.rank != 4:
            _fail(fn, f"{nm} must be rank 4 ([B, T|S, H, D]), got {t.type}")
    bsz, t, hq, d = q.shape
    bk, s, hkv, dk = k.shape
    bv, sv, hv, dv = v.shape
    if not bsz == bk == bv:
        _fail(fn, f"batch sizes differ: q {q.type}, k {k.type}, v {v.type}")
    if dk != d:
        _fail(fn, f"q head dim {d} differs from k head dim {dk}")
    if (sv, hv) != (s, hkv):
        _fail(fn, f"v {v.type} must have k's length and heads [{bk}, {s}, {hkv}, Dv]")
    if hq % hkv:
        _fail(fn, f"query heads Hq={hq} are not a multiple of kv heads Hkv={hkv} "
              f"(q {q.type}, k {k.type})")
    _int_shape(fn, "q_pos", q_pos, (bsz, t))
    if k_pos is not None:
        _int_shape(fn, "k_pos", k_pos, (bsz, s))
    if mask is not None and (not isinstance(mask.type, TensorType) or not mask.dtype.is_bool
                             or mask.shape != (bsz, t, s)):
        _fail(fn, f"mask must be i1 [{bsz}, {t}, {s}], got {mask.type}")
    if sliding_window is not None and (int(sliding_window) != sliding_window
                                       or sliding_window < 1):
        _fail(fn, f"sliding_window must be a positive int, got {sliding_window!r}")
    if softcap is not None and not softcap > 0:
        _fail(fn, f"softcap must be > 0, got {softcap!r}")
    g = hq // hkv
    scale = d ** -0.5 if scale is None else float(scale)

    # scores [B, Hkv, G*T, S]: query head h = kv * G + g reads kv head h // G (repeat_kv).
    qf = b.reshape(as_f32(b, q), [bsz, t, hkv, g, d])
    qf = b.reshape(b.transpose(qf, [0, 2, 3, 1, 4]), [bsz, hkv, g * t, d])
    kt = b.transpose(as_f32(b, k), [0, 2, 3, 1])
    scores = b.matmul(qf, kt) * scale
    if softcap is not None:
        scores = b.unary("tanh", scores * (1.0 / float(softcap))) * float(softcap)
    scores = b.reshape(scores, [bsz, hkv, g, t, s])

    visible = None
    if causal or sliding_window is not None:
        if k_pos is None:
            k_pos = b.iota([bsz, s], 1, q_pos.dtype)
        pdt = q_pos.dtype if q_pos.dtype is k_pos.dtype else DType.I64
        qp = b.reshape(b.cast(q_pos, pdt), [bsz, t, 1])
        kp = b.reshape(b.cast(k_pos, pdt), [bsz, 1, s])
        if causal:
            visible = b.compare("le", kp, qp)
        if sliding_window is not None:
            inside = b.compare("lt", qp - kp, b.scalar(int(sliding_window), pdt))
            visible = inside if visible is None else b.binary("and", visible, inside)
    if mask is not None:
        visible = mask if visible is None else b.binary("and", visible, mask)
    if visible is None:
        p = softmax(b, scores, -1)
    else:
        p = masked_softmax(b, scores, b.reshape(visible, [bsz, 1, 1, t, s]), -1)

    p = b.reshape(p, [bsz, hkv, g * t, s])
    out = b.matmul(p, b.transpose(as_f32(b, v), [0, 2, 1, 3]))  # [B, Hkv, G*T, Dv]
    out = b.transpose(b.reshape(out, [bsz, hkv, g, t, dv]), [0, 3, 1, 2, 4])
    return b.reshape(out, [bsz, t, hq, dv])


# ---------------------------------------------------------------------------------------------
# mixture of experts
# ---------------------------------------------------------------------------------------------
def _topk_rounds(b: Builder, scores: Tensor, k: int
                 ) -> tuple[list[tuple[Tensor, Tensor]], Tensor]:
    """The k rounds of :func:`topk_mask` (per round, the chosen index i32 ``[N, 1]`` and its
    one-hot i1 ``[N, E]``) and the mask of all k."""
    _float("topk_mask", "scores", scores)
    if scores.rank != 2:
        _fail("topk_mask", f"scores must be [N, E], got {scores.type}")
    n, e = scores.shape
    if not 1 <= k <= e:
        _fail("topk_mask", f"k={k} must be in [1, E={e}]")
    sf = as_f32(b, scores)
    idx = b.iota([n, e], 1, DType.I32)
    none = b.scalar(e, DType.I32)
    ninf = b.scalar(-np.inf)
    remaining, selected, rounds = sf, None, []
    for _ in range(k):
        top = b.compare("eq", remaining, b.reduce("max", remaining, 1, keepdims=True))
        if selected is not None:
            top = b.binary("and", top, b.unary("not", selected))
        first = b.reduce("min", b.select(top, idx, none), 1, keepdims=True)
        hit = b.compare("eq", idx, first)
        rounds.append((first, hit))
        selected = hit if selected is None else b.binary("or", selected, hit)
        remaining = b.select(hit, ninf, remaining)
    return rounds, selected


def topk_mask(b: Builder, scores: Tensor, k: int) -> Tensor:
    """i1 ``[N, E]``: True at the k largest entries of each row of ``scores`` ``[N, E]``.
    Ties are broken toward the lowest index. Spelled as k rounds of argmax (reduce max,
    compare, select over iota, reduce min)."""
    return _topk_rounds(b, scores, k)[1]


def topk_routing(b: Builder, logits: Tensor, k: int, normalize: bool, *,
                 softmax_after_topk: bool = False, scoring: str = "softmax",
                 bias: Tensor | None = None, groups: int = 1, topk_groups: int | None = None,
                 group_score: str = "top2_sum", scale: float = 1.0) -> Tensor:
    """Dense routing weights f32 ``[N, E]`` from router logits ``[N, E]``: zero except at each
    row's top-k experts (ties -> lowest expert index).

    * ``scoring="softmax"``, default (Qwen-MoE, OLMoE, Mixtral): ``p = softmax(logits)`` over
      all E; weight ``p`` at the selected experts; with ``normalize`` (HF ``norm_topk_prob``)
      divided by their sum.
    * ``softmax_after_topk=True``: ``softmax`` over the selected logits only (the Mixtral /
      llama.cpp spelling); mathematically equal to the renormalized softmax, so
      ``normalize`` is moot.
    * ``scoring="sigmoid"``: ``p = sigmoid(logits)`` (renormalized over the selection when
      ``normalize``).

    DeepSeek-style selection (HF ``DeepseekV3TopkRouter``, ``Glm4MoeTopkRouter``; DeepSeek-V2's
    ``group_limited_greedy``): experts are chosen by ``p + bias`` (``bias``: f32 ``[E]``, the
    score-correction bias; it never enters the weights); with ``groups`` > 1 the E experts
    form ``groups`` equal consecutive groups, each scored by the sum of its two best choice
    scores (``group_score="top2_sum"``, V3) or its best one (``"max"``, V2), and only the
    ``topk_groups`` best groups stay eligible. Without a bias or groups the choice is by
    logit (the same order). The weights are multiplied by ``scale``
    (``routed_scaling_factor``) after any renormalization.
    Raises OpError for a bias not ``[E]``, groups that do not divide E, or eligible groups
    holding fewer than k experts.
    """
    topk_groups = _check_routing(logits, k, softmax_after_topk, scoring, bias, groups,
                                 topk_groups, group_score)
    return _route(b, logits, k, normalize, softmax_after_topk, scoring, bias, groups,
                  topk_groups, group_score, scale)[0]


def _check_routing(logits: Tensor, k: int, softmax_after_topk: bool, scoring: str,
                   bias: Tensor | None, groups: int, topk_groups: int | None,
                   group_score: str) -> int:
    """:func:`topk_routing`'s argument checks; returns ``topk_groups`` resolved."""
    fn = "topk_routing"
    _float(fn, "logits", logits)
    if scoring not in ("softmax", "sigmoid"):
        _fail(fn, f"scoring must be 'softmax' or 'sigmoid', got {scoring!r}")
    if softmax_after_topk and (scoring != "softmax" or bias is not None or groups != 1):
        _fail(fn, "softmax_after_topk needs scoring='softmax' and no bias or groups")
    n, e = logits.shape if logits.rank == 2 else (0, 0)
    if bias is not None and bias.shape != (e,):
        _fail(fn, f"bias must be [{e}], got {bias.type}")
    if groups < 1 or (e and e % groups):
        _fail(fn, f"groups={groups} must divide the {e} experts")
    topk_groups = groups if topk_groups is None else topk_groups
    if not 1 <= topk_groups <= groups or (groups > 1 and topk_groups * (e // groups) < k):
        _fail(fn, f"topk_groups={topk_groups} of {groups} groups leave fewer than k={k} "
                  f"eligible experts")
    if group_score not in ("top2_sum", "max"):
        _fail(fn, f"group_score must be 'top2_sum' or 'max', got {group_score!r}")
    if logits.rank != 2:
        _fail("topk_mask", f"scores must be [N, E], got {logits.type}")
    if not 1 <= k <= e:
        _fail("topk_mask", f"k={k} must be in [1, E={e}]")
    return topk_groups


def _route(b: Builder, logits: Tensor, k: int, normalize: bool, softmax_after_topk: bool,
           scoring: str, bias: Tensor | None, groups: int, topk_groups: int,
           group_score: str, scale: float) -> tuple[Tensor, list[tuple[Tensor, Tensor]]]:
    """:func:`topk_routing`'s weights (arguments checked there) and its k selection rounds
    (:func:`_topk_rounds`)."""
    n, e = logits.shape
    lf = as_f32(b, logits)
    if softmax_after_topk:
        rounds, sel = _topk_rounds(b, logits, k)
        w = masked_softmax(b, lf, sel, -1)
        return (w * float(scale) if scale != 1.0 else w), rounds
    p = softmax(b, lf, -1) if scoring == "softmax" else sigmoid(b, lf)
    if bias is None and groups == 1:
        rounds, sel = _topk_rounds(b, logits, k)
    else:
        key = p if bias is None else p + b.reshape(as_f32(b, bias), [1, e])
        if groups > 1:
            per = e // groups
            kg = b.reshape(key, [n * groups, per])
            if group_score == "max" or per == 1:
                gs = b.reduce("max", kg, 1)
            else:
                gs = b.reduce("sum", b.select(topk_mask(b, kg, 2), kg, b.scalar(0.0)), 1)
            keep = topk_mask(b, b.reshape(gs, [n, groups]), topk_groups)       # [N, G]
            keep = b.reshape(b.broadcast_to(b.reshape(keep, [n, groups, 1]),
                                            [n, groups, per]), [n, e])
            key = b.select(keep, key, b.scalar(-np.inf))
        rounds, sel = _topk_rounds(b, key, k)
    w = b.select(sel, p, b.scalar(0.0))
    if normalize:
        w = w / b.binary("max", b.reduce("sum", w, 1, keepdims=True), b.scalar(1e-20))
    return (w * float(scale) if scale != 1.0 else w), rounds


def _moe_sparse(b: Builder, xf: Tensor, w: Tensor, rounds: list[tuple[Tensor, Tensor]],
                gate_w: Tensor, up_w: Tensor, down_w: Tensor, act: str) -> Tensor:
    """``sum_j w[n, idx_j] * down[idx_j](act(gate[idx_j] x_n) * up[idx_j] x_n)`` over the k
    selection rounds: the N * k (token, expert) rows through ``poot.indexed_matmul`` against
    the stacked ``[E, F, D]`` / ``[E, D, F]`` experts -> f32 ``[N, D]``."""
    n, d = xf.shape
    k = len(rounds)
    idx = b.reshape(b.concat([f for f, _ in rounds], axis=1), [n * k])      # [N*k] i32
    wsel = b.concat([b.reduce("sum", b.select(hit, w, b.scalar(0.0)), 1, keepdims=True)
                     for _, hit in rounds], axis=1)                          # [N, k]
    xr = b.reshape(b.broadcast_to(b.reshape(xf, [n, 1, d]), [n, k, d]), [n * k, d])
    h = activation(b, b.indexed_matmul(xr, gate_w, idx), act) * \
        b.indexed_matmul(xr, up_w, idx)                                      # [N*k, F]
    y = b.reshape(b.indexed_matmul(h, down_w, idx), [n, k, d])
    return b.reduce("sum", y * b.reshape(wsel, [n, k, 1]), 1)


def moe(b: Builder, x: Tensor, router_w: Tensor, experts_gate: Tensor, experts_up: Tensor,
        experts_down: Tensor, k: int, normalize: bool, act: str = "silu", *,
        softmax_after_topk: bool = False, scoring: str = "softmax",
        sparse: bool | None = None, **selection: Any) -> Tensor:
    """Sparse MoE block with gated experts.

    Args:
        x: ``[N, D]`` float tokens.
        router_w: ``[E, D]`` router (``logits = linear(x, router_w)``).
        experts_gate, experts_up: ``[E, F, D]`` stacked, dense or packed.
        experts_down: ``[E, D, F]`` stacked, dense or packed.
        k, normalize, softmax_after_topk, scoring: as :func:`topk_routing`; ``selection``:
            its DeepSeek-style keywords (``bias``, ``groups``, ``topk_groups``,
            ``group_score``, ``scale``).
        act: as :func:`activation`.
        sparse: how the experts are spelled. True: each token's k selected experts only,
            through ``poot.indexed_matmul`` (the selected experts' weights are read where
            they are stored, packed ones included; cost ~ N * k experts). False: every
            expert on every token, weighted (zero for unselected ones; cost ~ E experts,
            each as one matmul over the N tokens). None: sparse when ``N * k < E`` (decode
            steps), where it reads fewer expert weights than the dense form.
    Returns:
        f32 ``[N, D]``: ``sum_e w[n, e] * down_e(act(gate_e(x_n)) * up_e(x_n))`` with ``w`` from
        :func:`topk_routing` (both spellings compute this; they differ in f32 summation
        order only).
    """
    fn = "moe"
    _float(fn, "x", x)
    if x.rank < 1:
        _fail(fn, f"x must be [N, D], got {x.type}")
    d = x.shape[-1]
    if router_w.rank != 2 or router_w.shape[1] != d:
        _fail(fn, f"router_w must be [E, {d}], got {router_w.type}")
    e = router_w.shape[0]
    if experts_gate.rank != 3 or experts_gate.shape[0] != e or experts_gate.shape[2] != d:
        _fail(fn, f"experts_gate must be [{e}, F, {d}], got {experts_gate.type}")
    f = experts_gate.shape[1]
    if experts_up.shape != (e, f, d):
        _fail(fn, f"experts_up must be [{e}, {f}, {d}], got {experts_up.type}")
    if experts_down.shape != (e, d, f):
        _fail(fn, f"experts_down must be [{e}, {d}, {f}], got {experts_down.type}")
    lead = x.shape[:-1]
    n = int(np.prod(lead, dtype=np.int64))
    xf = b.reshape(as_f32(b, x), [n, d])
    logits = linear(b, xf, router_w)
    sel = dict(bias=None, groups=1, topk_groups=None, group_score="top2_sum", scale=1.0)
    unknown = set(selection) - set(sel)
    if unknown:
        _fail(fn, f"unknown routing options {sorted(unknown)}")
    sel.update(selection)
    sel["topk_groups"] = _check_routing(logits, k, softmax_after_topk, scoring, sel["bias"],
                                        sel["groups"], sel["topk_groups"], sel["group_score"])
    w, rounds = _route(b, logits, k, normalize, softmax_after_topk, scoring, **sel)  # [N, E]
    if sparse is None:
        sparse = n * k < e
    if sparse:
        return b.reshape(_moe_sparse(b, xf, w, rounds, as_f32(b, experts_gate),
                                     as_f32(b, experts_up), as_f32(b, experts_down), act),
                         lead + (d,))
    xe = b.broadcast_to(xf, [e, n, d], dims=(1, 2))
    gate = b.matmul(xe, b.transpose(as_f32(b, experts_gate), [0, 2, 1]))  # [E, N, F]
    up = b.matmul(xe, b.transpose(as_f32(b, experts_up), [0, 2, 1]))
    h = activation(b, gate, act) * up
    y = b.matmul(h, b.transpose(as_f32(b, experts_down), [0, 2, 1]))  # [E, N, D]
    y = y * b.reshape(b.transpose(w, [1, 0]), [e, n, 1])
    return b.reshape(b.reduce("sum", y, 0), lead + (d,))
