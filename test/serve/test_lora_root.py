"""Runtime LoRA loading reads only inside ``--lora-root`` (module
:mod:`poot.serve.lora_files`): a path outside it -- absolute, through ``..``, through a
symlink -- gets the same error as a path that does not exist; a FIFO is refused without
blocking, ``/dev/zero`` without being read, a file past the size limit without being read;
errors never quote a file's contents; ``--allow-runtime-lora`` without ``--api-key`` logs
one warning line."""

from __future__ import annotations

import json
import logging
import os
import shutil
import struct
import sys
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))

from model_steps import FIXTURES, fixture_path  # noqa: E402
from poot.serve import ServeConfig  # noqa: E402
from server_util import running  # noqa: E402

LORA = FIXTURES / "llama_lora"
SECRET = "SECRET-7f3a9"
#: the size limit of the served adapter files (adapter_b's tensors are 53696 bytes)
LIMIT = 100_000


@pytest.fixture(scope="module")
def handle(cache_dir):
    from poot.api import ModelHandle

    return ModelHandle.load(fixture_path("llama"), kv_capacity=64, max_batch=1,
                            prefill_chunk=8, cache_dir=cache_dir, max_loras=1,
                            max_lora_rank=8)


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """``root/`` (the LoRA root, holding a copy of adapter_b) beside ``outside/`` (a valid
    adapter the server must not read)."""
    base = tmp_path_factory.mktemp("lora-tree")
    shutil.copytree(LORA / "adapter_b", base / "root" / "good")
    shutil.copytree(LORA / "adapter_b", base / "outside")
    return base


@pytest.fixture(scope="module")
def srv(handle, tree):
    cfg = ServeConfig(served_model_name="base", runtime_lora=True,
                      lora_root=str(tree / "root"), max_lora_bytes=LIMIT)
    with running(handle, cfg) as s:
        yield s


def _load(s, path: str, name: str = "x") -> httpx.Response:
    return httpx.post(s.url + "/v1/load_lora_adapter", json={"lora_name": name,
                                                             "lora_path": path}, timeout=30)


def _unload(s, name: str) -> None:
    r = httpx.post(s.url + "/v1/unload_lora_adapter", json={"lora_name": name}, timeout=30)
    assert r.status_code == 200, r.text


def _refused(r: httpx.Response, path: str) -> str:
    """The error's message with the path the client sent taken out (what it says about the
    server's disk)."""
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "lora_path" and SECRET not in r.text
    return err["message"].replace(repr(path), "PATH")


def _adapter(folder: Path, config: bytes | None = None, tensors: bytes | None = None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "adapter_config.json").write_bytes(
        config if config is not None else (LORA / "adapter_b" / "adapter_config.json")
        .read_bytes())
    (folder / "adapter_model.safetensors").write_bytes(
        tensors if tensors is not None else (LORA / "adapter_b" /
                                             "adapter_model.safetensors").read_bytes())


def test_inside_the_root_loads(srv, tree):
    assert _load(srv, "good").status_code == 200
    _unload(srv, "x")
    assert _load(srv, str(tree / "root" / "good")).status_code == 200   # absolute, inside
    _unload(srv, "x")


def test_outside_the_root_is_not_found_whether_it_exists_or_not(srv, tree):
    missing = _refused(_load(srv, "nope"), "nope")
    cases = [str(tree / "outside"),                          # absolute, exists
             str(tree / "no-such-folder"),                   # absolute, does not exist
             "../outside",                                   # .. to one that exists
             "good/../../outside",
             "/etc", "/dev/zero", "/"]
    for path in cases:
        assert _refused(_load(srv, path), path) == missing, path


