"""Row-interleaved layouts of ggml's Q4_0, Q4_1 and Q8_0 (``q4_0_r16``, ``q4_1_r16``,
``q8_0_r16``): the same blocks, regrouped at load time so that the CPU's integer kernels read
16 W rows' block in the order their dot products consume it, with no shuffle or transpose in
the kernel (the "repacking" llama.cpp does for its ``Q4_0_8x8`` CPU path and Marlin does on
GPUs; IREE's data tiling is the compiler form of the same idea).

A weight of logical shape ``[N, K]`` (N a multiple of 16, K of 32; ``NB = K / 32`` blocks a
row) is stored as ``N / 16`` tiles of 16 rows, each as ``NB`` tile blocks, tile ``t``'s block
``b`` at byte ``(t * NB + b) * 16 * block_bytes``. A tile block of rows ``16 t + j``:

* ``d[16]`` (f16, row j's block scale at byte ``2 j``), then for Q4_1 ``m[16]`` (f16, at
  ``32 + 2 j``): ``S`` = 32 (Q4_0, Q8_0) or 64 (Q4_1) bytes;
* the weights in chunks of 64 bytes, byte ``S + 64 c + 4 j + e`` of chunk c holding row j's
  ggml block byte ``4 c + e``. Q4 (4 chunks): that byte holds element ``4 c + e`` in its low
  nibble and ``16 + 4 c + e`` in its high nibble (ggml's block holds element ``p`` and
  ``16 + p`` in byte ``p``: the nibbles are kept, the bytes moved); Q8_0 (8 chunks): element
  ``4 c + e`` itself, a signed byte.

So lane j (4 bytes) of a chunk is row j's 4 elements of one x word (Q4: the low nibbles of
chunk c are the elements ``4 c .. 4 c + 3``, the high ones ``16 + 4 c ..``): one 512-bit
``vpdpbusd`` operand against four x bytes broadcast to all lanes, and the 8 x 64 bytes of a
block are an AMX B tile in VNNI order. The byte count is ggml's, and the decoded values are
ggml's exactly (:func:`poot.dialects.quant_ref.dequantize` decodes them).
"""

from __future__ import annotations

import numpy as np

from poot.dialects.quant import BY_NAME, QuantFormat
from poot.dialects.types import PackedType

#: W rows of one tile
ROWS = 16


#: the ggml formats with a row-interleaved layout -> bytes of their block's weights
WEIGHT_BYTES = {"q4_0": 16, "q4_1": 16, "q8_0": 32}


def scale_bytes(fmt: QuantFormat) -> int:
    """Bytes of a block's f16 scale (and Q4_1's min) ahead of its weights."""
    return fmt.block_bytes - WEIGHT_BYTES[fmt.base or fmt.name]


def _check(fmt: QuantFormat, raw: np.ndarray, shape: tuple[int, ...]) -> tuple[int, int, int]:
    if len(shape) != 2 or shape[0] % ROWS or shape[1] % 32:
        raise ValueError(f"{fmt.name}: a row-interleaved weight is [N, K] with N a multiple "
                         f"of {ROWS} and K of 32, not {list(shape)}")
    n, k = (int(d) for d in shape)
    if raw.size != n * k // 32 * fmt.block_bytes:
        raise ValueError(f"{fmt.name}: {raw.size} bytes do not hold {list(shape)}")
    return n // ROWS, k // 32, fmt.block_bytes


def interleave(base: QuantFormat, data: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """ggml ``base`` bytes (Q4_0 / Q4_1 / Q8_0) of an ``[N, K]`` weight in its ``_r16`` layout
    (module doc): a new ``uint8`` array of the same size. Raises ValueError for another
    format or a shape the layout does not take."""
    if base.name not in WEIGHT_BYTES:
        raise ValueError(f"no row-interleaved layout of {base.name}")
    raw = np.ascontiguousarray(data, dtype=np.uint8).reshape(-1)
    t, nb, bb = _check(base, raw, shape)
    s = scale_bytes(base)
    blocks = raw.reshape(t, ROWS, nb, bb).transpose(0, 2, 1, 3)       # [T, NB, 16, bb]
    scales = blocks[..., :s].reshape(t, nb, ROWS, s // 2, 2).transpose(0, 1, 3, 2, 4)
    qs = blocks[..., s:].reshape(t, nb, ROWS, -1, 4).transpose(0, 1, 3, 2, 4)
    return np.concatenate([scales.reshape(t, nb, -1), qs.reshape(t, nb, -1)],
                          axis=-1).reshape(-1)


def deinterleave(fmt: QuantFormat, data: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The ggml bytes of an ``[N, K]`` weight stored in the row-interleaved ``fmt``: the
    inverse of :func:`interleave`."""
    base = BY_NAME[fmt.base] if fmt.base else None
    if base is None or fmt.rows != ROWS:
        raise ValueError(f"{fmt.name} is not a row-interleaved layout")
    raw = np.ascontiguousarray(data, dtype=np.uint8).reshape(-1)
    t, nb, bb = _check(fmt, raw, shape)
    s = scale_bytes(base)
    tiles = raw.reshape(t, nb, ROWS * bb)
    scales = tiles[..., :ROWS * s].reshape(t, nb, s // 2, ROWS, 2).transpose(0, 1, 3, 2, 4)
    q = bb - s
    qs = tiles[..., ROWS * s:].reshape(t, nb, q // 4, ROWS, 4).transpose(0, 1, 3, 2, 4)
    blocks = np.concatenate([scales.reshape(t, nb, ROWS, s), qs.reshape(t, nb, ROWS, q)],
                            axis=-1)
    return np.ascontiguousarray(blocks.transpose(0, 2, 1, 3)).reshape(-1)


def stored_layout(fmt: QuantFormat, shape: tuple[int, ...],
                  layouts: frozenset[str]) -> QuantFormat | None:
    """The row-interleaved layout among ``layouts`` (format names) a weight of ggml format
    ``fmt`` and ``shape`` is stored in, or None: 2-D, N a multiple of 16, K of 32."""
    name = f"{fmt.name}_r{ROWS}"
    if name not in layouts or len(shape) != 2 or shape[0] % ROWS or shape[1] % 32 \
            or not shape[0]:
        return None
    return BY_NAME[name]


def to_stored(array, t, stored):
    """``array`` (the bytes or values of a weight of poot type ``t``) as the target stores a
    weight of type ``stored`` (:func:`poot.compiler.planning.storage_type`): repacked into a
    row-interleaved layout where the packed format changes, else unchanged (a dtype change
    is the device upload's cast)."""
    if isinstance(t, PackedType) and isinstance(stored, PackedType) and \
            stored.format is not t.format:
        if stored.format.base != t.format.name:
            raise ValueError(f"cannot store {t.format.name} as {stored.format.name}")
        return interleave(t.format, np.asarray(array), t.shape)
    return array


__all__ = ["ROWS", "WEIGHT_BYTES", "deinterleave", "interleave", "scale_bytes", "stored_layout",
           "to_stored"]
