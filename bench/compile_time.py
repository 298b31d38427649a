"""Compile time, cold and warm: where a model's steps spend their seconds before the first token.

    python bench/compile_time.py          # SmolLM2 CPU cold + warm, tiny fixtures, CUDA to PTX
    python bench/compile_time.py --only smollm2-cpu --only tiny
    python bench/compile_time.py --out bench/compile_time_results.json --label after

What it measures (each in a fresh Python process with a fresh, empty compile cache, so nothing
compiled or imported before is reused):

* ``smollm2-cpu``: ``poot.api.compile_steps`` (``poot compile --max-batch 1``) of the bundled
  SmolLM2-135M Q4_1 for the CPU: the prefill step, the batch-1 decode step and its two
  samplers (greedy and the full one the CLI warms up). Then ``warm``: the same in another
  fresh process on the filled cache (every step a cache hit: the load time). Then ``ready``:
  ``ModelHandle.load`` as ``poot generate`` calls it, on a fresh cache: ``ready_s`` is the
  wait before the first token can be computed (prefill, decode, greedy sampler), ``all_s``
  until the compile workers also finished the full sampler (:mod:`poot.api.compile_ahead`).
* ``smollm2-cuda``: the compile_steps run for CUDA, to PTX (no GPU needed; no warm run).
* ``tiny``: each generating fixture of ``test/fixtures/tiny`` (random-init 2-layer
  checkpoints), CPU: the compile_steps run (``total_s``) and the ``ready_s``/``all_s`` run.

Compile workers (``POOT_COMPILE_WORKERS``, default one on 2 cores) compile steps beside the
measured process: the stage breakdown covers only what that process compiled itself (a step
a worker took shows as a wait and a cache load). ``POOT_COMPILE_WORKERS=0`` gives the serial
breakdown of every step.

Per step, the seconds of every stage the compiler reports through :mod:`poot.progress`
(tracing, each poot pass, planning, lowering to linalg, the MLIR pipeline stages,
``LLVM optimize``, ``LLVM codegen``, linking, the cache write; for CUDA the dispatch regions,
kernels and ``NVVM to PTX``), summed per stage over the steps in ``stages``. ``import_s`` is
the time to import poot's compiler before the first step; ``total_s`` the whole call of
``poot.api.compile_steps`` (opening the checkpoint included); ``process_s`` the child
process's wall time. Prints one JSON object; ``--out`` also writes it (``--label`` keys it
in that file, merging with the labels already there: ``before``/``after``).

Timings on a shared 2-core machine are noisy: ``load_avg`` is recorded with each run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "test" / "fixtures" / "tiny"


def _child(model: str | None, backend: str, cache_dir: str) -> dict:
    """Runs in the measured process: compile the steps, timing each progress stage."""
    t0 = time.perf_counter()
    from poot.api import compile_steps
    import poot.compiler  # noqa: F401  (the compiler's import is part of a cold start)
    t_import = time.perf_counter() - t0

    steps: dict[str, dict[str, float]] = {}
    cur = {"step": None, "stage": None, "t": 0.0}

    def close(now: float) -> None:
        if cur["step"] is not None and cur["stage"] is not None:
            st = steps.setdefault(cur["step"], {})
            st[cur["stage"]] = st.get(cur["stage"], 0.0) + now - cur["t"]

    def progress(stage: str, done: int = 0, total: int = 0) -> None:
        now = time.perf_counter()
        close(now)
        if total == 0:                       # a phase: "<name> step"
            cur["step"] = stage[:-5] if stage.endswith(" step") else stage
            cur["stage"] = None
        else:
            cur["stage"] = stage
        cur["t"] = now

    t1 = time.perf_counter()
    out = compile_steps(model, backend, max_batch=1, cache_dir=cache_dir, progress=progress)
    end = time.perf_counter()
    close(end)
    total = end - t1
    per_step = {name: round(s["seconds"], 3) for name, s in out["steps"].items()}
    stages: dict[str, float] = {}
    for st in steps.values():
        for k, v in st.items():
            stages[k] = stages.get(k, 0.0) + v
    return {"import_s": round(t_import, 3), "total_s": round(total, 3),
            "steps_s": per_step,
            "hits": sum(s["hit"] for s in out["steps"].values()),
            "stages": {k: round(v, 3) for k, v in sorted(stages.items(), key=lambda kv: -kv[1])},
            "per_step_stages": {n: {k: round(v, 3) for k, v in st.items()}
                                for n, st in steps.items()}}


def _child_ready(model: str | None, cache_dir: str) -> dict:
    """Runs in the measured process: what ``poot generate`` waits for before its first
    token (``ModelHandle.load`` with the CLI's warm samplers: ``ready_s``), then until the
    compile workers finished the rest (``all_s``: the full sampler too)."""
    t0 = time.perf_counter()
    from poot.api import ModelHandle
    from poot.graph.sampling import FULL
    t_import = time.perf_counter() - t0
    t1 = time.perf_counter()
    h = ModelHandle.load(model, "cpu", cache_dir=cache_dir, warm_samplers=(FULL,))
    ready = time.perf_counter() - t1
    h.finish_compiling()
    return {"import_s": round(t_import, 3), "ready_s": round(ready, 3),
            "all_s": round(time.perf_counter() - t1, 3),
            "steps_ready": sorted(h.runner.compile_s)}


def _run_child(model: str | None, backend: str, cache_dir: str, mode: str = "compile") -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               POOT_CACHE_DIR=cache_dir)
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, __file__, "--child", f"{mode}:{backend}", model or ""],
                       env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if r.returncode:
        last = (r.stderr.strip().splitlines() or ["?"])[-1]
        if "ModelError" in last or "LoadError" in last:
            return {"skipped": last}     # an encoder (no generation steps), an adapter folder
        raise SystemExit(f"compile of {model or 'SmolLM2'} ({backend}) failed:\n"
                         f"{r.stderr[-3000:]}")
    res = json.loads(r.stdout.strip().splitlines()[-1])
    res["process_s"] = round(wall, 3)
    res["load_avg"] = [round(x, 2) for x in os.getloadavg()]
    return res


def measure(only: set[str]) -> dict:
    """The measurements named in ``only`` (all when empty); see the module docstring."""
    out: dict = {"machine": {"cpus": os.cpu_count(), "load_avg_start":
                             [round(x, 2) for x in os.getloadavg()]}}
    want = (lambda k: not only or k in only)
    if want("smollm2-cpu"):
        with tempfile.TemporaryDirectory(prefix="poot-compile-bench-") as d:
            out["smollm2_cpu_cold"] = _run_child(None, "cpu", d)
            out["smollm2_cpu_warm"] = _run_child(None, "cpu", d)
        with tempfile.TemporaryDirectory(prefix="poot-compile-bench-") as d:
            out["smollm2_cpu_ready"] = _run_child(None, "cpu", d, mode="ready")
    if want("smollm2-cuda"):
        with tempfile.TemporaryDirectory(prefix="poot-compile-bench-") as d:
            out["smollm2_cuda_cold"] = _run_child(None, "cuda", d)
    if want("tiny"):
        out["tiny_cpu_cold"] = {}
        for fx in sorted(p for p in TINY.iterdir() if p.is_dir()):
            path = fx / "model.gguf" if (fx / "model.gguf").exists() else fx
            with tempfile.TemporaryDirectory(prefix="poot-compile-bench-") as d:
                r = _run_child(str(path), "cpu", d)
            if "skipped" not in r:
                r = {k: r[k] for k in ("total_s", "import_s", "process_s", "stages")}
                with tempfile.TemporaryDirectory(prefix="poot-compile-bench-") as d:
                    ready = _run_child(str(path), "cpu", d, mode="ready")
                r.update(ready_s=ready["ready_s"], all_s=ready["all_s"],
                         ready_process_s=ready["process_s"])
            out["tiny_cpu_cold"][fx.name] = r
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", action="append", default=[],
                    choices=("smollm2-cpu", "smollm2-cuda", "tiny"))
    ap.add_argument("--out", default=None, help="also write the JSON here (merged by --label)")
    ap.add_argument("--label", default="run")
    ap.add_argument("--child", nargs=2, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        (mode, backend), model = args.child[0].split(":"), args.child[1]
        cache = os.environ["POOT_CACHE_DIR"]
        print(json.dumps(_child_ready(model or None, cache) if mode == "ready" else
                         _child(model or None, backend, cache)))
        return
    res = measure(set(args.only))
    print(json.dumps(res, indent=1))
    if args.out:
        p = Path(args.out)
        all_ = json.loads(p.read_text()) if p.exists() else {}
        all_.setdefault(args.label, {}).update(res)
        p.write_text(json.dumps(all_, indent=1) + "\n")


if __name__ == "__main__":
    main()
