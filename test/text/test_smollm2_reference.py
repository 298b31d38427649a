"""The SmolLM2 GGUF tokenizer against HF transformers' ids (test/reference/smollm2).

Every string of tokenizer_roundtrip.json and every prompt of NN_*.json must encode to the
reference ids exactly and decode back; a few go through the real ``poot tokenize`` CLI in a
subprocess, the rest through the Python API.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from text_helpers import load_json, reference_dir

from poot.text.chat import encode_chat, render_chat

_REF = reference_dir()
_CASES = load_json(_REF / "tokenizer_roundtrip.json")["cases"] if _REF else []
_PROMPTS = sorted(p.name for p in _REF.glob("[0-9][0-9]_*.json")) if _REF else []
# Round-trip strings sent through the CLI subprocess (the rest use the API).
_CLI_CASES = {2, 7, 9, 11}


def _poot(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "poot.cli", *args], capture_output=True,
                          text=True, encoding="utf-8", timeout=60)


@pytest.mark.parametrize("k", range(len(_CASES)), ids=[repr(c["text"])[:24] for c in _CASES])
def test_roundtrip_strings_match_transformers(k, smollm2, smollm2_path):
    case = _CASES[k]
    if k in _CLI_CASES:
        out = _poot("tokenize", "--model", str(smollm2_path), "--json", case["text"])
        assert out.returncode == 0, out.stderr
        got = json.loads(out.stdout)
        ids = got["ids"]
        assert got["tokens"] == case["tokens"]
    else:
        ids = smollm2.encode(case["text"])
    assert ids == case["ids_transformers_gguf"]
    assert smollm2.decode(ids) == case["decoded_transformers"] == case["text"]
    assert [smollm2.id_to_token(i) for i in ids] == case["tokens"]


@pytest.mark.parametrize("name", _PROMPTS)
def test_prompts_match_transformers(name, smollm2, refs):
    ref = load_json(refs / name)
    assert smollm2.encode(ref["prompt_text"]) == ref["prompt_ids"]
    assert smollm2.decode(ref["prompt_ids"]) == ref["prompt_text"]
    # The generated ids decode to transformers' generated_text (special tokens kept).
    assert smollm2.decode(ref["generated_ids"]) == ref["generated_text"]


def test_cli_plain_ids(smollm2_path, refs):
    ref = load_json(refs / "01_english.json")
    out = _poot("tokenize", "--model", str(smollm2_path), ref["prompt_text"])
    assert out.returncode == 0, out.stderr
    assert [int(t) for t in out.stdout.split()] == ref["prompt_ids"]


def test_chat_prompt_reproduced(smollm2, refs):
    """03_chat was built from chat_messages with the GGUF template (default system prompt)."""
    ref = load_json(refs / "03_chat.json")
    kwargs = ref["chat_template_kwargs"]
    assert render_chat(smollm2, ref["chat_messages"], **kwargs) == ref["prompt_text"]
    assert encode_chat(smollm2, ref["chat_messages"], **kwargs) == ref["prompt_ids"]


def test_cli_chat(smollm2_path, refs):
    ref = load_json(refs / "03_chat.json")
    (msg,) = ref["chat_messages"]
    out = _poot("tokenize", "--model", str(smollm2_path), "--chat", "--json", msg["content"])
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["ids"] == ref["prompt_ids"] and got["text"] == ref["prompt_text"]


def test_cli_error_is_one_line(tmp_path):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"nope")
    out = _poot("tokenize", "--model", str(bad), "hi")
    assert out.returncode == 2
    assert out.stderr.startswith("poot: error: ") and out.stderr.count("\n") == 1


def test_checkpoint_facts(smollm2):
    assert (smollm2.bos_id, smollm2.eos_id, smollm2.vocab_size) == (1, 2, 49152)
    assert smollm2.special_ids == frozenset(range(17))
    assert smollm2.encode("Hi", add_special_tokens=True) == smollm2.encode("Hi", add_special_tokens=False)
    # <|im_end|> (EOS, end of turn) and <|endoftext|> (llama.cpp's end-of-generation set).
    assert smollm2.stop_ids == frozenset({0, 2})
    assert smollm2.special_tokens["bos_token"] == "<|im_start|>"
    ids = smollm2.encode("a<|im_end|>b")
    assert ids[1] == 2 and smollm2.decode(ids, skip_special_tokens=True) == "ab"
