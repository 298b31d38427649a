"""Llama config/weight handling: dense half-precision weights, GGUF rope factors, limits."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from poot.dialects.types import DType, TensorType
from poot.load import load_config
from poot.models import Model, ModelError, StepSpec, load_model, trace_limits
from poot.models.llama import Llama, LlamaConfig
from model_steps import fixture_path, prefill_then_decode, reference


def test_llama_is_a_model():
    model, _ = load_model(fixture_path("llama"))
    assert isinstance(model, Model)
    table = model.weight_table()
    assert table["blk.{i}.attn.q"].hf == "model.layers.{i}.self_attn.q_proj.weight"
    assert table["blk.{i}.attn.q"].gguf == "blk.{i}.attn_q.weight"


def test_f16_checkpoint_binds_as_stored(tmp_path):
    """f16 safetensors weights are bound as f16 (no host f32 copy) and cast in-graph."""
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    src = fixture_path("llama")
    tensors = safetensors_numpy.load_file(str(src / "model.safetensors"))
    safetensors_numpy.save_file({k: v.astype(np.float16) for k, v in tensors.items()},
                                str(tmp_path / "model.safetensors"))
    shutil.copy(src / "config.json", tmp_path / "config.json")
    model, weights = load_model(tmp_path)
    assert weights.types["blk.0.attn.q"] == TensorType((64, 64), DType.F16)
    assert weights["blk.0.attn.q"].dtype == np.float16
    ref = reference("llama")
    logits, _ = prefill_then_decode(model, weights, ref["prompt_ids"], n_prefill=12)
    err = np.abs(logits - ref["prefill_logits"]).max()
    assert err < 0.05 * np.abs(ref["prefill_logits"]).max(), err


def test_gguf_rope_freq_factors_reproduce_llama3():
    """llama.cpp stores llama3 scaling as ``rope_freqs`` = base inv_freq / scaled inv_freq;
    dividing by the factors gives HF's llama3 frequencies."""
    hf = LlamaConfig.from_model_config(load_config(fixture_path("llama_llama3rope_tied")))
    plain = LlamaConfig(**{**hf.__dict__, "rope_scaling": type(hf.rope_scaling)()})
    factors = plain.inv_freq().astype(np.float64) / hf.inv_freq().astype(np.float64)
    gguf = LlamaConfig(**{**plain.__dict__,
                          "rope_freq_factors": tuple(float(np.float32(f)) for f in factors)})
    assert np.abs(gguf.inv_freq() - hf.inv_freq()).max() <= 1e-6 * hf.inv_freq().max()


def test_unsupported_rope_scaling_is_typed():
    from dataclasses import replace

    from poot.load.config import RopeScaling

    cfg = load_config(fixture_path("llama"))
    with pytest.raises(ModelError, match="dynamic"):
        Llama.from_config(replace(cfg, rope_scaling=RopeScaling(kind="dynamic", factor=2.0)))


def test_missing_tensor_is_named(tmp_path):
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    src = fixture_path("llama")
    tensors = safetensors_numpy.load_file(str(src / "model.safetensors"))
    del tensors["model.layers.1.mlp.up_proj.weight"]
    safetensors_numpy.save_file(tensors, str(tmp_path / "model.safetensors"))
    shutil.copy(src / "config.json", tmp_path / "config.json")
    with pytest.raises(ModelError, match=r"model\.layers\.1\.mlp\.up_proj\.weight") as e:
        load_model(tmp_path)
    assert str(e.value).startswith(f"{tmp_path}: ")    # the checkpoint is named too


def test_family_errors_name_the_checkpoint(tmp_path):
    """A config the family refuses (heads that do not group over the KV heads) is reported
    with the checkpoint's path, as a missing tensor is."""
    import json

    src = fixture_path("llama")
    shutil.copy(src / "model.safetensors", tmp_path / "model.safetensors")
    cfg = json.loads((src / "config.json").read_text())
    cfg["num_attention_heads"] = 5
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelError, match="5 heads do not group over 2 KV heads") as e:
        load_model(tmp_path)
    assert str(e.value).startswith(f"{tmp_path}: ")


@pytest.mark.parametrize("spec", [StepSpec.decode(kv_capacity=4096),
                                  StepSpec.decode(batch=8, kv_capacity=512, kv_slots=16),
                                  StepSpec.prefill(256, kv_capacity=4096)],
                         ids=["decode", "decode-b8", "prefill-256"])
def test_trace_fits_limits_derived_from_shape(spec):
    """The limits come from the step's shape; the trace stays within them."""
    model, weights = load_model(fixture_path("llama"))
    lim = trace_limits(spec, model.dims())
    assert lim.max_tokens == spec.batch * spec.tokens
    g = model.trace(spec, weights.types)
    assert g.op_count() <= lim.max_ops
