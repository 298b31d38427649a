"""Small step graphs for executor tests: a 'KV cache' carried across steps."""

from __future__ import annotations

from poot.dialects.types import DType, TensorType
from poot.graph.builder import Builder, TraceLimits

ROWS, WIDTH = 8, 4


def cache_step():
    """inputs x f32 [1, W], idx i32 [1, 1], cache f32 [R, W]; param w f32 [W, W].
    outputs y f32 [W] = column sums of the updated cache; cache = cache with row idx set to
    x @ w (an out-of-range idx writes nothing)."""
    b = Builder(TraceLimits(max_values=64, max_ops=64, max_literal_bytes=1024,
                            max_owned_bytes=1 << 20), name="cache_step")
    x = b.input("x", TensorType((1, WIDTH), DType.F32))
    idx = b.input("idx", TensorType((1, 1), DType.I32))
    cache = b.input("cache", TensorType((ROWS, WIDTH), DType.F32))
    w = b.param("w", TensorType((WIDTH, WIDTH), DType.F32))
    new = b.scatter(cache, idx, b.matmul(x, w))
    return b.finish({"y": b.reduce("sum", new, 0), "cache": new})
