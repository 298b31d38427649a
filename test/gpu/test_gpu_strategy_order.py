"""The order planning tries the GPU kernel strategies in is one explicit list
(``poot.backends.gpu.strategies.STRATEGIES``), the same whichever strategy module a process
imports first (it was the registration order of module imports: a process that imported
``scatter`` first tried it before every other strategy)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: the order, written out: horizontal first (only it splits a merged function), the sm_90a
#: decode GEMM before the mma.sync one (which takes the same regions elsewhere), pointwise
#: last (it takes any elementwise-class region, so every specialised strategy wins)
ORDER = ["horizontal", "flash_decode", "rowreduce", "gemv", "gemm_decode_wgmma", "gemm_decode",
         "gemm", "indexed_gemv", "scatter", "pointwise"]


@pytest.mark.parametrize("first", ["scatter", "pointwise", "gemm", "attention"])
def test_strategy_order_is_the_list_whatever_is_imported_first(first):
    pytest.importorskip("mlir.ir", reason="the MLIR wheels are not installed here")
    code = (f"import poot.backends.gpu.strategies.{first}\n"
            "from poot.backends.gpu.strategies import STRATEGIES\n"
            "print(','.join(name for name, _ in STRATEGIES))\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().split(",") == ORDER
