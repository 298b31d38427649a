"""safetensors: round-trips vs the reference library, sharded folders, one test per malformed
case (typed LoadError naming the field, < 1 s, traced memory < file size)."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest
from broken import st_bytes, st_valid, write_bytes
from loadcheck import expect_load_error
from safetensors.numpy import load_file, save_file

from poot.load.checkpoint import open_weights
from poot.load.errors import LoadError
from poot.load.safetensors import open_hf_folder, read_safetensors
from poot.load.store import DType

RNG = np.random.default_rng(0)
# A 64 KiB tensor so that the file, not Python's constant overhead, sets the memory bound.
BODY = {"w": RNG.standard_normal((128, 128)).astype(np.float32),
        "b": RNG.standard_normal(64).astype(np.float32)}


def _read(path):
    return read_safetensors(path)


def _bad(tmp_path, header, data=None, header_len=None, name="bad.safetensors") -> str:
    h, buf = st_valid(BODY)
    return write_bytes(tmp_path / name, st_bytes(header(h) if callable(header) else header,
                                                 buf if data is None else data, header_len))


# --- round trips ------------------------------------------------------------------------------

def test_roundtrip_f32_f16_int_vs_reference_writer(tmp_path):
    ts = {"f32": RNG.standard_normal((3, 5)).astype(np.float32),
          "f16": RNG.standard_normal((4, 2, 3)).astype(np.float16),
          "i64": np.arange(7, dtype=np.int64), "u8": np.arange(9, dtype=np.uint8),
          "scalar": np.array(2.5, dtype=np.float32)}
    p = str(tmp_path / "m.safetensors")
    save_file(ts, p, metadata={"format": "np"})
    tensors, meta = read_safetensors(p)
    assert meta == {"format": "np"}
    ref = load_file(p)
    assert set(tensors) == set(ref)
    for k, t in tensors.items():
        assert t.data.dtype == ref[k].dtype and t.shape == ref[k].shape
        assert np.array_equal(t.data, ref[k])
        assert t.is_mapped and not t.data.flags.writeable
    assert tensors["f16"].dtype is DType.F16


def test_bf16_stays_bf16_words(tmp_path):
    x = RNG.standard_normal((6, 8)).astype(ml_dtypes.bfloat16)
    h, buf = st_valid({"x": x})
    p = write_bytes(tmp_path / "bf.safetensors", st_bytes(h, buf))
    t = read_safetensors(p)[0]["x"]
    assert t.dtype is DType.BF16 and t.data.dtype == np.dtype(ml_dtypes.bfloat16)
    assert t.data.itemsize == 2 and t.nbytes == x.nbytes and t.is_mapped
    assert np.array_equal(t.data.view(np.uint16), x.view(np.uint16))
    # The reference implementation accepts our hand-written BF16 file too.
    from safetensors import safe_open
    with safe_open(p, framework="numpy") as f:
        assert list(f.keys()) == ["x"]


def test_single_file_store_has_no_resident_bytes(tmp_path):
    p = str(tmp_path / "model.safetensors")
    save_file(BODY, p)
    store = open_weights(p)
    assert store.resident_bytes() == 0
    assert store.mapped_bytes() == sum(a.nbytes for a in BODY.values())


def _write_sharded(folder, index_map=None):
    a = {"x.weight": RNG.standard_normal((128, 128)).astype(np.float32)}
    b = {"y.weight": RNG.standard_normal((2, 8)).astype(np.float16),
         "z.bias": np.arange(3, dtype=np.float32)}
    save_file(a, str(folder / "model-00001-of-00002.safetensors"))
    save_file(b, str(folder / "model-00002-of-00002.safetensors"))
    wm = index_map or {"x.weight": "model-00001-of-00002.safetensors",
                       "y.weight": "model-00002-of-00002.safetensors",
                       "z.bias": "model-00002-of-00002.safetensors"}
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 0}, "weight_map": wm}))
    return {**a, **b}


def test_sharded_index(tmp_path):
    ref = _write_sharded(tmp_path)
    store = open_weights(tmp_path)
    assert set(store) == set(ref) and len(store.files) == 2
    for k, v in ref.items():
        assert np.array_equal(store[k].data, v)
    assert store.resident_bytes() == 0


def test_sharded_index_missing_shard(tmp_path):
    _write_sharded(tmp_path, {"x.weight": "model-00001-of-00002.safetensors",
                              "y.weight": "model-00003-of-00003.safetensors"})
    expect_load_error(open_hf_folder, tmp_path, "weight_map.y.weight", "does not exist")


def test_sharded_index_tensor_missing_from_shard(tmp_path):
    _write_sharded(tmp_path, {"x.weight": "model-00001-of-00002.safetensors",
                              "q.weight": "model-00002-of-00002.safetensors"})
    expect_load_error(open_hf_folder, tmp_path, "q.weight", "missing from this shard")


def test_sharded_index_shard_outside_folder(tmp_path):
    _write_sharded(tmp_path, {"x.weight": "../model-00001-of-00002.safetensors"})
    expect_load_error(open_hf_folder, tmp_path, "weight_map.x.weight", "outside the folder")


def test_folder_without_weights(tmp_path):
    with pytest.raises(LoadError) as ei:
        open_weights(tmp_path)
    assert ei.value.field == "path"


# --- malformed single files -------------------------------------------------------------------

def test_file_shorter_than_length_prefix(tmp_path):
    p = write_bytes(tmp_path / "tiny.safetensors", b"\x01\x02")
    with pytest.raises(LoadError) as ei:
        read_safetensors(p)
    assert ei.value.field == "header length"


def test_header_length_past_end_of_file(tmp_path):
    expect_load_error(_read, _bad(tmp_path, lambda h: h, header_len=1 << 20),
                      "header length", "past the end")


def test_header_length_over_100mb(tmp_path):
    expect_load_error(_read, _bad(tmp_path, lambda h: h, header_len=(1 << 62)),
                      "header length", "limit")


def test_header_not_json(tmp_path):
    expect_load_error(_read, _bad(tmp_path, b"{not json"), "header", "not valid JSON")


def test_header_not_utf8(tmp_path):
    expect_load_error(_read, _bad(tmp_path, b'{"\xff": 1}'), "header", "UTF-8")


def test_header_not_object(tmp_path):
    expect_load_error(_read, _bad(tmp_path, [1, 2, 3]), "header", "JSON object")


def test_header_duplicate_key(tmp_path):
    h, _ = st_valid(BODY)
    raw = json.dumps(h)[:-1] + ', "w": ' + json.dumps(h["w"]) + "}"
    expect_load_error(_read, _bad(tmp_path, raw.encode()), "w", "duplicate")


def test_entry_missing_field(tmp_path):
    def header(h):
        del h["w"]["shape"]
        return h
    expect_load_error(_read, _bad(tmp_path, header), "w", "dtype, shape and data_offsets")


def test_entry_bad_shape(tmp_path):
    def header(h):
        h["w"]["shape"] = [128, -128]
        return h
    expect_load_error(_read, _bad(tmp_path, header), "w.shape", "non-negative")


def test_entry_bad_offsets(tmp_path):
    def header(h):
        h["w"]["data_offsets"] = [10]
        return h
    expect_load_error(_read, _bad(tmp_path, header), "w.data_offsets", "[begin, end]")


def test_metadata_not_strings(tmp_path):
    def header(h):
        h["__metadata__"] = {"n": 3}
        return h
    expect_load_error(_read, _bad(tmp_path, header), "__metadata__", "strings")


def test_unknown_dtype(tmp_path):
    def header(h):
        h["w"]["dtype"] = "F12"
        return h
    expect_load_error(_read, _bad(tmp_path, header), "w.dtype", "unknown dtype 'F12'")


def test_size_disagrees_with_offsets(tmp_path):
    def header(h):
        h["w"]["dtype"] = "F16"  # half the bytes the offsets span
        return h
    expect_load_error(_read, _bad(tmp_path, header), "w.data_offsets", "needs 32768 bytes")


def test_overlapping_offsets(tmp_path):
    def header(h):
        h["b"]["data_offsets"] = [65536 - 128, 65536 + 128]
        return h
    expect_load_error(_read, _bad(tmp_path, header), "data_offsets", "overlaps")


def test_hole_between_tensors(tmp_path):
    def header(h):
        h["b"]["data_offsets"] = [65536 + 4, 65536 + 260]
        return h
    h, buf = st_valid(BODY)
    p = _bad(tmp_path, header, data=buf + b"\0" * 4)
    expect_load_error(_read, p, "b.data_offsets", "hole")


def test_trailing_bytes_hole(tmp_path):
    h, buf = st_valid(BODY)
    expect_load_error(_read, _bad(tmp_path, h, data=buf + b"\0" * 16), "data_offsets", "hole")


def test_offsets_past_end_of_file(tmp_path):
    h, buf = st_valid(BODY)
    expect_load_error(_read, _bad(tmp_path, h, data=buf[:-100]), "b.data_offsets",
                      "past the end")


def test_open_weights_on_safetensors_file(tmp_path):
    """open_weights dispatches a .safetensors path to this reader."""
    p = str(tmp_path / "model.safetensors")
    save_file(BODY, p)
    store = open_weights(p)
    assert store.kind == "safetensors" and set(store) == set(BODY)


def test_every_truncation_and_byte_flip_is_a_load_error_or_valid(tmp_path):
    """Fuzz: any cut or corrupted header byte is a LoadError or still a valid file."""
    h, buf = st_valid(BODY)
    full = st_bytes(h, buf)
    n_header = 8 + len(json.dumps(h))
    p = tmp_path / "fuzz.safetensors"
    for cut in list(range(0, n_header, 3)) + [len(full) - 1]:
        p.write_bytes(full[:cut])
        with pytest.raises(LoadError):
            read_safetensors(p)
    rng = np.random.default_rng(0)
    for i, v in zip(rng.integers(0, n_header, 400), rng.integers(0, 256, 400)):
        b = bytearray(full)
        b[int(i)] = int(v)
        p.write_bytes(bytes(b))
        try:
            read_safetensors(p)
        except LoadError:
            pass
