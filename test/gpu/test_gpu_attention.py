"""The flash-decoding attention strategy (:mod:`poot.backends.gpu.strategies.attention`):
``poot.attention`` dispatch regions built directly (GQA and MHA, decode and prefill, i1 and
additive masks, soft cap) run on a Vulkan device (lavapipe in CI) and match the CPU oracle at
1e-5; the same regions become PTX that ptxas assembles; the view resolution and the refusals."""

from __future__ import annotations

import os
import tempfile
from types import SimpleNamespace

import numpy as np
import pytest
from mlir import ir

from poot import oracle
from poot.dialects import make_context
from poot.graph.builder import Graph

os.environ.setdefault("MESA_SHADER_CACHE_DIR", tempfile.mkdtemp(prefix="poot-mesa-cache-"))
os.environ.setdefault("LP_NUM_THREADS", "2")

RTOL = ATOL = 1e-5


# ---- regions -------------------------------------------------------------------------------------

def _t(shape, dt="f32") -> str:
    return f"tensor<{'x'.join(str(s) for s in shape)}x{dt}>"


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
    args = ", ".join(f"%arg{i}: {t}" for i, t in enumerate(ins))
    rargs = ", ".join(f'%a{i}: {t} {{poot.name = "a{i}"}}' for i, t in enumerate(ins))
    text = f"""
func.func @region({rargs}) -> ({_t(out)} {{poot.name = "r0"}}) {{
  %r = func.call @attn(%a0, %a1, %a2, %a3) : ({", ".join(ins)}) -> {_t(out)}
  return %r : {_t(out)}
}}
func.func private @attn({args}) -> {_t(out)} attributes {{poot.dispatch = {{kind = "attention", ops = 7 : i64}}}} {{{body}
}}"""
    with make_context(), ir.Location.unknown():
        module = ir.Module.parse(text)
    return Graph.from_module(module)


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


# ---- Vulkan -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def vk_device():
    try:
        from poot.backends.vulkan.runtime import VulkanDevice, VulkanError
    except ImportError as e:
        pytest.skip(f"vulkan package not installed ({e})")
    try:
        dev = VulkanDevice()
    except VulkanError as e:
        pytest.skip(f"no usable Vulkan device: {e}")
    yield dev
    dev.close()


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
    PLANS.extend(plans)


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


#: the plans the device test ran (checked for coverage below)
PLANS: list = []


def test_device_plans_covered_every_kernel_shape(vk_device):
    """The device cases above ran one and several chunks, several key batches per chunk,
    and one lane per key as well as dot products split over lanes."""
    if len(PLANS) < 3 * len(CASES):
        pytest.skip("runs after the device cases (run the whole module)")
    assert {p.NS == 1 for p in PLANS} == {True, False}
    assert any(p.C > p.KL for p in PLANS)
    dls = {p.DL for p in PLANS}
    assert 1 in dls and len(dls) >= 3, dls


# ---- CUDA (PTX) ---------------------------------------------------------------------------------

@pytest.mark.parametrize("G,T,S,D,Dv,mask,softcap,dt", [
    (3, 1, 256, 64, 64, "i1", 0.0, "f32"),        # SmolLM2-like decode
    (1, 5, 7, 128, 96, "f32", 30.0, "f16"),
    (4, 16, 4096, 256, 256, "i1", 50.0, "f32"),   # long prefill, 256-wide heads
])
def test_attention_region_ptx_assembles(G, T, S, D, Dv, mask, softcap, dt):
    """For the CUDA target the region becomes the strategy's kernels (split + combine when
    the key axis is split), the PTX uses warp shuffles and ptxas assembles it."""
    from poot.backends.cuda.codegen import cuda_target, ptx_text, ptxas_check
    from poot.backends.gpu.plan import plan_program

    g = attention_region(B=1, T=T, Hkv=2, G=G, S=S, D=D, Dv=Dv, mask=mask, softcap=softcap,
                         dt=dt)
    plan = plan_program(SimpleNamespace(graph=g, storage=[]), cuda_target().caps)
    kernels = [L for L in plan.launches if L["op"] == "kernel"]
    assert plan.strategies == {"flash_decode": len(kernels)}
    assert all(L["block"][0] == 32 for L in kernels[:1])
    if S >= 256:
        assert len(kernels) == 2 and kernels[0]["grid"][0] > 1
    ptx = ptx_text(plan.module)
    assert "shfl.sync.bfly" in ptx and "shfl.sync.idx" in ptx
    if ptxas_check(ptx) is None:
        pytest.skip("ptxas is not installed (PTX generated, not assembled)")


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


