"""SmolLM2-135M (real Q4_1 weights) decode step on the Vulkan runtime: greedy tokens for the
reference prompts (host argmax of read-back logits, prompt fed as T=1 steps) and the replay
speed at KV capacity 256. MLIR-free; run on the GPU machine:

    python3 bench/gpu_run/smollm2_vulkan.py VK_ART W_A.npz W_B.npz REF_DIR OUT.json [NPROMPTS]
"""
from __future__ import annotations

import glob
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from poot.backends.vulkan.artifact import VulkanArtifact  # noqa: E402
from poot.backends.vulkan.runtime import VulkanDevice  # noqa: E402


def main() -> int:
    art_dir, wa, wb, ref_dir, out = sys.argv[1:6]
    nprompts = int(sys.argv[6]) if len(sys.argv) > 6 else 99
    art = VulkanArtifact.load(art_dir)
    weights = {}
    for p in (wa, wb):
        with np.load(p) as z:
            weights.update({k: z[k] for k in z.files})
    dev = VulkanDevice()
    caps = dev.capabilities()
    t0 = time.perf_counter()
    kernel = dev.load(art)
    carried = dict(art.aliases)
    ins = dict(art.inputs)
    state = {i: [dev.alloc(ins[i]), dev.alloc(ins[i])] for i in carried.values()}
    cur = {k: 0 for k in state}
    slots = {n: dev.alloc(s) for n, s in art.inputs if n not in state}
    outs = {n: dev.alloc(s) for n, s in art.outputs if n not in carried}
    params = {}
    for n, s in art.params:
        params[n] = dev.alloc(s)
        dev.upload(params[n], weights[n])
    load_s = time.perf_counter() - t0
    recs = {}

    def bindings():
        r = []
        for a in kernel.args:
            if a.role == "input":
                r.append(state[a.name][cur[a.name]] if a.name in state else slots[a.name])
            elif a.role == "param":
                r.append(params[a.name])
            elif a.name in carried:
                r.append(state[carried[a.name]][1 - cur[carried[a.name]]])
            else:
                r.append(outs[a.name])
        return r

    def run(tok, pos, read=True):
        dev.upload(slots["tokens"], np.array([[tok]], np.int32))
        dev.upload(slots["positions"], np.array([[pos]], np.int32))
        # one block per sequence (block 0): slot = position
        dev.upload(slots["block_table"], np.zeros((1, 1), np.int32))
        dev.upload(slots["slot_mapping"], np.array([pos], np.int32))
        key = tuple(cur.values())
        if key not in recs:
            recs[key] = dev.record(kernel, bindings())
        dev.replay(recs[key])
        dev.synchronize()
        for k in cur:
            cur[k] = 1 - cur[k]
        return dev.download(outs["logits"]).reshape(-1) if read else None

    def reset():
        for i, pair in state.items():
            z = np.zeros(ins[i].shape, ins[i].dtype.numpy if hasattr(ins[i].dtype, "numpy")
                         else np.float32)
            for b in pair:
                dev.upload(b, z)

    report = {"device": caps["name"], "subgroup_size": caps["subgroup_size"],
              "load_s": round(load_s, 2), "prompts": {}}
    for f in sorted(glob.glob(os.path.join(ref_dir, "*.json")))[:nprompts]:
        ref = json.load(open(f))
        reset()
        ids, want = ref["prompt_ids"], ref["generated_ids"]
        margins = [s["top1_minus_top2"] for s in ref["steps"]]
        for p, t in enumerate(ids):
            logits = run(t, p)
        ref0 = os.path.join(ref_dir, ref["first_step_logits_npy"])
        d0 = float(np.abs(logits - np.load(ref0).reshape(-1)).max())
        got = []
        for k in range(len(want)):
            got.append(int(np.argmax(logits)))
            if k + 1 < len(want):
                logits = run(got[-1], len(ids) + k)
        limit = next((i for i, m in enumerate(margins) if m < 0.01), len(want))
        match = next((i for i in range(len(want)) if got[i] != want[i]), len(want))
        report["prompts"][ref["name"]] = {"matched_prefix": match, "compared_up_to": limit,
                                          "ok": match >= limit,
                                          "first_step_logits_max_abs_diff": d0}
        print(ref["name"], match, limit, d0, flush=True)
    reset()
    cap = ins["kv.0.k"].shape[1]
    tok = 1
    run(tok, 0)
    t = time.perf_counter()
    for p in range(cap):
        tok = int(np.argmax(run(tok, p)))
    loop = time.perf_counter() - t
    n = 200
    t = time.perf_counter()
    for p in range(n):
        run(1, p % cap, read=False)
    rep = time.perf_counter() - t
    report["speed"] = {"kv_capacity": cap, "greedy_loop_tok_per_s": round(cap / loop, 1),
                       "replay_ms": round(1e3 * rep / n, 3),
                       "replay_tok_per_s": round(n / rep, 1),
                       "kernels": len(art.kernels), "dispatches": art.dispatch_count}
    print(json.dumps(report["speed"]), flush=True)
    dev.close()
    json.dump(report, open(out, "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
