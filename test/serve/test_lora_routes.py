"""LoRA over HTTP: ``model`` naming an adapter gives HF + PEFT's greedy tokens for it, next to
the base model; ``/v1/models`` lists adapters; ``/v1/load_lora_adapter`` and
``/v1/unload_lora_adapter`` (vLLM's routes) change them with typed 400/404 errors; ``poot
serve --lora`` option errors are one line."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import httpx
import openai
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))

from model_steps import FIXTURES, fixture_path, reference  # noqa: E402
from poot.serve import ServeConfig  # noqa: E402
from server_util import running  # noqa: E402

LORA = FIXTURES / "llama_lora"


@pytest.fixture(scope="module")
def lora_root(tmp_path_factory) -> Path:
    """The server's --lora-root: a copy of adapter_b."""
    root = tmp_path_factory.mktemp("lora-root")
    shutil.copytree(LORA / "adapter_b", root / "adapter_b")
    return root


@pytest.fixture(scope="module")
def srv(cache_dir, lora_root):
    from poot.api import ModelHandle

    h = ModelHandle.load(fixture_path("llama"), kv_capacity=64, max_batch=4, prefill_chunk=8,
                         cache_dir=cache_dir, max_loras=2, max_lora_rank=8,
                         loras={"a": LORA / "adapter_a"})
    with running(h, ServeConfig(served_model_name="base", runtime_lora=True,
                                lora_root=str(lora_root))) as s:
        yield s


def _complete(s, model):
    c = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)
    ids = [int(x) for x in reference("llama")["prompt_ids"]]
    r = c.completions.create(model=model, prompt=ids, max_tokens=8, temperature=0,
                             extra_body={"ignore_eos": True, "return_token_ids": True})
    return r.choices[0].model_extra.get("token_ids") or r.choices[0].token_ids


def _want(name):
    return [int(x) for x in reference("llama_lora")[f"{name}.greedy_ids"]]


def _post(s, route, body):
    return httpx.post(s.url + route, json=body, timeout=60)


def test_adapters_by_model_name_load_and_unload(srv):
    assert _complete(srv, "a") == _want("adapter_a")
    assert _complete(srv, "base") == [int(x) for x in reference("llama")["greedy_ids"]]
    r = _post(srv, "/v1/load_lora_adapter", {"lora_name": "b", "lora_path": "adapter_b"})
    assert r.status_code == 200, r.text
    ids = [m["id"] for m in httpx.get(srv.url + "/v1/models").json()["data"]]
    assert ids == ["base", "a", "b"]
    assert _complete(srv, "b") == _want("adapter_b")
    r = _post(srv, "/v1/unload_lora_adapter", {"lora_name": "a"})
    assert r.status_code == 200, r.text
    r = _post(srv, "/v1/completions", {"model": "a", "prompt": [1, 2, 3], "max_tokens": 2})
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"
    r = _post(srv, "/v1/unload_lora_adapter", {"lora_name": "a"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "lora_name"


def test_bad_adapters_are_400_naming_the_problem(srv, lora_root):
    r = _post(srv, "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": "missing"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "lora_path"
    d = lora_root / "bad"
    shutil.copytree(LORA / "adapter_a", d)
    cfg = json.loads((d / "adapter_config.json").read_text())
    cfg["r"] = 2                                       # the tensors are rank 4
    (d / "adapter_config.json").write_text(json.dumps(cfg))
    r = _post(srv, "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": str(d)})
    assert r.status_code == 400 and "lora_A.weight" in r.json()["error"]["message"]
    r = _post(srv, "/v1/load_lora_adapter", {"lora_name": "", "lora_path": "adapter_b"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "lora_name"
    r = _post(srv, "/v1/load_lora_adapter", {"lora_name": "base2",
                                             "lora_path": str(fixture_path("phi3"))})
    assert r.status_code == 400 and r.json()["error"]["param"] == "lora_path"


def test_runtime_loading_is_off_by_default(cache_dir):
    from poot.api import ModelHandle

    h = ModelHandle.load(fixture_path("llama"), kv_capacity=64, max_batch=1, prefill_chunk=8,
                         cache_dir=cache_dir, max_loras=1, max_lora_rank=8)
    with running(h, ServeConfig(served_model_name="base")) as s:
        r = _post(s, "/v1/load_lora_adapter", {"lora_name": "a",
                                               "lora_path": str(LORA / "adapter_a")})
        assert r.status_code == 403


@pytest.mark.parametrize("argv,says", [
    (["--lora", "noequals"], "NAME=PATH"),
    (["--lora", "a=x", "--max-loras", "0"], "--max-loras"),
    (["--allow-runtime-lora"], "--max-loras"),
    (["--allow-runtime-lora", "--max-loras", "1"], "--lora-root"),
])
def test_lora_option_errors(argv, says, capsys):
    from poot.cli import main

    assert main(["serve", "--model", str(fixture_path("llama")), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("poot: error:") and says in err[0]
