"""Multi-head latent attention (DeepSeek-V2/V3 fixtures): the KV cache holds the latent and the
rope key, nothing expanded; the absorbed attention is fused by the flash-attention rewrite;
batched decode equals each sequence alone; the config's MLA and DeepSeek-routing settings are
read, and bad ones are typed errors. (Logits against HF: test_families.py.)"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from model_steps import FIXTURES, empty_caches, fixture_path, prefill_then_decode, reference
from model_steps import run_step
from poot.dialects.types import DType
from poot.models import ModelError, StepSpec, load_model

MLA_FIXTURES = ["deepseek_v3", "deepseek_v2_lite"]


def _hf_config(name: str) -> dict:
    return json.loads((FIXTURES / name / "config.json").read_text())


@pytest.mark.parametrize("name", MLA_FIXTURES)
def test_kv_cache_holds_latent_and_rope_key(name, tmp_path):
    """Each layer's one pool holds ``kv_lora_rank + qk_rope_head_dim`` values a position (40
    here: the latent, then the rope key), not the expanded per-head keys and values
    (H * (nope + rope) + H * v = 144): in the traced step, in the runner's KV accounting and
    in the buffers the engine allocates."""
    from poot.api import ModelHandle

    cfg = _hf_config(name)
    per_pos = cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]
    expanded = cfg["num_attention_heads"] * (cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
                                             + cfg["v_head_dim"])
    assert per_pos < expanded
    model, weights = load_model(fixture_path(name))
    spec = StepSpec.decode(batch=2, kv_capacity=16, block_size=4, num_blocks=9,
                           kv_dtype=DType.F16)
    g = model.trace(spec, weights.types)
    pools = {n: t for n, t in g.inputs if n.startswith("kv.")}
    layers = cfg["num_hidden_layers"]
    assert sorted(pools) == sorted(f"kv.{i}.latent" for i in range(layers))
    for i in range(layers):
        assert pools[f"kv.{i}.latent"].shape == (9, 4, 1, per_pos)
    assert {n for n, _ in g.outputs if n.startswith("kv.")} == set(pools)
    assert model.dims().kv_token_elems == per_pos

    h = ModelHandle.load(fixture_path(name), kv_capacity=32, max_batch=2, cache_dir=tmp_path)
    kv = h.runner.kv
    assert kv.bytes(h.model.dims()) == layers * kv.num_blocks * kv.block_size * per_pos * \
        kv.kv_dtype.itemsize
    ex = h.runner.session
    state = {n: ex.read_state(n) for n in ex.state_names() if n.startswith("kv.")}
    assert sum(a.nbytes for a in state.values()) == kv.bytes(h.model.dims())


@pytest.mark.parametrize("name", MLA_FIXTURES)
def test_absorbed_attention_reads_the_pool_in_place(name):
    """Every layer's absorbed attention (one KV head of width R + P, values the latent)
    becomes one ``poot.paged_attention`` whose keys are the latent pool and whose values are
    its first R channels (a slice of the pool, not a gathered copy); the oracle agrees
    before and after."""
    from poot import oracle
    from poot.passes.flash_attention import flash_attention

    model, weights = load_model(fixture_path(name))
    r = _hf_config(name)["kv_lora_rank"]
    for spec in (StepSpec.prefill(8, kv_capacity=16), StepSpec.decode(kv_capacity=16)):
        g = model.trace(spec, weights.types)
        feed = {"tokens": np.arange(3, 3 + spec.tokens, dtype=np.int32)[None],
                "positions": np.arange(spec.tokens, dtype=np.int32)[None] + (spec.kind == "decode"),
                "block_table": np.zeros((1, 1), np.int32),
                "slot_mapping": np.arange(spec.tokens, dtype=np.int32)
                + (spec.kind == "decode"), **empty_caches(g)}
        ref = oracle.evaluate(g, feed, weights)
        assert flash_attention(g.module) == model.dims().n_layers
        paged = [op for op in g.module.body.operations[0].regions[0].blocks[0].operations
                 if op.operation.name == "poot.paged_attention"]
        assert len(paged) == model.dims().n_layers
        for op in paged:
            k_pool, v_pool = (op.operands[i] for i in (1, 2))
            assert k_pool.owner.name == "poot.scatter"      # the pool after this step's write
            assert v_pool.owner.name == "poot.slice" and v_pool.owner.operands[0] == k_pool
            assert list(v_pool.type.shape)[-1] == r
        got = oracle.evaluate(g, feed, weights)
        assert np.abs(got["logits"] - ref["logits"]).max() <= 1e-5


@pytest.mark.parametrize("name", MLA_FIXTURES)
def test_batched_decode_matches_single(name):
    """Two sequences decoded in one batch over their own latent pools give each sequence's
    own logits."""
    model, weights = load_model(fixture_path(name))
    ids = reference(name)["prompt_ids"]
    pre = model.trace(StepSpec.prefill(8, batch=2, kv_capacity=16, kv_slots=2), weights.types)
    dec = model.trace(StepSpec.decode(batch=2, kv_capacity=16, kv_slots=2), weights.types)
    seqs = [ids[:8], ids[4:12]]
    _, caches = run_step(pre, weights, seqs, [list(range(8))] * 2, [1, 0], empty_caches(pre))
    out, _ = run_step(dec, weights, [[5], [9]], [[8], [8]], [1, 0], caches)
    for row, seq, tok in ((0, seqs[0], 5), (1, seqs[1], 9)):
        _, dec1 = prefill_then_decode(model, weights, list(seq) + [tok], n_prefill=8)
        assert np.abs(out["logits"][row, 0] - dec1[0]).max() <= 1e-5


def test_deepseek_v3_settings_are_read():
    model, _ = load_model(fixture_path("deepseek_v3"))
    o = model.config
    m = o.mla
    assert (m.q_lora_rank, m.kv_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim,
            m.v_head_dim, m.rope_layout) == (48, 32, 16, 8, 12, "interleaved")
    mscale = 0.1 * 0.8 * math.log(4.0) + 1.0          # yarn_get_mscale(4, mscale_all_dim)
    assert m.scale == pytest.approx(24 ** -0.5 * mscale ** 2)
    assert len(o.inv_freq) == 4                        # RoPE over the 8 rope channels
    e = o.moe
    assert (e.scoring, e.score_bias, e.groups, e.topk_groups, e.group_score) == \
        ("sigmoid", True, 4, 2, "top2_sum")
    assert (e.normalize, e.scale, e.shared_ffn, e.dense_layers) == (True, 2.5, 32, (0,))


def test_deepseek_v2_settings_are_read():
    model, _ = load_model(fixture_path("deepseek_v2_lite"))
    o = model.config
    assert o.mla.q_lora_rank == 0 and o.mla.scale == pytest.approx(
        24 ** -0.5 * (0.1 * 0.707 * math.log(4.0) + 1.0) ** 2)
    e = o.moe
    assert (e.scoring, e.score_bias, e.groups, e.normalize, e.scale, e.shared_ffn) == \
        ("softmax", False, 1, False, 1.0, 64)


def _edited(tmp_path, name: str, changes: dict):
    import shutil

    dst = tmp_path / name
    shutil.copytree(FIXTURES / name, dst)
    cfg = _hf_config(name)
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.mark.parametrize("name,changes,match", [
    ("deepseek_v3", {"kv_lora_rank": None}, "kv_lora_rank must be a positive integer"),
    ("deepseek_v3", {"qk_rope_head_dim": 7}, "qk_rope_head_dim must be even"),
    ("deepseek_v3", {"v_head_dim": "12"}, "v_head_dim must be a positive integer"),
    ("deepseek_v3", {"scoring_func": "softmax"}, "scoring_func 'softmax'"),
    ("deepseek_v3", {"num_experts_per_tok": 5}, "leave 4 of 8 experts eligible, fewer than "
                                                 "the 5"),
    ("deepseek_v3", {"n_group": 0}, "n_group must be an integer >= 1, found 0"),
    ("deepseek_v3", {"n_group": 3}, "n_group=3 must divide the 8 routed experts"),
    ("deepseek_v3", {"topk_group": 5}, "topk_group=5 is more than the n_group=4 groups"),
    ("deepseek_v3", {"routed_scaling_factor": float("nan")},
     "routed_scaling_factor must be a positive finite number, found nan"),
    ("deepseek_v3", {"routed_scaling_factor": -2.5}, "must be a positive finite number"),
    # the config disagreeing with the tensors: refused at bind, naming the tensor
    ("deepseek_v3", {"kv_lora_rank": 64}, r"kv_a_proj_with_mqa.weight' has shape \[40, 64\], "
                                          r"but the config implies \[72, 64\]"),
    ("deepseek_v3", {"num_attention_heads": 8}, r"o_proj.weight' has shape \[64, 48\]"),
    ("deepseek_v3", {"vocab_size": 10 ** 12}, r"embed_tokens.weight' has shape \[256, 64\], "
                                              r"but the config implies \[1000000000000, 64\]"),
    ("deepseek_v2_lite", {"n_shared_experts": 3}, r"shared_experts.gate_proj.weight' has shape"),
    ("deepseek_v2_lite", {"topk_method": "noaux_tc"}, "topk_method 'noaux_tc'"),
])
def test_bad_mla_settings_are_typed(tmp_path, name, changes, match):
    with pytest.raises(ModelError, match=match):
        load_model(_edited(tmp_path, name, changes))


def _edited_gguf(tmp_path, edits: dict, rename: tuple[str, str] | None = None):
    """A copy of the ``deepseek_v2_lite_gguf`` fixture with metadata ``edits`` (key -> new
    value of the same type) and one tensor renamed, written by the ``gguf`` package."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    r = GGUFReader(str(FIXTURES / "deepseek_v2_lite_gguf" / "model.gguf"))
    out = tmp_path / "edited.gguf"
    w = GGUFWriter(str(out), "deepseek2")
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        t = f.types[0]
        if f.name in edits:
            w.add_key_value(f.name, edits[f.name], t)
        elif t == GGUFValueType.ARRAY:
            sub = f.types[-1]
            val = [bytes(f.parts[i]).decode() if sub == GGUFValueType.STRING
                   else f.parts[i].tolist()[0] for i in f.data]
            w.add_key_value(f.name, val, t, sub_type=sub)
        elif t == GGUFValueType.STRING:
            w.add_key_value(f.name, bytes(f.parts[f.data[0]]).decode(), t)
        else:
            w.add_key_value(f.name, f.parts[f.data[0]].tolist()[0], t)
    for t in r.tensors:
        name = rename[1] if rename and t.name == rename[0] else t.name
        w.add_tensor(name, np.array(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


@pytest.mark.parametrize("edits,rename,match", [
    ({"deepseek2.attention.key_length_mla": 8}, None,
     r"deepseek2\.attention\.key_length_mla \(8\) must exceed deepseek2\.rope\.dimension_count"),
    ({}, ("blk.0.attn_k_b.weight", "blk.0.attn_kv_b.weight"),
     "combined attn_kv_b .* reconvert the checkpoint"),
])
def test_bad_deepseek2_gguf_is_typed(tmp_path, edits, rename, match):
    """GGUF ``deepseek2`` files llama.cpp would not write, or wrote in its older layout: a
    typed error naming the GGUF key or the layout, before tracing."""
    with pytest.raises(ModelError, match=match):
        load_model(_edited_gguf(tmp_path, edits, rename))
