"""``compile_steps(max_prefill_tokens=...)``: the prompt budget a step while sequences
decode, which sets the largest ragged step an engine runs (decoding rows plus the budget,
rounded up to a bucket); ``poot bench --batch`` runs 8 chunks, more than the default one."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("mlir.ir", reason="the MLIR wheels are not installed here: compile_steps "
                    "compiles the steps")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
from model_steps import fixture_path  # noqa: E402

from poot.sampling_params import InvalidRequest  # noqa: E402


@pytest.mark.parametrize("bad", [0, -32])
def test_a_budget_that_is_not_positive_is_refused_before_compiling(tmp_path, bad):
    from poot.api import compile_steps

    with pytest.raises(InvalidRequest, match="max_prefill_tokens"):
        compile_steps(fixture_path("llama"), "cpu", kv_capacity=32,
                      max_prefill_tokens=bad, cache_dir=str(tmp_path))
    assert not any(tmp_path.rglob("*.so")), "nothing is compiled for a refused budget"
