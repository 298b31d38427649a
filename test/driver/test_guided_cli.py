"""``poot generate`` with a constraint: --json-schema / --regex / --grammar on the tiny GGUF
fixture (it has a tokenizer), and each kind of bad constraint refused as one ``poot: error:``
line before anything is compiled."""

from __future__ import annotations

import json
import os
import re

import pytest

from test_cli_errors import GGUF, poot, user_error

jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("llguidance")

SCHEMA = {"type": "object", "properties": {"id": {"type": "string", "pattern": "^[a-z]{3}$"},
                                           "n": {"type": "integer", "minimum": 1,
                                                 "maximum": 50}},
          "required": ["id", "n"], "additionalProperties": False}


def _env(cache):
    return {**os.environ, "POOT_CACHE_DIR": str(cache)}


def test_json_schema_regex_and_grammar_from_the_command_line(tmp_path):
    f = tmp_path / "s.json"
    f.write_text(json.dumps(SCHEMA))
    g = tmp_path / "g.lark"
    g.write_text('start: "x=" /[0-9]{2}/ ";"\n')
    base = ["generate", "--model", GGUF, "--prompt", "hi", "--max-tokens", "80", "--json",
            "-q", "--kv-capacity", "128"]
    for extra, check in ((["--json-schema", f], lambda t: jsonschema.validate(json.loads(t),
                                                                              SCHEMA)),
                         (["--regex", "[a-z]{2}-[0-9]{3}", "--temperature", "1", "--seed",
                           "3"], lambda t: re.fullmatch("[a-z]{2}-[0-9]{3}", t) or 1 / 0),
                         (["--grammar", g], lambda t: re.fullmatch("x=[0-9]{2};", t) or 1 / 0)):
        rc, out, err = poot(*base, *extra, env=_env(tmp_path / "cache"))
        assert rc == 0, err
        res = json.loads(out)
        assert res["stats"]["finish_reason"] == "stop", res
        check(res["text"])


@pytest.mark.parametrize("make,needles", [
    (lambda d: ["--json-schema", d / "missing.json"], ["--json-schema", "cannot be read"]),
    (lambda d: ["--json-schema", _write(d, "bad.json", '{"type": ')], ["not valid JSON"]),
    (lambda d: ["--json-schema", _write(d, "ni.json", '{"type": "array", "uniqueItems": true}')],
     ["uniqueItems"]),
    (lambda d: ["--json-schema", _write(d, "fmt.json", '{"type": "string", "format": "zz"}')],
     ["zz"]),
    (lambda d: ["--regex", "[a-z"], ["regex", "unclosed"]),
    (lambda d: ["--grammar", _write(d, "g.lark", "start: nope\n")], ["nope"]),
    (lambda d: ["--json-object", "--ignore-eos"], ["--ignore-eos"]),
])
def test_bad_constraints_are_one_line_errors_before_compiling(tmp_path, make, needles):
    cache = tmp_path / "cache"
    rc, _, err = poot("generate", "--model", GGUF, "--prompt", "hi", "--max-tokens", "16",
                      *make(tmp_path), env=_env(cache))
    user_error(rc, err, *needles)
    compiled = [p for p in cache.rglob("*") if p.is_file()] if cache.exists() else []
    assert not [p for p in compiled if p.suffix in (".so", ".bin", ".json")], compiled


def _write(d, name, text):
    p = d / name
    p.write_text(text)
    return p
