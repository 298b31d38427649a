"""The step interface: constant decode shape, cache I/O types, registry errors, batching."""

from __future__ import annotations

import numpy as np
import pytest

from poot.dialects.types import DType, TensorType
from poot.models import (REGISTRY, ModelError, Registry, StepSpec, UnknownArchitecture,
                         load_model)
from poot.oracle import evaluate
from model_steps import empty_caches, fixture_path, prefill_then_decode, reference, run_step


@pytest.fixture(scope="module")
def llama():
    return load_model(fixture_path("llama"))


def test_step_signature(llama):
    model, weights = llama
    spec = StepSpec.prefill(5, batch=2, kv_capacity=16, kv_slots=3, block_size=4)
    g = model.trace(spec, weights.types)
    inputs = dict(g.inputs)
    assert list(inputs)[:4] == ["tokens", "positions", "block_table", "slot_mapping"]
    assert inputs["tokens"] == TensorType((2, 5), DType.I32)
    assert inputs["positions"] == TensorType((2, 5), DType.I32)
    assert inputs["block_table"] == TensorType((2, 4), DType.I32)      # [B, W = 16 / 4]
    assert inputs["slot_mapping"] == TensorType((10,), DType.I32)      # [B * T]
    cache = TensorType((12, 4, 2, 16), DType.F32)  # [NB = 3 * W, bs, Hkv, D]
    outputs = dict(g.outputs)
    assert outputs["logits"] == TensorType((2, 5, 256), DType.F32)
    for i in range(2):
        for kv in ("k", "v"):
            assert inputs[f"kv.{i}.{kv}"] == cache and outputs[f"kv.{i}.{kv}"] == cache


def test_hidden_output(llama):
    model, weights = llama
    g = model.trace(StepSpec.decode(kv_capacity=8, outputs="hidden"), weights.types)
    assert dict(g.outputs)["hidden"] == TensorType((1, 1, 64), DType.F32)
    assert "lm_head" not in g.params


def test_decode_graph_is_position_independent(llama):
    """Positions are inputs: decode traces are identical text whatever position they will
    run at, and one graph serves every position (its types mention no position)."""
    model, weights = llama
    spec = StepSpec.decode(kv_capacity=16)
    a = model.trace(spec, weights.types)
    b = model.trace(spec, weights.types)
    assert a.text() == b.text()
    assert a.inputs == b.inputs and a.outputs == b.outputs
    # the same graph at two positions: outputs keep their types, the cache changes only at
    # (slot, position)
    caches = empty_caches(a)
    written = []
    for pos in (3, 11):
        out, caches = run_step(a, weights, [[7]], [[pos]], [0], caches)
        for name, t in a.outputs:
            assert out[name].shape == t.shape and out[name].dtype == t.dtype.numpy
        written.append((0, pos))
        rows = np.nonzero(np.abs(caches["kv.0.k"]).sum(axis=(2, 3)))
        assert sorted(zip(*map(list, rows))) == written


def test_decode_matches_prefill_rows(llama):
    """A decode step at position p reproduces row p of a prefill over the same prefix."""
    model, weights = llama
    ids = reference("llama")["prompt_ids"]
    full, _ = prefill_then_decode(model, weights, ids, n_prefill=12)
    _, dec = prefill_then_decode(model, weights, ids, n_prefill=9)
    assert np.abs(dec - full[9:]).max() <= 1e-5


def test_unknown_architecture_lists_registered(tmp_path):
    with pytest.raises(UnknownArchitecture) as e:
        REGISTRY.lookup("FancyNewForCausalLM")
    assert e.value.architecture == "FancyNewForCausalLM"
    for arch in ("LlamaForCausalLM", "MistralForCausalLM", "llama"):
        assert arch in e.value.registered and arch in str(e.value)
    # through load_model: a checkpoint whose config names an unregistered architecture
    src = fixture_path("llama")
    (tmp_path / "config.json").write_text(
        (src / "config.json").read_text().replace("LlamaForCausalLM", "FancyNewForCausalLM"))
    (tmp_path / "model.safetensors").symlink_to(src / "model.safetensors")
    with pytest.raises(UnknownArchitecture, match="registered: .*LlamaForCausalLM"):
        load_model(tmp_path)


def test_registry_refuses_a_taken_name():
    class A:
        family, architectures = "a", ("X",)

    class B:
        family, architectures = "b", ("X",)

    r = Registry()
    r.register(A)
    with pytest.raises(ModelError, match="already registered"):
        r.register(B)
    assert r.lookup("X") is A and r.names() == ["X"]


def test_step_spec_validation():
    with pytest.raises(ModelError):
        StepSpec("decode", 1, 2, 16, 1)
    with pytest.raises(ModelError):
        StepSpec.prefill(32, kv_capacity=16)
    with pytest.raises(ModelError):
        StepSpec.decode(kv_capacity=0)


