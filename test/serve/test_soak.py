"""A few seconds of ``bench/soak.py``: ``poot serve`` on the tiny chat fixture under
streaming clients with disconnects, slow readers, aborts and bad requests; every check of
its report must hold (well-formed streams, 4xx for bad requests, no KV block in use after,
resident memory back near its baseline, greedy replies unchanged, exit status 0)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_short_soak_passes_every_check():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "soak.py"), "--seconds", "3",
                           "--warmup", "1", "--clients", "3", "--max-requests", "400"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.stdout.strip(), proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    failed = [k for k, ok in report["checks"].items() if not ok]
    assert not failed, (failed, json.dumps(report, indent=1)[:4000], proc.stderr[-2000:])
    assert proc.returncode == 0
    # the mix ran: streams completed, bad requests refused, clients dropped streams
    out = report["outcomes"]
    assert out.get("stream_ok", 0) and out.get("bad_refused", 0) and out.get("disconnected", 0)
    assert report["kv_blocks_used_after"] == 0
