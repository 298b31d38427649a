"""``GET /v1/models`` (and ``/v1/models/{model}``), ``GET /health`` and ``GET /metrics``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, Response

from poot.serve.mapping import check_model
from poot.serve.metrics import CONTENT_TYPE
from poot.serve.routes.deps import AUTHED, ERRORS, server_state
from poot.serve.state import ServerState

router = APIRouter()


def _model_card(state: ServerState, adapter: str | None = None) -> dict[str, Any]:
    config = state.config
    card = {"id": adapter or config.served_model_name, "object": "model",
            "created": state.created, "owned_by": "poot"}
    if adapter is not None:
        card["parent"] = card["root"] = config.served_model_name
    if state.handle is not None:
        card["max_model_len"] = state.handle.kv_capacity
    return card


def _adapters(state: ServerState) -> dict[str, int]:
    loras = getattr(state.handle, "loras", None)
    return loras() if callable(loras) else {}


@router.get("/v1/models", dependencies=AUTHED, responses=ERRORS)
async def list_models(state: ServerState = Depends(server_state)):
    """The served model, then its loaded LoRA adapters (``parent`` names the model)."""
    return {"object": "list", "data": [_model_card(state)] + [
        _model_card(state, a) for a in sorted(_adapters(state))]}


@router.get("/v1/models/{model}", dependencies=AUTHED, responses=ERRORS)
async def get_model(model: str, state: ServerState = Depends(server_state)):
    """One model (404 unless it is the served one or a loaded adapter)."""
    names = _adapters(state)
    check_model(model, state.config, adapters=names)
    return _model_card(state, model if model in names else None)


@router.get("/health")
async def health(state: ServerState = Depends(server_state)):
    """200 ``{"status": "ready"}`` when serving; 503 while loading, after a failed load,
    while draining, or when the engine stopped after a fault (``unhealthy``)."""
    status = state.status
    body: dict[str, Any] = {"status": status}
    if status == "failed":
        body["error"] = state.error
    elif status == "unhealthy":
        body["error"] = state.aengine.fault
    return JSONResponse(body, status_code=200 if status == "ready" else 503,
                        headers=None if status == "ready" else
                        {"Retry-After": str(state.config.retry_after_s)})


@router.get("/metrics", dependencies=AUTHED)
async def metrics(state: ServerState = Depends(server_state)):
    """Prometheus metrics (module :mod:`poot.serve.metrics`)."""
    return Response(state.metrics.render(), media_type=CONTENT_TYPE)
