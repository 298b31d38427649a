"""Cold start of ``poot serve``: seconds from launching the process to the first 200 of
``GET /health``, on an empty compile cache.

    python bench/serve_cold_start.py                    # SmolLM2, CPU, 3 runs
    python bench/serve_cold_start.py --runs 5 --out bench/serve_cold_start_results.json
    python bench/serve_cold_start.py --model M --backend cpu -- --max-batch 4

Each run starts ``python -m poot.cli serve --port 0`` with a fresh ``POOT_CACHE_DIR`` (a new
temporary folder: every step is compiled), polls ``/health`` every 50 ms from the moment the
"listening on" line gives the port, and stops the server (SIGTERM) once it answers 200.
Per run it reports:

* ``ready_s``: launch to the first 200, measured here (what a client or a load balancer
  waits);
* ``reported_ready_s``: what the server's ready line says (``ready X s after start``), which
  should be ``ready_s`` less the interpreter's start before the process existed;
* ``listening_s``: launch to the "listening on" line;
* ``steps``: each step the serving process compiled (``poot: <step> step: N stages in S s``),
  and ``cached``: those it found in the compile cache (compiled by a compile worker,
  :mod:`poot.api.compile_ahead`, meanwhile);
* ``process_cpu_s``: the CPU seconds of the server and its children (compile workers, LLVM's
  opt/llc), from ``wait4``: on a shared machine the least noisy measure of the work done.

Prints one JSON object (the runs, their best and median ``ready_s``, the machine's CPU count
and load averages before and after); ``--out`` also writes it. Timings on a shared machine are
noisy: repeat, and read ``load_avg`` with them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LISTENING = re.compile(r"listening on (http://\S+?);")
READY = re.compile(r"ready: serving .*; ready (\d+(?:\.\d+)?) s after start\)")
STEP = re.compile(r"poot: (\S+) step: \d+ stages in (\d+(?:\.\d+)?) s")
CACHED = re.compile(r"poot: (\S+) step: loaded from the compile cache")


def _health(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except (OSError, urllib.error.URLError):
        return None


def one_run(serve_args: list[str], timeout_s: float) -> dict:
    """One cold start on a fresh compile cache; see the module docstring."""
    cache = tempfile.mkdtemp(prefix="poot-serve-cold-")
    env = dict(os.environ, POOT_CACHE_DIR=cache,
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    lines: list[str] = []
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "poot.cli", "serve", "--port", "0",
                             *serve_args], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=env)
    listening: list[tuple[float, str]] = []

    def read():
        for line in proc.stderr:
            lines.append(line.rstrip("\n"))
            m = LISTENING.search(line)
            if m and not listening:
                listening.append((time.perf_counter() - t0, m.group(1)))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    ready_s = None
    try:
        while time.perf_counter() - t0 < timeout_s and proc.poll() is None:
            if listening and _health(listening[0][1]) == 200:
                ready_s = time.perf_counter() - t0
                break
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            _, _, usage = os.wait4(proc.pid, 0)
            cpu_s = usage.ru_utime + usage.ru_stime
        except ChildProcessError:
            cpu_s = None
        reader.join(10)
        shutil.rmtree(cache, ignore_errors=True)
    log = "\n".join(lines)
    if ready_s is None:
        raise SystemExit(f"poot serve was not ready within {timeout_s} s "
                         f"(exit {proc.returncode}):\n{log[-3000:]}")
    reported = READY.search(log)
    return {"ready_s": round(ready_s, 2),
            "reported_ready_s": float(reported.group(1)) if reported else None,
            "listening_s": round(listening[0][0], 2) if listening else None,
            "process_cpu_s": round(cpu_s, 1) if cpu_s is not None else None,
            "steps": {m.group(1): float(m.group(2)) for m in STEP.finditer(log)},
            "cached": [m.group(1) for m in CACHED.finditer(log)]}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--model", default=None, help="default: the bundled SmolLM2")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--timeout", type=float, default=900.0, help="per run, seconds")
    ap.add_argument("--out", default=None, help="also write the JSON here")
    ap.add_argument("serve_args", nargs="*", help="more poot serve options (after --)")
    args = ap.parse_args(argv)
    serve_args = ["--backend", args.backend, *(["--model", args.model] if args.model else []),
                  *args.serve_args]
    out: dict = {"command": ["poot", "serve", "--port", "0", *serve_args],
                 "cpus": os.cpu_count(),
                 "compile_workers": os.environ.get("POOT_COMPILE_WORKERS", "default"),
                 "load_avg_start": [round(x, 2) for x in os.getloadavg()], "runs": []}
    for _ in range(args.runs):
        out["runs"].append(one_run(serve_args, args.timeout))
        print(json.dumps(out["runs"][-1]), file=sys.stderr)
    ready = [r["ready_s"] for r in out["runs"]]
    out.update(best_ready_s=min(ready), median_ready_s=round(statistics.median(ready), 2),
               load_avg_end=[round(x, 2) for x in os.getloadavg()])
    text = json.dumps(out, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
