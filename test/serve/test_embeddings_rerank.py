"""``/v1/embeddings`` and ``/v1/rerank`` on a real server: the ``openai`` client's
``embeddings.create`` (base64, its default, and float) returns the recorded
sentence-transformers embeddings of the tiny BERT fixture; rerank returns HF's
cross-encoder scores, sorted; bad input is a 400 naming the field; a server of one kind
refuses the other kind's routes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))

from model_steps import FIXTURES, fixture_path, reference  # noqa: E402
from server_util import pooled_server  # noqa: E402

TOL = 1e-4


def _meta(name):
    return json.loads((FIXTURES / name / "reference.json").read_text())


@pytest.fixture(scope="module")
def embed_server(cache_dir):
    yield from pooled_server(fixture_path("bert_embed"), "emb", cache_dir)


@pytest.fixture(scope="module")
def rerank_server(cache_dir):
    yield from pooled_server(fixture_path("bert_cross_encoder"), "ce", cache_dir)


def _client(srv):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)


def test_openai_client_embeddings_equal_sentence_transformers(embed_server):
    meta, ref = _meta("bert_embed"), reference("bert_embed")
    c = _client(embed_server)
    r = c.embeddings.create(model="emb", input=meta["texts"])       # base64 on the wire
    got = np.array([d.embedding for d in r.data], np.float32)
    assert [d.index for d in r.data] == list(range(len(meta["texts"])))
    assert np.abs(got - ref["text_embeddings"]).max() < TOL
    assert r.usage.prompt_tokens == r.usage.total_tokens == sum(map(len, meta["text_ids"]))
    rows = [[int(x) for x in row[:n]] for row, n in zip(ref["input_ids"], ref["lengths"])]
    r = c.embeddings.create(model="emb", input=rows, encoding_format="float")
    got = np.array([d.embedding for d in r.data], np.float32)
    assert np.abs(got - ref["embeddings"]).max() < TOL
    one = c.embeddings.create(model="emb", input=rows[1], encoding_format="float")
    assert len(one.data) == 1
    assert np.abs(np.array(one.data[0].embedding) - ref["embeddings"][1]).max() < TOL


def test_dimensions_truncate_and_renormalize(embed_server):
    """The fixture's config declares is_matryoshka: the first N values, unit length."""
    ref = reference("bert_embed")
    row = [int(x) for x in ref["input_ids"][0][:ref["lengths"][0]]]
    r = _client(embed_server).embeddings.create(model="emb", input=[row], dimensions=16,
                                                encoding_format="float")
    v = np.array(r.data[0].embedding)
    want = ref["embeddings"][0][:16] / np.linalg.norm(ref["embeddings"][0][:16])
    assert v.shape == (16,) and np.abs(v - want).max() < TOL


@pytest.mark.parametrize("body,param", [
    ({"model": "emb", "input": []}, "input"),
    ({"model": "emb", "input": [[1, 2], [3, 999]]}, "input[1]"),
    ({"model": "emb", "input": [list(range(1, 40))]}, "input[0]"),
    ({"model": "emb", "input": "hi", "dimensions": 65}, "dimensions"),
    ({"model": "emb", "input": "hi", "encoding_format": "hex"}, "encoding_format"),
    ({"model": "emb", "input": [1.5]}, "input"),
    ({"model": "emb", "input": "hi", "pooling": "max"}, "pooling"),
])
def test_bad_embedding_requests_name_the_field(embed_server, body, param):
    r = httpx.post(embed_server.url + "/v1/embeddings", json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text


def test_kind_mismatch_is_a_400_naming_model(embed_server, rerank_server):
    r = httpx.post(embed_server.url + "/v1/rerank", json={"query": "q", "documents": ["d"]},
                   timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
    r = httpx.post(embed_server.url + "/v1/completions",
                   json={"model": "emb", "prompt": "hi"}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
    r = httpx.post(rerank_server.url + "/v1/embeddings", json={"model": "ce", "input": "hi"},
                   timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"


@pytest.mark.parametrize("path", ["/v1/rerank", "/rerank"])
def test_rerank_scores_equal_hf_sorted(rerank_server, path):
    meta, ref = _meta("bert_cross_encoder"), reference("bert_cross_encoder")
    docs = meta["rerank_documents"]
    r = httpx.post(rerank_server.url + path, json={"model": "ce", "query": meta["rerank_query"],
                                                   "documents": docs}, timeout=30)
    assert r.status_code == 200, r.text
    res = r.json()["results"]
    assert sorted(x["index"] for x in res) == list(range(len(docs)))
    scores = [x["relevance_score"] for x in res]
    assert scores == sorted(scores, reverse=True)
    want = ref["rerank_scores"]
    for x in res:
        assert abs(x["relevance_score"] - want[x["index"]]) < TOL
        assert x["document"]["text"] == docs[x["index"]]
    assert r.json()["usage"]["total_tokens"] == sum(map(len, meta["rerank_pair_ids"]))
    top = httpx.post(rerank_server.url + path, json={
        "query": meta["rerank_query"], "documents": [{"text": d} for d in docs], "top_n": 2,
        "return_documents": False}, timeout=30).json()["results"]
    assert [x["index"] for x in top] == [x["index"] for x in res[:2]]
    assert all("document" not in x for x in top)


@pytest.mark.parametrize("body,param", [
    ({"query": "q", "documents": []}, "documents"),
    ({"query": "q", "documents": ["d"], "top_n": 0}, "top_n"),
    ({"query": "q", "documents": ["ok", "word " * 40]}, "documents[1]"),
    ({"documents": ["d"]}, "query"),
    ({"query": "q", "documents": [3]}, "documents[0]"),
])
def test_bad_rerank_requests_name_the_field(rerank_server, body, param):
    r = httpx.post(rerank_server.url + "/v1/rerank", json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text
