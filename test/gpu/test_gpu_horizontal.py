"""Horizontal fusion (:mod:`poot.backends.gpu.horizontal`): independent single-launch sibling
dispatches of a step (GEMVs sharing x with different N, hence different block sizes; KV
writes) become ONE kernel launch whose grid concatenates theirs, run on a real Vulkan device
(lavapipe in CI) against the numpy oracle; a dependent chain is not merged; a tiny model's
decode step launches fewer kernels with the same results; the fused kernel lowers to PTX.

Tolerances: GEMVs sum in another order than the oracle (f32 rounding: rtol 1e-4 as in
test_gpu_matmul); scatters are exact; the whole decode step 1e-4 (as test/vulkan)."""

from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np
import pytest
pytest.importorskip("mlir.ir", reason="the MLIR wheels (xtc-mlir-python-bindings) are not "
                    "installed here: this module compiles kernels")
from mlir import ir
from test_gpu_pointwise import rand

RTOL, ATOL = 1e-4, 1e-5


# ---- helpers ---------------------------------------------------------------------------------

def step(args: list[str], calls: list[tuple], rets: list[str]):
    """A graph ``@region(a0, ...)`` whose body calls dispatch functions in order. ``calls``:
    ``(operands, body, result types, kind)``; an operand is ``"a<i>"`` (a step argument) or
    ``"c<k>.<j>"`` (result j of call k); ``body`` uses ``%arg<i>`` and ends with its
    ``return``. ``rets``: the step's results (operand names)."""
    from poot.dialects import make_context
    from poot.graph.builder import Graph

    types = {f"a{i}": t for i, t in enumerate(args)}
    lines, fns = [], []
    for k, (ops, body, res, kind) in enumerate(calls):
        for j, t in enumerate(res):
            types[f"c{k}.{j}"] = t

        def ref(o):
            if o.startswith("a"):
                return f"%{o}"
            c, j = o[1:].split(".")
            return f"%c{c}#{j}"
        ins = ", ".join(types[o] for o in ops)
        lines.append(f"  %c{k}:{len(res)} = func.call @d{k}({', '.join(ref(o) for o in ops)}) : "
                     f"({ins}) -> ({', '.join(res)})")
        dsig = ", ".join(f"%arg{i}: {types[o]}" for i, o in enumerate(ops))
        fns.append(f"func.func private @d{k}({dsig}) -> ({', '.join(res)}) attributes "
                   f'{{poot.dispatch = {{kind = "{kind}", ops = 1 : i64}}}} {{\n{body}\n}}')
    sig = ", ".join(f'%a{i}: {t} {{poot.name = "a{i}"}}' for i, t in enumerate(args))
    rt = [types[r] for r in rets]
    res = ", ".join(f'{t} {{poot.name = "r{j}"}}' for j, t in enumerate(rt))

    def ref(o):
        if o.startswith("a"):
            return f"%{o}"
        c, j = o[1:].split(".")
        return f"%c{c}#{j}"
    text = (f"func.func @region({sig}) -> ({res}) {{\n" + "\n".join(lines) +
            f"\n  return {', '.join(ref(r) for r in rets)} : {', '.join(rt)}\n}}\n" +
            "\n".join(fns))
    with make_context() as ctx, ir.Location.unknown():
        module = ir.Module.parse(text)
        module.operation.verify()
    g = Graph.from_module(module)
    g._ctx = ctx
    return g


def gemv(K: int, N: int, dt: str = "f32", x: int = 0, w: int = 1):
    """A decode GEMV ``[1, K] x [N, K]^T`` (the weight as stored, transposed) of ``%arg<x>``
    and ``%arg<w>``: (body, result type)."""
    body = []
    src = f"%arg{w}"
    if dt != "f32":
        body.append(f'  %wc = "poot.cast"({src}) : (tensor<{N}x{K}x{dt}>) -> tensor<{N}x{K}xf32>')
        src = "%wc"
    body += [f'  %wt = "poot.transpose"({src}) {{perm = array<i64: 1, 0>}} : '
             f'(tensor<{N}x{K}xf32>) -> tensor<{K}x{N}xf32>',
             f'  %y = "poot.matmul"(%arg{x}, %wt) {{acc = f32}} : (tensor<1x{K}xf32>, '
             f'tensor<{K}x{N}xf32>) -> tensor<1x{N}xf32>',
             f"  return %y : tensor<1x{N}xf32>"]
    return "\n".join(body), f"tensor<1x{N}xf32>"


