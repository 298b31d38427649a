"""The server's routes, one router per concern (each a FastAPI :class:`~fastapi.APIRouter`):
:mod:`~poot.serve.routes.models` (``/v1/models``, ``/health``, ``/metrics``),
:mod:`~poot.serve.routes.lora` (runtime LoRA adapters), :mod:`~poot.serve.routes.tokenize`
(``/tokenize``, ``/detokenize``), :mod:`~poot.serve.routes.pooling` (``/v1/embeddings``,
``/v1/rerank``), :mod:`~poot.serve.routes.generation` (``/v1/chat/completions``,
``/v1/completions``), :mod:`~poot.serve.routes.responses_api` (``/v1/responses``, over
the chat route) and :mod:`~poot.serve.routes.docs` (the API docs behind the key). They
read the shared :class:`~poot.serve.state.ServerState` through
:func:`~poot.serve.routes.deps.server_state`."""

from __future__ import annotations

from poot.serve.routes import generation, lora, models, pooling, responses_api, tokenize

#: every router, in the order the application includes them
ROUTERS = (models.router, lora.router, tokenize.router, pooling.router, generation.router,
           responses_api.router)

__all__ = ["ROUTERS"]
