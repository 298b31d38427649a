"""Tokenizers for poot: one :class:`Tokenizer` over HF ``tokenizers``, built from GGUF or HF files.

Sources of the formats and algorithms:

* GGUF ``tokenizer.ggml.*`` metadata (ggml/docs/gguf.md): ``model`` (``gpt2`` | ``llama``),
  ``pre``, ``tokens``, ``token_type`` (1 normal, 2 unknown, 3 control, 4 user-defined,
  5 unused, 6 byte), ``merges`` (``"left right"`` strings), ``scores``, special token ids,
  ``add_bos_token`` / ``add_eos_token`` / ``add_space_prefix``, ``chat_template``.
* ``gpt2``: GPT-2 byte-level BPE (Radford et al. 2019; HF ``ByteLevel``). The pre-tokenizer
  regexes follow llama.cpp's ``llama-vocab.cpp`` table, keyed by ``tokenizer.ggml.pre``;
  llama.cpp applies its regex list in sequence, each splitting the previous fragments and
  keeping matches and gaps, which is HF ``Split(..., behavior="isolated")``.
* ``llama``: SentencePiece BPE as HF's ``LlamaConverter`` / transformers' GGUF converter
  build it: BPE with byte fallback (``<0xAB>`` pieces), merges from the GGUF or derived from
  the piece scores (transformers' ``generate_merges``), ``"▁"`` for spaces, and a ``"▁"``
  prepended to the first text run when ``add_space_prefix`` (HF ``Metaspace``,
  ``prepend_scheme="first"``; llama.cpp also prepends one after each special token).
* HF folders: ``tokenizer.json`` read by ``tokenizers`` as is, plus ``tokenizer_config.json``
  (``add_bos_token``/``add_eos_token``, special tokens, ``chat_template``),
  ``special_tokens_map.json`` and ``generation_config.json`` (``eos_token_id``).

Every user-caused failure (a missing field, an unknown model or pre-tokenizer, tokens and
merges that disagree) is a :class:`TokenizerError` that names the field.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as _HFTokenizer

from poot.errors import PootError
from poot.load.gguf import looks_like_gguf, read_gguf


class TokenizerError(PootError):
    """A tokenizer that cannot be built or used: bad metadata, files, or token ids."""


# GGUF token_type values (gguf.TokenType / llama.cpp LLAMA_TOKEN_TYPE_*).
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6

# End-of-generation token texts llama.cpp scans the vocab for (llama-vocab.cpp, EOT/EOG search);
# counted as stops only when the vocab marks them special, so plain text never stops a run.
END_OF_TURN_TOKENS = (
    "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<end_of_turn>", "<|end|>", "<|endoftext|>",
    "<|end_of_text|>", "<EOT>", "_<EOT>", "<｜end▁of▁sentence｜>",
)

# --- llama.cpp pre-tokenizer regexes (llama-vocab.cpp, llm_tokenizer_bpe) -------------------
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
# Llama 3's regex with the case-insensitive contractions spelled out, as llama.cpp does.
_LLAMA3 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
           r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Qwen2: the Llama 3 regex with single digits.
_QWEN2 = _LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")
# Qwen3.5: letters may carry combining marks (\p{M}).
_QWEN35 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
           r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Mistral Tekken and GPT-4o / Llama 4 (case-aware words; the form transformers' GGUF loader uses).
_TEKKEN = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
           r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
           r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_CONTRACTION = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
_GPT4O = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+" + _CONTRACTION
          + r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*" + _CONTRACTION
          + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"

PRE_TOKENIZER_REGEXES: dict[str, tuple[str, ...]] = {
    "default": (r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, r"\p{N}+", "[0-9][0-9][0-9]"),
    "gpt2": (_GPT2,),
    "llama3": (_LLAMA3,),
    "qwen2": (_QWEN2,),
    "qwen35": (_QWEN35,),
    # smollm, starcoder, refact, command-r, codeshell, exaone, minerva: single digits first.
    # (The models' own tokenizer.json: Digits(individual_digits) + ByteLevel. transformers'
    # GGUF loader uses plain GPT-2 here and differs on whitespace runs before a digit.)
    "smollm": (r"\p{N}", _GPT2),
    "tekken": (_TEKKEN,),
    "gpt-4o": (_GPT4O,),
    "falcon": (r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, "[0-9][0-9][0-9]"),
    "deepseek-coder": ("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}"),
    "deepseek-v3": (
        r"\p{N}{1,3}",
        "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
        r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
        r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
}
# tokenizer.ggml.pre names (llama.cpp's convert_hf_to_gguf / llama-vocab.cpp) -> table key.
PRE_TOKENIZER_ALIASES: dict[str, str] = {
    "default": "default",
    "gpt-2": "gpt2", "gpt2": "gpt2", "mpt": "gpt2", "olmo": "gpt2", "jais": "gpt2",
    "phi-2": "gpt2", "roberta-bpe": "gpt2", "trillion": "gpt2",
    "llama3": "llama3", "llama-v3": "llama3", "llama-bpe": "llama3", "falcon3": "llama3",
    "dbrx": "llama3", "smaug-bpe": "llama3", "chatglm-bpe": "llama3",
    "qwen2": "qwen2", "deepseek-r1-qwen": "qwen2", "stablelm2": "qwen2", "megrez": "qwen2",
    "qwen35": "qwen35",
    "smollm": "smollm", "starcoder": "smollm", "refact": "smollm", "command-r": "smollm",
    "codeshell": "smollm", "exaone": "smollm", "minerva-7b": "smollm",
    "falcon": "falcon",
    "tekken": "tekken", "gpt-4o": "gpt-4o", "llama4": "gpt-4o",
    "deepseek-coder": "deepseek-coder", "deepseek-v3": "deepseek-v3",
}
# Pre-tokenizers whose BPE emits a whole word found in the vocab before merging (llama.cpp's
# ignore_merges, HF BPE(ignore_merges=True) in Llama 3's tokenizer.json).
_IGNORE_MERGES = {"llama3"}


@dataclass
class Tokenizer:
    """Text <-> token ids for one checkpoint, backed by an HF ``tokenizers.Tokenizer``.

    Attributes:
        bos_id / eos_id: the checkpoint's BOS / EOS token ids, ``None`` when it has none.
        stop_ids: ids that end generation: EOS, GGUF ``eot``/``eom`` ids, ``generation_config``
            ``eos_token_id`` (int or list) and special end-of-turn tokens in the vocab
            (:data:`END_OF_TURN_TOKENS`).
        chat_template: the checkpoint's Jinja chat template source, or ``None``.
        special_tokens: template variables naming special tokens (``bos_token``,
            ``eos_token``, ``unk_token``, ``pad_token``) as strings, when known.
        source: where it was loaded from (for messages).
    """

    backend: _HFTokenizer
    bos_id: int | None
    eos_id: int | None
    stop_ids: frozenset[int] = frozenset()
    chat_template: str | None = None
    special_tokens: dict[str, str] = field(default_factory=dict)
    source: str = "<memory>"

    @cached_property  # the backend is not changed after construction
    def vocab_size(self) -> int:
        """Number of ids, added tokens included (ids are ``0 .. vocab_size-1``)."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    @cached_property
    def special_ids(self) -> frozenset[int]:
        """Ids of special (control) tokens: matched atomically, dropped by ``skip_special_tokens``."""
        return frozenset(i for i, t in self.backend.get_added_tokens_decoder().items() if t.special)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; special-token texts in it map to their ids.

        ``add_special_tokens`` adds the checkpoint's BOS/EOS as its rules say (GGUF
        ``add_bos_token``/``add_eos_token``, the HF post-processor or tokenizer_config).
        """
        if not isinstance(text, str):
            raise TokenizerError(f"encode expects str, got {type(text).__name__}")
        check_utf8(text)
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Text of ``ids``; raises TokenizerError for an id outside ``0 .. vocab_size-1``.

        Bytes that do not form complete UTF-8 characters decode to U+FFFD, as in HF.
        """
        ids = self._check_ids(ids)
        return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str:
        """The vocab string of ``token_id`` (byte-level/SentencePiece form, e.g. ``"Ġthe"``)."""
        tok = self.backend.id_to_token(int(token_id)) if 0 <= int(token_id) < self.vocab_size else None
        if tok is None:
            raise TokenizerError(f"token id {token_id} out of range [0, {self.vocab_size})")
        return tok

    def token_to_id(self, token: str) -> int | None:
        """Id of the vocab string ``token``, or ``None`` when it is not in the vocab."""
        return self.backend.token_to_id(token)

    def _check_ids(self, ids: Iterable[int]) -> list[int]:
        out = [int(i) for i in ids]
        n = self.vocab_size
        bad = [i for i in out if not 0 <= i < n]
        if bad:
            raise TokenizerError(f"token id {bad[0]} out of range [0, {n})")
        return out