def plan_of(g, caps):
    from poot.backends.gpu.plan import plan_program

    return plan_program(SimpleNamespace(graph=g, storage=[]), caps)


def kernel_launches(plan) -> list[dict]:
    return [L for L in plan.launches if L["op"] == "kernel"]


def run(vk, g, inputs) -> dict:
    """Compile ``g`` for the Vulkan device and run it once: outputs by name."""
    from poot.backends.vulkan.codegen import codegen_vulkan

    dev, target = vk
    k = dev.load(codegen_vulkan(g, target))
    bufs = []
    for a in k.args:
        b = dev.alloc(a.type)
        if a.role == "input":
            dev.upload(b, inputs[a.name])
        bufs.append(b)
    dev.replay(dev.record(k, bufs))
    dev.synchronize()
    return {a.name: dev.download(b) for a, b in zip(k.args, bufs) if a.role == "output"}


def check(vk, g, inputs, rtol=RTOL, atol=ATOL):
    from poot import oracle

    want = oracle.evaluate(g, inputs)
    got = run(vk, g, inputs)
    for k, w in want.items():
        gk = np.asarray(got[k])
        if w.dtype.itemsize == 2 and gk.dtype == np.uint16:
            gk = gk.view(w.dtype)
        np.testing.assert_allclose(gk.reshape(w.shape).astype(np.float32),
                                   w.astype(np.float32), rtol=rtol,
                                   atol=atol * max(1.0, float(np.abs(w).max())), err_msg=k)


def _gemv_step(K: int, Ns: list[int], dts: list[str]):
    """Independent GEMVs of one x (``a0``) against weights ``a1..``, and their inputs."""
    rng = np.random.default_rng(sum(Ns) + K)
    args = [f"tensor<1x{K}xf32>"] + [f"tensor<{N}x{K}x{dt}>" for N, dt in zip(Ns, dts)]
    calls = []
    for i, (N, dt) in enumerate(zip(Ns, dts)):
        body, rt = gemv(K, N, dt)
        calls.append((["a0", f"a{i + 1}"], body, [rt], "matmul"))
    g = step(args, calls, [f"c{i}.0" for i in range(len(Ns))])
    ins = {"a0": rand(rng, (1, K), "f32")}
    for i, (N, dt) in enumerate(zip(Ns, dts)):
        ins[f"a{i + 1}"] = rand(rng, (N, K), dt, -0.1, 0.1)
    return g, ins


# ---- GEMVs sharing x -------------------------------------------------------------------------

def many_cores(vk):
    """The Vulkan device, planned as if it had an H200's 132 compute units: the GEMV strategy
    then picks 1, 4 or 8 warps per block by N (on lavapipe's few cores it always picks 8)."""
    from dataclasses import replace

    dev, target = vk
    return dev, replace(target, caps=replace(target.caps, cores=132))


@pytest.mark.parametrize("Ns,dts", [([1200, 192], ["f32", "f32"]),
                                    ([1200, 576, 192], ["f32", "bf16", "f32"]),
                                    ([17, 576, 100], ["f16", "bf16", "f32"])])
