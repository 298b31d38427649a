"""The OpenAI-compatible HTTP application (FastAPI on Starlette).

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``GET /v1/models`` (and
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
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import threading
import time
import uuid
from typing import Any, Callable

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from poot.serve import errors
from poot.serve.config import ServeConfig
from poot.serve.engine_client import (AsyncEngine, ClientGone, ConstraintFailed, EngineFault,
                                      QueueFull, RequestTimeout, ShuttingDown,
                                      TooManySequences)
from poot.serve.errors import APIError, bad_request, unavailable
from poot.serve.limits import BodyDeadline
from poot.serve.mapping import chat_plan, check_model, completion_plan, encode_chat
from poot.serve.metrics import CONTENT_TYPE, Metrics
from poot.api.pooling import relevance
from poot.engine.pooling import PoolQueueFull
from poot.models.lora import LoraError
from poot.serve.pooling import (check_dimensions, embedding_response, embedding_rows,
                                rerank_pairs, rerank_response)
from poot.serve.protocol import (ChatCompletionRequest, CompletionRequest, DetokenizeRequest,
                                 EmbeddingRequest, ErrorResponse, LoadLoraRequest,
                                 RerankRequest, TokenizeBody, TokenizeChatRequest,
                                 UnloadLoraRequest)
from poot.serve.responses import (SSE_DONE, ChoiceState, CompletionLogprobs, TokenText,
                                  chat_logprobs, new_id, sse, usage)

log = logging.getLogger("poot.serve")

#: routes whose metrics keep their path as the label (others count as "other")
_ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics",
           "/tokenize", "/detokenize", "/v1/embeddings", "/v1/rerank", "/rerank",
           "/v1/load_lora_adapter", "/v1/unload_lora_adapter")
#: routes that neither count toward nor are refused by the concurrency limit
_UNLIMITED = ("/health", "/metrics")
_ERRORS = {s: {"model": ErrorResponse} for s in (400, 401, 404, 413, 429, 500, 503, 504)}


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


class FrontDoor:
    """ASGI middleware: the concurrency limit (503 + ``Retry-After``), the body-size limit
    (413, from ``Content-Length`` or while the body streams in), the body's deadline (408,
    :class:`~poot.serve.limits.BodyDeadline`), the request counter and the one log line
    per request."""

    def __init__(self, app, state: ServerState):
        self.app, self.state = app, state

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        state, cfg = self.state, self.state.config
        path = scope.get("path", "")
        info: dict[str, Any] = {"t0": time.monotonic(), "id": f"req-{uuid.uuid4().hex[:12]}"}
        scope["poot.log"] = info
        status = [0]

        async def send_(msg):
            if msg["type"] == "http.response.start":
                status[0] = msg["status"]
                msg = {**msg, "headers": [*msg.get("headers", ()),
                                          (b"x-poot-replica", state.replica_id.encode())]}
            await send(msg)

        limited = path not in _UNLIMITED
        try:
            if limited and state.active >= cfg.max_concurrent:
                await unavailable(f"too many requests in progress ({state.active}); retry "
                                  f"shortly", cfg.retry_after_s, "server_busy"
                                  ).response()(scope, receive, send_)
                return
            length = _content_length(scope)
            if length is not None and length > cfg.max_body_bytes:
                await _too_large(length, cfg.max_body_bytes).response()(scope, receive, send_)
                return
            seen = [0]
            body_receive = BodyDeadline(receive, cfg.body_timeout_s)

            async def receive_():
                msg = await body_receive()
                if msg["type"] == "http.request":
                    seen[0] += len(msg.get("body", b""))
                    if seen[0] > cfg.max_body_bytes:
                        raise StarletteHTTPException(413, _too_large(seen[0],
                                                                     cfg.max_body_bytes).message)
                return msg

            if limited:
                state.active += 1
            try:
                await self.app(scope, receive_, send_)
            finally:
                if limited:
                    state.active -= 1
        finally:
            route = path if path in _ROUTES else ("/v1/models" if path.startswith(
                "/v1/models/") else "other")
            state.metrics.requests.labels(route, str(status[0] or 499)).inc()
            _log_request(scope, status[0], info)


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


def _content_length(scope) -> int | None:
    for k, v in scope.get("headers", ()):
        if k == b"content-length":
            try:
                return int(v)
            except ValueError:
                return None
    return None


def _too_large(n: int, limit: int) -> APIError:
    return APIError(413, f"the request body is {n} bytes or more, more than this server's "
                    f"limit of {limit} bytes", errors.INVALID_REQUEST, None,
                    "request_too_large")


def _log_request(scope, status: int, info: dict[str, Any]) -> None:
    path = scope.get("path", "")
    level = logging.DEBUG if path in _UNLIMITED else logging.INFO
    if not log.isEnabledFor(level):
        return
    total = time.monotonic() - info["t0"]
    parts = [info["id"], scope.get("method", ""), path,
             str(status) if status else "disconnected"]
    if "prompt" in info:
        parts.append(f"prompt={info['prompt']} generated={info.get('generated', 0)} "
                     f"cached={info.get('cached', 0)}")
    if info.get("ttft") is not None:
        parts.append(f"ttft={info['ttft']:.3f}s")
    parts.append(f"time={total:.3f}s")
    if info.get("finish"):
        parts.append(f"finish={info['finish']}")
    if info.get("error"):
        parts.append(f"error={info['error']}")
    log.log(level, " ".join(parts))


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
    from contextlib import asynccontextmanager

    config = config or ServeConfig()
    state = ServerState(config)

    @asynccontextmanager
    async def lifespan(app):
        if config.runtime_lora and config.api_key is None:
            log.warning("warning: --allow-runtime-lora without --api-key: anyone who can "
                        "reach this server can load adapters from --lora-root")
        if handle is not None:
            state.attach(handle)
        elif loader is not None:
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

            threading.Thread(target=load, name="poot-load", daemon=True).start()
        yield
        state.drain()
        if state.aengine is not None:
            state.aengine.engine.shutdown(timeout=30)
        if state.pool is not None:
            state.pool.close()

    # with an API key the docs routes are declared below, behind the key
    keyed = config.api_key is not None
    app = FastAPI(title="poot", version=_version(), lifespan=lifespan,
                  description="An OpenAI-compatible server on poot's batching engine.",
                  **(dict(openapi_url=None, docs_url=None, redoc_url=None) if keyed else {}))
    app.state.poot = state
    errors.install(app)
    app.add_middleware(FrontDoor, state=state)

    async def auth(request: Request) -> None:
        if config.api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, key = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
                key.strip().encode(), config.api_key.encode()):
            raise APIError(401, "Incorrect API key provided" if header else
                           "Missing API key: send 'Authorization: Bearer <key>'",
                           errors.INVALID_REQUEST, None, "invalid_api_key")

    authed = [Depends(auth)]
    if keyed:
        _keyed_docs(app, authed)

    # ---- model listing, health, metrics ------------------------------------------------------
    def model_card(adapter: str | None = None) -> dict[str, Any]:
        card = {"id": adapter or config.served_model_name, "object": "model",
                "created": state.created, "owned_by": "poot"}
        if adapter is not None:
            card["parent"] = card["root"] = config.served_model_name
        if state.handle is not None:
            card["max_model_len"] = state.handle.kv_capacity
        return card

    def adapters() -> dict[str, int]:
        loras = getattr(state.handle, "loras", None)
        return loras() if callable(loras) else {}

    @app.get("/v1/models", dependencies=authed, responses=_ERRORS)
    async def list_models():
        """The served model, then its loaded LoRA adapters (``parent`` names the model)."""
        return {"object": "list", "data": [model_card()] + [model_card(a)
                                                             for a in sorted(adapters())]}

    @app.get("/v1/models/{model}", dependencies=authed, responses=_ERRORS)
    async def get_model(model: str):
        """One model (404 unless it is the served one or a loaded adapter)."""
        names = adapters()
        check_model(model, config, adapters=names)
        return model_card(model if model in names else None)

    # ---- LoRA adapters -----------------------------------------------------------------------
    def _lora_handle():
        h = state.require_model()
        if state.pooler is not None:
            raise bad_request("lora_name", "this server's model serves embeddings or rerank; "
                              "it takes no LoRA adapters")
        if not config.runtime_lora:
            raise APIError(403, "loading LoRA adapters at run time is off (start poot serve "
                           "with --allow-runtime-lora)", errors.INVALID_REQUEST, None,
                           "runtime_lora_disabled")
        return h

    def _lora_error(e: Exception) -> APIError:
        from poot.models.lora import LoraError

        field = getattr(e, "field", None)
        if isinstance(e, LoraError) and field == "lora_name":
            return bad_request("lora_name", str(e))
        if isinstance(e, LoraError):        # a config field or a tensor of the folder
            return bad_request("lora_path", str(e))
        return bad_request(field or "lora_name", str(e))

    @app.post("/v1/load_lora_adapter", dependencies=authed, responses=_ERRORS)
    async def load_lora_adapter(body: LoadLoraRequest):
        """Load a PEFT LoRA folder into a free adapter slot (vLLM's route); requests name it
        in ``model``. ``lora_path`` is a folder under the server's ``--lora-root``
        (:mod:`poot.serve.lora_files`). Nothing is compiled; running requests are not
        disturbed."""
        h = _lora_handle()
        from poot.errors import PootError

        from poot.serve.lora_files import read_runtime_adapter

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

    @app.post("/v1/unload_lora_adapter", dependencies=authed, responses=_ERRORS)
    async def unload_lora_adapter(body: UnloadLoraRequest):
        """Unload an adapter (vLLM's route): new requests naming it get 404; those running
        finish with it, then its slot is freed."""
        h = _lora_handle()
        from poot.errors import PootError

        try:
            await run_in_threadpool(h.unload_lora, body.lora_name)
        except PootError as e:
            raise _lora_error(e) from None
        return Response(f"Success: LoRA adapter '{body.lora_name}' removed successfully.",
                        media_type="text/plain")

    @app.get("/health")
    async def health():
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
                            {"Retry-After": str(config.retry_after_s)})

    @app.get("/metrics", dependencies=authed)
    async def metrics():
        """Prometheus metrics (module :mod:`poot.serve.metrics`)."""
        return Response(state.metrics.render(), media_type=CONTENT_TYPE)

    # ---- tokenizer routes --------------------------------------------------------------------
    @app.post("/tokenize", dependencies=authed, responses=_ERRORS)
    async def tokenize(body: TokenizeBody):
        """Token ids of a ``prompt`` or of chat ``messages`` (through the chat template)."""
        h = state.require_model()
        check_model(body.model, config, required=False)
        if h.tokenizer is None:
            raise bad_request("prompt", "this model has no tokenizer")

        def run():
            if isinstance(body, TokenizeChatRequest):
                return encode_chat(h, body.messages, body.add_generation_prompt,
                                   body.chat_template_kwargs)
            from poot.text.tokenizer import TokenizerError

            try:
                return h.tokenizer.encode(body.prompt, add_special_tokens=body.add_special_tokens)
            except TokenizerError as e:
                raise bad_request("prompt", str(e)) from None

        ids = await run_in_threadpool(run)
        return {"count": len(ids), "max_model_len": h.kv_capacity, "tokens": ids}

    @app.post("/detokenize", dependencies=authed, responses=_ERRORS)
    async def detokenize(body: DetokenizeRequest):
        """The text of token ids."""
        h = state.require_model()
        check_model(body.model, config, required=False)
        if h.tokenizer is None:
            raise bad_request("tokens", "this model has no tokenizer")
        vocab = h.tokenizer.vocab_size
        bad = [i for i in body.tokens if not 0 <= i < vocab]
        if bad:
            raise bad_request("tokens", f"token id {bad[0]} is outside the vocabulary "
                              f"[0, {vocab})")
        return {"prompt": await run_in_threadpool(h.tokenizer.decode, body.tokens)}

    # ---- embeddings and rerank (a pooling model) -----------------------------------------------
    async def _pooled(request: Request, rows, types=None):
        """Queue ``rows`` on the model's :class:`~poot.engine.pooling.PoolQueue` and await
        their outputs (f32 [n, H]); None once the client disconnected (its rows not yet run
        are dropped). 429 ``queue_full`` past ``max_pooled_rows``, as generation's queue."""
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

    @app.post("/v1/embeddings", dependencies=authed, responses=_ERRORS)
    async def embeddings(request: Request, body: EmbeddingRequest):
        """OpenAI embeddings: pooled hidden states of each input (module
        :mod:`poot.serve.pooling`); the inputs share steps with other requests'."""
        pm = state.require_pooler("embed")
        check_model(body.model, config)
        check_dimensions(pm, body.dimensions)
        rows = await run_in_threadpool(embedding_rows, pm, body)
        vecs = await _pooled(request, rows)
        if vecs is None:
            return Response(status_code=499)
        return embedding_response(pm, body, rows, vecs, config.served_model_name)

    async def _rerank(request: Request, body: RerankRequest):
        state.require_pooler("score")
        check_model(body.model, config, required=False)
        texts, pairs = await run_in_threadpool(rerank_pairs, state.pooler, body)
        logits = await _pooled(request, [p[0] for p in pairs], [p[1] for p in pairs])
        if logits is None:
            return Response(status_code=499)
        return rerank_response(body, texts, pairs, relevance(logits),
                               config.served_model_name)

    @app.post("/v1/rerank", dependencies=authed, responses=_ERRORS)
    async def rerank_v1(request: Request, body: RerankRequest):
        """Rerank ``documents`` by relevance to ``query`` with a cross-encoder (vLLM's and
        Cohere's shape); results sorted best first."""
        return await _rerank(request, body)

    @app.post("/rerank", dependencies=authed, responses=_ERRORS)
    async def rerank(request: Request, body: RerankRequest):
        """``/v1/rerank`` under vLLM's unversioned path."""
        return await _rerank(request, body)

    # ---- generation --------------------------------------------------------------------------
    @app.post("/v1/chat/completions", dependencies=authed, responses=_ERRORS)
    async def chat_completions(request: Request, body: ChatCompletionRequest):
        """OpenAI chat completions (streaming with ``stream: true``)."""
        return await _generate(request, body, chat=True)

    @app.post("/v1/completions", dependencies=authed, responses=_ERRORS)
    async def completions(request: Request, body: CompletionRequest):
        """OpenAI (legacy) completions (streaming with ``stream: true``)."""
        return await _generate(request, body, chat=False)

    async def _generate(request: Request, body, chat: bool):
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
        run = _Run(state, body, plan, rid, chat, info)
        if body.stream:
            return _SSEResponse(run.stream(gen), on_close=lambda: run.closed(gen),
                                media_type="text/event-stream",
                                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return await run.complete(gen)

    return app


def _keyed_docs(app: FastAPI, authed: list) -> None:
    """``/openapi.json``, ``/docs`` and ``/redoc`` behind the API key (FastAPI's own are
    open to anyone)."""
    from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html

    @app.get("/openapi.json", dependencies=authed, include_in_schema=False)
    async def openapi():
        return JSONResponse(app.openapi())

    @app.get("/docs", dependencies=authed, include_in_schema=False)
    async def docs():
        return get_swagger_ui_html(openapi_url="/openapi.json", title=f"{app.title} - docs")

    @app.get("/redoc", dependencies=authed, include_in_schema=False)
    async def redoc():
        return get_redoc_html(openapi_url="/openapi.json", title=f"{app.title} - ReDoc")


class _SSEResponse(StreamingResponse):
    """A streaming response that runs ``on_close`` however it ends -- also when the client
    went away before the first chunk, so the body generator never started (and its own
    ``finally`` never runs)."""

    def __init__(self, content, on_close: Callable[[], None], **kw):
        super().__init__(content, **kw)
        self.on_close = on_close

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()


#: the log's ``finish=`` of a request that ended with one of these
_ABORTED = {RequestTimeout: "timeout", ShuttingDown: "shutdown"}


class _Run:
    """One generation request's response: the choice states, metrics and log fields."""

    def __init__(self, state: ServerState, body, plan, rid: str, chat: bool, info: dict):
        self.state, self.body, self.plan, self.rid = state, body, plan, rid
        self.chat, self.info = chat, info
        self.model = state.config.served_model_name
        self.created = int(time.time())
        n = plan.n
        self.states = [ChoiceState(i, len(plan.prompts[i // n])) for i in range(plan.choices)]
        self.want_logprobs = plan.params[0].logprobs is not None
        tt = state.tokens
        self.tt = tt
        self.echo = (not chat) and body.echo
        self.prompt_texts: list[str] = []
        if self.echo:
            p = body.prompt
            for ids, src in zip(plan.prompts, [p] if isinstance(p, str) or
                                (p and isinstance(p[0], int)) else p):
                self.prompt_texts.append(src if isinstance(src, str) else
                                         (tt.tok.decode(ids, skip_special_tokens=True)
                                          if tt.tok is not None else ""))
        self.clp = [CompletionLogprobs(tt, plan.prompts[i // n]) for i in
                    range(plan.choices)] if not chat else []
        self.ttft_seen: set[int] = set()
        self.finished = False
        # vLLM's return_token_ids: prompt and generated ids beside the text
        self.ids = bool(body.return_token_ids)
        self.ids_sent: set[int] = set()

    def _prompt_ids(self, i: int) -> list[int]:
        return self.plan.prompts[i // self.plan.n]

    def _with_ids(self, choice: dict[str, Any], i: int, ids: list[int]) -> dict[str, Any]:
        """``choice`` with its ``token_ids`` (and, on a choice's first chunk of a completion,
        ``prompt_token_ids``) when the request asked for them."""
        if self.ids:
            choice["token_ids"] = list(ids)
            if not self.chat and i not in self.ids_sent:
                self.ids_sent.add(i)
                choice["prompt_token_ids"] = self._prompt_ids(i)
        return choice

    # ---- shared bookkeeping ------------------------------------------------------------------
    def _feed(self, i: int, ev):
        st = self.states[i]
        text, released, gaps = st.feed(ev)
        m = self.state.metrics
        if st.t_first is not None and i not in self.ttft_seen:
            self.ttft_seen.add(i)
            m.ttft.observe(st.t_first - self.info["t0"])
        for g in gaps:
            m.itl.observe(g)
        return st, text, released

    def _finish(self, status: str | None = None) -> None:
        if self.finished:
            return
        self.finished = True
        m = self.state.metrics
        gen = sum(s.completion_tokens or len(s.token_ids) for s in self.states)
        m.prompt_tokens.inc(self.info.get("prompt", 0))
        m.generation_tokens.inc(gen)
        m.e2e.observe(time.monotonic() - self.info["t0"])
        self.info["generated"] = gen
        self.info["cached"] = usage(self.states, [len(p) for p in self.plan.prompts])[
            "prompt_tokens_details"]["cached_tokens"]
        firsts = [s.t_first for s in self.states if s.t_first is not None]
        if firsts:
            self.info["ttft"] = min(firsts) - self.info["t0"]
        reasons = sorted({s.finish_reason for s in self.states if s.finish_reason})
        self.info["finish"] = status or ",".join(reasons) or None

    def _usage(self) -> dict[str, Any]:
        return usage(self.states, [len(p) for p in self.plan.prompts])

    def _error(self, e: BaseException) -> APIError:
        if isinstance(e, RequestTimeout):
            return APIError(504, f"the request ran past this server's limit of "
                            f"{self.state.config.request_timeout_s:g} s and was aborted",
                            errors.TIMEOUT, None, "request_timeout")
        if isinstance(e, ShuttingDown):
            return shutting_down(self.state.config)
        if isinstance(e, ConstraintFailed):
            field = self.plan.guided_field
            return APIError(400, f"invalid '{field}': {e}", errors.INVALID_REQUEST, field,
                            "guided_decoding_failed")
        return APIError(500, f"the engine failed while running this request ({e})",
                        errors.SERVER, None, "engine_error")

    # ---- non-streaming -----------------------------------------------------------------------
    async def complete(self, gen):
        """Run to the end; the response JSON."""
        try:
            async for i, ev in gen.events():
                self._feed(i, ev)
        except (RequestTimeout, EngineFault, ShuttingDown) as e:
            self._finish(_ABORTED.get(type(e), "error"))
            self.info["error"] = type(e).__name__
            self.state.metrics.aborted.inc(len(gen.unfinished))
            raise self._error(e) from None
        except ClientGone:
            self.state.metrics.aborted.inc(len(gen.unfinished))
            self._finish("disconnected")
            return Response(status_code=499)
        finally:
            gen.close()
        self._finish()
        choices = []
        for st in self.states:
            if self.chat:
                choices.append(self._with_ids({
                    "index": st.index,
                    "message": {"role": "assistant", "content": st.text, "refusal": None},
                    "logprobs": chat_logprobs(st.logprobs, self.tt)
                    if self.want_logprobs else None,
                    "finish_reason": st.finish_reason}, st.index, st.token_ids))
            else:
                p = st.index // self.plan.n
                text = (self.prompt_texts[p] if self.echo else "") + st.text
                lp = None
                if self.want_logprobs:
                    clp = self.clp[st.index]
                    lp = clp.prompt() if self.echo else None
                    lp = CompletionLogprobs.merge(lp, clp.generated(st.logprobs))
                choices.append(self._with_ids({"index": st.index, "text": text, "logprobs": lp,
                                               "finish_reason": st.finish_reason},
                                              st.index, st.token_ids))
        out = {"id": self.rid, "object": "chat.completion" if self.chat else
               "text_completion", "created": self.created, "model": self.model,
               "system_fingerprint": None, "choices": choices, "usage": self._usage()}
        if self.ids and self.chat:
            out["prompt_token_ids"] = self._prompt_ids(0)
        return out

    def closed(self, gen) -> None:
        """The stream's response ended (any way): abort what still runs."""
        if not self.finished:
            self.state.metrics.aborted.inc(len(gen.unfinished))
            self._finish("disconnected")
        gen.close()

    # ---- streaming ---------------------------------------------------------------------------
    def _chunk(self, choice: dict[str, Any], top: dict[str, Any] | None = None) -> str:
        obj = {"id": self.rid, "object": "chat.completion.chunk" if self.chat else
               "text_completion", "created": self.created, "model": self.model,
               "system_fingerprint": None, "choices": [choice], **(top or {})}
        opts = self.body.stream_options
        if opts is not None and opts.include_usage:
            obj["usage"] = None
            if opts.continuous_usage_stats:
                obj["usage"] = self._running_usage()
        return sse(obj)

    def _running_usage(self) -> dict[str, Any]:
        prompt = sum(len(p) for p in self.plan.prompts)
        gen = sum(len(s.token_ids) for s in self.states)
        return {"prompt_tokens": prompt, "completion_tokens": gen, "total_tokens": prompt + gen}

    def _event_chunks(self, i: int, ev) -> list[str]:
        """The SSE chunks of one engine output of choice ``i``: its text (and log-probs, token
        ids) when any is released, and the finish chunk when it finished."""
        st, text, released = self._feed(i, ev)
        new_ids = ev.token_ids if self.ids else []
        out = []
        if text or released or new_ids:
            if self.chat:
                out.append(self._chunk(self._with_ids({
                    "index": i, "delta": {"content": text},
                    "logprobs": chat_logprobs(released, self.tt)
                    if self.want_logprobs else None, "finish_reason": None}, i, new_ids)))
            else:
                out.append(self._chunk(self._with_ids({
                    "index": i, "text": text,
                    "logprobs": self.clp[i].generated(released)
                    if self.want_logprobs else None, "finish_reason": None}, i, new_ids)))
        if ev.finished:
            if self.chat:
                out.append(self._chunk(self._with_ids(
                    {"index": i, "delta": {}, "logprobs": None,
                     "finish_reason": st.finish_reason}, i, [])))
            else:
                out.append(self._chunk(self._with_ids(
                    {"index": i, "text": "", "logprobs": None,
                     "finish_reason": st.finish_reason}, i, [])))
        return out

    async def stream(self, gen):
        """The SSE body: chunks, the usage chunk when asked, ``data: [DONE]``. Chunks of
        outputs already queued are written together (one send when the front end has fallen
        behind the engine, instead of one per token). A client that goes away cancels this
        generator: its sequences are aborted (``gen.close``)."""
        done = False
        try:
            for st in self.states:
                if self.chat:
                    yield self._chunk({"index": st.index,
                                       "delta": {"role": "assistant", "content": ""},
                                       "logprobs": None, "finish_reason": None},
                                      {"prompt_token_ids": self._prompt_ids(st.index)}
                                      if self.ids else None)
                elif self.echo:
                    p = st.index // self.plan.n
                    lp = self.clp[st.index].prompt() \
                        if self.want_logprobs else None
                    yield self._chunk(self._with_ids(
                        {"index": st.index, "text": self.prompt_texts[p], "logprobs": lp,
                         "finish_reason": None}, st.index, []))
            out: list[str] = []         # chunks not yet written (see Generation.ready)
            try:
                async for i, ev in gen.events():
                    out += self._event_chunks(i, ev)
                    if out and not gen.ready():
                        yield "".join(out)
                        out.clear()
            except (RequestTimeout, EngineFault, ShuttingDown) as e:
                self.state.metrics.aborted.inc(len(gen.unfinished))
                self._finish(_ABORTED.get(type(e), "error"))
                self.info["error"] = type(e).__name__
                yield "".join(out) + sse(self._error(e).body()) + SSE_DONE
                done = True
                return
            if out:
                yield "".join(out)
            self._finish()
            opts = self.body.stream_options
            if opts is not None and opts.include_usage:
                yield sse({"id": self.rid, "object": "chat.completion.chunk" if self.chat
                           else "text_completion", "created": self.created,
                           "model": self.model, "system_fingerprint": None, "choices": [],
                           "usage": self._usage()})
            yield SSE_DONE
            done = True
        finally:
            if not done:                       # the client went away (or the server stops)
                self.state.metrics.aborted.inc(len(gen.unfinished))
                self._finish("disconnected")
            gen.close()


def _version() -> str:
    try:
        import poot

        return poot.__version__
    except (ImportError, AttributeError):
        return "0"


__all__ = ["FrontDoor", "ServerState", "build_app"]
