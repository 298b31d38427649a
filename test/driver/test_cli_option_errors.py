"""A bad command-line option is refused as a CLI error naming the option (one line
``poot: error: --option ...``, status 2), and before anything is compiled: every case runs
with the step compiler and the compile cache's lookup replaced by a function that stops the
process, so a check that comes after a compile fails the case (CLI cases run in a fresh
interpreter, :func:`test_cli_errors.poot`)."""

from __future__ import annotations

import pytest
from test_cli_errors import LLAMA, poot, user_error

#: no step may be compiled or loaded from the cache: the process stops (status 1) if one is
NO_COMPILE = """
import poot.api.model as _m
def _stop(*a, **k):
    raise SystemExit('a step was compiled or looked up before the options were checked')
_m.cached_compiler = lambda *a, **k: _stop
_m._StepSource._find = _stop
"""
NO_TORCH = """
import importlib.util as _u
_spec = _u.find_spec
_u.find_spec = lambda name, *a: None if name == 'torch' else _spec(name, *a)
"""


def test_bench_profile_on_a_device_without_timers_is_refused_before_compiling():
    rc, _, err = poot("bench", "--model", LLAMA, "--profile", "--max-tokens", "2",
                      prelude=NO_COMPILE)
    user_error(rc, err, "--profile needs a device that times its dispatches", "cpu")


def test_bench_baseline_without_torch_is_refused_before_compiling():
    rc, _, err = poot("bench", "--model", LLAMA, "--baseline", "gpt-fast", "--max-tokens", "2",
                      prelude=NO_COMPILE + NO_TORCH)
    user_error(rc, err, "--baseline gpt-fast needs torch")


@pytest.mark.parametrize("option", ["--kv-dtype", "--kv-dtype-v"])
def test_kv_dtype_error_names_the_option(option):
    rc, _, err = poot("generate", "--model", LLAMA, "--prompt", "hi", option, "q9",
                      prelude=NO_COMPILE)
    line = user_error(rc, err, f"{option}='q9'", "must be one of", "q8_0")
    assert "invalid request" not in line


def test_draft_method_without_a_path_says_how_to_give_one():
    rc, _, err = poot("generate", "--model", LLAMA, "--prompt", "hi", "--speculative", "draft",
                      prelude=NO_COMPILE)
    line = user_error(rc, err, "draft model path is needed", "--draft-model PATH",
                      "draft:PATH")
    assert "None" not in line


@pytest.mark.parametrize("value", ["-5GiB", "-1.5G", "-5"])
def test_negative_kv_memory_is_refused_as_a_negative_size(value):
    rc, _, err = poot("serve", "--model", LLAMA, "--kv-memory", value, prelude=NO_COMPILE)
    user_error(rc, err, f"--kv-memory='{value}'", "cannot be negative")


def test_negative_values_attach_only_to_options_that_take_one():
    from poot.cli import attach_negative_values

    opts = {"--kv-memory", "--top-k"}
    assert attach_negative_values(["serve", "--kv-memory", "-5GiB", "--top-k", "-1"], opts) == \
        ["serve", "--kv-memory=-5GiB", "--top-k=-1"]
    # a flag, a non-numeric value and an option name stay as they are
    assert attach_negative_values(["--quiet", "-5", "--kv-memory", "-h"], opts) == \
        ["--quiet", "-5", "--kv-memory", "-h"]
