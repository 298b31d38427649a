"""What every route depends on: the shared :class:`~poot.serve.state.ServerState`
(``app.state.poot``), the API key check, and the error responses routes declare."""

from __future__ import annotations

import hmac

from fastapi import Depends, Request

from poot.serve import errors
from poot.serve.errors import APIError
from poot.serve.protocol import ErrorResponse
from poot.serve.state import ServerState

#: the error statuses a route may answer with, each in OpenAI's shape (for the OpenAPI doc)
ERRORS = {s: {"model": ErrorResponse} for s in (400, 401, 404, 413, 429, 500, 503, 504)}


def server_state(request: Request) -> ServerState:
    """The application's :class:`ServerState`."""
    return request.app.state.poot


async def require_api_key(request: Request) -> None:
    """401 ``invalid_api_key`` unless the request carries ``Authorization: Bearer <key>``
    with the server's API key (nothing is checked without one)."""
    key_wanted = server_state(request).config.api_key
    if key_wanted is None:
        return
    header = request.headers.get("authorization", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(
            key.strip().encode(), key_wanted.encode()):
        raise APIError(401, "Incorrect API key provided" if header else
                       "Missing API key: send 'Authorization: Bearer <key>'",
                       errors.INVALID_REQUEST, None, "invalid_api_key")


#: a keyed route's dependencies
AUTHED = [Depends(require_api_key)]

__all__ = ["AUTHED", "ERRORS", "require_api_key", "server_state"]
