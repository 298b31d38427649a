"""The flash-decoding attention strategy (:mod:`poot.backends.gpu.strategies.attention`):
``poot.attention`` and ``poot.paged_attention`` dispatch regions built directly (GQA and MHA,
decode and prefill, i1 and additive masks, soft cap; paged: f32/f16/bf16 pools read through a
scattered table whose stale rows hold inf/NaN, sliding windows) run on a Vulkan device
(lavapipe in CI) and match the CPU oracle at 1e-5; the same regions become PTX that ptxas
assembles; the view resolution and the refusals."""

from __future__ import annotations

from types import SimpleNamespace

import ml_dtypes
import numpy as np
import pytest
pytest.importorskip("mlir.ir", reason="the MLIR wheels (xtc-mlir-python-bindings) are not "
                    "installed here: this module compiles kernels")
from mlir import ir

from test_gpu_pointwise import rope_body

from poot import oracle
from poot.dialects import make_context
from poot.graph.builder import Graph


RTOL = ATOL = 1e-5


# ---- regions -------------------------------------------------------------------------------------

def _t(shape, dt="f32") -> str:
    return f"tensor<{'x'.join(str(s) for s in shape)}x{dt}>"


def dispatch_region(ins: list[str], out: str, body: str, kind: str, ops: int) -> Graph:
    """A graph whose ``@region`` (arguments ``a0 ..`` of the MLIR types ``ins``, result
    ``r0`` of type ``out``) calls one dispatch ``@attn`` (``poot.dispatch`` of ``kind`` and
    ``ops``) with body ``body`` (its arguments are ``%arg0 ..``)."""
    args = ", ".join(f"%arg{i}: {x}" for i, x in enumerate(ins))
    rargs = ", ".join(f'%a{i}: {x} {{poot.name = "a{i}"}}' for i, x in enumerate(ins))
    names = ", ".join(f"%a{i}" for i in range(len(ins)))
    text = f"""
func.func @region({rargs}) -> ({out} {{poot.name = "r0"}}) {{
  %r = func.call @attn({names}) : ({", ".join(ins)}) -> {out}
  return %r : {out}
}}
func.func private @attn({args}) -> {out} attributes {{poot.dispatch = {{kind = "{kind}", ops = {ops} : i64}}}} {{{body}
}}"""
    with make_context(), ir.Location.unknown():
        module = ir.Module.parse(text)
    return Graph.from_module(module)


def attention_region(B, T, Hkv, G, S, D, Dv, mask, softcap, scale=None, dt="f32") -> Graph:
    """``@region`` calling a dispatch whose root is ``poot.attention``, spelled like the
    flash-attention rewrite leaves it: q ``[B, T, H, D]`` reshaped to ``[B, T, Hkv, G, D]``,
    transposed to ``[B, Hkv, G, T, D]`` and reshaped through ``[B, Hkv, G*T, D]`` (a reshape
    that alone has no strided form) back to it; k/v ``[B, S, Hkv, D]`` transposed to
    ``[B, Hkv, S, D]``; mask ``i1 [B, T, S]`` reshaped, or ``f32 [T, S]`` broadcast, to
    ``[B|1, 1, 1, T, S]``; the result reshaped to ``[B, Hkv * G, T, Dv]``. ``dt``: the
    q/k/v dtype."""
    H = Hkv * G
    scale = 1.0 / np.sqrt(D) if scale is None else scale
    qa, ka, va = (B, T, H, D), (B, S, Hkv, D), (B, S, Hkv, Dv)
    q5, q, q4 = (B, T, Hkv, G, D), (B, Hkv, G, T, D), (B, Hkv, G * T, D)
    k, v = (B, Hkv, S, D), (B, Hkv, S, Dv)
    res, out = (B, Hkv, G, T, Dv), (B, Hkv * G, T, Dv)
    if mask == "i1":
        ma, mt, m5 = (B, T, S), "i1", (B, 1, 1, T, S)
        mop = f'%m = "poot.reshape"(%arg3) : ({_t(ma, mt)}) -> {_t(m5, mt)}'
    else:
        ma, mt, m5 = (T, S), "f32", (1, 1, 1, T, S)
        mop = (f'%m = "poot.broadcast"(%arg3) {{dims = array<i64: 3, 4>}} : '
               f'({_t(ma, mt)}) -> {_t(m5, mt)}')
    ins = [_t(qa, dt), _t(ka, dt), _t(va, dt), _t(ma, mt)]
    body = f"""
  %q5 = "poot.reshape"(%arg0) : ({_t(qa, dt)}) -> {_t(q5, dt)}
  %qt = "poot.transpose"(%q5) {{perm = array<i64: 0, 2, 3, 1, 4>}} : ({_t(q5, dt)}) -> {_t(q, dt)}
  %q4 = "poot.reshape"(%qt) : ({_t(q, dt)}) -> {_t(q4, dt)}
  %q = "poot.reshape"(%q4) : ({_t(q4, dt)}) -> {_t(q, dt)}
  %k = "poot.transpose"(%arg1) {{perm = array<i64: 0, 2, 1, 3>}} : ({_t(ka, dt)}) -> {_t(k, dt)}
  %v = "poot.transpose"(%arg2) {{perm = array<i64: 0, 2, 1, 3>}} : ({_t(va, dt)}) -> {_t(v, dt)}
  {mop}
  %a = "poot.attention"(%q, %k, %v, %m) {{scale = {float(scale)!r} : f64, softcap = {float(softcap)!r} : f64}} : ({_t(q, dt)}, {_t(k, dt)}, {_t(v, dt)}, {_t(m5, mt)}) -> {_t(res)}
  %r = "poot.reshape"(%a) : ({_t(res)}) -> {_t(out)}
  return %r : {_t(out)}"""
    return dispatch_region(ins, _t(out), body, "attention", 7)


