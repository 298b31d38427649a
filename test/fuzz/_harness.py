"""What every fuzzer here shares: the contract check and the atheris entry point.

A fuzzer module defines ``ALLOWED`` (the typed errors its target documents) and
``one_input(data: bytes)``, which feeds the bytes to the target and checks the properties the
target promises (raising :class:`PropertyFailed` when one does not hold). :func:`check`
applies the contract: an input either succeeds or raises one of ``ALLOWED``; any other
exception escapes (to atheris, which records the input as a crash; to pytest in a regression
test). Hangs and huge allocations are caught by libFuzzer's ``-timeout`` and
``-rss_limit_mb`` (``test_fuzzers.py`` passes both).

Run one by hand (the first folder collects new inputs, the second is the committed seeds)::

    python test/fuzz/fuzz_gguf.py /tmp/gguf-corpus test/fuzz/corpus/gguf -max_total_time=300 \\
        -timeout=10 -rss_limit_mb=2048
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


class PropertyFailed(AssertionError):
    """A property the target promises did not hold for this input."""


def check(one_input: Callable[[bytes], None], allowed: tuple[type[BaseException], ...],
          data: bytes) -> None:
    """Run ``one_input(data)``; swallow only the target's documented errors."""
    try:
        one_input(data)
    except allowed:
        pass


def instrumented(main: bool):
    """A context whose imports of poot (and ``extra`` packages) atheris instruments for
    coverage when the fuzzer runs as a program (``main``); a no-op when a test imports it."""
    if not main:
        return contextlib.nullcontext()
    import atheris
    return atheris.instrument_imports(include=["poot"])


class ScratchFile:
    """One temporary file the readers under test open by path, rewritten for every input."""

    def __init__(self, suffix: str):
        fd, self.path = tempfile.mkstemp(suffix=suffix, prefix="poot-fuzz-")
        os.close(fd)

    def write(self, data: bytes) -> str:
        with open(self.path, "wb") as f:
            f.write(data)
        return self.path


def _byte_level_alphabet() -> list[str]:
    """GPT-2's byte -> printable character map (the byte-level BPE alphabet), by byte."""
    keep = {*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    extra = iter(range(256, 512))
    return [chr(b if b in keep else next(extra)) for b in range(256)]


def byte_tokenizer(chat_template: str | None = None):
    """A byte-level BPE tokenizer that spells every byte (the tiny fixtures' 256-entry
    vocabularies leave out control bytes): ``<pad>``, ``<s>`` (BOS), ``</s>`` (EOS), the 256
    byte tokens and two merges, built by poot's own GGUF tokenizer builder; ``chat_template``:
    its ``tokenizer.chat_template``."""
    import numpy as np

    from poot.text.tokenizer import from_gguf_metadata

    tokens = ["<pad>", "<s>", "</s>", *_byte_level_alphabet(), "ab", "\u0120t"]
    extra = {"tokenizer.chat_template": chat_template} if chat_template else {}
    return from_gguf_metadata({**extra,
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.merges": ["a b", "\u0120 t"],
        "tokenizer.ggml.token_type": np.array([3, 3, 3] + [1] * (len(tokens) - 3), np.int32),
        "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2})


def main(one_input: Callable[[bytes], None], allowed: tuple[type[BaseException], ...]) -> None:
    """The atheris entry point: libFuzzer's flags and corpus folders come from ``sys.argv``."""
    import atheris

    atheris.Setup(sys.argv, lambda data: check(one_input, allowed, data))
    atheris.Fuzz()