def test_symlinks_out_of_the_root_are_not_found(srv, tree):
    root = tree / "root"
    (root / "link").symlink_to(tree / "outside", target_is_directory=True)
    part = root / "partial"
    part.mkdir()
    (part / "adapter_config.json").symlink_to(tree / "outside" / "adapter_config.json")
    (part / "adapter_model.safetensors").symlink_to(tree / "outside" /
                                                    "adapter_model.safetensors")
    zero = root / "zero"
    zero.mkdir()
    (zero / "adapter_config.json").symlink_to("/dev/zero")
    (zero / "adapter_model.safetensors").symlink_to("/dev/zero")
    missing = _refused(_load(srv, "nope"), "nope")
    for path in ("link", "partial", "zero"):                 # relative, and absolute
        assert _refused(_load(srv, path), path) == missing, path
        path = str(root / path)
        assert _refused(_load(srv, path), path) == missing, path
    inside = root / "inside-link"                            # a link within the root is fine
    inside.symlink_to(root / "good", target_is_directory=True)
    assert _load(srv, str(inside)).status_code == 200
    _unload(srv, "x")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_fifo_is_refused_without_blocking(srv, tree):
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        folder = tree / "root" / f"fifo-{name}"
        _adapter(folder)
        (folder / name).unlink()
        os.mkfifo(folder / name)
        r = _load(srv, str(folder))                         # answered (30 s client timeout)
        assert r.status_code == 400 and r.json()["error"]["param"] == "lora_path", r.text
        assert name in r.json()["error"]["message"]
        assert "regular file" in r.json()["error"]["message"]


def test_files_past_the_limit_are_refused_unread(srv, tree):
    big = tree / "root" / "big"
    _adapter(big)
    with open(big / "adapter_model.safetensors", "r+b") as f:
        f.truncate(LIMIT + 1)                                # sparse: nothing to read
    r = _load(srv, str(big))
    assert r.status_code == 400 and f"limit of {LIMIT} bytes" in r.json()["error"]["message"]
    bigcfg = tree / "root" / "bigcfg"
    _adapter(bigcfg)
    with open(bigcfg / "adapter_config.json", "r+b") as f:
        f.truncate(64 << 20)                                 # 64 MiB of config
    r = _load(srv, str(bigcfg))
    assert r.status_code == 400 and "limit of" in r.json()["error"]["message"]
    assert "adapter_config.json" in r.json()["error"]["message"]


def _safetensors(header: dict) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw


@pytest.mark.parametrize("config,tensors", [
    (f"{SECRET} not json {{".encode() + bytes(range(256)), None),
    (json.dumps({"peft_type": SECRET}).encode(), None),
    (json.dumps({"r": SECRET, "target_modules": ["q_proj"]}).encode(), None),
    (json.dumps({"r": 4, "lora_alpha": SECRET, "target_modules": ["q_proj"]}).encode(), None),
    (json.dumps({"r": 4, "target_modules": [SECRET]}).encode(), None),
    (json.dumps({"r": 4, "target_modules": SECRET}).encode(), None),
    (json.dumps({"r": 4, "bias": SECRET, "target_modules": ["q_proj"]}).encode(), None),
    (json.dumps([SECRET]).encode(), None),
    (None, SECRET.encode() * 50),
    (None, _safetensors({SECRET: {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})
     + b"\0" * 4),
    (None, _safetensors({"a": {"dtype": SECRET, "shape": [1], "data_offsets": [0, 4]}})
     + b"\0" * 4),
    (None, _safetensors({"__metadata__": {"k": SECRET}, "a": [SECRET]})),
    (None, _safetensors({f"base_model.model.model.layers.0.self_attn.q_proj.lora_A.{SECRET}"
                         f".weight": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})
     + b"\0" * 4),
])
def test_garbage_files_are_not_echoed(srv, tree, config, tensors):
    folder = tree / "root" / f"garbage-{abs(hash((config, tensors)))}"
    _adapter(folder, config, tensors)
    r = _load(srv, str(folder))
    assert r.status_code == 400, r.text
    assert SECRET not in r.text


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
            and "--allow-runtime-lora" in r.getMessage()]


def test_warning_without_api_key(handle, tree, caplog):
    caplog.set_level(logging.INFO)
    with running(handle, ServeConfig(runtime_lora=True, lora_root=str(tree / "root"))):
        pass
    w = _warnings(caplog)
    assert len(w) == 1 and "--api-key" in w[0] and "\n" not in w[0]
    caplog.clear()
    with running(handle, ServeConfig(runtime_lora=True, lora_root=str(tree / "root"),
                                     api_key="k")):
        pass
    assert _warnings(caplog) == []
