"""Decode attention on the H200: the one-launch plan (W subgroups a block) against the split +
combine plan, per model shape and position.

Build here (MLIR; ~1 min), into an ignored folder carried to the machine (~1 MB)::

    PYTHONPATH=. python bench/gpu_run/attn_bench.py build .cache/gpu/attn

Run there (cuda-bindings, numpy; no MLIR), carry ``.cache/gpu/attn``::

    python3 bench/gpu_run/attn_bench.py run .cache/gpu/attn $OUT/attn_bench.json

Each case is the attention region of one decode layer as the folded step holds it (RoPE of q
and the causal mask ``iota <= position`` computed in the region, f32 KV caches; see
``rope_attention_region`` in test/gpu/test_gpu_attention.py), compiled three times: ``auto`` (what
:func:`~poot.backends.gpu.strategies.attention.plan_attention` picks), ``split`` (the
single-kernel plan disabled: split + combine) and ``w32`` (the single-kernel plan with blocks of
up to 32 subgroups). ``run`` checks every variant against the
oracle's outputs computed here (same seeded inputs; 1e-4), then times a CUDA graph of
``LAYERS`` back-to-back copies of the region (a decode step's attention launches, their
graph-node overheads included) per position, and reports microseconds per layer.

Paged cases (``PAGED``: ``poot.paged_attention`` as a paged step's folded region holds it, f16
block pools of 32 positions, every sequence's blocks scattered over the pool) are compiled once
(``auto``) and timed the same way, every sequence at the position: the same shapes as the dense
cases (what the block table costs) and a batch of 16 sequences in a 2048-key table (what a
serving decode step's attention costs while the sequences are short).
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

#: name -> (Hkv, G, S, D): SmolLM2-135M, Llama-3.2-1B, Llama-3-8B decode, and longer caps
CASES = {"smollm2_s256": (3, 3, 256, 64), "llama1b_s512": (8, 4, 512, 64),
         "llama8b_s512": (8, 4, 512, 128), "llama1b_s1024": (8, 4, 1024, 64),
         "llama8b_s1024": (8, 4, 1024, 128), "llama8b_s4096": (8, 4, 4096, 128)}
#: name -> (B, Hkv, G, S, D) of paged regions (f16 pools, PAGED_BS positions a block)
PAGED = {"smollm2_s256_paged": (1, 3, 3, 256, 64), "llama8b_s512_paged": (1, 8, 4, 512, 128),
         "llama8b_s4096_paged": (1, 8, 4, 4096, 128),
         "llama1b_b16_s2048_paged": (16, 8, 4, 2048, 64)}
PAGED_BS = 32
LAYERS = 30
REPLAYS = 200


def positions(S: int) -> list[int]:
    return [0, S // 4, S // 2, S - 1]


def inputs(Hkv, G, S, D, pos, seed=0) -> dict:
    rng = np.random.default_rng(seed)
    return {"a0": rng.standard_normal((1, 1, Hkv * G, D)).astype(np.float32),
            "a1": np.array([[pos]], np.int32),
            "a2": rng.standard_normal((1, S, Hkv, D)).astype(np.float32),
            "a3": rng.standard_normal((1, S, Hkv, D)).astype(np.float32)}


def paged_inputs(B, Hkv, G, S, D, pos, seed=0) -> dict:
    """q, positions (every sequence at ``pos``), f16 pools of ``B * S / PAGED_BS + 1`` blocks
    (as uint16 words) and a table of each sequence's blocks, scattered over the pool."""
    rng = np.random.default_rng(seed)
    W = S // PAGED_BS
    NB = B * W + 1
    pool = (NB, PAGED_BS, Hkv, D)
    return {"a0": rng.standard_normal((B, 1, Hkv * G, D)).astype(np.float32),
            "a1": np.full((B, 1), pos, np.int32),
            "a2": rng.standard_normal(pool).astype(np.float16).view(np.uint16),
            "a3": rng.standard_normal(pool).astype(np.float16).view(np.uint16),
            "a4": rng.permutation(NB)[:B * W].reshape(B, W).astype(np.int32)}


def case_inputs(case: str, pos: int) -> dict:
    if case in PAGED:
        return paged_inputs(*PAGED[case], pos)
    return inputs(*CASES[case], pos)


def case_positions(case: str) -> list[int]:
    return positions((PAGED[case] if case in PAGED else CASES[case])[-2])


