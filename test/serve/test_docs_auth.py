"""With ``--api-key`` the API docs (``/docs``, ``/redoc``, ``/openapi.json``) need the key like
every other route but ``/health``; without a key they stay open."""

from __future__ import annotations

import httpx
import pytest

from poot.serve import ServeConfig
from server_util import running

DOCS = ("/openapi.json", "/docs", "/redoc")


@pytest.fixture(scope="module")
def keyed():
    with running(None, ServeConfig(served_model_name="tiny", api_key="sekret")) as s:
        yield s


@pytest.mark.parametrize("path", DOCS)
def test_docs_need_the_key(keyed, path):
    for headers in ({}, {"authorization": "Bearer wrong"}):
        r = httpx.get(keyed.url + path, headers=headers)
        assert r.status_code == 401, (path, r.status_code)
        assert r.json()["error"]["code"] == "invalid_api_key"
    r = httpx.get(keyed.url + path, headers={"authorization": "Bearer sekret"})
    assert r.status_code == 200


def test_schema_behind_the_key_lists_the_routes(keyed):
    r = httpx.get(keyed.url + "/openapi.json", headers={"authorization": "Bearer sekret"})
    paths = r.json()["paths"]
    assert "/v1/chat/completions" in paths and "/docs" not in paths


def test_docs_open_without_a_key():
    with running(None, ServeConfig(served_model_name="tiny")) as s:
        for path in DOCS:
            assert httpx.get(s.url + path).status_code == 200, path
