"""Decode attention on the H200: the one-launch plan (W subgroups a block) against the split +
combine plan, per model shape and position.

Build here (MLIR; ~1 min), into an ignored folder carried to the machine (~1 MB)::

    PYTHONPATH=. python bench/gpu_run/attn_bench.py build .cache/gpu/attn

Run there (cuda-bindings, numpy; no MLIR), carry ``.cache/gpu/attn``::

    python3 bench/gpu_run/attn_bench.py run .cache/gpu/attn $OUT/attn_bench.json

Each case is the attention region of one decode layer as the folded step holds it (RoPE of q
and the causal mask ``iota <= position`` computed in the region, f32 KV caches; see
``rope_attention_region`` in test/gpu/test_gpu_attention.py), compiled once per plan variant
of :data:`DENSE_VARIANTS` (:func:`plan_variant`; ``auto`` is what
:func:`~poot.backends.gpu.strategies.attention.plan_attention` picks). ``run`` checks every
variant against the oracle's outputs computed here (same seeded inputs; 1e-4), then times a CUDA graph of
``LAYERS`` back-to-back copies of the region (a decode step's attention launches, their
graph-node overheads included) per position, and reports microseconds per layer.

Paged cases (``PAGED``: ``poot.paged_attention`` as a paged step's folded region holds it, f16
block pools of 32 positions, every sequence's blocks scattered over the pool) are compiled per
variant of :data:`PAGED_VARIANTS` and timed the same way, every sequence at the position: the
same shapes as the dense cases (what the block table costs), a batch of 16 sequences in a
2048-key table (what a serving decode step's attention costs while the sequences are short)
and one of 128 in a 512-key table (the 1B's decode bench at B = 128).

KV storage cases (``KV``, built alone with ``build FOLDER --kv``): the Llama-3.2-1B shape at
B = 64 sequences in a 2048-key table (issue 49's H200 target), paged, once per pool storage of
``KV_FORMATS``: f16, bf16 and q8_0 (i8 values and f16 scales, dequantized by the kernel where
it loads them, K four values a 32-bit word load; q8_0's ``bytes`` variant reads K one byte
load a value, its ``k2`` variant twice the K loads a round, its ``bytes16`` split blocks of 16
subgroups reading bytes; every storage's ``w1``, split blocks of one subgroup). ``run`` checks
each
against the oracle and adds ``kv_summary``: per position, microseconds per layer of each
storage and the speed-ups of q8_0 over f16 and bf16 (the issue's target: >= 1.1x bf16 at 2k
context)::

    PYTHONPATH=. python bench/gpu_run/attn_bench.py build .cache/gpu/attn_kv --kv    # here
    python3 bench/gpu_run/attn_bench.py run .cache/gpu/attn_kv $OUT/attn_kv.json     # there

The pools (134 MiB each in f16 at this shape) are made on the machine from the same seed as
here, so only the kernels and the expected outputs are carried (~4 MB).
"""

from __future__ import annotations

import contextlib
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
         "llama1b_b16_s2048_paged": (16, 8, 4, 2048, 64),
         "llama1b_b128_s512_paged": (128, 8, 4, 512, 64)}
PAGED_BS = 32
#: name -> (B, Hkv, G, S, D) of the KV storage cases (paged, PAGED_BS positions a block)
KV = {"llama1b_b64_s2048": (64, 8, 4, 2048, 64)}
KV_FORMATS = ("f16", "bf16", "q8_0")
#: KV storage case -> (KV name, storage)
KV_CASES = {f"{n}_{f}": (n, f) for n in KV for f in KV_FORMATS}
#: every sequence's position in the KV storage cases (context pos + 1)
KV_POSITIONS = (511, 2047)
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


def bf16_words(x: np.ndarray) -> np.ndarray:
    """f32 ``x`` rounded to bf16 (to nearest, ties to even), as uint16 words."""
    w = np.ascontiguousarray(x, np.float32).view(np.uint32)
    return ((w + 0x7FFF + ((w >> 16) & 1)) >> 16).astype(np.uint16)


