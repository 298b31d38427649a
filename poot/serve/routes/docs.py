"""``/openapi.json``, ``/docs`` and ``/redoc`` behind the API key (FastAPI's own are open to
anyone, so a keyed application turns those off and includes this router instead)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import JSONResponse

from poot.serve.routes.deps import AUTHED

router = APIRouter()


@router.get("/openapi.json", dependencies=AUTHED, include_in_schema=False)
async def openapi(request: Request):
    return JSONResponse(request.app.openapi())


@router.get("/docs", dependencies=AUTHED, include_in_schema=False)
async def docs(request: Request):
    return get_swagger_ui_html(openapi_url="/openapi.json",
                               title=f"{request.app.title} - docs")


@router.get("/redoc", dependencies=AUTHED, include_in_schema=False)
async def redoc(request: Request):
    return get_redoc_html(openapi_url="/openapi.json", title=f"{request.app.title} - ReDoc")