def test_sibling_gemvs_are_one_launch(vk, Ns, dts, monkeypatch):
    """Different N: different block sizes (warps per block); the smaller ones run as virtual
    blocks of the largest; one launch whose grid is the sum of the members' shares. (One
    warp per column: split-K GEMVs all take 8-warp blocks.)"""
    from poot.backends.gpu.strategies import matmul, synthesize

    monkeypatch.setitem(matmul.TUNING, "ksplit", 1)

    vk = many_cores(vk)
    g, ins = _gemv_step(576, Ns, dts)
    caps = vk[1].caps
    # each member alone: its launch shape (before any fusion)
    kctx = ir.Context()
    kctx.allow_unregistered_dialects = True
    fns = [o.operation for o in g.module.body.operations
           if ir.StringAttr(o.operation.attributes["sym_name"]).value.startswith("d")]
    alone = [synthesize(f, caps, kctx).launches[-1] for f in fns]
    B = max(L.block[0] for L in alone)
    assert len({L.block[0] for L in alone}) > 1            # virtual blocks are exercised
    want_grid = sum(-(-L.grid[0] // (B // L.block[0])) for L in alone)
    plan = plan_of(g, caps)
    (L,) = kernel_launches(plan)
    assert L["strategy"] == "horizontal" and L["block"] == [B, 1, 1]
    assert L["grid"] == [want_grid, 1, 1]
    assert len(plan.dispatches) == 1 and plan.dispatches[0]["kind"] == "matmul"
    g, ins = _gemv_step(576, Ns, dts)
    check(vk, g, ins)


def test_disabled_by_env(vk, monkeypatch):
    monkeypatch.setenv("POOT_GPU_HORIZONTAL", "0")
    g, ins = _gemv_step(576, [192, 8], ["f32", "f32"])
    plan = plan_of(g, vk[1].caps)
    assert [L["strategy"] for L in kernel_launches(plan)] == ["gemv", "gemv"]


# ---- KV writes -------------------------------------------------------------------------------

def _scatter_body(cache: str, upd: str, rows: int) -> str:
    return (f'  %s = "poot.scatter"(%arg0, %arg1, %arg2) : ({cache}, tensor<{rows}x2xi32>, '
            f'{upd}) -> {cache}\n  return %s : {cache}')


@pytest.mark.parametrize("dt", ["f32", "f16"])
def test_sibling_scatters_are_one_launch(vk, dt):
    """The K and V cache writes of one step: two caches, one index tensor, two updates; the
    copies of the destinations stay (this plan has no in-place state), the two kernels are
    one."""
    kc, vc = f"tensor<2x8x3x16x{dt}>", f"tensor<2x8x2x32x{dt}>"
    ku, vu = f"tensor<1x3x16x{dt}>", f"tensor<1x2x32x{dt}>"
    g = step([kc, vc, "tensor<1x2xi32>", ku, vu],
             [(["a0", "a2", "a3"], _scatter_body(kc, ku, 1), [kc], "scatter"),
              (["a1", "a2", "a4"], _scatter_body(vc, vu, 1), [vc], "scatter")],
             ["c0.0", "c1.0"])
    rng = np.random.default_rng(7)
    ins = {"a0": rand(rng, (2, 8, 3, 16), dt), "a1": rand(rng, (2, 8, 2, 32), dt),
           "a2": np.array([[1, 5]], np.int32), "a3": rand(rng, (1, 3, 16), dt),
           "a4": rand(rng, (1, 2, 32), dt)}
    plan = plan_of(g, vk[1].caps)
    (L,) = kernel_launches(plan)
    assert L["strategy"] == "horizontal"
    assert [x["op"] for x in plan.launches] == ["copy", "copy", "kernel"]
    check(vk, g, ins, rtol=0, atol=0)


def test_state_written_in_place_is_not_shared():
    """A member that writes a state in place (a scatter's destination) is not merged with a
    member that reads that same state: in one kernel the read would race with the write."""
    from poot.backends.cuda.codegen import cuda_target

    kc = "tensor<2x8x3x16xf32>"
    g = step([kc, "tensor<1x2xi32>", "tensor<1x3x16xf32>"],
             [(["a0", "a1", "a2"], _scatter_body(kc, "tensor<1x3x16xf32>", 1), [kc],
               "scatter"),
              (["a0"], f'  %n = "poot.unary"(%arg0) {{fn = "neg"}} : ({kc}) -> {kc}\n'
                       f"  return %n : {kc}", [kc], "elementwise")],
             ["c0.0", "c1.0"])
    plan = plan_of(g, cuda_target().caps)
    assert "horizontal" not in [L["strategy"] for L in kernel_launches(plan)]


# ---- dependencies ----------------------------------------------------------------------------

def test_dependent_chain_is_not_merged(vk):
    """y1 = x W1; z = y1 * 2 (a pointwise region, kept: z is a step result too); y2 = z W2;
    y3 = x W3: z reads y1 and y2 reads y1 through z, so y1, z, y2 each close the group before
    them; only the independent y3 joins y2's launch."""
    K = 64
    b1, t1 = gemv(K, K)
    b2, t2 = gemv(K, 32)
    b3, t3 = gemv(K, 8)
    dbl = (f'  %c = "poot.constant"() {{value = dense<2.0> : {t1}}} : () -> {t1}\n'
           f'  %m = "poot.binary"(%arg0, %c) {{fn = "mul"}} : ({t1}, {t1}) -> {t1}\n'
           f"  return %m : {t1}")
    args = [f"tensor<1x{K}xf32>", f"tensor<{K}x{K}xf32>", f"tensor<32x{K}xf32>",
            f"tensor<8x{K}xf32>"]
    g = step(args, [(["a0", "a1"], b1, [t1], "matmul"),
                    (["c0.0"], dbl, [t1], "elementwise"),
                    (["c1.0", "a2"], b2, [t2], "matmul"),
                    (["a0", "a3"], b3, [t3], "matmul")],
             ["c0.0", "c1.0", "c2.0", "c3.0"])
    rng = np.random.default_rng(5)
    ins = {"a0": rand(rng, (1, K), "f32"), "a1": rand(rng, (K, K), "f32", -0.2, 0.2),
           "a2": rand(rng, (32, K), "f32", -0.2, 0.2), "a3": rand(rng, (8, K), "f32")}
    plan = plan_of(g, vk[1].caps)
    launches = kernel_launches(plan)
    assert [L["strategy"] for L in launches] == ["gemv", "pointwise", "horizontal"]
    d = plan.dispatches[-1]
    assert d["args"][0] == plan.dispatches[1]["outs"][0]     # y2 = z W2 ...
    assert plan.dispatches[0]["outs"][0] not in d["outs"]    # ... and x W3, not y1
    g = step(args, [(["a0", "a1"], b1, [t1], "matmul"),
                    (["c0.0"], dbl, [t1], "elementwise"),
                    (["c1.0", "a2"], b2, [t2], "matmul"),
                    (["a0", "a3"], b3, [t3], "matmul")],
             ["c0.0", "c1.0", "c2.0", "c3.0"])
    check(vk, g, ins)


def test_pure_chain_keeps_every_launch(vk):
    b1, t1 = gemv(64, 64)
    b2, t2 = gemv(64, 16)
    g = step(["tensor<1x64xf32>", "tensor<64x64xf32>", "tensor<16x64xf32>"],
             [(["a0", "a1"], b1, [t1], "matmul"), (["c0.0", "a2"], b2, [t2], "matmul")],
             ["c1.0"])
    plan = plan_of(g, vk[1].caps)
    assert [L["strategy"] for L in kernel_launches(plan)] == ["gemv", "gemv"]


# ---- multi-launch members: split-K GEMMs --------------------------------------------------------

def _gemm_step(M: int, K: int, Ns: list[int], seed: int = 0):
    """Independent ``x W_i^T`` of one x [M, K] (``a0``) and bf16 weights [N_i, K], each its
    own matmul region (the tensor-core GEMM's, from M > 8 rows), and their inputs."""
    args = [f"tensor<{M}x{K}xf32>"] + [f"tensor<{N}x{K}xbf16>" for N in Ns]
    calls = []
    for i, N in enumerate(Ns):
        body = "\n".join([
            f'  %wc = "poot.cast"(%arg1) : (tensor<{N}x{K}xbf16>) -> tensor<{N}x{K}xf32>',
            f'  %wt = "poot.transpose"(%wc) {{perm = array<i64: 1, 0>}} : '
            f'(tensor<{N}x{K}xf32>) -> tensor<{K}x{N}xf32>',
            f'  %y = "poot.matmul"(%arg0, %wt) {{acc = f32}} : (tensor<{M}x{K}xf32>, '
            f'tensor<{K}x{N}xf32>) -> tensor<{M}x{N}xf32>',
            f"  return %y : tensor<{M}x{N}xf32>"])
        calls.append((["a0", f"a{i + 1}"], body, [f"tensor<{M}x{N}xf32>"], "matmul"))
    rng = np.random.default_rng(seed)
    ins = {"a0": rand(rng, (M, K), "f32")}
    for i, N in enumerate(Ns):
        ins[f"a{i + 1}"] = rand(rng, (N, K), "bf16", -0.2, 0.2)
    return step(args, calls, [f"c{i}.0" for i in range(len(Ns))]), ins


def test_sibling_split_k_gemms_are_two_launches(vk, monkeypatch):
    """Two split-K GEMMs of one x (each a partial-products kernel then a reduction): one
    launch per phase, the partial products side by side, then both reductions; on lavapipe
    (each mma emulated from workgroup memory, tiles of one shape sharing it) every element
    within the GEMM's stated error bound of the f32 oracle."""
    from poot.backends.gpu.strategies import gemm as G

    monkeypatch.setattr(G, "EMULATE_MMA", G.MMA_SYNC)
    monkeypatch.setattr(G, "FORCE_TILING", (32, 32, 64))
    monkeypatch.setattr(G, "FORCE_SPLIT", 3)
    M, K, Ns = 40, 512, [72, 40]
    g, ins = _gemm_step(M, K, Ns)
    plan = plan_of(g, vk[1].caps)
    launches = kernel_launches(plan)
    assert [L["strategy"] for L in launches] == ["horizontal", "horizontal"]
    # partial products: ceil(N / 32) x ceil(M / 32) tiles x 3 slices per member
    assert launches[0]["grid"][0] == sum(-(-N // 32) * 2 * 3 for N in Ns)
    g, ins = _gemm_step(M, K, Ns)
    from poot import oracle

    want = oracle.evaluate(g, ins)
    got = run(vk, g, ins)
    for i, N in enumerate(Ns):
        bound = G.error_bound(ins["a0"], np.asarray(ins[f"a{i + 1}"]).astype(np.float32),
                              "bf16") + 1e-6 * np.abs(want[f"r{i}"])
        err = np.abs(np.asarray(got[f"r{i}"]).reshape(M, N) - want[f"r{i}"])
        assert (err <= bound).all(), f"r{i}: worst err/bound {(err / bound).max():.3g}"


def test_gemm_tiles_of_different_shapes_share_one_buffer(monkeypatch):
    """Batch-32 decode: a [2048 -> 512] projection (64-wide tiles) beside a rank-16 LoRA
    shrink (32-wide tiles, K steps of 128): their tiles together pass 48 KiB, so on a target
    whose lowering takes views of workgroup memory each member's tiles are ``memref.view``s
    of one buffer as large as the larger member's (the fused kernel lowers to PTX, with
    one shared array no larger than 48 KiB); without that feature they stay two dispatches.
    (The tiled GEMM's tiles: the decode GEMM, which takes these rows first, is off here.)"""
    from dataclasses import replace

    from poot.backends.cuda.codegen import cuda_target, ptx_text, ptxas_check
    from poot.backends.gpu.horizontal import WORKGROUP_VIEW
    from poot.backends.gpu.strategies import gemm_decode

    monkeypatch.setattr(gemm_decode, "MAX_M", 0)

    caps = cuda_target().caps
    assert WORKGROUP_VIEW in caps.features
    plan = plan_of(_gemm_step(32, 2048, [512, 16])[0], caps)
    assert [L["strategy"] for L in kernel_launches(plan)] == ["horizontal", "horizontal"]
    assert "memref.view" in str(plan.module)
    ptx = ptx_text(plan.module)
    shared = [int(n) for n in re.findall(r"\.shared \.align \d+ \.b8 \S+\[(\d+)\]", ptx)]
    assert shared and max(shared) <= 48 * 1024 and "mma.sync" in ptx
    ptxas_check(ptx)
    plain = replace(caps, features=caps.features - {WORKGROUP_VIEW})
    plan = plan_of(_gemm_step(32, 2048, [512, 16])[0], plain)
    assert [L["strategy"] for L in kernel_launches(plan)] == ["gemm"] * 4


# ---- PTX -------------------------------------------------------------------------------------

def test_fused_kernel_lowers_to_ptx():
    """Sibling GEMVs with 4 / 1 warps per block (H200 caps): one kernel, lowered
    by the NVVM pipeline (and assembled by ptxas where installed); shuffles and the block-id
    branch are there, the block size is pinned."""
    from poot.backends.cuda.codegen import cuda_target, ptx_text, ptxas_check

    g, _ = _gemv_step(576, [576, 64], ["bf16", "f32"])
    plan = plan_of(g, cuda_target().caps)
    (L,) = kernel_launches(plan)
    assert L["strategy"] == "horizontal"
    ptx = ptx_text(plan.module)
    assert ptx.count(".entry ") == 1 and "shfl.sync.bfly" in ptx
    assert f".maxntid {L['block'][0]}, 1, 1" in ptx            # known_block_size
    ptxas_check(ptx)


# ---- a whole decode step ---------------------------------------------------------------------

@pytest.mark.parametrize("name", ["llama", "llama_gguf_q4_1"])
def test_tiny_decode_step_launches_fewer_kernels(vk, monkeypatch, name):
    """The tiny Llama decode step (tolerance 1e-4 vs the oracle, f32 accumulation) on Vulkan:
    with horizontal fusion its q/k/v GEMVs and its K/V writes are one launch each per layer,
    and logits and caches still match; the number of distinct kernels does not grow."""
    from model_steps import fixture_path, step_feed

    from poot import oracle
    from poot.backends.vulkan.codegen import compile_vulkan
    from poot.runtime import Session
    from poot.models import StepSpec, load_model

    dev, target = vk
    model, weights = load_model(fixture_path(name))
    g = model.trace(StepSpec.decode(kv_capacity=16, kv_slots=1), weights.types)
    fused = compile_vulkan(g, target)
    monkeypatch.setenv("POOT_GPU_HORIZONTAL", "0")
    plain = compile_vulkan(g, target)
    monkeypatch.delenv("POOT_GPU_HORIZONTAL")

    def launches(p):
        return sum(1 for s in p.executable.steps if s.op == "dispatch")
    layers = sum(1 for n, _ in g.inputs if n.startswith("kv.")) // 2     # a K and a V cache
    assert layers >= 1
    assert launches(fused) <= launches(plain) - 3 * layers, (launches(fused), launches(plain))
    assert len(fused.executable.kernels) <= len(plain.executable.kernels)
    rng = np.random.default_rng(2)
    inputs = step_feed(g, [[5]], [[3]], [0])
    for n, t in g.inputs:
        if n.startswith("kv."):
            inputs[n] = (0.5 * rng.standard_normal(t.shape)).astype(t.dtype.numpy)
    eng = Session(dev)
    eng.load_weights(weights.arrays, weights.types)
    entry = eng.add_entry(fused)
    for n, v in inputs.items():
        if n.startswith("kv."):
            eng.write_state(n, v)
    got = eng.step(entry, {n: v for n, v in inputs.items() if not n.startswith("kv.")})
    want = oracle.evaluate(g, inputs, weights)
    np.testing.assert_allclose(got["logits"], want["logits"], rtol=1e-4, atol=1e-4)
    for k, v in want.items():
        if k.startswith("kv."):
            got_k = eng.read_state(k)            # f16/bf16 state: the device's 16-bit words
            got_k = got_k.view(v.dtype) if got_k.dtype == np.uint16 else got_k
            np.testing.assert_allclose(got_k.astype(np.float32), v.astype(np.float32),
                                       rtol=1e-4, atol=1e-4, err_msg=k)