def q8_0_planes(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """f32 ``x [..., D]`` as q8_0 planes: int8 values and f16 scales ``[..., D / 32]`` (one
    per 32 values: ``d = max|x| / 127``, ``q = round(x / d)``; plain numpy, the machine has no
    MLIR to import poot.dialects.kv_quant with)."""
    g = x.reshape(x.shape[:-1] + (x.shape[-1] // 32, 32))
    d = (np.abs(g).max(axis=-1, keepdims=True) / 127).astype(np.float16)
    df = d.astype(np.float32)
    q = np.rint(np.divide(g, df, out=np.zeros_like(g), where=df > 0)).clip(-127, 127)
    return q.astype(np.int8).reshape(x.shape), d[..., 0]


def kv_inputs(B, Hkv, G, S, D, fmt, pos, seed=0) -> dict:
    """Like :func:`paged_inputs` with the pools in ``fmt``: f16 / bf16 as uint16 words, q8_0
    as int8 values (``a2``, ``a3``) and f16 scales (``a5``, ``a6``, uint16 words)."""
    rng = np.random.default_rng(seed)
    W = S // PAGED_BS
    NB = B * W + 1
    pool = (NB, PAGED_BS, Hkv, D)
    x = {"a0": rng.standard_normal((B, 1, Hkv * G, D)).astype(np.float32),
         "a1": np.full((B, 1), pos, np.int32)}
    k, v = (rng.standard_normal(pool, dtype=np.float32) for _ in range(2))
    x["a4"] = rng.permutation(NB)[:B * W].reshape(B, W).astype(np.int32)
    if fmt == "q8_0":
        (x["a2"], x["a5"]), (x["a3"], x["a6"]) = q8_0_planes(k), q8_0_planes(v)
        x["a5"], x["a6"] = x["a5"].view(np.uint16), x["a6"].view(np.uint16)
    elif fmt == "bf16":
        x["a2"], x["a3"] = bf16_words(k), bf16_words(v)
    else:
        x["a2"], x["a3"] = k.astype(np.float16).view(np.uint16), \
            v.astype(np.float16).view(np.uint16)
    return x


def case_inputs(case: str, pos: int) -> dict:
    if case in PAGED:
        return paged_inputs(*PAGED[case], pos)
    if case in CASES:
        return inputs(*CASES[case], pos)
    name, fmt = KV_CASES[case]
    return kv_inputs(*KV[name], fmt, pos)


def case_positions(case: str) -> list[int]:
    if case in KV_CASES:
        return list(KV_POSITIONS)
    return positions((PAGED[case] if case in PAGED else CASES[case])[-2])


def save_plan(plan, folder: str, key: str) -> list:
    """Write ``plan`` (a :func:`~poot.backends.gpu.plan.plan_program` result) as the CUDA
    artifact ``folder/key``; returns its kernel launches ``(grid, block)``."""
    from poot.backends.cuda.artifact import CudaArtifact
    from poot.backends.cuda.codegen import ptx_text

    p = {"entry": plan.entry, "target": {"arch": "sm_90", "subgroup_size": 32},
         "kernels": plan.kernels, "buffers": plan.buffers, "launches": plan.launches,
         "dispatches": plan.dispatches, "inputs": plan.inputs, "params": plan.params,
         "outputs": plan.outputs}
    ks = [(L["grid"], L["block"]) for L in plan.launches if L["op"] == "kernel"]
    CudaArtifact(p, ptx_text(plan.module), {"launches": ks}).save(os.path.join(folder, key))
    return ks


@contextlib.contextmanager
def wide_k_rounds():
    """Within it, the split kernel issues twice the K loads a round (``JU`` doubled where the
    head dim allows; :func:`~poot.backends.gpu.strategies.attention.plan.unroll`): a q8_0 key
    round then reads the bytes an f16 round reads. The ``k2`` variant of the q8_0 cases, to
    see whether the dependent load rounds or the bytes bound the kernel."""
    from poot.backends.gpu.strategies.attention import emit

    base = emit.unroll

    def wide(D: int, DL: int):
        V, J, JU = base(D, DL)
        JU2 = min(J, 2 * JU)
        while J % JU2:
            JU2 -= 1
        return V, J, JU2

    emit.unroll = wide
    try:
        yield
    finally:
        emit.unroll = base


@contextlib.contextmanager
def byte_loads():
    """Within it, the split kernel reads a q8_0 K pool one byte load a value
    (:data:`~poot.backends.gpu.strategies.attention.emit.Q8_WORDS` off): the ``bytes``
    variant, against the word loads of ``auto``."""
    from poot.backends.gpu.strategies.attention import emit

    emit.Q8_WORDS = False
    try:
        yield
    finally:
        emit.Q8_WORDS = True


#: the q8_0 cases' variants besides ``auto``: name -> how the kernels are built
Q8_VARIANTS = {"bytes": byte_loads, "k2": wide_k_rounds}


@contextlib.contextmanager
def plan_variant(variant: str):
    """Within it, the attention plan is ``variant``'s: ``auto`` (the planner's), ``split``
    (no single-kernel plan: split + combine), ``w32`` (single-kernel blocks of up to 32
    subgroups, 1024 threads), ``w1`` (split blocks of one subgroup:
    :func:`~poot.backends.gpu.strategies.attention.plan.split_subgroups` off) or
    ``split_w1`` (both: every block one subgroup, the plan of the paged decode step at
    B = 128 before the single-kernel plan was tried for one-chunk plans) or ``bytes16`` (a q8_0
    K pool's split blocks as wide as an f16 pool's, up to 16 subgroups, past the 256 threads
    within which its kernel reads K as words: bytes then)."""
    from poot.backends.gpu.strategies.attention import plan as A

    saved = A._single_plan, A.split_subgroups, A.MAX_SUBGROUPS, A.MAX_BLOCK_THREADS, \
        A.WORD_MAX_THREADS
    if variant in ("split", "split_w1"):
        A._single_plan = lambda *a, **k: None
    if variant in ("w1", "split_w1"):
        A.split_subgroups = lambda *a, **k: 1
    if variant == "w32":
        A.MAX_SUBGROUPS, A.MAX_BLOCK_THREADS = 32, 1024
    if variant == "bytes16":
        A.WORD_MAX_THREADS = A.MAX_BLOCK_THREADS
    try:
        yield
    finally:
        A._single_plan, A.split_subgroups, A.MAX_SUBGROUPS, A.MAX_BLOCK_THREADS, \
            A.WORD_MAX_THREADS = saved


#: variants of the dense and the paged cases
DENSE_VARIANTS = ("auto", "split", "w32", "w1")
PAGED_VARIANTS = ("auto", "w1", "split_w1")


def build_kv(folder: str) -> dict:
    """The KV storage cases (:data:`KV` x :data:`KV_FORMATS`) into ``folder``: each one's
    artifact (the strategy's kernels only, else it stops) and the oracle's outputs at
    :data:`KV_POSITIONS` (``<case>_want.npz``); returns their manifest entries."""
    from types import SimpleNamespace

    import ml_dtypes

    sys.path.insert(0, os.path.join(ROOT, "test", "gpu"))
    from test_gpu_attention import rope_attention_region

    from poot import oracle
    from poot.backends.cuda.codegen import cuda_target
    from poot.backends.gpu.plan import plan_program

    caps = cuda_target().caps
    manifest = {}
    for name, (B, Hkv, G, S, D) in KV.items():
        NB = B * (S // PAGED_BS) + 1
        for fmt in KV_FORMATS:
            case = f"{name}_{fmt}"
            g = rope_attention_region(B=B, T=1, Hkv=Hkv, G=G, S=S, D=D, Dv=D, mask="i1",
                                      paged=(NB, PAGED_BS, fmt))
            plan = plan_program(SimpleNamespace(graph=g, storage=[]), caps)
            kernels = sum(1 for L in plan.launches if L["op"] == "kernel")
            if plan.strategies != {"flash_decode": kernels}:
                sys.exit(f"{case}: planned {plan.strategies}, not the flash-decoding kernels")
            ks = save_plan(plan, folder, f"{case}_auto")
            manifest[f"{case}_auto"] = {"case": case, "variant": "auto", "launches": ks}
            for variant in ("w1", "bytes16") if fmt == "q8_0" else ("w1",):
                with plan_variant(variant):
                    plan = plan_program(SimpleNamespace(graph=g, storage=[]), caps)
                ks = save_plan(plan, folder, f"{case}_{variant}")
                manifest[f"{case}_{variant}"] = {"case": case, "variant": variant,
                                                 "launches": ks}
            for variant, how in (Q8_VARIANTS.items() if fmt == "q8_0" else ()):
                with how():
                    plan = plan_program(SimpleNamespace(graph=g, storage=[]), caps)
                ks = save_plan(plan, folder, f"{case}_{variant}")
                manifest[f"{case}_{variant}"] = {"case": case, "variant": variant,
                                                 "launches": ks}
            want = {}
            for p in KV_POSITIONS:
                x = kv_inputs(B, Hkv, G, S, D, fmt, p)
                for a in ("a2", "a3", "a5", "a6"):
                    if x.get(a) is not None and x[a].dtype == np.uint16:
                        x[a] = x[a].view(ml_dtypes.bfloat16 if fmt == "bf16" and a in ("a2", "a3")
                                         else np.float16)
                want[str(p)] = oracle.evaluate(g, x)["r0"]
            np.savez(os.path.join(folder, f"{case}_want.npz"), **want)
            print(case, ks, flush=True)
    return manifest


def save_variants(g, caps, folder: str, name: str, variants, manifest: dict) -> None:
    """Plan ``g`` under each of ``variants`` (:func:`plan_variant`) and save each as the
    artifact ``folder/<name>_<variant>``, listed in ``manifest``."""
    from types import SimpleNamespace

    from poot.backends.gpu.plan import plan_program

    for variant in variants:
        with plan_variant(variant):
            plan = plan_program(SimpleNamespace(graph=g, storage=[]), caps)
        ks = save_plan(plan, folder, f"{name}_{variant}")
        manifest[f"{name}_{variant}"] = {"case": name, "variant": variant, "launches": ks}
        print(name, variant, ks, flush=True)


def build(folder: str, kv_only: bool = False) -> None:
    os.makedirs(folder, exist_ok=True)
    if kv_only:
        with open(os.path.join(folder, "manifest.json"), "w") as f:
            json.dump(build_kv(folder), f, indent=1)
        return
    sys.path.insert(0, os.path.join(ROOT, "test", "gpu"))
    from test_gpu_attention import rope_attention_region

    from poot import oracle
    from poot.backends.cuda.codegen import cuda_target

    caps = cuda_target().caps
    manifest = {}
    for name, (Hkv, G, S, D) in CASES.items():
        g = rope_attention_region(B=1, T=1, Hkv=Hkv, G=G, S=S, D=D, Dv=D, mask="i1")
        want = {str(p): oracle.evaluate(g, inputs(Hkv, G, S, D, p))["r0"].tolist()
                for p in positions(S)}
        save_variants(g, caps, folder, name, DENSE_VARIANTS, manifest)
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
        save_variants(g, caps, folder, name, PAGED_VARIANTS, manifest)
        with open(os.path.join(folder, f"{name}_want.json"), "w") as f:
            json.dump(want, f)
    with open(os.path.join(folder, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)


def expected(folder: str, case: str) -> dict:
    """The oracle's outputs of ``case`` by position (``<case>_want.npz`` or ``.json``)."""
    path = os.path.join(folder, f"{case}_want")
    if os.path.exists(path + ".npz"):
        with np.load(path + ".npz") as z:
            return {k: z[k] for k in z.files}
    with open(path + ".json") as f:
        return json.load(f)


def kv_summary(results: dict) -> dict:
    """Per KV storage shape and position: microseconds per layer of each storage and the
    speed-ups of q8_0 over f16 and bf16 (the time of the other over q8_0's); ``ok``: every
    storage matched the oracle."""
    out = {}
    for name in KV:
        rows = {f: results.get(f"{name}_{f}_auto") for f in KV_FORMATS}
        if any(r is None for r in rows.values()):
            continue
        per = {}
        for p in map(str, KV_POSITIONS):
            us = {f: rows[f]["us_per_layer"][p] for f in KV_FORMATS}
            per[p] = {"us_per_layer": us,
                      "q8_0_vs_f16": round(us["f16"] / us["q8_0"], 3),
                      "q8_0_vs_bf16": round(us["bf16"] / us["q8_0"], 3)}
            for variant in Q8_VARIANTS:
                r = results.get(f"{name}_q8_0_{variant}")
                if r is not None:
                    per[p][f"q8_0_{variant}_us"] = r["us_per_layer"][p]
                    per[p][f"q8_0_{variant}_vs_bf16"] = round(us["bf16"] /
                                                             r["us_per_layer"][p], 3)
        variants = [results.get(f"{name}_q8_0_{v}", {"ok": True}) for v in Q8_VARIANTS]
        out[name] = {"positions": per,
                     "ok": all(r["ok"] for r in list(rows.values()) + variants)}
    return out


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
        want = expected(folder, m["case"])
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
    report = {"time": time.strftime("%Y-%m-%d %H:%M:%S"), "layers": LAYERS,
              "replays": REPLAYS, "results": results}
    if any(key.rsplit("_", 1)[0] in KV_CASES for key in results):
        report["kv_summary"] = kv_summary(results)
        print("kv_summary", json.dumps(report["kv_summary"]), flush=True)
    with open(out, "w") as f:
        json.dump(report, f, indent=1)
    if not all(r["ok"] for r in results.values()):
        sys.exit(f"{out}: some outputs differ from the oracle (max_err >= 1e-4)")


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] not in ("build", "run"):
        sys.exit(__doc__)
    if sys.argv[1] == "build":
        build(sys.argv[2], kv_only="--kv" in sys.argv[3:])
    else:
        run(sys.argv[2], sys.argv[3])