def check_utf8(text: str, what: str = "text") -> None:
    """Raise :class:`TokenizerError` when ``text`` holds lone surrogates (bytes that were not
    UTF-8, smuggled in by ``surrogateescape``, e.g. a command-line argument), naming the byte
    offset of the first one in the original bytes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        ch = ord(text[e.start])
        try:
            at = len(text[:e.start].encode("utf-8", "surrogateescape"))
        except UnicodeEncodeError:        # an earlier surrogate that is no smuggled byte
            at = None
        if 0xDC80 <= ch <= 0xDCFF and at is not None:      # a byte smuggled in
            raise TokenizerError(f"{what} is not valid UTF-8 at byte {at} "
                                 f"(0x{ch - 0xDC00:02x})") from None
        # a lone UTF-16 surrogate (a JSON "\udXXX" escape without its pair)
        raise TokenizerError(f"{what} is not valid Unicode: a lone surrogate U+{ch:04X} at "
                             f"character {e.start}") from None


# --- entry point -----------------------------------------------------------------------------

def load_tokenizer(model_path: str | Path) -> Tokenizer:
    """Load the tokenizer of a checkpoint: a ``.gguf`` file or an HF folder with tokenizer.json.

    Raises:
        TokenizerError: the path is neither, or its tokenizer data is malformed.
        poot.load.LoadError: a GGUF file the loader rejects (truncated, bad header, ...).
    """
    path = Path(model_path)
    if path.is_dir():
        if (path / "tokenizer.json").is_file():
            return from_hf_folder(path)
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            path = ggufs[0]
        else:
            raise TokenizerError(f"{path}: no tokenizer.json and not exactly one .gguf file")
    if not path.is_file():
        raise TokenizerError(f"{path}: no such file or directory")
    if not looks_like_gguf(path):
        raise TokenizerError(f"{path}: neither a GGUF file nor an HF folder with tokenizer.json")
    tok = from_gguf_metadata(_gguf_metadata(path))
    tok.source = str(path)
    return tok


def _gguf_metadata(path: Path) -> Mapping[str, Any]:
    """GGUF metadata through the project's loader (raises its LoadError for a bad file)."""
    return read_gguf(path).metadata


