"""A real ``poot serve`` application on 127.0.0.1 (a free port) in a background thread of the
test process, for the tests to talk to over HTTP (the openai client, httpx)."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from pathlib import Path

from poot.serve import ServeConfig, build_app
from poot.serve.server import bind, make_server

#: the tiny fixture's context (its trained context); max batch of the shared handle
TINY_CONTEXT = 128
TINY_BATCH = 8


def load_tiny(path: Path, cache_dir: str, **kw):
    """A ModelHandle of the tiny chat fixture (CPU) with the samplers the tests use."""
    from poot.api import ModelHandle
    from poot.graph.sampling import FULL

    opts = dict(kv_capacity=TINY_CONTEXT, max_batch=TINY_BATCH, prefill_chunk=16,
                cache_dir=cache_dir, warm_samplers=(FULL,))
    opts.update(kw)
    return ModelHandle.load(path, **opts)


class ServerThread:
    """uvicorn serving ``build_app(config, handle, **kw)`` on a socket bound here; ``url``
    is ``http://127.0.0.1:PORT``; :meth:`stop` shuts it down (the engine loop too), draining
    for ``drain_timeout_s``."""

    def __init__(self, handle=None, config: ServeConfig | None = None,
                 drain_timeout_s: float = 2, **kw):
        self.config = config or ServeConfig(served_model_name="tiny")
        self.app = build_app(self.config, handle=handle, **kw)
        self.state = self.app.state.poot
        self.sock = bind("127.0.0.1", 0)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = make_server(self.app, drain_timeout_s=drain_timeout_s)
        self.thread = threading.Thread(target=self.server.run,
                                       kwargs={"sockets": [self.sock]}, daemon=True)

    def start(self, timeout: float = 60.0) -> "ServerThread":
        self.thread.start()
        t_end = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > t_end:
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()


@contextmanager
def running(handle=None, config: ServeConfig | None = None, **kw):
    """A started :class:`ServerThread`, stopped on exit."""
    srv = ServerThread(handle, config, **kw).start()
    try:
        yield srv
    finally:
        srv.stop()


def pooled_server(fixture_dir, served: str, cache_dir, max_batch: int = 4):
    """Yields a server running the pooled fixture at ``fixture_dir`` (a
    :class:`~poot.api.pooling.PoolingModel`, up to ``max_batch`` rows a step, 32 tokens an input)
    under the model name ``served`` (for module-scoped fixtures: ``yield from``)."""
    from poot.api.pooling import PoolingModel

    pm = PoolingModel.load(fixture_dir, max_batch=max_batch, max_tokens=32, cache_dir=cache_dir)
    with running(pm, ServeConfig(served_model_name=served)) as srv:
        yield srv
