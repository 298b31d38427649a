"""Storage formats of the paged KV cache: the float dtypes (f32, f16, bf16), ``q8_0`` and ``fp8``.

``q8_0`` is GGUF's Q8_0 quantization applied to the KV cache (llama.cpp's ``-ctk/-ctv q8_0``):
each run of 32 consecutive values of one head of one position (a *group*, along the head dim
D) is stored as 32 int8 ``q`` and one f16 scale ``d``, and read as ``f32(q) * f32(d)``.
Quantizing (``quantize_row_q8_0_ref`` of ggml): ``amax = max |x|`` over the group,
``d = amax / 127`` (f32), ``q = round(x * (1 / d))`` (0 when ``d == 0``; rounded half away
from zero, spelled ``trunc(v + copysign(0.5, v))``), ``d`` stored rounded to f16.

Memory layout: a q8_0 pool ``[NB, bs, H, D]`` is two planes, the values ``i8 [NB, bs, H, D]``
(step input ``kv.{i}.k``) and the scales ``f16 [NB, bs, H, D / 32]`` (``kv.{i}.k_scale``),
both indexed by block like every pool; GGUF interleaves each group's scale with its 32
values in one 34-byte block, the planes keep the values 32-byte aligned for vector loads. The
bytes are the same: 34 per 32 values, 1.0625 a value (f16: 2).

``fp8`` is OCP FP8 E4M3 (``e4m3fn``: max 448, no infinities, one NaN pattern) with one f32
scale per head vector (a position's ``D`` values of one KV head; vLLM's
``kv_cache_dtype="fp8"`` with per-head scales): ``s = amax / 448`` over the vector,
``q = e4m3fn(x / s)`` rounded to nearest even and saturated to +-448 (0 where ``s == 0``),
read as ``f32(q) * s``. Layout: the values ``i8 [NB, bs, H, D]`` (the e4m3fn bit patterns)
and the scales ``f32 [NB, bs, H, 1]``: ``D + 4`` bytes a head vector. Kernels read it only
where the device converts e4m3 in hardware (CUDA sm_89 and newer: PTX
``cvt.rn.f16x2.e4m3x2`` / ``cvt.rn.satfinite.e4m3x2.f32``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from poot.dialects.types import DType, TensorType


@dataclass(frozen=True)
class KvQuant:
    """A block-quantized KV storage format.

    Attributes:
        value: its name (``"q8_0"``), as options spell it.
        group: values per scale, along the head dim; 0: one scale per head vector (fp8).
        values: the dtype of the quantized values plane; scales: the dtype of the scales.
    """

    value: str
    group: int
    values: DType
    scales: DType

    def value_bytes(self, width: int) -> float:
        """Bytes one stored value of a head vector of ``width`` values takes, its share of the
        scale included (q8_0: 34 / 32; fp8: 1 + 4 / width)."""
        return self.values.itemsize + self.scales.itemsize / (self.group or width)

    def planes(self, shape: tuple[int, ...]) -> tuple[TensorType, TensorType]:
        """The values and scales types of a pool of logical ``shape`` ``[..., D]``
        (``D`` a multiple of :attr:`group`; ValueError otherwise); fp8's scales
        ``[..., 1]``."""
        *lead, d = shape
        if not self.group:
            return (TensorType(tuple(shape), self.values),
                    TensorType(tuple(lead) + (1,), self.scales))
        if d % self.group:
            raise ValueError(f"{self.value} needs a head dim that is a multiple of "
                             f"{self.group}, got {d}")
        return (TensorType(tuple(shape), self.values),
                TensorType(tuple(lead) + (d // self.group,), self.scales))

    def __str__(self) -> str:
        return self.value


Q8_0 = KvQuant("q8_0", 32, DType.I8, DType.F16)
#: fp8 (e4m3fn bit patterns) with one f32 scale per head vector (module doc); a target
#: whose kernels lack it (no ``"fp8"`` in ``Capabilities.kv_formats``) refuses it in planning.
FP8 = KvQuant("fp8", 0, DType.I8, DType.F32)
#: The largest finite e4m3fn value.
FP8_MAX = 448.0

#: A KV pool's storage: a float dtype or a block-quantized format.
KvDType = DType | KvQuant

#: Every KV storage format by the name options give it.
KV_FORMATS: dict[str, KvDType] = {"f32": DType.F32, "f16": DType.F16, "bf16": DType.BF16,
                                  "q8_0": Q8_0, "fp8": FP8}


def kv_value_bytes(fmt: KvDType, width: int) -> float:
    """Bytes one KV value takes in storage ``fmt`` (scales included), in head vectors of
    ``width`` values (the head dim; multi-head latent attention's latent width)."""
    return fmt.value_bytes(width) if isinstance(fmt, KvQuant) else float(fmt.itemsize)


def quantize_q8_0(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``x`` float ``[..., D]`` (D a multiple of 32) as q8_0 (module doc): ``(q int8 [..., D],
    d float16 [..., D / 32])``."""
    x = np.asarray(x, np.float32)
    g = x.reshape(x.shape[:-1] + (x.shape[-1] // 32, 32))
    d = np.max(np.abs(g), axis=-1, keepdims=True) / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(d > 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    v = g * inv
    q = np.trunc(v + np.where(v < 0, np.float32(-0.5), np.float32(0.5))).astype(np.int8)
    return q.reshape(x.shape), d[..., 0].astype(np.float16)


def dequantize_q8_0(q: np.ndarray, d: np.ndarray) -> np.ndarray:
    """f32 ``[..., D]``: ``f32(q) * f32(d)`` of q8_0 values ``q`` int8 ``[..., D]`` and scales
    ``d`` float16 ``[..., D / 32]``."""
    scale = np.repeat(np.asarray(d).astype(np.float32), 32, axis=-1)
    with np.errstate(invalid="ignore"):       # 0 * inf: a stale block's scale, masked later
        return (np.asarray(q).astype(np.float32) * scale).astype(np.float32)


def quantize_fp8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``x`` float ``[..., D]`` as fp8 (module doc): ``(q int8 [..., D]`` (e4m3fn bit
    patterns), ``s float32 [..., 1])``; the rounding is ``ml_dtypes.float8_e4m3fn``'s (to
    nearest even), after saturating to +-448 (``x / s`` may round past it)."""
    x = np.asarray(x, np.float32)
    s = (np.max(np.abs(x), axis=-1, keepdims=True) / np.float32(FP8_MAX)).astype(np.float32)
    return encode_fp8(x, s), s


def encode_fp8(x: np.ndarray, s: np.ndarray) -> np.ndarray:
    """int8 ``[..., D]``: the e4m3fn bit patterns of ``x / s`` (f32 ``[..., D]`` over f32
    ``[..., 1]``; 0 where ``s == 0``), saturated to +-448 then rounded to nearest even
    (``ml_dtypes.float8_e4m3fn``): PTX ``cvt.rn.satfinite.e4m3x2.f32``'s numbers."""
    import ml_dtypes

    x, s = np.asarray(x, np.float32), np.asarray(s, np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        v = np.where(s > 0, x / s, np.float32(0)).astype(np.float32)
    v = np.clip(v, -FP8_MAX, FP8_MAX)
    return v.astype(ml_dtypes.float8_e4m3fn).view(np.int8)


def dequantize_fp8(q: np.ndarray, s: np.ndarray) -> np.ndarray:
    """f32 ``[..., D]``: ``f32(q) * s`` of fp8 values ``q`` int8 ``[..., D]`` (e4m3fn bit
    patterns) and scales ``s`` float32 ``[..., 1]``."""
    import ml_dtypes

    v = np.asarray(q).view(np.int8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    with np.errstate(invalid="ignore"):       # 0 * inf: a stale block's scale, masked later
        return (v * np.asarray(s, np.float32)).astype(np.float32)


__all__ = ["FP8", "FP8_MAX", "dequantize_fp8", "encode_fp8", "quantize_fp8", "KV_FORMATS", "KvDType", "KvQuant", "Q8_0", "dequantize_q8_0", "kv_value_bytes",
           "quantize_q8_0"]
