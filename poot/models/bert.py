"""The BERT family: a bidirectional encoder for embeddings and cross-encoder scores.

HF ``BertModel`` (``modeling_bert.py``), post-LayerNorm::

    x = LayerNorm(word[ids] + position[pos] + token_type[types])          # embeddings
    per layer: x = LayerNorm(x + o(attn(q(x), k(x), v(x))))               # every key visible
               x = LayerNorm(x + down(act(up(x))))                         # act: exact GELU
    pooler:    p = tanh(dense(x[:, 0]))                                    # [CLS]
    classifier (ForSequenceClassification): scores = classifier(p)        # [B, num_labels]

Attention is bidirectional (no causal mask); padded keys are masked through the pooled
step's ``lengths`` (:mod:`poot.models.pooling`). Positions are absolute (learned
``position_embeddings``); ``position_embedding_type`` other than ``absolute`` is refused.

BERT serves only pooled steps (:meth:`Bert.trace_pooled`): embeddings (sentence-transformers
checkpoints such as all-MiniLM, pooled as their ``1_Pooling/config.json`` says) and, when the
checkpoint has a ``classifier``, cross-encoder scores. It has no generation step:
:meth:`Bert.trace` raises :class:`ModelError`.

Weight names: ``BertModel`` saves ``embeddings.*``/``encoder.*``/``pooler.*``;
``BertForSequenceClassification`` and ``BertForMaskedLM`` put them under ``bert.`` and add
``classifier.*`` (or ``cls.*``, unused). The prefix is found from the checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Mapping

from poot.dialects.types import PootType
from poot.graph import ops
from poot.graph.builder import Builder, Graph
from poot.models import pooling as P
from poot.models.base import (REGISTRY, ModelError, StepDims, StepSpec, WeightBinding,
                              WeightName, WeightTable, bind_weights)

_ACTS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu")


@dataclass(frozen=True)
class BertConfig:
    """BERT hyper-parameters (HF ``BertConfig``, read from ``config.json``).

    Attributes:
        vocab_size, hidden_size, intermediate_size, num_layers, num_heads: model shape.
        max_position_embeddings: rows of the learned position table (the longest input).
        type_vocab_size: rows of the token-type table (2: segments A and B).
        layer_norm_eps: every LayerNorm's epsilon.
        hidden_act: the FFN activation (``gelu`` is the exact, erf GELU:
            :func:`gelu_erf_poly`).
        prefix: ``""`` or ``"bert."``: where the encoder's tensors are named.
        num_labels: the classifier's outputs (0: no classifier in the checkpoint).
        has_pooler: the checkpoint has ``pooler.dense`` (needed by the classifier).
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float
    hidden_act: str = "gelu"
    prefix: str = ""
    num_labels: int = 0
    has_pooler: bool = False

    def __post_init__(self):
        if self.num_heads <= 0 or self.hidden_size % self.num_heads:
            raise ModelError(f"bert: hidden_size {self.hidden_size} does not split over "
                             f"{self.num_heads} heads")
        if self.hidden_act not in _ACTS:
            raise ModelError(f"bert: hidden_act {self.hidden_act!r} is not supported "
                             f"(supported: {', '.join(_ACTS)})")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @staticmethod
    def from_model_config(cfg: Any, store: Mapping[str, Any] | None = None) -> "BertConfig":
        """Read a :class:`~poot.load.config.ModelConfig` (HF fields in ``cfg.extra``);
        ``store`` tells the name prefix, whether a classifier and a pooler are stored.
        Raises ModelError for unsupported settings (relative positions, a GGUF file)."""
        if cfg.source != "hf":
            raise ModelError("bert: only HF safetensors checkpoints are supported")
        extra = cfg.extra or {}
        pet = extra.get("position_embedding_type", "absolute")
        if pet not in (None, "absolute"):
            raise ModelError(f"bert: position_embedding_type {pet!r} is not supported "
                             f"(supported: absolute)")
        names = set(store) if store is not None else set()
        prefix = "bert." if "bert.embeddings.word_embeddings.weight" in names else ""
        num_labels = 0
        if "classifier.weight" in names:
            num_labels = int(store["classifier.weight"].shape[0])
        return BertConfig(
            vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
            intermediate_size=cfg.intermediate_size, num_layers=cfg.num_layers,
            num_heads=cfg.num_heads, max_position_embeddings=cfg.max_position_embeddings,
            type_vocab_size=int(extra.get("type_vocab_size", 2)),
            layer_norm_eps=float(cfg.rms_norm_eps), hidden_act=str(extra.get("hidden_act",
                                                                             "gelu")),
            prefix=prefix, num_labels=num_labels,
            has_pooler=prefix + "pooler.dense.weight" in names)