# --- GGUF ------------------------------------------------------------------------------------

def _field(meta: Mapping[str, Any], key: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
    """``meta[key]`` checked against ``kind``; missing without default -> TokenizerError."""
    if key not in meta:
        if default is ...:
            raise TokenizerError(f"GGUF metadata field {key!r} is missing")
        return default
    v = meta[key]
    if isinstance(v, np.ndarray) and kind is list:
        return v.tolist()
    if isinstance(v, (np.integer, np.floating, np.bool_)):
        v = v.item()
    if not isinstance(v, kind) or (kind is int and isinstance(v, bool)):
        raise TokenizerError(f"GGUF metadata field {key!r} has type {type(v).__name__}, "
                             f"expected {getattr(kind, '__name__', kind)}")
    return v


def _token_id(meta: Mapping[str, Any], key: str, n_vocab: int) -> int | None:
    v = _field(meta, key, int, None)
    if v is not None and not 0 <= v < n_vocab:
        raise TokenizerError(f"GGUF metadata field {key!r} = {v} outside the vocab [0, {n_vocab})")
    return v


def from_gguf_metadata(meta: Mapping[str, Any]) -> Tokenizer:
    """Build a Tokenizer from GGUF metadata (a mapping shaped like ``GGUFFile.metadata``).

    Raises:
        TokenizerError: missing ``tokenizer.ggml.model``/``tokens``; an unknown model or
            ``pre``; ``token_type``/``scores`` lengths that differ from ``tokens``; merges
            naming tokens not in the vocab.
    """
    model = _field(meta, "tokenizer.ggml.model", str)
    tokens = _field(meta, "tokenizer.ggml.tokens", list)
    if not tokens or not all(isinstance(t, str) for t in tokens):
        raise TokenizerError("GGUF metadata field 'tokenizer.ggml.tokens' must be a non-empty string array")
    _check_utf8(tokens)
    n = len(tokens)
    types = _field(meta, "tokenizer.ggml.token_type", list, [TOKEN_NORMAL] * n)
    if len(types) != n:
        raise TokenizerError(f"GGUF metadata field 'tokenizer.ggml.token_type' has {len(types)} "
                             f"entries for {n} tokens")
    if model == "gpt2":
        backend, add_bos_default = _build_gpt2(meta, tokens)
    elif model == "llama":
        backend, add_bos_default = _build_llama(meta, tokens, types), True
    else:
        raise TokenizerError(f"GGUF metadata field 'tokenizer.ggml.model' = {model!r} is not "
                             "supported (supported: 'gpt2', 'llama')")
    _add_gguf_special_tokens(backend, tokens, types)

    bos = _token_id(meta, "tokenizer.ggml.bos_token_id", n)
    eos = _token_id(meta, "tokenizer.ggml.eos_token_id", n)
    add_bos = _field(meta, "tokenizer.ggml.add_bos_token", bool, add_bos_default)
    add_eos = _field(meta, "tokenizer.ggml.add_eos_token", bool, False)
    _set_post_processor(backend, (tokens[bos], bos) if add_bos and bos is not None else None,
                        (tokens[eos], eos) if add_eos and eos is not None else None)

    extra = {_token_id(meta, f"tokenizer.ggml.{k}_token_id", n) for k in ("eot", "eom")}
    specials = {i for i, t in enumerate(types) if t in (TOKEN_CONTROL, TOKEN_USER_DEFINED)}
    stops = _stop_ids(backend, eos, extra - {None}, specials)
    named = {"bos_token": bos, "eos_token": eos,
             "unk_token": _token_id(meta, "tokenizer.ggml.unknown_token_id", n),
             "pad_token": _token_id(meta, "tokenizer.ggml.padding_token_id", n)}
    template = _field(meta, "tokenizer.chat_template", str, None)
    return Tokenizer(backend, bos, eos, stops, template,
                     {k: tokens[v] for k, v in named.items() if v is not None})


def _check_utf8(tokens: Sequence[str]) -> None:
    # The loader keeps invalid UTF-8 as surrogate escapes; the tokenizers library cannot hold them.
    for i, t in enumerate(tokens):
        if not t.isascii():
            try:
                t.encode("utf-8")
            except UnicodeEncodeError:
                raise TokenizerError(f"GGUF metadata field 'tokenizer.ggml.tokens'[{i}] is not valid UTF-8") from None


def _pre_tokenizer_key(meta: Mapping[str, Any]) -> str:
    # llama.cpp falls back to its "default" regexes when the field is absent.
    pre = _field(meta, "tokenizer.ggml.pre", str, "default")
    if pre not in PRE_TOKENIZER_ALIASES:
        raise TokenizerError(f"GGUF metadata field 'tokenizer.ggml.pre' = {pre!r} is not a supported "
                             f"pre-tokenizer (supported: {', '.join(sorted(PRE_TOKENIZER_ALIASES))})")
    return PRE_TOKENIZER_ALIASES[pre]


def _merges(meta: Mapping[str, Any], vocab: Mapping[str, int]) -> list[tuple[str, str]] | None:
    """``tokenizer.ggml.merges`` as pairs, each side and their concatenation in the vocab."""
    raw = _field(meta, "tokenizer.ggml.merges", list, None)
    if raw is None:
        return None
    out = []
    for k, m in enumerate(raw):
        # llama.cpp splits at the first space after position 0 (a side may start with ' ').
        cut = m.find(" ", 1) if isinstance(m, str) else -1
        if cut < 0:
            raise TokenizerError(f"GGUF metadata field 'tokenizer.ggml.merges'[{k}] = {m!r} is not 'left right'")
        a, b = m[:cut], m[cut + 1:]
        for side in (a, b, a + b):
            if side not in vocab:
                raise TokenizerError(f"GGUF metadata field 'tokenizer.ggml.merges'[{k}] = {m!r}: "
                                     f"{side!r} is not in 'tokenizer.ggml.tokens'")
        out.append((a, b))
    return out


def _vocab(tokens: Sequence[str]) -> dict[str, int]:
    # First id wins for duplicated strings (rare; llama.cpp's text->id map keeps one too).
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)
    return vocab


