"""Fuzz the guided-decoding front end: a :class:`Guide` of any kind from arbitrary text (a JSON
schema, a regex, a Lark or GBNF grammar), its llguidance grammar, and a matcher of it
compiled against a byte-level tokenizer that spells every byte
(:func:`_harness.byte_tokenizer`), then driven a few tokens.

The first byte picks the kind (a few values give an unknown kind, or a JSON schema passed
as a parsed object); the rest is the spec's text (UTF-8, bytes that are not decoded as
lone surrogates). Contract: only GuidedDecodingError, at construction or compile time.
Properties: the first mask allows at least one token; a token the mask allows is accepted (or,
where llguidance runs past a limit, rejected with an error the engine reports); EOS is
allowed only where the constraint is complete or where the matcher reports a dead end (an
error the engine ends the request with).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

from _harness import PropertyFailed, byte_tokenizer, instrumented, main  # noqa: E402

with instrumented(__name__ == "__main__"):
    from poot.engine.guided import GuidedCompiler, mask_words
    from poot.sampling_params import Guide, GuidedDecodingError

ALLOWED = (GuidedDecodingError,)
TOKENIZER = byte_tokenizer()
VOCAB = TOKENIZER.vocab_size
COMPILER = GuidedCompiler(TOKENIZER, VOCAB, TOKENIZER.stop_ids)
KINDS = ["json_schema", "regex", "grammar", "json_schema_object", "json_object", "nope"]


def _allowed(mask: np.ndarray) -> list[int]:
    return [t for t in range(VOCAB) if (int(mask[t // 16]) >> (t % 16)) & 1]


def one_input(data: bytes) -> None:
    if not data:
        return
    kind = KINDS[data[0] % len(KINDS)]
    spec = data[1:].decode("utf-8", "surrogateescape")
    if kind == "json_schema_object":
        try:
            spec = json.loads(spec)
        except (ValueError, RecursionError):
            return
        kind = "json_schema"
    guide = Guide(kind, None if kind == "json_object" else spec)
    tm = COMPILER.matcher(guide)
    mask = np.zeros(mask_words(VOCAB), np.int32)
    for step in range(4):
        if tm.error:
            raise PropertyFailed(f"matcher in error after {step} tokens: {tm.error}")
        tm.fill_mask(mask)
        ok = _allowed(mask)
        if not ok:
            raise PropertyFailed(f"no token allowed after {step} tokens")
        tok = ok[data[-1 - step] % len(ok)] if len(data) > step else ok[0]
        if tok in COMPILER.stop_ids:
            # past a dead end (a lexeme no text matches) llguidance allows only EOS and
            # reports why: the engine ends that request with the error, not a stop
            if not tm.accepting and not tm.error:
                raise PropertyFailed(f"stop id {tok} allowed where the grammar is incomplete "
                                     "and the matcher reports no dead end")
            return
        if not tm.consume(tok):
            # the engine's documented outcome where llguidance's parser runs past a limit
            # (``root ::= "a" root``-like grammars): the request ends with the matcher's
            # error, so there must be one
            if not tm.error:
                raise PropertyFailed(f"token {tok} allowed by the mask, rejected, no error")
            return

if __name__ == "__main__":
    main(one_input, ALLOWED)
