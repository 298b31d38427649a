"""Clients that stall are dropped (module :mod:`poot.serve.limits`): raw sockets to a live
server that send part of their headers, or headers and part of a body, and then nothing, get
408 and are closed; a connection that sends nothing is closed; with every ``max_concurrent``
slot taken by stalled bodies, a normal request is served once they are dropped. The deadlines
are small here (1 s); the tests wait on outcomes (a closed socket, a 200), not on time."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from poot.serve import ServeConfig
from server_util import running

CONFIG = ServeConfig(served_model_name="tiny", max_concurrent=2, header_timeout_s=1.0,
                     body_timeout_s=1.0, idle_timeout_s=1.0)
BODY = json.dumps({"model": "tiny", "prompt": "hi", "max_tokens": 1}).encode()


@pytest.fixture(scope="module")
def srv():
    """A server with no model (its routes that need none still answer) and small
    deadlines."""
    with running(None, CONFIG) as s:
        yield s


def _connect(srv) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=60)
    return s


def _read_all(s: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (fails after 60 s)."""
    out = b""
    while True:
        try:
            b = s.recv(65536)
        except ConnectionResetError:
            return out
        if not b:
            return out
        out += b


def _wait(cond, what: str) -> None:
    end = time.monotonic() + 60
    while not cond():
        if time.monotonic() > end:
            pytest.fail(f"gave up waiting for {what}")
        time.sleep(0.02)


def _status_and_json(raw: bytes) -> tuple[int, dict]:
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(body)


def test_partial_headers_get_408_and_are_closed(srv):
    with _connect(srv) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Ty")
        raw = _read_all(s)
    status, body = _status_and_json(raw)
    assert status == 408 and body["error"]["code"] == "request_timeout"
    assert "headers" in body["error"]["message"]


def test_silent_connection_is_closed(srv):
    with _connect(srv) as s:
        raw = _read_all(s)
    assert raw == b"" or raw.startswith(b"HTTP/1.1 408")


def test_partial_body_gets_408_and_is_closed(srv):
    with _connect(srv) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                  b"\r\nContent-Length: %d\r\n\r\n" % len(BODY) + BODY[:10])
        raw = _read_all(s)
    status, body = _status_and_json(raw)
    assert status == 408 and body["error"]["code"] == "request_timeout"
    assert "body" in body["error"]["message"]
    _wait(lambda: srv.state.active == 0, "the slot to be released")


def test_stalled_bodies_release_their_slots(srv):
    """Both slots are taken by bodies that never finish; a normal request is served once
    they are dropped (before the deadlines it was refused with 503 for as long as they
    stalled, that is forever)."""
    stalled = []
    for _ in range(CONFIG.max_concurrent):
        s = _connect(srv)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                  b"application/json\r\nContent-Length: %d\r\n\r\n" % len(BODY) + BODY[:5])
        stalled.append(s)
    try:
        for s in stalled:                          # dropped: 408, then the socket closes
            status, _ = _status_and_json(_read_all(s))
            assert status == 408
    finally:
        for s in stalled:
            s.close()
    end = time.monotonic() + 60
    r = httpx.get(srv.url + "/v1/models")
    while r.status_code == 503 and time.monotonic() < end:
        time.sleep(0.05)
        r = httpx.get(srv.url + "/v1/models")
    assert r.status_code == 200, r.text


def test_a_client_that_stops_reading_is_dropped(srv):
    """A client that asks for a response and never reads it (its receive buffer, then the
    server's send buffer, fill up): the connection is aborted after the idle deadline and
    the request's slot is released."""
    with _connect(srv) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        # pipelined requests for /openapi.json (tens of kB each): responses pile up unread
        req = b"GET /openapi.json HTTP/1.1\r\nHost: x\r\n\r\n"
        s.sendall(req * 64)
        s.setblocking(False)
        end = time.monotonic() + 60
        while time.monotonic() < end:              # the server gives up on this client
            try:
                s.send(req)
            except BlockingIOError:
                pass
            except OSError:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the server kept the stalled client's connection open")
    _wait(lambda: srv.state.active == 0, "the slot to be released")