def test_view_without_strided_form_is_refused():
    """q reshaped from a transposed view into a shape no strides express (the merged rows are
    not contiguous) makes the strategy refuse the region."""
    from poot.backends.gpu.strategies.attention import match_attention, resolve_view

    t = _t
    a, tq, q = (1, 3, 4, 8), (1, 4, 3, 8), (1, 2, 6, 8)
    text = f"""
func.func private @attn(%x: {t(a)}, %k: {t((1, 2, 5, 8))}, %v: {t((1, 2, 5, 8))}, %m: {t((1, 1, 1, 5), "i1")}) -> {t(q)} {{
  %tq = "poot.transpose"(%x) {{perm = array<i64: 0, 2, 1, 3>}} : ({t(a)}) -> {t(tq)}
  %q = "poot.reshape"(%tq) : ({t(tq)}) -> {t(q)}
  %a = "poot.attention"(%q, %k, %v, %m) {{scale = 1.0 : f64, softcap = 0.0 : f64}} : ({t(q)}, {t((1, 2, 5, 8))}, {t((1, 2, 5, 8))}, {t((1, 1, 1, 5), "i1")}) -> {t(q)}
  return %a : {t(q)}
}}"""
    with make_context(), ir.Location.unknown():
        m = ir.Module.parse(text)
        fn = next(o.operation for o in m.body.operations)
        body = [o.operation for o in fn.regions[0].blocks[0].operations]
        args = list(fn.regions[0].blocks[0].arguments)
        assert resolve_view(body[0].results[0], args).strides == (96, 8, 32, 1)
        assert resolve_view(body[1].results[0], args) is None
        assert match_attention(fn) is None


def test_other_regions_are_refused():
    """A region with other work around the attention (here the mask computed inside it) is
    left to the generic mapping."""
    from poot.backends.gpu.strategies.attention import flash_decode
    from poot.backends.cuda.codegen import cuda_target

    t = _t
    text = f"""
func.func private @attn(%q: {t((1, 2, 1, 8))}, %k: {t((1, 2, 5, 8))}, %v: {t((1, 2, 5, 8))}, %m: {t((1, 1, 1, 5))}) -> {t((1, 2, 1, 8))} {{
  %z = "poot.constant"() {{value = dense<0.0> : {t((1, 1, 1, 5))}}} : () -> {t((1, 1, 1, 5))}
  %vis = "poot.compare"(%m, %z) {{pred = "gt"}} : ({t((1, 1, 1, 5))}, {t((1, 1, 1, 5))}) -> {t((1, 1, 1, 5), "i1")}
  %a = "poot.attention"(%q, %k, %v, %vis) {{scale = 1.0 : f64, softcap = 0.0 : f64}} : ({t((1, 2, 1, 8))}, {t((1, 2, 5, 8))}, {t((1, 2, 5, 8))}, {t((1, 1, 1, 5), "i1")}) -> {t((1, 2, 1, 8))}
  return %a : {t((1, 2, 1, 8))}
}}"""
    with make_context(), ir.Location.unknown():
        m = ir.Module.parse(text)
        fn = next(o.operation for o in m.body.operations)
        assert flash_decode(fn, cuda_target().caps) is None
