"""fp8 KV pools (:mod:`poot.dialects.kv_quant`: e4m3fn values, one f32 scale per head vector)
on CUDA sm_89+: the numpy reference quantization against ``ml_dtypes``, the paged-attention
oracle against a straight numpy dequantize-then-attend, planning (accepted on sm_90 and sm_89,
a typed refusal naming the option everywhere else, before compiling), and the PTX of the
flash-decoding kernels (the 1B and SmolLM2 shapes) and of a traced step: the hardware e4m3
conversions, assembled by ptxas for sm_90 and sm_89 without spills. Device numerics: the
bundle of bench/cuda_bundle.py (``paged_fp8``, ``model_fp8``), run on a GPU."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

ml_dtypes = pytest.importorskip("ml_dtypes")

from poot.dialects.kv_quant import FP8, dequantize_fp8, quantize_fp8  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _ref_quantize(x: np.ndarray):
    """fp8 by hand: per vector s = max|x| / 448, x / s saturated, rounded by ml_dtypes."""
    s = np.abs(x).max(-1, keepdims=True).astype(np.float32) / np.float32(448)
    v = np.zeros_like(x)
    np.divide(x, s, out=v, where=s > 0)
    v = np.clip(v, -448, 448).astype(ml_dtypes.float8_e4m3fn)
    return v.view(np.uint8), s


def test_reference_quantize_bytes_match_ml_dtypes():
    """quantize_fp8's bytes and scales equal the hand quantization (ml_dtypes' rounding to
    nearest even, saturating); the vector's max maps to 448 (0x7e), a zero vector to zeros,
    and every byte decodes back within half an e4m3 step of x / s."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((5, 3, 64)) * np.exp(rng.uniform(-8, 8, (5, 3, 1)))).astype(
        np.float32)
    x[0, 0] = 0.0
    q, s = quantize_fp8(x)
    want_q, want_s = _ref_quantize(x)
    assert q.dtype == np.int8 and s.dtype == np.float32 and s.shape == (5, 3, 1)
    np.testing.assert_array_equal(q.view(np.uint8), want_q)
    np.testing.assert_array_equal(s, want_s)
    assert not q[0, 0].any()
    top = np.abs(x).argmax(-1)
    assert (np.take_along_axis(q.view(np.uint8) & 0x7F, top[..., None], -1)[1:] == 0x7E).all()
    back = dequantize_fp8(q, s)
    assert np.all(np.abs(back - x) <= np.abs(x) / 16 + s * 2.0 ** -9)


def test_encode_round_trips_every_code_and_rounds_ties_to_even():
    """encode_fp8 maps each of the 254 finite e4m3fn values (scale 1) back to its own code,
    ties go to the even code (1.0625 -> 1.0, 1.1875 -> 1.25, half the least subnormal -> 0),
    beyond 448 saturates."""
    from poot.dialects.kv_quant import encode_fp8

    codes = np.arange(256, dtype=np.uint8)
    vals = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    fin = np.isfinite(vals)
    assert fin.sum() == 254
    one = np.ones((int(fin.sum()), 1), np.float32)
    got = encode_fp8(vals[fin][:, None], one)[:, 0].view(np.uint8)
    np.testing.assert_array_equal(got, codes[fin])
    x = np.array([[1.0625, 1.1875, 500.0, -1e9, 2.0 ** -10, 1.5 * 2.0 ** -10]], np.float32)
    back = encode_fp8(x, np.ones((1, 1), np.float32)).view(ml_dtypes.float8_e4m3fn)
    np.testing.assert_array_equal(back.astype(np.float32), [[1.0, 1.25, 448, -448, 0.0, 2.0 ** -9]])