#: Numerical Recipes' ``erfcc`` (Chebyshev fit; fractional error of erfc below 1.2e-7):
#: ``erfc(z) = t exp(-z^2 + P(t))`` with ``t = 1 / (1 + z / 2)``, z >= 0; P's coefficients
#: from the constant term up.
_ERFC_P = (-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806, 0.27886807,
           -1.13520398, 1.48851587, -0.82215223, 0.17087277)


def gelu_erf_poly(b: Builder, x):
    """Exact (erf) GELU, ``0.5 x (1 + erf(x / sqrt 2))``, with erf from :data:`_ERFC_P` in f32
    elementwise ops. The graph's ``erf`` op lowers through f64, which the Vulkan (SPIR-V)
    target cannot legalize; this spelling runs on every backend and differs from the f64 erf
    by well under 1e-6 in the GELU's output for BERT-sized activations."""
    x = ops.as_f32(b, x)
    z = x * (1.0 / 2.0 ** 0.5)
    az = b.unary("abs", z)
    t = 1.0 / (az * 0.5 + 1.0)
    poly = b.scalar(_ERFC_P[-1])
    for c in reversed(_ERFC_P[:-1]):
        poly = poly * t + c
    erfc = t * b.unary("exp", poly - az * az)          # erfc(|z|)
    erf_abs = 1.0 - erfc
    erf = b.select(b.compare("lt", z, b.scalar(0.0)), -erf_abs, erf_abs)
    return x * 0.5 * (erf + 1.0)


def _activation(b: Builder, x, act: str):
    return gelu_erf_poly(b, x) if act == "gelu" else ops.activation(b, x, act)


def weight_table(cfg: BertConfig) -> WeightTable:
    """Role -> stored HF names (no GGUF naming): embeddings, per-layer attention/FFN with
    their biases and LayerNorms, the pooler and the classifier when stored."""
    p = cfg.prefix
    lp = p + "encoder.layer.{i}."
    t = {"tok_embed": WeightName(p + "embeddings.word_embeddings.weight", None),
         "pos_embed": WeightName(p + "embeddings.position_embeddings.weight", None),
         "type_embed": WeightName(p + "embeddings.token_type_embeddings.weight", None),
         "embed_norm": WeightName(p + "embeddings.LayerNorm.weight", None),
         "embed_norm_bias": WeightName(p + "embeddings.LayerNorm.bias", None)}
    for role, name in (("attn.q", "attention.self.query"), ("attn.k", "attention.self.key"),
                       ("attn.v", "attention.self.value"), ("attn.o", "attention.output.dense"),
                       ("attn_norm", "attention.output.LayerNorm"),
                       ("ffn.up", "intermediate.dense"), ("ffn.down", "output.dense"),
                       ("ffn_norm", "output.LayerNorm")):
        t[f"blk.{{i}}.{role}"] = WeightName(lp + name + ".weight", None)
        t[f"blk.{{i}}.{role}_bias"] = WeightName(lp + name + ".bias", None)
    if cfg.has_pooler:
        t["pooler"] = WeightName(p + "pooler.dense.weight", None)
        t["pooler_bias"] = WeightName(p + "pooler.dense.bias", None)
    if cfg.num_labels:
        t["classifier"] = WeightName("classifier.weight", None)
        t["classifier_bias"] = WeightName("classifier.bias", None, optional=True)
    return t


def dims(cfg: BertConfig) -> StepDims:
    """:class:`StepDims` for trace limits (vocab counts the position and type tables; two
    LayerNorms and the erf GELU a layer hold half again the decoder's activations: traced
    pooled steps measured 1.03-1.06x the decoder bound at 16-64 rows of 16 tokens)."""
    h, f = cfg.hidden_size, cfg.intermediate_size
    per_layer = 4 * h * h + 2 * h * f + 9 * h + f
    n = (cfg.vocab_size + cfg.max_position_embeddings + cfg.type_vocab_size) * h \
        + cfg.num_layers * per_layer + h * h + h + cfg.num_labels * (h + 1)
    return StepDims(cfg.num_layers, h, f, max(cfg.vocab_size, cfg.num_labels),
                    cfg.num_heads, cfg.num_heads, cfg.head_dim, n_weight_elems=n,
                    ops_per_layer=200, token_elems_per_layer=8 * h + 4 * f)


