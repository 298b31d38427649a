"""Guided decoding: constraints on what a request may generate (a JSON schema, any JSON object,
a regular expression, a context-free grammar), through llguidance.

    params = SamplingParams(temperature=0, guided=Guide.json_schema({"type": "object", ...}))

A request's :class:`~poot.sampling_params.Guide` (the constraint as data, checked with the
other request parameters) is compiled against the model's tokenizer when the request is added
(:meth:`GuidedCompiler.matcher`: a schema or grammar llguidance cannot honor is a
:class:`~poot.sampling_params.GuidedDecodingError` naming what, before anything runs). Each step, the engine asks
the request's :class:`TokenMatcher` for the tokens the constraint allows next
(:meth:`TokenMatcher.fill_mask`, on the host, while the device runs the step's forward pass
where the device overlaps) and uploads them as a packed bitmask the on-device sampler applies
before any sampling rule (:mod:`poot.graph.sampling`): greedy, temperature, top-k/p,
penalties and log-probs all see the masked distribution. Every accepted token advances the
matcher. The constraint's end is EOS: the mask allows an end-of-sequence token only where the
grammar is complete, so a constrained request ends when its grammar is complete and the model
emits EOS, and cannot end before (``max_tokens`` still cuts it: finish reason ``length``).

Why llguidance (measured on SmolLM2's 49152-token vocabulary, ``bench/guided/compare_libs.py``):
JSON schema, regex, Lark and GBNF grammars in one library with no torch dependency; 0.25 s to
index the vocabulary once per model, grammars compiled in under a millisecond, and a median
16 us per token mask on a JSON schema (Earley parser with a token trie). xgrammar needs torch,
transformers and triton installed; outlines-core has no context-free grammars.

Mask layout on the device: ``ceil(V / 16)`` int32 words per row, token ``t`` allowed when bit
``t % 16`` of word ``t // 16`` is set (16 bits a word, so a word is never negative and the
sampler unpacks it with integer division alone: the dialect has no bitwise ops).
"""

from __future__ import annotations

import time

import numpy as np

from poot.graph.sampling import MASK_BITS, mask_words
from poot.sampling_params import Guide, GuidedDecodingError, short_spec

#: JSON compile options applied before the schema's own ``"x-guidance"`` options: whitespace
#: between JSON tokens is bounded (at most 24 characters of space, tab or newline: pretty
#: printing fits, and a small model cannot loop on whitespace until ``max_tokens``), and
#: unsupported schema keywords are errors (``lenient`` off), never silently ignored.
JSON_DEFAULTS = {"whitespace_pattern": r"[\x20\x0A\x0D\x09]{0,24}", "lenient": False}


def grammar_text(guide: Guide) -> str:
    """The llguidance grammar of ``guide`` (raises
    :class:`~poot.sampling_params.GuidedDecodingError` for a grammar that does not even
    parse)."""
    import llguidance as L

    try:
        if guide.kind == "json_object":
            return L.LLMatcher.grammar_from_json_schema({"type": "object"},
                                                        defaults=JSON_DEFAULTS)
        if guide.kind == "json_schema":
            return L.LLMatcher.grammar_from_json_schema(guide.spec, defaults=JSON_DEFAULTS)
        if guide.kind == "regex":
            return L.LLMatcher.grammar_from_regex(guide.spec)
        fmt = "gbnf" if "::=" in guide.spec else "lark"
        return L.grammar_from(fmt, guide.spec)
    except Exception as e:  # noqa: BLE001  (llguidance's parse errors: a user's grammar)
        raise GuidedDecodingError(guide.kind, short_spec(guide.spec), str(e).strip()) from None


def first_line(message: str, limit: int = 200) -> str:
    """The first line of an llguidance error (the rest is its parser's state dump), at most
    ``limit`` characters."""
    line = str(message).strip().split("\n", 1)[0].strip()
    return line if len(line) <= limit else line[:limit - 3] + "..."