def _build_gpt2(meta: Mapping[str, Any], tokens: Sequence[str]) -> tuple[_HFTokenizer, bool]:
    """GPT-2 byte-level BPE with llama.cpp's pre-tokenizer for ``tokenizer.ggml.pre``.

    Returns the backend and llama.cpp's add-BOS default for that pre-tokenizer.
    """
    key = _pre_tokenizer_key(meta)
    vocab = _vocab(tokens)
    merges = _merges(meta, vocab)
    if merges is None:
        raise TokenizerError("GGUF metadata field 'tokenizer.ggml.merges' is missing (required by model 'gpt2')")
    tk = _HFTokenizer(models.BPE(vocab, merges, ignore_merges=key in _IGNORE_MERGES))
    splits = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in PRE_TOKENIZER_REGEXES[key]]
    tk.pre_tokenizer = pre_tokenizers.Sequence(
        splits + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tk.decoder = decoders.ByteLevel()
    return tk, key == "llama3"


def _build_llama(meta: Mapping[str, Any], tokens: Sequence[str], types: Sequence[int]) -> _HFTokenizer:
    """SentencePiece BPE with byte fallback, as transformers' GGUF/Llama converters build it."""
    vocab = _vocab(tokens)
    merges = _merges(meta, vocab)
    if merges is None:
        scores = _field(meta, "tokenizer.ggml.scores", list)
        if len(scores) != len(tokens):
            raise TokenizerError(f"GGUF metadata field 'tokenizer.ggml.scores' has {len(scores)} "
                                 f"entries for {len(tokens)} tokens")
        merges = merges_from_scores(tokens, scores)
    unk_ids = [i for i, t in enumerate(types) if t == TOKEN_UNKNOWN]
    unk_id = _field(meta, "tokenizer.ggml.unknown_token_id", int, unk_ids[0] if unk_ids else None)
    unk = tokens[unk_id] if unk_id is not None and 0 <= unk_id < len(tokens) else None
    tk = _HFTokenizer(models.BPE(vocab, merges, unk_token=unk, fuse_unk=True, byte_fallback=True))
    # HF LlamaTokenizer: Metaspace prepends "▁" to the first text run only (and not when it
    # already starts with a space); the decoder strips that one leading space again.
    prefix = _field(meta, "tokenizer.ggml.add_space_prefix", bool, True)
    tk.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first" if prefix else "never",
                                                split=False)
    dec = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    tk.decoder = decoders.Sequence(dec + ([decoders.Strip(" ", 1, 0)] if prefix else []))
    return tk


