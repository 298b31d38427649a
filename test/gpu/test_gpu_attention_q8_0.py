"""The flash-decoding strategy over q8_0 KV pools (:mod:`poot.dialects.kv_quant`: i8 values
and one f16 scale per 32 values of a head): a lane dequantizes K and V where it loads them,
never a separate dequantize of the cache. The same kernels lower for Vulkan (run here on
lavapipe), CUDA (PTX that ptxas assembles) and ROCm (HSACO code objects): paged decode regions
(head dims 64 and 128, GQA and MHA, contexts that end inside a block, a permuted block table
whose stale entries hold inf scales) equal a straight numpy dequantize-then-attend."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
pytest.importorskip("mlir.ir", reason="the MLIR wheels (xtc-mlir-python-bindings) are not "
                    "installed here: this module compiles kernels")
from mlir import ir

from test_gpu_attention import (_callee, _ptxas_spills, _run, _t, _vk_target,
                                dispatch_region, rope_attention_region)

from poot.dialects import make_context
from poot.dialects.kv_quant import dequantize_q8_0, quantize_q8_0
from poot.graph.builder import Graph

#: against numpy in f64 (the kernels accumulate in f32)
RTOL = ATOL = 1e-4


def q8_region(B, Hkv, G, NB, bs, TW, D, mask, k_q8=True, v_q8=True) -> Graph:
    """``@region`` calling a decode dispatch whose root is ``poot.paged_attention`` over
    pools ``[NB, bs, Hkv, D]``, each q8_0 (``i8`` values, then its f16 scales ``[NB, bs,
    Hkv, D / 32]`` among the trailing arguments, k's first) or f16: q ``[B, 1, H, D]``
    reshaped and transposed to ``[B, Hkv, G, 1, D]``, the table ``[B, TW]`` i32, the mask
    ``[B, 1, S]`` (i1, or an f32 bias) reshaped to ``[B, 1, 1, 1, S]``; the result
    ``[B, Hkv, G, 1, D]`` reshaped to ``[B, H, 1, D]``. Arguments: q, k pool, v pool, table,
    mask, scales..."""
    H, S = Hkv * G, TW * bs
    qa, q5, q = (B, 1, H, D), (B, 1, Hkv, G, D), (B, Hkv, G, 1, D)
    kp, vp = (_t((NB, bs, Hkv, D), "i8" if x else "f16") for x in (k_q8, v_q8))
    scales = [_t((NB, bs, Hkv, D // 32), "f16")] * (int(k_q8) + int(v_q8))
    tb, ma, m5 = _t((B, TW), "i32"), (B, 1, S), (B, 1, 1, 1, S)
    mt = "i1" if mask == "i1" else "f32"
    res, out = (B, Hkv, G, 1, D), (B, H, 1, D)
    ins = [_t(qa), kp, vp, tb, _t(ma, mt)] + scales
    sargs = "".join(f", %arg{5 + i}" for i in range(len(scales)))
    body = f"""
  %q5 = "poot.reshape"(%arg0) : ({_t(qa)}) -> {_t(q5)}
  %q = "poot.transpose"(%q5) {{perm = array<i64: 0, 2, 3, 1, 4>}} : ({_t(q5)}) -> {_t(q)}
  %m = "poot.reshape"(%arg4) : ({_t(ma, mt)}) -> {_t(m5, mt)}
  %a = "poot.paged_attention"(%q, %arg1, %arg2, %arg3, %m{sargs}) {{scale = {float(1.0 / np.sqrt(D))!r} : f64, softcap = 0.0 : f64}} : ({_t(q)}, {kp}, {vp}, {tb}, {_t(m5, mt)}{"".join(", " + x for x in scales)}) -> {_t(res)}
  %r = "poot.reshape"(%a) : ({_t(res)}) -> {_t(out)}
  return %r : {_t(out)}"""
    return dispatch_region(ins, _t(out), body, "paged_attention", 5)


def q8_inputs(B, Hkv, G, NB, bs, TW, D, mask, lengths, k_q8=True, v_q8=True, seed=0):
    """A paged cache as the engine leaves it: sequence b has ``lengths[b]`` keys (0: a row
    that sees none) in distinct blocks of a random permutation, the table's entries past them
    -1, NB + 3 or another sequence's block; every pool row no sequence holds keeps inf scales
    (a q8_0 pool) or inf / NaN values (f16). An f32 mask is a random bias over the visible
    keys, -inf elsewhere. Returns ``(feed, expected)``: the region's arguments and the numpy
    dequantize-then-attend result ``[B, H, 1, D]`` (f64)."""
    rng = np.random.default_rng(seed)
    H, S = Hkv * G, TW * bs
    perm = rng.permutation(NB)
    table = np.empty((B, TW), np.int32)
    used = 0
    for b, n in enumerate(lengths):
        for w in range(TW):
            if w < -(-n // bs):
                table[b, w], used = perm[used], used + 1
            else:
                table[b, w] = (-1, NB + 3, int(rng.integers(NB)))[w % 3]
    held = np.zeros((NB, bs), bool)
    for b, n in enumerate(lengths):
        for j in range(n):
            held[table[b, j // bs], j % bs] = True
    feed, logical, scales = {}, [], []
    for name, q8 in (("a1", k_q8), ("a2", v_q8)):
        x = rng.standard_normal((NB, bs, Hkv, D)).astype(np.float32)
        if q8:
            vals, d = quantize_q8_0(x)
            d[~held] = np.inf
            feed[name], x = vals, dequantize_q8_0(vals, d)
            scales.append(d)
        else:
            x = x.astype(np.float16)
            x[~held] = np.nan if name == "a2" else np.inf
            feed[name] = x
        logical.append(x.astype(np.float64))
    vis = np.arange(S)[None, :] < np.array(lengths)[:, None]                  # [B, S]
    bias = np.where(vis, 0.5 * rng.standard_normal((B, S)), -np.inf).astype(np.float32)
    q = rng.standard_normal((B, 1, H, D)).astype(np.float32)
    feed.update(a0=q, a3=table, a4=(vis if mask == "i1" else bias)[:, None, :])
    feed.update({f"a{5 + i}": d for i, d in enumerate(scales)})
    want = np.zeros((B, H, 1, D))
    for b, n in enumerate(lengths):
        if n == 0:
            continue                                # sees no key: zeros
        blk, row = table[b, np.arange(n) // bs], np.arange(n) % bs
        for h in range(H):
            k, v = (p[blk, row, h // G] for p in logical)                  # [n, D]
            x = k @ q[b, 0, h].astype(np.float64) / np.sqrt(D)
            if mask != "i1":
                x = x + bias[b, :n]
            p = np.exp(x - x.max())
            want[b, h, 0] = p @ v / p.sum()
    return feed, want


def _strategies(g: Graph, target) -> dict[str, int]:
    """Kernels per strategy of the region planned for ``target``."""
    from poot.backends.gpu.plan import plan_program

    return plan_program(SimpleNamespace(graph=g, storage=[]), target.caps).strategies


#: (B, Hkv, G, NB, bs, TW, D, mask, lengths, k_q8, v_q8): head dims 64 and 128, GQA 4 and 2
#: and MHA, contexts ending inside a block (and one longer than a block's multiple of the
#: subgroup), a row that sees nothing, K or V alone in q8_0; the long table splits into
#: chunks on the 1000-core target
CASES = [
    (2, 2, 4, 160, 16, 72, 64, "i1", (1100, 37), True, True),
    (2, 2, 4, 160, 16, 72, 128, "f32", (45, 1107), True, True),
    (3, 2, 1, 24, 16, 8, 128, "i1", (100, 5, 0), True, False),
    (2, 1, 2, 20, 16, 8, 64, "f32", (77, 123), False, True),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"D{c[6]}-G{c[2]}-S{c[4] * c[5]}-{c[7]}"
                         f"-{'q8' if c[9] else 'f16'}-{'q8' if c[10] else 'f16'}")
def test_q8_0_paged_attention_matches_numpy_on_vulkan(vk_device, case):
    """The strategy takes q8_0 pools (the scales planes matched as views) and, planned for 1
    and 1000 cores (one launch or split + combine; K read as words of four values in blocks
    of at most WORD_MAX_THREADS threads, else a byte a value), equals numpy's
    dequantize-then-attend: the inf scales of stale rows never leak, a row that sees no key
    gives zeros."""
    from poot.backends.gpu.strategies.attention import (emit_attention, match_attention,
                                                        plan_attention)
    from poot.backends.gpu.strategies.attention.plan import WORD_MAX_THREADS
    from poot.backends.vulkan.codegen import codegen_vulkan

    *shape, lengths, k_q8, v_q8 = case
    g = q8_region(*shape, k_q8=k_q8, v_q8=v_q8)
    feed, want = q8_inputs(*shape, lengths, k_q8, v_q8, seed=CASES.index(case))
    reg = match_attention(_callee(g))
    assert reg is not None and reg.paged is not None
    assert (reg.paged.k_scale is not None, reg.paged.v_scale is not None) == (k_q8, v_q8)
    splits = set()
    words = f"memref<{shape[3] * shape[4] * shape[1] * shape[6] // 4}xi32>"   # K as i32 words
    for cores in (1, 1000):
        target = _vk_target(vk_device, cores)
        plan = plan_attention(reg, target.caps)
        with g.module.context:
            text = emit_attention(reg, plan).text
        assert (words in text) == (k_q8 and plan.TB <= WORD_MAX_THREADS), plan  # else bytes
        art = codegen_vulkan(g, target)
        assert _strategies(g, target) == {"flash_decode": 1 + (plan.NS > 1)}
        got = _run(vk_device, art, feed)["r0"]
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL,
                                   err_msg=f"cores={cores} {plan}")
        splits.add(plan.NS > 1)
    if shape[4] * shape[5] > 1024:
        assert True in splits                 # long context: split + combine on 1000 cores


#: forced plans (W subgroups, DL lanes a key, batches a chunk): a key's 64 or 128 values over
#: 2 and 8 lanes (each lane's run of V values inside one 32-group), chunks starting inside a
#: block, a subgroup with no batch
FORCED = [(2, 2, 3, 64), (1, 8, 5, 128), (4, 1, 2, 64)]


@pytest.mark.parametrize("W,DL,nbat,D", FORCED)
def test_q8_0_forced_plans_on_vulkan(vk_device, monkeypatch, W, DL, nbat, D):
    """Every chunking the emitter takes, planned by hand (decode, GQA 2 x 3, q8_0 K and V,
    5-position blocks, stale rows with inf scales), equals numpy."""
    from poot.backends.gpu.strategies import attention as A
    from poot.backends.vulkan.codegen import codegen_vulkan

    shape = (2, 2, 3, 20, 5, 9, D, "i1")
    g = q8_region(*shape)
    feed, want = q8_inputs(*shape, (43, 17), seed=W * DL)
    target = _vk_target(vk_device, 4)
    sg = target.caps.subgroup_size
    C = nbat * (sg // DL)
    S = shape[4] * shape[5]
    plan = A.AttentionPlan(sg, DL, 3, 1, C, -(-S // C), max(sg, min(256, 4 * sg)), W)
    monkeypatch.setattr(A, "plan_attention", lambda reg, caps: plan)
    art = codegen_vulkan(g, target)
    assert _strategies(g, target) == {"flash_decode": 1 + (plan.NS > 1)}
    np.testing.assert_allclose(_run(vk_device, art, feed)["r0"], want, rtol=RTOL, atol=ATOL,
                               err_msg=f"{plan}")


# ---- CUDA (PTX) and ROCm (HSACO): compile only ------------------------------------------------

#: Llama-3.2-1B (8 kv heads, GQA 4, D = 64) and Llama-3-8B (D = 128) decode regions as
#: folding leaves them (q RoPE'd, the causal mask computed in the region), q8_0 pools of
#: 16-position blocks: (S, D, launches)
LLAMA_Q8 = [(512, 128, 1), (2048, 64, 2), (4096, 128, 2)]


def _llama_q8(S, D):
    return rope_attention_region(B=1, T=1, Hkv=8, G=4, S=S, D=D, Dv=D, mask="i1",
                                 paged=(S // 16 + 8, 16, "q8_0"))


@pytest.mark.parametrize("S,D,launches", LLAMA_Q8)
def test_q8_0_paged_attention_ptx_assembles(S, D, launches):
    """For CUDA the q8_0 region becomes the strategy's kernels only (no dequantize launch):
    K is read as 32-bit words of four values, V as signed bytes, the scales as 16-bit words,
    and ptxas assembles the kernels without spilling."""
    from poot.backends.cuda.codegen import cuda_target, ptx_text, ptxas_check
    from poot.backends.gpu.plan import plan_program

    plan = plan_program(SimpleNamespace(graph=_llama_q8(S, D), storage=[]),
                        cuda_target().caps)
    kernels = [L for L in plan.launches if L["op"] == "kernel"]
    assert plan.strategies == {"flash_decode": launches} and len(kernels) == launches
    ptx = ptx_text(plan.module)
    assert "ld.global.s8" in ptx and "ld.global.b16" in ptx and "cvt.rn.f32.s16" in ptx
    if ptxas_check(ptx) is None:
        pytest.skip("ptxas is not installed (PTX generated, not assembled)")
    assert _ptxas_spills(ptx) == []


@pytest.mark.parametrize("arch", ["gfx942", "gfx1100"])
def test_q8_0_paged_attention_compiles_to_an_hsaco(arch):
    """For ROCm (wave64 and wave32 archs) the q8_0 region becomes the strategy's kernels,
    lowered through ROCDL to code objects whose kernels match the plan."""
    import sys
    from pathlib import Path

    pytest.importorskip("elftools", reason="pyelftools reads the code objects")
    from poot.backends.rocm.codegen import compile_program, tools_missing
    from poot.backends.rocm.target import rocm_target

    if tools_missing() is not None:
        pytest.skip(f"ROCm code generation tools: {tools_missing()}")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "rocm"))
    from test_rocm_codegen import check_artifact

    target = rocm_target(arch)
    art = compile_program(SimpleNamespace(graph=_llama_q8(2048, 64), storage=[],
                                          target=target, dispatches={}))
    assert art.meta["strategies"] == {"flash_decode": 2}
    assert check_artifact(art, arch) == 2


# ---- traced steps and planning ------------------------------------------------------------------

#: tiny fixtures whose KV rows q8_0 can cut (32-wide heads; MLA: a 64-wide latent row)
WIDE = {"llama": {"head_dim": 32}, "deepseek_v3": {"kv_lora_rank": 32, "qk_rope_head_dim": 32}}


def _llama32(tmp_path, fixture: str = "llama"):
    """Tiny ``fixture`` with the :data:`WIDE` changes (q8_0 needs a multiple of 32), random
    f32 weights: ``(model, weights)``."""
    import json
    from pathlib import Path

    from poot.models.random_init import load_random_model

    folder = Path(__file__).resolve().parents[1] / "fixtures" / "tiny" / fixture
    cfg = {**json.loads((folder / "config.json").read_text()), **WIDE[fixture]}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return load_random_model(tmp_path / "config.json", dtype="f32")


def _targets():
    from poot.backends.cuda.artifact import cuda_target
    from poot.backends.rocm.target import rocm_target

    return {"cuda": cuda_target(), "rocm": rocm_target("gfx942")}


@pytest.mark.parametrize("fixture", sorted(WIDE))
@pytest.mark.parametrize("backend", ["cuda", "rocm"])
def test_traced_q8_0_decode_step_attends_by_the_strategy(tmp_path, backend, fixture):
    """A traced decode step (batch 2) over q8_0 pools (a Llama's K and V; multi-head latent
    attention's one latent pool) compiles for CUDA and ROCm, and every paged-attention
    dispatch is the flash-decoding strategy's kernels, reading the pools in place (no other
    launch of that dispatch: no dequantize pass)."""
    from poot.compiler import compile
    from poot.dialects.kv_quant import Q8_0
    from poot.models import StepSpec

    model, weights = _llama32(tmp_path, fixture)
    spec = StepSpec.decode(kv_capacity=64, block_size=16, num_blocks=9, kv_dtype=Q8_0,
                           batch=2)
    g = model.trace(spec, weights.types)
    if backend == "rocm":
        from poot.backends.rocm.codegen import tools_missing

        if tools_missing() is not None:
            pytest.skip(f"ROCm code generation tools: {tools_missing()}")
    prog = compile(g, _targets()[backend])
    plan = prog.executable.plan
    attn = [d for d in plan["dispatches"] if d["kind"] == "paged_attention"]
    assert len(attn) == model.dims().n_layers
    for d in attn:
        launches = plan["launches"][d["first"]:d["first"] + d["count"]]
        assert {L["strategy"] for L in launches} == {"flash_decode"}, d["callee"]


@pytest.mark.parametrize("backend", ["cuda", "rocm"])
def test_cuda_and_rocm_take_q8_0_kv_and_refuse_fp8(tmp_path, backend):
    """Planning the KV pool: q8_0 (K, V or both) is taken by the CUDA and ROCm targets, the
    pool's bytes follow it; fp8 is a typed refusal naming the option and the target (ROCm,
    CUDA before sm_89)."""
    from poot.api.memory import plan_kv
    from poot.dialects.kv_quant import FP8, Q8_0
    from poot.dialects.types import DType
    from poot.sampling_params import InvalidRequest

    model, weights = _llama32(tmp_path)
    target = _targets()[backend]
    if backend == "cuda":       # fp8 from sm_89 (test_gpu_attention_fp8.py)
        from poot.backends.cuda.artifact import cuda_target

        target = cuda_target(sm=80)
    f16 = plan_kv(model, weights.types, target, 64, 2, None, DType.F16)
    q8 = plan_kv(model, weights.types, target, 64, 2, None, Q8_0)
    assert q8.kv_dtype is Q8_0 and q8.bytes(model.dims()) * 32 == f16.bytes(model.dims()) * 17
    plan_kv(model, weights.types, target, 64, 2, None, DType.F16, kv_dtype_v=Q8_0)
    for kw, option in (({"kv_dtype": FP8}, "kv_dtype"),
                       ({"kv_dtype": Q8_0, "kv_dtype_v": FP8}, "kv_dtype_v")):
        with pytest.raises(InvalidRequest) as e:
            plan_kv(model, weights.types, target, 64, 2, None, **kw)
        assert e.value.field == option
        assert "fp8 (e4m3) KV storage needs a device that converts fp8 in hardware" in \
            str(e.value) and f"which the {backend} target lacks" in str(e.value)


def test_wgpu_plans_q8_0_kv_and_refuses_fp8(tmp_path):
    """wgpu stores no 16-bit values (naga), yet plans a q8_0 KV cache (its kernels move the
    scales as 32-bit words, test/wgpu/test_wgpu_kv_q8_0.py); fp8 stays a typed refusal naming
    the option."""
    from poot.api.memory import plan_kv
    from poot.backends.wgpu.target import wgpu_target
    from poot.dialects.kv_quant import FP8, Q8_0
    from poot.sampling_params import InvalidRequest

    model, weights = _llama32(tmp_path)
    assert plan_kv(model, weights.types, wgpu_target(), 64, 2, None, Q8_0).kv_dtype is Q8_0
    with pytest.raises(InvalidRequest) as e:
        plan_kv(model, weights.types, wgpu_target(), 64, 2, None, FP8)
    assert e.value.field == "kv_dtype" and "the wgpu target lacks" in str(e.value)


@pytest.mark.parametrize("step", ["decode", "prefill"])
def test_mla_step_over_a_q8_0_latent_pool_matches_oracle_on_vulkan(vk_device, tmp_path, step):
    """Multi-head latent attention (tiny DeepSeek-V3, a 64-wide latent row) with a q8_0
    latent pool, whole steps on the device: its paged attention (the strategy: K the latent
    row, V a slice of it, each with its scales) and the logits equal the oracle's."""
    from poot import oracle
    from poot.backends.gpu.plan import plan_program
    from poot.compiler import CompileOptions, compile
    from poot.dialects.kv_quant import Q8_0
    from poot.models import StepSpec

    target = _vk_target(vk_device, 4)
    if "q8_0" not in target.caps.kv_formats:
        pytest.skip("this Vulkan device stores no f16 (the q8_0 scales)")
    model, weights = _llama32(tmp_path, "deepseek_v3")
    kw = dict(kv_capacity=64, block_size=16, num_blocks=6, kv_dtype=Q8_0)
    spec = StepSpec.decode(**kw) if step == "decode" else StepSpec.prefill(8, **kw)
    g = model.trace(spec, weights.types)
    rng = np.random.default_rng(3)
    ins = {n: (rng.integers(-127, 128, t.shape).astype(np.int8) if t.dtype.value == "i8"
               else (rng.random(t.shape) * 0.02).astype(t.dtype.numpy))
           for n, t in g.inputs if n.startswith("kv.")}
    pos = (np.arange(spec.tokens) + (0 if spec.tokens > 1 else 9)).astype(np.int32)[None]
    table = rng.permutation(spec.n_blocks)[:spec.table_width][None].astype(np.int32)
    ins.update(tokens=rng.integers(0, 64, (1, spec.tokens)).astype(np.int32), positions=pos,
               block_table=table,
               slot_mapping=(table[0, pos[0] // spec.bs] * spec.bs + pos[0] % spec.bs)
               .astype(np.int32))
    want = oracle.evaluate(g, ins, weights)["logits"]
    prog = compile(g, target, CompileOptions())
    attn = plan_program(prog, target.caps).strategies.get("flash_decode", 0)
    assert attn >= prog.dispatches["paged_attention"] == model.dims().n_layers
    k = vk_device.load(prog.executable)
    bufs = []
    for a in k.args:
        bufs.append(vk_device.alloc(a.type))
        if a.role in ("input", "param"):
            vk_device.upload(bufs[-1], ins[a.name] if a.role == "input"
                             else np.asarray(weights[a.name]))
    vk_device.replay(vk_device.record(k, bufs))
    vk_device.synchronize()
    got = next(vk_device.download(b) for a, b in zip(k.args, bufs) if a.name == "logits")
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-4, atol=1e-4)
