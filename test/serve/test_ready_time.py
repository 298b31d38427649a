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


def test_a_log_probs_request_right_after_ready_waits_for_its_sampler(tiny_path, tmp_path):
    """Ready comes with the full sampler; the one with log-probs and the guided mask is left
    to the compile workers. A request that needs it at once is served (it waits for the
    sampler), with its log-probs, and the server then stops cleanly (workers reaped)."""
    import json
    import urllib.request

    p = ServeProcess("--model", str(tiny_path), "--port", "0", "--max-batch", "2",
                     env={"POOT_CACHE_DIR": str(tmp_path), "POOT_COMPILE_WORKERS": "1"})
    try:
        port = int(p.wait_for(r"listening on http://127\.0\.0\.1:(\d+)", 120).group(1))
        p.wait_for(r"ready: serving .*", 600)
        body = json.dumps({"model": "chat", "max_tokens": 4, "temperature": 0,
                           "logprobs": True, "top_logprobs": 3,
                           "messages": [{"role": "user", "content": "hi"}]}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", body,
                                     {"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            out = json.loads(r.read())
        content = out["choices"][0]["logprobs"]["content"]
        assert len(content) == out["usage"]["completion_tokens"] > 0, out
        assert all(len(t["top_logprobs"]) == 3 for t in content), out
        assert p.terminate(120) == 0, p.log
    finally:
        p.kill()
    assert "Traceback" not in p.log, p.log
