"""``POST /v1/chat/completions`` and ``POST /v1/completions`` (OpenAI's shapes, streaming with
``stream: true``): a request checked in a worker thread, submitted to the engine
(:mod:`poot.serve.engine_client`), answered by a :class:`~poot.serve.generation.GenerationRun`."""

from __future__ import annotations

import time

from fastapi import APIRouter, Depends, Request
from starlette.concurrency import run_in_threadpool

from poot.models.lora import LoraError
from poot.serve import errors
from poot.serve.engine_client import EngineFault, QueueFull, ShuttingDown, TooManySequences
from poot.serve.errors import APIError, bad_request, unavailable
from poot.serve.generation import GenerationRun, SSEResponse
from poot.serve.mapping import chat_plan, completion_plan
from poot.serve.protocol import ChatCompletionRequest, CompletionRequest
from poot.serve.responses import new_id
from poot.serve.routes.deps import AUTHED, ERRORS, server_state
from poot.serve.state import ServerState, queue_full, shutting_down

router = APIRouter()


@router.post("/v1/chat/completions", dependencies=AUTHED, responses=ERRORS)
async def chat_completions(request: Request, body: ChatCompletionRequest,
                           state: ServerState = Depends(server_state)):
    """OpenAI chat completions (streaming with ``stream: true``)."""
    return await _generate(state, request, body, chat=True)


@router.post("/v1/completions", dependencies=AUTHED, responses=ERRORS)
async def completions(request: Request, body: CompletionRequest,
                      state: ServerState = Depends(server_state)):
    """OpenAI (legacy) completions (streaming with ``stream: true``)."""
    return await _generate(state, request, body, chat=False)


async def _generate(state: ServerState, request: Request, body, chat: bool):
    config = state.config
    info = request.scope.setdefault("poot.log", {"t0": time.monotonic()})
    rid = new_id("chatcmpl" if chat else "cmpl")
    info["id"] = rid
    h = state.require_model()
    aeng = state.require_engine()
    plan = await run_in_threadpool(chat_plan if chat else completion_plan, h, body, config)
    info["prompt"] = sum(len(p) for p in plan.prompts)
    try:
        gen = aeng.submit(rid, plan.prompts, plan.params, plan.n,
                          info["t0"] + config.request_timeout_s,
                          disconnected=None if body.stream else request.is_disconnected,
                          poll_s=config.poll_s, lora=plan.lora)
    except LoraError as e:             # unloaded after the request was checked
        raise APIError(404, str(e), errors.NOT_FOUND, "model", "model_not_found") from None
    except TooManySequences as e:
        raise bad_request("n", str(e)) from None
    except QueueFull as e:
        raise queue_full(e, config) from None
    except ShuttingDown:
        raise shutting_down(config) from None
    except EngineFault as e:
        raise unavailable(f"the engine stopped after a fault ({e}); the server is "
                          f"unhealthy", config.retry_after_s, "engine_unhealthy") from None
    run = GenerationRun(state, body, plan, rid, chat, info)
    if body.stream:
        return SSEResponse(run.stream(gen), on_close=lambda: run.closed(gen),
                           media_type="text/event-stream",
                           headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    return await run.complete(gen)
