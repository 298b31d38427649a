"""poot.dialects.quant_ref vs gguf.quants.dequantize: bitwise equal on random blocks."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from broken import random_blocks
from gguf.quants import dequantize as gguf_dequantize

from poot.dialects.quant import FORMATS
from poot.dialects.quant_ref import dequantize

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
