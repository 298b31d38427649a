"""Stopping past the drain deadline: requests still running are answered in OpenAI's shape
(a 503 ``shutting_down`` JSON error; a stream's error event, then ``data: [DONE]``) and the
log holds no traceback. The engine is paused by the gate, so both requests are certainly
running when the server is told to stop (the same path as SIGTERM: uvicorn's shutdown);
``test_sigterm.py`` checks the whole process with a real signal."""

from __future__ import annotations

import logging
import threading
import time

import httpx
import pytest

from poot.serve import ServeConfig
from server_util import ServerThread
from sse import parse_sse

BODY = {"model": "tiny", "temperature": 0, "max_tokens": 50, "ignore_eos": True,
        "messages": [{"role": "user", "content": "tell me a long story"}]}


def _in_background(fn):
    out = {}

    def run():
        try:
            out["r"] = fn()
        except Exception as e:  # noqa: BLE001  (the test reports it)
            out["e"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def _wait(cond, what: str) -> None:
    end = time.monotonic() + 60
    while not cond():
        if time.monotonic() > end:
            pytest.fail(f"gave up waiting for {what}")
        time.sleep(0.01)


def test_drain_deadline_aborts_in_openai_shape(tiny, gate, caplog):
    caplog.set_level(logging.INFO)
    srv = ServerThread(tiny, ServeConfig(served_model_name="tiny", drain_timeout_s=1),
                       drain_timeout_s=1).start()
    url = srv.url + "/v1/chat/completions"
    try:
        gate.close_after_token = True           # both requests stay running at the deadline
        whole = _in_background(lambda: httpx.post(url, json=BODY, timeout=60))
        stream = _in_background(lambda: httpx.post(url, json={**BODY, "stream": True},
                                                   timeout=60))
        _wait(lambda: srv.state.aengine.inflight == 2, "both requests to run")
        srv.server.should_exit = True           # what SIGTERM does
        for t, _ in (whole, stream):
            t.join(60)
    finally:
        gate.open()
        srv.stop()
    r = whole[1].get("r")
    assert r is not None, whole[1]
    assert r.status_code == 503, r.text
    err = r.json()["error"]
    assert err["code"] == "shutting_down" and err["type"] == "service_unavailable"
    s = stream[1].get("r")
    assert s is not None and s.status_code == 200, stream[1]
    events = parse_sse(s.text)                  # strict framing, ends with data: [DONE]
    assert events[-1]["error"]["code"] == "shutting_down"
    assert "choices" not in events[-1]
    assert "Traceback" not in caplog.text and "CancelledError" not in caplog.text
    assert not [rec for rec in caplog.records if rec.levelno >= logging.ERROR]
    assert "finish=shutdown" in caplog.text