class GuidedCompiler:
    """Compiles guides against one tokenizer (the vocabulary is indexed once, lazily: about
    0.25 s for 49152 tokens). ``vocab``: the model's vocabulary size (the logits' width, at
    least the tokenizer's); ``stop_ids``: the ids that end a sequence (EOS, end of turn)."""

    def __init__(self, tokenizer, vocab: int, stop_ids):
        self.tokenizer, self.vocab = tokenizer, vocab
        self.stop_ids = sorted(int(i) for i in stop_ids) or \
            ([tokenizer.eos_id] if tokenizer.eos_id is not None else [])
        self._lt = None
        self._executor = None     # llguidance's thread pool, for several masks at once
        self._bits = None         # u32 [rows, words] scratch of the parallel masks

    def _ll_tokenizer(self):
        if self._lt is None:
            import llguidance as L

            if not self.stop_ids:
                raise GuidedDecodingError("guided", "tokenizer", "the tokenizer has no EOS "
                                          "or end-of-turn id to end a constrained sequence")
            self._lt = L.LLTokenizer(self.tokenizer.backend.to_str(),
                                     n_vocab=max(self.vocab, self.tokenizer.vocab_size),
                                     eos_token=self.stop_ids)
        return self._lt

    def matcher(self, guide: Guide) -> "TokenMatcher":
        """A fresh matcher of ``guide``; :class:`GuidedDecodingError` naming what is wrong
        or unsupported."""
        import llguidance as L

        grammar = grammar_text(guide)
        lt = self._ll_tokenizer()
        bad, messages = L.LLMatcher.validate_grammar_with_warnings(grammar, lt)
        if bad:
            raise GuidedDecodingError(guide.kind, short_spec(guide.spec or "{}"),
                                      "; ".join(m.strip() for m in messages) or "invalid")
        m = L.LLMatcher(lt, grammar, log_level=0)
        if m.is_error():
            raise GuidedDecodingError(guide.kind, short_spec(guide.spec or "{}"),
                                      first_line(m.get_error()))
        # the first mask, computed here once: a constraint that allows no output at all (an
        # empty regex class, say) fails now, at admission, not after it is queued
        tm = TokenMatcher(m, self.vocab, lt.vocab_size)
        tm.fill_mask(np.empty(mask_words(self.vocab), np.int32))
        tm.mask_s, tm.masks = 0.0, 0
        if m.is_error():
            raise GuidedDecodingError(guide.kind, short_spec(guide.spec or "{}"),
                                      f"allows no output (llguidance: "
                                      f"{first_line(m.get_error())})")
        return tm

    def fill_masks(self, matchers: "list[TokenMatcher]", out: np.ndarray) -> None:
        """Row i of ``out`` (i32 [len(matchers), mask_words(vocab)]) gets the tokens
        ``matchers[i]`` allows next: one matcher on this thread, several in parallel on
        llguidance's thread pool (``LLExecutor``: 80% of the host's cores, up to 32)."""
        if len(matchers) == 1:
            matchers[0].fill_mask(out[0])
            return
        import llguidance as L

        t0 = time.perf_counter()
        if self._executor is None:
            self._executor = L.LLExecutor()
        words32 = matchers[0]._bits.size
        if self._bits is None or self._bits.shape[0] < len(matchers) or \
                self._bits.shape[1] != words32:
            self._bits = np.zeros((max(len(matchers), 8), words32), np.uint32)
        bits = self._bits
        self._executor.unsafe_compute_mask_ptr([(m.m, i) for i, m in enumerate(matchers)],
                                               bits.ctypes.data, words32 * 4, bits.shape[0])
        n = out.shape[1]
        out[:, 0::2] = bits[:len(matchers), :(n + 1) // 2] & 0xFFFF
        out[:, 1::2] = bits[:len(matchers), :n // 2] >> 16
        share = (time.perf_counter() - t0) / len(matchers)
        for m in matchers:
            m.mask_s += share
            m.masks += 1


#: A device mask word that allows all of its 16 tokens.
ALL_ALLOWED = (1 << MASK_BITS) - 1


class TokenMatcher:
    """One constrained sequence's matcher (llguidance's ``LLMatcher``) and its mask buffer.

    ``vocab``: the model's vocabulary (the logits' width); ``n_vocab``: the matcher's (at
    least ``vocab``; tokens past ``vocab`` can never be sampled)."""

    def __init__(self, matcher, vocab: int, n_vocab: int | None = None):
        self.m = matcher
        self.vocab = vocab
        self._bits = np.zeros(-(-max(vocab, n_vocab or 0, 1) // 32), np.uint32)
        self.mask_s = 0.0                 # host seconds spent computing masks
        self.masks = 0

    def fill_mask(self, out: np.ndarray) -> None:
        """Write the tokens allowed next into ``out`` (i32 [mask_words(vocab)], the device
        layout: token t is bit t % 16 of word t // 16). llguidance writes 32 bits a word, bit
        t % 32 of word t // 32: its low and high halves are the even and odd 16-bit words."""
        t0 = time.perf_counter()
        self.m.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        n = out.size
        out[0::2] = self._bits[:(n + 1) // 2] & 0xFFFF
        out[1::2] = self._bits[:n // 2] >> 16
        self.mask_s += time.perf_counter() - t0
        self.masks += 1

    def consume(self, token: int) -> bool:
        """Advance by an accepted token; False when the constraint rejected it."""
        return bool(self.m.consume_token(int(token)))

    def try_consume(self, token: int) -> bool:
        """Advance by ``token`` if the constraint allows it (False, and no change, where it
        does not): a speculative step's proposals, taken back with :meth:`rollback`."""
        return self.m.try_consume_tokens([int(token)]) == 1

    def rollback(self, n: int) -> None:
        """Take back the last ``n`` tokens consumed."""
        if n:
            self.m.rollback(n)

    @property
    def accepting(self) -> bool:
        """The grammar is complete here (an end-of-sequence token may follow)."""
        return bool(self.m.is_accepting())

    @property
    def error(self) -> str | None:
        """Why the matcher stopped (the first line of llguidance's error), or None."""
        return first_line(self.m.get_error()) if self.m.is_error() else None


__all__ = ["ALL_ALLOWED", "GuidedCompiler", "MASK_BITS", "TokenMatcher", "grammar_text",
           "mask_words"]
