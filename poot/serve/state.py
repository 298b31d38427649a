"""What the server's routes share: :class:`ServerState` (the config, the served model, its
engine, the metrics, the status) and the errors every route may answer with when the server
cannot run a request (shutting down, queue full). The application keeps it as
``app.state.poot``; a route reads it through :func:`poot.serve.routes.deps.server_state`."""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from poot.serve import errors
from poot.serve.config import ServeConfig
from poot.serve.engine_client import AsyncEngine
from poot.serve.errors import APIError, bad_request, unavailable
from poot.serve.metrics import Metrics
from poot.serve.responses import TokenText

log = logging.getLogger("poot.serve")


class ServerState:
    """What the routes share: the config, the loaded model (None while loading), its
    :class:`AsyncEngine`, the metrics, and the status (``loading``, ``ready``, ``failed``,
    ``draining``; ``unhealthy`` once the engine stopped after a fault)."""

    def __init__(self, config: ServeConfig):
        self.config = config
        self.handle = None
        #: the served model when it is a :class:`~poot.api.pooling.PoolingModel` (no engine loop)
        self.pooler = None
        #: its :class:`~poot.engine.pooling.PoolQueue` (the requests' shared steps)
        self.pool = None
        self.aengine: AsyncEngine | None = None
        self.tokens: TokenText | None = None
        self._status = "loading"
        self.error: str | None = None
        self.active = 0                       # HTTP requests in progress (limited routes)
        self.aborting = False                 # the drain deadline passed (abort_running)
        self.metrics = Metrics(lambda: self)
        self.created = int(time.time())
        #: names this server process in the ``x-poot-replica`` response header (which
        #: replica behind a load balancer answered)
        self.replica_id = uuid.uuid4().hex[:12]

    @property
    def status(self) -> str:
        """``loading``, ``ready``, ``failed``, ``draining`` or ``unhealthy``."""
        if self._status == "ready" and self.aengine is not None and self.aengine.fault:
            return "unhealthy"
        return self._status

    def attach(self, handle) -> None:
        """Serve ``handle`` (a loaded :class:`~poot.api.ModelHandle`): start its engine loop
        and become ready."""
        self.handle = handle
        self.tokens = TokenText(handle.tokenizer)
        if getattr(handle, "task", None) in ("embed", "score"):   # a PoolingModel
            self.pooler = handle
            self.pool = handle.queue(self.config.max_pooled_rows)
        else:
            self.aengine = AsyncEngine(handle.engine, self.config.max_queue)
            self.aengine.start()
        self._status = "ready"

    def fail(self, message: str) -> None:
        """Loading failed: every route but ``/health`` answers 503 with ``message``."""
        self.error, self._status = message, "failed"

    def drain(self) -> None:
        """Refuse new generation requests (shutting down)."""
        if self._status == "ready":
            self._status = "draining"

    def abort_running(self) -> None:
        """The drain deadline passed: requests still running end now, answered as 503
        ``shutting_down`` (:func:`shutting_down`; a stream: its error event and ``[DONE]``).
        Call on the event loop."""
        self.aborting = True
        n = self.aengine.abort_all() if self.aengine is not None else 0
        log.warning("drain deadline passed: aborting %d running generation request(s)", n)

    def require_model(self) -> Any:
        """The handle, or 503 while loading / after a failed load."""
        if self._status == "loading":
            raise unavailable("the model is loading; retry shortly",
                              self.config.retry_after_s, "model_loading")
        if self._status == "failed":
            raise unavailable(f"the model failed to load: {self.error}",
                              self.config.retry_after_s, "model_failed")
        return self.handle

    def require_pooler(self, task: str):
        """The served :class:`~poot.api.pooling.PoolingModel` for ``task`` (``embed``/``score``),
        or 503 while loading or draining, or 400 naming ``model`` when the served model
        does not do ``task``."""
        self.require_model()
        if self.status == "draining":
            raise unavailable("the server is shutting down", self.config.retry_after_s,
                              "shutting_down")
        what = {"embed": "embeddings", "score": "rerank"}
        if self.pooler is None:
            raise bad_request("model", f"this server's model generates text; it serves no "
                              f"{what[task]} (start poot serve with an embedding model or "
                              f"a cross-encoder)")
        if self.pooler.task != task:
            raise bad_request("model", f"this server's model serves {what[self.pooler.task]}"
                              f", not {what[task]}")
        return self.pooler

    def require_engine(self) -> AsyncEngine:
        """The engine, or 503 while loading, draining or unhealthy; 400 naming ``model``
        when the served model is a pooling one (it does not generate)."""
        self.require_model()
        if self.pooler is not None:
            what, route = (("embeddings", "/v1/embeddings") if self.pooler.task == "embed"
                           else ("rerank", "/v1/rerank"))
            raise bad_request("model", f"this server's model serves {what} (POST {route}), "
                              f"not generation")
        status = self.status
        if status == "draining":
            raise unavailable("the server is shutting down", self.config.retry_after_s,
                              "shutting_down")
        if status == "unhealthy":
            raise unavailable(f"the engine stopped after a fault ({self.aengine.fault}); "
                              f"the server is unhealthy", self.config.retry_after_s,
                              "engine_unhealthy")
        return self.aengine


def shutting_down(config: ServeConfig) -> APIError:
    """503 ``shutting_down``: the server stopped and its drain deadline passed while the
    request ran (it was aborted)."""
    return unavailable(f"the server is shutting down: the request was aborted at the end "
                       f"of the {config.drain_timeout_s:g} s drain", config.retry_after_s,
                       "shutting_down")


def queue_full(e: Exception, config: ServeConfig) -> APIError:
    """429 ``queue_full`` (OpenAI's rate-limit shape, with ``Retry-After``): the generation
    engine's or the pooled queue's bound was reached."""
    return APIError(429, f"the server's queue is full: {e}; retry shortly", errors.RATE_LIMIT,
                    None, "queue_full", {"Retry-After": str(config.retry_after_s)})


__all__ = ["ServerState", "queue_full", "shutting_down"]
