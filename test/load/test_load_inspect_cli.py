"""``poot inspect``: a malformed file is one ``poot: error:`` line and exit 2; valid
checkpoints print their config and tensors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from broken import GGUFSpec

from poot.cli.inspect_cmd import inspect_model

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures", "tiny")


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "poot.cli", "inspect", *args],
                          capture_output=True, text=True, timeout=60)


def test_cli_malformed_gguf_is_one_error_line(tmp_path):
    bad = GGUFSpec(tensor_count=1 << 62).write(tmp_path / "bad.gguf")
    r = _run(bad)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("poot: error:"), r.stderr
    assert "bad.gguf: tensor_count:" in lines[0]
    assert "Traceback" not in r.stderr and r.stdout == ""


def test_cli_valid_gguf_json(tmp_path):
    ok = GGUFSpec().write(tmp_path / "ok.gguf")
    r = _run(ok, "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["architecture"] == "llama" and rep["config"]["hidden_size"] == 64
    assert [t["format"] for t in rep["tensors"]] == ["f32", "q8_0", "f16"]
    assert rep["resident_bytes"] == 0 and rep["tokenizer"]["vocab_size"] == 64


@pytest.mark.skipif(not os.path.isdir(os.path.join(FIXTURES, "llama")),
                    reason="test/fixtures/tiny not present")
def test_inspect_hf_folder_text():
    rep = inspect_model(os.path.join(FIXTURES, "llama"))
    assert rep["format"] == "safetensors" and rep["architecture"] == "LlamaForCausalLM"
    assert any(t["name"] == "lm_head.weight" for t in rep["tensors"])
