"""Pooled steps on Vulkan (lavapipe in CI): embeddings of the decoder and BERT fixtures and
the cross-encoder's scores equal the recorded sentence-transformers / HF references."""

from __future__ import annotations

import os

import numpy as np
import pytest

from model_steps import fixture_path, reference
from poot.api.pooling import PoolingModel

TOL = 1e-4


def _rows(ref, key="input_ids"):
    return [[int(x) for x in r[:n]] for r, n in zip(ref[key], ref["lengths"])]


@pytest.mark.parametrize("name", ["qwen3_embed", "bert_embed", "bert_cross_encoder"])
def test_pooled_outputs_equal_reference_on_vulkan(vk_device, tmp_path_factory, name):
    cache = os.environ.get("POOT_CACHE_DIR") or tmp_path_factory.mktemp("poot-cache")
    pm = PoolingModel.load(fixture_path(name), backend="vulkan", max_batch=4, max_tokens=16,
                           cache_dir=cache)
    ref = reference(name)
    if pm.task == "embed":
        got, want = pm.embed_ids(_rows(ref)), ref["embeddings"]
    else:
        got = pm.score_pairs(list(zip(_rows(ref), _rows(ref, "token_type_ids"))))
        want = ref["scores"]
    assert got.shape == want.shape
    assert np.abs(got - want).max() < TOL
