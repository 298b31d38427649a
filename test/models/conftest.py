"""Shared helpers for the model-family tests: fixtures, step runners over the oracle."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "tiny"


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: long-running oracle evaluation of a real "
                                       "checkpoint (deselect with -m 'not slow')")


def fixture_path(name: str) -> Path:
    """The checkpoint of a tiny fixture: the HF folder, or model.gguf for GGUF fixtures."""
    folder = FIXTURES / name
    gguf = folder / "model.gguf"
    return gguf if gguf.exists() else folder


def reference(name: str) -> dict[str, np.ndarray]:
    with np.load(FIXTURES / name / "reference.npz") as z:
        return {k: z[k] for k in z.files}


@pytest.fixture
def tiny():
    """(path, reference arrays) of a tiny fixture, by name."""
    return lambda name: (fixture_path(name), reference(name))