def merges_from_scores(tokens: Sequence[str], scores: Sequence[float]) -> list[tuple[str, str]]:
    """SentencePiece BPE merges from piece scores (transformers' ``SentencePieceExtractor``).

    Every split ``piece = left + right`` with both sides in the vocab is a merge, ranked by
    the merged piece's score (higher first; SentencePiece BPE scores are minus merge order),
    then by longer left and right sides, then vocab order (transformers' ``generate_merges``).
    Cost: O(total piece length^2 / piece) string slicing, fine for 32k-256k vocabs.
    """
    vocab = _vocab(tokens)
    found = []
    for piece, pid in vocab.items():
        local = [(piece[:k], piece[k:]) for k in range(1, len(piece))
                 if piece[:k] in vocab and piece[k:] in vocab]
        local.sort(key=lambda m: (vocab[m[0]], vocab[m[1]]))
        found.extend((float(scores[pid]), a, b) for a, b in local)
    # Stable sort, best first: score, then longer left side, then longer right side.
    found.sort(key=lambda m: (m[0], len(m[1]), len(m[2])), reverse=True)
    return [(a, b) for _, a, b in found]


def _add_gguf_special_tokens(tk: _HFTokenizer, tokens: Sequence[str], types: Sequence[int]) -> None:
    """Control and unknown tokens as special added tokens, user-defined ones as plain added
    tokens: both are matched atomically before pre-tokenization, as llama.cpp does."""
    special = [AddedToken(tokens[i], special=True, normalized=False)
               for i, t in enumerate(types) if t in (TOKEN_CONTROL, TOKEN_UNKNOWN)]
    user = [AddedToken(tokens[i], special=False, normalized=False)
            for i, t in enumerate(types) if t == TOKEN_USER_DEFINED]
    if special:
        tk.add_special_tokens(special)
    if user:
        tk.add_tokens(user)


