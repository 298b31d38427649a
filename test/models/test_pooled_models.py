"""Pooled steps (embeddings, cross-encoder scores) compiled for the CPU equal the references
recorded by scripts/make_fixtures.py: sentence-transformers' Pooling/Normalize over HF hidden
states (qwen3_embed, bert_embed; SentenceTransformer.encode for texts) and HF
BertForSequenceClassification logits (bert_cross_encoder)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from model_steps import FIXTURES, fixture_path, reference
from poot.sampling_params import InvalidRequest
from poot.api.pooling import PoolingModel, WrongTask, relevance
from poot.models import ModelError, StepSpec, load_model
from poot.models.pooling import PoolSpec, read_pooling_config

TOL = 1e-4


def _rows(ref, key="input_ids"):
    return [[int(x) for x in r[:n]] for r, n in zip(ref[key], ref["lengths"])]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """The compile cache: CI's (POOT_CACHE_DIR, shared with the other tests), else a temp."""
    return os.environ.get("POOT_CACHE_DIR") or str(tmp_path_factory.mktemp("poot-cache"))


@pytest.fixture(scope="module")
def models(cache):
    return {n: PoolingModel.load(fixture_path(n), max_batch=4, max_tokens=32, cache_dir=cache)
            for n in ("qwen3_embed", "bert_embed", "bert_cross_encoder")}


@pytest.mark.parametrize("name", ["qwen3_embed", "bert_embed"])
def test_embeddings_equal_sentence_transformers(models, name):
    pm, ref = models[name], reference(name)
    meta = json.loads((FIXTURES / name / "reference.json").read_text())
    assert pm.task == "embed"
    assert pm.pooling == {"lasttoken": "last"}.get(meta["pooling"], meta["pooling"])
    assert pm.normalize is True and pm.pooling_source.endswith("modules.json")
    got = pm.embed_ids(_rows(ref))
    assert got.shape == ref["embeddings"].shape
    assert np.abs(got - ref["embeddings"]).max() < TOL


def test_rows_do_not_depend_on_their_batch(models):
    """Each row alone (batch 1, other padding) equals the row inside the batch."""
    pm, ref = models["qwen3_embed"], reference("qwen3_embed")
    rows = _rows(ref)
    alone = np.concatenate([pm.embed_ids([r]) for r in rows])
    assert np.abs(alone - ref["embeddings"]).max() < TOL


def test_flags_override_the_checkpoint_pooling(cache):
    """normalize=False gives sentence-transformers' unnormalized pooling."""
    pm = PoolingModel.load(fixture_path("bert_embed"), normalize=False, max_batch=4,
                           max_tokens=16, cache_dir=cache)
    ref = reference("bert_embed")
    assert pm.pooling_source == "argument"
    assert np.abs(pm.embed_ids(_rows(ref)) - ref["embeddings_unnormalized"]).max() < TOL


def test_text_embeddings_equal_sentence_transformers_encode(models):
    pm = models["bert_embed"]
    meta = json.loads((FIXTURES / "bert_embed" / "reference.json").read_text())
    assert [pm.encode_input(t) for t in meta["texts"]] == meta["text_ids"]
    got = pm.embed(meta["texts"])
    assert np.abs(got - reference("bert_embed")["text_embeddings"]).max() < TOL


def test_cross_encoder_scores_equal_hf(models):
    pm, ref = models["bert_cross_encoder"], reference("bert_cross_encoder")
    assert pm.task == "score" and pm.num_labels == 1
    got = pm.score_pairs(list(zip(_rows(ref), _rows(ref, "token_type_ids"))))
    assert np.abs(got - ref["scores"]).max() < TOL


