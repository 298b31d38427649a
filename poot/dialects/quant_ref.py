"""Numpy reference dequantization of ggml block formats (test-side oracle, not a fast path).

Layouts follow ggml's ``ggml-common.h`` block structs and ``dequantize_row_*`` in
``ggml-quants.c`` (llama.cpp); all multi-byte fields are little-endian, ``d``/``m``/``dmin``
are IEEE half floats, arithmetic is float32 in the C reference's operation order (so results
are bitwise equal to ggml and to ``gguf.quants.dequantize``).

=======  =====  =========================================================================
format   bytes  block (elements per block)
=======  =====  =========================================================================
Q4_0     18     d, qs[16]: x[j] = (lo4(qs[j]) - 8) * d, x[j+16] = (hi4(qs[j]) - 8) * d  (32)
Q4_1     20     d, m, qs[16]: x = q * d + m                                              (32)
Q5_0     22     d, qh u32, qs[16]: 5th bit of x[j] is bit j of qh; x = (q - 16) * d      (32)
Q5_1     24     d, m, qh u32, qs[16]: x = q * d + m                                      (32)
Q8_0     34     d, qs int8[32]: x = qs * d                                               (32)
Q4_K     144    d, dmin, scales[12] (8 x 6-bit scale/min), qs[128]                      (256)
Q5_K     176    d, dmin, scales[12], qh[32], qs[128]                                    (256)
Q6_K     210    ql[128], qh[64], scales int8[16], d                                     (256)
=======  =====  =========================================================================
"""

from __future__ import annotations

import numpy as np

from poot.dialects.quant import BY_NAME, Quant, QuantFormat
from poot.dialects.quant_layout import deinterleave


