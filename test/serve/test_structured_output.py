"""Structured output through the server (tiny fixture, random weights, byte-level
tokenizer): OpenAI's ``response_format`` (``json_object``, ``json_schema``) and vLLM's
``guided_json`` / ``guided_regex`` / ``guided_choice`` / ``guided_grammar``, streamed or not,
on chat and completions, through the official ``openai`` client. Every output is checked
against its constraint by an independent checker (``jsonschema``, ``re``), never by
llguidance. A constrained request next to unconstrained ones leaves their tokens as they are
alone. Malformed, conflicting and unsupported constraints are 400s naming the field."""

from __future__ import annotations

import json
import re
import threading

import httpx
import pytest

jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("llguidance")

from sse import parse_sse  # noqa: E402
from test_errors import CHAT, COMP, chat, check_error, comp  # noqa: E402

PERSON = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 8},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}
FLAGS = {"type": "array", "items": {"enum": ["on", "off"]}, "minItems": 1, "maxItems": 3}
#: choices with regex meta characters: each must come back verbatim
CHOICES = ["a.b", "x|y", "(c)", "1+1", "d e"]
SUM = 'start: "(" NUM ("+" NUM)* ")"\nNUM: /[0-9]{1,3}/\n'
SUM_RE = r"\([0-9]{1,3}(\+[0-9]{1,3})*\)"


def _openai(server):
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)


def _post(server, route, body) -> httpx.Response:
    # json.dumps escapes non-ASCII (lone surrogates included) as httpx's json= does not
    return httpx.post(server.url + route, content=json.dumps(body), timeout=120,
                      headers={"content-type": "application/json"})


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_response_format_json_schema_chat(server, temperature):
    client = _openai(server)
    r = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "a person"}], max_tokens=100,
        temperature=temperature, seed=7, n=2,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "person", "schema": PERSON, "strict": True}})
    assert len(r.choices) == 2
    for c in r.choices:
        assert c.finish_reason == "stop", c
        jsonschema.validate(json.loads(c.message.content), PERSON)


def test_response_format_json_object_streamed(server):
    # a random-weight model samples at temperature 0.8: the seed is one whose object closes
    # within max_tokens (under the int16 default; seed 3 did under int8)
    client = _openai(server)
    stream = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "json"}], max_tokens=100,
        temperature=0.8, seed=2, stream=True,
        response_format={"type": "json_object"},
        extra_body={"guided_whitespace_pattern": r"[ ]?"})
    parts, reasons = [], []
    for chunk in stream:
        for c in chunk.choices:
            parts.append(c.delta.content or "")
            reasons.append(c.finish_reason)
    text = "".join(parts)
    assert reasons[-1] == "stop"
    assert isinstance(json.loads(text), dict)
    assert "\n" not in text and "  " not in text      # whitespace bounded to one space


def test_guided_json_on_completions_streamed_and_not(server):
    body = comp(prompt="flags:", max_tokens=60, temperature=0.0, guided_json=json.dumps(FLAGS))
    r = _post(server, COMP, body)
    assert r.status_code == 200, r.text
    text = r.json()["choices"][0]["text"]
    jsonschema.validate(json.loads(text), FLAGS)
    s = _post(server, COMP, {**body, "stream": True})
    events = parse_sse(s.text)
    assert "".join(e["choices"][0]["text"] for e in events if e["choices"]) == text


def test_guided_regex_and_choice(server):
    client = _openai(server)
    for seed in range(3):
        r = client.completions.create(model="tiny", prompt="date:", max_tokens=40, seed=seed,
                                      temperature=1.0,
                                      extra_body={"guided_regex": r"20[0-9]{2}-[01][0-9]"})
        assert re.fullmatch(r"20[0-9]{2}-[01][0-9]", r.choices[0].text), r.choices[0].text
        assert r.choices[0].finish_reason == "stop"
    seen = set()
    for seed in range(6):
        r = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "pick"}], max_tokens=20,
            temperature=1.0, seed=seed, extra_body={"guided_choice": CHOICES})
        assert r.choices[0].message.content in CHOICES
        seen.add(r.choices[0].message.content)
    assert seen      # (random weights: which choices come is not asserted)


@pytest.mark.parametrize("grammar", [SUM, 'root ::= "(" num ("+" num)* ")"\n'
                                          'num ::= [0-9] | [0-9] [0-9] | [0-9] [0-9] [0-9]\n'])
def test_guided_grammar_lark_and_gbnf(server, grammar):
    client = _openai(server)
    for seed in range(2):
        r = client.completions.create(model="tiny", prompt="sum:", max_tokens=40, seed=seed,
                                      temperature=1.0, extra_body={"guided_grammar": grammar})
        c = r.choices[0]
        if c.finish_reason == "stop":
            assert re.fullmatch(SUM_RE, c.text), c.text
        else:    # cut by max_tokens: a prefix of a sentence of the grammar
            assert c.finish_reason == "length" and re.fullmatch(r"\([0-9+]*", c.text), c


