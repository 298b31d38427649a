"""Connection deadlines: a client that stalls is dropped, never left holding a slot.

uvicorn bounds only the idle time between requests of a kept-alive connection
(``timeout_keep_alive``); a client that opens a connection and sends nothing, or half its
headers, or headers and part of a body, is otherwise waited for forever (and a request whose
body never ends holds one of ``--max-concurrent`` slots). Three deadlines close that:

- **headers** (``header_timeout_s``): the request line and headers must arrive within this
  many seconds of the connection opening (or, on a kept-alive connection, of the first byte
  of the next request); past it the connection gets ``408`` and is closed. Enforced by the
  HTTP protocol (:func:`protocol_class`), since no application code runs before the headers.
- **body** (``body_timeout_s``): the whole body must arrive within this many seconds of the
  headers; past it the request gets an OpenAI-shaped ``408`` (``Connection: close``) and
  its slot is released. Enforced where the application reads the body
  (:class:`BodyDeadline`).
- **idle** (``idle_timeout_s``): a kept-alive connection with no request (uvicorn's
  ``timeout_keep_alive``), or a client that stops reading its response (the socket's send
  buffer stays full), is closed after this many seconds; a running request then sees the
  client as gone (its sequences are aborted, its slot released).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from starlette.exceptions import HTTPException

from poot.serve import errors


class RequestTooSlow(HTTPException):
    """The body did not arrive in time: an HTTP exception (so that FastAPI's body parsing
    lets it through) carrying the OpenAI-shaped :attr:`api_error` (408)."""

    def __init__(self, api_error: errors.APIError):
        super().__init__(api_error.status, api_error.message, api_error.headers)
        self.api_error = api_error


def timeout_error(what: str, limit: float) -> errors.APIError:
    """The 408 a client that was too slow gets (``Connection: close``)."""
    return errors.APIError(408, f"the request {what} did not arrive within this server's "
                           f"limit of {limit:g} s", errors.INVALID_REQUEST, None,
                           "request_timeout", {"Connection": "close"})


def _raw_408(limit: float) -> bytes:
    body = json.dumps(timeout_error("headers", limit).body()).encode()
    return (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n"
            + body)


def protocol_class(base: type, header_timeout_s: float, idle_timeout_s: float) -> type:
    """A subclass of uvicorn's HTTP protocol ``base`` (``HttpToolsProtocol`` or
    ``H11Protocol``) that answers ``408`` and closes a connection whose request headers are
    not complete ``header_timeout_s`` seconds after it opened (or after the first byte of
    a later request), and aborts one whose client has not read its response for
    ``idle_timeout_s`` seconds (writing paused by a full send buffer). Uses only the
    protocol's asyncio callbacks and its ``cycle`` / ``transport`` attributes, which both
    of uvicorn's implementations have."""

    class DeadlineProtocol(base):
        _header_timer: asyncio.TimerHandle | None = None
        _stall_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm_header_timer()

        def _between_requests(self) -> bool:
            cycle = getattr(self, "cycle", None)
            return cycle is None or cycle.response_complete

        def _arm_header_timer(self) -> None:
            if self._header_timer is None:
                loop = asyncio.get_running_loop()
                self._header_timer = loop.call_later(header_timeout_s, self._headers_late)

        def _disarm(self, name: str) -> None:
            timer = getattr(self, name)
            if timer is not None:
                timer.cancel()
                setattr(self, name, None)

        def data_received(self, data: bytes) -> None:
            between, cycle = self._between_requests(), getattr(self, "cycle", None)
            super().data_received(data)
            if getattr(self, "cycle", None) is not cycle:
                self._disarm("_header_timer")          # a request's headers are complete
            elif between and data and not self.transport.is_closing():
                self._arm_header_timer()               # part of the next request's headers

        def _headers_late(self) -> None:
            self._header_timer = None
            if self.transport.is_closing():
                return
            if self._between_requests():
                self.transport.write(_raw_408(header_timeout_s))
            self.transport.close()

        def pause_writing(self) -> None:
            super().pause_writing()
            if self._stall_timer is None:
                self._stall_timer = asyncio.get_running_loop().call_later(
                    idle_timeout_s, self._client_stalled)

        def resume_writing(self) -> None:
            self._disarm("_stall_timer")
            super().resume_writing()

        def _client_stalled(self) -> None:
            self._stall_timer = None
            self.transport.abort()        # connection_lost: the request sees a disconnect

        def connection_lost(self, exc) -> None:
            self._disarm("_header_timer")
            self._disarm("_stall_timer")
            super().connection_lost(exc)

    DeadlineProtocol.__name__ = DeadlineProtocol.__qualname__ = f"Deadline{base.__name__}"
    return DeadlineProtocol


class BodyDeadline:
    """Wraps an ASGI ``receive``: until the request's body has arrived whole, each wait for
    more of it is bounded by what is left of ``limit_s`` (counted from construction, i.e.
    from the headers); past it raises :class:`RequestTooSlow` (a 408). Once the
    body is complete, ``receive`` (waiting for a disconnect) is passed through unbounded."""

    def __init__(self, receive, limit_s: float):
        self.receive, self.limit_s = receive, limit_s
        self.deadline = time.monotonic() + limit_s
        self.complete = False

    async def __call__(self) -> dict[str, Any]:
        if self.complete:
            return await self.receive()
        left = self.deadline - time.monotonic()
        try:
            if left <= 0:
                raise TimeoutError
            msg = await asyncio.wait_for(self.receive(), left)
        except TimeoutError:
            raise RequestTooSlow(timeout_error("body", self.limit_s)) from None
        if msg["type"] != "http.request" or not msg.get("more_body", False):
            self.complete = True
        return msg


__all__ = ["BodyDeadline", "RequestTooSlow", "protocol_class", "timeout_error"]