def region_inputs(B, T, Hkv, G, S, D, Dv, mask, softcap, seed=0, dt="f32") -> dict:
    """Random q/k/v and a mask with causal structure (query t sits at key ``S - T + t``).
    i1: random holes, and row (b=B-1, t=0) sees no key at all (zeros). f32: -inf past the
    position and, for even t, over the first half of the keys (whole chunks of -inf), finite
    random biases elsewhere; every row keeps a finite entry (the op is NaN otherwise)."""
    rng = np.random.default_rng(seed)
    H = Hkv * G
    qs = 10.0 if softcap else 1.0            # scores well into the tanh cap
    x = {"a0": (qs * rng.standard_normal((B, T, H, D))).astype(np.float32),
         "a1": rng.standard_normal((B, S, Hkv, D)).astype(np.float32),
         "a2": rng.standard_normal((B, S, Hkv, Dv)).astype(np.float32)}
    np_dt = {"f32": np.float32, "f16": np.float16}[dt]
    x.update({n: x[n].astype(np_dt) for n in ("a0", "a1", "a2")})
    pos = S - T + np.arange(T)
    causal = np.arange(S)[None, :] <= pos[:, None]                     # [T, S]
    if mask == "i1":
        vis = causal[None] & ((rng.random((B, T, S)) < 0.8) | (np.arange(S) == pos[:, None]))
        vis[B - 1, 0, :] = False
        x["a3"] = vis
    else:
        bias = (0.5 * rng.standard_normal((T, S))).astype(np.float32)
        bias[~causal] = -np.inf
        bias[0::2, :S // 2] = -np.inf
        assert np.isfinite(bias).any(axis=1).all()
        x["a3"] = bias
    return x


def rope_attention_region(B, T, Hkv, G, S, D, Dv, mask, softcap=0.0, paged=None,
                          window=None) -> Graph:
    """``@region`` calling ONE dispatch that computes what folded regions leave in front of
    the attention: RoPE of q from the positions (cos/sin of ``positions * inv_freq``, a
    non-splat constant; strided slices, products, a concat of unit-axis reshapes) and the
    causal mask ``iota(S) <= position`` (and ``position - iota(S) < window`` with a
    ``window``; ``i1``, or ``f32`` as ``select(vis, 0, -inf)``), with k/v ``[B, S, Hkv, D]``
    KV caches transposed to ``[B, Hkv, S, D]``. Arguments: q ``[B, T, H, D]``, positions
    ``[B, T]`` i32, k, v; result ``[B, H, T, Dv]``.

    ``paged`` (``(NB, bs, kv dtype)``, with ``S = TW * bs``): ``poot.paged_attention`` over
    block pools ``[NB, bs, Hkv, D]`` instead, the block table ``[B, TW]`` i32 a fifth
    argument (what the step's paged attention region is after folding); kv dtype ``q8_0``:
    i8 pools and their f16 scales ``[NB, bs, Hkv, D / 32]`` (k's, v's) the sixth and
    seventh."""
    H, h = Hkv * G, D // 2
    freqs = ", ".join(f"{1.0 / 10000 ** (2 * i / D):.8e}" for i in range(h))
    qa, ha, h5, two = (B, T, H, D), (B, T, H, h), (B, T, H, h, 1), (B, T, H, h, 2)
    q5, q = (B, T, Hkv, G, D), (B, Hkv, G, T, D)
    ka, va, k, v = (B, S, Hkv, D), (B, S, Hkv, Dv), (B, Hkv, S, D), (B, Hkv, S, Dv)
    m5, res, out = (B, 1, 1, T, S), (B, Hkv, G, T, Dv), (B, H, T, Dv)
    t = _t
    scales = []
    if paged:
        NB, bs, kdt = paged
        pdt = "i8" if kdt == "q8_0" else kdt
        ka, va = t((NB, bs, Hkv, D), pdt), t((NB, bs, Hkv, Dv), pdt)
        if kdt == "q8_0":
            scales = [t((NB, bs, Hkv, D // 32), "f16"), t((NB, bs, Hkv, Dv // 32), "f16")]
    else:
        ka, va = t(ka), t(va)
    body = f"""
  %f = "poot.constant"() {{value = dense<[{freqs}]> : {t((h,))}}} : () -> {t((h,))}
  %pf = "poot.cast"(%arg1) : ({t((B, T), "i32")}) -> {t((B, T))}
  %pr = "poot.reshape"(%pf) : ({t((B, T))}) -> {t((B, T, 1, 1))}
  %pb = "poot.broadcast"(%pr) {{dims = array<i64: 0, 1, 2, 3>}} : ({t((B, T, 1, 1))}) -> {t(ha)}
  %fb = "poot.broadcast"(%f) {{dims = array<i64: 3>}} : ({t((h,))}) -> {t(ha)}
  %ang = "poot.binary"(%pb, %fb) {{fn = "mul"}} : ({t(ha)}, {t(ha)}) -> {t(ha)}
  %cos = "poot.unary"(%ang) {{fn = "cos"}} : ({t(ha)}) -> {t(ha)}
  %sin = "poot.unary"(%ang) {{fn = "sin"}} : ({t(ha)}) -> {t(ha)}
  %x0 = "poot.slice"(%arg0) {{limit = array<i64: {B}, {T}, {H}, {D}>, start = array<i64: 0, 0, 0, 0>, stride = array<i64: 1, 1, 1, 2>}} : ({t(qa)}) -> {t(ha)}
  %x1 = "poot.slice"(%arg0) {{limit = array<i64: {B}, {T}, {H}, {D}>, start = array<i64: 0, 0, 0, 1>, stride = array<i64: 1, 1, 1, 2>}} : ({t(qa)}) -> {t(ha)}
  %a = "poot.binary"(%x0, %cos) {{fn = "mul"}} : ({t(ha)}, {t(ha)}) -> {t(ha)}
  %b = "poot.binary"(%x1, %sin) {{fn = "mul"}} : ({t(ha)}, {t(ha)}) -> {t(ha)}
  %r0 = "poot.binary"(%a, %b) {{fn = "sub"}} : ({t(ha)}, {t(ha)}) -> {t(ha)}
  %c = "poot.binary"(%x1, %cos) {{fn = "mul"}} : ({t(ha)}, {t(ha)}) -> {t(ha)}
  %d = "poot.binary"(%x0, %sin) {{fn = "mul"}} : ({t(ha)}, {t(ha)}) -> {t(ha)}
  %r1 = "poot.binary"(%c, %d) {{fn = "add"}} : ({t(ha)}, {t(ha)}) -> {t(ha)}
  %e0 = "poot.reshape"(%r0) : ({t(ha)}) -> {t(h5)}
  %e1 = "poot.reshape"(%r1) : ({t(ha)}) -> {t(h5)}
  %cc = "poot.concat"(%e0, %e1) {{axis = 4 : i64}} : ({t(h5)}, {t(h5)}) -> {t(two)}
  %qr = "poot.reshape"(%cc) : ({t(two)}) -> {t(qa)}
  %q5 = "poot.reshape"(%qr) : ({t(qa)}) -> {t(q5)}
  %q = "poot.transpose"(%q5) {{perm = array<i64: 0, 2, 3, 1, 4>}} : ({t(q5)}) -> {t(q)}
  %io = "poot.iota"() {{axis = 1 : i64}} : () -> {t((1, S), "i32")}
  %ir = "poot.reshape"(%io) : ({t((1, S), "i32")}) -> {t((1, 1, 1, 1, S), "i32")}
  %ib = "poot.broadcast"(%ir) {{dims = array<i64: 0, 1, 2, 3, 4>}} : ({t((1, 1, 1, 1, S), "i32")}) -> {t(m5, "i32")}
  %pp = "poot.reshape"(%arg1) : ({t((B, T), "i32")}) -> {t((B, 1, 1, T, 1), "i32")}
  %pq = "poot.broadcast"(%pp) {{dims = array<i64: 0, 1, 2, 3, 4>}} : ({t((B, 1, 1, T, 1), "i32")}) -> {t(m5, "i32")}
  %vis = "poot.compare"(%ib, %pq) {{pred = "le"}} : ({t(m5, "i32")}, {t(m5, "i32")}) -> {t(m5, "i1")}"""
    vis = "%vis"
    if window:
        body += f"""
  %wc = "poot.constant"() {{value = dense<{int(window)}> : {t(m5, "i32")}}} : () -> {t(m5, "i32")}
  %dp = "poot.binary"(%pq, %ib) {{fn = "sub"}} : ({t(m5, "i32")}, {t(m5, "i32")}) -> {t(m5, "i32")}
  %in = "poot.compare"(%dp, %wc) {{pred = "lt"}} : ({t(m5, "i32")}, {t(m5, "i32")}) -> {t(m5, "i1")}
  %visw = "poot.binary"(%vis, %in) {{fn = "and"}} : ({t(m5, "i1")}, {t(m5, "i1")}) -> {t(m5, "i1")}"""
        vis = "%visw"
    if mask == "i1":
        mt, mv = "i1", vis
    else:
        mt, mv = "f32", "%bias"
        body += f"""
  %z = "poot.constant"() {{value = dense<0.0> : {t(m5)}}} : () -> {t(m5)}
  %ni = "poot.constant"() {{value = dense<0xFF800000> : {t(m5)}}} : () -> {t(m5)}
  %bias = "poot.select"({vis}, %z, %ni) : ({t(m5, "i1")}, {t(m5)}, {t(m5)}) -> {t(m5)}"""
    attrs = f"{{scale = {float(1.0 / np.sqrt(D))!r} : f64, softcap = {float(softcap)!r} : f64}}"
    if paged:
        tb = t((B, S // paged[1]), "i32")
        body += f"""
  %at = "poot.paged_attention"(%q, %arg2, %arg3, %arg4, {mv}{"".join(f", %arg{5 + i}" for i in range(len(scales)))}) {attrs} : ({t(q)}, {ka}, {va}, {tb}, {t(m5, mt)}{"".join(", " + x for x in scales)}) -> {t(res)}"""
    else:
        body += f"""
  %k = "poot.transpose"(%arg2) {{perm = array<i64: 0, 2, 1, 3>}} : ({ka}) -> {t(k)}
  %v = "poot.transpose"(%arg3) {{perm = array<i64: 0, 2, 1, 3>}} : ({va}) -> {t(v)}
  %at = "poot.attention"(%q, %k, %v, {mv}) {attrs} : ({t(q)}, {t(k)}, {t(v)}, {t(m5, mt)}) -> {t(res)}"""
    body += f"""
  %r = "poot.reshape"(%at) : ({t(res)}) -> {t(out)}
  return %r : {t(out)}"""
    ins = [t(qa), t((B, T), "i32"), ka, va] + ([tb] if paged else []) + scales
    return dispatch_region(ins, t(out), body, "attention", 40)


def rope_inputs(B, T, Hkv, G, S, D, Dv, mask, seed=0) -> dict:
    """Random q/k/v; positions: batch 0 ends at the last key, the others earlier (decode: a
    position < S - 1, so keys past it are masked). With an i1 mask and ``T == 1`` the last
    batch sits at position -1: it sees no key (zeros)."""
    rng = np.random.default_rng(seed)
    H = Hkv * G
    x = {"a0": rng.standard_normal((B, T, H, D)).astype(np.float32),
         "a2": rng.standard_normal((B, S, Hkv, D)).astype(np.float32),
         "a3": rng.standard_normal((B, S, Hkv, Dv)).astype(np.float32)}
    ends = [S - 1] + [int(rng.integers(T - 1, S - 1)) if S > T else S - 1 for _ in range(B - 1)]
    if mask == "i1" and T == 1 and B > 1:
        ends[-1] = -1
    x["a1"] = np.array([[e - T + 1 + t for t in range(T)] for e in ends], np.int32)
    return x


# ---- Vulkan -------------------------------------------------------------------------------------



def _vk_target(dev, cores):
    from dataclasses import replace

    from poot.backends.vulkan.codegen import vulkan_target
    from poot.compiler.target import Target

    t = vulkan_target(dev.capabilities())
    return Target(t.backend, replace(t.caps, cores=cores))


def _run(dev, art, inputs) -> dict:
    k = dev.load(art)
    bufs = []
    for a in k.args:
        b = dev.alloc(a.type)
        if a.role == "input":
            dev.upload(b, inputs[a.name])
        bufs.append(b)
    dev.replay(dev.record(k, bufs))
    dev.synchronize()
    return {a.name: dev.download(b) for a, b in zip(k.args, bufs) if a.role == "output"}


def _callee(g: Graph) -> ir.Operation:
    return next(o.operation for o in g.module.body.operations
                if o.operation.name == "func.func" and
                ir.StringAttr(o.operation.attributes["sym_name"]).value == "attn")


CASES = [(g, S, mask, cap) for g in (3, 1) for S in (1, 7, 64, 300)
         for mask in ("i1", "f32") for cap in (0.0, 30.0)]
#: (D, Dv) cycled over the cases: head dims 64..256, Dv not a multiple of the subgroup
HEAD_DIMS = [(64, 64), (128, 96), (256, 100), (80, 256)]


@pytest.mark.parametrize("G,S,mask,softcap", CASES)
def test_attention_region_matches_oracle_on_vulkan(vk_device, G, S, mask, softcap):
    """Each region, planned for targets of the device with 1, 16 and 1000 cores (one chunk
    of keys or many; one lane per key or a dot product split over several), runs on the
    device and equals the oracle at 1e-5 (rel and abs)."""
    from poot.backends.gpu.strategies.attention import match_attention, plan_attention
    from poot.backends.vulkan.codegen import codegen_vulkan

    i = CASES.index((G, S, mask, softcap))
    D, Dv = HEAD_DIMS[i % len(HEAD_DIMS)]
    T = 1 if i % 2 == 0 else min(4, -(-S // 2))          # decode and prefill
    shape = dict(B=2, T=T, Hkv=2 if G == 3 else 3, G=G, S=S, D=D, Dv=Dv, mask=mask,
                 softcap=softcap)
    g = attention_region(**shape)
    x = region_inputs(**shape, seed=i)
    want = oracle.evaluate(g, x)["r0"]
    assert np.isfinite(want).all()
    if mask == "i1":
        assert not want[1, :, 0].any()           # the row that sees no key: zeros
    plans = []
    for cores in (1, 16, 1000):
        target = _vk_target(vk_device, cores)
        plan = plan_attention(match_attention(_callee(g)), target.caps)
        assert plan is not None
        plans.append(plan)
        art = codegen_vulkan(g, target)
        assert len(art.steps) == (1 if plan.NS == 1 else 2)
        got = _run(vk_device, art, x)["r0"]
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL,
                                   err_msg=f"{shape} cores={cores} {plan}")


#: single-kernel decode cases: (Hkv, G, S, D, Dv, mask, softcap). GQA and MHA, i1 (random
#: holes, a batch that sees no key) and additive (-inf over half the keys) masks, a soft cap,
#: Dv not a multiple of the subgroup, S not a multiple of W * KL
SINGLE_CASES = [(2, 3, 300, 64, 64, "i1", 0.0), (2, 4, 250, 128, 100, "f32", 30.0),
                (3, 1, 1000, 64, 64, "f32", 0.0), (2, 3, 77, 256, 96, "i1", 50.0)]


@pytest.mark.parametrize("Hkv,G,S,D,Dv,mask,softcap", SINGLE_CASES)
def test_single_kernel_decode_on_vulkan(vk_device, Hkv, G, S, D, Dv, mask, softcap):
    """Decode (one query per batch index) on a 1000-core target: the split plan would need
    several chunks, the planner takes ONE launch instead (NS = 1, W > 1 subgroups a block,
    no scratch, no combine) and the result equals the oracle at 1e-5, the row that sees no
    key included (zeros)."""
    from poot.backends.gpu.strategies.attention import match_attention, plan_attention
    from poot.backends.vulkan.codegen import codegen_vulkan

    shape = dict(B=2, T=1, Hkv=Hkv, G=G, S=S, D=D, Dv=Dv, mask=mask, softcap=softcap)
    g = attention_region(**shape)
    x = region_inputs(**shape, seed=S)
    want = oracle.evaluate(g, x)["r0"]
    assert np.isfinite(want).all()
    if mask == "i1":
        assert not want[1].any() and want[0].any()
    target = _vk_target(vk_device, 1000)
    plan = plan_attention(match_attention(_callee(g)), target.caps)
    assert plan.NS == 1 and plan.W > 1 and plan.C >= S, plan
    assert S % (plan.W * plan.KL), plan                  # a ragged last round of batches
    art = codegen_vulkan(g, target)
    assert len(art.steps) == 1
    got = _run(vk_device, art, x)["r0"]
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=f"{shape} {plan}")


def test_single_kernel_all_minus_inf_bias_gives_zeros_on_vulkan(vk_device):
    """An additive bias of -inf everywhere (every subgroup's state stays m = -inf, l = 0):
    the W-subgroup merge gives zeros, never NaN (the op itself is NaN there: no oracle)."""
    from poot.backends.gpu.strategies.attention import match_attention, plan_attention
    from poot.backends.vulkan.codegen import codegen_vulkan

    shape = dict(B=1, T=1, Hkv=2, G=3, S=200, D=64, Dv=64, mask="f32", softcap=0.0)
    g = attention_region(**shape)
    x = region_inputs(**shape)
    x["a3"] = np.full_like(x["a3"], -np.inf)
    target = _vk_target(vk_device, 1000)
    plan = plan_attention(match_attention(_callee(g)), target.caps)
    assert plan.NS == 1 and plan.W > 1
    got = _run(vk_device, codegen_vulkan(g, target), x)["r0"]
    assert np.isfinite(got).all() and not got.any()


LONG_CASES = [(1, 3, 1100, 64, "i1"), (1, 3, 1100, 64, "f32"), (6, 3, 200, 32, "i1"),
              (6, 3, 200, 32, "f32")]


@pytest.mark.parametrize("T,G,S,D,mask", LONG_CASES)
def test_long_context_and_prefill_still_split_on_vulkan(vk_device, T, G, S, D, mask):
    """Past SINGLE_MAX_KEYS keys a subgroup (decode over 1100 keys: at most 16 subgroups)
    and for prefill blocks of more than SINGLE_MAX_ROWS rows (6 queries x 3 heads) the plan
    keeps split + combine over the GPU (one subgroup a block, as before), and matches the
    oracle."""
    from poot.backends.gpu.strategies.attention import (SINGLE_MAX_KEYS, SINGLE_MAX_ROWS,
                                                        match_attention, plan_attention)
    from poot.backends.vulkan.codegen import codegen_vulkan

    shape = dict(B=1, T=T, Hkv=2, G=G, S=S, D=D, Dv=D, mask=mask, softcap=0.0)
    g = attention_region(**shape)
    x = region_inputs(**shape, seed=5)
    want = oracle.evaluate(g, x)["r0"]
    target = _vk_target(vk_device, 1000)
    plan = plan_attention(match_attention(_callee(g)), target.caps)
    assert plan.NS > 1 and plan.W == 1, plan
    assert S > 16 * SINGLE_MAX_KEYS or plan.R > SINGLE_MAX_ROWS
    art = codegen_vulkan(g, target)
    assert len(art.steps) == 2
    np.testing.assert_allclose(_run(vk_device, art, x)["r0"], want, rtol=RTOL, atol=ATOL)


#: forced plans (the planner only emits W > 1 with NS = 1): (S, DL, C, NS, W, mask). A
#: subgroup past the last batch of its chunk (the guarded loop, no zero-trip scf.for), W > 1
#: blocks writing merged chunks to the scratch for the combine kernel
FORCED = [(20, 1, 24, 1, 4, "i1"), (20, 1, 24, 1, 4, "f32"), (50, 2, 20, 3, 4, "i1"),
          (50, 2, 20, 3, 2, "f32"), (37, 8, 37, 1, 8, "i1")]


@pytest.mark.parametrize("S,DL,C,NS,W,mask", FORCED)
def test_forced_subgroup_plans_on_vulkan(vk_device, monkeypatch, S, DL, C, NS, W, mask):
    """Every (W, NS) the emitter takes, planned by hand: subgroups with no key batch in
    their chunk (guarded), several chunks of W-subgroup blocks (merged in the block, then
    by the combine kernel), all equal to the oracle."""
    from poot.backends.gpu.strategies import attention as A
    from poot.backends.vulkan.codegen import codegen_vulkan

    shape = dict(B=2, T=1, Hkv=2, G=3, S=S, D=64, Dv=64, mask=mask, softcap=0.0)
    g = attention_region(**shape)
    x = region_inputs(**shape, seed=S + W)
    want = oracle.evaluate(g, x)["r0"]
    target = _vk_target(vk_device, 4)
    sg = target.caps.subgroup_size
    plan = A.AttentionPlan(sg, DL, 3, 1, C, NS, max(sg, min(256, 4 * sg)), W)
    assert -(-S // C) == NS
    guarded = (W - 1) * plan.KL >= S - (NS - 1) * C
    assert guarded == ((S, W) in ((20, 4), (50, 4)))
    monkeypatch.setattr(A, "plan_attention", lambda reg, caps: plan)
    art = codegen_vulkan(g, target)
    assert len(art.steps) == (1 if NS == 1 else 2)
    got = _run(vk_device, art, x)["r0"]
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=f"{plan}")


def test_combine_past_the_grid_limit_uses_a_2d_grid_on_vulkan(vk_device, monkeypatch):
    """A combine launch of more than MAX_GRID blocks (a pooled step of 32 x 128 tokens on
    the 1B shape needs 65536) runs as a 2-D grid of rows of MAX_GRID blocks, its last row
    guarded: with MAX_GRID forced to 2, the 12 x 64 outputs take a 2 x 2 grid (one block
    past the end) and still equal the oracle."""
    from poot.backends.gpu.strategies import attention as A
    from poot.backends.gpu.strategies.attention import emit as E
    from poot.backends.vulkan.codegen import codegen_vulkan

    shape = dict(B=2, T=1, Hkv=2, G=3, S=50, D=64, Dv=64, mask="f32", softcap=0.0)
    g = attention_region(**shape)
    x = region_inputs(**shape, seed=11)
    want = oracle.evaluate(g, x)["r0"]
    target = _vk_target(vk_device, 4)
    sg = target.caps.subgroup_size
    plan = A.AttentionPlan(sg, 2, 3, 1, 20, 3, max(sg, min(256, 4 * sg)), 2)
    monkeypatch.setattr(A, "plan_attention", lambda reg, caps: plan)
    monkeypatch.setattr(E, "MAX_GRID", 2)            # where the combine kernel reads it
    art = codegen_vulkan(g, target)
    nblk = -(-2 * 2 * 3 * 64 // plan.CT)
    assert nblk > 2 and list(art.steps[1].groups[:2]) == [2, -(-nblk // 2)], art.steps[1]
    got = _run(vk_device, art, x)["r0"]
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


def test_plan_rule_boundaries():
    """The single-kernel rule on the CUDA target (warps of 32, 132 SMs): D = 64 decode is
    one launch up to 1024 keys (64 a warp over 16 warps), split past it, at any batch; a
    prefill block of
    16 rows keeps the split plan; a single plan's shared memory and threads stay within the
    target."""
    from poot.backends.cuda.codegen import cuda_target
    from poot.backends.gpu.strategies.attention import (MAX_BLOCK_THREADS, SINGLE_MAX_KEYS,
                                                        match_attention, plan_attention)

    caps = cuda_target().caps

    def plan(**kw):
        kw = dict(dict(B=1, T=1, Hkv=8, G=4, D=64, Dv=64, mask="i1", softcap=0.0), **kw)
        g = attention_region(**kw)            # held: the function lives in its module
        return plan_attention(match_attention(_callee(g)), caps)

    for S in (64, 256, 512, 1024):
        p = plan(S=S)
        assert p.NS == 1 and p.W > 1 and p.TB <= MAX_BLOCK_THREADS, (S, p)
        assert -(-(-(-S // p.KL)) // p.W) * p.KL <= SINGLE_MAX_KEYS
        assert 4 * p.W * p.R * (64 + 2) <= caps.max_shared_bytes
    for S, W in ((1056, 1), (4096, 1), (32768, 8)):
        p = plan(S=S)                         # split over the GPU: chunks of 16, 64, 512 keys
        assert p.NS > 1 and p.W == W, (S, p)  # 512 keys: 8 warps of 64 (SINGLE_MAX_KEYS)
    # 128 sequences x 8 kv heads: enough row groups for one chunk each, whose keys W warps
    # share (one warp walking all 512 keys measured 4x the time of B = 64's plan)
    for B in (64, 128, 1024):
        p = plan(S=512, B=B)
        assert p.NS == 1 and p.W > 1, (B, p)
    # D = 128 (Llama-3-8B): 32 keys a warp at S = 512 stay one launch, 64 at 1024 split
    # (SINGLE_MAX_KEY_ELEMS, measured)
    assert plan(S=512, D=128, Dv=128).NS == 1
    assert plan(S=1024, D=128, Dv=128).NS > 1
    p = plan(S=512, T=4)                      # 16 rows a block: prefill-shaped
    assert p.R == 16 and p.NS > 1 and p.W == 1
    p = plan(S=64, D=256, Dv=256, G=8)        # 8 rows x 256: W bounded by shared memory
    assert p.NS == 1 and p.W == 4 and 4 * p.W * p.R * (256 + 2) <= caps.max_shared_bytes


def test_f16_attention_region_on_vulkan(vk_device):
    """f16 q/k/v (read as f16, computed in f32) match the oracle."""
    if "storageBuffer16BitAccess" not in vk_device.capabilities().get("features", ()):
        pytest.skip("the device has no 16-bit storage")
    from poot.backends.vulkan.codegen import codegen_vulkan

    shape = dict(B=1, T=3, Hkv=2, G=2, S=40, D=64, Dv=64, mask="i1", softcap=0.0, dt="f16")
    g = attention_region(**shape)
    x = region_inputs(**shape)
    want = oracle.evaluate(g, x)["r0"]
    for cores in (1, 1000):
        got = _run(vk_device, codegen_vulkan(g, _vk_target(vk_device, cores)), x)["r0"]
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=f"cores={cores}")


ROPE_CASES = [(G, T, S, mask) for G, Hkv in ((3, 2), (1, 3)) for T, S in ((1, 7), (1, 300),
                                                                           (4, 64), (5, 300))
              for mask in ("i1", "f32")]


@pytest.mark.parametrize("G,T,S,mask", ROPE_CASES)
def test_rope_and_mask_computed_in_region_on_vulkan(vk_device, G, T, S, mask):
    """A region whose q is RoPE'd from the positions and whose causal mask is computed from
    them (what folding rope_q and the mask region into attention leaves) takes the strategy
    (q staged per block, the mask evaluated per row and key; i1: key batches no row sees
    skipped) and equals the oracle at 1e-5 for one and many chunks, decode and prefill. On
    the 1000-core target a block of at most SINGLE_MAX_ROWS rows is the single kernel (q
    staged by all W subgroups' threads), more rows keep split + combine."""
    from poot.backends.gpu.strategies.attention import (SINGLE_MAX_ROWS, match_attention,
                                                        plan_attention)
    from poot.backends.vulkan.codegen import codegen_vulkan

    i = ROPE_CASES.index((G, T, S, mask))
    D, Dv = HEAD_DIMS[i % len(HEAD_DIMS)]
    shape = dict(B=2, T=T, Hkv=2 if G == 3 else 3, G=G, S=S, D=D, Dv=Dv, mask=mask)
    g = rope_attention_region(**shape, softcap=30.0 if i % 3 == 0 else 0.0)
    x = rope_inputs(**shape, seed=i)
    want = oracle.evaluate(g, x)["r0"]
    assert np.isfinite(want).all()
    if mask == "i1" and T == 1:
        assert not want[1].any()                 # position -1: sees no key, zeros
    reg = match_attention(_callee(g))
    assert reg is not None and reg.q is None and reg.mask is None and reg.mask_const is None
    nss = set()
    for cores in (1, 16, 1000):
        target = _vk_target(vk_device, cores)
        plan = plan_attention(reg, target.caps)
        assert plan is not None
        nss.add(plan.NS)
        if cores == 1000 and S >= 64:
            single = plan.NS == 1 and plan.W > 1
            if plan.R > SINGLE_MAX_ROWS:          # prefill-shaped: split + combine
                assert not single and plan.NS > 1 and plan.W == 1, plan
            elif D <= 64:                         # few key elements a warp: one launch
                assert single, plan
        art = codegen_vulkan(g, target)
        assert len(art.steps) == (1 if plan.NS == 1 else 2)
        got = _run(vk_device, art, x)["r0"]
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL,
                                   err_msg=f"{shape} cores={cores} {plan}")
    assert 1 in nss


def _strided_refusal_region(k_view: bool):
    """q ``[1, 2, 6, 8]`` reshaped from a transposed argument (no strided form: the merged
    rows are not contiguous); with ``k_view`` k is reshaped the same way (refused)."""
    t = _t
    a, tq, q = (1, 3, 4, 8), (1, 4, 3, 8), (1, 2, 6, 8)
    kt = (1, 2, 5, 8)
    if k_view:
        kv = f"""
  %tk = "poot.transpose"(%kx) {{perm = array<i64: 0, 2, 1, 3>}} : ({t(kt)}) -> {t((1, 5, 2, 8))}
  %k = "poot.reshape"(%tk) : ({t((1, 5, 2, 8))}) -> {t(kt)}"""
        kx = t(kt)
    else:
        kv, kx = "", t(kt)
    kref = "%k" if k_view else "%kx"
    return f"""
func.func @region(%a0: {t(a)} {{poot.name = "a0"}}, %a1: {kx} {{poot.name = "a1"}}, %a2: {t(kt)} {{poot.name = "a2"}}, %a3: {t((1, 1, 1, 5), "i1")} {{poot.name = "a3"}}) -> ({t(q)} {{poot.name = "r0"}}) {{
  %r = func.call @attn(%a0, %a1, %a2, %a3) : ({t(a)}, {kx}, {t(kt)}, {t((1, 1, 1, 5), "i1")}) -> {t(q)}
  return %r : {t(q)}
}}
func.func private @attn(%x: {t(a)}, %kx: {kx}, %v: {t(kt)}, %m: {t((1, 1, 1, 5), "i1")}) -> {t(q)} attributes {{poot.dispatch = {{kind = "attention", ops = 3 : i64}}}} {{{kv}
  %tq = "poot.transpose"(%x) {{perm = array<i64: 0, 2, 1, 3>}} : ({t(a)}) -> {t(tq)}
  %q = "poot.reshape"(%tq) : ({t(tq)}) -> {t(q)}
  %a = "poot.attention"(%q, {kref}, %v, %m) {{scale = 1.0 : f64, softcap = 0.0 : f64}} : ({t(q)}, {t(kt)}, {t(kt)}, {t((1, 1, 1, 5), "i1")}) -> {t(q)}
  return %a : {t(q)}
}}"""


def test_non_strided_q_is_computed_on_vulkan(vk_device):
    """A q view with no strided form is taken as a computed q (staged per block) with the
    mask still a view of its argument, and matches the oracle."""
    from poot.backends.gpu.strategies.attention import match_attention
    from poot.backends.vulkan.codegen import codegen_vulkan

    with make_context(), ir.Location.unknown():
        g = Graph.from_module(ir.Module.parse(_strided_refusal_region(False)))
    reg = match_attention(_callee(g))
    assert reg.q is None and reg.mask is not None
    rng = np.random.default_rng(3)
    x = {"a0": rng.standard_normal((1, 3, 4, 8)).astype(np.float32),
         "a1": rng.standard_normal((1, 2, 5, 8)).astype(np.float32),
         "a2": rng.standard_normal((1, 2, 5, 8)).astype(np.float32),
         "a3": np.array([[[[1, 0, 1, 1, 0]]]], bool)}
    want = oracle.evaluate(g, x)["r0"]
    for cores in (1, 1000):
        art = codegen_vulkan(g, _vk_target(vk_device, cores))
        np.testing.assert_allclose(_run(vk_device, art, x)["r0"], want, rtol=RTOL, atol=ATOL)


def smollm2_region() -> Graph:
    """The SmolLM2-135M decode step's regions around one layer's attention, as the step
    holds them before folding (cap 256): the RoPE tables of the 9 query heads from the
    position, RoPE of q, the causal mask ``iota <= position``, attention over the
    ``[1, 256, 3, 64]`` KV caches (GQA 9/3). Arguments: q ``[1, 1, 9, 64]``, positions
    ``[1, 1]``, k and v caches; result ``[1, 3, 3, 1, 64]``."""
    freqs = ", ".join(f"{1.0 / 100000 ** (2 * i / 64):.8e}" for i in range(32))
    t = _t
    kv, qa, half = t((1, 256, 3, 64)), t((1, 1, 9, 64)), t((1, 1, 9, 32))
    q4 = t((1, 3, 3, 64))
    q5, m3, m5 = t((1, 3, 3, 1, 64)), t((1, 1, 256), "i1"), t((1, 1, 1, 1, 256), "i1")
    kt, pos = t((1, 3, 256, 64)), t((1, 1), "i32")
    text = f"""
func.func @region(%a0: {qa} {{poot.name = "a0"}}, %a1: {pos} {{poot.name = "a1"}}, %a2: {kv} {{poot.name = "a2"}}, %a3: {kv} {{poot.name = "a3"}}) -> ({q5} {{poot.name = "r0"}}) {{
  %t:2 = func.call @tables(%a1) : ({pos}) -> ({half}, {half})
  %q = func.call @rope(%a0, %t#0, %t#1) : ({qa}, {half}, {half}) -> {q4}
  %m = func.call @mask(%a1) : ({pos}) -> {m3}
  %r = func.call @attn(%a2, %q, %a3, %m) : ({kv}, {q4}, {kv}, {m3}) -> {q5}
  return %r : {q5}
}}
func.func private @tables(%arg0: {pos}) -> ({half}, {half}) attributes {{poot.dispatch = {{kind = "elementwise", ops = 14 : i64}}}} {{
  %0 = "poot.constant"() {{value = dense<[[[{freqs}]]]> : tensor<1x1x32xf32>}} : () -> tensor<1x1x32xf32>
  %1 = "poot.cast"(%arg0) : ({pos}) -> tensor<1x1xf32>
  %2 = "poot.reshape"(%1) : (tensor<1x1xf32>) -> tensor<1x1x1xf32>
  %3 = "poot.broadcast"(%2) {{dims = array<i64: 0, 1, 2>}} : (tensor<1x1x1xf32>) -> tensor<1x1x32xf32>
  %4 = "poot.binary"(%3, %0) {{fn = "mul"}} : (tensor<1x1x32xf32>, tensor<1x1x32xf32>) -> tensor<1x1x32xf32>
  %5 = "poot.unary"(%4) {{fn = "cos"}} : (tensor<1x1x32xf32>) -> tensor<1x1x32xf32>
  %6 = "poot.unary"(%4) {{fn = "sin"}} : (tensor<1x1x32xf32>) -> tensor<1x1x32xf32>
  %9 = "poot.reshape"(%5) : (tensor<1x1x32xf32>) -> tensor<1x1x1x32xf32>
  %10 = "poot.broadcast"(%9) {{dims = array<i64: 0, 1, 2, 3>}} : (tensor<1x1x1x32xf32>) -> {half}
  %11 = "poot.reshape"(%6) : (tensor<1x1x32xf32>) -> tensor<1x1x1x32xf32>
  %12 = "poot.broadcast"(%11) {{dims = array<i64: 0, 1, 2, 3>}} : (tensor<1x1x1x32xf32>) -> {half}
  return %10, %12 : {half}, {half}
}}
func.func private @rope(%arg0: {qa}, %arg1: {half}, %arg2: {half}) -> {q4} attributes {{poot.dispatch = {{kind = "rope", ops = 12 : i64}}}} {{
{rope_body((1, 1, 9, 64), "f32", q4)}
}}
func.func private @mask(%arg0: {pos}) -> {m3} attributes {{poot.dispatch = {{kind = "elementwise", ops = 3 : i64}}}} {{
  %0 = "poot.iota"() {{axis = 1 : i64}} : () -> tensor<1x256xi32>
  %1 = "poot.reshape"(%0) : (tensor<1x256xi32>) -> tensor<1x1x256xi32>
  %2 = "poot.reshape"(%arg0) : ({pos}) -> tensor<1x1x1xi32>
  %3 = "poot.broadcast"(%2) {{dims = array<i64: 0, 1, 2>}} : (tensor<1x1x1xi32>) -> tensor<1x1x256xi32>
  %4 = "poot.compare"(%1, %3) {{pred = "le"}} : (tensor<1x1x256xi32>, tensor<1x1x256xi32>) -> {m3}
  return %4 : {m3}
}}
func.func private @attn(%arg0: {kv}, %arg1: {q4}, %arg2: {kv}, %arg3: {m3}) -> {q5} attributes {{poot.dispatch = {{kind = "attention", ops = 5 : i64}}}} {{
  %0 = "poot.transpose"(%arg0) {{perm = array<i64: 0, 2, 1, 3>}} : ({kv}) -> {kt}
  %1 = "poot.reshape"(%arg1) : ({q4}) -> {q5}
  %2 = "poot.transpose"(%arg2) {{perm = array<i64: 0, 2, 1, 3>}} : ({kv}) -> {kt}
  %3 = "poot.reshape"(%arg3) : ({m3}) -> {m5}
  %4 = "poot.attention"(%1, %2, %0, %3) {{scale = 1.250000e-01 : f64, softcap = 0.000000e+00 : f64}} : ({q5}, {kt}, {kt}, {m5}) -> {q5}
  return %4 : {q5}
}}"""
    with make_context(), ir.Location.unknown():
        module = ir.Module.parse(text)
    return Graph.from_module(module)


def test_smollm2_layer_folds_into_attention_on_vulkan(vk_device):
    """The SmolLM2-shaped regions fold into the attention region (RoPE tables, RoPE of q
    and the mask cost no launch of their own), the attention region is one launch (256
    keys: the single-kernel plan) and matches the oracle for positions at the start, middle
    and end of the cache (most batches past the position skipped)."""
    from poot.backends.vulkan.codegen import codegen_vulkan

    g = smollm2_region()
    rng = np.random.default_rng(7)
    x = {"a0": rng.standard_normal((1, 1, 9, 64)).astype(np.float32),
         "a2": rng.standard_normal((1, 256, 3, 64)).astype(np.float32),
         "a3": rng.standard_normal((1, 256, 3, 64)).astype(np.float32)}
    for cores in (1, 1000):
        target = _vk_target(vk_device, cores)
        art = codegen_vulkan(g, target)
        assert len(art.steps) == 1                     # the one attention kernel: nothing else
        for p in (0, 100, 255):
            x["a1"] = np.array([[p]], np.int32)
            want = oracle.evaluate(g, x)["r0"]
            np.testing.assert_allclose(_run(vk_device, art, x)["r0"], want, rtol=RTOL,
                                       atol=ATOL, err_msg=f"cores={cores} position={p}")


def device_case_plans(vk_device) -> list:
    """The plans the device cases above run (CASES and ROPE_CASES on 1, 16 and 1000 cores,
    LONG_CASES on 1000), planned again here: planning alone, nothing launched."""
    from poot.backends.gpu.strategies.attention import match_attention, plan_attention

    plans = []
    for i, (G, S, mask, softcap) in enumerate(CASES):
        D, Dv = HEAD_DIMS[i % len(HEAD_DIMS)]
        T = 1 if i % 2 == 0 else min(4, -(-S // 2))
        g = attention_region(B=2, T=T, Hkv=2 if G == 3 else 3, G=G, S=S, D=D, Dv=Dv,
                             mask=mask, softcap=softcap)
        plans += [plan_attention(match_attention(_callee(g)), _vk_target(vk_device, c).caps)
                  for c in (1, 16, 1000)]
    for T, G, S, D, mask in LONG_CASES:
        g = attention_region(B=1, T=T, Hkv=2, G=G, S=S, D=D, Dv=D, mask=mask, softcap=0.0)
        plans.append(plan_attention(match_attention(_callee(g)),
                                    _vk_target(vk_device, 1000).caps))
    for i, (G, T, S, mask) in enumerate(ROPE_CASES):
        D, Dv = HEAD_DIMS[i % len(HEAD_DIMS)]
        g = rope_attention_region(B=2, T=T, Hkv=2 if G == 3 else 3, G=G, S=S, D=D, Dv=Dv,
                                  mask=mask, softcap=30.0 if i % 3 == 0 else 0.0)
        reg = match_attention(_callee(g))
        plans += [plan_attention(reg, _vk_target(vk_device, c).caps) for c in (1, 16, 1000)]
    assert None not in plans
    return plans


def test_device_plans_covered_every_kernel_shape(vk_device):
    """The device cases above run one and several chunks, several key batches per chunk,
    one lane per key as well as dot products split over lanes, and single-kernel blocks of
    one and of several subgroups (the split ones: long context and prefill). Their plans
    are made here again, so this holds whatever order or subset of tests runs."""
    plans = device_case_plans(vk_device)
    assert len(plans) == 3 * (len(CASES) + len(ROPE_CASES)) + len(LONG_CASES)
    assert {p.NS == 1 for p in plans} == {True, False}
    assert any(p.C > p.KL for p in plans)
    ws = {p.W for p in plans if p.NS == 1}
    assert 1 in ws and max(ws) >= 8, ws
    dls = {p.DL for p in plans}
    assert 1 in dls and len(dls) >= 3, dls


# ---- paged attention (poot.paged_attention) ----------------------------------------------------

def paged_region(B, T, Hkv, G, NB, bs, TW, D, Dv, mask, kv="f16", softcap=0.0) -> Graph:
    """``@region`` calling a dispatch whose root is ``poot.paged_attention`` as a paged step
    holds it: q ``[B, T, H, D]`` reshaped to ``[B, T, Hkv, G, D]`` and transposed to
    ``[B, Hkv, G, T, D]``; the block pools ``[NB, bs, Hkv, D|Dv]`` (``kv`` dtype) and the
    table ``[B, TW]`` i32 read as they are; the mask ``[B, T, S]`` (``i1``, or an ``f32``
    bias) reshaped to ``[B, 1, 1, T, S]`` (``S = TW * bs``); the result
    ``[B, Hkv, G, T, Dv]`` reshaped to ``[B, H, T, Dv]``. Arguments: q, k pool, v pool,
    table, mask."""
    H, S = Hkv * G, TW * bs
    qa, q5, q = (B, T, H, D), (B, T, Hkv, G, D), (B, Hkv, G, T, D)
    kp, vp, tb = _t((NB, bs, Hkv, D), kv), _t((NB, bs, Hkv, Dv), kv), _t((B, TW), "i32")
    ma, m5 = (B, T, S), (B, 1, 1, T, S)
    mt = "i1" if mask == "i1" else "f32"
    res, out = (B, Hkv, G, T, Dv), (B, H, T, Dv)
    ins = [_t(qa), kp, vp, tb, _t(ma, mt)]
    body = f"""
  %q5 = "poot.reshape"(%arg0) : ({_t(qa)}) -> {_t(q5)}
  %q = "poot.transpose"(%q5) {{perm = array<i64: 0, 2, 3, 1, 4>}} : ({_t(q5)}) -> {_t(q)}
  %m = "poot.reshape"(%arg4) : ({_t(ma, mt)}) -> {_t(m5, mt)}
  %a = "poot.paged_attention"(%q, %arg1, %arg2, %arg3, %m) {{scale = {float(1.0 / np.sqrt(D))!r} : f64, softcap = {float(softcap)!r} : f64}} : ({_t(q)}, {kp}, {vp}, {tb}, {_t(m5, mt)}) -> {_t(res)}
  %r = "poot.reshape"(%a) : ({_t(res)}) -> {_t(out)}
  return %r : {_t(out)}"""
    return dispatch_region(ins, _t(out), body, "paged_attention", 5)


def paged_inputs(B, T, Hkv, G, NB, bs, TW, D, Dv, mask, kv="f16", ends=(), window=None,
                 holes=False, seed=0) -> dict:
    """A paged cache as a serving engine leaves it. Sequence b's queries sit at positions
    ``ends[b] - T + 1 .. ends[b]`` (``ends[b] = -1``: a decode row that sees no key); key j
    is visible to the query at p when ``j <= p`` (and ``p - j < window``; ``holes``: 20% of
    the other keys masked too); an ``f32`` mask is a random bias there and ``-inf``
    elsewhere. The table: distinct random blocks per sequence, the first block shared by
    sequences 0 and 1 (a common prefix), the entries past a sequence's last block -1, NB + 3
    (clamped into the pool) or a block of another sequence. Every pool row no query sees
    holds ``inf`` keys and ``NaN``/``inf`` values (what a freed, reused block may hold).
    Returns q, k, v (pools in ``kv``), table, mask ``[B, T, S]``, pos ``[B, T]``."""
    rng = np.random.default_rng(seed)
    H, S = Hkv * G, TW * bs
    pos = np.array([[e - T + 1 + t for t in range(T)] for e in ends], np.int32)
    blocks = rng.permutation(NB)
    table = np.zeros((B, TW), np.int32)
    used = 0
    for b in range(B):
        n = max(0, int(pos[b].max()) // bs + 1)
        for w in range(TW):
            if w < n and b == 1 and w == 0 and B > 1:
                table[b, w] = table[0, 0]                     # a shared prefix block
            elif w < n:
                table[b, w], used = blocks[used % NB], used + 1
            else:
                table[b, w] = (-1, NB + 3, int(rng.integers(NB)))[w % 3]
    j = np.arange(S)
    vis = j[None, None] <= pos[..., None]                                # [B, T, S]
    if window:
        vis &= pos[..., None] - j[None, None] < window
    if holes:
        vis &= (rng.random(vis.shape) < 0.8) | (j[None, None] == pos[..., None])
    seen = np.zeros((NB, bs), bool)
    for b, t, jj in zip(*np.nonzero(vis)):
        seen[min(max(table[b, jj // bs], 0), NB - 1), jj % bs] = True
    k = rng.standard_normal((NB, bs, Hkv, D)).astype(np.float32)
    v = rng.standard_normal((NB, bs, Hkv, Dv)).astype(np.float32)
    k[~seen] = np.inf
    v[~seen] = np.nan
    v[~seen & (np.arange(bs)[None] % 2 == 0)] = np.inf
    if mask == "i1":
        m = vis
    else:
        m = np.where(vis, 0.5 * rng.standard_normal(vis.shape), -np.inf).astype(np.float32)
    dt = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}[kv]
    return {"q": rng.standard_normal((B, T, H, D)).astype(np.float32), "k": k.astype(dt),
            "v": v.astype(dt), "table": table, "mask": m, "pos": pos}


#: (B, T, Hkv, G, NB, bs, TW, D, Dv, mask, kv, softcap, window, holes, ends): decode (GQA,
#: MHA; a row that sees no key; a shared prefix block) and prefill (a sliding window, random
#: holes), f32/f16/bf16 pools, i1 and bias masks, a soft cap, Dv not a multiple of the
#: subgroup, and a long decode (1152 keys: split + combine on a big target)
PAGED_CASES = [
    (3, 1, 2, 3, 20, 4, 8, 32, 32, "i1", "f16", 0.0, None, False, (13, 1, -1)),
    (2, 1, 2, 4, 24, 8, 10, 64, 48, "f32", "bf16", 30.0, None, False, (70, 9)),
    (2, 4, 1, 2, 16, 4, 8, 16, 16, "i1", "f32", 0.0, 5, True, (20, 3)),
    (1, 3, 3, 1, 12, 16, 6, 32, 32, "f32", "f16", 0.0, None, False, (60,)),
    (1, 1, 2, 2, 80, 16, 72, 32, 32, "i1", "bf16", 0.0, None, False, (1100,)),
]


def _paged_shape(case):
    names = ("B", "T", "Hkv", "G", "NB", "bs", "TW", "D", "Dv", "mask", "kv")
    return dict(zip(names, case[:11]))


@pytest.mark.parametrize("case", PAGED_CASES, ids=lambda c: f"{c[1]}x{c[6] * c[5]}-{c[9]}-{c[10]}")
def test_paged_attention_matches_oracle_on_vulkan(vk_device, case):
    """``poot.paged_attention`` regions (keys read through a scattered table with a shared
    block and out-of-range entries, pools poisoned with inf/NaN wherever no query looks),
    planned for targets of 1, 16 and 1000 cores, run on the device and equal the oracle at
    1e-5: the poison never leaks (a masked key contributes nothing), a row that sees no key
    gives zeros, and the long context splits into chunks on the big target."""
    from poot.backends.gpu.strategies.attention import match_attention, plan_attention
    from poot.backends.vulkan.codegen import codegen_vulkan

    shape = _paged_shape(case)
    softcap, window, holes, ends = case[11:]
    g = paged_region(**shape, softcap=softcap)
    x = paged_inputs(**shape, ends=ends, window=window, holes=holes,
                     seed=PAGED_CASES.index(case))
    feed = {f"a{i}": x[n] for i, n in enumerate(("q", "k", "v", "table", "mask"))}
    assert not np.isfinite(x["k"].astype(np.float32)).all()
    want = oracle.evaluate(g, feed)["r0"]
    assert np.isfinite(want).all()
    for b, e in enumerate(ends):
        assert (e >= 0) == bool(want[b].any())             # no visible key: zeros
    reg = match_attention(_callee(g))
    assert reg.paged is not None and reg.paged.bs == shape["bs"]
    for cores in (1, 16, 1000):
        target = _vk_target(vk_device, cores)
        plan = plan_attention(reg, target.caps)
        art = codegen_vulkan(g, target)
        assert len(art.steps) == (1 if plan.NS == 1 else 2)
        got = _run(vk_device, art, feed)["r0"]
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL,
                                   err_msg=f"{shape} cores={cores} {plan}")
    if shape["TW"] * shape["bs"] > 1024:
        assert plan.NS > 1                                 # long context: split + combine


#: forced plans (bs, TW, batches per chunk, W, DL, mask): chunks that start inside a KV
#: block (their staged table starts mid-table), several chunks of W-subgroup blocks, a
#: subgroup with no batch (guarded), dot products split over 2 and 8 lanes
PAGED_FORCED = [(4, 12, 5, 2, 2, "i1"), (3, 7, 9, 1, 8, "f32"), (8, 5, 5, 4, 1, "i1"),
                (5, 9, 2, 4, 1, "f32")]


def _forced_plan(sg: int, bs: int, TW: int, nbat: int, W: int, DL: int):
    """The hand-made plan of a :data:`PAGED_FORCED` case (GQA 2 x 3: 3 rows a block) for
    subgroups of ``sg``: chunks of ``nbat`` key batches."""
    from poot.backends.gpu.strategies.attention import AttentionPlan

    C = nbat * (sg // DL)
    return AttentionPlan(sg, DL, 3, 1, C, -(-bs * TW // C), max(sg, min(256, 4 * sg)), W)


@pytest.mark.parametrize("bs,TW,nbat,W,DL,mask", PAGED_FORCED)
def test_paged_forced_plans_on_vulkan(vk_device, monkeypatch, bs, TW, nbat, W, DL, mask):
    """Every chunking the paged emitter takes, planned by hand (decode, GQA 2 x 3, f16
    pools, poisoned stale rows), equals the oracle."""
    from poot.backends.gpu.strategies import attention as A
    from poot.backends.vulkan.codegen import codegen_vulkan

    shape = dict(B=2, T=1, Hkv=2, G=3, NB=2 * TW + 1, bs=bs, TW=TW, D=64, Dv=64, mask=mask)
    S = bs * TW
    g = paged_region(**shape)
    x = paged_inputs(**shape, ends=(S - 2, S // 3), seed=S + W)
    feed = {f"a{i}": x[n] for i, n in enumerate(("q", "k", "v", "table", "mask"))}
    want = oracle.evaluate(g, feed)["r0"]
    target = _vk_target(vk_device, 4)
    plan = _forced_plan(target.caps.subgroup_size, bs, TW, nbat, W, DL)
    monkeypatch.setattr(A, "plan_attention", lambda reg, caps: plan)
    art = codegen_vulkan(g, target)
    assert len(art.steps) == (1 if plan.NS == 1 else 2)
    np.testing.assert_allclose(_run(vk_device, art, feed)["r0"], want, rtol=RTOL, atol=ATOL,
                               err_msg=f"{plan}")


#: (B, T, Hkv, G, NB, bs, TW, D, mask, kv, window, ends) of the folded form
PAGED_ROPE_CASES = [(2, 1, 2, 3, 20, 4, 8, 32, "i1", "f16", None, (19, 6)),
                    (2, 1, 2, 3, 20, 4, 8, 32, "f32", "bf16", 4, (19, 6)),
                    (2, 3, 1, 2, 16, 8, 6, 16, "i1", "f32", 5, (40, 2))]


@pytest.mark.parametrize("case", PAGED_ROPE_CASES)
def test_paged_rope_and_mask_computed_in_region_on_vulkan(vk_device, case):
    """The paged attention region as folding leaves it (q RoPE'd from the positions, the
    causal mask, with a sliding window, computed from them; i1 or a select-made bias) takes
    the strategy (q and the table staged per block, the mask evaluated per row and key) and
    equals the oracle for one chunk and several, decode and prefill."""
    from poot.backends.gpu.strategies.attention import match_attention, plan_attention
    from poot.backends.vulkan.codegen import codegen_vulkan

    B, T, Hkv, G, NB, bs, TW, D, mask, kv, window, ends = case
    g = rope_attention_region(B, T, Hkv, G, TW * bs, D, D, mask, paged=(NB, bs, kv),
                              window=window)
    x = paged_inputs(B, T, Hkv, G, NB, bs, TW, D, D, mask, kv, ends=ends, window=window,
                     seed=PAGED_ROPE_CASES.index(case))
    feed = {"a0": x["q"], "a1": x["pos"], "a2": x["k"], "a3": x["v"], "a4": x["table"]}
    want = oracle.evaluate(g, feed)["r0"]
    assert np.isfinite(want).all()
    reg = match_attention(_callee(g))
    assert reg.paged is not None and reg.q is None and reg.mask_value is not None
    nss = set()
    for cores in (1, 1000):
        target = _vk_target(vk_device, cores)
        nss.add(plan_attention(reg, target.caps).NS)
        got = _run(vk_device, codegen_vulkan(g, target), feed)["r0"]
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=f"cores={cores}")


def test_paged_walk_bounds_follow_the_mask_on_vulkan(vk_device):
    """A one-subgroup chunk first finds the first and last key any row sees, then walks the
    batches between: with a sliding window of 5 over 40 keys (batches of the subgroup's
    keys), for every position of one sequence (the other elsewhere), the first and the last
    visible key landing on every offset of a batch, the result equals the oracle. (9 q heads
    a kv head: blocks of more rows than SINGLE_MAX_ROWS keep the one-subgroup walk.)"""
    from poot.backends.gpu.strategies.attention import (SINGLE_MAX_ROWS, emit_attention,
                                                        match_attention, plan_attention)
    from poot.backends.vulkan.codegen import codegen_vulkan

    shape = dict(B=2, T=1, Hkv=2, G=SINGLE_MAX_ROWS + 1, NB=24, bs=4, TW=10, D=16, Dv=16,
                 mask="i1", kv="f16")
    g = paged_region(**shape)
    target = _vk_target(vk_device, 1)
    reg = match_attention(_callee(g))
    plan = plan_attention(reg, target.caps)
    assert plan.W == 1 and plan.NS == 1 and plan.C >= 3 * plan.KL, plan
    with g.module.context:
        assert "arith.maxsi" in emit_attention(reg, plan).text        # the bounds' butterfly
    k = vk_device.load(codegen_vulkan(g, target))
    for p in range(40):
        x = paged_inputs(**shape, ends=(p, (7 * p + 3) % 40), window=5, seed=p)
        feed = {f"a{i}": x[n] for i, n in enumerate(("q", "k", "v", "table", "mask"))}
        want = oracle.evaluate(g, feed)["r0"]
        bufs = []
        for a in k.args:
            buf = vk_device.alloc(a.type)
            if a.role == "input":
                vk_device.upload(buf, feed[a.name])
            bufs.append(buf)
        vk_device.replay(vk_device.record(k, bufs))
        vk_device.synchronize()
        got = next(vk_device.download(b) for a, b in zip(k.args, bufs) if a.role == "output")
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=f"position {p}")


def test_paged_device_plans_covered_every_kernel_shape(vk_device):
    """The paged device cases (:data:`PAGED_CASES` at 1, 16 and 1000 cores, as
    ``test_paged_attention_matches_oracle_on_vulkan`` plans them, and :data:`PAGED_FORCED`)
    run one and several chunks, one and several subgroups a block, one lane a key and dot
    products split over lanes."""
    from poot.backends.gpu.strategies.attention import match_attention, plan_attention

    plans = []
    for case in PAGED_CASES:
        g = paged_region(**_paged_shape(case), softcap=case[11])   # held: the function's module
        reg = match_attention(_callee(g))
        plans += [plan_attention(reg, _vk_target(vk_device, c).caps) for c in (1, 16, 1000)]
    sg = _vk_target(vk_device, 4).caps.subgroup_size
    plans += [_forced_plan(sg, *f[:5]) for f in PAGED_FORCED]
    assert {p.NS == 1 for p in plans} == {True, False}
    assert {p.W > 1 for p in plans} == {True, False}
    assert {p.DL > 1 for p in plans} == {True, False}


def test_paged_plans_follow_the_dense_ones():
    """On the CUDA target a paged region plans exactly as the dense region of the same
    shape (decode at 512 keys: one launch of 16 warps; 4096 keys: split), so the table costs
    no tuning; a table of 4096 one-position blocks keeps each chunk within
    TABLE_MAX_ENTRIES staged entries."""
    from poot.backends.cuda.codegen import cuda_target
    from poot.backends.gpu.strategies.attention import (TABLE_MAX_ENTRIES, match_attention,
                                                        plan_attention, table_entries)

    caps = cuda_target().caps
    for S, bs in ((512, 16), (4096, 16), (256, 256)):
        g = paged_region(B=1, T=1, Hkv=8, G=4, NB=S // bs + 1, bs=bs, TW=S // bs, D=128,
                         Dv=128, mask="i1", kv="bf16")
        d = attention_region(B=1, T=1, Hkv=8, G=4, S=S, D=128, Dv=128, mask="i1",
                             softcap=0.0)
        pr, dr = match_attention(_callee(g)), match_attention(_callee(d))
        assert plan_attention(pr, caps) == plan_attention(dr, caps), S
    g = paged_region(B=1, T=1, Hkv=2, G=2, NB=4097, bs=1, TW=4096, D=64, Dv=64, mask="i1",
                     kv="f16")
    reg = match_attention(_callee(g))
    plan = plan_attention(reg, cuda_target(cores=1).caps)
    assert plan.NS > 1 and table_entries(reg, plan.C) <= TABLE_MAX_ENTRIES


# ---- CUDA (PTX) ---------------------------------------------------------------------------------

def _ptxas_spills(ptx: str) -> list[str] | None:
    """ptxas -v's spill lines that report spilled bytes (None: no ptxas here)."""
    import shutil
    import subprocess
    import tempfile

    from poot.backends.cuda.codegen import ptx_target

    exe = shutil.which("ptxas")
    if exe is None:
        return None
    with tempfile.TemporaryDirectory() as d:
        src = f"{d}/k.ptx"
        with open(src, "w") as f:
            f.write(ptx)
        r = subprocess.run([exe, f"-arch={ptx_target(ptx)}", "-v", src, "-o", f"{d}/k.cubin"],
                           capture_output=True, text=True, check=True)
    return [ln for ln in r.stderr.splitlines()
            if "spill" in ln and not ln.strip().startswith("0 bytes stack frame, 0 bytes spill")]


@pytest.mark.parametrize("G,T,S,D,Dv,mask,softcap,dt,blocks", [
    (3, 1, 256, 64, 64, "i1", 0.0, "f32", [512]),            # SmolLM2-like decode: one kernel
    (1, 5, 7, 128, 96, "f32", 30.0, "f16", [64]),            # 7 keys: two warps
    (4, 16, 4096, 256, 256, "i1", 50.0, "f32", [64, 128]),   # long prefill: split (2 warps
    #                                                          a chunk of 128 keys) + combine
    (4, 1, 4096, 128, 128, "i1", 0.0, "f32", [32, 128]),     # long-context decode: split
])
def test_attention_region_ptx_assembles(G, T, S, D, Dv, mask, softcap, dt, blocks):
    """For the CUDA target the region becomes the strategy's kernels (one kernel of several
    warps for a short decode, split + combine when the key axis is split), the PTX uses warp
    shuffles and ptxas assembles it."""
    from poot.backends.cuda.codegen import cuda_target, ptx_text, ptxas_check
    from poot.backends.gpu.plan import plan_program

    g = attention_region(B=1, T=T, Hkv=2, G=G, S=S, D=D, Dv=Dv, mask=mask, softcap=softcap,
                         dt=dt)
    plan = plan_program(SimpleNamespace(graph=g, storage=[]), cuda_target().caps)
    kernels = [L for L in plan.launches if L["op"] == "kernel"]
    assert plan.strategies == {"flash_decode": len(kernels)}
    assert [L["block"][0] for L in kernels] == blocks
    if len(kernels) == 2:
        assert kernels[0]["grid"][0] > 1
    ptx = ptx_text(plan.module)
    assert "shfl.sync.bfly" in ptx and "shfl.sync.idx" in ptx
    assert ("bar.sync" in ptx) == (blocks[0] > 32)      # the W-subgroup merge
    if ptxas_check(ptx) is None:
        pytest.skip("ptxas is not installed (PTX generated, not assembled)")


@pytest.mark.parametrize("G,T,S,D,mask", [(3, 1, 256, 64, "i1"), (4, 16, 4096, 128, "f32")])
def test_rope_attention_region_ptx_assembles(G, T, S, D, mask):
    """A region with q RoPE'd and the mask computed in it becomes the strategy's kernels only
    (q staged in shared memory, a const buffer for the frequencies) and ptxas assembles it."""
    from poot.backends.cuda.codegen import cuda_target, ptx_text, ptxas_check
    from poot.backends.gpu.plan import plan_program

    g = rope_attention_region(B=1, T=T, Hkv=2, G=G, S=S, D=D, Dv=D, mask=mask)
    plan = plan_program(SimpleNamespace(graph=g, storage=[]), cuda_target().caps)
    kernels = [L for L in plan.launches if L["op"] == "kernel"]
    assert plan.strategies == {"flash_decode": len(kernels)} and len(kernels) <= 2
    ptx = ptx_text(plan.module)
    assert ".shared" in ptx and "bar.sync" in ptx
    if ptxas_check(ptx) is None:
        pytest.skip("ptxas is not installed (PTX generated, not assembled)")


def test_smollm2_layer_plan_is_attention_only():
    """For CUDA the SmolLM2-shaped regions fold into the attention region and the plan is
    ONE kernel of the strategy (no RoPE, table, mask or combine launch): a block of 16 warps
    per kv head (3 x 3 GQA rows, 256 keys: 16 a warp); ptxas assembles it without spills."""
    from poot.backends.cuda.codegen import cuda_target, ptx_text, ptxas_check
    from poot.backends.gpu.plan import plan_program

    plan = plan_program(SimpleNamespace(graph=smollm2_region(), storage=[]),
                        cuda_target().caps)
    kernels = [L for L in plan.launches if L["op"] == "kernel"]
    assert plan.strategies == {"flash_decode": 1} and len(kernels) == 1
    assert kernels[0]["grid"] == [1, 1, 3] and kernels[0]["block"] == [512, 1, 1]
    assert all(b["role"] != "scratch" for b in plan.buffers)
    ptx = ptx_text(plan.module)
    assert ".maxntid 512, 1, 1" in ptx and "bar.sync" in ptx
    if ptxas_check(ptx) is None:
        pytest.skip("ptxas is not installed (PTX generated, not assembled)")
    assert _ptxas_spills(ptx) == []


#: (Hkv, G, S, D): Llama-3.2-1B, Llama-3-8B decode at capacity 512, then long contexts
LLAMA_SHAPES = [(8, 4, 512, 64, 1), (8, 4, 512, 128, 1), (8, 4, 4096, 64, 2),
                (8, 4, 4096, 128, 2)]


@pytest.mark.parametrize("Hkv,G,S,D,launches", LLAMA_SHAPES)
def test_llama_decode_attention_plans_and_ptx(Hkv, G, S, D, launches):
    """Llama-3.2-1B- and Llama-3-8B-shaped decode regions (RoPE'd q and the causal mask
    computed in the region, GQA 32/8): capacity 512 is one kernel (16 warps a kv head, 32
    keys a warp), 4096 still splits over the GPU (split + combine). ptxas assembles the
    kernels without spilling."""
    from poot.backends.cuda.codegen import cuda_target, ptx_text, ptxas_check
    from poot.backends.gpu.plan import plan_program
    from poot.backends.gpu.strategies.attention import (SINGLE_MAX_KEYS, match_attention,
                                                        plan_attention)

    g = rope_attention_region(B=1, T=1, Hkv=Hkv, G=G, S=S, D=D, Dv=D, mask="i1")
    caps = cuda_target().caps
    p = plan_attention(match_attention(_callee(g)), caps)
    plan = plan_program(SimpleNamespace(graph=g, storage=[]), caps)
    kernels = [L for L in plan.launches if L["op"] == "kernel"]
    assert len(kernels) == launches and (p.NS == 1) == (launches == 1)
    if launches == 1:
        assert p.W == 16 and kernels[0]["block"] == [512, 1, 1]
        assert kernels[0]["grid"] == [1, 1, Hkv]
        assert -(-(-(-S // p.KL)) // p.W) * p.KL <= SINGLE_MAX_KEYS
    else:                                     # split: the busiest warp walks <= 64 keys
        assert kernels[0]["grid"][0] == p.NS > 1 and kernels[0]["block"][0] == 32 * p.W
        assert -(-(p.C // p.KL) // p.W) * p.KL <= SINGLE_MAX_KEYS
    ptx = ptx_text(plan.module)
    if ptxas_check(ptx) is None:
        pytest.skip("ptxas is not installed (PTX generated, not assembled)")
    assert _ptxas_spills(ptx) == []


# ---- views and refusals --------------------------------------------------------------------------

def test_reshape_strides_follow_numpy():
    """The strided reshape agrees with NumPy's no-copy reshape, and refuses where NumPy must
    copy."""
    from poot.backends.gpu.strategies.attention import reshape_strides

    base = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)
    for perm, new in [((0, 2, 1, 3), (2, 4, 15)), ((0, 1, 2, 3), (6, 20)),
                      ((0, 2, 1, 3), (2, 4, 3, 5, 1)), ((1, 0, 2, 3), (3, 2, 20)),
                      ((0, 2, 1, 3), (8, 15)), ((3, 2, 1, 0), (5, 4, 6))]:
        a = base.transpose(perm)
        st = reshape_strides(a.shape, tuple(s // 4 for s in a.strides), new)
        try:
            b = a.view()
            b.shape = new                  # NumPy's no-copy reshape (raises if it must copy)
        except AttributeError:
            assert st is None, (perm, new)
            continue
        assert st is not None, (perm, new)
        flat = base.reshape(-1)
        idx = np.indices(new).reshape(len(new), -1)
        offs = sum(i * s for i, s in zip(idx, st))
        np.testing.assert_array_equal(flat[offs], b.reshape(-1))


def test_views_resolve_to_strided_maps():
    """q/k/v/mask views of the region map onto their arguments with the expected strides
    (GQA rows over the q heads, a transposed KV cache, a broadcast mask)."""
    from poot.backends.gpu.strategies.attention import match_attention

    g = attention_region(B=2, T=3, Hkv=2, G=4, S=10, D=8, Dv=6, mask="f32", softcap=0.0)
    reg = match_attention(_callee(g))
    assert reg is not None and reg.batch == (2, 2) and reg.rows == (4, 3)
    # q arg [2, 3, 8, 8] -> [B, Hkv, G, T, D]
    assert reg.q.arg == 0 and reg.q.strides == (3 * 64, 32, 8, 64, 1)
    assert reg.k.strides == (10 * 16, 8, 16, 1) and reg.v.strides == (10 * 12, 6, 12, 1)
    assert reg.mask.arg == 3 and reg.mask.strides == (0, 0, 0, 10, 1)
    assert (reg.S, reg.D, reg.Dv, reg.mask_kind) == (10, 8, 6, "f32")


def test_view_without_strided_form_is_refused_for_k():
    """A view with no strided form resolves to None; for q that is a computed q (staged),
    for k (a KV cache: read in place, never recomputed) the strategy refuses the region."""
    from poot.backends.gpu.strategies.attention import match_attention, resolve_view

    for k_view in (False, True):
        with make_context(), ir.Location.unknown():
            m = ir.Module.parse(_strided_refusal_region(k_view))
            fn = _callee(Graph.from_module(m))
            body = [o.operation for o in fn.regions[0].blocks[0].operations]
            args = list(fn.regions[0].blocks[0].arguments)
            tq = next(o for o in body if o.name == "poot.transpose" and o.operands[0] == args[0])
            assert resolve_view(tq.results[0], args).strides == (96, 8, 32, 1)
            reg = match_attention(fn)
            if k_view:
                assert reg is None
            else:
                assert reg is not None and reg.q is None and reg.k.arg == 1


def test_other_regions_are_refused():
    """A mask computed in the region is taken; other work is left to the generic mapping:
    k computed (not a view of a KV cache), q through a reduction of 16 terms an element (past
    the scalar emitter's SCALAR_MAX_REDUCE: not elementwise-class), an op that feeds nothing
    the attention reads."""
    from poot.backends.cuda.codegen import cuda_target
    from poot.backends.gpu.strategies.attention import flash_decode

    t = _t
    q, kv, m = t((1, 2, 1, 8)), t((1, 2, 5, 8)), t((1, 1, 1, 5))
    head = f"func.func private @attn(%q: {q}, %k: {kv}, %v: {kv}, %m: {m}) -> {q} {{"
    tail = f"""
  %a = "poot.attention"(%q2, %k2, %v, %vis) {{scale = 1.0 : f64, softcap = 0.0 : f64}} : ({q}, {kv}, {kv}, {t((1, 1, 1, 5), "i1")}) -> {q}
  return %a : {q}
}}"""
    mask = f"""
  %z = "poot.constant"() {{value = dense<0.0> : {m}}} : () -> {m}
  %vis = "poot.compare"(%m, %z) {{pred = "gt"}} : ({m}, {m}) -> {t((1, 1, 1, 5), "i1")}"""
    same = f"""
  %q2 = "poot.reshape"(%q) : ({q}) -> {q}
  %k2 = "poot.reshape"(%k) : ({kv}) -> {kv}"""
    bodies = {
        "mask computed": same,
        "k computed": f"""
  %q2 = "poot.reshape"(%q) : ({q}) -> {q}
  %k2 = "poot.binary"(%k, %k) {{fn = "add"}} : ({kv}, {kv}) -> {kv}""",
        "q reduced": f"""
  %s = "poot.reduce"(%q) {{axes = array<i64: 1, 3>, fn = "sum"}} : ({q}) -> {t((1, 1))}
  %s2 = "poot.reshape"(%s) : ({t((1, 1))}) -> {t((1, 1, 1, 1))}
  %s3 = "poot.broadcast"(%s2) {{dims = array<i64: 0, 1, 2, 3>}} : ({t((1, 1, 1, 1))}) -> {q}
  %q2 = "poot.binary"(%q, %s3) {{fn = "sub"}} : ({q}, {q}) -> {q}
  %k2 = "poot.reshape"(%k) : ({kv}) -> {kv}""",
        "dead op": same + f"""
  %dead = "poot.binary"(%v, %v) {{fn = "mul"}} : ({kv}, {kv}) -> {kv}""",
    }
    for name, body in bodies.items():
        with make_context(), ir.Location.unknown():
            mod = ir.Module.parse(head + mask + body + tail)
            fn = next(o.operation for o in mod.body.operations)
            got = flash_decode(fn, cuda_target().caps)
        assert (got is not None) == (name == "mask computed"), name


@pytest.mark.parametrize("S,bs,kv,mask,launches", [(512, 16, "bf16", "i1", 1),
                                                   (4096, 16, "f16", "f32", 2)])
def test_paged_attention_region_ptx_assembles(S, bs, kv, mask, launches):
    """Llama-3-8B-shaped paged decode regions as folding leaves them (GQA 32/8, D = 128,
    q RoPE'd and the causal mask computed in the region; bf16 or f16 pools) become the
    strategy's kernels for CUDA only: one launch of 16 warps a kv head at 512 keys, split +
    combine at 4096. The table is staged in shared memory, the pools are read as 16-bit
    words, and ptxas assembles the kernels without spilling."""
    from poot.backends.cuda.codegen import cuda_target, ptx_text, ptxas_check
    from poot.backends.gpu.plan import plan_program

    g = rope_attention_region(B=1, T=1, Hkv=8, G=4, S=S, D=128, Dv=128, mask=mask,
                              paged=(S // bs + 8, bs, kv))
    plan = plan_program(SimpleNamespace(graph=g, storage=[]), cuda_target().caps)
    kernels = [L for L in plan.launches if L["op"] == "kernel"]
    assert plan.strategies == {"flash_decode": launches} and len(kernels) == launches
    if launches == 1:
        assert kernels[0]["block"] == [512, 1, 1] and kernels[0]["grid"] == [1, 1, 8]
    ptx = ptx_text(plan.module)
    assert "ld.shared.b32" in ptx and "bar.sync" in ptx and "ld.global.b16" in ptx
    assert "shfl.sync.bfly" in ptx and "shfl.sync.idx" in ptx
    if ptxas_check(ptx) is None:
        pytest.skip("ptxas is not installed (PTX generated, not assembled)")
    assert _ptxas_spills(ptx) == []


def test_lora_q_expand_is_computed_outside_the_attention():
    """The tiny Llama's decode step with a LoRA slot, planned for CUDA: the attention
    dispatches read no LoRA weight (a small contraction in a computed q would be evaluated
    by every block of the attention again: 8 chunks of the 1B shape's 32-token prefill, 27
    -> 45 us a layer), while another dispatch of each layer reads its q expand's B."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))
    from model_steps import fixture_path

    from poot.api import bind_lora_slots
    from poot.backends.cuda.codegen import cuda_target
    from poot.compiler.compile import compile as compile_step
    from poot.models import StepSpec, load_model

    model, weights = load_model(fixture_path("llama"))
    weights, _ = bind_lora_slots(model, weights, 1, 8)
    g = model.trace(StepSpec.decode(kv_capacity=16), weights.types)
    plan = compile_step(g, cuda_target()).executable.plan
    name = {i: b.get("name", "") for i, b in enumerate(plan["buffers"])}
    attn = [d for d in plan["dispatches"] if d["kind"] in ("attention", "paged_attention")]
    assert attn
    for d in attn:
        assert not [name[a] for a in d["args"] if name[a].startswith("lora.")], d["callee"]
    q_b = [d["callee"] for d in plan["dispatches"]
           if any(name[a].endswith("attn.q.b") for a in d["args"])]
    assert len(q_b) == model.dims().n_layers
