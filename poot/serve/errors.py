"""Errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``.

Every failure a client can see goes through :class:`APIError` (or is turned into one by the
handlers :func:`install` registers): request validation (FastAPI's, turned from 422 into
OpenAI's 400 naming the field), unknown routes and methods (404/405), the body-size limit
(413), a full queue (429, ``Retry-After``), a loading, draining or unhealthy server (503,
``Retry-After``), and any unexpected exception (500 with a generic message: the traceback
goes to the server's log, never to the client).
"""

from __future__ import annotations

import logging
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse

log = logging.getLogger("poot.serve")

#: type strings, as OpenAI's API spells them
INVALID_REQUEST = "invalid_request_error"
AUTHENTICATION = "authentication_error"
NOT_FOUND = "not_found_error"
RATE_LIMIT = "rate_limit_error"
SERVER = "server_error"
UNAVAILABLE = "service_unavailable"
TIMEOUT = "timeout_error"


class APIError(Exception):
    """An error response: HTTP ``status``, OpenAI ``type``, the ``param`` it is about (a
    request field, ``messages[0].content``), a short machine-readable ``code``, and extra
    response ``headers`` (``Retry-After``)."""

    def __init__(self, status: int, message: str, type: str = INVALID_REQUEST,
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.type = status, message, type
        self.param, self.code, self.headers = param, code, headers or {}

    def body(self) -> dict[str, Any]:
        """The JSON body."""
        return error_body(self.message, self.type, self.param, self.code)

    def response(self) -> JSONResponse:
        """The error as a JSON response."""
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def error_body(message: str, type: str, param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    """``{"error": {...}}``."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def bad_request(param: str | None, message: str, code: str = "invalid_value") -> APIError:
    """A 400 about request field ``param``."""
    return APIError(400, message, INVALID_REQUEST, param, code)


def unavailable(message: str, retry_after: int = 1, code: str = "unavailable") -> APIError:
    """A 503 with ``Retry-After``."""
    return APIError(503, message, UNAVAILABLE, None, code, {"Retry-After": str(retry_after)})


# pydantic puts the member of a union it tried into the location ("stop", "list[str]"): not
# a field
_TYPE_TAG = re.compile(r"^(str|int|float|bool|bytes|none|list\[.*\]|dict\[.*\]|"
                       r"[a-z-]+\[.*\]|function-.*|json-or-python.*|literal\[.*\])$")
# ... or a model's name (a tagged union's member): no field is spelled in CamelCase
_MODEL_TAG = re.compile(r"^[A-Z][A-Za-z0-9]*$")


def field_path(loc: tuple[Any, ...] | list[Any]) -> str | None:
    """A validation error's location as a parameter name: ``("body", "messages", 0,
    "content")`` -> ``"messages[0].content"`` (union-member tags dropped)."""
    parts = list(loc)
    if parts and parts[0] in ("body", "query", "path", "header"):
        parts = parts[1:]
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        elif isinstance(p, str) and (_MODEL_TAG.match(p) or (_TYPE_TAG.match(p) and out)):
            continue
        else:
            out += f".{p}" if out else str(p)
    return out or None


def _validation_message(err: dict[str, Any], param: str | None) -> tuple[str, str]:
    kind = err.get("type", "")
    msg = err.get("msg", "invalid value")
    if kind == "json_invalid":
        return "the request body is not valid JSON: " + str(err.get("ctx", {}).get("error", msg)), \
            "invalid_json"
    if kind == "missing":
        if param is None:
            return "the request body is missing (a JSON object is expected)", "missing_body"
        return f"'{param}' is a required property", "missing_required_parameter"
    if kind == "extra_forbidden":
        return f"unsupported parameter '{param}': this server does not implement it", \
            "unsupported_parameter"
    if param is None:
        return ("the request body must be a JSON object (Content-Type: application/json): "
                f"{msg}"), "invalid_body"
    value = err.get("input")
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return f"invalid value for '{param}' ({shown}): {msg}", "invalid_value"


def install(app: FastAPI) -> None:
    """Register the handlers that give every error OpenAI's shape."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        errors = exc.errors()
        # the most specific error first: a field that is present beats "missing" of a union
        # alternative
        err = errors[0] if errors else {}
        param = None if err.get("type") == "json_invalid" else field_path(err.get("loc", ()))
        message, code = _validation_message(err, param)
        return APIError(400, message, INVALID_REQUEST, param, code).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        if isinstance(getattr(exc, "api_error", None), APIError):   # raised below a route
            return exc.api_error.response()
        if exc.status_code == 404:
            e = APIError(404, f"no route {request.method} {request.url.path}", NOT_FOUND,
                         code="not_found")
        elif exc.status_code == 413:
            e = APIError(413, str(exc.detail), INVALID_REQUEST, code="request_too_large")
        elif exc.status_code == 405:
            e = APIError(405, f"method {request.method} is not allowed on {request.url.path}",
                         INVALID_REQUEST, code="method_not_allowed",
                         headers=dict(exc.headers or {}))
        else:
            e = APIError(exc.status_code, str(exc.detail), INVALID_REQUEST if
                         exc.status_code < 500 else SERVER, headers=dict(exc.headers or {}))
        return e.response()

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        log.error("internal error on %s %s", request.method, request.url.path, exc_info=exc)
        return APIError(500, "internal server error (the server's log has the details)",
                        SERVER, code="internal_error").response()


__all__ = ["APIError", "AUTHENTICATION", "INVALID_REQUEST", "NOT_FOUND", "RATE_LIMIT",
           "SERVER", "TIMEOUT", "UNAVAILABLE", "bad_request", "error_body", "field_path",
           "install", "unavailable"]
