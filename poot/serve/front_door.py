"""The server's front door (:class:`FrontDoor`, pure ASGI): the concurrency limit, the body's
size and deadline, the request counter and the one log line per request."""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from starlette.exceptions import HTTPException as StarletteHTTPException

from poot.serve import errors
from poot.serve.errors import APIError, unavailable
from poot.serve.limits import BodyDeadline
from poot.serve.state import ServerState

log = logging.getLogger("poot.serve")

#: routes whose metrics keep their path as the label (others count as "other")
_ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics",
           "/tokenize", "/detokenize", "/v1/embeddings", "/v1/rerank", "/rerank",
           "/v1/load_lora_adapter", "/v1/unload_lora_adapter")
#: routes that neither count toward nor are refused by the concurrency limit
_UNLIMITED = ("/health", "/metrics")


class FrontDoor:
    """ASGI middleware: the concurrency limit (503 + ``Retry-After``), the body-size limit
    (413, from ``Content-Length`` or while the body streams in), the body's deadline (408,
    :class:`~poot.serve.limits.BodyDeadline`), the request counter and the one log line
    per request."""

    def __init__(self, app, state: ServerState):
        self.app, self.state = app, state

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        state, cfg = self.state, self.state.config
        path = scope.get("path", "")
        info: dict[str, Any] = {"t0": time.monotonic(), "id": f"req-{uuid.uuid4().hex[:12]}"}
        scope["poot.log"] = info
        status = [0]

        async def send_(msg):
            if msg["type"] == "http.response.start":
                status[0] = msg["status"]
                msg = {**msg, "headers": [*msg.get("headers", ()),
                                          (b"x-poot-replica", state.replica_id.encode())]}
            await send(msg)

        limited = path not in _UNLIMITED
        try:
            if limited and state.active >= cfg.max_concurrent:
                await unavailable(f"too many requests in progress ({state.active}); retry "
                                  f"shortly", cfg.retry_after_s, "server_busy"
                                  ).response()(scope, receive, send_)
                return
            length = _content_length(scope)
            if length is not None and length > cfg.max_body_bytes:
                await _too_large(length, cfg.max_body_bytes).response()(scope, receive, send_)
                return
            seen = [0]
            body_receive = BodyDeadline(receive, cfg.body_timeout_s)

            async def receive_():
                msg = await body_receive()
                if msg["type"] == "http.request":
                    seen[0] += len(msg.get("body", b""))
                    if seen[0] > cfg.max_body_bytes:
                        raise StarletteHTTPException(413, _too_large(seen[0],
                                                                     cfg.max_body_bytes).message)
                return msg

            if limited:
                state.active += 1
            try:
                await self.app(scope, receive_, send_)
            finally:
                if limited:
                    state.active -= 1
        finally:
            route = path if path in _ROUTES else ("/v1/models" if path.startswith(
                "/v1/models/") else "other")
            state.metrics.requests.labels(route, str(status[0] or 499)).inc()
            _log_request(scope, status[0], info)


def _content_length(scope) -> int | None:
    for k, v in scope.get("headers", ()):
        if k == b"content-length":
            try:
                return int(v)
            except ValueError:
                return None
    return None


def _too_large(n: int, limit: int) -> APIError:
    return APIError(413, f"the request body is {n} bytes or more, more than this server's "
                    f"limit of {limit} bytes", errors.INVALID_REQUEST, None,
                    "request_too_large")


def _log_request(scope, status: int, info: dict[str, Any]) -> None:
    path = scope.get("path", "")
    level = logging.DEBUG if path in _UNLIMITED else logging.INFO
    if not log.isEnabledFor(level):
        return
    total = time.monotonic() - info["t0"]
    parts = [info["id"], scope.get("method", ""), path,
             str(status) if status else "disconnected"]
    if "prompt" in info:
        parts.append(f"prompt={info['prompt']} generated={info.get('generated', 0)} "
                     f"cached={info.get('cached', 0)}")
    if info.get("ttft") is not None:
        parts.append(f"ttft={info['ttft']:.3f}s")
    parts.append(f"time={total:.3f}s")
    if info.get("finish"):
        parts.append(f"finish={info['finish']}")
    if info.get("error"):
        parts.append(f"error={info['error']}")
    log.log(level, " ".join(parts))


__all__ = ["FrontDoor"]
