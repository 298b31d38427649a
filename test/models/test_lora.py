"""LoRA adapters in fixed slots inside the traced step: one batch of the base model and two
PEFT adapters (rank 4 on q/k/v/o; rank 8 rsLoRA on q/v and the MLP) compiled for the CPU gives
each row the logits and greedy tokens HF + PEFT recorded for its adapter
(test/fixtures/tiny/llama_lora); loading checks name the config field or the tensor."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from model_steps import FIXTURES, fixture_path, reference
from poot.models import WeightBinding, contiguous_inputs, load_model
from poot.models.base import StepSpec
from poot.models.lora import COLUMN_SLOT, LoraError, LoraSlots, LoraTable, read_peft_adapter

LORA = FIXTURES / "llama_lora"
ADAPTERS = ("adapter_a", "adapter_b")
CAP = 24
TOL = 1e-4


@pytest.fixture(scope="module")
def base():
    return load_model(fixture_path("llama"))


@pytest.fixture(scope="module")
def table(base):
    model, weights = base
    t = LoraTable(LoraSlots(max_loras=2, max_rank=8), weights.types, model.dims().n_layers)
    for slot, name in enumerate(ADAPTERS, start=1):
        t.load(slot, read_peft_adapter(LORA / name, weights.types))
    return t


def _bound(weights, table) -> WeightBinding:
    return WeightBinding({**weights.arrays, **table.arrays}, {**weights.types, **table.types},
                         dict(weights.stored))


@pytest.fixture(scope="module")
def compiled(base, table):
    from poot.compiler import compile, host_cpu

    model, weights = base
    w = _bound(weights, table)
    pre = model.trace(StepSpec.prefill(12, batch=3, kv_capacity=CAP, kv_slots=3), w.types)
    dec = model.trace(StepSpec.decode(batch=3, kv_capacity=CAP, kv_slots=3), w.types)
    return w, compile(pre, host_cpu()), compile(dec, host_cpu()), pre


def _params(prog, w):
    return {k: w[k] for k in prog.graph.params}


def _want(name):
    ref = reference("llama_lora")
    if name == "base":
        r = reference("llama")
        return r["prefill_logits"], r["greedy_ids"]
    return ref[f"{name}.prefill_logits"], ref[f"{name}.greedy_ids"]


def test_mixed_batch_equals_hf_peft_per_row(compiled):
    """Rows: base (slot 0), adapter_a (slot 1), adapter_b (slot 2), same prompt; prefill
    logits, then 7 greedy decode steps, each row as HF + PEFT gives its adapter."""
    w, pre, dec, pre_graph = compiled
    ids = [int(x) for x in reference("llama")["prompt_ids"]]
    n = len(ids)
    lora_index = np.array([0, 1, 2], np.int32)
    caches = {k: np.zeros(t.shape, t.dtype.numpy) for k, t in pre_graph.inputs
              if k.startswith("kv.")}
    feed = contiguous_inputs(CAP, [ids] * 3, [list(range(n))] * 3, [0, 1, 2])
    out = pre.run({**feed, **caches, "lora_index": lora_index}, _params(pre, w))
    names = ("base",) + ADAPTERS
    for row, name in enumerate(names):
        assert np.abs(out["logits"][row] - _want(name)[0]).max() < TOL, name
    caches = {k: v for k, v in out.items() if k.startswith("kv.")}
    tokens = out["logits"][:, -1].argmax(-1)
    got = [tokens]
    for step in range(7):
        feed = contiguous_inputs(CAP, tokens[:, None], [[n + step]] * 3, [0, 1, 2])
        out = dec.run({**feed, **caches, "lora_index": lora_index}, _params(dec, w))
        caches = {k: v for k, v in out.items() if k.startswith("kv.")}
        tokens = out["logits"][:, 0].argmax(-1)
        got.append(tokens)
    got = np.stack(got, axis=1)
    for row, name in enumerate(names):
        assert list(got[row]) == list(_want(name)[1]), name


def test_slots_reload_without_recompiling(base, compiled):
    """The same compiled program serves other adapters once a slot's arrays change."""
    model, weights = base
    _, pre, _, pre_graph = compiled
    t = LoraTable(LoraSlots(max_loras=2, max_rank=8), weights.types, model.dims().n_layers)
    changed = t.load(1, read_peft_adapter(LORA / "adapter_b", weights.types))
    assert changed and all(c.startswith("lora.") for c in changed)
    w = _bound(weights, t)
    ids = [int(x) for x in reference("llama")["prompt_ids"]]
    caches = {k: np.zeros(s.shape, s.dtype.numpy) for k, s in pre_graph.inputs
              if k.startswith("kv.")}
    feed = contiguous_inputs(CAP, [ids] * 3, [list(range(12))] * 3, [0, 1, 2])
    out = pre.run({**feed, **caches, "lora_index": np.array([1, 0, 2], np.int32)},
                  _params(pre, w))
    assert np.abs(out["logits"][0] - _want("adapter_b")[0]).max() < TOL
    assert np.abs(out["logits"][1] - _want("base")[0]).max() < TOL
    assert np.abs(out["logits"][2]).max() > 0            # slot 2 empty: the base again
    assert np.abs(out["logits"][2] - _want("base")[0]).max() < TOL
    t.unload(1)
    assert not any(a.any() for n, a in t.arrays.items() if n != COLUMN_SLOT)
    assert list(t.arrays[COLUMN_SLOT]) == [1] * 8 + [2] * 8      # slot of each stacked rank