def build(folder: str) -> None:
    from types import SimpleNamespace

    sys.path.insert(0, os.path.join(ROOT, "test", "gpu"))
    from test_gpu_attention import rope_attention_region

    from poot import oracle
    from poot.backends.cuda.artifact import CudaArtifact
    from poot.backends.cuda.codegen import cuda_target, ptx_text
    from poot.backends.gpu.plan import plan_program
    from poot.backends.gpu.strategies.attention import plan as A

    caps = cuda_target().caps
    manifest = {}
    for name, (Hkv, G, S, D) in CASES.items():
        g = rope_attention_region(B=1, T=1, Hkv=Hkv, G=G, S=S, D=D, Dv=D, mask="i1")
        want = {str(p): oracle.evaluate(g, inputs(Hkv, G, S, D, p))["r0"].tolist()
                for p in positions(S)}
        for variant in ("auto", "split", "w32"):
            single, limits = A._single_plan, (A.MAX_SUBGROUPS, A.MAX_BLOCK_THREADS)
            if variant == "split":
                A._single_plan = lambda *a, **k: None
            if variant == "w32":             # blocks of up to 32 subgroups (1024 threads)
                A.MAX_SUBGROUPS, A.MAX_BLOCK_THREADS = 32, 1024
            try:
                plan = plan_program(SimpleNamespace(graph=g, storage=[]), caps)
            finally:
                A._single_plan = single
                A.MAX_SUBGROUPS, A.MAX_BLOCK_THREADS = limits
            p = {"entry": plan.entry, "target": {"arch": "sm_90", "subgroup_size": 32},
                 "kernels": plan.kernels, "buffers": plan.buffers, "launches": plan.launches,
                 "dispatches": plan.dispatches, "inputs": plan.inputs, "params": plan.params,
                 "outputs": plan.outputs}
            ks = [(L["grid"], L["block"]) for L in plan.launches if L["op"] == "kernel"]
            CudaArtifact(p, ptx_text(plan.module), {"launches": ks}).save(
                os.path.join(folder, f"{name}_{variant}"))
            manifest[f"{name}_{variant}"] = {"case": name, "variant": variant, "launches": ks}
            print(name, variant, ks, flush=True)
        with open(os.path.join(folder, f"{name}_want.json"), "w") as f:
            json.dump(want, f)
    for name, (B, Hkv, G, S, D) in PAGED.items():
        NB = B * (S // PAGED_BS) + 1
        g = rope_attention_region(B=B, T=1, Hkv=Hkv, G=G, S=S, D=D, Dv=D, mask="i1",
                                  paged=(NB, PAGED_BS, "f16"))
        want = {}
        for p in positions(S):
            x = paged_inputs(B, Hkv, G, S, D, p)
            x["a2"], x["a3"] = x["a2"].view(np.float16), x["a3"].view(np.float16)
            want[str(p)] = oracle.evaluate(g, x)["r0"].tolist()
        plan = plan_program(SimpleNamespace(graph=g, storage=[]), caps)
        p = {"entry": plan.entry, "target": {"arch": "sm_90", "subgroup_size": 32},
             "kernels": plan.kernels, "buffers": plan.buffers, "launches": plan.launches,
             "dispatches": plan.dispatches, "inputs": plan.inputs, "params": plan.params,
             "outputs": plan.outputs}
        ks = [(L["grid"], L["block"]) for L in plan.launches if L["op"] == "kernel"]
        CudaArtifact(p, ptx_text(plan.module), {"launches": ks}).save(
            os.path.join(folder, f"{name}_auto"))
        manifest[f"{name}_auto"] = {"case": name, "variant": "auto", "launches": ks}
        print(name, "auto", ks, flush=True)
        with open(os.path.join(folder, f"{name}_want.json"), "w") as f:
            json.dump(want, f)
    with open(os.path.join(folder, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)


def run(folder: str, out: str) -> None:
    from poot.backends.cuda.artifact import CudaArtifact
    from poot.backends.cuda.runtime import CudaDevice, _check, driver

    cu = driver()
    dev = CudaDevice()
    with open(os.path.join(folder, "manifest.json")) as f:
        manifest = json.load(f)
    ev0 = _check(cu.cuEventCreate(0), "cuEventCreate")
    ev1 = _check(cu.cuEventCreate(0), "cuEventCreate")
    results = {}
    for key, m in manifest.items():
        with open(os.path.join(folder, f"{m['case']}_want.json")) as f:
            want = json.load(f)
        k = dev.load(CudaArtifact.load(os.path.join(folder, key)))
        bufs = [dev.alloc(a.type) for a in k.args]
        ptrs, _ = dev._pointers(k, bufs)
        row = {"launches": m["launches"], "us_per_layer": {}, "max_err": 0.0}
        for pos in case_positions(m["case"]):
            x = case_inputs(m["case"], pos)
            for a, b in zip(k.args, bufs):
                if a.role == "input":
                    dev.upload(b, x[a.name])
            dev.run_eager(k, bufs)
            got = next(dev.download(b) for a, b in zip(k.args, bufs) if a.role == "output")
            err = float(np.abs(got.reshape(-1) - np.asarray(want[str(pos)]).reshape(-1)).max())
            row["max_err"] = max(row["max_err"], err)
            # LAYERS copies of the region in one graph, REPLAYS replays
            keep: list = []
            _check(cu.cuStreamBeginCapture(
                dev.stream, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
                "cuStreamBeginCapture")
            for _ in range(LAYERS):
                dev._enqueue(k, ptrs, [], keep)
            graph = _check(cu.cuStreamEndCapture(dev.stream), "cuStreamEndCapture")
            gexec = _check(cu.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
            for _ in range(10):
                _check(cu.cuGraphLaunch(gexec, dev.stream), "cuGraphLaunch")
            dev.synchronize()
            _check(cu.cuEventRecord(ev0, dev.stream), "cuEventRecord")
            for _ in range(REPLAYS):
                _check(cu.cuGraphLaunch(gexec, dev.stream), "cuGraphLaunch")
            _check(cu.cuEventRecord(ev1, dev.stream), "cuEventRecord")
            _check(cu.cuEventSynchronize(ev1), "cuEventSynchronize")
            ms = float(_check(cu.cuEventElapsedTime(ev0, ev1), "cuEventElapsedTime"))
            row["us_per_layer"][str(pos)] = round(1000 * ms / (REPLAYS * LAYERS), 3)
            _check(cu.cuGraphExecDestroy(gexec), "cuGraphExecDestroy")
            _check(cu.cuGraphDestroy(graph), "cuGraphDestroy")
        row["ok"] = row["max_err"] < 1e-4
        results[key] = row
        print(key, json.dumps(row), flush=True)
    with open(out, "w") as f:
        json.dump({"time": time.strftime("%Y-%m-%d %H:%M:%S"), "layers": LAYERS,
                   "replays": REPLAYS, "results": results}, f, indent=1)


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] not in ("build", "run"):
        sys.exit(__doc__)
    if sys.argv[1] == "build":
        build(sys.argv[2])
    else:
        run(sys.argv[2], sys.argv[3])
