"""What the ``poot`` subcommands reuse and print: ``bench`` finds the steps ``generate``
compiled, reports a cold start's time to first token with its compile, ``-q`` silences a
``--prompts-file`` run, an unknown option shows the subcommand's usage, and ``serve`` refuses
a broken model before it listens (CLI cases run in a fresh interpreter,
:func:`test_cli_errors.poot`)."""

from __future__ import annotations

import importlib.util
import json
import os
import time

import pytest

from test_cli_errors import GGUF, _broken, poot, user_error
from test_first_run import NO_CACHE_MISS

#: a small context and prefill chunk: the tiny model's steps compile in seconds
SMALL = ("--kv-capacity", "16", "--prefill-chunk", "4")


@pytest.fixture
def cache_env(tmp_path):
    return {**os.environ, "POOT_CACHE_DIR": str(tmp_path / "cache")}


def test_bench_after_generate_compiles_nothing(cache_env):
    """``bench`` used to size the KV pool (an input of every step) for one sequence and
    ``generate`` for 8: the same model compiled its steps twice."""
    rc, _, err = poot("generate", "--model", GGUF, "--prompt", "hi", "--max-tokens", "2",
                      *SMALL, "-q", env=cache_env)
    assert rc == 0, err
    rc, out, err = poot("bench", "--model", GGUF, "--prompt-tokens", "4", "--max-tokens", "3",
                        "--runs", "1", "--replay", "0", *SMALL, "-q", prelude=NO_CACHE_MISS,
                        env=cache_env)
    assert rc == 0 and "reached a compile" not in out, (out, err)
    assert json.loads(out)["generated_tokens"] == 3


def test_bench_cold_ttft_includes_loading_and_compiling(cache_env):
    """An empty compile cache: the first token comes after loading and compiling, which
    ``ttft_s`` (a timed run's, every step compiled) leaves out."""
    t0 = time.perf_counter()
    rc, out, err = poot("bench", "--model", GGUF, "--prompt-tokens", "4", "--max-tokens", "3",
                        "--runs", "1", "--replay", "0", *SMALL, "-q", env=cache_env)
    wall = time.perf_counter() - t0
    assert rc == 0, err
    b = json.loads(out)
    assert b["load_s"] < b["cold_ttft_s"] < wall
    assert b["ttft_s"] < b["cold_ttft_s"]


def test_quiet_prompts_file_prints_nothing_on_stderr(cache_env, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hi\nhello there\n")
    rc, out, err = poot("generate", "--model", GGUF, "--prompts-file", prompts,
                        "--max-tokens", "2", *SMALL, "-q", env=cache_env)
    assert rc == 0 and err == "", err
    assert sorted(json.loads(ln)["index"] for ln in out.splitlines()) == [0, 1]


@pytest.mark.parametrize("argv", [["generate", "--prompt", "hi", "--bogus"],
                                  ["bench", "--bogus", "x"], ["devices", "--bogus"]])
def test_unknown_option_shows_the_subcommand_usage(argv, capsys):
    from poot.cli import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    cmd, unknown = argv[0], " ".join(a for a in argv if a in ("--bogus", "x"))
    assert lines[0].startswith(f"usage: poot {cmd} ")
    assert all(ln.startswith(" ") for ln in lines[1:-1])       # the usage, wrapped
    assert lines[-1] == f"poot {cmd}: error: unrecognized arguments: {unknown}"


@pytest.mark.skipif(importlib.util.find_spec("fastapi") is None,
                    reason="poot serve needs the serve extra (fastapi)")
@pytest.mark.parametrize("kind", ["missing", "bad-magic", "bad-header-folder"])
def test_serve_refuses_a_broken_model_before_listening(tmp_path, kind):
    """The loader's error, as ``poot inspect`` says it, and no ``listening on`` line."""
    model = _broken(tmp_path, kind)
    rc, _, err = poot("inspect", model)
    want = user_error(rc, err)
    rc, _, err = poot("serve", "--model", model, "--port", "0", timeout=120)
    assert user_error(rc, err) == want


@pytest.mark.skipif(importlib.util.find_spec("fastapi") is None,
                    reason="poot serve needs the serve extra (fastapi)")
def test_serve_refuses_a_missing_backend_before_listening():
    """A backend whose runtime or device is missing here (CUDA: cuda-python or a driver;
    ROCm: the HSA runtime) is one error line, and no ``listening on`` line before it."""
    from poot.backends.registry import BACKENDS
    from poot.runtime import DeviceError, open_device

    missing = []
    for name in ("cuda", "rocm"):
        try:
            open_device(name)
        except DeviceError:
            missing.append(name)
    if not missing:
        pytest.skip("CUDA and ROCm both open here: no missing backend to refuse")
    assert BACKENDS[missing[0]].open_device is not None
    rc, _, err = poot("serve", "--model", str(GGUF), "--backend", missing[0], "--port", "0",
                      timeout=120)
    line = user_error(rc, err)
    assert "listening" not in err and line.startswith("poot: error: "), err
