"""Storage formats of the paged KV cache: the float dtypes (f32, f16, bf16) and ``q8_0``.

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
        group: values per scale, along the head dim.
        values: the dtype of the quantized values plane; scales: the dtype of the scales.
    """

    value: str
    group: int
    values: DType
    scales: DType

    @property
    def value_bytes(self) -> float:
        """Bytes one stored value takes, its share of the scale included (q8_0: 34 / 32)."""
        return self.values.itemsize + self.scales.itemsize / self.group

    def planes(self, shape: tuple[int, ...]) -> tuple[TensorType, TensorType]:
        """The values and scales types of a pool of logical ``shape`` ``[..., D]``
        (``D`` a multiple of :attr:`group`; ValueError otherwise)."""
        *lead, d = shape
        if d % self.group:
            raise ValueError(f"{self.value} needs a head dim that is a multiple of "
                             f"{self.group}, got {d}")
        return (TensorType(tuple(shape), self.values),
                TensorType(tuple(lead) + (d // self.group,), self.scales))

    def __str__(self) -> str:
        return self.value


Q8_0 = KvQuant("q8_0", 32, DType.I8, DType.F16)
#: fp8 (e4m3) with one scale per head (vLLM's ``kv_cache_dtype="fp8"``): named so that a
#: request for it is refused by planning, with a reason, on targets whose kernels lack it
#: (every target of this version: no backend lists it in ``Capabilities.kv_formats``).
FP8 = KvQuant("fp8", 0, DType.I8, DType.F32)

#: A KV pool's storage: a float dtype or a block-quantized format.
KvDType = DType | KvQuant

#: Every KV storage format by the name options give it.
KV_FORMATS: dict[str, KvDType] = {"f32": DType.F32, "f16": DType.F16, "bf16": DType.BF16,
                                  "q8_0": Q8_0, "fp8": FP8}


def kv_value_bytes(fmt: KvDType) -> float:
    """Bytes one KV value takes in storage ``fmt`` (scales included)."""
    if fmt is FP8:
        return 1.0
    return fmt.value_bytes if isinstance(fmt, KvQuant) else float(fmt.itemsize)


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


__all__ = ["FP8", "KV_FORMATS", "KvDType", "KvQuant", "Q8_0", "dequantize_q8_0", "kv_value_bytes",
           "quantize_q8_0"]
