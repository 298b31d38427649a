"""Running the application on uvicorn: on a host and port, or on a socket already bound.

SIGTERM (and Ctrl-C) drains: uvicorn stops accepting connections, ``/health`` says
``draining`` and new generation requests get 503 ``shutting_down``; requests in progress may
finish until ``drain_timeout_s``; then those still running are aborted and answered in
OpenAI's shape (503 ``shutting_down``, or a stream's error event and ``data: [DONE]``), the
engine loop stops, and the process exits with status 0. Connections are bounded by the
deadlines of :mod:`poot.serve.limits`.
"""

from __future__ import annotations

import asyncio
import math
import socket
import sys
from typing import Any

from poot.settings import get_float

#: seconds uvicorn waits past the drain deadline (for the aborted requests' last words)
#: before it cancels what still runs
ABORT_GRACE_S = 5


def shorten_switch_interval() -> float:
    """Set the interpreter's thread switch interval to ``POOT_SERVE_SWITCH_INTERVAL``
    (default 0.1 ms; ``sys.setswitchinterval``) and return it.

    The engine steps on its own thread and the HTTP front end runs on the event loop's, and
    they share the GIL. The engine gives it up in every driver call and every wait for the
    device; taking it back while the event loop computes takes up to the switch interval
    (CPython's default is 5 ms), a long stall beside a GPU step of 2-4 ms. Measured on an
    H100 with the Llama-3.2-1B shape under 64 streaming clients (``serve_under_load.sh``):
    6,910 output tok/s at 5 ms, 7,873 at 0.5 ms, 9,216 at 0.1 ms.

    Raises :class:`~poot.settings.InvalidSetting` for a value that is not a positive number.
    """
    interval = get_float("POOT_SERVE_SWITCH_INTERVAL", positive=True)
    sys.setswitchinterval(interval)
    return interval


def make_server(app, host: str = "127.0.0.1", port: int = 8000, drain_timeout_s: float = 30.0,
                log_level: str = "warning"):
    """A ``uvicorn.Server`` for ``app`` (access log off: the app logs one line per request).
    With a ``build_app`` application (its :class:`~poot.serve.state.ServerState` as
    ``app.state.poot``), its config's connection deadlines apply and SIGTERM drains as the
    module doc says."""
    import uvicorn
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    from poot.serve.limits import protocol_class  # lazy: FastAPI, Starlette

    state = getattr(getattr(app, "state", None), "poot", None)
    kw: dict[str, Any] = {}
    if state is not None:
        cfg = state.config
        kw = dict(http=protocol_class(AutoHTTPProtocol, cfg.header_timeout_s,
                                      cfg.idle_timeout_s),
                  timeout_keep_alive=cfg.idle_timeout_s)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                            timeout_graceful_shutdown=math.ceil(drain_timeout_s)
                            + ABORT_GRACE_S, lifespan="on", log_config=None, **kw)

    class DrainingServer(uvicorn.Server):
        async def shutdown(self, sockets=None):
            if state is None:
                return await super().shutdown(sockets)
            state.drain()
            timer = asyncio.get_running_loop().call_later(drain_timeout_s, state.abort_running)
            try:
                await super().shutdown(sockets)
            finally:
                timer.cancel()

    return DrainingServer(config)


def bind(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: a free one; ``sock.getsockname()``
    says which)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def serve_forever(app, sock: socket.socket, drain_timeout_s: float = 30.0,
                  log_level: str = "warning") -> Any:
    """Serve ``app`` on ``sock`` until SIGTERM/SIGINT (this thread must be the main one for
    the signals); returns when drained. Sets :func:`shorten_switch_interval`."""
    shorten_switch_interval()
    server = make_server(app, drain_timeout_s=drain_timeout_s, log_level=log_level)
    server.run(sockets=[sock])
    return server


__all__ = ["bind", "make_server", "serve_forever", "shorten_switch_interval"]