def test_scatter_graph_quantizes_as_the_reference():
    """The tracer's fp8 quantize (poot.models.blocks.quantize_fp8: the graph the KV scatter
    writes), run by the oracle, gives the bytes and scales of the reference."""
    from poot.dialects.types import DType, TensorType
    from poot.graph.builder import Builder, TraceLimits
    from poot.models.blocks import quantize_fp8 as traced
    from poot.oracle import evaluate

    b = Builder(TraceLimits(max_values=1024, max_ops=1024, max_literal_bytes=4096,
                            max_owned_bytes=1 << 20))
    q, s = traced(b, b.input("x", TensorType((6, 2, 64), DType.F32)))
    g = b.finish({"q": q, "s": s})
    x = np.random.default_rng(1).standard_normal((6, 2, 64)).astype(np.float32) * 3
    x[2, 1] = 0.0
    out = evaluate(g, {"x": x})
    want_q, want_s = _ref_quantize(x)
    np.testing.assert_array_equal(out["q"].view(np.uint8), want_q)
    np.testing.assert_array_equal(out["s"], want_s)


# ---- the paged-attention op: its oracle against numpy -----------------------------------------

def _t(shape, dt="f32"):
    return f"tensor<{'x'.join(map(str, shape))}x{dt}>"


def fp8_region(B, Hkv, G, NB, bs, TW, D, k_fp8=True, v_fp8=True):
    """``@region`` calling a decode dispatch whose root is ``poot.paged_attention`` over pools
    ``[NB, bs, Hkv, D]``, each fp8 (i8 values, its f32 scales ``[NB, bs, Hkv, 1]`` among the
    trailing arguments, k's first) or f16; q ``[B, 1, H, D]`` as ``[B, Hkv, G, 1, D]``, the
    table ``[B, TW]`` i32, an i1 mask ``[B, 1, S]``. Arguments: q, k pool, v pool, table,
    mask, scales..."""
    from mlir import ir

    from poot.dialects import make_context
    from poot.graph.builder import Graph

    H, S = Hkv * G, TW * bs
    qa, q5, q = (B, 1, H, D), (B, 1, Hkv, G, D), (B, Hkv, G, 1, D)
    kp, vp = (_t((NB, bs, Hkv, D), "i8" if x else "f16") for x in (k_fp8, v_fp8))
    scales = [_t((NB, bs, Hkv, 1))] * (int(k_fp8) + int(v_fp8))
    tb, ma, m5, res, out = (B, TW), (B, 1, S), (B, 1, 1, 1, S), (B, Hkv, G, 1, D), (B, H, 1, D)
    ins = [_t(qa), kp, vp, _t(tb, "i32"), _t(ma, "i1")] + scales
    sargs = "".join(f", %arg{5 + i}" for i in range(len(scales)))
    body = f"""
  %q5 = "poot.reshape"(%arg0) : ({_t(qa)}) -> {_t(q5)}
  %q = "poot.transpose"(%q5) {{perm = array<i64: 0, 2, 3, 1, 4>}} : ({_t(q5)}) -> {_t(q)}
  %m = "poot.reshape"(%arg4) : ({_t(ma, "i1")}) -> {_t(m5, "i1")}
  %a = "poot.paged_attention"(%q, %arg1, %arg2, %arg3, %m{sargs}) {{scale = {float(1.0 / np.sqrt(D))!r} : f64, softcap = 0.0 : f64}} : ({_t(q)}, {kp}, {vp}, {_t(tb, "i32")}, {_t(m5, "i1")}{"".join(", " + x for x in scales)}) -> {_t(res)}
  %r = "poot.reshape"(%a) : ({_t(res)}) -> {_t(out)}
  return %r : {_t(out)}"""
    args = ", ".join(f"%arg{i}: {t}" for i, t in enumerate(ins))
    rargs = ", ".join(f'%a{i}: {t} {{poot.name = "a{i}"}}' for i, t in enumerate(ins))
    names = ", ".join(f"%a{i}" for i in range(len(ins)))
    text = f"""
func.func @region({rargs}) -> ({_t(out)} {{poot.name = "r0"}}) {{
  %r = func.call @attn({names}) : ({", ".join(ins)}) -> {_t(out)}
  return %r : {_t(out)}
}}
func.func private @attn({args}) -> {_t(out)} attributes {{poot.dispatch = {{kind = "paged_attention", ops = 5 : i64}}}} {{{body}
}}"""
    with make_context(), ir.Location.unknown():
        return Graph.from_module(ir.Module.parse(text))


