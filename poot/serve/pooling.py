"""``/v1/embeddings`` and ``/v1/rerank`` bodies -> :class:`~poot.api.pooling.PoolingModel` calls ->
response objects.

Shapes: OpenAI's embeddings response (``{"object": "list", "data": [{"object": "embedding",
"index", "embedding"}], "model", "usage": {"prompt_tokens", "total_tokens"}}``, ``embedding``
a list of floats or, with ``encoding_format: base64``, the base64 of its little-endian f32
bytes, which the ``openai`` client decodes) and vLLM's rerank response (``{"id", "model",
"usage": {"total_tokens"}, "results": [{"index", "document": {"text"}, "relevance_score"}]}``,
results sorted by score, best first; Cohere's is the same less ``id``/``usage`` naming).

Every check that fails is an :class:`~poot.serve.errors.APIError` 400 naming the field
(``input[2]``, ``documents[0]``, ``dimensions``); nothing is allocated per request beyond
the inputs' token ids, whose count the body limit and :data:`MAX_EMBED_INPUTS` bound.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np

from poot.sampling_params import InvalidRequest
from poot.serve.errors import APIError, bad_request
from poot.serve.protocol import (MAX_EMBED_INPUTS, MAX_RERANK_DOCUMENTS, EmbeddingRequest,
                                 RerankRequest)
from poot.serve.responses import new_id


def _bad(e: InvalidRequest) -> APIError:
    return bad_request(e.field, f"invalid value for '{e.field}': {e.reason}")


def embedding_rows(pm, req: EmbeddingRequest) -> list[list[int]]:
    """Token ids of each input of ``req`` (a single string or id list is one input).
    400 naming the field for an empty or oversized list and for a bad input."""
    inp = req.input
    single = isinstance(inp, str) or (bool(inp) and all(isinstance(x, int) for x in inp))
    items: list[Any] = [inp] if single else list(inp)
    if not items:
        raise bad_request("input", "'input' must not be empty")
    if len(items) > MAX_EMBED_INPUTS:
        raise bad_request("input", f"at most {MAX_EMBED_INPUTS} inputs per request, got "
                          f"{len(items)}")
    try:
        return [pm.encode_input(x, "input" if single else f"input[{i}]")
                for i, x in enumerate(items)]
    except InvalidRequest as e:
        raise _bad(e) from None


def check_dimensions(pm, dimensions: int | None) -> None:
    """400 naming ``dimensions`` unless the model may be truncated to it: at most its hidden
    size, and the config marks it Matryoshka-trained (``is_matryoshka``, or
    ``matryoshka_dimensions`` listing the value)."""
    if dimensions is None:
        return
    h = pm.hidden_size
    if dimensions > h:
        raise bad_request("dimensions", f"'dimensions' {dimensions} is more than the "
                          f"model's {h}")
    allowed = pm.matryoshka
    if allowed is False:
        raise bad_request("dimensions", "this model does not support 'dimensions' (its "
                          "config declares no Matryoshka training: is_matryoshka / "
                          "matryoshka_dimensions)")
    if allowed is not True and dimensions not in allowed:
        raise bad_request("dimensions", f"'dimensions' must be one of "
                          f"{', '.join(map(str, allowed))}")


def embedding_response(pm, req: EmbeddingRequest, rows: list[list[int]], vecs: np.ndarray,
                       model_name: str) -> dict[str, Any]:
    """The response body for ``vecs`` f32 [n, H] (truncated to ``dimensions`` and
    re-normalized when the model normalizes)."""
    if req.dimensions is not None:
        vecs = vecs[:, :req.dimensions]
        if pm.normalize:
            norm = np.maximum(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-12)
            vecs = (vecs / norm).astype(np.float32)
    data = []
    for i, v in enumerate(vecs):
        if req.encoding_format == "base64":
            emb: Any = base64.b64encode(np.asarray(v, "<f4").tobytes()).decode("ascii")
        else:
            emb = [float(x) for x in v]
        data.append({"object": "embedding", "index": i, "embedding": emb})
    n = sum(len(r) for r in rows)
    return {"object": "list", "data": data, "model": model_name,
            "usage": {"prompt_tokens": n, "total_tokens": n}}


def rerank_pairs(pm, req: RerankRequest) -> tuple[list[str], list[tuple[list[int], list[int]]]]:
    """(document texts, (ids, token types) of each query/document pair); 400 naming the
    field for too many documents or a pair past the model's input limit."""
    if len(req.documents) > MAX_RERANK_DOCUMENTS:
        raise bad_request("documents", f"at most {MAX_RERANK_DOCUMENTS} documents per "
                          f"request, got {len(req.documents)}")
    texts = [d if isinstance(d, str) else d.text for d in req.documents]
    try:
        return texts, [pm.encode_pair(req.query, t, f"documents[{i}]")
                       for i, t in enumerate(texts)]
    except InvalidRequest as e:
        raise _bad(e) from None


def rerank_response(req: RerankRequest, texts: list[str], pairs, scores: np.ndarray,
                    model_name: str) -> dict[str, Any]:
    """vLLM's rerank body: results sorted by ``relevance_score`` (best first; ties keep the
    documents' order), the first ``top_n``."""
    order = sorted(range(len(texts)), key=lambda i: (-float(scores[i]), i))
    if req.top_n is not None:
        order = order[:req.top_n]
    results = []
    for i in order:
        r: dict[str, Any] = {"index": i, "relevance_score": float(scores[i])}
        if req.return_documents:
            r["document"] = {"text": texts[i]}
        results.append(r)
    return {"id": new_id("rerank"), "model": model_name,
            "usage": {"total_tokens": sum(len(p[0]) for p in pairs)}, "results": results}


__all__ = ["check_dimensions", "embedding_response", "embedding_rows", "rerank_pairs",
           "rerank_response"]
