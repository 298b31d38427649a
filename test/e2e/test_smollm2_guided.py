"""Guided decoding on SmolLM2 (CPU): 23 JSON schemas (nested objects, arrays with bounds,
enums, anyOf, required fields, string patterns, numbers with ranges), each at temperature 0
and at temperature 1 with a seed, all batched; every output is checked with the
``jsonschema`` library (independent of llguidance). A regex and a grammar case, and a batch
mixing constrained and unconstrained requests (the unconstrained ones get exactly their
unconstrained tokens)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("llguidance")

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))

from engine_cases import alone, staggered  # noqa: E402
from guided_schemas import CASES  # noqa: E402
from poot.api import LLM  # noqa: E402
from poot.sampling_params import Guide  # noqa: E402
from poot.sampling_params import SamplingParams  # noqa: E402


def _chat(q):
    return [{"role": "user", "content": q}]


def test_schemas_validate_at_temperature_0_and_1(smollm2):
    assert len(CASES) >= 20
    prompts, params = [], []
    for i, (q, schema) in enumerate(CASES):
        for t in (0.0, 1.0):
            prompts.append(_chat(q))
            # the schemas bound every string (maxLength) and array, but a greedy run may
            # fill them with multi-token characters (emoji, up to 4 byte tokens each)
            params.append(SamplingParams(temperature=t, seed=1000 + i, max_tokens=200,
                                         guided=Guide.json_schema(schema)))
    outs = LLM(handle=smollm2).generate(prompts, params)
    failures = []
    for p, o in zip(params, outs):
        try:
            if o.finish_reason != "stop":
                raise ValueError(f"finished by {o.finish_reason}")
            jsonschema.validate(json.loads(o.text), p.guided.spec)
        except (ValueError, jsonschema.ValidationError) as e:
            failures.append((p.temperature, p.guided.spec, o.text, str(e)[:200]))
    assert not failures, failures
    # properties come in the schema's order (the schema is not re-sorted)
    first = json.loads(outs[0].text)
    assert list(first) == list(CASES[0][1]["properties"])


def test_regex_and_grammar(smollm2):
    rx = r"(19|20)[0-9]{2}"
    lark = ('start: answer "."\n'
            'answer: "The answer is " ("yes" | "no")\n')
    gbnf = 'root ::= "(" [0-9] [0-9]? " + " [0-9] [0-9]? ")"\n'
    cases = [(_chat("In which year did the Apollo 11 mission land on the moon?"),
              Guide.regex(rx), rx),
             (_chat("Is water wet? Answer yes or no."), Guide.grammar(lark),
              r"The answer is (yes|no)\."),
             (_chat("Write a sum of two small numbers."), Guide.grammar(gbnf),
              r"\([0-9]{1,2} \+ [0-9]{1,2}\)")]
    params = [SamplingParams(temperature=t, seed=5, max_tokens=40, guided=g)
              for _, g, _ in cases for t in (0.0, 1.0)]
    outs = LLM(handle=smollm2).generate([c[0] for c in cases for _ in (0, 1)], params)
    for (_, g, want), o in zip([c for c in cases for _ in (0, 1)], outs):
        assert o.finish_reason == "stop" and re.fullmatch(want, o.text), (g.spec, o.text)
    assert outs[0].text == "1969"       # greedy SmolLM2 knows this one


def test_mixed_batch_unconstrained_rows_are_exact(smollm2):
    """Guided and unconstrained requests arriving staggered: every request (constrained or
    not) gets exactly the tokens it gets alone; the unconstrained ones are also what they
    get with no guided request around (alone runs use the plain sampler)."""
    eng = smollm2.engine
    texts = ["The capital of Japan is", "Write a haiku about the sea.", "def add(a, b):",
             "The three primary colors are"]
    items = []
    for i, (q, schema) in enumerate(CASES[:4]):
        items.append((smollm2.encode(_chat(q)),
                      SamplingParams(temperature=0.0 if i % 2 == 0 else 0.8, seed=i,
                                     max_tokens=60, guided=Guide.json_schema(schema))))
        items.append((smollm2.encode(texts[i]),
                      SamplingParams(temperature=0.0 if i % 2 == 0 else 0.8, seed=i,
                                     top_p=0.9, max_tokens=24, ignore_eos=True)))
    want = [alone(eng, ids, sp) for ids, sp in items]
    got = staggered(eng, items, every=2)
    assert eng.stats().max_decode_batch >= 4
    for rid, w in zip(got["ids"], want):
        assert got["final"][rid].output_ids == w, rid
