"""OpenAI response bodies and stream chunks, and the per-choice state that builds them.

Log-probs follow OpenAI's shapes exactly: chat ``{"content": [{"token", "logprob", "bytes",
"top_logprobs": [{"token", "logprob", "bytes"}]}], "refusal": null}``; completions
``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}``. A token's log-prob goes out
with the text it produced: while the engine holds text back (a possible stop string, an
incomplete UTF-8 character) its tokens' log-probs wait too, and the tokens of a stop string
that ended the choice are dropped with their text, so no piece of a stop string reaches the
client through either.
"""

from __future__ import annotations

import json
import time
import uuid
from functools import lru_cache
from typing import Any

from poot.text.stream import StreamDecoder

_BYTE_DECODER: dict[str, int] | None = None


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet: vocabulary character -> byte."""
    global _BYTE_DECODER
    if _BYTE_DECODER is None:
        bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
            list(range(ord("®"), ord("ÿ") + 1))
        cs = bs[:]
        n = 0
        for b in range(256):
            if b not in bs:
                bs.append(b)
                cs.append(256 + n)
                n += 1
        _BYTE_DECODER = {chr(c): b for b, c in zip(bs, cs)}
    return _BYTE_DECODER


class TokenText:
    """A tokenizer's per-token text and raw bytes (for log-prob entries), cached."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        dec = getattr(getattr(tokenizer, "backend", None), "decoder", None)
        self.byte_level = type(dec).__name__ == "ByteLevel"
        self.special = tokenizer.special_ids if tokenizer is not None else frozenset()
        self.text = lru_cache(maxsize=1 << 16)(self._text)
        self.bytes = lru_cache(maxsize=1 << 16)(self._bytes)

    def _text(self, tid: int) -> str:
        if self.tok is None:
            return f"token_id:{tid}"
        return self.tok.decode([tid])

    def _bytes(self, tid: int) -> list[int]:
        if self.tok is None:
            return []
        if tid not in self.special:
            piece = self.tok.id_to_token(tid)
            if self.byte_level:
                table = _byte_decoder()
                if all(c in table for c in piece):
                    return [table[c] for c in piece]
            elif len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
                try:
                    return [int(piece[3:5], 16)]
                except ValueError:
                    pass
        return list(self._text(tid).encode("utf-8"))


def new_id(prefix: str) -> str:
    """A response id: ``chatcmpl-...`` / ``cmpl-...``."""
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


#: characters that JSON leaves raw in a string but line-splitting clients (JavaScript's line
#: terminators, Python's str.splitlines) take for line breaks: escaped in an event's JSON,
#: so each event stays one ``data:`` line (json.dumps already escapes the C0 controls)
_LINE_BREAKS = str.maketrans({c: f"\\u{ord(c):04x}" for c in "\x85\u2028\u2029"})


#: compact JSON, non-ASCII kept (one encoder: ``json.dumps`` with options builds one a call)
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(',', ':'))


def sse_json(obj: Any) -> str:
    """``obj`` as an event's JSON: compact, non-ASCII kept, line separators escaped."""
    return _ENCODER.encode(obj).translate(_LINE_BREAKS)


def sse(obj: Any) -> str:
    """One server-sent event carrying ``obj`` as JSON (one line: no raw line separator)."""
    return f"data: {sse_json(obj)}\n\n"


SSE_DONE = "data: [DONE]\n\n"


class ChoiceState:
    """What one choice has produced so far: its text, tokens, the log-probs released with
    its text, its finish reason and timing (first and last token)."""

    def __init__(self, index: int, prompt_tokens: int):
        self.index = index
        self.prompt_tokens = prompt_tokens
        self.parts: list[str] = []
        self.token_ids: list[int] = []
        self.logprobs: list[Any] = []        # released TokenLogprob entries
        self._pending: list[Any] = []
        self.finish_reason: str | None = None
        self.completion_tokens = 0
        self.cached_tokens = 0
        self.t_first: float | None = None
        self.t_last: float | None = None

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def feed(self, ev) -> tuple[str, list[Any], list[float]]:
        """Take one engine output; returns the text released, the log-prob entries released
        with it, and the inter-token gaps seen (seconds, for the metrics)."""
        now = time.monotonic()
        gaps: list[float] = []
        if ev.token_ids:
            if self.t_first is None:
                self.t_first = now
            elif self.t_last is not None:
                gaps = [(now - self.t_last) / len(ev.token_ids)] * len(ev.token_ids)
            self.t_last = now
            self.token_ids += ev.token_ids
        if ev.logprobs:
            self._pending += ev.logprobs
        released: list[Any] = []
        text = ev.text or ""
        if text:
            released, self._pending = self._pending, []
        if ev.finished:
            if self.t_first is None and ev.stats is not None and ev.stats.generated_tokens:
                self.t_first = now              # the only token was a stop token
            self.finish_reason = "stop" if ev.finish_reason == "stop" else \
                "length" if ev.finish_reason == "length" else ev.finish_reason
            if not (ev.finish_reason == "stop" and isinstance(ev.stop, str)):
                released += self._pending       # held text that was no stop string
            self._pending = []
            if ev.stats is not None:
                self.completion_tokens = ev.stats.generated_tokens
                self.cached_tokens = ev.stats.cached_tokens
        if text:
            self.parts.append(text)
        self.logprobs += released
        return text, released, gaps


