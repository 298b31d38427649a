"""Running the application on uvicorn: on a host and port, or on a socket already bound.

SIGTERM (and Ctrl-C) drains: uvicorn stops accepting connections, requests in progress may
finish until ``drain_timeout_s``, then the rest are cancelled (their sequences aborted), the
engine loop stops, and the process exits with status 0.
"""

from __future__ import annotations

import socket
from typing import Any


def make_server(app, host: str = "127.0.0.1", port: int = 8000, drain_timeout_s: float = 30.0,
                log_level: str = "warning"):
    """A ``uvicorn.Server`` for ``app`` (access log off: the app logs one line per request)."""
    import uvicorn

    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                            timeout_graceful_shutdown=max(1, int(round(drain_timeout_s))),
                            lifespan="on", log_config=None)
    return uvicorn.Server(config)


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
    the signals); returns when drained."""
    server = make_server(app, drain_timeout_s=drain_timeout_s, log_level=log_level)
    server.run(sockets=[sock])
    return server


__all__ = ["bind", "make_server", "serve_forever"]
