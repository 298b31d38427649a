"""bench/cpu_step.py's step choice: ``--batch B`` times a decode step of B rows (one sequence
each), ``--prefill T`` a prefill step; bad combinations are argparse errors (exit 2) named on
one line, before any model is loaded."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "cpu_step.py"


@pytest.fixture(scope="module")
def cpu_step():
    spec = importlib.util.spec_from_file_location("cpu_step", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_batch_is_a_decode_step_of_b_rows(cpu_step):
    s = cpu_step._spec(0, 8)
    assert (s.kind, s.batch, s.tokens, s.kv_slots) == ("decode", 8, 1, 8)
    assert cpu_step._spec(0, 1).batch == 1
    p = cpu_step._spec(64, 1)
    assert (p.kind, p.tokens) == ("prefill", 64)


@pytest.mark.parametrize("argv", [["--batch", "0"], ["--batch", "4", "--prefill", "16"],
                                  ["--prefill", "-1"]])
def test_bad_step_arguments_are_usage_errors(cpu_step, argv, capsys):
    with pytest.raises(SystemExit) as e:
        cpu_step.main(argv)
    assert e.value.code == 2
    assert "--batch must be >= 1" in capsys.readouterr().err
