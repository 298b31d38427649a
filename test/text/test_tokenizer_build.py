"""Tokenizers built from GGUF metadata (gpt2, llama/SentencePiece) and from an HF folder, plus
the typed errors for malformed metadata. No checkpoint needed."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tokenizers import AddedToken, Tokenizer as HFTokenizer, decoders, models, pre_tokenizers, processors, trainers

from text_helpers import tiny_gpt2_meta, tiny_spm_meta

from poot.errors import PootError
from poot.text.chat import render_chat
from poot.text.tokenizer import (PRE_TOKENIZER_ALIASES, TokenizerError, from_gguf_metadata,
                                 load_tokenizer, merges_from_scores)


# --- gpt2 (byte-level BPE) --------------------------------------------------------------------

def test_gpt2_merges_and_specials():
    tok = from_gguf_metadata(tiny_gpt2_meta())
    ids = tok.encode("hello the world")
    assert [tok.id_to_token(i) for i in ids] == ["he", "l", "l", "o", "Ġthe", "Ġworld"]
    assert tok.decode(tok.encode("<|start|>x<|end|>")) == "<|start|>x<|end|>"
    assert tok.encode("<|start|>x")[0] == 1  # control token matched atomically
    assert tok.decode(tok.encode("<|start|>x<|end|>"), skip_special_tokens=True) == "x"
    assert tok.special_ids == frozenset({0, 1})


def test_gpt2_numeric_arrays_and_add_bos():
    meta = tiny_gpt2_meta(**{"tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.add_eos_token": True})
    meta["tokenizer.ggml.token_type"] = np.asarray(meta["tokenizer.ggml.token_type"], np.int32)
    tok = from_gguf_metadata(meta)
    assert tok.encode("the") == [1, tok.token_to_id("t"), tok.token_to_id("he"), 0]
    assert tok.encode("the", add_special_tokens=False)[0] != 1


@pytest.mark.parametrize("pre, text, pieces", [
    ("gpt2", "x 1234", ["x", " 1234"]),
    ("smollm", "x 1234", ["x", " ", "1", "2", "3", "4"]),
    ("llama-bpe", "x 1234", ["x", " ", "123", "4"]),
    ("qwen2", "x 12", ["x", " ", "1", "2"]),
    ("llama3", "I'LL go", ["I", "'LL", " go"]),
    ("gpt2", "a  b", ["a", " ", " b"]),
    ("deepseek-coder", "ab, 12", ["ab", ",", " ", "1", "2"]),
])
def test_pre_tokenizer_splits(pre, text, pieces):
    """Word pieces per llama.cpp's pre-tokenizer table (checked through decode of each piece)."""
    tok = from_gguf_metadata(tiny_gpt2_meta(**{"tokenizer.ggml.pre": pre}))
    words = tok.backend.pre_tokenizer.pre_tokenize_str(text)
    byte_dec = decoders.ByteLevel()
    assert [byte_dec.decode([w]) for w, _ in words] == pieces


def test_every_pre_alias_builds():
    for pre in PRE_TOKENIZER_ALIASES:
        tok = from_gguf_metadata(tiny_gpt2_meta(**{"tokenizer.ggml.pre": pre}))
        text = "Hello, World! 12345 ünï 北京 \n\n  x"
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == text, pre


# --- llama (SentencePiece BPE, byte fallback) -------------------------------------------------

def test_spm_encode_decode():
    tok = from_gguf_metadata(tiny_spm_meta())
    ids = tok.encode("hello world")
    assert ids[0] == 1 and [tok.id_to_token(i) for i in ids[1:]] == ["▁hello", "▁world"]
    assert tok.decode(ids, skip_special_tokens=True) == "hello world"
    # é and 北 are not pieces: they fall back to their UTF-8 bytes and decode back.
    ids = tok.encode("héllo 北", add_special_tokens=False)
    assert "<0xC3>" in [tok.id_to_token(i) for i in ids]
    assert tok.decode(ids) == "héllo 北"
    # The "▁" prefix goes on the first text run only (HF LlamaTokenizer, Metaspace "first").
    assert tok.id_to_token(tok.encode("a</s>hello")[-1]) == "hello"
    assert tok.stop_ids == frozenset({2})


def test_spm_no_space_prefix():
    tok = from_gguf_metadata(tiny_spm_meta(**{"tokenizer.ggml.add_space_prefix": False,
                                              "tokenizer.ggml.add_bos_token": False}))
    assert [tok.id_to_token(i) for i in tok.encode("hello")] == ["hello"]
    assert tok.decode(tok.encode(" hello world")) == " hello world"


def test_merges_from_scores_order():
    merges = merges_from_scores(["a", "b", "c", "ab", "abc", "bc"], [0, 0, 0, -1.0, -2.0, -3.0])
    # "ab" (score -1) first; "abc" splits both ways at score -2, longer left side first.
    assert merges == [("a", "b"), ("ab", "c"), ("a", "bc"), ("b", "c")]


