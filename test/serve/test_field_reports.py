"""Field reports from other OpenAI-compatible servers, as tests: a stop string streamed at
temperature 0 leaks none of its pieces; ``logprobs: true`` without ``top_logprobs`` is
accepted; completions with ``echo`` + ``logprobs`` + ``stream`` give valid SSE; log-probs
have OpenAI's exact shape. (SmolLM2's two end tokens: test_smollm2.py.)"""

from __future__ import annotations

import httpx
import openai

from sse import parse_sse

MSG = [{"role": "user", "content": "hello there"}]
CHAT_KEYS = {"token", "logprob", "bytes", "top_logprobs"}
TOP_KEYS = {"token", "logprob", "bytes"}
COMP_KEYS = {"tokens", "token_logprobs", "top_logprobs", "text_offset"}


def post(srv, route, body):
    r = httpx.post(srv.url + route, json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r


def test_stop_string_streamed_leaks_nothing(server):
    base = {"model": "tiny", "messages": MSG, "temperature": 0, "max_tokens": 40,
            "ignore_eos": True}
    text = post(server, "/v1/chat/completions", base).json()["choices"][0]["message"]["content"]
    # a 4-character stop string from the middle of the greedy text (several tokens long)
    at = next(i for i in range(6, len(text) - 4) if "\ufffd" not in text[i:i + 4]
              and text.find(text[i:i + 4]) == i)
    stop = text[at:at + 4]
    r = post(server, "/v1/chat/completions", {**base, "stream": True, "stop": stop,
                                              "logprobs": True})
    events = parse_sse(r.text)
    deltas = [e["choices"][0]["delta"].get("content") or "" for e in events]
    streamed = "".join(deltas)
    assert streamed == text[:at]
    assert events[-1]["choices"][0]["finish_reason"] == "stop"
    # no piece of the stop string in any chunk's content or log-prob tokens past the cut
    lp_tokens = [c["token"] for e in events if e["choices"][0].get("logprobs")
                 for c in e["choices"][0]["logprobs"]["content"]]
    # at most the token cut by it; U+FFFD left out on both sides (a byte token that is part
    # of a multi-byte character shows as one U+FFFD per token, the streamed text as one)
    clean = lambda t: t.replace("\ufffd", "")  # noqa: E731
    assert len(clean("".join(lp_tokens))) <= len(clean(streamed)) + 3
    whole = post(server, "/v1/chat/completions", {**base, "stop": stop}).json()
    assert whole["choices"][0]["message"]["content"] == text[:at]


def test_logprobs_true_without_top_logprobs(server):
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    r = c.chat.completions.create(model="tiny", messages=MSG, logprobs=True, max_tokens=6,
                                  temperature=0, extra_body={"ignore_eos": True})
    content = r.choices[0].logprobs.content
    assert len(content) == 6
    assert all(e.top_logprobs == [] and e.logprob <= 0 for e in content)


def _check_chat_logprobs(lp: dict, k: int) -> None:
    assert set(lp) == {"content", "refusal"} and lp["refusal"] is None
    for e in lp["content"]:
        assert set(e) == CHAT_KEYS, e
        assert isinstance(e["token"], str) and isinstance(e["logprob"], float)
        assert e["logprob"] <= 0
        assert isinstance(e["bytes"], list) and all(0 <= b < 256 for b in e["bytes"])
        assert len(e["top_logprobs"]) == k
        for t in e["top_logprobs"]:
            assert set(t) == TOP_KEYS, t
            assert isinstance(t["logprob"], float) and t["logprob"] <= 0
        lps = [t["logprob"] for t in e["top_logprobs"]]
        assert lps == sorted(lps, reverse=True)
        if k:
            # greedy: the chosen token is the most likely one
            assert e["top_logprobs"][0]["token"] == e["token"]
            assert abs(e["top_logprobs"][0]["logprob"] - e["logprob"]) < 1e-5


def test_chat_logprobs_exact_shape(server):
    body = {"model": "tiny", "messages": MSG, "temperature": 0, "max_tokens": 8,
            "ignore_eos": True, "logprobs": True, "top_logprobs": 3}
    whole = post(server, "/v1/chat/completions", body).json()
    lp = whole["choices"][0]["logprobs"]
    _check_chat_logprobs(lp, 3)
    assert len(lp["content"]) == 8
    events = parse_sse(post(server, "/v1/chat/completions", {**body, "stream": True}).text)
    streamed = []
    for e in events:
        ch = e["choices"][0]
        if ch.get("logprobs") is not None:
            _check_chat_logprobs(ch["logprobs"], 3)
            streamed += ch["logprobs"]["content"]
    assert streamed == lp["content"]
    # no log-probs asked: null
    plain = post(server, "/v1/chat/completions", {**body, "logprobs": False,
                                                  "top_logprobs": None}).json()
    assert plain["choices"][0]["logprobs"] is None


def _check_completion_logprobs(lp: dict, k: int, text: str) -> None:
    assert set(lp) == COMP_KEYS, lp
    n = len(lp["tokens"])
    assert all(len(lp[key]) == n for key in COMP_KEYS)
    assert lp["text_offset"] == sorted(lp["text_offset"])
    assert all(0 <= o <= len(text) for o in lp["text_offset"])
    for t, tl, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
        assert isinstance(t, str)
        if tl is None:
            assert top is None                  # an echoed prompt token
        else:
            assert tl <= 0 and isinstance(top, dict) and len(top) <= k
            assert all(isinstance(v, float) and v <= 0 for v in top.values())


def test_completions_echo_logprobs_stream_valid_sse(server, tiny):
    body = {"model": "tiny", "prompt": "Once upon a time", "temperature": 0, "max_tokens": 10,
            "ignore_eos": True, "echo": True, "logprobs": 2}
    whole = post(server, "/v1/completions", body).json()["choices"][0]
    assert whole["text"].startswith("Once upon a time")
    _check_completion_logprobs(whole["logprobs"], 2, whole["text"])
    n_prompt = len(tiny.encode("Once upon a time"))
    assert whole["logprobs"]["token_logprobs"][:n_prompt] == [None] * n_prompt
    assert len(whole["logprobs"]["tokens"]) == n_prompt + 10
    r = post(server, "/v1/completions", {**body, "stream": True,
                                         "stream_options": {"include_usage": True}})
    assert r.headers["content-type"].startswith("text/event-stream")
    events = parse_sse(r.text)
    assert events[0]["choices"][0]["text"] == "Once upon a time"
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 10
    text = "".join(e["choices"][0]["text"] for e in events if e["choices"])
    assert text == whole["text"]
    merged = {k: [] for k in COMP_KEYS}
    for e in events:
        if e["choices"] and e["choices"][0]["logprobs"]:
            for k in COMP_KEYS:
                merged[k] += e["choices"][0]["logprobs"][k]
    assert merged == whole["logprobs"]
    # the openai client reads the same stream
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    parts = list(c.completions.create(model="tiny", prompt="Once upon a time", temperature=0,
                                      max_tokens=10, echo=True, logprobs=2, stream=True,
                                      extra_body={"ignore_eos": True}))
    assert "".join(p.choices[0].text for p in parts) == whole["text"]


def test_completions_logprobs_shape_without_echo(server):
    body = {"model": "tiny", "prompt": "hello", "temperature": 0, "max_tokens": 6,
            "ignore_eos": True, "logprobs": 0}
    ch = post(server, "/v1/completions", body).json()["choices"][0]
    _check_completion_logprobs(ch["logprobs"], 0, ch["text"])
    assert len(ch["logprobs"]["tokens"]) == 6 and ch["logprobs"]["text_offset"][0] == 0
