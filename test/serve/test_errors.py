"""Every failure a client can see is OpenAI's error shape with the right status: a table of
malformed bodies (400 naming the field), 401, 404, 405, 413, 429 and 503 with Retry-After,
504 past the time limit, and an engine fault (500, then the server reports itself
unhealthy). Never a 500 for bad input, never a traceback."""

from __future__ import annotations

import json
import threading
import time

import httpx
import openai
import pytest

from poot.serve import ServeConfig
from server_util import running

MSG = [{"role": "user", "content": "hi"}]
CHAT = "/v1/chat/completions"
COMP = "/v1/completions"

# httpx's default 5 s read timeout is shorter than a model step on a loaded 2-core CI machine
# (the n = 8 request timed out there): every round trip here may take up to a minute.
TIMEOUT = httpx.Timeout(60.0)


def post(url, **kw):
    return httpx.post(url, **{"timeout": TIMEOUT, **kw})


def get(url, **kw):
    return httpx.get(url, **{"timeout": TIMEOUT, **kw})


def check_error(r: httpx.Response, status: int, param: str | None = "?") -> dict:
    """``r`` is an OpenAI-shaped error with ``status`` (and ``param`` unless "?")."""
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"]
    assert "Traceback" not in err["message"]
    if param != "?":
        assert err["param"] == param, err
    return err


def chat(**kw):
    return {"model": "tiny", "messages": MSG, **kw}


def comp(**kw):
    return {"model": "tiny", "prompt": "hi", **kw}


