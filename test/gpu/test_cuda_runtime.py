"""The CUDA runtime on a real device: the tiny Llama decode step (every dispatch on its own,
and whole steps replayed from one CUDA graph) matches the oracle. Skips without a device."""

from __future__ import annotations

import numpy as np
import pytest

from _build import tiny_artifact, tiny_program
from model_steps import step_feed


def _device():
    from poot.backends.cuda.runtime import device_available

    ok, why = device_available()
    if not ok:
        pytest.skip(f"no CUDA device: {why}")


@pytest.mark.parametrize("strategy", ["naive", "auto"])
def test_tiny_decode_matches_oracle_on_device(tmp_path, strategy):
    _device()
    from poot.backends.cuda.devcheck import run_check
    from poot.backends.cuda.fixtures import write_check_bundle

    prog, weights = tiny_program()
    steps = [step_feed(prog.graph, [[3 + k]], [[k]], [0]) for k in range(3)]
    write_check_bundle(str(tmp_path), prog, tiny_artifact(strategy=strategy), weights.arrays,
                       steps)
    report = run_check(str(tmp_path))
    assert report["ok"], report["failures"] + report["missing"]


def test_missing_fixture_fails(tmp_path):
    _device()
    from poot.backends.cuda.devcheck import run_check
    from poot.backends.cuda.fixtures import write_check_bundle

    prog, weights = tiny_program()
    steps = [step_feed(prog.graph, [[3]], [[0]], [0])]
    write_check_bundle(str(tmp_path), prog, tiny_artifact(), weights.arrays, steps)
    fx = dict(np.load(tmp_path / "fixtures.npz"))
    del fx["d3.o0"]
    np.savez(tmp_path / "fixtures.npz", **fx)
    report = run_check(str(tmp_path))
    assert not report["ok"] and report["missing"]
