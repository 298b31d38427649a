"""One test per malformed-GGUF case: typed LoadError naming the field, < 1 s, memory < file."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from broken import (BOOL, F32, I32, STR, U32, U64, GGUFSpec, GTensor, gstr, kv_array,
                    kv_scalar)
from loadcheck import expect_load_error

from poot.load.errors import LoadError
from poot.load.gguf import read_gguf

BIG = 1 << 62


def _write(tmp_path, spec: GGUFSpec, name: str = "bad.gguf") -> str:
    return spec.write(tmp_path / name)


def _with_kv(key: str, new: bytes) -> GGUFSpec:
    """The default file with pair ``key`` replaced by ``new`` bytes."""
    spec = GGUFSpec()
    spec.kvs = [new if kv[8:8 + len(key)] == key.encode() and
                struct.unpack_from("<Q", kv)[0] == len(key) else kv for kv in spec.kvs]
    return spec


def _with_tensor(i: int, **changes) -> GGUFSpec:
    spec = GGUFSpec()
    for k, v in changes.items():
        setattr(spec.tensors[i], k, v)
    return spec


def test_valid_default_file_parses(tmp_path):
    g = read_gguf(_write(tmp_path, GGUFSpec(), "ok.gguf"))
    assert g.version == 3 and g.alignment == 32
    assert list(g.tensors) == ["a.weight", "b.weight", "c.weight"]
    assert g.tensors["a.weight"].shape == (256, 64)
    assert g.tensors["b.weight"].quant.name == "q8_0"
    assert g.tensors["b.weight"].data.shape == (16, 68)
    assert g.metadata["tokenizer.ggml.add_bos_token"] is True
    assert str(g.metadata_types["tokenizer.ggml.scores"]) == "array[float32]"


def test_bad_magic(tmp_path):
    expect_load_error(read_gguf, _write(tmp_path, GGUFSpec(magic=b"GGUX")), "magic")


def test_unsupported_version(tmp_path):
    expect_load_error(read_gguf, _write(tmp_path, GGUFSpec(version=1)), "version",
                      "not supported")


def test_big_endian_version(tmp_path):
    expect_load_error(read_gguf, _write(tmp_path, GGUFSpec(big_endian_version=True)),
                      "version", "big-endian")


def test_file_shorter_than_header(tmp_path):
    p = tmp_path / "short.gguf"
    p.write_bytes(b"GGUF\x03\0\0\0" + b"\0" * 4)
    # 12 bytes: the traced-memory bound is meaningless at this size; check the error only.
    with pytest.raises(LoadError) as ei:
        read_gguf(p)
    assert ei.value.field == "header"


def test_absurd_tensor_count(tmp_path):
    expect_load_error(read_gguf, _write(tmp_path, GGUFSpec(tensor_count=BIG)), "tensor_count")


def test_absurd_kv_count(tmp_path):
    expect_load_error(read_gguf, _write(tmp_path, GGUFSpec(kv_count=BIG)), "kv_count")


def test_key_length_past_end(tmp_path):
    spec = GGUFSpec()
    spec.kvs[0] = gstr("general.architecture", length=BIG) + spec.kvs[0][8 + 20:]
    expect_load_error(read_gguf, _write(tmp_path, spec), "kv[0].key", "file ends")


def test_string_value_length_past_end(tmp_path):
    bad = gstr("general.name") + struct.pack("<I", STR) + gstr("x", length=BIG)
    expect_load_error(read_gguf, _write(tmp_path, _with_kv("general.name", bad)),
                      "general.name")


def test_numeric_array_length_past_end(tmp_path):
    bad = kv_array("tokenizer.ggml.scores", F32, np.zeros(64, np.float32), length=BIG)
    expect_load_error(read_gguf, _write(tmp_path, _with_kv("tokenizer.ggml.scores", bad)),
                      "tokenizer.ggml.scores", "past the end")


def test_string_array_length_past_end(tmp_path):
    bad = kv_array("tokenizer.ggml.tokens", STR, [f"t{i}" for i in range(64)], length=BIG)
    expect_load_error(read_gguf, _write(tmp_path, _with_kv("tokenizer.ggml.tokens", bad)),
                      "tokenizer.ggml.tokens", "cannot fit")


def test_string_in_array_past_end(tmp_path):
    toks = [f"t{i}" for i in range(64)]
    bad = gstr("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, STR, 64) + \
        b"".join(gstr(t) for t in toks[:3]) + gstr("x", length=BIG)
    expect_load_error(read_gguf, _write(tmp_path, _with_kv("tokenizer.ggml.tokens", bad)),
                      "tokenizer.ggml.tokens[3]")


def test_duplicate_key(tmp_path):
    spec = GGUFSpec()
    spec.kvs.append(kv_scalar("general.name", STR, "again"))
    expect_load_error(read_gguf, _write(tmp_path, spec), "general.name", "duplicate")


def test_duplicate_tensor_name(tmp_path):
    expect_load_error(read_gguf, _write(tmp_path, _with_tensor(2, name="a.weight")),
                      "tensor a.weight", "duplicate")


def test_unknown_value_type(tmp_path):
    bad = kv_scalar("general.name", U32, 7, stored_type=99)
    expect_load_error(read_gguf, _write(tmp_path, _with_kv("general.name", bad)),
                      "general.name", "unknown value type 99")


def test_nested_array(tmp_path):
    bad = gstr("general.tags") + struct.pack("<IIQ", 9, 9, 1)
    spec = GGUFSpec()
    spec.kvs.append(bad)
    expect_load_error(read_gguf, _write(tmp_path, spec), "general.tags", "nested")


def test_invalid_bool(tmp_path):
    bad = kv_scalar("tokenizer.ggml.add_bos_token", BOOL, 7)
    expect_load_error(read_gguf, _write(tmp_path, _with_kv("tokenizer.ggml.add_bos_token",
                                                           bad)),
                      "tokenizer.ggml.add_bos_token", "0 or 1")


def test_alignment_not_uint32(tmp_path):
    bad = kv_scalar("general.alignment", U64, 32)
    expect_load_error(read_gguf, _write(tmp_path, _with_kv("general.alignment", bad)),
                      "general.alignment", "must be uint32")


def test_scores_not_float32_array(tmp_path):
    bad = kv_array("tokenizer.ggml.scores", I32, np.zeros(64, np.int32))
    expect_load_error(read_gguf, _write(tmp_path, _with_kv("tokenizer.ggml.scores", bad)),
                      "tokenizer.ggml.scores", "array[float32]")


def test_tokens_not_string_array(tmp_path):
    bad = kv_array("tokenizer.ggml.tokens", I32, np.zeros(64, np.int32))
    expect_load_error(read_gguf, _write(tmp_path, _with_kv("tokenizer.ggml.tokens", bad)),
                      "tokenizer.ggml.tokens", "array[string]")


def test_token_type_not_int_array(tmp_path):
    bad = kv_array("tokenizer.ggml.token_type", F32, np.ones(64, np.float32))
    expect_load_error(read_gguf, _write(tmp_path, _with_kv("tokenizer.ggml.token_type", bad)),
                      "tokenizer.ggml.token_type", "integer array")


def test_arch_key_wrong_type(tmp_path):
    bad = kv_scalar("llama.block_count", STR, "one")
    expect_load_error(read_gguf, _write(tmp_path, _with_kv("llama.block_count", bad)),
                      "llama.block_count", "integer")


def test_token_arrays_disagree_in_length(tmp_path):
    bad = kv_array("tokenizer.ggml.scores", F32, np.zeros(63, np.float32))
    expect_load_error(read_gguf, _write(tmp_path, _with_kv("tokenizer.ggml.scores", bad)),
                      "tokenizer.ggml.scores", "63 entries")


def test_alignment_zero(tmp_path):
    bad = kv_scalar("general.alignment", U32, 0)
    expect_load_error(read_gguf, _write(tmp_path, _with_kv("general.alignment", bad)),
                      "general.alignment", "power of two")


def test_alignment_not_power_of_two(tmp_path):
    bad = kv_scalar("general.alignment", U32, 48)
    expect_load_error(read_gguf, _write(tmp_path, _with_kv("general.alignment", bad)),
                      "general.alignment", "power of two")


def test_too_many_dims(tmp_path):
    expect_load_error(read_gguf, _write(tmp_path, _with_tensor(2, dims=[2, 2, 2, 2, 8])),
                      "tensor c.weight n_dims", "5 dimensions")


def test_zero_dims(tmp_path):
    expect_load_error(read_gguf, _write(tmp_path, _with_tensor(2, dims=[])),
                      "tensor c.weight n_dims", "0 dimensions")


def test_dim_product_overflows_int64(tmp_path):
    expect_load_error(read_gguf, _write(tmp_path, _with_tensor(0, dims=[1 << 40, 1 << 40])),
                      "tensor a.weight dims", "overflows int64")


def test_dim_past_int64(tmp_path):
    expect_load_error(read_gguf, _write(tmp_path, _with_tensor(0, dims=[(1 << 63) + 1])),
                      "tensor a.weight dims", "exceeds int64")


def test_absurd_element_count(tmp_path):
    expect_load_error(read_gguf, _write(tmp_path, _with_tensor(0, dims=[1 << 31, 1 << 20])),
                      "tensor a.weight dims", "cannot be stored")


def test_unknown_ggml_type(tmp_path):
    expect_load_error(read_gguf, _write(tmp_path, _with_tensor(0, ggml_type=99)),
                      "tensor a.weight type", "unknown ggml tensor type 99")


def test_unsupported_ggml_type(tmp_path):
    expect_load_error(read_gguf, _write(tmp_path, _with_tensor(1, ggml_type=10)),
                      "tensor b.weight type", "Q2_K")


def test_quant_row_not_whole_blocks(tmp_path):
    expect_load_error(read_gguf, _write(tmp_path, _with_tensor(1, dims=[48, 4])),
                      "tensor b.weight dims", "whole number")


def test_offset_not_aligned(tmp_path):
    expect_load_error(read_gguf, _write(tmp_path, _with_tensor(1, offset=65536 + 4)),
                      "tensor b.weight offset", "multiple of the alignment")


def test_offset_outside_file(tmp_path):
    expect_load_error(read_gguf, _write(tmp_path, _with_tensor(1, offset=1 << 40)),
                      "tensor b.weight offset", "outside the file")


def test_overlapping_tensors(tmp_path):
    expect_load_error(read_gguf, _write(tmp_path, _with_tensor(2, offset=32768)),
                      "offset", "overlaps")


def test_truncated_tensor_data(tmp_path):
    expect_load_error(read_gguf, _write(tmp_path, GGUFSpec(truncate=100)),
                      "tensor c.weight data", "truncated")


def test_truncated_inside_metadata(tmp_path):
    spec = GGUFSpec()
    spec.kvs.append(kv_scalar("tokenizer.chat_template", STR, "{{ x }}" * 20000))
    full = spec.build()
    p = tmp_path / "cut.gguf"
    p.write_bytes(full[:len(full) // 2])  # ends inside the 140 KB template string
    expect_load_error(read_gguf, str(p), "tokenizer.chat_template", "file ends")


def test_invalid_utf8_key(tmp_path):
    spec = GGUFSpec()
    spec.kvs.append(gstr(b"bad\xff") + struct.pack("<I", U32) + struct.pack("<I", 1))
    expect_load_error(read_gguf, _write(tmp_path, spec), "kv[", "UTF-8")


def test_version_2_parses(tmp_path):
    g = read_gguf(_write(tmp_path, GGUFSpec(version=2), "v2.gguf"))
    assert g.version == 2 and len(g.tensors) == 3


def test_missing_file(tmp_path):
    with pytest.raises(LoadError) as ei:
        read_gguf(tmp_path / "nope.gguf")
    assert ei.value.field == "file"


def test_dims_are_reversed_into_numpy_order(tmp_path):
    spec = GGUFSpec()
    spec.tensors = [GTensor("t", [4, 3, 2], 0, np.arange(24, dtype=np.float32).tobytes())]
    g = read_gguf(_write(tmp_path, spec, "r.gguf"))
    t = g.tensors["t"]
    assert t.shape == (2, 3, 4) and t.data[1, 2, 3] == 23.0
    assert not t.data.flags.writeable


def test_empty_tensor_name(tmp_path):
    expect_load_error(read_gguf, _write(tmp_path, _with_tensor(1, name="")),
                      "tensor[1].name", "empty")


def test_not_a_regular_file(tmp_path):
    with pytest.raises(LoadError) as ei:
        read_gguf(tmp_path)
    assert ei.value.field == "file" and "regular file" in ei.value.problem


def test_every_truncation_and_byte_flip_is_a_load_error_or_valid(tmp_path):
    """Fuzz: cutting the file anywhere or corrupting any header byte never escapes as
    anything but LoadError (no IndexError, struct.error, MemoryError, ...)."""
    full = GGUFSpec().build()
    header_end = full.index(b"c.weight") + 64
    p = tmp_path / "fuzz.gguf"
    rng = np.random.default_rng(0)
    cuts = list(range(0, header_end, 7)) + [len(full) - 1]
    flips = [(int(i), int(v)) for i, v in zip(rng.integers(0, header_end, 400),
                                               rng.integers(0, 256, 400))]
    for cut in cuts:
        p.write_bytes(full[:cut])
        with pytest.raises(LoadError):
            read_gguf(p)
    for i, v in flips:
        b = bytearray(full)
        b[i] = v
        p.write_bytes(bytes(b))
        try:
            read_gguf(p)
        except LoadError:
            pass