# (route, body, status, param)
BAD = [
    (CHAT, {}, 400, "model"),
    (CHAT, {"model": "tiny"}, 400, "messages"),
    (CHAT, chat(messages=[]), 400, "messages"),
    (CHAT, chat(messages="hi"), 400, "messages"),
    (CHAT, chat(messages=[{"content": "hi"}]), 400, "messages[0].role"),
    (CHAT, chat(messages=[{"role": "wizard", "content": "hi"}]), 400, "messages[0].role"),
    (CHAT, chat(messages=[{"role": "user", "content": 5}]), 400, "messages[0].content"),
    (CHAT, chat(messages=[{"role": "user", "content": [{"type": "image_url",
                                                        "image_url": {"url": "x"}}]}]),
     400, "messages[0].content"),
    (CHAT, chat(model=5), 400, "model"),
    (CHAT, chat(model="gpt-4"), 404, "model"),
    (CHAT, chat(temperature="hot"), 400, "temperature"),
    (CHAT, chat(temperature=-1), 400, "temperature"),
    (CHAT, chat(temperature=2.5), 400, "temperature"),
    (CHAT, chat(top_p=0), 400, "top_p"),
    (CHAT, chat(top_p=1.5), 400, "top_p"),
    (CHAT, chat(top_k=-5), 400, "top_k"),
    (CHAT, chat(min_p=2), 400, "min_p"),
    (CHAT, chat(repetition_penalty=0), 400, "repetition_penalty"),
    (CHAT, chat(presence_penalty=3), 400, "presence_penalty"),
    (CHAT, chat(frequency_penalty=-2.5), 400, "frequency_penalty"),
    (CHAT, chat(max_tokens=0), 400, "max_tokens"),
    (CHAT, chat(max_tokens=1.5), 400, "max_tokens"),
    (CHAT, chat(max_tokens=True), 400, "max_tokens"),
    (CHAT, chat(max_tokens=10_000), 400, "max_tokens"),
    (CHAT, chat(max_completion_tokens=10_000), 400, "max_completion_tokens"),
    (CHAT, chat(messages=[{"role": "user", "content": "x" * 600}]), 400, "messages"),
    (CHAT, chat(n=0), 400, "n"),
    (CHAT, chat(n=1000), 400, "n"),
    (CHAT, chat(stop=5), 400, "stop"),
    (CHAT, chat(stop=[""]), 400, "stop"),
    (CHAT, chat(stop=["x"] * 100), 400, "stop"),
    (CHAT, chat(stop_token_ids=[99999]), 400, "stop_token_ids"),
    (CHAT, chat(logit_bias={"abc": 1}), 400, "logit_bias"),
    (CHAT, chat(logit_bias={"5": 500}), 400, "logit_bias[5]"),
    (CHAT, chat(logit_bias={"99999": 1}), 400, "logit_bias"),
    (CHAT, chat(seed=-1 - 2 ** 63), 400, "seed"),
    (CHAT, chat(seed="x"), 400, "seed"),
    (CHAT, chat(logprobs="yes"), 400, "logprobs"),
    (CHAT, chat(top_logprobs=5), 400, "top_logprobs"),
    (CHAT, chat(logprobs=True, top_logprobs=21), 400, "top_logprobs"),
    (CHAT, chat(stream="yes"), 400, "stream"),
    (CHAT, chat(stream_options={"include_usage": "yes"}), 400, "stream_options.include_usage"),
    (CHAT, chat(stream_options={"bogus": 1}), 400, "stream_options.bogus"),
    (CHAT, chat(stream_options={"include_usage": True}), 400, "stream_options"),
    # lone UTF-16 surrogates (a JSON "\udfff" escape without its pair): not text
    (COMP, comp(prompt="\udfff abc"), 400, "prompt"),
    (COMP, comp(prompt=["ok", "\ud83d"]), 400, "prompt[1]"),
    ("/tokenize", {"prompt": "\udfff abc"}, 400, "prompt"),
    (CHAT, chat(response_format={"type": "yaml"}), 400, "response_format.type"),
    (COMP, comp(tools=[{"type": "function", "function": {"name": "f"}}]), 400, "tools"),
    (CHAT, chat(tool_choice="required"), 400, "tool_choice"),
    (CHAT, chat(functions=[]), 400, "functions"),
    (CHAT, chat(unknown_field=1), 400, "unknown_field"),
    (CHAT, chat(chat_template_kwargs={"messages": []}), 400, "chat_template_kwargs"),
    (CHAT, chat(temperature=float("nan")), 400, "temperature"),
    (COMP, {"model": "tiny"}, 400, "prompt"),
    (COMP, comp(prompt=[]), 400, "prompt"),
    (COMP, comp(prompt=""), 400, "prompt"),
    (COMP, comp(prompt=[1, -5]), 400, "prompt"),
    (COMP, comp(prompt=[1, 99999]), 400, "prompt"),
    (COMP, comp(prompt=[[1, 2], "x"]), 400, "prompt"),
    (COMP, comp(prompt=["a"] * 20), 400, "prompt"),
    (COMP, comp(prompt=["a", "b"], n=9), 400, "n"),
    (COMP, comp(prompt=[1] * 500), 400, "prompt"),
    (COMP, comp(logprobs=21), 400, "logprobs"),
    (COMP, comp(logprobs=True), 400, "logprobs"),
    (COMP, comp(echo=1), 400, "echo"),
    (COMP, comp(suffix="tail"), 400, "suffix"),
    (COMP, comp(best_of=3), 400, "best_of"),
    (COMP, comp(max_tokens=-1), 400, "max_tokens"),
    (COMP, comp(max_tokens=200), 400, "max_tokens"),
    ("/tokenize", {"prompt": 5}, 400, "prompt"),
    ("/tokenize", {"messages": "x"}, 400, "messages"),
    ("/tokenize", {"model": "other", "prompt": "x"}, 404, "model"),
    ("/detokenize", {"tokens": [1, 99999]}, 400, "tokens"),
    ("/detokenize", {"tokens": "abc"}, 400, "tokens"),
]


@pytest.mark.parametrize("route,body,status,param", BAD,
                         ids=[f"{i}-{r.rsplit('/', 1)[-1]}-{p}" for i, (r, _, _, p) in
                              enumerate(BAD)])
def test_bad_bodies(server, route, body, status, param):
    r = post(server.url + route, content=json.dumps(body, allow_nan=True),
                   headers={"content-type": "application/json"})
    check_error(r, status, param)


@pytest.mark.parametrize("raw,ctype", [
    (b"{not json", "application/json"), (b"", "application/json"), (b"[1, 2]",
                                                                     "application/json"),
    (b"null", "application/json"), (b'"text"', "application/json"),
    (b"\xff\xfe\x00", "application/json"), (b"model=tiny", "application/x-www-form-urlencoded"),
    (b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}', "text/plain"),
])
def test_bodies_that_are_not_json_objects(server, raw, ctype):
    r = post(server.url + CHAT, content=raw, headers={"content-type": ctype})
    check_error(r, 400)