def test_guided_request_leaves_its_neighbours_tokens_alone(server):
    """Unconstrained requests running beside a constrained one get their tokens alone."""
    plain = [comp(prompt=p, max_tokens=12, temperature=t, seed=5)
             for p, t in (("hello", 0.0), ("abc", 1.0))]
    alone = [_post(server, COMP, b).json()["choices"][0]["text"] for b in plain]
    guided = comp(prompt="x", max_tokens=100, temperature=1.0, seed=1,
                  guided_json=PERSON)
    results: dict[int, str] = {}

    def run(i, body):
        results[i] = _post(server, COMP, body).json()["choices"][0]["text"]

    threads = [threading.Thread(target=run, args=(i, b))
               for i, b in enumerate([guided, *plain])]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    jsonschema.validate(json.loads(results[0]), PERSON)
    assert [results[1], results[2]] == alone


BAD_GUIDED = [
    (CHAT, chat(response_format={"type": "json_schema"}), "response_format.json_schema"),
    (CHAT, chat(response_format={"type": "json_schema", "json_schema": {"name": "x"}}),
     "response_format.json_schema"),
    (CHAT, chat(response_format={"type": "json_schema",
                                 "json_schema": {"name": "x", "schema": [1]}}),
     "response_format.json_schema.schema"),
    (CHAT, chat(response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "integer", "minimum": 5, "maximum": 2}}}),
     "response_format.json_schema.schema"),
    (CHAT, chat(response_format={"type": "yaml"}), "response_format.type"),
    (CHAT, chat(guided_json="{not json"), "guided_json"),
    (CHAT, chat(guided_json=5), "guided_json"),
    (CHAT, chat(guided_json={"$ref": "http://example.com/s.json"}), "guided_json"),
    (CHAT, chat(guided_regex="[a-z"), "guided_regex"),
    (CHAT, chat(guided_regex="(?<=a)b"), "guided_regex"),
    (CHAT, chat(guided_regex=""), "guided_regex"),
    (CHAT, chat(guided_choice=[]), "guided_choice"),
    (CHAT, chat(guided_choice="a"), "guided_choice"),
    (CHAT, chat(guided_choice=["a", ""]), "guided_choice"),
    (CHAT, chat(guided_grammar="start: foo"), "guided_grammar"),
    (CHAT, chat(guided_grammar='root ::= "a" bar'), "guided_grammar"),
    (CHAT, chat(guided_json={"type": "object"}, guided_regex="a+"), "guided_regex"),
    (CHAT, chat(response_format={"type": "json_object"}, guided_choice=["a"]),
     "guided_choice"),
    (CHAT, chat(guided_regex="a+", guided_decoding_backend="magic"),
     "guided_decoding_backend"),
    (CHAT, chat(guided_regex="a+", guided_decoding_backend={"x": 1}),
     "guided_decoding_backend"),
    (CHAT, chat(guided_json={"type": "object", "x-guidance": 5},
                guided_whitespace_pattern=" "), "guided_json"),
    (CHAT, chat(guided_json={"type": "object"}, guided_whitespace_pattern=5),
     "guided_whitespace_pattern"),
    (CHAT, chat(guided_whitespace_pattern=" "), "guided_whitespace_pattern"),
    (CHAT, chat(guided_regex="a+", guided_whitespace_pattern=" "),
     "guided_whitespace_pattern"),
    (CHAT, chat(response_format={"type": "json_object"}, ignore_eos=True), "ignore_eos"),
    (COMP, comp(guided_regex="(?<=a)b"), "guided_regex"),
    (COMP, comp(guided_regex=r"[^\s\S]"), "guided_regex"),       # allows no output at all
    (CHAT, chat(guided_regex="\ud83d"), "guided_regex"),           # a lone surrogate
    (CHAT, chat(guided_grammar='start: "\ud83d"'), "guided_grammar"),
    (CHAT, chat(guided_choice=["a", "\udfff"]), "guided_choice"),
    (COMP, comp(guided_json={"type": "string", "minLength": 3, "maxLength": 1}),
     "guided_json"),
]


@pytest.mark.parametrize("route,body,param", BAD_GUIDED)
def test_malformed_constraints_are_400_naming_the_field(server, route, body, param):
    check_error(_post(server, route, body), 400, param)


def test_a_malformed_constraint_compiles_nothing_and_leaves_the_server_serving(server):
    runner = server.state.handle.runner
    before = dict(runner.compile_s)
    check_error(_post(server, CHAT, chat(guided_regex="(?<=a)b")), 400, "guided_regex")
    assert runner.compile_s == before
    r = _post(server, CHAT, chat(max_tokens=4, guided_choice=["yes", "no"]))
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] in ("yes",
                                                                                      "no")


def test_a_constraint_that_fails_while_it_runs_is_the_requests_400(server):
    """``a{1000000}`` passes admission and its first mask, then llguidance's lexer runs past
    its limit at the first token: a 400 naming the field (streamed: an error event), not an
    engine fault; the server stays healthy."""
    body = chat(max_tokens=8, guided_regex="a{1000000}")
    err = check_error(_post(server, CHAT, body), 400, "guided_regex")
    assert err["code"] == "guided_decoding_failed" and "\n" not in err["message"]
    events = parse_sse(_post(server, CHAT, {**body, "stream": True}).text)
    assert events[-1]["error"]["param"] == "guided_regex"
    assert httpx.get(server.url + "/health").status_code == 200
    r = _post(server, CHAT, chat(max_tokens=4, guided_choice=["yes", "no"]))
    assert r.status_code == 200
