"""The OpenAI-compatible HTTP application (FastAPI on Starlette).

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``POST /v1/responses``
(over the chat route), ``GET /v1/models`` (and
``/v1/models/{model}``), ``GET /health`` (200 ready; 503 loading, failed, unhealthy),
``GET /metrics`` (Prometheus), ``POST /tokenize``, ``POST /detokenize``; with an embedding
model ``POST /v1/embeddings``, with a cross-encoder ``POST /v1/rerank`` (and ``/rerank``):
with ``--allow-runtime-lora`` ``POST /v1/load_lora_adapter`` and
``/v1/unload_lora_adapter`` (``model`` may name a loaded adapter; ``/v1/models`` lists them);
a server serves either a generating model (a :class:`~poot.api.ModelHandle`) or a pooling
one (a :class:`~poot.api.pooling.PoolingModel`), and a route of the other kind is a 400 naming
``model``.

The event loop never waits on the engine: checking a request (tokenizing, the chat template)
runs in a worker thread, and outputs arrive through :mod:`poot.serve.engine_client`. The
front door (:class:`FrontDoor`, pure ASGI) bounds concurrent requests (503), body size
(413) and the time a body may take to arrive (408), and writes one log line per request
when its response ends (id, status, prompt and generated tokens, cached tokens, time to
first token, total time, finish reason). With an API key the docs routes need it too.

The routes are routers in :mod:`poot.serve.routes` (one module per concern); what they share
is the :class:`~poot.serve.state.ServerState` at ``app.state.poot``; the front door is
:mod:`poot.serve.front_door`, a generation request's response :mod:`poot.serve.generation`.
"""

from __future__ import annotations

import logging
import threading
from contextlib import asynccontextmanager
from typing import Any, Callable

from fastapi import FastAPI

from poot.version import __version__
from poot.serve import errors
from poot.serve.config import ServeConfig
from poot.serve.front_door import FrontDoor
from poot.serve.routes import ROUTERS
from poot.serve.routes import docs as keyed_docs
from poot.serve.state import ServerState

log = logging.getLogger("poot.serve")


def build_app(config: ServeConfig | None = None, handle=None,
              loader: Callable[[], Any] | None = None,
              on_loaded: Callable[[ServerState], None] | None = None,
              on_load_error: Callable[[BaseException], None] | None = None) -> FastAPI:
    """The FastAPI application.

    ``handle``: a loaded :class:`~poot.api.ModelHandle` to serve (ready at once);
    ``loader``: instead, a function returning one, run on a thread at startup while
    ``/health`` says ``loading`` (``on_loaded(state)`` / ``on_load_error(exc)`` are called
    when it ends). At shutdown the engine loop is stopped and unfinished requests aborted.
    The :class:`ServerState` is ``app.state.poot``.
    """
    config = config or ServeConfig()
    state = ServerState(config)
    # with an API key the docs routes are the keyed router's, behind the key
    keyed = config.api_key is not None
    app = FastAPI(title="poot", version=__version__,
                  lifespan=_lifespan(state, handle, loader, on_loaded, on_load_error),
                  description="An OpenAI-compatible server on poot's batching engine.",
                  **(dict(openapi_url=None, docs_url=None, redoc_url=None) if keyed else {}))
    app.state.poot = state
    errors.install(app)
    app.add_middleware(FrontDoor, state=state)
    if keyed:
        app.include_router(keyed_docs.router)
    for router in ROUTERS:
        app.include_router(router)
    return app


def _lifespan(state: ServerState, handle, loader, on_loaded, on_load_error):
    """The application's lifespan: serve ``handle``, or run ``loader`` on a thread (module
    doc of :func:`build_app`); at shutdown drain, stop the engine loop and the pooled
    queue."""
    config = state.config

    def load():
        try:
            h = loader()
        except BaseException as e:  # noqa: BLE001  (reported; /health says failed)
            state.fail(f"{type(e).__name__}: {e}" if not isinstance(e, SystemExit)
                       else "interrupted")
            if on_load_error is not None:
                on_load_error(e)
            return
        state.attach(h)
        if on_loaded is not None:
            on_loaded(state)

    @asynccontextmanager
    async def lifespan(app):
        if config.runtime_lora and config.api_key is None:
            log.warning("warning: --allow-runtime-lora without --api-key: anyone who can "
                        "reach this server can load adapters from --lora-root")
        if handle is not None:
            state.attach(handle)
        elif loader is not None:
            threading.Thread(target=load, name="poot-load", daemon=True).start()
        yield
        state.drain()
        if state.aengine is not None:
            state.aengine.engine.shutdown(timeout=30)
        if state.pool is not None:
            state.pool.close()

    return lifespan


__all__ = ["FrontDoor", "ServerState", "build_app"]