def fp8_inputs(B, Hkv, G, NB, bs, TW, D, lengths, k_fp8=True, v_fp8=True, seed=0):
    """A paged cache (sequence b holds ``lengths[b]`` keys in blocks of a random permutation;
    rows nobody holds keep inf scales or inf/NaN f16 values) and the numpy
    dequantize-then-attend result ``[B, H, 1, D]`` (f64): ``(feed, expected)``."""
    rng = np.random.default_rng(seed)
    H, S = Hkv * G, TW * bs
    perm, table, used = rng.permutation(NB), np.full((B, TW), -1, np.int32), 0
    for b, n in enumerate(lengths):
        for w in range(-(-n // bs)):
            table[b, w], used = perm[used], used + 1
    held = np.zeros((NB, bs), bool)
    for b, n in enumerate(lengths):
        for j in range(n):
            held[table[b, j // bs], j % bs] = True
    feed, logical, scales = {}, [], []
    for name, fp8 in (("a1", k_fp8), ("a2", v_fp8)):
        x = rng.standard_normal((NB, bs, Hkv, D)).astype(np.float32)
        if fp8:
            vals, s = quantize_fp8(x)
            s[~held] = np.inf
            feed[name] = vals
            with np.errstate(invalid="ignore"):           # 0 * inf: a stale row
                x = vals.view(ml_dtypes.float8_e4m3fn).astype(np.float64) * s   # by hand
            scales.append(s)
        else:
            x = x.astype(np.float16)
            x[~held] = np.nan if name == "a2" else np.inf
            feed[name] = x
        logical.append(x.astype(np.float64))
    vis = np.arange(S)[None, :] < np.array(lengths)[:, None]
    q = rng.standard_normal((B, 1, H, D)).astype(np.float32)
    feed.update(a0=q, a3=table, a4=vis[:, None, :])
    feed.update({f"a{5 + i}": s for i, s in enumerate(scales)})
    want = np.zeros((B, H, 1, D))
    for b, n in enumerate(lengths):
        blk, row = table[b, np.arange(n) // bs], np.arange(n) % bs
        for h in range(H):
            k, v = (p[blk, row, h // G] for p in logical)
            x = k @ q[b, 0, h].astype(np.float64) / np.sqrt(D)
            p = np.exp(x - x.max())
            want[b, h, 0] = p @ v / p.sum()
    return feed, want


#: (B, Hkv, G, NB, bs, TW, D, lengths, k_fp8, v_fp8)
CASES = [(2, 8, 4, 40, 16, 8, 64, (100, 37), True, True),
         (1, 3, 3, 12, 16, 4, 64, (50,), True, False),
         (2, 2, 1, 12, 16, 3, 32, (16, 33), False, True)]


@pytest.mark.parametrize("case", CASES)
def test_oracle_matches_numpy_dequantize_then_attend(case):
    """The paged-attention oracle over fp8 pools (K, V or both; stale rows with inf scales)
    equals a straight numpy dequantize (ml_dtypes) then attend, in f64."""
    from poot.oracle import evaluate

    *shape, lengths, kf, vf = case
    feed, want = fp8_inputs(*shape, lengths, kf, vf)
    got = evaluate(fp8_region(*shape, kf, vf), feed)["r0"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


# ---- planning ---------------------------------------------------------------------------------

def _model(tmp_path):
    from poot.models.random_init import load_random_model

    cfg = json.loads((ROOT / "test/fixtures/tiny/llama/config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return load_random_model(tmp_path / "config.json", dtype="f32")


def test_fp8_is_planned_on_cuda_sm89_and_sm90(tmp_path):
    """plan_kv takes fp8 (K, V or both) on the sm_90 and sm_89 targets; a pool's bytes are
    D + 4 a head vector (tiny llama: D = 16, 20 / 32 of f16's)."""
    from poot.api.memory import plan_kv
    from poot.backends.cuda.artifact import cuda_target
    from poot.dialects.types import DType

    model, w = _model(tmp_path)
    for target in (cuda_target(), cuda_target(sm=89)):
        f16 = plan_kv(model, w.types, target, 64, 2, None, DType.F16)
        fp8 = plan_kv(model, w.types, target, 64, 2, None, FP8)
        assert fp8.bytes(model.dims()) * 32 == f16.bytes(model.dims()) * 20
        plan_kv(model, w.types, target, 64, 2, None, DType.F16, kv_dtype_v=FP8)


def _refusing_targets():
    from poot.backends.cuda.artifact import cuda_target
    from poot.backends.rocm.target import rocm_target
    from poot.backends.wgpu.target import wgpu_target
    from poot.compiler.target import Capabilities, Target

    return {"cuda sm_80": cuda_target(sm=80), "cpu": Target("cpu", Capabilities()),
            "vulkan": Target("vulkan", Capabilities(subgroup_size=32,
                                                    kv_formats=frozenset({"q8_0"}))),
            "wgpu": wgpu_target(), "rocm": rocm_target("gfx942")}


@pytest.mark.parametrize("name", ["cuda sm_80", "cpu", "vulkan", "wgpu", "rocm"])
def test_fp8_is_refused_elsewhere_naming_the_option(tmp_path, name):
    """fp8 on a target without the hardware conversions is an InvalidRequest naming the
    option (kv_dtype, or kv_dtype_v for V alone) and the reason, raised by planning."""
    from poot.api.memory import plan_kv
    from poot.dialects.types import DType
    from poot.sampling_params import InvalidRequest

    model, w = _model(tmp_path)
    target = _refusing_targets()[name]
    for kw, option in (({"kv_dtype": FP8}, "kv_dtype"),
                       ({"kv_dtype": DType.F16, "kv_dtype_v": FP8}, "kv_dtype_v")):
        with pytest.raises(InvalidRequest) as e:
            plan_kv(model, w.types, target, 64, 2, None, **kw)
        assert e.value.field == option
        assert "needs a device that converts fp8 in hardware (CUDA sm_89 or newer)" in \
            str(e.value) and f"the {target.backend} target lacks" in str(e.value)


def test_compile_refuses_an_fp8_step_for_sm80(tmp_path):
    """A traced fp8 step handed to compile() for sm_80 is a typed Refusal naming the
    missing conversions, before any code is generated."""
    from poot.backends.cuda.artifact import cuda_target
    from poot.compiler import compile
    from poot.compiler.planning import Refusal
    from poot.models import StepSpec

    model, w = _model(tmp_path)
    spec = StepSpec.decode(kv_capacity=64, block_size=16, num_blocks=9, kv_dtype=FP8, batch=2)
    with pytest.raises(Refusal, match="fp8 .e4m3. conversions in hardware"):
        compile(model.trace(spec, w.types), cuda_target(sm=80))


# ---- PTX --------------------------------------------------------------------------------------

def _ptxas(ptx: str, arch: str) -> list[str]:
    """ptxas -v's lines reporting spilled bytes for ``arch`` (skips without ptxas)."""
    exe = shutil.which("ptxas")
    if exe is None:
        pytest.skip("ptxas is not installed (PTX generated, not assembled)")
    with tempfile.TemporaryDirectory() as d:
        Path(d, "k.ptx").write_text(ptx)
        r = subprocess.run([exe, "-v", f"-arch={arch}", f"{d}/k.ptx", "-o", f"{d}/k.cubin"],
                           capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    return [x for x in r.stderr.splitlines() if re.search(r"[1-9]\d* bytes spill", x)]


#: (Hkv, G, TW, D): Llama-3.2-1B (GQA 32/8, D 64) at 512 and 4096 keys, SmolLM2 (9/3, D 64)
SHAPES = [(8, 4, 32, 64), (8, 4, 256, 64), (3, 3, 64, 64)]


@pytest.mark.parametrize("chip", ["sm_90", "sm_89"])
@pytest.mark.parametrize("Hkv,G,TW,D", SHAPES)
def test_fp8_paged_attention_ptx_uses_the_e4m3_conversions(Hkv, G, TW, D, chip):
    """The fp8 region becomes the flash-decoding kernels only (no dequantize launch), which
    decode e4m3 pairs with cvt.rn.f16x2.e4m3x2 (never an integer convert of the values); ptxas
    assembles them for the chip without spills."""
    from poot.backends.cuda.codegen import cuda_target, ptx_text
    from poot.backends.gpu.plan import plan_program

    g = fp8_region(1, Hkv, G, TW + 8, 16, TW, D)
    plan = plan_program(SimpleNamespace(graph=g, storage=[]),
                        cuda_target(sm=int(chip[3:])).caps)
    assert set(plan.strategies) == {"flash_decode"}
    ptx = ptx_text(plan.module, chip)
    assert f".target {chip}" in ptx
    assert re.search(r"cvt\.rn\.f16x2\.e4m3x2\s", ptx) and "cvt.rn.f32.s8" not in ptx
    assert _ptxas(ptx, chip) == []


@pytest.mark.parametrize("chip", ["sm_90", "sm_89"])
def test_traced_fp8_step_writes_and_reads_with_the_conversions(tmp_path, chip):
    """A traced decode step over fp8 pools compiles for the chip: the KV scatter encodes
    with cvt.rn.satfinite.e4m3x2.f32, every paged-attention dispatch is the
    flash-decoding strategy's, and ptxas assembles the step without spills."""
    from poot.backends.cuda.artifact import cuda_target
    from poot.backends.cuda.codegen import target_chip
    from poot.compiler import compile
    from poot.models import StepSpec

    model, w = _model(tmp_path)
    spec = StepSpec.decode(kv_capacity=64, block_size=16, num_blocks=9, kv_dtype=FP8, batch=2)
    target = cuda_target(sm=int(chip[3:]))
    chip = target_chip(target.caps)                 # sm_90a on sm_90 (its wgmma feature)
    art = compile(model.trace(spec, w.types), target).executable
    attn = [d for d in art.plan["dispatches"] if d["kind"] == "paged_attention"]
    assert len(attn) == model.dims().n_layers
    for d in attn:
        launches = art.plan["launches"][d["first"]:d["first"] + d["count"]]
        assert {L["strategy"] for L in launches} == {"flash_decode"}
    assert art.plan["target"]["arch"] == chip
    assert re.search(r"cvt\.rn\.satfinite\.e4m3x2\.f32\s", art.ptx)
    assert re.search(r"cvt\.rn\.f16x2\.e4m3x2\s", art.ptx)
    assert _ptxas(art.ptx, chip) == []


# ---- the device check's greedy-token comparison (no device needed) ---------------------------

def test_device_check_compares_greedy_tokens():
    """devcheck.top1 counts rows whose argmax equals the oracle's, and reports a differing
    row's oracle margin only beyond the logits' tolerance (a near-tie is no failure)."""
    from poot.backends.cuda.devcheck import top1

    want = np.array([[0.0, 2.0, 1.0], [3.0, 0.0, 2.99999], [0.0, 1.0, 5.0]], np.float32)
    assert top1(want, want) == (3, 3, 0.0)
    near = want.copy()
    near[1, 2] = 3.00001                      # row 1 picks 2: the oracle's margin 1e-5
    assert top1(near, want) == (2, 3, 0.0)
    far = want.copy()
    far[2, 1] = 9.0                           # row 2 picks 1: 4.0 worse in the oracle
    assert top1(far, want)[:2] == (2, 3) and top1(far, want)[2] == pytest.approx(4.0)