def _copy(tmp_path, name="adapter_a"):
    d = tmp_path / name
    shutil.copytree(LORA / name, d)
    return d


def _edit_config(d, **kw):
    cfg = json.loads((d / "adapter_config.json").read_text())
    cfg.update(kw)
    (d / "adapter_config.json").write_text(json.dumps(cfg))


def test_loading_errors_name_the_field_or_tensor(base, tmp_path):
    model, weights = base
    small = LoraTable(LoraSlots(max_loras=1, max_rank=4), weights.types, model.dims().n_layers)
    with pytest.raises(LoraError) as e:                       # rank past the slot size
        small.load(1, read_peft_adapter(LORA / "adapter_b", weights.types))
    assert e.value.field.endswith(".lora_A") and "rank 8" in str(e.value)
    with pytest.raises(LoraError) as e:
        small.load(2, read_peft_adapter(LORA / "adapter_a", weights.types))
    assert e.value.field == "slot"
    phi3, phi3_w = load_model(fixture_path("phi3"))          # fused qkv: no q_proj to adapt
    with pytest.raises(LoraError) as e:
        read_peft_adapter(LORA / "adapter_a", phi3_w.types)
    assert e.value.field.endswith(".weight") and "no separate" in str(e.value)
    d = _copy(tmp_path)
    _edit_config(d, use_dora=True)
    with pytest.raises(LoraError) as e:
        read_peft_adapter(d, weights.types)
    assert e.value.field == "use_dora"
    _edit_config(d, use_dora=False, target_modules=["q_proj", "lm_head"])
    with pytest.raises(LoraError) as e:
        read_peft_adapter(d, weights.types)
    assert e.value.field == "target_modules"
    _edit_config(d, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], r=2)
    with pytest.raises(LoraError) as e:                       # tensors are rank 4
        read_peft_adapter(d, weights.types)
    assert e.value.field.endswith("lora_A.weight") and "expected [2, 64]" in str(e.value)
    (d / "adapter_config.json").write_text("{oops")
    with pytest.raises(LoraError) as e:
        read_peft_adapter(d, weights.types)
    assert e.value.field == "adapter_config.json"


@pytest.mark.parametrize("gguf_qk", ["interleaved", "unpermute"])
def test_gguf_qk_row_order_describes_the_file(gguf_qk):
    """llama_gguf_q4_1 is tiny/llama quantized with Q/K rows permuted by llama.cpp's
    converter: kept as stored, the binding's row order names, for every bound Q/K row, the
    HF row it is nearest to (Q4_1 rounding is far smaller than the rows' distances); rows
    put back in HF order (``unpermute``) record none. An adapter's B is written in it."""
    import gguf

    from poot.load import open_weights

    model, weights = load_model(fixture_path("llama_gguf_q4_1"), gguf_qk=gguf_qk)
    if gguf_qk == "unpermute":
        assert weights.row_order == {}
        return
    n = model.dims().n_layers
    assert sorted(weights.row_order) == sorted(f"blk.{i}.attn.{t}" for i in range(n)
                                               for t in "qk")
    hf = open_weights(fixture_path("llama"))
    stored = {t.name: gguf.quants.dequantize(t.data, t.tensor_type).reshape(t.shape[::-1])
              for t in gguf.GGUFReader(fixture_path("llama_gguf_q4_1")).tensors}
    for role, order in weights.row_order.items():
        i, t = role.split(".")[1], role[-1]
        w = np.asarray(hf[f"model.layers.{i}.self_attn.{t}_proj.weight"].data, np.float32)
        got = stored[weights.stored[role]]
        nearest = np.abs(got[:, None, :] - w[None, :, :]).sum(-1).argmin(-1)
        assert list(nearest) == list(order), role
    table = LoraTable(LoraSlots(max_loras=1, max_rank=8), weights.types, n,
                      weights.row_order)
    adapter = read_peft_adapter(LORA / "adapter_a", weights.types)
    table.load(1, adapter)
    a, b = adapter.weights["blk.0.attn.k"]
    assert np.array_equal(table.arrays["lora.blk.0.attn.k.b"][:4],
                          (b * np.float32(adapter.scale)).T[:, weights.row_order["blk.0.attn.k"]])
