"""``poot serve``'s ready line reports the time from the process's start to serving: the
imports, the load and every warm-up compile (those finished after ``ModelHandle.load``
returned included), not the load alone."""

from __future__ import annotations

import re
import subprocess
import sys

from proc_util import ServeProcess


def test_process_age_counts_from_the_process_start():
    code = ("import time; time.sleep(1.0)\n"
            "from poot.cli.serve_cmd import process_age_s; print(process_age_s())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert float(out) >= 1.0


def test_the_ready_line_covers_every_compile_of_the_process(tiny_path, tmp_path):
    # a fresh cache and no compile workers: this process compiles every step, and each
    # step's compile ends with a "poot: <step> step: N stages in S s" line
    p = ServeProcess("--model", str(tiny_path), "--port", "0", "--max-batch", "1",
                     env={"POOT_CACHE_DIR": str(tmp_path), "POOT_COMPILE_WORKERS": "0"})
    try:
        line = p.wait_for(r"ready: serving .*", 600).group(0)
    finally:
        p.kill()
    m = re.search(r"; ready (\d+\.\d) s after start\)", line)
    assert m, line
    compiled = [float(s) for s in re.findall(r"step: \d+ stages in (\d+\.\d+) s", p.log)]
    assert len(compiled) >= 4, p.log       # prefill, decode, the three samplers
    assert float(m.group(1)) >= sum(compiled) - 0.05 * len(compiled), p.log
