"""CUDA code generation without a GPU: every dispatch kind of the tiny Llama decode step
becomes PTX kernels (assembled by ptxas when one is installed), the launch plan is
consistent (a paged step's pools updated in place, its attention the flash-decoding kernel),
the artifact round-trips, and the runtime imports no MLIR."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
pytest.importorskip("mlir.ir", reason="the MLIR wheels (xtc-mlir-python-bindings) are not "
                    "installed here: this module compiles kernels")

from _build import tiny_artifact, tiny_program
from model_steps import step_feed

KINDS = {"elementwise", "gather", "reduction", "matmul", "rope", "scatter", "attention"}


def _kernels_per_dispatch(plan) -> dict:
    seen = {}
    for d in plan["dispatches"]:
        launches = plan["launches"][d["first"]:d["first"] + d["count"]]
        kernels = [L for L in launches if L["op"] == "kernel"]
        assert kernels, f"{d['callee']} ({d['kind']}) has no kernel"
        seen[d["kind"]] = seen.get(d["kind"], 0) + 1
    return seen


def test_every_dispatch_kind_generates_kernels(monkeypatch):
    # the generic mapping alone: one plan dispatch per region, every kind
    monkeypatch.setenv("POOT_GPU_STRATEGIES", "generic")
    prog, _ = tiny_program.__wrapped__()
    plan = prog.executable.plan
    assert set(prog.dispatches) == KINDS
    assert len(plan["dispatches"]) == prog.dispatch_count
    assert set(_kernels_per_dispatch(plan)) == KINDS
    # with the strategies: cheap producers (RoPE tables, the K RoPE, the KV write indices, the
    # norms in front of the GEMVs) are folded into their consumers, every remaining region
    # still has kernels
    monkeypatch.delenv("POOT_GPU_STRATEGIES")
    prog, _ = tiny_program()
    art = tiny_artifact()
    plan = art.plan
    seen = _kernels_per_dispatch(plan)
    assert set(seen) <= KINDS and {"matmul", "attention", "scatter"} <= set(seen)
    assert "reduction" not in seen
    assert len(plan["dispatches"]) < prog.dispatch_count
    for name in plan["kernels"]:
        assert f".entry {name}(" in art.ptx
    assert ".target sm_90" in art.ptx


def test_ptx_assembles_with_ptxas():
    from poot.backends.cuda.codegen import ptxas_check

    for strategy in ("naive", "auto"):
        if ptxas_check(tiny_artifact(strategy=strategy).ptx) is None:
            pytest.skip("ptxas is not installed (PTX not assembled)")


def test_launch_plan_is_consistent():
    plan = tiny_artifact().plan
    ids = {b["id"]: b for b in plan["buffers"]}
    for L in plan["launches"]:
        if L["op"] == "kernel":
            assert all(a in ids for a in L["args"])
            assert 0 <= L["kernel"] < len(plan["kernels"])
            assert 1 <= L["block"][0] <= 1024 and L["grid"][0] >= 1
        else:
            assert ids[L["src"]]["nbytes"] >= L["nbytes"] <= ids[L["dst"]]["nbytes"]
    # the KV caches are written in place over their inputs
    kv = [o for o in plan["outputs"] if o["aliases"]]
    assert len(kv) == 4 and all(o["in_place"] for o in kv)
    # weights are bound by name, once each
    names = [p["name"] for p in plan["params"]]
    assert len(names) == len(set(names)) and "lm_head" in names


def test_strategies():
    naive = tiny_artifact(strategy="naive")
    auto = tiny_artifact(strategy="auto")
    assert "warp_rows" not in naive.meta["strategies"]
    # the GEMVs and norms reduce across lanes: generic warp rows or the gemv/rowreduce strategies,
    # sibling GEMVs (q/k/v) fused into one launch by the horizontal strategy
    warped = ("warp_rows", "gemv", "rowreduce", "horizontal")
    assert sum(auto.meta["strategies"].get(s, 0) for s in warped) >= 10
    assert "shfl.sync.bfly" in auto.ptx and "shfl.sync" not in naive.ptx
    warp = [L for L in auto.plan["launches"] if L.get("strategy") in warped]
    assert all(L["block"][0] % 32 == 0 for L in warp)


def test_attention_is_flash_decoding_and_generic_mapping_remains(monkeypatch):
    """Each attention region (KV capacity 256: a short chain a subgroup) is the
    flash-decoding strategy's one kernel (a block of 16 warps per kv head walking the keys
    interleaved, merged through shared memory; no combine launch); with
    ``POOT_GPU_STRATEGIES=generic`` the generic mapping still makes the online-softmax loop
    one cooperative block."""
    from poot.backends.cuda.codegen import compile_program

    art = tiny_artifact(capacity=256)
    plan = art.plan
    att = [d for d in plan["dispatches"] if d["kind"] == "attention"]
    assert att
    for d in att:
        ks = [L for L in plan["launches"][d["first"]:d["first"] + d["count"]]
              if L["op"] == "kernel"]
        assert [L["strategy"] for L in ks] == ["flash_decode"]
        assert ks[0]["block"] == [512, 1, 1] and ks[0]["grid"][0] == 1
    assert ".maxntid 512, 1, 1" in art.ptx and "bar.sync" in art.ptx
    assert "shfl.sync.idx" in art.ptx
    monkeypatch.setenv("POOT_GPU_STRATEGIES", "generic")
    generic = compile_program(tiny_program(capacity=256)[0])
    assert "flash_decode" not in generic.meta["strategies"]
    coop = [L for L in generic.plan["launches"] if L.get("strategy") == "cooperative"]
    assert coop and max(L["block"][0] for L in coop) >= 64
    assert "bar.sync" in generic.ptx


def test_artifact_round_trip(tmp_path):
    from poot.backends.cuda.artifact import CudaArtifact

    art = tiny_artifact()
    art.save(str(tmp_path))
    back = CudaArtifact.load(str(tmp_path))
    assert back.plan == art.plan and back.ptx == art.ptx and back.meta == art.meta
    (tmp_path / "plan.json").write_text('{"format": "other"}')
    with pytest.raises(ValueError, match="poot-cuda-1"):
        CudaArtifact.load(str(tmp_path))


def test_runtime_imports_no_mlir(tmp_path):
    """The device side (artifact, runtime, devcheck) loads as plain files with no MLIR."""
    here = os.path.join(os.path.dirname(__file__), "..", "..", "poot", "backends", "cuda")
    code = ("import sys, runpy; sys.path.insert(0, %r); import artifact, runtime, devcheck; "
            "assert not [m for m in sys.modules if m.split('.')[0] in ('mlir', 'poot')], "
            "sorted(sys.modules)" % os.path.abspath(here))
    subprocess.run([sys.executable, "-c", code], check=True, cwd=str(tmp_path))


def test_fixtures_follow_the_step(tmp_path):
    """The oracle fixtures: the last dispatch's result is the step's logits, and the bundle
    holds everything the device check reads."""
    from poot.backends.cuda.fixtures import write_check_bundle

    prog, weights = tiny_program()
    art = tiny_artifact()
    steps = [step_feed(prog.graph, [[5 + k]], [[k]], [0]) for k in range(2)]
    write_check_bundle(str(tmp_path), prog, art, weights.arrays, steps)
    fx = np.load(tmp_path / "fixtures.npz")
    last = len(art.plan["dispatches"]) - 1
    np.testing.assert_array_equal(fx[f"d{last}.o0"].reshape(-1), fx["s0.out.logits"].reshape(-1))
    assert all(f"d{i}.o0" in fx for i in range(last + 1))
    assert "final.kv.0.k" in fx and np.abs(fx["final.kv.0.k"]).max() > 0
    assert set(np.load(tmp_path / "weights.npz").files) == {p["name"] for p in art.plan["params"]}


def test_compile_entry_keeps_kv_in_place():
    """``compile(graph, cuda_target())`` plans the KV scatters before fusion outlines them;
    its CUDA artifact writes the carried caches in place."""
    art = tiny_artifact()  # compile(traced step, cuda_target()).executable
    kv = {o["name"]: o for o in art.plan["outputs"] if o["name"].startswith("kv.")}
    assert len(kv) == 4 and all(o["aliases"] == n and o["in_place"] for n, o in kv.items())


def _param_sources(insts: list[str]) -> dict[str, set[int]]:
    """PTX registers of a kernel body mapped to the kernel parameters they are computed from
    (``ld.param`` of ``..._param_<i>``, then through every instruction that reads them)."""
    import re

    src: dict[str, set[int]] = {}
    for s in insts:
        m = re.match(r"ld\.param\.\S+\s+(%\w+), \[\w+_param_(\d+)\];", s)
        if m:
            src[m.group(1)] = {int(m.group(2))}
            continue
        regs = re.findall(r"%\w+", s)
        if regs and not s.startswith(("st.", "ld.global", "@", "bra", "setp")):
            from_ = set().union(*(src.get(r, set()) for r in regs[1:]))
            if from_:
                src[regs[0]] = from_
    return src


def test_every_kernel_opens_with_grid_dependency_control():
    """Programmatic dependent launch: each kernel waits (``griddepcontrol.wait``) before it
    touches memory the step writes, then triggers its dependents
    (``griddepcontrol.launch_dependents``); before the wait it only loads the step's
    constants (arguments bound to a weight or a plan constant in every launch, what
    :func:`~poot.backends.cuda.hoist_constant_loads.hoist_constant_loads` moves there), never
    stores. The plan says ``pdl`` so the runtime launches the kernels with programmatic
    stream serialization."""
    import re

    art = tiny_artifact()
    assert art.plan["pdl"] is True
    plan = art.plan
    role = [b["role"] for b in plan["buffers"]]
    constant = {}
    for L in plan["launches"]:
        if L["op"] == "kernel":
            mine = {i for i, b in enumerate(L["args"]) if role[b] in ("param", "const")}
            k = plan["kernels"][L["kernel"]]
            constant[k] = constant[k] & mine if k in constant else mine
    bodies = re.split(r"\.entry ", art.ptx)[1:]
    assert len(bodies) == len(plan["kernels"])
    early = 0
    for body in bodies:
        name = body.split("(", 1)[0].strip()
        insts = [ln.strip() for ln in body.split("{", 1)[1].splitlines()
                 if ln.strip() and not ln.strip().startswith((".", "//", "{", "}", "$"))]
        wait = insts.index("griddepcontrol.wait;")
        trig = insts.index("griddepcontrol.launch_dependents;")
        assert wait < trig, name
        head = insts[:wait]
        assert not [s for s in head if s.startswith(("st.global", "atom.", "red."))], name
        src = _param_sources(head)
        for s in head:
            if s.startswith("ld.global"):
                addr = re.search(r"\[(%\w+)", s).group(1)
                assert src.get(addr) and src[addr] <= constant[name], (name, s, src.get(addr))
                early += 1
    # some of the tiny Llama's kernels read constants early (20 loads when this was written)
    assert early > 0


def test_smollm2_decode_fuses_sibling_launches(monkeypatch):
    """SmolLM2-135M's decode plan for CUDA: horizontal fusion makes each layer's q/k/v GEMVs
    one launch and its K/V cache writes one launch (3 fewer launches per layer, 30 layers),
    the KV caches stay written in place, and the number of distinct kernels does not grow
    (identical layers share the fused kernels)."""
    from poot.backends.cuda.codegen import cuda_target
    from poot.compiler.compile import compile as compile_step
    from poot.graph.sampling import GREEDY
    from poot.load.bundled import smollm2_gguf
    from poot.models import StepSpec, load_model

    path = smollm2_gguf()
    if path is None:
        pytest.skip("the SmolLM2 GGUF is not bundled")
    model, weights = load_model(str(path))
    plans = {}
    for flag in ("1", "0"):
        monkeypatch.setenv("POOT_GPU_HORIZONTAL", flag)
        g = model.trace(StepSpec.decode(kv_capacity=256, sampler=GREEDY), weights.types)
        plans[flag] = compile_step(g, cuda_target()).executable
    layers = sum(1 for n, _ in g.inputs if n.startswith("kv.")) // 2

    def kernels(art):
        return [L for L in art.plan["launches"] if L["op"] == "kernel"]
    fused, plain = kernels(plans["1"]), kernels(plans["0"])
    assert layers == 30
    assert len(fused) <= len(plain) - 3 * layers, (len(fused), len(plain))
    assert len(plans["1"].plan["kernels"]) <= len(plans["0"].plan["kernels"])
    assert sum(L["strategy"] == "horizontal" for L in fused) >= 2 * layers
    assert all(o["in_place"] for o in plans["1"].plan["outputs"] if o["aliases"])
    for name in plans["1"].plan["kernels"]:
        assert f".entry {name}(" in plans["1"].ptx


def test_paged_decode_step_plan():
    """The tiny Q4_1 Llama's paged decode step for CUDA (4 sequences, 16-position f16 blocks
    in a 24-block pool): each layer's ``poot.paged_attention`` region is the flash-decoding
    strategy's one kernel over the (sequence, kv head) grid, RoPE and the causal mask folded
    into it; each layer's K/V writes are one horizontal launch and no copy (the pools are
    updated in place: every carried output is its input's buffer); ptxas assembles the
    PTX."""
    from poot.backends.cuda.codegen import cuda_target, ptxas_check
    from poot.compiler.compile import compile as compile_step
    from poot.models import StepSpec, load_model
    from model_steps import fixture_path

    model, weights = load_model(fixture_path("llama_gguf_q4_1"))
    g = model.trace(StepSpec.decode(batch=4, kv_capacity=64, block_size=16, num_blocks=24),
                    weights.types)
    prog = compile_step(g, cuda_target())
    plan = prog.executable.plan
    assert dict(g.inputs)["kv.0.k"].shape == (24, 16, 2, 16)
    assert '"poot.paged_attention"' in str(prog.graph.module)
    attention = ("attention", "paged_attention")      # the kind of the op's region
    kinds = [d["kind"] for d in plan["dispatches"]]
    assert sum(k in attention for k in kinds) == 2 and "rope" not in kinds
    assert "elementwise" not in kinds
    for d in plan["dispatches"]:
        ls = plan["launches"][d["first"]:d["first"] + d["count"]]
        if d["kind"] in attention:
            assert [L["strategy"] for L in ls] == ["flash_decode"]
            assert ls[0]["grid"][2] == 4 * 2                    # sequences x kv heads
        if d["kind"] == "scatter":
            assert [L["op"] for L in ls] == ["kernel"] and ls[0]["strategy"] == "horizontal"
    kv = [o for o in plan["outputs"] if o["aliases"]]
    assert len(kv) == 4 and all(o["in_place"] and o["poot"] == "f16" for o in kv)
    assert not any(L["op"] == "copy" for L in plan["launches"])
    if ptxas_check(prog.executable.ptx) is None:
        pytest.skip("ptxas is not installed (PTX generated, not assembled)")


def test_mla_paged_decode_step_plan():
    """DeepSeek-V3's MLA decode for CUDA (4 sequences, 16-position blocks): each layer's
    ``poot.paged_attention`` reads the one latent pool as keys and its first
    ``kv_lora_rank`` channels as values inside the flash-decoding kernel (grid: sequences x
    the one KV head; no slice or copy of the pool), and the pool is updated in place."""
    from poot.backends.cuda.codegen import cuda_target, ptxas_check
    from poot.compiler.compile import compile as compile_step
    from poot.models import StepSpec, load_model
    from model_steps import fixture_path

    model, weights = load_model(fixture_path("deepseek_v3"))
    g = model.trace(StepSpec.decode(batch=4, kv_capacity=64, block_size=16, num_blocks=24),
                    weights.types)
    assert dict(g.inputs)["kv.0.latent"].shape == (24, 16, 1, 32 + 8)
    prog = compile_step(g, cuda_target())
    plan = prog.executable.plan
    kinds = [d["kind"] for d in plan["dispatches"]]
    assert kinds.count("paged_attention") == 2 and "slice" not in kinds
    for d in plan["dispatches"]:
        ls = plan["launches"][d["first"]:d["first"] + d["count"]]
        if d["kind"] == "paged_attention":
            assert [L["strategy"] for L in ls] == ["flash_decode"]
            assert ls[0]["grid"][0] * ls[0]["grid"][1] * ls[0]["grid"][2] >= 4
    kv = [o for o in plan["outputs"] if o["aliases"]]
    assert len(kv) == 2 and all(o["in_place"] for o in kv)
    if ptxas_check(prog.executable.ptx) is None:
        pytest.skip("ptxas is not installed (PTX generated, not assembled)")