@pytest.mark.parametrize("route,body", [
    (CHAT, chat(n=None, stream=None, ignore_eos=None, max_tokens=2, return_token_ids=None)),
    (COMP, comp(echo=None, n=None, stream=None, max_tokens=2)),
    ("/tokenize", {"prompt": "hi", "add_special_tokens": None}),
])
def test_null_means_the_default(server, route, body):
    """OpenAI's clients send ``null`` for a parameter left unset: it is the default."""
    r = post(server.url + route, json=body)
    assert r.status_code == 200, r.text
    if route != "/tokenize":
        assert len(r.json()["choices"]) == 1


def test_not_found_and_method(server):
    check_error(get(server.url + "/v1/nothing"), 404, None)
    check_error(post(server.url + "/v2/chat/completions", json=chat()), 404, None)
    check_error(get(server.url + CHAT), 405, None)
    check_error(get(server.url + "/v1/models/gpt-4"), 404, "model")


def test_context_overflow_says_both_numbers(server, tiny):
    r = post(server.url + CHAT, json=chat(max_tokens=500))
    err = check_error(r, 400, "max_tokens")
    n = len(tiny.encode(MSG))
    assert err["code"] == "context_length_exceeded"
    assert f"{n} in the messages" in err["message"] and "500 in the completion" in \
        err["message"] and "128 tokens" in err["message"]


def test_api_key(tiny):
    with running(tiny, ServeConfig(served_model_name="tiny", api_key="sekret")) as srv:
        check_error(post(srv.url + CHAT, json=chat(max_tokens=2)), 401, None)
        check_error(post(srv.url + CHAT, json=chat(max_tokens=2),
                               headers={"authorization": "Bearer wrong"}), 401, None)
        check_error(get(srv.url + "/v1/models",
                              headers={"authorization": "Basic sekret"}), 401, None)
        check_error(get(srv.url + "/metrics"), 401, None)
        assert get(srv.url + "/health").status_code == 200
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            c.models.list()
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="sekret", max_retries=0)
        assert c.chat.completions.create(model="tiny", messages=MSG, max_tokens=2).choices


def test_body_too_large(tiny):
    with running(tiny, ServeConfig(served_model_name="tiny", max_body_bytes=2000)) as srv:
        big = chat(messages=[{"role": "user", "content": "x" * 5000}])
        check_error(post(srv.url + CHAT, json=big), 413, None)

        def chunks():                       # no Content-Length: counted as it streams in
            data = json.dumps(big).encode()
            for i in range(0, len(data), 512):
                yield data[i:i + 512]

        check_error(post(srv.url + CHAT, content=chunks(),
                               headers={"content-type": "application/json"}), 413, None)
        assert post(srv.url + CHAT, json=chat(max_tokens=2)).status_code == 200


def _in_background(fn):
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("r", fn()), daemon=True)
    t.start()
    return t, out


def test_queue_full_429_then_served(tiny, gate):
    """With the engine paused, requests fill the queue (max_batch running + max_queue
    waiting); the next one gets 429 with Retry-After; once the engine runs, the queued ones
    complete."""
    cfg = ServeConfig(served_model_name="tiny", max_queue=0)
    with running(tiny, cfg) as srv:
        gate.close()
        t, out = _in_background(lambda: post(srv.url + CHAT, json=chat(
            n=8, max_tokens=3)))
        end = time.monotonic() + 30
        while srv.state.aengine.inflight < 8 and time.monotonic() < end:
            time.sleep(0.01)
        assert srv.state.aengine.inflight == 8
        r = post(srv.url + CHAT, json=chat(max_tokens=2))
        err = check_error(r, 429, None)
        assert err["code"] == "queue_full" and r.headers["retry-after"] == "1"
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.RateLimitError):
            c.chat.completions.create(model="tiny", messages=MSG, max_tokens=2)
        gate.open()
        t.join(60)
        assert out["r"].status_code == 200 and len(out["r"].json()["choices"]) == 8
        assert post(srv.url + CHAT, json=chat(max_tokens=2)).status_code == 200


