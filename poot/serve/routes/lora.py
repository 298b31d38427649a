"""``POST /v1/load_lora_adapter`` and ``/v1/unload_lora_adapter`` (vLLM's routes; with
``--allow-runtime-lora``): LoRA adapters loaded into and unloaded from the served model's
slots while it serves."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from poot.errors import PootError
from poot.models.lora import LoraError
from poot.serve import errors
from poot.serve.errors import APIError, bad_request
from poot.serve.lora_files import read_runtime_adapter
from poot.serve.protocol import LoadLoraRequest, UnloadLoraRequest
from poot.serve.routes.deps import AUTHED, ERRORS, server_state
from poot.serve.state import ServerState

router = APIRouter()


def _lora_handle(state: ServerState):
    """The served model, when it takes runtime adapters: 400 naming ``lora_name`` for a
    pooling model, 403 ``runtime_lora_disabled`` without ``--allow-runtime-lora``."""
    h = state.require_model()
    if state.pooler is not None:
        raise bad_request("lora_name", "this server's model serves embeddings or rerank; "
                          "it takes no LoRA adapters")
    if not state.config.runtime_lora:
        raise APIError(403, "loading LoRA adapters at run time is off (start poot serve "
                       "with --allow-runtime-lora)", errors.INVALID_REQUEST, None,
                       "runtime_lora_disabled")
    return h


def _lora_error(e: Exception) -> APIError:
    field = getattr(e, "field", None)
    if isinstance(e, LoraError) and field == "lora_name":
        return bad_request("lora_name", str(e))
    if isinstance(e, LoraError):        # a config field or a tensor of the folder
        return bad_request("lora_path", str(e))
    return bad_request(field or "lora_name", str(e))


@router.post("/v1/load_lora_adapter", dependencies=AUTHED, responses=ERRORS)
async def load_lora_adapter(body: LoadLoraRequest, state: ServerState = Depends(server_state)):
    """Load a PEFT LoRA folder into a free adapter slot (vLLM's route); requests name it
    in ``model``. ``lora_path`` is a folder under the server's ``--lora-root``
    (:mod:`poot.serve.lora_files`). Nothing is compiled; running requests are not
    disturbed."""
    h = _lora_handle(state)
    config = state.config

    def load():
        if h.runner.lora is None:                  # no slots: say so, read nothing
            return h.load_lora(body.lora_name, body.lora_path)
        adapter = read_runtime_adapter(config.lora_root, body.lora_path, h.weights.types,
                                       body.lora_name, config.max_lora_bytes)
        return h.load_lora(body.lora_name, adapter)

    try:
        await run_in_threadpool(load)
    except PootError as e:
        raise _lora_error(e) from None
    return Response(f"Success: LoRA adapter '{body.lora_name}' added successfully.",
                    media_type="text/plain")


@router.post("/v1/unload_lora_adapter", dependencies=AUTHED, responses=ERRORS)
async def unload_lora_adapter(body: UnloadLoraRequest,
                              state: ServerState = Depends(server_state)):
    """Unload an adapter (vLLM's route): new requests naming it get 404; those running
    finish with it, then its slot is freed."""
    h = _lora_handle(state)
    try:
        await run_in_threadpool(h.unload_lora, body.lora_name)
    except PootError as e:
        raise _lora_error(e) from None
    return Response(f"Success: LoRA adapter '{body.lora_name}' removed successfully.",
                    media_type="text/plain")