def _set_post_processor(tk: _HFTokenizer, bos: tuple[str, int] | None, eos: tuple[str, int] | None) -> None:
    """BOS/EOS (``(text, id)`` or None) added by ``encode(add_special_tokens=True)``."""
    pre, post = [bos] if bos else [], [eos] if eos else []
    words = lambda seq: [t for t, _ in seq]  # noqa: E731
    single = " ".join(words(pre) + ["$A"] + words(post))
    pair = " ".join(words(pre) + ["$A"] + words(post) + ["$B:1"] + words(post))
    tk.post_processor = processors.TemplateProcessing(
        single=single, pair=pair, special_tokens=list(dict.fromkeys(pre + post)))


def _stop_ids(tk: _HFTokenizer, eos: int | None, extra: set[int], special: set[int]) -> frozenset[int]:
    """EOS, explicitly named end ids, and special end-of-turn tokens found in the vocab."""
    stops = set(extra) | ({eos} if eos is not None else set())
    for text in END_OF_TURN_TOKENS:
        i = tk.token_to_id(text)
        if i is not None and i in special:
            stops.add(i)
    return frozenset(stops)


# --- HF folder -------------------------------------------------------------------------------

def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise TokenizerError(f"{path}: cannot read JSON: {e}") from e
    if not isinstance(data, dict):
        raise TokenizerError(f"{path}: expected a JSON object")
    return data


def _token_text(v: Any) -> str | None:
    """A special token entry of tokenizer_config/special_tokens_map: str or {"content": str}."""
    if isinstance(v, dict):
        v = v.get("content")
    return v if isinstance(v, str) else None