def trace_bert(cfg: BertConfig, spec: P.PoolSpec, weight_types: Mapping[str, PootType]
               ) -> Graph:
    """The pooled step of ``cfg`` (module doc): ``embeddings`` [B, H] pooled as
    ``spec.pooling`` from the last layer's output, or ``scores`` [B, num_labels] from the
    classifier over the tanh pooler of token 0. Raises ModelError for scores without a
    classifier and pooler, or more tokens than position embeddings."""
    if spec.tokens > cfg.max_position_embeddings:
        raise ModelError(f"bert: {spec.tokens} tokens exceed max_position_embeddings "
                         f"{cfg.max_position_embeddings}")
    if spec.outputs == "scores" and not (cfg.num_labels and cfg.has_pooler):
        raise ModelError("bert: this checkpoint has no classifier and pooler "
                         "(a BertForSequenceClassification checkpoint gives scores)")
    b = Builder(P.pool_limits(spec, dims(cfg)), name="bert_pooled")
    types = dict(weight_types)
    prm = lambda role: b.param(role, types[role])  # noqa: E731
    lin = lambda role, x: ops.linear(b, x, prm(role), prm(role + "_bias"))  # noqa: E731
    ln = lambda role, x: ops.layernorm(b, x, prm(role), prm(role + "_bias"),  # noqa: E731
                                       cfg.layer_norm_eps)
    inp = P.pool_inputs(b, spec, token_types=True)
    bsz, t = spec.batch, spec.tokens
    nh, d = cfg.num_heads, cfg.head_dim
    with b.scope("embed"):
        x = (ops.embedding(b, prm("tok_embed"), inp.tokens)
             + ops.embedding(b, prm("pos_embed"), inp.positions)
             + ops.embedding(b, prm("type_embed"), inp.token_types))
        x = ln("embed_norm", x)
    with b.scope("mask"):
        mask = P.key_mask(b, inp.lengths, t)
    for i in range(cfg.num_layers):
        p = f"blk.{i}."
        with b.scope(f"blk.{i}"):
            with b.scope("attn"):
                q, k, v = (b.reshape(lin(p + r, x), (bsz, t, nh, d))
                           for r in ("attn.q", "attn.k", "attn.v"))
                a = ops.attention(b, q, k, v, q_pos=inp.positions, causal=False, mask=mask)
                x = ln(p + "attn_norm", x + lin(p + "attn.o", b.reshape(a, (bsz, t, nh * d))))
            with b.scope("ffn"):
                f = _activation(b, lin(p + "ffn.up", x), cfg.hidden_act)
                x = ln(p + "ffn_norm", x + lin(p + "ffn.down", f))
    if spec.outputs == "embeddings":
        return P.finish_pooled(b, spec, x, inp.lengths)
    with b.scope("classifier"):
        cls = b.reshape(b.slice_axis(x, 1, 0, 1), (bsz, cfg.hidden_size))
        pooled = b.unary("tanh", lin("pooler", cls))
        bias = prm("classifier_bias") if "classifier_bias" in types else None
        scores = ops.linear(b, pooled, prm("classifier"), bias)
    return b.finish({"scores": scores})


@REGISTRY.register
class Bert:
    """The BERT encoder family (module doc). ``config`` is a :class:`BertConfig`."""

    family: ClassVar[str] = "bert"
    architectures: ClassVar[tuple[str, ...]] = ("BertModel", "BertForSequenceClassification",
                                                "BertForMaskedLM", "BertForPreTraining")
    #: serves pooled steps only (no KV cache, no generation)
    encoder_only: ClassVar[bool] = True

    def __init__(self, config: BertConfig):
        self.config = config

    @classmethod
    def from_config(cls, cfg: Any, store: Mapping[str, Any] | None = None) -> "Bert":
        return cls(BertConfig.from_model_config(cfg, store))

    def weight_table(self) -> WeightTable:
        return weight_table(self.config)

    def bind(self, store: Mapping[str, Any]) -> WeightBinding:
        """Bind every role from ``store``. Raises ModelError naming a missing tensor."""
        return bind_weights(self.weight_table(), store, "hf", self.config.num_layers)

    bind_headless = bind

    def dims(self) -> StepDims:
        return dims(self.config)

    def trace(self, spec: StepSpec, weight_types: Mapping[str, PootType]) -> Graph:
        """Refused: BERT has no generation step (ModelError)."""
        raise ModelError("bert is an encoder: it serves embeddings and scores (poot embed, "
                         "/v1/embeddings, /v1/rerank), not generation")

    def trace_pooled(self, spec: P.PoolSpec, weight_types: Mapping[str, PootType]) -> Graph:
        """The pooled step (:func:`trace_bert`)."""
        return trace_bert(self.config, spec, weight_types)


__all__ = ["Bert", "BertConfig", "trace_bert", "weight_table"]
