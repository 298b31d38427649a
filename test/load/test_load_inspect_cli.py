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


@pytest.mark.skipif(not os.path.isdir(os.path.join(FIXTURES, "deepseek_v2_lite_gguf")),
                    reason="test/fixtures/tiny not present")
@pytest.mark.parametrize("hf,gguf", [("llama", "llama_gguf_q4_1"),
                                     ("deepseek_v2_lite", "deepseek_v2_lite_gguf")])
def test_inspect_resolves_the_same_family_options_from_hf_and_gguf(hf, gguf):
    """The family section is what the family resolves (head dims, KV heads, MLA ranks,
    experts and routing), so a GGUF and the HF folder it was converted from agree on it."""
    a = inspect_model(os.path.join(FIXTURES, hf))["family"]["options"]
    b = inspect_model(os.path.join(FIXTURES, gguf, "model.gguf"))["family"]["options"]
    for key in ("hidden_size", "num_heads", "num_kv_heads", "head_dim", "num_layers", "moe"):
        assert a[key] == b[key], key
    if hf.startswith("deepseek"):
        assert a["mla"]["kv_lora_rank"] == b["mla"]["kv_lora_rank"] == 32
        assert a["mla"]["v_head_dim"] == b["mla"]["v_head_dim"] == 12
        assert a["moe"]["num_experts"] == 8 and a["moe"]["top_k"] == 2
    assert (a["source"], b["source"]) == ("hf", "gguf")


def test_inspect_names_an_unknown_architecture_without_failing(tmp_path):
    """A config no family serves is reported in the family section; the rest still prints."""
    import shutil

    d = tmp_path / "m"
    shutil.copytree(os.path.join(FIXTURES, "llama"), d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["architectures"] = ["NopeForCausalLM"]
    (d / "config.json").write_text(json.dumps(cfg))
    rep = inspect_model(str(d))
    assert "NopeForCausalLM" in rep["family"]["error"]
    assert rep["tensors"]
