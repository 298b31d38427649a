"""Schemathesis against the server's own OpenAPI schema: generated requests, valid and
invalid, to every route. Whatever it sends, the server answers -- 2xx, or a 4xx in OpenAI's
error shape -- never a 5xx and never a hang (every call has a client time limit). Bounded:
a fixed number of examples per route and mode, no example database, and a small body limit
so that valid requests stay cheap (the tiny model's context is 128 tokens)."""

from __future__ import annotations

import os
import time

import pytest

schemathesis = pytest.importorskip("schemathesis", reason="needs schemathesis (the test "
                                   "extra)")

from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis.errors import Unsatisfiable  # noqa: E402

from poot.serve import ServeConfig  # noqa: E402
from server_util import running  # noqa: E402

#: examples per route and mode; POOT_FUZZ_EXAMPLES raises it for a longer hunt
EXAMPLES = int(os.environ.get("POOT_FUZZ_EXAMPLES", "60"))


def _openai_shape(response, case) -> None:
    """4xx bodies are ``{"error": {message, type, param, code}}``; nothing is a 5xx."""
    status = response.status_code
    where = f"{case.method} {case.path} {case.body!r:.300}"
    assert status < 500, f"{where}: {status} {response.text[:300]}"
    if 400 <= status < 500:
        body = response.json()
        assert set(body) == {"error"}, (where, body)
        assert set(body["error"]) == {"message", "type", "param", "code"}, (where, body)
        assert body["error"]["message"]


def _served_model(case):
    """Valid requests name the served model (else almost all would be 404s)."""
    if isinstance(case.body, dict) and isinstance(case.body.get("model"), str):
        case.body["model"] = "tiny"
    if case.path_parameters and "model" in case.path_parameters:
        case.path_parameters["model"] = "tiny"
    return case


@pytest.mark.parametrize("mode", ["positive", "negative"])
def test_schema_fuzz(tiny, mode):
    cfg = ServeConfig(served_model_name="tiny", max_body_bytes=4096, request_timeout_s=30)
    with running(tiny, cfg) as srv:
        schema = schemathesis.openapi.from_url(srv.url + "/openapi.json")
        ops = [r.ok() for r in schema.get_all_operations()]
        assert {op.path for op in ops} >= {"/v1/chat/completions", "/v1/completions",
                                           "/v1/responses", "/v1/models", "/tokenize",
                                           "/detokenize"}
        gen_mode = schemathesis.GenerationMode(mode)
        calls, fuzzed = [], set()
        for op in ops:
            @settings(max_examples=EXAMPLES, deadline=None, database=None,
                      phases=[Phase.explicit, Phase.generate],
                      suppress_health_check=list(HealthCheck))
            @given(case=op.as_strategy(generation_mode=gen_mode).map(_served_model))
            def run(case):
                response = case.call(base_url=srv.url, timeout=60)
                calls.append(response.status_code)
                fuzzed.add(op.path)
                _openai_shape(response, case)

            try:
                run()
            except Unsatisfiable:    # nothing to make invalid (a GET with no parameters)
                assert mode == "negative" and op.method.upper() == "GET"
        assert calls and all(c < 500 for c in calls)
        assert {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/tokenize",
                "/detokenize"} <= fuzzed
        # the engine is left clean: nothing running, every block free. A request that
        # failed while running (a guided constraint that cannot be completed) is answered at
        # once and the engine aborts its other choices at its next step (LLMEngine.abort):
        # wait for that step, bounded; a request left running would hold its blocks
        end = time.monotonic() + 10.0
        while tiny.engine.stats().running and time.monotonic() < end:
            time.sleep(0.02)
        stats = tiny.engine.stats()
        assert stats.running == 0 and stats.kv_blocks_used == 0, stats
        assert srv.state.aengine.inflight == 0