def test_gguf_file_through_loader(tmp_path):
    """A real GGUF file (written with gguf.GGUFWriter) loads through poot.load.gguf.read_gguf."""
    gguf = pytest.importorskip("gguf")
    meta = tiny_spm_meta()
    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "llama")
    w.add_tokenizer_model("llama")
    w.add_token_list(meta["tokenizer.ggml.tokens"])
    w.add_token_types(meta["tokenizer.ggml.token_type"])
    w.add_token_scores(meta["tokenizer.ggml.scores"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_chat_template("{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}")
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    tok = load_tokenizer(tmp_path / "m.gguf")
    assert tok.decode(tok.encode("this is the test"), skip_special_tokens=True) == "this is the test"
    assert render_chat(tok, [{"role": "user", "content": "hi"}]) == "[user]hi"
    assert load_tokenizer(tmp_path).source == str(tmp_path / "m.gguf")  # folder with one .gguf


# --- HF folder ----------------------------------------------------------------------------------

def _write_hf_folder(folder, config: dict, generation: dict | None = None, bos_in_post: bool = False):
    tk = HFTokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    specials = ["<s>", "</s>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator(["hello world, the quick brown fox"] * 20 + ["北京 emoji 🎉"], trainer)
    if bos_in_post:
        tk.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    tk.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    if generation is not None:
        (folder / "generation_config.json").write_text(json.dumps(generation))
    return folder


def test_hf_folder(tmp_path):
    template = ("{% for m in messages %}{{ bos_token }}{{ m['role'] }}: {{ m['content'] }}{{ eos_token }}\n"
                "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}")
    _write_hf_folder(tmp_path, {"bos_token": "<s>", "eos_token": {"content": "</s>"}, "add_bos_token": True,
                                "chat_template": template}, {"eos_token_id": [1, 2]})
    tok = load_tokenizer(tmp_path)
    assert (tok.bos_id, tok.eos_id) == (0, 1)
    ids = tok.encode("hello 北京 🎉")
    assert ids[0] == 0 and tok.decode(ids, skip_special_tokens=True) == "hello 北京 🎉"
    assert tok.encode("hello", add_special_tokens=False)[0] != 0
    assert tok.stop_ids == frozenset({1, 2})
    assert render_chat(tok, [{"role": "user", "content": "hi"}]) == "<s>user: hi</s>\nassistant:"


def test_hf_folder_config_disables_bos(tmp_path):
    _write_hf_folder(tmp_path, {"bos_token": "<s>", "add_bos_token": False}, bos_in_post=True)
    tok = load_tokenizer(tmp_path)
    assert tok.encode("hello")[0] != 0 and tok.chat_template is None


def test_hf_folder_bad_generation_config(tmp_path):
    _write_hf_folder(tmp_path, {}, {"eos_token_id": "x"})
    with pytest.raises(TokenizerError, match="eos_token_id"):
        load_tokenizer(tmp_path)


# --- typed errors ------------------------------------------------------------------------------

def _drop(meta, key):
    del meta[key]
    return meta


@pytest.mark.parametrize("meta, field", [
    (_drop(tiny_gpt2_meta(), "tokenizer.ggml.model"), "tokenizer.ggml.model"),
    (_drop(tiny_gpt2_meta(), "tokenizer.ggml.tokens"), "tokenizer.ggml.tokens"),
    (_drop(tiny_gpt2_meta(), "tokenizer.ggml.merges"), "tokenizer.ggml.merges"),
    (tiny_gpt2_meta(**{"tokenizer.ggml.model": "bert"}), "tokenizer.ggml.model"),
    (tiny_gpt2_meta(**{"tokenizer.ggml.pre": "no-such-pre"}), "tokenizer.ggml.pre"),
    (tiny_gpt2_meta(**{"tokenizer.ggml.tokens": "abc"}), "tokenizer.ggml.tokens"),
    (tiny_gpt2_meta(**{"tokenizer.ggml.token_type": [1, 1]}), "tokenizer.ggml.token_type"),
    (tiny_gpt2_meta(**{"tokenizer.ggml.merges": ["Ġ t", "x y"]}), "tokenizer.ggml.merges"),
    (tiny_gpt2_meta(**{"tokenizer.ggml.merges": ["nospace"]}), "tokenizer.ggml.merges"),
    (tiny_gpt2_meta(**{"tokenizer.ggml.bos_token_id": 10**6}), "tokenizer.ggml.bos_token_id"),
    (tiny_gpt2_meta(**{"tokenizer.ggml.eos_token_id": "2"}), "tokenizer.ggml.eos_token_id"),
    (tiny_gpt2_meta(**{"tokenizer.ggml.add_bos_token": 1}), "tokenizer.ggml.add_bos_token"),
    (_drop(tiny_spm_meta(), "tokenizer.ggml.scores"), "tokenizer.ggml.scores"),
    (tiny_spm_meta(**{"tokenizer.ggml.scores": [0.0]}), "tokenizer.ggml.scores"),
])
def test_bad_metadata_is_typed(meta, field):
    with pytest.raises(TokenizerError, match=field.replace(".", r"\.")) as err:
        from_gguf_metadata(meta)
    assert isinstance(err.value, PootError)


def test_bad_ids_and_paths(tmp_path):
    tok = from_gguf_metadata(tiny_gpt2_meta())
    with pytest.raises(TokenizerError, match="out of range"):
        tok.decode([tok.vocab_size])
    with pytest.raises(TokenizerError, match="out of range"):
        tok.id_to_token(-1)
    assert tok.token_to_id("no such token") is None
    with pytest.raises(TokenizerError, match="no such file"):
        load_tokenizer(tmp_path / "missing.gguf")
    (tmp_path / "x.bin").write_bytes(b"\0" * 64)
    with pytest.raises(TokenizerError, match="neither a GGUF"):
        load_tokenizer(tmp_path / "x.bin")
    with pytest.raises(TokenizerError, match="tokenizer.json"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="cannot load"):
        load_tokenizer(tmp_path)
