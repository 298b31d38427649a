"""``POST /v1/embeddings`` (an embedding model) and ``POST /v1/rerank`` (and ``/rerank``; a
cross-encoder): pooled steps shared with other requests' inputs (module
:mod:`poot.serve.pooling`)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from poot.api.pooling import relevance
from poot.engine.pooling import PoolQueueFull
from poot.serve.mapping import check_model
from poot.serve.pooling import (check_dimensions, embedding_response, embedding_rows,
                                rerank_pairs, rerank_response)
from poot.serve.protocol import EmbeddingRequest, RerankRequest
from poot.serve.routes.deps import AUTHED, ERRORS, server_state
from poot.serve.state import ServerState, queue_full, shutting_down

router = APIRouter()


async def _pooled(state: ServerState, request: Request, rows, types=None):
    """Queue ``rows`` on the model's :class:`~poot.engine.pooling.PoolQueue` and await
    their outputs (f32 [n, H]); None once the client disconnected (its rows not yet run
    are dropped). 429 ``queue_full`` past ``max_pooled_rows``, as generation's queue."""
    config = state.config
    try:
        fut = state.pool.submit(rows, types)
    except PoolQueueFull as e:
        raise queue_full(e, config) from None
    done = asyncio.wrap_future(fut)
    try:
        while not done.done():
            await asyncio.wait({done}, timeout=config.poll_s)
            if not done.done() and state.aborting:
                raise shutting_down(config)
            if not done.done() and await request.is_disconnected():
                return None
        return done.result()
    finally:
        fut.cancel()


@router.post("/v1/embeddings", dependencies=AUTHED, responses=ERRORS)
async def embeddings(request: Request, body: EmbeddingRequest,
                     state: ServerState = Depends(server_state)):
    """OpenAI embeddings: pooled hidden states of each input (module
    :mod:`poot.serve.pooling`); the inputs share steps with other requests'."""
    pm = state.require_pooler("embed")
    check_model(body.model, state.config)
    check_dimensions(pm, body.dimensions)
    rows = await run_in_threadpool(embedding_rows, pm, body)
    vecs = await _pooled(state, request, rows)
    if vecs is None:
        return Response(status_code=499)
    return embedding_response(pm, body, rows, vecs, state.config.served_model_name)


async def _rerank(state: ServerState, request: Request, body: RerankRequest):
    state.require_pooler("score")
    check_model(body.model, state.config, required=False)
    texts, pairs = await run_in_threadpool(rerank_pairs, state.pooler, body)
    logits = await _pooled(state, request, [p[0] for p in pairs], [p[1] for p in pairs])
    if logits is None:
        return Response(status_code=499)
    return rerank_response(body, texts, pairs, relevance(logits),
                           state.config.served_model_name)


@router.post("/v1/rerank", dependencies=AUTHED, responses=ERRORS)
async def rerank_v1(request: Request, body: RerankRequest,
                    state: ServerState = Depends(server_state)):
    """Rerank ``documents`` by relevance to ``query`` with a cross-encoder (vLLM's and
    Cohere's shape); results sorted best first."""
    return await _rerank(state, request, body)


@router.post("/rerank", dependencies=AUTHED, responses=ERRORS)
async def rerank(request: Request, body: RerankRequest,
                 state: ServerState = Depends(server_state)):
    """``/v1/rerank`` under vLLM's unversioned path."""
    return await _rerank(state, request, body)
