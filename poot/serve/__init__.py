"""``poot serve``: an OpenAI-compatible HTTP server on the batching engine.

    from poot.api import ModelHandle
    from poot.serve import ServeConfig, build_app

    app = build_app(ServeConfig(served_model_name="smollm2"), handle=ModelHandle.load())
    # uvicorn.run(app, host="127.0.0.1", port=8000)   or: poot serve --port 8000

Layers (docs/serving.md): HTTP (:mod:`poot.serve.app`: the application,
:mod:`poot.serve.routes`: its routers, :mod:`~poot.serve.protocol` request models, :mod:`~poot.serve.responses` bodies and SSE chunks,
:mod:`~poot.serve.errors` OpenAI-shaped errors, :mod:`~poot.serve.metrics` Prometheus)
-> :mod:`poot.serve.engine_client` (the asyncio side of the engine) -> the engine thread.
:mod:`poot.serve.ray` deploys replicas behind one ingress with Ray Serve.

Needs the ``serve`` extra (FastAPI, uvicorn, pydantic, prometheus-client).
"""

from __future__ import annotations

from poot.serve.config import ServeConfig


def build_app(*args, **kwargs):
    """:func:`poot.serve.app.build_app` (imported on use: FastAPI loads only when serving)."""
    # lazy: FastAPI, prometheus_client, pydantic, Starlette
    from poot.serve.app import build_app as _build

    return _build(*args, **kwargs)


__all__ = ["ServeConfig", "build_app"]
