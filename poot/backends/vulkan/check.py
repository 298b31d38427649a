"""The Vulkan device check: a compiled step bundle run on whatever Vulkan device is present,
against the CPU oracle's results carried as fixtures; then the replay speed. Imports no MLIR.

    python poot/backends/vulkan/check.py BUNDLE... [--bench N] [--json OUT] [--device NAME]

``BUNDLE`` is a folder written by :mod:`poot.backends.vulkan.bundle` (``art/`` = SPIR-V +
plan.json, ``weights.npz``, ``fixtures.npz`` with ``s{k}.in.{name}`` / ``s{k}.out.{name}``
over consecutive steps, carried state starting at zero). Carried state (``plan.aliases``:
KV caches) is ping-ponged between two buffers, one recording per parity, as the executor
does. Exit status 1 when any output is off by more than the tolerance (f32: 1e-4).
This file and its siblings ``artifact.py`` / ``runtime.py`` load on their own (no package
import) for machines without MLIR.
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

if __package__:
    from poot.backends.vulkan.artifact import VulkanArtifact
    from poot.backends.vulkan.runtime import VulkanDevice
else:                                   # run as a file: load the siblings directly
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from artifact import VulkanArtifact  # type: ignore  # noqa: E402
    from runtime import VulkanDevice  # type: ignore  # noqa: E402

TOL = 1e-4


def run_bundle(dev, folder: str, bench: int = 0) -> dict:
    art = VulkanArtifact.load(os.path.join(folder, "art"))
    with np.load(os.path.join(folder, "weights.npz")) as z:
        weights = {k: z[k] for k in z.files}
    with np.load(os.path.join(folder, "fixtures.npz")) as z:
        fx = {k: z[k] for k in z.files}
    t0 = time.perf_counter()
    kernel = dev.load(art)
    load_s = time.perf_counter() - t0
    carried = dict(art.aliases)                      # output -> input
    state = {inp: [dev.alloc(s), dev.alloc(s)] for inp, s in
             ((i, dict(art.inputs)[i]) for i in carried.values())}
    cur = {k: 0 for k in state}
    slots = {n: dev.alloc(s) for n, s in art.inputs if n not in state}
    outs = {n: dev.alloc(s) for n, s in art.outputs if n not in carried}
    params = {}
    for n, s in art.params:
        params[n] = dev.alloc(s)
        dev.upload(params[n], weights[n])
    recs = {}

    def bindings():
        out = []
        for a in kernel.args:
            if a.role == "input":
                out.append(state[a.name][cur[a.name]] if a.name in state else slots[a.name])
            elif a.role == "param":
                out.append(params[a.name])
            elif a.name in carried:
                inp = carried[a.name]
                out.append(state[inp][1 - cur[inp]])
            else:
                out.append(outs[a.name])
        return out

    def step():
        key = tuple(cur.values())
        if key not in recs:
            recs[key] = dev.record(kernel, bindings())
        dev.replay(recs[key])
        dev.synchronize()
        for k in cur:
            cur[k] = 1 - cur[k]

    steps = sorted({int(k.split(".")[0][1:]) for k in fx if k.startswith("s")})
    worst, ok = 0.0, True
    first_s = None
    for s in steps:
        for k, v in fx.items():
            if k.startswith(f"s{s}.in."):
                dev.upload(slots[k[len(f"s{s}.in."):]], v)
        t = time.perf_counter()
        step()
        if first_s is None:
            first_s = time.perf_counter() - t
        for k, want in fx.items():
            if k.startswith(f"s{s}.out."):
                got = dev.download(outs[k[len(f"s{s}.out."):]])
                err = float(np.max(np.abs(got.astype(np.float64) - want)
                                   / (1.0 + np.abs(want)))) if want.size else 0.0
                worst = max(worst, err)
                ok &= err <= TOL
    res = {"bundle": os.path.basename(os.path.normpath(folder)), "ok": bool(ok),
           "max_rel_err": worst, "steps_checked": len(steps), "kernels": len(art.kernels),
           "dispatches": art.dispatch_count, "load_s": round(load_s, 3),
           "first_step_s": round(first_s or 0.0, 4), "recordings": len(recs)}
    if bench:
        t = time.perf_counter()
        for _ in range(bench):
            step()
        res["replay_ms"] = round(1e3 * (time.perf_counter() - t) / bench, 4)
        res["bench_steps"] = bench
    return res


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bundles", nargs="+")
    ap.add_argument("--bench", type=int, default=0, help="replay the step N times and time it")
    ap.add_argument("--json", help="write the results here too")
    ap.add_argument("--device", help="Vulkan device index or name substring")
    a = ap.parse_args(argv)
    dev = VulkanDevice(device=a.device)
    caps = dev.capabilities()
    report = {"device": caps["name"], "subgroup_size": caps["subgroup_size"],
              "api_version": caps["api_version"], "memory_budget": dev.memory_budget(),
              "results": []}
    for b in a.bundles:
        report["results"].append(run_bundle(dev, b, a.bench))
    dev.close()
    text = json.dumps(report, indent=1)
    print(text)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text)
    return 0 if all(r["ok"] for r in report["results"]) else 1


if __name__ == "__main__":
    sys.exit(main())