def _hf_chat_template(folder: Path, config: Mapping[str, Any]) -> str | None:
    """``chat_template.jinja``, ``chat_template.json`` or tokenizer_config ``chat_template``
    (a string, or a list of ``{name, template}`` of which ``default`` is used)."""
    if (folder / "chat_template.jinja").is_file():
        return (folder / "chat_template.jinja").read_text(encoding="utf-8")
    t = _read_json(folder / "chat_template.json").get("chat_template", config.get("chat_template"))
    if isinstance(t, list):
        named = {d.get("name"): d.get("template") for d in t if isinstance(d, dict)}
        t = named.get("default")
    return t if isinstance(t, str) else None


def from_hf_folder(folder: str | Path) -> Tokenizer:
    """Build a Tokenizer from an HF folder (``tokenizer.json`` plus optional configs).

    ``add_bos_token``/``add_eos_token`` in tokenizer_config override the tokenizer.json
    post-processor when they disagree with it (what transformers' Llama-style fast
    tokenizers do on load).

    Raises:
        TokenizerError: unreadable tokenizer.json or config JSON; a named special token
            missing from the vocab.
    """
    folder = Path(folder)
    try:
        tk = _HFTokenizer.from_file(str(folder / "tokenizer.json"))
    except Exception as e:  # tokenizers raises plain Exception subclasses on bad files
        raise TokenizerError(f"{folder / 'tokenizer.json'}: cannot load: {e}") from e
    config = _read_json(folder / "tokenizer_config.json")
    smap = _read_json(folder / "special_tokens_map.json")
    gen = _read_json(folder / "generation_config.json")

    names = {}
    for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
        text = _token_text(config.get(key)) or _token_text(smap.get(key))
        if text is not None:
            if tk.token_to_id(text) is None:
                raise TokenizerError(f"{folder}: {key} {text!r} is not in the vocab")
            names[key] = text
    bos = tk.token_to_id(names["bos_token"]) if "bos_token" in names else _gen_id(gen, "bos_token_id")
    eos = tk.token_to_id(names["eos_token"]) if "eos_token" in names else None
    gen_eos = _gen_ids(gen, "eos_token_id")
    if eos is None and gen_eos:
        eos = gen_eos[0]
    _apply_add_flags(tk, config, bos, eos)
    special = {i for i, t in tk.get_added_tokens_decoder().items() if t.special}
    stops = _stop_ids(tk, eos, set(gen_eos), special)
    return Tokenizer(tk, bos, eos, stops, _hf_chat_template(folder, config), names, str(folder))


def _gen_ids(gen: Mapping[str, Any], key: str) -> list[int]:
    v = gen.get(key)
    if v is None:
        return []
    vals = v if isinstance(v, list) else [v]
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in vals):
        raise TokenizerError(f"generation_config.json field {key!r} must be an int or a list of ints, got {v!r}")
    return list(vals)


def _gen_id(gen: Mapping[str, Any], key: str) -> int | None:
    ids = _gen_ids(gen, key)
    return ids[0] if ids else None


def _apply_add_flags(tk: _HFTokenizer, config: Mapping[str, Any], bos: int | None, eos: int | None) -> None:
    """Make ``encode(add_special_tokens=True)`` follow tokenizer_config's add_bos/add_eos."""
    if "add_bos_token" not in config and "add_eos_token" not in config:
        return
    probe = tk.encode("", add_special_tokens=True).ids
    has_bos = bool(probe) and bos is not None and probe[0] == bos
    has_eos = bool(probe) and eos is not None and probe[-1] == eos
    want_bos = bool(config.get("add_bos_token", has_bos)) and bos is not None
    want_eos = bool(config.get("add_eos_token", has_eos)) and eos is not None
    if (want_bos, want_eos) != (has_bos, has_eos):
        _set_post_processor(tk, (tk.id_to_token(bos), bos) if want_bos else None,
                            (tk.id_to_token(eos), eos) if want_eos else None)
