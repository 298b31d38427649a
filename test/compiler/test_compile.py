"""compile(): typed refusals from planning, legalization for the target, limits, storage."""

from dataclasses import replace

import numpy as np
import pytest

from poot.compiler import (CompileLimitExceeded, CompileLimits, CompileOptions, Refusal,
                           compile, host_cpu)
from poot.compiler.target import Target
from poot.dialects.quant import Quant
from poot.dialects.types import DType, PackedType, TensorType
from poot.graph import Builder, TraceLimits, ops
from poot.oracle import evaluate

LIMITS = TraceLimits(max_values=4096, max_ops=4096, max_literal_bytes=1 << 16,
                     max_owned_bytes=1 << 26)


def _half_linear(dtype):
    b = Builder(LIMITS)
    x = b.input("x", TensorType((2, 32), DType.F32))
    w = b.param("w", TensorType((8, 32), dtype))
    h = b.cast(b.unary("exp", b.cast(x, dtype)), DType.F32)  # half-precision arithmetic
    return b.finish({"y": ops.linear(b, h, w)})


def test_refusal_names_op_and_missing_dtype():
    """A 16-bit float is widened where f32 can be stored (next test); without f32 storage
    either, there is nothing to widen to and planning refuses, naming the op and dtype."""
    g = _half_linear(DType.F16)
    caps = host_cpu().caps.without_dtype(DType.F16)
    no_float = Target("cpu", replace(caps, storage_dtypes=caps.storage_dtypes - {DType.F32}))
    with pytest.raises(Refusal) as e:
        compile(g, no_float, CompileOptions(fuse=False))
    assert e.value.capability in ("f16 storage", "f32 storage")
    assert e.value.op.startswith("poot.")
    assert e.value.capability in str(e.value) and e.value.op in str(e.value)


@pytest.mark.parametrize("dtype", [DType.F16, DType.BF16])
def test_half_storage_is_widened_to_f32_where_the_target_has_none(dtype):
    """poot-legalize's storage rule (planning.storage_type): on a target that stores f32 but
    not ``dtype``, every value of ``dtype`` is stored as f32 -- the weight's planned storage
    and every type in the module -- so the half-precision casts keep no rounding: the step
    equals numpy's f32 computation on the same (16-bit-valued) weights."""
    from poot.compiler.planning import storage_type

    g = _half_linear(dtype)
    t = Target("cpu", host_cpu().caps.without_dtype(dtype))
    prog = compile(g, t, CompileOptions(fuse=False))
    assert {b.name: b.type for b in prog.storage}["w"] == TensorType((8, 32), DType.F32)
    assert storage_type(TensorType((8, 32), dtype), t.caps) == TensorType((8, 32), DType.F32)
    assert storage_type(TensorType((8, 32), dtype), host_cpu().caps).dtype == dtype
    assert f"x{dtype.value}" not in prog.ir_text
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 32)).astype(np.float32) * 0.5
    w = rng.standard_normal((8, 32)).astype(dtype.numpy).astype(np.float32)
    out = prog.run({"x": x}, {"w": w})["y"]
    np.testing.assert_allclose(out, np.exp(x) @ w.T, rtol=1e-5, atol=1e-5)


def test_refusal_for_packed_format_without_decoder():
    b = Builder(LIMITS)
    x = b.input("x", TensorType((1, 256), DType.F32))
    w = b.param("w", PackedType(Quant.Q4_K.value, (4, 256)))
    g = b.finish({"y": ops.linear(b, x, w)})
    only_q8 = Target("cpu", replace(host_cpu().caps, packed_formats=frozenset({"q8_0"})))
    with pytest.raises(Refusal) as e:
        compile(g, only_q8, CompileOptions(fuse=False))
    assert e.value.op == "poot.dequantize"
    assert "q4_k" in e.value.capability


@pytest.mark.parametrize("dtype", [DType.F16, DType.BF16])
def test_half_compute_is_legalized_to_f32_and_matches_oracle(dtype):
    g = _half_linear(dtype)
    prog = compile(g, host_cpu(), CompileOptions(fuse=False))
    assert f"\"poot.unary\"(%" in prog.ir_text
    # after legalization no arithmetic runs in the half dtype
    for line in prog.ir_text.splitlines():
        if '"poot.unary"' in line or '"poot.matmul"' in line:
            assert f"x{dtype.value}>" not in line.split("->")[0], line
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 32)).astype(np.float32) * 0.5
    w = rng.standard_normal((8, 32)).astype(dtype.numpy)
    ref = evaluate(g, {"x": x}, {"w": w})["y"]
    out = prog.run({"x": x}, {"w": w})["y"]
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_graph_limit_is_a_typed_error_before_codegen():
    g = _half_linear(DType.F16)
    tiny = CompileOptions(limits=CompileLimits(max_graph_ops=3, max_kernel_ops=8,
                                               max_artifact_bytes=1 << 20))
    with pytest.raises(CompileLimitExceeded) as e:
        compile(g, host_cpu(), tiny)
    assert e.value.resource == "graph_ops" and e.value.limit == 3 and e.value.attempted > 3


def test_limits_must_be_finite_and_positive():
    with pytest.raises(ValueError):
        CompileLimits(max_graph_ops=0, max_kernel_ops=1, max_artifact_bytes=1)


def test_scatter_output_aliases_its_input():
    b = Builder(LIMITS)
    cache = b.input("cache", TensorType((4, 8), DType.F32))
    idx = b.input("idx", TensorType((1, 1), DType.I32))
    upd = b.input("upd", TensorType((1, 8), DType.F32))
    g = b.finish({"cache_out": b.scatter(cache, idx, upd)})
    prog = compile(g, host_cpu(), CompileOptions(fuse=False))
    out = {x.name: x for x in prog.storage if x.role == "output"}
    assert out["cache_out"].aliases == "cache"
    res = prog.run({"cache": np.zeros((4, 8), np.float32), "idx": np.array([[2]], np.int32),
                    "upd": np.ones((1, 8), np.float32)})["cache_out"]
    assert res[2].sum() == 8 and res.sum() == 8
