"""WeightStore/StoredTensor: GGUF files written by gguf-py read back exactly; packed row
permutation; the llama Q/K un-permutation."""

from __future__ import annotations

import gguf
import ml_dtypes
import numpy as np
import pytest
from broken import random_blocks

from poot.dialects.quant import BY_NAME, FORMATS
from poot.dialects.quant_ref import dequantize
from poot.load.checkpoint import open_weights
from poot.load.gguf import read_gguf
from poot.load.store import DType, llama_rotary_permute_rows, llama_rotary_unpermute_rows


def _gguf_py_file(tmp_path, version_alignment=None):
    """A GGUF written by the independent gguf-py writer with dense and packed tensors."""
    rng = np.random.default_rng(1)
    path = str(tmp_path / "w.gguf")
    w = gguf.GGUFWriter(path, "llama")
    if version_alignment:
        w.add_custom_alignment(version_alignment)
    w.add_uint32("llama.block_count", 2)
    w.add_array("test.floats", [1.5, 2.5])
    w.add_array("test.strings", ["a", "bé"])
    w.add_bool("test.flag", True)
    dense = {"f32": rng.standard_normal((3, 4, 5)).astype(np.float32),
             "f16": rng.standard_normal((6, 7)).astype(np.float16),
             "i32": np.arange(10, dtype=np.int32)}
    for k, v in dense.items():
        w.add_tensor(k, v)
    bf = rng.standard_normal((4, 8)).astype(np.float32)
    w.add_tensor("bf16", bf.astype(ml_dtypes.bfloat16).view(np.uint16).view(np.uint8)
                 .reshape(4, 16), raw_dtype=gguf.GGMLQuantizationType.BF16)
    packed = {}
    for fmt in FORMATS:
        rows = 3
        q = random_blocks(fmt, rows * 2, seed=fmt.ggml_type).reshape(rows, -1)
        packed[fmt.name] = q
        w.add_tensor(fmt.name, q, raw_dtype=gguf.GGMLQuantizationType(fmt.ggml_type))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path, dense, packed


@pytest.mark.parametrize("alignment", [None, 64])
def test_gguf_py_file_matches_ggufreader(tmp_path, alignment):
    path, dense, packed = _gguf_py_file(tmp_path, alignment)
    g = read_gguf(path)
    ref = gguf.GGUFReader(path)
    assert g.alignment == (alignment or 32) and g.version == 3
    assert list(g.tensors) == [t.name for t in ref.tensors]
    for t in ref.tensors:
        ours = g.tensors[t.name]
        assert ours.shape == tuple(int(d) for d in reversed(t.shape))
        assert ours.nbytes == t.n_bytes
        assert np.array_equal(ours.data.view(np.uint8).reshape(-1),
                              np.asarray(t.data).view(np.uint8).reshape(-1))
    for k, v in dense.items():
        assert g.tensors[k].data.dtype == v.dtype and np.array_equal(g.tensors[k].data, v)
    assert g.tensors["bf16"].dtype is DType.BF16
    for name, q in packed.items():
        t = g.tensors[name]
        assert t.quant is BY_NAME[name] and t.data.shape == q.shape
        assert t.shape == (3, 2 * t.quant.block_elems)
    assert g.metadata["llama.block_count"] == 2
    assert g.metadata["test.strings"] == ["a", "bé"] and g.metadata["test.flag"] is True
    assert g.metadata["test.floats"].dtype == np.float32
    assert not g.metadata["test.floats"].flags.writeable
    assert str(g.metadata_types["llama.block_count"]) == "uint32"


def test_take_rows_stays_packed_and_exact(tmp_path):
    path, _, _ = _gguf_py_file(tmp_path)
    store = open_weights(path)
    for fmt in FORMATS:
        t = store[fmt.name]
        idx = np.array([2, 0, 1])
        p = t.take_rows(idx)
        assert p.quant is fmt and p.shape == t.shape and not p.is_mapped
        full = dequantize(fmt, t.data, t.shape)
        assert np.array_equal(dequantize(fmt, p.data, p.shape), full[idx])
    store.replace(store["q4_1"].take_rows([0, 1, 2]))
    assert store.resident_bytes() == store["q4_1"].nbytes > 0


def test_take_rows_rejects_out_of_range(tmp_path):
    path, _, _ = _gguf_py_file(tmp_path)
    with pytest.raises(ValueError):
        open_weights(path)["q8_0"].take_rows([3])


@pytest.mark.parametrize("n_head,head_dim", [(4, 8), (3, 64), (1, 2)])
def test_llama_rotary_unpermute_undoes_convert_hf_to_gguf(n_head, head_dim):
    rows, cols = n_head * head_dim, 5
    w = np.random.default_rng(0).standard_normal((rows, cols)).astype(np.float32)
    # llama.cpp convert_hf_to_gguf.py LlamaModel.permute
    stored = w.reshape(n_head, 2, rows // n_head // 2, cols).swapaxes(1, 2).reshape(rows, cols)
    assert np.array_equal(stored[llama_rotary_unpermute_rows(rows, n_head)], w)


@pytest.mark.parametrize("n_head,head_dim", [(4, 8), (3, 64), (1, 2)])
def test_llama_rotary_permute_lays_hf_rows_out_as_convert_hf_to_gguf(n_head, head_dim):
    rows, cols = n_head * head_dim, 5
    w = np.random.default_rng(1).standard_normal((rows, cols)).astype(np.float32)
    stored = w.reshape(n_head, 2, rows // n_head // 2, cols).swapaxes(1, 2).reshape(rows, cols)
    assert np.array_equal(w[llama_rotary_permute_rows(rows, n_head)], stored)


def test_llama_rotary_unpermute_rejects_odd_heads():
    with pytest.raises(ValueError):
        llama_rotary_unpermute_rows(12, 4)
