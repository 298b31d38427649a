"""poot-flash-attention and poot.attention: the rewrite fires on attention however it is
spelled (traced Llama/Mistral steps, hand-spelled variants built from Builder primitives) and
keeps the oracle's results; it does not fire where the composition means something else; the
CPU lowering matches the oracle and never materializes the score matrix.

Tolerances: oracle(rewritten) vs oracle(original) within 1e-6 relative to the largest
magnitude of each output (the op's oracle repeats the composition's f32 operations; only the
matmul summation order and, where the scale sits on q, its rounding may differ); compiled CPU
vs oracle within 1e-5 relative (online softmax sums keys in blocks).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest

from poot import oracle
from poot.backends.cpu.codegen import compile_cpu, lower_graph
from poot.dialects.types import DType, TensorType
from poot.dialects.verify import verify_module
from poot.graph.builder import Builder, TraceLimits
from poot.passes.flash_attention import flash_attention
from poot.passes.registry import build_pass_manager

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
from model_steps import fixture_path  # noqa: E402

LIMITS = TraceLimits(max_values=100_000, max_ops=100_000, max_literal_bytes=1 << 22,
                     max_owned_bytes=1 << 31)
F32 = DType.F32


def rel_err(a: dict, b: dict) -> float:
    return max(float(np.abs(a[k] - b[k]).max()) / max(float(np.abs(b[k]).max()), 1e-30)
               for k in b)


def n_ops(g, name: str) -> int:
    return str(g.module).count(f'"{name}"')


# ---------------------------------------------------------------------------------------------
# hand-spelled attention (Builder primitives only)
# ---------------------------------------------------------------------------------------------
B, H, G, T, S, D, DV = 1, 2, 2, 3, 10, 8, 6


def spelled(**kw):
    """Attention over q [B, H, G*T, D], k, v [B, H, S, DV], spelled as the keywords say
    (default: the traced spelling). Returns (graph, inputs)."""
    o = {**dict(scale="after", mask="visible", softcap=None, rows5=True, keep="reshape",
                k_layout="bshd", order="qk_first"), **kw}
    rng = np.random.default_rng(7)
    b = Builder(LIMITS)
    M = G * T
    ins = {}

    def inp(name, shape, dtype=F32):
        t = b.input(name, TensorType(shape, dtype))
        if dtype is DType.I1:
            ins[name] = rng.random(shape) < 0.7
        else:
            ins[name] = (rng.standard_normal(shape) * 1.5).astype(np.float32)
        return t

    q = inp("q", (B, H, M, D))
    if o["k_layout"] == "bshd":
        k = inp("k", (B, S, H, D))
        kt = lambda: b.transpose(k, [0, 2, 3, 1])  # noqa: E731  [B, H, D, S]
    elif o["k_layout"] == "bhsd":
        k = inp("k", (B, H, S, D))
        kt = lambda: b.transpose(k, [0, 1, 3, 2])  # noqa: E731
    else:  # K^T given directly
        k = inp("k", (B, H, D, S))
        kt = lambda: k  # noqa: E731
    v = inp("v", (B, H, S, DV))
    vis = inp("vis", (B, 1, 1, T, S) if o["rows5"] else (B, 1, M, S), DType.I1)
    if o["rows5"]:
        ins["vis"][0, 0, 0, 1, :] = False        # a fully masked query row
    else:
        ins["vis"][0, 0, 1, :] = False
    scale = D ** -0.5
    if o["order"] == "v_first":
        v = b.reshape(v, (B, H, S, DV))  # no-op spelled view, created before q/k
    if o["scale"] == "before":
        q = q * scale
    s = b.matmul(q, kt())
    if o["scale"] == "after":
        s = s * scale
    elif o["scale"] == "div":
        s = s / (1.0 / scale)
    if o["softcap"]:
        s = b.unary("tanh", s * (1.0 / o["softcap"])) * o["softcap"]
    extra = {}
    if o.get("scores_out"):
        extra["scores"] = s
    full = (B, H, G, T, S) if o["rows5"] else (B, H, M, S)
    if o["rows5"]:
        s = b.reshape(s, full)
    visb = b.broadcast_to(vis, full)
    axis = len(full) - 1 if not o.get("wrong_axis") else len(full) - 2

    def red(fn, x):
        r = b.reduce(fn, x, axis)
        keep = [1 if i == axis else d for i, d in enumerate(full)]
        if o["keep"] == "reshape":
            return b.broadcast_to(b.reshape(r, keep), full)
        return b.broadcast_to(r, full, dims=tuple(i for i in range(len(full)) if i != axis))

    if o["mask"] == "visible":
        y = b.select(visb, s, b.scalar(o.get("fill", -1e30)))
    elif o["mask"] == "masked":         # branches swapped on the negated mask
        y = b.select(b.unary("not", visb), b.scalar(-1e30), s)
    elif o["mask"] == "bias":
        bias = b.select(vis, b.scalar(0.0), b.scalar(-1e30))
        y = b.broadcast_to(bias, full) + s if o.get("bias_first") else s + b.broadcast_to(
            bias, full)
    else:
        y = s
    mx = red("max", s if o.get("max_of") else y)
    e = b.unary("exp", y - mx) if not o.get("no_max") else b.unary("exp", y)
    if o.get("exp_out"):
        extra["exp"] = e
    if o["mask"] == "visible":
        e = b.select(b.broadcast_to(o.get("vis2", vis), full), e, b.scalar(0.0))
    elif o["mask"] == "masked":
        e = b.select(b.unary("not", visb), b.scalar(0.0), e)
    den = red("sum", e)
    if o["mask"] in ("visible", "masked") and not o.get("no_clamp"):
        den = b.binary("max", den, b.scalar(1.0))
    p = e / den
    if o["rows5"]:
        p = b.reshape(p, (B, H, M, S))
    out = b.matmul(p, v)
    g = b.finish({"out": out, **extra})
    return g, ins


POSITIVE = {
    "traced-order visible GQA": {},
    "scale before matmul": dict(scale="before"),
    "scale as a division": dict(scale="div"),
    "additive bias": dict(mask="bias"),
    "additive bias, bias first": dict(mask="bias", bias_first=True),
    "no mask": dict(mask="none"),
    "softcap visible": dict(softcap=5.0),
    "softcap bias, scale before": dict(softcap=3.0, mask="bias", scale="before"),
    "swapped select on not(mask)": dict(mask="masked"),
    "rank-4 softmax": dict(rows5=False),
    "keep-dims by broadcast": dict(keep="broadcast"),
    "k as [B,H,S,D]": dict(k_layout="bhsd"),
    "K^T given directly": dict(k_layout="kt"),
    "v view first": dict(order="v_first"),
    "-inf fill": dict(fill=-np.inf),
}


@pytest.mark.parametrize("name", list(POSITIVE))
def test_rewrite_fires_and_keeps_results(name):
    g, ins = spelled(**POSITIVE[name])
    ref = oracle.evaluate(g, ins)
    assert flash_attention(g.module) == 1
    g.module.operation.verify()
    assert verify_module(g.module) == []
    assert n_ops(g, "poot.attention") == 1
    assert n_ops(g, "poot.matmul") == 0 and n_ops(g, "poot.unary") <= 1  # at most a `not`
    got = oracle.evaluate(g, ins)
    assert rel_err(got, ref) <= 1e-6, name
    cpu = compile_cpu(g).run(ins, {})
    assert rel_err(cpu, got) <= 1e-5, name


def test_fully_masked_rows_are_zero_after_rewrite():
    g, ins = spelled()
    flash_attention(g.module)
    out = oracle.evaluate(g, ins)["out"]       # [B, H, G*T, DV]; query t=1 sees nothing
    assert np.all(out[0, :, [1, T + 1]] == 0)
    assert np.abs(out).max() > 0


NEGATIVE = {
    "softmax over the wrong axis": dict(wrong_axis=True, rows5=False),
    "exp not max-subtracted": dict(no_max=True),
    "max of the unmasked scores": dict(max_of="scores"),
    "scores have another consumer": dict(scores_out=True),
    "exp has another consumer": dict(exp_out=True, mask="bias"),
    "masked without the max(sum, 1) clamp": dict(no_clamp=True),
    "masked fill above -1e30": dict(fill=-1e4),
    "the two selects use different masks": dict(vis2="other"),
}


@pytest.mark.parametrize("name", list(NEGATIVE))
def test_rewrite_does_not_fire(name):
    kw = dict(NEGATIVE[name])
    if kw.get("vis2") == "other":
        g, ins = _other_mask_graph()
    else:
        g, ins = spelled(**kw)
    before = str(g.module)
    assert flash_attention(g.module) == 0
    assert str(g.module) == before


def _other_mask_graph():
    """Visible-mask attention whose zeroing select uses a second, different mask."""
    rng = np.random.default_rng(3)
    b = Builder(LIMITS)
    M = G * T
    q = b.input("q", TensorType((B, H, M, D), F32))
    k = b.input("k", TensorType((B, H, S, D), F32))
    v = b.input("v", TensorType((B, H, S, DV), F32))
    m1 = b.input("m1", TensorType((B, H, M, S), DType.I1))
    m2 = b.input("m2", TensorType((B, H, M, S), DType.I1))
    s = b.matmul(q, b.transpose(k, [0, 1, 3, 2])) * 0.3
    y = b.select(m1, s, b.scalar(-1e30))
    e = b.unary("exp", y - b.reduce("max", y, 3, keepdims=True))
    e = b.select(m2, e, b.scalar(0.0))
    den = b.binary("max", b.reduce("sum", e, 3, keepdims=True), b.scalar(1.0))
    g = b.finish(b.matmul(e / den, v))
    ins = {"q": rng.standard_normal((B, H, M, D)).astype(np.float32),
           "k": rng.standard_normal((B, H, S, D)).astype(np.float32),
           "v": rng.standard_normal((B, H, S, DV)).astype(np.float32),
           "m1": rng.random((B, H, M, S)) < 0.5, "m2": rng.random((B, H, M, S)) < 0.5}
    return g, ins


def test_scale_after_softcap_does_not_fire():
    rng = np.random.default_rng(4)
    b = Builder(LIMITS)
    q = b.input("q", TensorType((1, 4, D), F32))
    k = b.input("k", TensorType((1, S, D), F32))
    v = b.input("v", TensorType((1, S, DV), F32))
    s = b.matmul(q, b.transpose(k, [0, 2, 1]))
    s = b.unary("tanh", s * 0.2) * 5.0 * 0.35     # scale after the cap: not softcap(scale x)
    e = b.unary("exp", s - b.reduce("max", s, 2, keepdims=True))
    g = b.finish(b.matmul(e / b.reduce("sum", e, 2, keepdims=True), v))
    before = str(g.module)
    assert flash_attention(g.module) == 0 and str(g.module) == before
    del rng


def test_pass_runs_from_a_pipeline():
    g, ins = spelled()
    ref = oracle.evaluate(g, ins)
    pm = build_pass_manager("builtin.module(poot-flash-attention,poot-canonicalize,poot-cse)",
                            g.context)
    pm.run(g.module.operation)
    assert n_ops(g, "poot.attention") == 1
    assert rel_err(oracle.evaluate(g, ins), ref) <= 1e-6


# ---------------------------------------------------------------------------------------------
# traced model steps
# ---------------------------------------------------------------------------------------------
def _step_inputs(g, spec, rng):
    """Random pools and a step at positions 0..T-1 (prefill) or 9 (decode) of one sequence
    whose blocks are a random permutation of the pool's."""
    caches = {n: rng.standard_normal(t.shape).astype(t.dtype.numpy)
              for n, t in g.inputs if n.startswith("kv.")}
    T_ = spec.tokens
    start = 0 if T_ > 1 else 9
    pos = (np.arange(T_)[None] + start).astype(np.int32)
    table = rng.permutation(spec.n_blocks)[:spec.table_width][None].astype(np.int32)
    slots = table[0, pos[0] // spec.bs] * spec.bs + pos[0] % spec.bs
    return {"tokens": rng.integers(0, 64, (1, T_)).astype(np.int32), "positions": pos,
            "block_table": table, "slot_mapping": slots.astype(np.int32), **caches}


@pytest.mark.parametrize("fixture", ["llama", "mistral_swa4", "deepseek_v3"])
@pytest.mark.parametrize("step", ["prefill", "decode"])
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_traced_steps(fixture, step, paged):
    """The traced attention of every layer becomes one fused op (``poot.paged_attention``,
    reading the pools through the table, over 4-position f16 blocks; DeepSeek-V3's MLA reads
    one latent pool as keys and, through a channel slice, as values); the oracle agrees
    before and after, and so does the CPU."""
    from poot.models import StepSpec, load_model

    model, weights = load_model(fixture_path(fixture))
    kw = dict(kv_capacity=16, block_size=4, num_blocks=6, kv_dtype=DType.F16) if paged \
        else dict(kv_capacity=16)
    spec = (StepSpec.prefill(8, **kw) if step == "prefill" else StepSpec.decode(**kw))
    g = model.trace(spec, weights.types)
    ins = _step_inputs(g, spec, np.random.default_rng(11))
    ref = oracle.evaluate(g, ins, weights)
    n = flash_attention(g.module)
    assert n == model.dims().n_layers
    g.module.operation.verify()
    assert verify_module(g.module) == []
    # a one-block cache is a table lookup too (one entry): fused either way, never left
    assert n_ops(g, "poot.paged_attention") + n_ops(g, "poot.attention") == n
    if paged:
        assert n_ops(g, "poot.paged_attention") == n
    got = oracle.evaluate(g, ins, weights)
    assert rel_err(got, ref) <= 1e-6
    cpu = compile_cpu(g).run(ins, weights)
    # f16 pools: a K/V row may round to a neighbouring f16 (the CPU computes it in another
    # order), which moves later logits by ~1e-4 relative
    tol = 1e-3 if paged else 1e-5
    assert rel_err({"logits": cpu["logits"]}, {"logits": got["logits"]}) <= tol
    pools = {k: v.astype(np.float32) for k, v in got.items() if k.startswith("kv.")}
    assert rel_err({k: cpu[k].astype(np.float32) for k in pools}, pools) <= 1e-3


# ---------------------------------------------------------------------------------------------
# lowering: blocks, no score matrix
# ---------------------------------------------------------------------------------------------
def _attention_graph(s_len, m_rows=128, d=16, dv=16, mask_dtype=DType.I1, softcap=0.0):
    b = Builder(LIMITS)
    q = b.input("q", TensorType((1, 2, m_rows, d), F32))
    k = b.input("k", TensorType((1, 2, s_len, d), F32))
    v = b.input("v", TensorType((1, 2, s_len, dv), F32))
    m = b.input("m", TensorType((1, 1, 1, s_len), mask_dtype))
    out = b.op("attention", [q, k, v, m], {"scale": 0.25, "softcap": softcap})
    return b.finish(out)


def _tensor_sizes(text: str) -> list[int]:
    sizes = []
    for shape in re.findall(r"(?:tensor|memref)<([0-9x]+)x[a-z]", text):
        sizes.append(int(np.prod([int(x) for x in shape.split("x")])))
    return sizes


@pytest.mark.parametrize("mask_dtype", [DType.I1, DType.F32])
def test_lowering_never_materializes_scores(mask_dtype):
    s_len, m_rows = 4096, 128
    g = _attention_graph(s_len, m_rows, mask_dtype=mask_dtype, softcap=30.0)
    module, _ = lower_graph(g)
    text = str(module)
    assert "scf.for" in text
    assert max(_tensor_sizes(text)) < 2 * m_rows * s_len     # k, v: 2*4096*16 each
    for shape in re.findall(r"tensor<([0-9x]+)x[a-z]", text):
        dims = [int(x) for x in shape.split("x")]
        assert not (m_rows in dims and s_len in dims), shape
    rng = np.random.default_rng(5)
    ins = {"q": rng.standard_normal((1, 2, m_rows, 16)).astype(np.float32),
           "k": rng.standard_normal((1, 2, s_len, 16)).astype(np.float32),
           "v": rng.standard_normal((1, 2, s_len, 16)).astype(np.float32)}
    ins["m"] = (rng.random((1, 1, 1, s_len)) < 0.5 if mask_dtype is DType.I1 else
                np.where(rng.random((1, 1, 1, s_len)) < 0.5, 0, -1e30).astype(np.float32))
    ref = oracle.evaluate(g, ins)
    got = compile_cpu(g).run(ins, {})
    assert rel_err(got, ref) <= 1e-5


@pytest.mark.parametrize("s_len", [1, 5, 64, 65, 130])
def test_lowering_block_edges(s_len):
    g = _attention_graph(s_len, m_rows=3, d=4, dv=3)
    text = str(lower_graph(g)[0])
    assert ("scf.for" in text) == (s_len > 64)
    rng = np.random.default_rng(s_len)
    ins = {"q": rng.standard_normal((1, 2, 3, 4)).astype(np.float32),
           "k": rng.standard_normal((1, 2, s_len, 4)).astype(np.float32),
           "v": rng.standard_normal((1, 2, s_len, 3)).astype(np.float32),
           "m": rng.random((1, 1, 1, s_len)) < 0.6}
    ins["m"][..., 0] = True
    ref = oracle.evaluate(g, ins)
    assert rel_err(compile_cpu(g).run(ins, {}), ref) <= 1e-5
    ins["m"][:] = False                      # every key masked: zeros, not NaN
    assert np.all(compile_cpu(g).run(ins, {})["output"] == 0)
    assert np.all(oracle.evaluate(g, ins)["output"] == 0)


def test_contraction_not_over_the_key_axis_does_not_fire():
    """Softmax over S of [H, M, S] scores, but P is reshaped to [H, S, M] (a view that mixes
    the key axis into the rows) before P @ V contracts its last axis: not attention."""
    b = Builder(LIMITS)
    q = b.input("q", TensorType((2, 6, D), F32))
    k = b.input("k", TensorType((2, 10, D), F32))
    v = b.input("v", TensorType((2, 6, DV), F32))
    s = b.matmul(q, b.transpose(k, [0, 2, 1])) * 0.3
    e = b.unary("exp", s - b.reduce("max", s, 2, keepdims=True))
    p = e / b.reduce("sum", e, 2, keepdims=True)
    g = b.finish(b.matmul(b.reshape(p, (2, 10, 6)), v))
    before = str(g.module)
    assert flash_attention(g.module) == 0 and str(g.module) == before


# ---------------------------------------------------------------------------------------------
# paged attention: oracle and CPU lowering
# ---------------------------------------------------------------------------------------------
def _paged_graph(bsz, h, rows, d, dv, nb, bs, w, mask_shape, mask_dtype, kv=DType.F16,
                 softcap=0.0):
    b = Builder(LIMITS)
    q = b.input("q", TensorType((bsz, h) + rows + (d,), F32))
    kp = b.input("kp", TensorType((nb, bs, h, d), kv))
    vp = b.input("vp", TensorType((nb, bs, h, dv), kv))
    bt = b.input("bt", TensorType((bsz, w), DType.I32))
    m = b.input("m", TensorType(mask_shape, mask_dtype))
    out = b.op("paged_attention", [q, kp, vp, bt, m], {"scale": 0.3, "softcap": softcap})
    return b.finish(out)


@pytest.mark.parametrize("mask_dtype", [DType.I1, DType.F32])
@pytest.mark.parametrize("kv", [DType.F16, DType.F32])
def test_paged_lowering_matches_oracle_and_ignores_stale_blocks(mask_dtype, kv):
    """Three sequences of different lengths (one with no visible key) over a pool whose
    unused positions hold inf and NaN (what a reused block may hold): the CPU kernel equals
    the oracle, and both equal attention over each sequence's gathered keys, with the stale
    entries contributing nothing."""
    from poot.dialects.ops.attention import Attention, PagedAttention

    bsz, h, g_, t, d, dv, nb, bs, w = 3, 2, 2, 2, 8, 4, 9, 4, 3
    rng = np.random.default_rng(7)
    lengths = [9, 3, 0]                                    # visible keys per sequence
    table = np.array([[4, 1, 7], [2, 0, 0], [8, 8, 8]], np.int32)
    kp = rng.standard_normal((nb, bs, h, d)).astype(np.float32)
    vp = rng.standard_normal((nb, bs, h, dv)).astype(np.float32)
    # poison every position no sequence sees
    seen = np.zeros((nb, bs), bool)
    for s, n in enumerate(lengths):
        for j in range(n):
            seen[table[s, j // bs], j % bs] = True
    kp[~seen], vp[~seen] = np.inf, np.nan
    j = np.arange(w * bs)
    vis = (j[None, :] < np.array(lengths)[:, None])          # [B, S]
    mshape = (bsz, 1, 1, 1, w * bs)
    mask = vis.reshape(mshape)
    if mask_dtype is DType.F32:
        mask = np.where(mask, 0.0, -np.inf).astype(np.float32)
    gr = _paged_graph(bsz, h, (g_, t), d, dv, nb, bs, w, mshape, mask_dtype,
                      kv=kv, softcap=20.0)
    ins = {"q": rng.standard_normal((bsz, h, g_, t, d)).astype(np.float32),
           "kp": kp.astype(kv.numpy), "vp": vp.astype(kv.numpy), "bt": table, "m": mask}
    want = next(iter(oracle.evaluate(gr, ins).values()))
    if mask_dtype is DType.I1:
        assert np.isfinite(want).all() and not want[2].any()    # no visible key: zeros
    else:
        assert np.isfinite(want[:2]).all()     # all -inf row: NaN, as softmax of -inf gives
    # reference: dense attention over the visible keys only
    for s, n in enumerate(lengths[:2]):
        k = PagedAttention.gather_keys(ins["kp"], table)[s:s + 1, :, :n]
        v = PagedAttention.gather_keys(ins["vp"], table)[s:s + 1, :, :n]
        ref = Attention.evaluate([ins["q"][s:s + 1], k, v,
                                  np.ones((1, 1, 1, 1, n), bool)],
                                 {"scale": 0.3, "softcap": 20.0},
                                 TensorType((1, h, g_, t, dv), F32))
        np.testing.assert_allclose(want[s:s + 1], ref, rtol=2e-6, atol=2e-6)
    got = next(iter(compile_cpu(gr).run(ins, {}).values()))
    np.testing.assert_allclose(got[:2], want[:2], rtol=1e-5, atol=1e-5)
    if mask_dtype is DType.I1:
        assert not got[2].any()


def test_paged_lowering_visits_only_visible_blocks():
    """The CPU kernel's block loop runs from the first to the last visible block of each
    sequence (its bounds come from the mask), so a short sequence in a wide table reads one
    block: the IR has a dynamic-bound scf.for over blocks, and the results agree with the
    oracle for sequences whose visible keys start past block 0 (a sliding window)."""
    bsz, h, d, nb, bs, w = 2, 1, 4, 6, 2, 3
    rng = np.random.default_rng(3)
    table = np.array([[5, 3, 1], [0, 2, 4]], np.int32)
    vis = np.zeros((bsz, w * bs), bool)
    vis[0, 3:5] = True                 # keys 3..4 (blocks 1 and 2)
    vis[1, 0:1] = True                 # key 0 (block 0)
    mshape = (bsz, 1, 1, w * bs)
    gr = _paged_graph(bsz, h, (1,), d, d, nb, bs, w, mshape, DType.I1, kv=F32)
    module, _ = lower_graph(gr)
    assert re.search(r"scf\.for %\w+ = %\w+ to %\w+ step", str(module))
    ins = {"q": rng.standard_normal((bsz, h, 1, d)).astype(np.float32),
           "kp": rng.standard_normal((nb, bs, h, d)).astype(np.float32),
           "vp": rng.standard_normal((nb, bs, h, d)).astype(np.float32),
           "bt": table, "m": vis.reshape(mshape)}
    want = next(iter(oracle.evaluate(gr, ins).values()))
    got = next(iter(compile_cpu(gr).run(ins, {}).values()))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