def dequantize(fmt: QuantFormat, data: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Dequantize packed bytes to float32.

    Args:
        fmt: the block format (a row-interleaved one, :mod:`poot.dialects.quant_layout`,
            is deinterleaved first).
        data: ``uint8`` bytes of whole blocks, any shape, C-contiguous order = storage order.
        shape: logical shape of the result (numpy order); ``shape[-1]`` is a multiple of
            ``fmt.block_elems``.
    Returns:
        float32 array of ``shape``.
    Raises:
        ValueError: unknown format, or a byte count that does not match ``shape``.
    """
    shape = tuple(int(d) for d in shape)
    if fmt.rows > 1:        # a row-interleaved layout: ggml's blocks, regrouped
        return dequantize(BY_NAME[fmt.base], deinterleave(fmt, data, shape), shape)
    nbytes = fmt.packed_bytes(shape)
    raw = np.ascontiguousarray(data, dtype=np.uint8).reshape(-1)
    if raw.size != nbytes:
        raise ValueError(f"{fmt.name}: {raw.size} bytes do not hold {list(shape)} "
                         f"({nbytes} bytes)")
    fn = _DEQUANT.get(fmt.name)
    if fn is None:
        raise ValueError(f"no reference dequantization for {fmt.name}")
    blocks = raw.reshape(-1, fmt.block_bytes)
    return fn(blocks).reshape(shape)


def _f16(b: np.ndarray) -> np.ndarray:
    """Two bytes per row -> float32 column of shape [n, 1]."""
    return np.ascontiguousarray(b).view("<f2").astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """[n, 16] bytes -> [n, 32] 4-bit values: low nibbles first, then high nibbles."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)


def _qh_bits(qh: np.ndarray) -> np.ndarray:
    """[n, 4] bytes of a little-endian u32 -> [n, 32] bits, bit j in column j."""
    return np.unpackbits(qh, axis=1, bitorder="little")


def _q4_0(b: np.ndarray) -> np.ndarray:
    d = _f16(b[:, 0:2])
    q = _nibbles(b[:, 2:18]).astype(np.int8) - np.int8(8)
    return q.astype(np.float32) * d


def _q4_1(b: np.ndarray) -> np.ndarray:
    d, m = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    return _nibbles(b[:, 4:20]).astype(np.float32) * d + m


def _q5_0(b: np.ndarray) -> np.ndarray:
    d = _f16(b[:, 0:2])
    q = _nibbles(b[:, 6:22]) | (_qh_bits(b[:, 2:6]) << 4)
    return (q.astype(np.int8) - np.int8(16)).astype(np.float32) * d


def _q5_1(b: np.ndarray) -> np.ndarray:
    d, m = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    q = _nibbles(b[:, 8:24]) | (_qh_bits(b[:, 4:8]) << 4)
    return q.astype(np.float32) * d + m


def _q8_0(b: np.ndarray) -> np.ndarray:
    d = _f16(b[:, 0:2])
    return np.ascontiguousarray(b[:, 2:34]).view(np.int8).astype(np.float32) * d


def _k_scale_min(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml ``get_scale_min_k4`` for all 8 sub-blocks: [n, 12] bytes -> two [n, 8] uint8.

    Sub-block j < 4: scale = s[j] & 63, min = s[j+4] & 63. j >= 4: the low 4 bits come from
    s[j+4] (scale: low nibble, min: high nibble), the top 2 bits from s[j-4] / s[j] >> 6.
    """
    lo_sc, lo_m = s[:, 0:4] & 63, s[:, 4:8] & 63
    hi_sc = (s[:, 8:12] & 0x0F) | ((s[:, 0:4] >> 6) << 4)
    hi_m = (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)
    return np.concatenate([lo_sc, hi_sc], axis=1), np.concatenate([lo_m, hi_m], axis=1)


def _k_affine(b: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Q4_K/Q5_K: y = (d * scale_j) * q - (dmin * min_j) per 32-element sub-block j."""
    n = b.shape[0]
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, m = _k_scale_min(b[:, 4:16])
    d1 = (d * sc.astype(np.float32)).reshape(n, 8, 1)
    m1 = (dmin * m.astype(np.float32)).reshape(n, 8, 1)
    return (d1 * q.reshape(n, 8, 32).astype(np.float32) - m1).reshape(n, 256)


def _k_low_nibbles(qs: np.ndarray) -> np.ndarray:
    """[n, 128] bytes -> [n, 256]: 64-element chunk c is low nibbles of qs[32c:32c+32]
    followed by their high nibbles."""
    n = qs.shape[0]
    c = qs.reshape(n, 4, 1, 32)
    return np.concatenate([c & 0x0F, c >> 4], axis=2).reshape(n, 256)


def _q4_k(b: np.ndarray) -> np.ndarray:
    return _k_affine(b, _k_low_nibbles(b[:, 16:144]))


def _q5_k(b: np.ndarray) -> np.ndarray:
    n = b.shape[0]
    # Sub-block j (32 elements) takes its 5th bit from bit j of qh[l], l = 0..31.
    qh = b[:, 16:48].reshape(n, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
    q = _k_low_nibbles(b[:, 48:176]) | ((qh & 1) << 4).reshape(n, 256)
    return _k_affine(b, q)


def _q6_k(b: np.ndarray) -> np.ndarray:
    n = b.shape[0]
    ql, qh = b[:, 0:128].reshape(n, 2, 64), b[:, 128:192].reshape(n, 2, 1, 32)
    sc = np.ascontiguousarray(b[:, 192:208]).view(np.int8).astype(np.float32)
    d = _f16(b[:, 208:210])
    # Per 128-element half: 4 groups of 32; group g's low 4 bits are the low (g<2) or high
    # (g>=2) nibbles of ql[32*(g%2):+32], its top 2 bits are bits 2g..2g+1 of qh[0:32].
    lo = np.concatenate([ql[:, :, 0:32] & 0x0F, ql[:, :, 32:64] & 0x0F,
                         ql[:, :, 0:32] >> 4, ql[:, :, 32:64] >> 4], axis=2).reshape(n, 2, 4, 32)
    hi = (qh >> (2 * np.arange(4, dtype=np.uint8)).reshape(1, 1, 4, 1)) & 3
    q = ((lo | (hi << 4)).astype(np.int8) - np.int8(32)).astype(np.float32)
    scale = (d * sc).reshape(n, 16, 1)  # one scale per 16 elements
    return (scale * q.reshape(n, 16, 16)).reshape(n, 256)


_DEQUANT = {
    Quant.Q4_0.value.name: _q4_0, Quant.Q4_1.value.name: _q4_1, Quant.Q5_0.value.name: _q5_0,
    Quant.Q5_1.value.name: _q5_1, Quant.Q8_0.value.name: _q8_0, Quant.Q4_K.value.name: _q4_k,
    Quant.Q5_K.value.name: _q5_k, Quant.Q6_K.value.name: _q6_k,
}
