"""StreamDecoder: deltas never hold a broken UTF-8 character and join to decode(all ids).

Byte-level BPE (SmolLM2) splits emoji/CJK into byte tokens; SentencePiece splits unknown
characters into <0xAB> byte-fallback pieces; both are fed one id at a time.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from text_helpers import tiny_spm_meta

from poot.text.stream import StreamDecoder
from poot.text.tokenizer import from_gguf_metadata

FFFD = "\ufffd"
TRICKY = ["👩‍👩‍👧 family", "北京是中国的首都。", "한국어 텍스트", "🎉🎉🎉", "naïve café", "a😀b", "x\u0301y",
          "mixed 日本語 and emoji 🤖 in one", "<|im_end|>🎉<|im_start|>"]


def _stream(tok, ids, **kw):
    dec = StreamDecoder(tok, **kw)
    return [dec.push(i) for i in ids] + [dec.finish()]


def _check(tok, ids, skip=False):
    deltas = _stream(tok, ids, skip_special_tokens=skip)
    full = tok.decode(ids, skip_special_tokens=skip)
    assert "".join(deltas) == full
    if FFFD not in full:
        assert not any(FFFD in d for d in deltas)
    return deltas


@pytest.mark.parametrize("text", TRICKY)
def test_smollm2_tricky_strings(smollm2, text):
    ids = smollm2.encode(text)
    deltas = _check(smollm2, ids)
    assert "".join(deltas) == text
    _check(smollm2, ids, skip=True)


def test_emoji_held_until_complete(smollm2):
    ids = smollm2.encode("🎉")
    assert len(ids) > 1  # the emoji spans several byte-level tokens
    dec = StreamDecoder(smollm2)
    out = [dec.push(i) for i in ids]
    assert out[:-1] == [""] * (len(ids) - 1) and out[-1] == "🎉"


def test_incomplete_tail_flushed_on_finish(smollm2):
    ids = smollm2.encode("ok 🎉")[:-1]  # drop the last byte token
    dec = StreamDecoder(smollm2)
    text = "".join(dec.push(i) for i in ids)
    assert FFFD not in text
    assert text + dec.finish() == smollm2.decode(ids)


def test_context_seed_decodes_in_context():
    tok = from_gguf_metadata(tiny_spm_meta())
    prompt = tok.encode("hello")
    new = tok.encode("hello world", add_special_tokens=False)[1:]  # "▁world"
    dec = StreamDecoder(tok, context=prompt)
    assert dec.push(new[0]) == " world"  # the leading space is kept mid-text
    assert dec.ids == new


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=40))
def test_smollm2_any_text(smollm2, text):
    _check(smollm2, smollm2.encode(text))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.integers(0, 49151), max_size=30) | st.lists(st.integers(17, 272), max_size=30))
def test_smollm2_any_ids(smollm2, ids):
    """Arbitrary ids, including lone or invalid UTF-8 bytes (the 256 byte symbols)."""
    deltas = _stream(smollm2, ids)
    assert "".join(deltas) == smollm2.decode(ids)
    assert not any(d.endswith(FFFD) for d in deltas[:-1]) or FFFD in smollm2.decode(ids)


_SPM = from_gguf_metadata(tiny_spm_meta())


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet="▁ abcdehilnorstwy,.é北🎉\n", max_size=30))
def test_spm_byte_fallback_text(text):
    _check(_SPM, _SPM.encode(text))
    _check(_SPM, _SPM.encode(text), skip=True)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, _SPM.vocab_size - 1), max_size=30))
def test_spm_any_ids(ids):
    """Random SentencePiece ids: exact unless an invalid byte-fallback run is involved (see
    poot.text.stream: HF's ByteFallback rewrites a whole invalid run to U+FFFD)."""
    full = _SPM.decode(ids)
    deltas = _stream(_SPM, ids)
    if FFFD not in full:
        assert "".join(deltas) == full
