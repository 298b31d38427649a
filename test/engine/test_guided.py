"""Guided decoding through the engine on the CPU, with the tiny GGUF fixture (random weights,
a 256-token byte-level tokenizer): every constrained output matches its constraint (checked by
``jsonschema`` and ``re``, independent of llguidance), ends by EOS only once the constraint is
complete, and a batch mixing constrained and unconstrained requests gives each the tokens it
gets alone. Malformed and unsupported constraints are typed errors raised before anything
runs."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("llguidance")

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine_cases import alone, prompts, staggered  # noqa: E402
from poot.api import LLM, ModelHandle  # noqa: E402
from poot.sampling_params import Guide, GuidedDecodingError  # noqa: E402
from poot.sampling_params import InvalidRequest, SamplingParams  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "tiny"
GGUF = FIXTURES / "llama_gguf_q4_1" / "model.gguf"

#: Bounded schemas (strings with maxLength, numbers with ranges, arrays with maxItems): the
#: random-weight model's output is complete long before max_tokens.
SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
                                      "age": {"type": "integer", "minimum": 0,
                                              "maximum": 120}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]},
                                      "ok": {"type": "boolean"}},
     "required": ["color", "ok"], "additionalProperties": False},
    {"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 5},
     "minItems": 2, "maxItems": 4},
    {"type": "object", "properties": {"id": {"type": "string", "pattern": "^[a-f0-9]{4}$"},
                                      "v": {"anyOf": [{"type": "null"},
                                                      {"type": "number", "minimum": 0,
                                                       "maximum": 1}]}},
     "required": ["id", "v"], "additionalProperties": False},
    {"type": "object", "properties": {"inner": {
        "type": "object", "properties": {"x": {"type": "integer", "minimum": 1,
                                               "maximum": 9}},
        "required": ["x"], "additionalProperties": False}},
     "required": ["inner"], "additionalProperties": False},
]


@pytest.fixture(scope="module")
def handle(tmp_path_factory):
    return ModelHandle.load(str(GGUF), kv_capacity=128, max_batch=8, prefill_chunk=16,
                            cache_dir=tmp_path_factory.mktemp("poot-cache"))


def _guided(guide, temperature=0.0, seed=None, max_tokens=120, **kw):
    return SamplingParams(temperature=temperature, seed=seed, max_tokens=max_tokens,
                          guided=guide, **kw)


def test_schemas_validate_greedy_and_seeded(handle):
    params = []
    for i, schema in enumerate(SCHEMAS):
        params.append(_guided(Guide.json_schema(schema)))
        params.append(_guided(Guide.json_schema(schema), temperature=1.0, seed=100 + i))
    outs = LLM(handle=handle).generate(["hello"] * len(params), params)
    for p, o in zip(params, outs):
        assert o.finish_reason == "stop", (o.text, p.guided.spec)
        assert o.stop == 2                                    # ended by EOS, once complete
        jsonschema.validate(json.loads(o.text), p.guided.spec)
        assert o.stats.guided_masks == len(o.token_ids) + 1   # one per sampled token
    # the seeded rows are not just the greedy ones
    assert any(outs[2 * i].text != outs[2 * i + 1].text for i in range(len(SCHEMAS)))


def test_json_object_regex_and_grammars(handle):
    lark = 'start: "(" num ("+" num)? ")"\nnum: /[0-9]{1,3}/\n'
    gbnf = 'root ::= "[" word ("," word)? "]"\nword ::= [a-z] [a-z]? [a-z]?\n'
    cases = [(Guide.json_object(), None),
             (Guide.regex(r"[a-z]{3}-[0-9]{2,4}"), r"[a-z]{3}-[0-9]{2,4}"),
             (Guide.grammar(lark), r"\([0-9]{1,3}(\+[0-9]{1,3})?\)"),
             (Guide.grammar(gbnf), r"\[[a-z]{1,3}(,[a-z]{1,3})?\]")]
    # any JSON object is unbounded: a bias towards "}" lets the random model close it
    close = {handle.tokenizer.encode("}", add_special_tokens=False)[0]: 8.0}
    params = [_guided(g, temperature=t, seed=7, logit_bias=close if rx is None else {})
              for g, rx in cases for t in (0.0, 1.0)]
    outs = LLM(handle=handle).generate(["abc"] * len(params), params)
    for (g, rx), o in zip([c for c in cases for _ in (0, 1)], outs):
        assert o.finish_reason == "stop", (g.spec, o.text)
        if rx is None:
            assert isinstance(json.loads(o.text), dict), o.text
        else:
            assert re.fullmatch(rx, o.text), (g.spec, o.text)


def test_cannot_end_before_the_constraint_is_complete(handle):
    """A constraint longer than max_tokens ends by length with a prefix of a valid output;
    EOS (the most likely token after a bias) is never sampled before the end."""
    g = Guide.regex(r"[a-z]{20}")
    o = LLM(handle=handle).generate("x", _guided(g, max_tokens=5, logit_bias={2: 100.0}))[0]
    assert o.finish_reason == "length" and re.fullmatch(r"[a-z]{1,20}", o.text)
    o = LLM(handle=handle).generate("x", _guided(g, max_tokens=40, logit_bias={2: 100.0}))[0]
    assert o.finish_reason == "stop" and re.fullmatch(r"[a-z]{20}", o.text)


def test_mixed_batch_gives_each_request_its_alone_tokens(handle):
    """Constrained and unconstrained requests arriving staggered (so the batch's sampler
    changes between guided and plain): every one gets exactly its alone tokens."""
    eng = handle.engine
    ps = prompts(handle.runner.vocab, 8, seed=5, lo=3, hi=12)
    sps = []
    for i in range(8):
        if i % 2:
            sps.append(_guided(Guide.json_schema(SCHEMAS[i % len(SCHEMAS)]),
                               temperature=0.0 if i % 4 == 1 else 0.8, seed=i))
        else:
            sps.append(SamplingParams(temperature=0.0 if i % 4 == 0 else 0.9, seed=i,
                                      top_p=0.9, max_tokens=24, ignore_eos=True))
    want = [alone(eng, p, sp) for p, sp in zip(ps, sps)]
    got = staggered(eng, list(zip(ps, sps)), every=2)
    assert eng.stats().max_decode_batch >= 4
    for rid, w in zip(got["ids"], want):
        assert got["final"][rid].output_ids == w, rid
    assert eng.blocks.stats().used == 0


def test_mask_applies_before_bias_penalties_and_logprobs(handle):
    """A logit bias of +100 on a disallowed token, penalties and log-probs: the output still
    matches; the top log-probs list only allowed tokens, so they are digits here."""
    tok = handle.tokenizer
    digits = {tok.encode(str(d), add_special_tokens=False)[0] for d in range(10)}
    a = tok.encode("a", add_special_tokens=False)[0]
    sp = _guided(Guide.regex(r"[0-9]{6}"), temperature=0.7, seed=3, logit_bias={a: 100.0},
                 repetition_penalty=1.3, presence_penalty=0.5, logprobs=5)
    o = LLM(handle=handle).generate("zz", sp)[0]
    assert re.fullmatch(r"[0-9]{6}", o.text) and o.finish_reason == "stop"
    for lp in o.logprobs:
        assert lp.logprob <= 0.0 and np.isfinite(lp.logprob)
        assert {i for i, _ in lp.top} <= digits | set(tok.stop_ids), lp.top
        assert len(lp.top) >= 1


def test_preempted_guided_request_resumes_its_constraint(tmp_path):
    """A pool so small that requests are preempted and recomputed: the guided outputs still
    validate and equal their alone runs (the matcher keeps its state across preemption)."""
    h = ModelHandle.load(str(GGUF), kv_capacity=64, max_batch=8, prefill_chunk=16,
                         kv_blocks=4, cache_dir=tmp_path)
    eng = h.engine
    ps = prompts(h.runner.vocab, 8, seed=9, lo=18, hi=24)
    sps = [_guided(Guide.json_schema(SCHEMAS[1 + i % 2]), temperature=0.5, seed=i,
                   max_tokens=40) for i in range(8)]
    want = [alone(eng, p, sp) for p, sp in zip(ps, sps)]
    got = staggered(eng, list(zip(ps, sps)), every=1)
    for (rid, w), sp in zip(zip(got["ids"], want), sps):
        out = got["final"][rid]
        assert out.output_ids == w
        if out.finish_reason == "stop":
            jsonschema.validate(json.loads(out.output_text), sp.guided.spec)
    assert eng.preemptions > 0
    assert sum(got["final"][r].finish_reason == "stop" for r in got["ids"]) >= 2


# ---- typed errors, before anything runs ------------------------------------------------------
BAD = [
    (lambda: Guide.json_schema('{"type": "object",'), "not valid JSON"),
    (lambda: Guide.json_schema([1, 2]), "must be a JSON object"),
    (lambda: Guide("xml", "<a/>"), "kind must be one of"),
    (lambda: Guide.regex(""), "non-empty"),
    (lambda: Guide.json_schema({"type": "string", "description": "x" * (1 << 20)}),
     "exceeds"),
    (lambda: Guide.regex("\ud83d"), "lone surrogate U\\+D83D"),
    (lambda: Guide.grammar('start: "\udfff"'), "lone surrogate"),
]
UNHONORED = [
    (Guide.regex(r"[^\s\S]"), "allows no output"),
    (Guide.json_schema({"not": {"type": "string"}}), "not"),
    (Guide.json_schema({"type": "array", "uniqueItems": True}), "uniqueItems"),
    (Guide.json_schema({"if": {"type": "string"}, "then": {"minLength": 2}}), "if"),
    (Guide.json_schema({"type": "string", "format": "no-such-format"}), "no-such-format"),
    (Guide.json_schema({"type": "strin"}), "strin"),
    (Guide.json_schema({"type": "integer", "minimum": 5, "maximum": 2}), "minimum"),
    (Guide.json_schema({"$ref": "http://example.com/s.json"}), "example.com"),
    (Guide.regex("[a-z"), "unclosed"),
    (Guide.regex("(?<=a)b"), "look"),
    (Guide.grammar("start: foo"), "foo"),
    (Guide.grammar('root ::= "a" bar'), "bar"),
]


@pytest.mark.parametrize("make,match", BAD)
def test_malformed_guides_are_typed_errors(make, match):
    with pytest.raises(GuidedDecodingError, match=match):
        make()


@pytest.mark.parametrize("guide,feature", UNHONORED)
def test_unhonored_constraints_are_refused_at_add_request(handle, guide, feature):
    eng = handle.engine
    compiled = dict(handle.runner.compile_s)
    with pytest.raises(GuidedDecodingError) as e:
        eng.add_request([5, 6, 7], _guided(guide))
    assert feature in str(e.value) and isinstance(e.value, InvalidRequest)
    assert not eng.has_unfinished() and handle.runner.compile_s == compiled


def test_a_constraint_that_fails_while_running_ends_its_request_only(handle):
    """``a{1000000}`` compiles and gives a first mask, then llguidance's lexer runs past its
    limit at the first token: that request finishes with reason "error" and an error that
    says so (GUIDED_ERROR, one line); a request beside it is untouched."""
    from poot.engine.output_processor import GUIDED_ERROR

    eng = handle.engine
    plain = SamplingParams(temperature=0, max_tokens=6)
    alone = [t for ev in eng.generate([5, 6, 7], plain) for t in ev.token_ids]
    bad = eng.add_request([5, 6, 7], _guided(Guide.regex("a{1000000}"), max_tokens=6))
    good = eng.add_request([5, 6, 7], plain)
    events = eng.run_until_done()
    last = {e.request_id: e for e in events if e.finished}
    assert last[bad].finish_reason == "error"
    assert last[bad].error.startswith(GUIDED_ERROR) and "\n" not in last[bad].error
    assert [t for e in events if e.request_id == good for t in e.token_ids] == alone
    assert eng.fault is None


def test_a_constraint_that_cannot_be_completed_is_an_error_not_a_stop(handle):
    """A grammar whose ``NUM`` matches no text (the intersection ``&/[9]R/`` is empty):
    after "x" llguidance's mask allows only EOS although the grammar is incomplete (found
    by fuzz_guided). The request finishes with reason "error", not "stop" with text that
    does not match the grammar; a request beside it is untouched."""
    from poot.engine.output_processor import GUIDED_ERROR

    eng = handle.engine
    plain = SamplingParams(temperature=0, max_tokens=6)
    alone = [t for ev in eng.generate([5, 6, 7], plain) for t in ev.token_ids]
    bad = eng.add_request([5, 6, 7], _guided(Guide.grammar('start: "x" NUM\nNUM: &/[9]R/\n'),
                                              max_tokens=6))
    good = eng.add_request([5, 6, 7], plain)
    events = eng.run_until_done()
    last = {e.request_id: e for e in events if e.finished}
    assert last[bad].finish_reason == "error", last[bad]
    assert last[bad].error.startswith(GUIDED_ERROR) and "cannot be completed" in last[bad].error
    assert "\n" not in last[bad].error
    assert "".join(e.text for e in events if e.request_id == bad) == "x"
    assert [t for e in events if e.request_id == good for t in e.token_ids] == alone
    assert eng.fault is None


def test_guided_parameter_checks():
    with pytest.raises(InvalidRequest, match="ignore_eos"):
        SamplingParams(guided=Guide.json_object(), ignore_eos=True)
    with pytest.raises(InvalidRequest, match="guided"):
        SamplingParams(guided="json")
    sp = SamplingParams.from_dict({"guided": {"kind": "regex", "spec": "[0-9]+"}})
    assert sp.guided == Guide.regex("[0-9]+")
    with pytest.raises(InvalidRequest, match="guided"):
        SamplingParams.from_dict({"guided": {"type": "regex"}})


def test_a_model_without_tokenizer_refuses_guided(tmp_path):
    h = ModelHandle.load(str(FIXTURES / "llama"), kv_capacity=64, max_batch=2,
                         cache_dir=tmp_path, warm_up=False)
    assert h.tokenizer is None
    with pytest.raises(GuidedDecodingError, match="tokenizer"):
        h.engine.add_request([5, 6], _guided(Guide.json_object(), max_tokens=8))
