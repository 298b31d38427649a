"""``/v1/embeddings`` and ``/v1/rerank`` through the pooled queue: concurrent requests share
steps and each gets what it gets alone (and the fixture's reference); a full queue is a 429 (as generation's)
``queue_full``; a disconnected client's rows are dropped; the pooled metrics; a Ray Serve
replica (built without starting Ray) serves an embedding model. The queue is
paused while requests arrive, so which rows share a step does not depend on timing."""

from __future__ import annotations

import concurrent.futures
import json
import socket
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))

from model_steps import FIXTURES, fixture_path, reference  # noqa: E402
from poot.serve import ServeConfig  # noqa: E402
from server_util import pooled_server  # noqa: E402

TOL = 1e-4


@pytest.fixture(scope="module")
def emb(cache_dir):
    yield from pooled_server(fixture_path("bert_embed"), "emb", cache_dir, max_batch=8)


@pytest.fixture(scope="module")
def ce(cache_dir):
    yield from pooled_server(fixture_path("bert_cross_encoder"), "ce", cache_dir, max_batch=8)


def _embed(srv, rows):
    r = httpx.post(srv.url + "/v1/embeddings", timeout=120,
                   json={"model": "emb", "input": rows, "encoding_format": "float"})
    assert r.status_code == 200, r.text
    return np.array([d["embedding"] for d in r.json()["data"]], np.float32)


def _concurrently(srv, fn, args, rows):
    """``fn(arg)`` for every arg on threads while the queue is paused; resumed once all
    ``rows`` are queued. Returns the results and the steps they took."""
    q = srv.state.pool
    q.pause()
    steps = q.steps
    try:
        with concurrent.futures.ThreadPoolExecutor(len(args)) as ex:
            futs = [ex.submit(fn, a) for a in args]
            with q.cond:
                assert q.cond.wait_for(lambda: q.pending_rows == rows, timeout=120)
            q.pause(False)
            return [f.result() for f in futs], q.steps - steps
    finally:
        q.pause(False)


def _ref_rows():
    ref = reference("bert_embed")
    return ref, [[int(x) for x in r[:n]] for r, n in zip(ref["input_ids"], ref["lengths"])]


def test_concurrent_embeddings_equal_each_alone(emb):
    ref, rows = _ref_rows()
    reqs = [[r] for r in rows] + [rows, rows[::-1]]
    alone = [_embed(emb, x) for x in reqs]
    got, steps = _concurrently(emb, lambda x: _embed(emb, x), reqs, sum(map(len, reqs)))
    assert steps < len(reqs)
    for x, a, g in zip(reqs, alone, got):
        assert g.shape == a.shape and np.abs(g - a).max() < TOL
    for i in range(len(rows)):
        assert np.abs(got[i][0] - ref["embeddings"][i]).max() < TOL
    assert np.abs(got[-2] - ref["embeddings"]).max() < TOL
    assert np.abs(got[-1] - ref["embeddings"][::-1]).max() < TOL


def test_four_requests_of_two_rows_share_one_step(emb):
    reqs = [[[5 + i, 6, 7], [8, 9 + i]] for i in range(4)]
    got, steps = _concurrently(emb, lambda x: _embed(emb, x), reqs, 8)
    assert steps == 1 and all(g.shape[0] == 2 for g in got)
    text = httpx.get(emb.url + "/metrics", timeout=30).text
    assert 'poot_pooled_step_rows_bucket{le="8.0"}' in text
    for name in ("poot_pooled_steps_total", "poot_pooled_rows_total",
                 "poot_pooled_requests_total", "poot_pooled_rows_waiting"):
        assert name in text


def test_concurrent_rerank_equals_hf(ce):
    meta = json.loads((FIXTURES / "bert_cross_encoder" / "reference.json").read_text())
    want = reference("bert_cross_encoder")["rerank_scores"]
    docs = meta["rerank_documents"]

    def rerank(d):
        r = httpx.post(ce.url + "/v1/rerank", timeout=120, json={
            "query": meta["rerank_query"], "documents": d})
        assert r.status_code == 200, r.text
        return {x["document"]["text"]: x["relevance_score"] for x in r.json()["results"]}

    reqs = [docs, docs[::-1]] + [[d] for d in docs]
    got, steps = _concurrently(ce, rerank, reqs, sum(map(len, reqs)))
    assert steps < len(reqs)
    for res in got:
        for text, score in res.items():
            assert abs(score - want[docs.index(text)]) < TOL


def test_full_queue_is_a_429(emb):
    q = emb.state.pool
    q.max_pending_rows = 4
    try:
        q.pause()
        with concurrent.futures.ThreadPoolExecutor(1) as ex:
            first = ex.submit(_embed, emb, [[1, 2]] * 3)
            with q.cond:
                assert q.cond.wait_for(lambda: q.pending_rows == 3, timeout=120)
            r = httpx.post(emb.url + "/v1/embeddings", timeout=30,
                           json={"model": "emb", "input": [[3, 4], [5, 6]]})
            q.pause(False)
            assert first.result().shape[0] == 3
        assert r.status_code == 429, r.text
        assert r.json()["error"]["code"] == "queue_full"
        assert r.json()["error"]["type"] == "rate_limit_error"
        assert r.headers["retry-after"] == "1"
    finally:
        q.max_pending_rows = emb.state.config.max_pooled_rows
        q.pause(False)


def test_a_gone_clients_rows_are_dropped(emb):
    q = emb.state.pool
    dropped, rows = q.dropped, q.rows
    q.pause()
    try:
        body = json.dumps({"model": "emb", "input": [[1, 2], [3, 4], [5, 6]]}).encode()
        with socket.create_connection(("127.0.0.1", emb.port)) as s:
            s.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: "
                      b"application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            with q.cond:
                assert q.cond.wait_for(lambda: q.pending_rows == 3, timeout=120)
            req = q.pending[0]
        end = time.monotonic() + 60                  # the route polls the connection
        while not req.future.cancelled():
            assert time.monotonic() < end, "the route did not notice the client left"
            time.sleep(0.05)
    finally:
        q.pause(False)
    assert _embed(emb, [[7, 8]]).shape[0] == 1
    assert q.dropped - dropped == 3 and q.rows - rows == 1


def test_a_ray_replica_serves_an_embedding_model():
    """``poot serve --ray`` with an embedding checkpoint: each replica loads a PoolingModel
    and serves the same app (the replica class runs here, without Ray)."""
    from fastapi.testclient import TestClient

    from poot.serve.ray import PootReplica

    ref, rows = _ref_rows()
    rep = PootReplica({"path": str(fixture_path("bert_embed")), "backend": "cpu",
                       "max_batch": 4, "kv_capacity": 32, "use_cache": True,
                       "pooled": "embed"}, ServeConfig(served_model_name="emb"),
                      warm_up=False)
    assert rep.handle.task == "embed"
    with TestClient(rep.__serve_build_asgi_app__()) as c:
        rep.check_health()
        r = c.post("/v1/embeddings", json={"model": "emb", "input": rows,
                                           "encoding_format": "float"})
        assert r.status_code == 200, r.text
        got = np.array([d["embedding"] for d in r.json()["data"]], np.float32)
        assert np.abs(got - ref["embeddings"]).max() < TOL