def test_rerank_texts_equal_hf_tokenizer_and_model(models):
    pm, ref = models["bert_cross_encoder"], reference("bert_cross_encoder")
    meta = json.loads((FIXTURES / "bert_cross_encoder" / "reference.json").read_text())
    pairs = [pm.encode_pair(meta["rerank_query"], d) for d in meta["rerank_documents"]]
    assert [p[0] for p in pairs] == meta["rerank_pair_ids"]
    logits = pm.score_pairs(pairs)
    assert np.abs(logits[:, 0] - ref["rerank_logits"]).max() < TOL
    scores = pm.score(meta["rerank_query"], meta["rerank_documents"])
    assert np.abs(scores - ref["rerank_scores"]).max() < TOL


def test_wrong_task_and_bad_inputs_are_typed(models):
    emb, ce = models["bert_embed"], models["bert_cross_encoder"]
    with pytest.raises(WrongTask):
        ce.embed(["hello"])
    with pytest.raises(WrongTask):
        emb.score("q", ["d"])
    with pytest.raises(InvalidRequest) as e:
        emb.embed([[1, 2, 256]])
    assert e.value.field == "input[0]" and "vocabulary" in e.value.reason
    with pytest.raises(InvalidRequest) as e:
        emb.embed([list(range(1, 40))])
    assert "32 tokens" in e.value.reason
    with pytest.raises(InvalidRequest):
        emb.embed([[]])
    with pytest.raises(InvalidRequest):
        emb.embed([3.5])
    with pytest.raises(InvalidRequest) as e:
        PoolingModel.load(fixture_path("bert_embed"), pooling="max", warm_up=False)
    assert e.value.field == "pooling"


def test_relevance_is_sigmoid_or_last_label_softmax():
    np.testing.assert_allclose(relevance(np.array([[0.0], [2.0]])),
                               [0.5, 1 / (1 + np.exp(-2.0))], rtol=1e-6)
    np.testing.assert_allclose(relevance(np.array([[0.0, np.log(3.0)]])), [0.75], rtol=1e-6)


def test_bert_refuses_generation_and_bad_specs():
    model, weights = load_model(fixture_path("bert_embed"))
    with pytest.raises(ModelError, match="encoder"):
        model.trace(StepSpec.prefill(4, kv_capacity=8), weights.types)
    with pytest.raises(ModelError, match="classifier"):
        model.trace_pooled(PoolSpec(1, 8, outputs="scores"), weights.types)
    with pytest.raises(ModelError, match="max_position_embeddings"):
        model.trace_pooled(PoolSpec(1, 128), weights.types)
    with pytest.raises(ModelError):
        PoolSpec(1, 8, pooling="max")


@pytest.mark.parametrize("name", ["bert_embed", "bert_cross_encoder", "qwen3_embed"])
def test_pooled_steps_trace_within_their_limits_at_large_batches(name):
    """The trace limits bound every pooled step a server may compile: 64 rows of the
    smallest and of the largest token bucket (BERT's layers hold more activations than the
    decoder estimate; 16 rows of 16 tokens once raised BuilderLimitExceeded)."""
    pm = PoolingModel.load(fixture_path(name), warm_up=False)
    outputs = "scores" if name == "bert_cross_encoder" else "embeddings"
    for tokens in (16, 64):
        g = pm.model.trace_pooled(PoolSpec(64, tokens, "mean", True, outputs), pm.weights.types)
        assert outputs in dict(g.outputs)


