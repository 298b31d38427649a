"""Where a running server's host time goes, by Python thread (no GPU needed; the GPU
scripts run it beside ``poot serve``):

    python bench/gpu_run/thread_profile.py cpu PID SECONDS        # CPU seconds a thread
    python bench/gpu_run/thread_profile.py summarize RAW [--top N]  # a py-spy raw profile

``cpu``: each thread's user + system CPU time over the window (``/proc/PID/task/*/stat``),
threads named by their Python names (from ``py-spy dump``; unnamed native threads, such as
OpenMP's or the CUDA driver's, are summed as ``native``), as one JSON object of seconds.

``summarize``: a ``py-spy record --format raw --threads`` file (one line a distinct stack,
``thread;frame;...;frame COUNT``) as JSON: each thread's samples, and for the threads with
the most samples the frames holding the most samples, inclusive and self. py-spy samples
every thread whether or not it holds the GIL (``--gil`` keeps only the holder).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import time


def thread_names(pid: int) -> dict[str, str]:
    """Native thread id -> Python thread name, from ``py-spy dump`` (empty without py-spy)."""
    try:
        out = subprocess.run(["py-spy", "dump", "-p", str(pid)], capture_output=True,
                             text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return {m.group(1): m.group(2) for m in re.finditer(r'^Thread (\d+) \([^)]*\): "([^"]*)"',
                                                         out, re.M)}


def cpu_times(pid: int) -> dict[str, float]:
    """Native thread id -> CPU seconds (user + system) so far."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except FileNotFoundError:           # the thread ended
            continue
        out[tid] = (int(fields[11]) + int(fields[12])) / tick
    return out


def cpu(pid: int, seconds: float) -> dict:
    names = thread_names(pid)
    before = cpu_times(pid)
    time.sleep(seconds)
    after = cpu_times(pid)
    names.update(thread_names(pid))          # threads started during the window
    by_name: dict[str, float] = collections.defaultdict(float)
    for tid, t in after.items():
        by_name[names.get(tid, "native")] += t - before.get(tid, 0.0)
    return {"seconds": seconds,
            "cpu_s": {k: round(v, 3) for k, v in sorted(by_name.items(), key=lambda x: -x[1])}}


def summarize(raw: str, top: int) -> dict:
    threads: dict[str, int] = collections.Counter()
    incl: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    self_: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    with open(raw) as f:
        for line in f:
            line = line.rstrip("\n")
            if not line:
                continue
            stack, count = line.rsplit(" ", 1)
            frames = stack.split(";")
            name = re.sub(r"^thread \(\d+\): ", "", frames[0])
            n = int(count)
            threads[name] += n
            for fr in set(frames[1:]):
                incl[name][fr] += n
            self_[name][frames[-1]] += n
    busiest = [t for t, _ in threads.most_common(3)]
    return {"samples": dict(threads.most_common()),
            "threads": {t: {"inclusive": incl[t].most_common(top),
                            "self": self_[t].most_common(top)} for t in busiest}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("cpu")
    c.add_argument("pid", type=int)
    c.add_argument("seconds", type=float)
    s = sub.add_parser("summarize")
    s.add_argument("raw")
    s.add_argument("--top", type=int, default=40)
    a = ap.parse_args()
    out = cpu(a.pid, a.seconds) if a.cmd == "cpu" else summarize(a.raw, a.top)
    json.dump(out, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
