"""poot.dialects.quant_ref vs gguf.quants.dequantize: bitwise equal on random blocks."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf.quants import dequantize as gguf_dequantize

from poot.dialects.quant import FORMATS, QuantFormat
from poot.dialects.quant_ref import dequantize

# Byte offsets of the f16 scale fields per block (ggml-common.h): random bytes there could be
# NaN/Inf, where "bitwise equal" would only test NaN propagation.
_F16_FIELDS = {"q4_0": [0], "q4_1": [0, 2], "q5_0": [0], "q5_1": [0, 2], "q8_0": [0],
               "q4_k": [0, 2], "q5_k": [0, 2], "q6_k": [208]}


def random_blocks(fmt: QuantFormat, n_blocks: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    b = rng.integers(0, 256, (n_blocks, fmt.block_bytes), dtype=np.uint8)
    for off in _F16_FIELDS[fmt.name]:
        scales = rng.uniform(-4, 4, n_blocks).astype(np.float16)
        b[:, off:off + 2] = scales.view(np.uint8).reshape(n_blocks, 2)
    return b


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_dequant_matches_gguf_bitwise(fmt):
    rows, blocks_per_row = 8, 16
    b = random_blocks(fmt, rows * blocks_per_row, seed=fmt.ggml_type)
    shape = (rows, blocks_per_row * fmt.block_elems)
    ours = dequantize(fmt, b, shape)
    ref = gguf_dequantize(b.reshape(rows, -1), gguf.GGMLQuantizationType(fmt.ggml_type))
    assert ours.dtype == np.float32 and ours.shape == shape
    assert np.all(np.isfinite(ours))
    assert np.array_equal(ours.view(np.uint32), ref.astype(np.float32).view(np.uint32))


def test_dequant_rejects_wrong_byte_count():
    fmt = FORMATS[0]
    with pytest.raises(ValueError):
        dequantize(fmt, np.zeros(fmt.block_bytes + 1, np.uint8), (1, fmt.block_elems))
