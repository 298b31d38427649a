"""The device check: every dispatch of a compiled program, and whole steps replayed from one
CUDA graph, against the oracle's results carried as fixtures. Imports no MLIR.

    python poot/backends/cuda/devcheck.py BUNDLE [--bench N] [--json OUT]

``BUNDLE`` is a folder written by :func:`poot.backends.cuda.fixtures.write_check_bundle`.
Fails (exit 1) when any result is off by more than the tolerance, or when the fixture of any
dispatch or step is missing. This file and its two siblings (``artifact.py``, ``runtime.py``)
are loadable on their own (no package import), for machines without MLIR.
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

if __package__:
    from poot.backends.cuda.artifact import CudaArtifact
    from poot.backends.cuda.runtime import CudaDevice, StepRunner, profile_dispatches
else:                                   # run as a file: load the siblings directly
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from artifact import CudaArtifact  # type: ignore  # noqa: E402
    from runtime import CudaDevice, StepRunner, profile_dispatches  # type: ignore  # noqa

TOL = {"float32": 1e-4, "float16": 1e-2, "uint16": 2e-2}


def compare(got: np.ndarray, want: np.ndarray) -> tuple[float, bool]:
    """(max abs diff, within tolerance): floats relative to max(1, max|want|), ints exact but
    int8 (q8_0 KV values: a value that lands on a rounding edge in one summation order may
    round one step the other way in another) within one."""
    got = np.asarray(got).reshape(want.shape)
    if want.dtype.kind == "f":
        if want.size == 0:
            return 0.0, True
        d = np.abs(got.astype(np.float64) - want.astype(np.float64))
        err = float(np.nanmax(d)) if np.isfinite(d).all() else float("inf")
        scale = max(1.0, float(np.abs(want).max()))
        return err, err <= TOL.get(str(want.dtype), 1e-4) * scale
    err = float(np.abs(got.astype(np.int64) - want.astype(np.int64)).max()) if want.size else 0.
    return err, err <= (1 if want.dtype == np.int8 else 0)


def top1(got: np.ndarray, want: np.ndarray) -> tuple[int, int, float]:
    """Greedy tokens of logits ``[rows..., V]``: ``(rows whose argmax equals the oracle's,
    rows, the largest oracle margin by which a differing row's choice is worse)``; a margin
    within the logits' tolerance (a near-tie) is 0: not a failure."""
    want = np.asarray(want, np.float64).reshape(-1, want.shape[-1])
    got = np.asarray(got).astype(np.float64).reshape(want.shape)
    g, w = got.argmax(-1), want.argmax(-1)
    r = np.arange(len(w))
    margin = want[r, w] - want[r, g]
    tol = TOL["float32"] * max(1.0, float(np.abs(want).max()))
    worst = float(margin.max())
    return int((g == w).sum()), len(w), worst if worst > tol else 0.0


def random_weights(plan: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """Stand-in weights of the right sizes (speed runs only): small normal floats, random
    bytes for packed weights (whose decoded values are then arbitrary)."""
    rng = np.random.default_rng(seed)
    out = {}
    for p in plan["params"]:
        dt = np.dtype(p["dtype"])
        if dt.kind == "f":
            out[p["name"]] = (rng.standard_normal(p["shape"]) * 0.02).astype(dt)
        elif dt == np.uint16:
            out[p["name"]] = (rng.standard_normal(p["shape"]) * 0.02).astype(np.float16) \
                .view(np.uint16)
        else:
            out[p["name"]] = rng.integers(0, 256, p["shape"], dtype=np.uint8).astype(dt)
    return out


def run_check(folder: str, bench: int = 0) -> dict:
    art = CudaArtifact.load(folder)
    fpath = os.path.join(folder, "fixtures.npz")
    speed_only = not os.path.exists(fpath)
    fx = {} if speed_only else dict(np.load(fpath))
    wpath = os.path.join(folder, "weights.npz")
    if os.path.exists(wpath):
        weights = dict(np.load(wpath))
    elif speed_only:
        weights = random_weights(art.plan)
    else:
        raise FileNotFoundError(f"{wpath}: the bundle has fixtures but no weights")
    if speed_only:                 # shapes only: synthetic inputs, no correctness claim
        for x in art.plan["inputs"]:
            if not any(o.get("aliases") == x["name"] for o in art.plan["outputs"]):
                fx[f"s0.in.{x['name']}"] = np.zeros(x["shape"], np.dtype(x["dtype"]))
    dev = CudaDevice()
    t0 = time.perf_counter()
    runner = StepRunner(dev, art, weights)
    report = {"device": dev.device_name, "summary": art.summary(), "meta": art.meta,
              "load_s": round(time.perf_counter() - t0, 3), "failures": [], "missing": []}
    plan = art.plan
    # ---- whole steps through the CUDA graph ----------------------------------------------
    carried = [o for o in plan["outputs"] if o.get("aliases")]
    plain = [o["name"] for o in plan["outputs"] if not o.get("aliases")]
    k = 0
    steps = []
    if speed_only:
        report["speed_only"] = True
        runner.step({n[6:]: v for n, v in fx.items() if n.startswith("s0.in.")}, read=plain)
        k = 1
    while not speed_only and (f"s{k}.out.{plain[0]}" in fx if plain else False):
        ins = {n[len(f"s{k}.in."):]: v for n, v in fx.items() if n.startswith(f"s{k}.in.")}
        outs = runner.step(ins, read=plain)
        for n in plain:
            err, ok = compare(outs[n], fx[f"s{k}.out.{n}"])
            steps.append({"step": k, "output": n, "max_abs_diff": err, "ok": ok})
            if not ok:
                report["failures"].append(f"step {k} output {n}: max abs diff {err:.3g}")
            if n == "logits":
                same, rows, off = top1(outs[n], fx[f"s{k}.out.{n}"])
                t = report.setdefault("greedy_tokens", {"equal": 0, "rows": 0})
                t["equal"], t["rows"] = t["equal"] + same, t["rows"] + rows
                if off:
                    report["failures"].append(f"step {k}: greedy token differs from the "
                                              f"oracle's by a margin of {off:.3g}")
        k += 1
    if k == 0:
        report["missing"].append("step fixtures (s0.out.*)")
    for o in ([] if speed_only else carried):
        key = f"final.{o['name']}"
        if key not in fx:
            report["missing"].append(key)
            continue
        err, ok = compare(dev.download(runner.buffer("output", o["name"])), fx[key])
        steps.append({"step": k - 1, "output": o["name"], "max_abs_diff": err, "ok": ok})
        if not ok:
            report["failures"].append(f"carried {o['name']} after {k} steps: {err:.3g}")
    report["steps"] = steps
    report["graph_capture_s"] = round(runner.graph_s, 4)
    report["graph_nodes"] = runner.recording.nodes if runner.recording else 0
    # ---- speed: replay the captured step ---------------------------------------------------
    if bench and k:
        ins = {n[len("s0.in."):]: v for n, v in fx.items() if n.startswith("s0.in.")}
        read = [plain[0]] if plain else []
        runner.step(ins, read=read)
        t0 = time.perf_counter()
        for _ in range(bench):
            runner.step(ins, read=read)
        dt = time.perf_counter() - t0
        dev.synchronize()
        t1 = time.perf_counter()
        for _ in range(bench):
            dev.replay(runner.recording)
        dev.synchronize()
        dt_graph = time.perf_counter() - t1
        report["bench"] = {"steps": bench, "step_ms": 1e3 * dt / bench,
                           "tok_per_s": bench / dt, "graph_only_ms": 1e3 * dt_graph / bench,
                           "launches_per_step": runner.recording.nodes,
                           "gpu_ms_by_kind_eager": profile_dispatches(runner)}
    # ---- every dispatch on its own ---------------------------------------------------------
    specs = {b["id"]: b for b in plan["buffers"]}
    worst = {}
    for i, d in enumerate([] if speed_only else plan["dispatches"]):
        if f"d{i}.o0" not in fx:
            report["missing"].append(f"d{i} ({d['callee']})")
            continue
        args = {}
        for j, bid in enumerate(d["args"]):
            if specs[bid]["role"] == "param":
                continue
            if f"d{i}.a{j}" not in fx:
                report["missing"].append(f"d{i}.a{j}")
                continue
            args[bid] = fx[f"d{i}.a{j}"]
        outs = runner.run_dispatch(i, args)
        for j, got in enumerate(outs):
            want = fx.get(f"d{i}.o{j}")
            if want is None:
                report["missing"].append(f"d{i}.o{j}")
                continue
            err, ok = compare(got.view(want.dtype) if got.dtype != want.dtype and
                              got.dtype.itemsize == want.dtype.itemsize else got, want)
            kind = d["kind"]
            worst[kind] = max(worst.get(kind, 0.0), err)
            if not ok:
                report["failures"].append(f"dispatch {i} {d['callee']} ({kind}) result {j}: "
                                          f"max abs diff {err:.3g}")
    report["dispatches_checked"] = len(plan["dispatches"])
    report["max_abs_diff_by_kind"] = worst
    report["ok"] = not report["failures"] and not report["missing"] and not speed_only
    return report


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bundles", nargs="+")
    ap.add_argument("--bench", type=int, default=0)
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    reports = {}
    ok = True
    for b in a.bundles:
        try:
            r = run_check(b, a.bench)
        except Exception as e:  # noqa: BLE001
            import traceback

            r = {"ok": False, "error": f"{type(e).__name__}: {e}",
                 "trace": traceback.format_exc()[-3000:]}
        reports[b] = r
        ok &= bool(r.get("ok"))
        print(json.dumps({b: {k: v for k, v in r.items() if k != "steps"}}, indent=1,
                         default=str))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(reports, f, indent=1, default=str)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