def test_batch_of_two_matches_each_alone(llama):
    """Two sequences in slots 2 and 0 at different positions give the same logits, in one
    batched step, as each sequence run alone (and their caches stay separate)."""
    model, weights = llama
    ids = [int(i) for i in reference("llama")["prompt_ids"]]
    seq_a, seq_b = ids[:7], ids[3:12]         # lengths 7 and 9
    C, slots = 16, 3
    pre1 = model.trace(StepSpec.prefill(4, kv_capacity=C, kv_slots=slots), weights.types)
    pre2 = model.trace(StepSpec.prefill(4, batch=2, kv_capacity=C, kv_slots=slots),
                       weights.types)
    dec2 = model.trace(StepSpec.decode(batch=2, kv_capacity=C, kv_slots=slots), weights.types)

    # alone: each sequence prefilled up to its last token, which one decode step feeds
    alone = {}
    for name, seq, slot in (("a", seq_a, 2), ("b", seq_b, 0)):
        _, want = prefill_then_decode(model, weights, seq, n_prefill=len(seq) - 1, capacity=C,
                                      n_slots=slots, slot=slot)
        alone[name] = want[0]

    # batched: b's first chunk alone; then one batch-2 chunk with a at positions 0..3
    # (slot 2) and b at 4..7 (slot 0); a catches up by two single decode steps; finally one
    # batch-2 decode step with a at position 6 and b at position 8.
    caches = empty_caches(pre2)
    _, caches = run_step(pre1, weights, [seq_b[:4]], [[0, 1, 2, 3]], [0], caches)
    chunk, caches = run_step(pre2, weights, [seq_a[:4], seq_b[4:8]],
                             [[0, 1, 2, 3], [4, 5, 6, 7]], [2, 0], caches)
    dec1 = model.trace(StepSpec.decode(kv_capacity=C, kv_slots=slots), weights.types)
    for p in (4, 5):
        _, caches = run_step(dec1, weights, [[seq_a[p]]], [[p]], [2], caches)
    out, _ = run_step(dec2, weights, [[seq_a[6]], [seq_b[8]]], [[6], [8]], [2, 0], caches)
    err_a = np.abs(out["logits"][0, 0] - alone["a"]).max()
    err_b = np.abs(out["logits"][1, 0] - alone["b"]).max()
    print(f"batch-2 vs alone: a {err_a:.3g}, b {err_b:.3g}")
    assert err_a <= 1e-5 and err_b <= 1e-5
    # the batched prefill chunk too: b's rows 4..7 equal a prefill of b alone
    b_alone, _ = prefill_then_decode(model, weights, seq_b[:8], n_prefill=8, capacity=C,
                                     n_slots=slots)
    assert np.abs(chunk["logits"][1] - b_alone[4:8]).max() <= 1e-5


def _paged_feed(spec, tokens, positions, tables):
    """Inputs of a paged step: tokens/positions [B, T], each sequence's block list; the slot
    of position p is ``table[p // bs] * bs + p % bs`` (negative positions: padding, -1)."""
    bs, w = spec.bs, spec.table_width
    bt = np.zeros((spec.batch, w), np.int32)
    for i, t in enumerate(tables):
        bt[i, :len(t)] = t
    pos = np.asarray(positions, np.int32)
    slots = np.where(pos >= 0, np.take_along_axis(bt, np.maximum(pos, 0) // bs, 1) * bs
                     + np.maximum(pos, 0) % bs, -1)
    return {"tokens": np.asarray(tokens, np.int32), "positions": np.maximum(pos, 0),
            "block_table": bt, "slot_mapping": slots.reshape(-1).astype(np.int32)}


def test_paged_blocks_anywhere_match_contiguous(llama):
    """Two sequences whose 4-position blocks are scattered over the pool in reverse and
    interleaved order (and a padding row that writes nothing) give the logits each gets
    alone in a contiguous cache: attention reads through the block table, nothing else."""
    model, weights = llama
    ids = [int(i) for i in reference("llama")["prompt_ids"]]
    seq_a, seq_b = ids[:9], ids[2:12]                 # lengths 9 and 10
    bs, C = 4, 16
    tables = [[7, 2, 5], [1, 6, 3]]                   # 3 blocks each, no order
    pre = model.trace(StepSpec.prefill(6, batch=2, kv_capacity=C, block_size=bs,
                                       num_blocks=8), weights.types)
    dec = model.trace(StepSpec.decode(batch=2, kv_capacity=C, block_size=bs, num_blocks=8),
                      weights.types)
    alone = []
    for seq in (seq_a, seq_b):
        _, want = prefill_then_decode(model, weights, seq, n_prefill=len(seq) - 1, capacity=C)
        alone.append(want[0])
    caches = empty_caches(pre)
    pspec = StepSpec.prefill(6, batch=2, kv_capacity=C, block_size=bs, num_blocks=8)
    # chunk 1: a 0..5, b 0..5; chunk 2: a 6..7 (+4 padding rows), b 6..8 (+3)
    for toks, pos in (([seq_a[:6], seq_b[:6]], [range(6), range(6)]),
                      ([seq_a[6:8] + [0] * 4, seq_b[6:9] + [0] * 3],
                       [[6, 7, -1, -1, -1, -1], [6, 7, 8, -1, -1, -1]])):
        out = evaluate(pre, {**_paged_feed(pspec, toks, pos, tables), **caches}, weights)
        caches = {k: v for k, v in out.items() if k.startswith("kv.")}
    # block 0 and 4 were never written (padding rows wrote nothing)
    assert not caches["kv.0.k"][[0, 4]].any()
    dspec = StepSpec.decode(batch=2, kv_capacity=C, block_size=bs, num_blocks=8)
    out = evaluate(dec, {**_paged_feed(dspec, [[seq_a[8]], [seq_b[9]]], [[8], [9]], tables),
                         **caches}, weights)
    for i in range(2):
        assert np.abs(out["logits"][i, 0] - alone[i]).max() <= 1e-5
