"""Runs the lit/FileCheck IR tests (test/ir) as part of the pytest suite, so that the one test
command covers both. Each lit failure is shown in the assertion message."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_lit_ir_suite():
    lit = shutil.which("lit") or os.path.join(os.path.dirname(sys.executable), "lit")
    if not os.path.exists(lit):
        pytest.fail("lit is not installed: install the test extra (pip install -e '.[test]')")
    proc = subprocess.run([lit, "-q", "-sv", str(ROOT / "test" / "ir")], cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"lit failed:\n{out[-20000:]}"
    # lit -q prints nothing for a clean run; make sure it discovered the suite at all.
    listing = subprocess.run([lit, "--show-tests", str(ROOT / "test" / "ir")], cwd=ROOT,
                             capture_output=True, text=True, timeout=300)
    assert ".mlir" in listing.stdout, f"lit found no IR tests:\n{listing.stdout}"