def test_pooling_config_files(tmp_path):
    assert read_pooling_config(tmp_path) is None
    (tmp_path / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling",
         "type": "sentence_transformers.models.Pooling"}]))
    (tmp_path / "1_Pooling").mkdir()
    pcfg = tmp_path / "1_Pooling" / "config.json"
    pcfg.write_text(json.dumps({"word_embedding_dimension": 8, "pooling_mode_cls_token": True,
                                "pooling_mode_mean_tokens": False}))
    got = read_pooling_config(tmp_path)
    assert (got.pooling, got.normalize) == ("cls", False)
    pcfg.write_text(json.dumps({"pooling_mode_max_tokens": True}))
    with pytest.raises(ModelError, match="pooling_mode_max_tokens"):
        read_pooling_config(tmp_path)
    pcfg.write_text("{not json")
    with pytest.raises(ModelError, match="config.json"):
        read_pooling_config(tmp_path)
    (tmp_path / "modules.json").write_text(json.dumps([
        {"name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}]))
    with pytest.raises(ModelError, match="Dense"):
        read_pooling_config(tmp_path)


# --- decoder rerankers: yes/no tokens (Qwen3-Reranker style) and score.weight -------------------

NO, YES = 31, 200
PREFIXES = (5, 9, 12)


def _yes_minus_no():
    """HF's recorded logits of the qwen3 fixture: logit(yes) - logit(no) at each prefix's
    last token (causal: prefill_logits[n - 1] is the last token of prompt[:n])."""
    lg = reference("qwen3")["prefill_logits"]
    return np.array([lg[n - 1, YES] - lg[n - 1, NO] for n in PREFIXES])


def _prefix_pairs():
    ids = [int(x) for x in reference("qwen3")["prompt_ids"]]
    return [(ids[:n], [0] * n) for n in PREFIXES]


def test_yes_no_reranker_scores_equal_hf_lm_logits(cache):
    pm = PoolingModel.load(fixture_path("qwen3"), score_tokens=(NO, YES), max_batch=4,
                           max_tokens=16, cache_dir=cache)
    assert pm.task == "score" and pm.num_labels == 1
    got = pm.score_pairs(_prefix_pairs())[:, 0]
    assert np.abs(got - _yes_minus_no()).max() < TOL
    want = 1 / (1 + np.exp(-_yes_minus_no()))       # = softmax over (no, yes) of p(yes)
    assert np.abs(relevance(got[:, None]) - want).max() < TOL


def _write_safetensors(path, tensors):
    """The safetensors format: u64 header length, JSON header, raw little-endian data."""
    header, blobs, off = {}, [], 0
    for name, a in tensors.items():
        b = np.ascontiguousarray(a, "<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    hb = json.dumps(header).encode()
    hb += b" " * (-len(hb) % 8)
    with open(path, "wb") as f:
        f.write(len(hb).to_bytes(8, "little") + hb + b"".join(blobs))


def test_sequence_classification_decoder_uses_score_weight(tmp_path):
    """A Qwen3ForSequenceClassification layout (score.weight [1, H], no lm_head): the score
    row is lm_head[yes] - lm_head[no], so the same HF numbers are expected."""
    from poot.load import open_weights

    store = open_weights(fixture_path("qwen3"))
    tensors = {n: np.asarray(store[n].data, np.float32) for n in store if n != "lm_head.weight"}
    head = np.asarray(store["lm_head.weight"].data, np.float32)
    tensors["score.weight"] = (head[YES] - head[NO])[None, :]
    _write_safetensors(tmp_path / "model.safetensors", tensors)
    cfg = json.loads((fixture_path("qwen3") / "config.json").read_text())
    cfg["architectures"] = ["Qwen3ForSequenceClassification"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    from poot.api.pooling import pooled_task

    assert pooled_task(tmp_path) == "score"
    pm = PoolingModel.load(tmp_path, max_batch=4, max_tokens=16,
                           cache_dir=os.environ.get("POOT_CACHE_DIR") or tmp_path / "c")
    assert pm.task == "score"
    assert np.abs(pm.score_pairs(_prefix_pairs())[:, 0] - _yes_minus_no()).max() < TOL


def test_bad_score_tokens_are_typed():
    with pytest.raises(ModelError, match="two ids"):
        PoolingModel.load(fixture_path("qwen3"), score_tokens=(1, 2, 3), warm_up=False)
    with pytest.raises(ModelError, match="outside the vocabulary"):
        PoolingModel.load(fixture_path("qwen3"), score_tokens=(1, 999), warm_up=False)
    with pytest.raises(InvalidRequest) as e:        # no tokenizer to look "yes" up in
        PoolingModel.load(fixture_path("qwen3"), score_tokens=("no", "yes"), warm_up=False)
    assert e.value.field == "score_tokens"
