"""Incremental detokenization: token ids in one at a time, text deltas out.

Algorithm: prefix offsets, as in HF text-generation-inference ``decode_token`` and vLLM
``detokenize_incrementally``. The decoder keeps two offsets into the ids: ``prefix`` (start of a
small window already emitted) and ``read`` (end of what is emitted). Each step decodes
``ids[prefix:read]`` and ``ids[prefix:]``; the delta is the part after the first. Decoding a
window rather than single tokens keeps context-dependent decoding right (SentencePiece's
leading-space strip, byte fallback pieces), and a window whose text ends in U+FFFD (an
incomplete UTF-8 sequence split across byte-level tokens) is held back until later ids
complete it. Because the offsets only advance at character boundaries, the concatenated deltas
equal ``decode(all ids)``; :meth:`StreamDecoder.finish` flushes bytes that never completed.

One exception, from HF's ``ByteFallback`` decoder (SentencePiece ``<0xAB>`` pieces): a run of
byte pieces that is not valid UTF-8 decodes to one U+FFFD per byte as a whole, so a later
invalid byte can turn already-valid, already-emitted bytes of the same run into U+FFFD. A
stream cannot take text back; it then emits what was valid when it was seen, and stops
matching ``decode`` only inside such garbage runs. (Byte-level BPE decodes with
``from_utf8_lossy``, which is prefix-stable, so it has no such case.)
"""

from __future__ import annotations

from collections.abc import Iterable

from poot.text.tokenizer import Tokenizer

_REPLACEMENT = "\ufffd"


class StreamDecoder:
    """Feed ids with :meth:`push`; get text deltas that never end in a broken character.

    Args:
        tokenizer: decodes the ids.
        skip_special_tokens: drop special tokens from the text (as ``Tokenizer.decode``).
        context: ids already emitted (e.g. the prompt); the newest few seed the window so the
            first delta decodes in context, and none of their text is emitted.
    """

    # How many context ids seed the window (vLLM uses 5: enough for any multi-token char).
    CONTEXT_IDS = 5

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False,
                 context: Iterable[int] = ()):
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = list(context)[-self.CONTEXT_IDS:]
        self._n_context = len(self._ids)
        self._prefix = 0
        self._read = len(self._ids)

    @property
    def ids(self) -> list[int]:
        """Ids pushed so far (the context seed excluded)."""
        return self._ids[self._n_context:]

    def push(self, token_id: int) -> str:
        """Add one id; return the newly complete text ("" while a character is incomplete)."""
        self._ids.append(int(token_id))
        return self._step(final=False)

    def extend(self, ids: Iterable[int]) -> str:
        """Push several ids; return their joined deltas."""
        return "".join(self.push(i) for i in ids)

    def finish(self) -> str:
        """Flush held-back text (incomplete bytes decode to U+FFFD, as ``decode`` does)."""
        return self._step(final=True)

    def _step(self, final: bool) -> str:
        prefix_text = self._decode(self._prefix, self._read)
        text = self._decode(self._prefix, len(self._ids))
        # Hold back while the window ends in an incomplete character or disagrees with what was
        # already emitted (a later id may still change how earlier bytes decode).
        if not final and (text.endswith(_REPLACEMENT) or not text.startswith(prefix_text)
                          or len(text) <= len(prefix_text)):
            return ""
        delta = text[len(prefix_text):] if text.startswith(prefix_text) else ""
        self._prefix, self._read = self._read, len(self._ids)
        return delta

    def _decode(self, start: int, stop: int) -> str:
        if start >= stop:
            return ""
        return self._tok.decode(self._ids[start:stop], skip_special_tokens=self._skip)
