"""Random weights packed in GGUF block formats (``--random-weights --dtype q4_1``): matrices
quantized by the ``gguf`` package's reference quantizer, vectors f32; decoding the blocks
gives back the random floats within the format's own error."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from poot.dialects.types import DType, PackedType, TensorType

CONFIG = Path(__file__).resolve().parents[2] / "bench" / "shapes" / "smollm2-135m.json"


def _tiny_config(tmp_path):
    import json

    cfg = json.loads(CONFIG.read_text())
    cfg.update(hidden_size=64, intermediate_size=128, num_hidden_layers=2, vocab_size=256,
               num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    return p


@pytest.mark.parametrize("fmt,tol", [("q4_1", 0.09), ("q8_0", 0.006)])
def test_matrices_packed_vectors_f32(tmp_path, fmt, tol):
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    from poot.models.random_init import load_random_model

    dense_model, dense = load_random_model(_tiny_config(tmp_path), "f32", seed=3)
    model, weights = load_random_model(_tiny_config(tmp_path), fmt, seed=3)
    assert weights.types.keys() == dense.types.keys()
    for name, t in weights.types.items():
        if len(dense.types[name].shape) == 1:
            assert t == TensorType(dense.types[name].shape, DType.F32), name
            continue
        assert isinstance(t, PackedType) and t.format.name == fmt, name
        got = dequantize(np.asarray(weights[name]), GGMLQuantizationType[fmt.upper()])
        want = np.asarray(dense[name], np.float32).reshape(got.shape)
        scale = np.abs(want).max()
        assert np.abs(got - want).max() <= tol * scale, name


def test_unknown_format_is_refused(tmp_path):
    from poot.models.base import ModelError
    from poot.models.random_init import load_random_model

    with pytest.raises(ModelError, match="q4_1"):
        load_random_model(_tiny_config(tmp_path), "q3_k")


def _big_config(tmp_path):
    """A 4096 x 65536-vocab, 24-layer config (over 5 GiB of bf16 weights)."""
    import json

    cfg = json.loads(_tiny_config(tmp_path).read_text())
    cfg.update(hidden_size=4096, intermediate_size=14336, num_hidden_layers=24,
               vocab_size=65536, num_attention_heads=32, num_key_value_heads=8, head_dim=128)
    p = tmp_path / "big.json"
    p.write_text(json.dumps(cfg))
    return p


@pytest.mark.parametrize("dtype", ["bf16", "q4_0"])
def test_weights_past_this_machines_memory_are_refused_before_allocating(tmp_path, dtype,
                                                                         monkeypatch):
    """A config whose random weights would not fit (here: a machine said to have 1 GiB, and
    a 4096 x 65536-vocab model: 0.5 GiB of embeddings and 0.5 of head in bf16, 2 x 24
    layers of 4096 x 4096 projections) is refused with the bytes needed, before a weight is
    made (RandomArray is never built)."""
    from poot.models import random_init
    from poot.models.base import ModelError

    p = _big_config(tmp_path)
    monkeypatch.setattr(random_init, "_memory_bytes", lambda: 1 << 30)
    monkeypatch.setattr(random_init, "RandomArray", None)      # any weight made would fail
    with pytest.raises(ModelError, match=r"need [\d,.]+ GiB, more than this machine's 1\.0 GiB"):
        random_init.load_random_model(p, dtype)


def test_types_only_past_memory_for_a_compile(tmp_path, monkeypatch):
    """``check_memory=False`` (what ``poot compile`` uses: compiling reads the weights' types,
    never their data) binds a config past this machine's memory: every weight typed, none
    materialized."""
    from poot.models import random_init

    p = _big_config(tmp_path)
    monkeypatch.setattr(random_init, "_memory_bytes", lambda: 1 << 30)
    model, weights = random_init.load_random_model(p, "bf16", check_memory=False)
    assert sum(t.nbytes for t in weights.types.values()) > 5 * (1 << 30)
    assert weights.types["blk.23.ffn.down"].shape == (4096, 14336)