def test_concurrency_limit_503(tiny, gate):
    cfg = ServeConfig(served_model_name="tiny", max_concurrent=1)
    with running(tiny, cfg) as srv:
        gate.close()
        t, out = _in_background(lambda: post(srv.url + CHAT, json=chat(max_tokens=2)))
        end = time.monotonic() + 30
        while srv.state.active < 1 and time.monotonic() < end:
            time.sleep(0.01)
        r = post(srv.url + COMP, json=comp(max_tokens=2))
        err = check_error(r, 503, None)
        assert err["code"] == "server_busy" and "retry-after" in r.headers
        assert get(srv.url + "/health").status_code == 200     # never limited
        gate.open()
        t.join(60)
        assert out["r"].status_code == 200


def test_request_timeout_504(tiny, gate):
    cfg = ServeConfig(served_model_name="tiny", request_timeout_s=0.3, poll_s=0.05)
    with running(tiny, cfg) as srv:
        gate.close()
        r = post(srv.url + CHAT, json=chat(max_tokens=2))
        err = check_error(r, 504, None)
        assert err["code"] == "request_timeout"
        s = post(srv.url + CHAT, json=chat(max_tokens=2, stream=True))
        assert s.status_code == 200
        events = s.text.strip().split("\n\n")
        assert events[-1] == "data: [DONE]"
        assert json.loads(events[-2][len("data: "):])["error"]["code"] == "request_timeout"
        gate.open()
        end = time.monotonic() + 30
        while tiny.engine.stats().kv_blocks_used and time.monotonic() < end:
            time.sleep(0.01)
        assert tiny.engine.stats().kv_blocks_used == 0 and srv.state.aengine.inflight == 0


def test_loading_503_then_ready(tiny):
    release = threading.Event()

    def loader():
        release.wait(60)
        return tiny

    with running(None, loader=loader) as srv:
        h = get(srv.url + "/health")
        assert h.status_code == 503 and h.json()["status"] == "loading"
        r = post(srv.url + CHAT, json=chat(max_tokens=2))
        err = check_error(r, 503, None)
        assert err["code"] == "model_loading" and "retry-after" in r.headers
        release.set()
        end = time.monotonic() + 30
        while get(srv.url + "/health").status_code != 200 and time.monotonic() < end:
            time.sleep(0.02)
        assert post(srv.url + CHAT, json=chat(max_tokens=2)).status_code == 200


def test_load_failure_reported(tmp_path):
    def loader():
        raise RuntimeError("no such model")

    with running(None, loader=loader) as srv:
        end = time.monotonic() + 30
        while srv.state.status == "loading" and time.monotonic() < end:
            time.sleep(0.01)
        h = get(srv.url + "/health")
        assert h.status_code == 503 and h.json()["status"] == "failed"
        assert "no such model" in h.json()["error"]
        check_error(post(srv.url + CHAT, json=chat()), 503, None)


def test_engine_fault_500_then_unhealthy(tiny_path, cache_dir):
    """A step that raises fails the requests it touched with 500 (OpenAI's shape, no
    traceback); the server then reports itself unhealthy and refuses generation with 503,
    while the tokenizer routes keep working."""
    from server_util import load_tiny

    h = load_tiny(tiny_path, cache_dir, max_batch=2)

    def broken(*a, **k):
        raise RuntimeError("injected device failure")

    h.runner.submit_decode = broken
    with running(h) as srv:
        r = post(srv.url + CHAT, json=chat(max_tokens=4))
        err = check_error(r, 500, None)
        assert err["type"] == "server_error" and "injected device failure" in err["message"]
        health = get(srv.url + "/health")
        assert health.status_code == 503 and health.json()["status"] == "unhealthy"
        err = check_error(post(srv.url + CHAT, json=chat(max_tokens=4)), 503, None)
        assert err["code"] == "engine_unhealthy"
        assert post(srv.url + "/tokenize", json={"prompt": "hi"}).status_code == 200
        assert "poot_engine_healthy 0.0" in get(srv.url + "/metrics").text


def test_n_beyond_what_the_server_holds_is_400(tiny):
    """A request needing more sequences than running + queue can ever hold is a 400 (a 429
    would promise a retry that can never succeed)."""
    with running(tiny, ServeConfig(served_model_name="tiny", max_queue=0)) as srv:
        err = check_error(post(srv.url + CHAT, json=chat(n=9, max_tokens=2)), 400, "n")
        assert "at most 8" in err["message"]
        assert post(srv.url + CHAT, json=chat(n=8, max_tokens=2)).status_code == 200
