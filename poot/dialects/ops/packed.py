"""Decoding packed weights.

``poot.dequantize`` is a primitive because a block format is a storage encoding that no
composition of dense ops can read: it turns ``!poot.packed`` into a dense tensor. Lowerings
fuse it into the consuming matmul so that no dense copy of the weight is materialized.
"""

from __future__ import annotations

import numpy as np

from poot.dialects.opdef import OpDef, register
from poot.dialects.quant_ref import dequantize  # numpy reference per format
from poot.dialects.types import PackedType, TensorType


@register
class Dequantize(OpDef):
    """Decode a packed weight to a float tensor of the same logical shape."""

    name = "dequantize"
    operands = ("packed",)
    packed_operands = ("packed",)
    summary = "decode a packed quantized weight to a float tensor"

    @classmethod
    def check(cls, operands, attrs, result):
        cls.check_attrs(attrs)
        p = operands[0]
        if not isinstance(p, PackedType):
            cls.fail(f"operand must be !poot.packed, got {p}")
        r = cls.need_result(result)
        if r.shape != p.shape or not r.dtype.is_float:
            cls.fail(f"result {r} must be a float tensor of shape {list(p.shape)}")
        return r

    @classmethod
    def evaluate(cls, args, attrs, result: TensorType):
        raw, fmt = args[0]
        return dequantize(fmt, raw, result.shape).astype(result.dtype.numpy)


def packed_value(raw: np.ndarray, t: PackedType):
    """The oracle's runtime value for a packed weight: (uint8 bytes, format)."""
    if raw.dtype != np.uint8 or raw.size != t.nbytes:
        raise ValueError(f"packed weight {t} needs {t.nbytes} uint8 bytes, got "
                         f"{raw.size} x {raw.dtype}")
    return (raw.reshape(-1), t.format)