# ---- log-prob shapes ---------------------------------------------------------------------------

def chat_logprobs(entries: list[Any], tt: TokenText) -> dict[str, Any]:
    """OpenAI chat ``logprobs``: ``{"content": [...], "refusal": None}``."""
    content = []
    for e in entries:
        top = [{"token": tt.text(i), "logprob": _lp(lp), "bytes": tt.bytes(i)}
               for i, lp in (e.top or [])]
        content.append({"token": tt.text(e.token_id), "logprob": _lp(e.logprob),
                        "bytes": tt.bytes(e.token_id), "top_logprobs": top})
    return {"content": content, "refusal": None}


def _lp(x: float) -> float:
    # JSON has no -inf: a token with probability 0 gets OpenAI's floor
    return x if x > -9999.0 else -9999.0


class CompletionLogprobs:
    """OpenAI completions ``logprobs`` of one choice, built up chunk by chunk.
    ``text_offset`` is each token's character offset in the choice's text (the echoed prompt
    first, when echoed), found by decoding incrementally as the engine does, so a token that
    is part of a multi-byte character points where that character starts."""

    def __init__(self, tt: TokenText, prompt_ids: list[int]):
        self.tt, self.prompt_ids = tt, list(prompt_ids)
        self.offset = 0
        self._gen = None

    def _decoder(self, context, skip: bool):
        return StreamDecoder(self.tt.tok, skip_special_tokens=skip, context=context) \
            if self.tt.tok is not None else None

    def _entries(self, ids: list[int], dec) -> tuple[list[str], list[int]]:
        tokens, offsets = [], []
        for i in ids:
            tokens.append(self.tt.text(i))
            offsets.append(self.offset)
            if dec is not None:
                self.offset += len(dec.push(i))
        return tokens, offsets

    def prompt(self) -> dict[str, Any]:
        """The echoed prompt's tokens with their texts and offsets; log-probs null (the
        engine does not compute prompt log-probs)."""
        tokens, offsets = self._entries(self.prompt_ids, self._decoder((), True))
        n = len(tokens)
        return {"tokens": tokens, "token_logprobs": [None] * n, "top_logprobs": [None] * n,
                "text_offset": offsets}

    def generated(self, entries: list[Any]) -> dict[str, Any]:
        """Generated tokens' entries."""
        if self._gen is None:
            self._gen = self._decoder(self.prompt_ids, True)
        tokens, offsets = self._entries([e.token_id for e in entries], self._gen)
        top_list = []
        for e in entries:
            top: dict[str, float] = {}
            for i, lp in (e.top or []):
                top.setdefault(self.tt.text(i), _lp(lp))
            top_list.append(top)
        return {"tokens": tokens, "token_logprobs": [_lp(e.logprob) for e in entries],
                "top_logprobs": top_list, "text_offset": offsets}

    @staticmethod
    def merge(a: dict[str, Any] | None, b: dict[str, Any]) -> dict[str, Any]:
        """``a`` followed by ``b``."""
        if a is None:
            return b
        return {k: a[k] + b[k] for k in a}


def usage(states: list[ChoiceState], prompt_lens: list[int]) -> dict[str, Any]:
    """The ``usage`` object: each prompt counted once, every choice's generated tokens
    (a stop token included), and the prompt tokens served from the prefix cache."""
    prompt = sum(prompt_lens)
    completion = sum(s.completion_tokens for s in states)
    n = len(states) // max(len(prompt_lens), 1)
    cached = sum(s.cached_tokens for s in states[::n]) if n else 0
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


__all__ = ["ChoiceState", "CompletionLogprobs", "SSE_DONE", "TokenText", "chat_logprobs",
           "new_id", "sse", "usage"]
