"""poot-rope-fusion: each RoPE rotation (half or interleaved pairs, with or without a
pass-through tail) becomes one ``rope`` dispatch, whatever the spelling (commuted products,
add of a negation, fma, op order), with bit-identical oracle results; rotations that are not
rotations, or whose pieces are used elsewhere, are left alone."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from poot import oracle
from poot.dialects.types import DType, TensorType
from poot.dialects.verify import verify_module
from poot.graph.builder import Builder, TraceLimits
from poot.passes.analysis import dispatch_kind, dispatch_report, functions, is_dispatch_function
from poot.passes.registry import build_pass_manager
from poot.passes.rope_fusion import rope_fusion

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
from model_steps import fixture_path  # noqa: E402

LIMITS = TraceLimits(max_values=100_000, max_ops=100_000, max_literal_bytes=1 << 22,
                     max_owned_bytes=1 << 30)
F32 = DType.F32
B, T, H, D = 1, 3, 2, 12


def rope_graph(layout="half", rot=8, spelling="traced", extra_out=None, sign=-1,
               other_x=False, other_cos=False):
    """x [B, T, H, D] rotated on its first ``rot`` channels with cos/sin [B, T, rot/2]."""
    rng = np.random.default_rng(1)
    b = Builder(LIMITS)
    half = rot // 2
    x = b.input("x", TensorType((B, T, H, D), F32))
    cos = b.input("cos", TensorType((B, T, half), F32))
    sin = b.input("sin", TensorType((B, T, half), F32))
    ins = {"x": rng.standard_normal((B, T, H, D)).astype(np.float32),
           "cos": rng.standard_normal((B, T, half)).astype(np.float32),
           "sin": rng.standard_normal((B, T, half)).astype(np.float32)}
    x2src = x
    if other_x:
        x2src = b.input("y", TensorType((B, T, H, D), F32))
        ins["y"] = rng.standard_normal((B, T, H, D)).astype(np.float32)
    c = b.reshape(cos, [B, T, 1, half])
    s = b.reshape(sin, [B, T, 1, half])
    c2 = b.reshape(b.input("cos2", TensorType((B, T, half), F32)), [B, T, 1, half]) \
        if other_cos else c
    if other_cos:
        ins["cos2"] = rng.standard_normal((B, T, half)).astype(np.float32)
    if layout == "half":
        a = b.slice_axis(x, 3, 0, half)
        bb = b.slice_axis(x2src, 3, half, rot)
    else:
        a = b.slice_axis(x, 3, 0, rot, 2)
        bb = b.slice_axis(x2src, 3, 1, rot, 2)
    outs = {}
    if spelling == "traced":
        first = a * c - bb * s if sign < 0 else a * c + bb * s
        second = bb * c2 + a * s
    elif spelling == "commuted":      # factor first, add of a negation, second half first
        second = s * a + c2 * bb
        first = -(s * bb) + c * a if sign < 0 else (s * bb) + c * a
    else:                             # fma
        first = b.ternary("fma", a, c, -(bb * s)) if sign < 0 else b.ternary("fma", a, c, bb * s)
        second = b.ternary("fma", bb, c2, a * s)
    if extra_out == "first":
        outs["leak"] = first
    if layout == "half":
        rotd = b.concat([first, second], axis=3)
    else:
        fe = b.reshape(first, [B, T, H, half, 1])
        so = b.reshape(second, [B, T, H, half, 1])
        rotd = b.reshape(b.concat([fe, so], axis=4), [B, T, H, rot])
    if rot < D:
        rotd = b.concat([rotd, b.slice_axis(x, 3, rot, D)], axis=3)
    g = b.finish({"out": rotd, **outs})
    return g, ins


def rope_calls(g) -> list[str]:
    return [dispatch_kind(f) for f in functions(g.module) if is_dispatch_function(f)]


POSITIVE = [(layout, rot, spelling) for layout in ("half", "interleaved")
            for rot in (12, 8) for spelling in ("traced", "commuted", "fma")]


@pytest.mark.parametrize("layout,rot,spelling", POSITIVE)
def test_rope_outlined_bit_exact(layout, rot, spelling):
    g, ins = rope_graph(layout, rot, spelling)
    ref = oracle.evaluate(g, ins)
    tr = []
    assert rope_fusion(g.module, tr) == 1
    assert tr[0][1] == layout
    g.module.operation.verify()
    assert verify_module(g.module) == []
    assert rope_calls(g) == ["rope"]
    assert dispatch_report(g.module) == {"rope": 1}       # nothing left outside the call
    got = oracle.evaluate(g, ins)
    assert np.array_equal(got["out"], ref["out"])


NEGATIVE = {
    "wrong sign (not a rotation)": dict(sign=+1),
    "pair from two tensors": dict(other_x=True),
    "different cos in the halves": dict(other_cos=True),
    "an intermediate leaves the group": dict(extra_out="first"),
}


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("name", list(NEGATIVE))
def test_rope_not_outlined(name, layout):
    g, _ = rope_graph(layout, 8, **NEGATIVE[name])
    before = str(g.module)
    assert rope_fusion(g.module) == 0
    assert str(g.module) == before


def test_misaligned_halves_not_outlined():
    """Halves (i, i + h + 1): slices that do not pair channels as RoPE does."""
    b = Builder(LIMITS)
    x = b.input("x", TensorType((1, 2, 2, 10), F32))
    c = b.input("c", TensorType((1, 2, 2, 4), F32))
    s = b.input("s", TensorType((1, 2, 2, 4), F32))
    x1, x2 = b.slice_axis(x, 3, 0, 4), b.slice_axis(x, 3, 5, 9)
    out = b.concat([x1 * c - x2 * s, x2 * c + x1 * s, b.slice_axis(x, 3, 8, 10)], axis=3)
    g = b.finish(out)
    assert rope_fusion(g.module) == 0


@pytest.mark.parametrize("fixture,layout", [("llama", "half"),
                                            ("llama_gguf_q4_1", "interleaved")])
@pytest.mark.parametrize("step", ["prefill", "decode"])
@pytest.mark.parametrize("pre", ["", "poot-canonicalize,poot-cse,"])
def test_traced_steps(fixture, layout, step, pre):
    from poot.models import StepSpec, load_model

    model, weights = load_model(fixture_path(fixture))
    assert model.config.rope_layout == layout
    spec = (StepSpec.prefill(8, kv_capacity=16) if step == "prefill"
            else StepSpec.decode(kv_capacity=16))
    g = model.trace(spec, weights.types)
    rng = np.random.default_rng(2)
    ins = {"tokens": rng.integers(0, 64, (1, spec.tokens)).astype(np.int32),
           "positions": (np.arange(spec.tokens)[None] + (0 if step == "prefill" else 7)
                         ).astype(np.int32),
           "block_table": np.zeros((1, 1), np.int32),
           "slot_mapping": (np.arange(spec.tokens) + (0 if step == "prefill" else 7)
                            ).astype(np.int32),
           **{n: rng.standard_normal(t.shape).astype(t.dtype.numpy)
              for n, t in g.inputs if n.startswith("kv.")}}
    ref = oracle.evaluate(g, ins, weights)
    pipeline = f"builtin.module({pre}poot-rope-fusion,poot-verify)"
    build_pass_manager(pipeline, g.context).run(g.module.operation)
    assert rope_calls(g).count("rope") == 2 * model.dims().n_layers     # q and k per layer
    got = oracle.evaluate(g, ins, weights)
    for k in ref:
        assert np.array_equal(got[k], ref[k]), k


def test_full_pipeline_keeps_rope_and_attention():
    from poot.models import StepSpec, load_model

    model, weights = load_model(fixture_path("llama"))
    g = model.trace(StepSpec.prefill(8, kv_capacity=16), weights.types)
    rng = np.random.default_rng(3)
    ins = {"tokens": rng.integers(0, 64, (1, 8)).astype(np.int32),
           "positions": np.arange(8)[None].astype(np.int32),
           "block_table": np.zeros((1, 1), np.int32), "slot_mapping": np.arange(8, dtype=np.int32),
           **{n: np.zeros(t.shape, t.dtype.numpy) for n, t in g.inputs if n.startswith("kv.")}}
    ref = oracle.evaluate(g, ins, weights)
    build_pass_manager("builtin.module(poot-canonicalize,poot-cse,poot-rope-fusion,"
                       "poot-flash-attention,poot-fuse-dispatch,poot-verify)",
                       g.context).run(g.module.operation)
    rep = dispatch_report(g.module)
    assert rep.get("rope") == 4 and rep.get("attention") == 2
    got = oracle.evaluate(g, ins, weights)
    for k in ref:
        assert np.abs(got[k] - ref[k]).max() <= 1e-6 * max(np.abs(ref[k]).max(), 1e-30), k


def test_rope_dispatch_compiles_on_cpu():
    """The outlined rope functions lower and run (CPU backend) like the oracle."""
    from poot.backends.cpu.codegen import compile_cpu

    for layout, rot in (("half", 8), ("interleaved", 12)):
        g, ins = rope_graph(layout, rot, "commuted")
        ref = oracle.evaluate(g, ins)
        assert rope_fusion(g.module) == 1
        got = compile_cpu(g).run(ins, {})
        assert np.abs(got["out"] - ref["out"]).max() <= 1e-5 * np.abs(ref["out"]).max()
