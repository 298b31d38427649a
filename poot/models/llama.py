"""The Llama family: Llama 2/3.x, SmolLM2, Mistral (dense, optional sliding window).

Pre-norm decoder: ``x += o(attn(rope(q(n1(x))), rope(k(n1(x))), v(n1(x))))``,
``x += down(silu(gate(n2(x))) * up(n2(x)))``, with RMSNorm, grouped-query attention over the
KV cache, RoPE with the checkpoint's scaling (default, linear, llama3, yarn) and a tied or
untied output head. HF safetensors and GGUF (``general.architecture = llama``) checkpoints.

GGUF Q/K rows. llama.cpp's converter permutes the rows of ``attn_q``/``attn_k`` per head from
HF's "rotate half" layout (pairs ``(i, i + D/2)``) to interleaved pairs ``(2i, 2i + 1)``, and
llama.cpp then applies interleaved ("NORM") RoPE. By default this family does the same: it
traces ``apply_rope(layout="interleaved")`` for GGUF files. This is exact, not an
approximation: the permuted projection produces ``q'[2i] = q[i]``, ``q'[2i+1] = q[i + D/2]``,
so interleaved rotation of ``q'`` is the half-layout rotation of ``q`` with its channels
permuted; Q and K carry the same permutation (per head), so every score ``q . k`` is unchanged
and V/O are untouched. It keeps the packed Q/K weights exactly as stored (still memory-mapped,
no re-ordered copy). ``from_config(..., gguf_qk="unpermute")`` instead reorders the stored
rows back with ``StoredTensor.take_rows`` (packed rows copied whole) and traces half-layout
RoPE; tests check that both give the same logits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Mapping

import numpy as np

from poot.dialects.types import PootType
from poot.graph import ops
from poot.graph.builder import Builder, Graph, Tensor
from poot.load.store import llama_rotary_unpermute_rows
from poot.models import components as C
from poot.models.base import (REGISTRY, ModelError, StepDims, StepSpec, WeightBinding,
                              WeightName, WeightTable, bind_weights)

GgufQK = Literal["interleaved", "unpermute"]


@dataclass(frozen=True)
class LlamaConfig:
    """Llama hyper-parameters (from :class:`~poot.load.config.ModelConfig`).

    Attributes:
        vocab_size, hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads,
            head_dim: model shape (elements).
        rms_norm_eps: RMSNorm epsilon.
        rope_theta, rope_scaling: RoPE base and :class:`poot.graph.ops.RopeScaling`.
        rope_freq_factors: GGUF ``rope_freqs.weight`` (llama.cpp's llama3 spelling): each
            inverse frequency is divided by its factor; None if absent.
        tie_word_embeddings: the output head is the embedding table.
        sliding_window: Mistral's window W (a query sees itself and W-1 earlier positions).
        attention_bias, mlp_bias: q/k/v/o and gate/up/down biases (HF flags).
        hidden_act: the gated MLP's activation (``silu``).
        source: ``"hf"`` or ``"gguf"`` (picks the weight names).
        rope_layout: ``"half"`` (HF rows) or ``"interleaved"`` (GGUF rows kept as stored).
        unpermute_qk: GGUF only: reorder Q/K rows back to HF order at bind.
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: ops.RopeScaling
    tie_word_embeddings: bool
    source: str
    rope_layout: str = "half"
    unpermute_qk: bool = False
    rope_freq_factors: tuple[float, ...] | None = None
    sliding_window: int | None = None
    attention_bias: bool = False
    mlp_bias: bool = False
    hidden_act: str = "silu"

    def __post_init__(self):
        if self.num_heads % self.num_kv_heads:
            raise ModelError(f"llama: {self.num_heads} heads do not group over "
                             f"{self.num_kv_heads} KV heads")

    @staticmethod
    def from_model_config(cfg: Any, store: Mapping[str, Any] | None = None,
                          gguf_qk: GgufQK = "interleaved") -> "LlamaConfig":
        """Read a :class:`~poot.load.config.ModelConfig`; ``store`` supplies GGUF
        ``rope_freqs.weight`` when present. Raises ModelError for unsupported settings."""
        if gguf_qk not in ("interleaved", "unpermute"):
            raise ModelError(f"llama: gguf_qk must be 'interleaved' or 'unpermute', got "
                             f"{gguf_qk!r}")
        gguf = cfg.source == "gguf"
        extra = cfg.extra or {}
        return LlamaConfig(
            vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
            intermediate_size=cfg.intermediate_size, num_layers=cfg.num_layers,
            num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
            rms_norm_eps=float(cfg.rms_norm_eps), rope_theta=float(cfg.rope_theta),
            rope_scaling=_ops_rope_scaling(cfg), tie_word_embeddings=cfg.tie_word_embeddings,
            source=cfg.source,
            rope_layout="interleaved" if gguf and gguf_qk == "interleaved" else "half",
            unpermute_qk=gguf and gguf_qk == "unpermute",
            rope_freq_factors=_rope_freq_factors(store) if gguf else None,
            sliding_window=cfg.sliding_window,
            attention_bias=bool(extra.get("attention_bias", False)),
            mlp_bias=bool(extra.get("mlp_bias", False)),
            hidden_act=str(extra.get("hidden_act", "silu")))

    def inv_freq(self) -> np.ndarray:
        """float32 [head_dim / 2] RoPE inverse frequencies (scaled; GGUF factors applied)."""
        inv = ops.rope_inv_freq(self.head_dim, self.rope_theta, self.rope_scaling)
        if self.rope_freq_factors is not None:
            ff = np.asarray(self.rope_freq_factors, dtype=np.float64)
            inv = (inv.astype(np.float64) / ff).astype(np.float32)
        return inv


def _ops_rope_scaling(cfg: Any) -> ops.RopeScaling:
    """The loader's RopeScaling -> :class:`poot.graph.ops.RopeScaling`."""
    rs = cfg.rope_scaling
    if rs.kind == "none":
        return ops.RopeScaling()
    if rs.kind not in ("linear", "llama3", "yarn"):
        raise ModelError(f"llama: rope scaling {rs.kind!r} is not supported (supported: "
                         f"none, linear, llama3, yarn)")
    d = ops.RopeScaling()
    pick = lambda v, dflt: dflt if v is None else v  # noqa: E731
    return ops.RopeScaling(
        kind=rs.kind, factor=float(rs.factor),
        low_freq_factor=pick(rs.low_freq_factor, d.low_freq_factor),
        high_freq_factor=pick(rs.high_freq_factor, d.high_freq_factor),
        original_max_position=pick(rs.original_max_position_embeddings,
                                   cfg.max_position_embeddings),
        beta_fast=pick(rs.beta_fast, d.beta_fast), beta_slow=pick(rs.beta_slow, d.beta_slow),
        mscale=pick(rs.mscale, 0.0), mscale_all_dim=pick(rs.mscale_all_dim, 0.0),
        attention_factor=rs.attn_factor)


def _rope_freq_factors(store: Mapping[str, Any] | None) -> tuple[float, ...] | None:
    if store is None or "rope_freqs.weight" not in store:
        return None
    return tuple(float(x) for x in np.asarray(store["rope_freqs.weight"].data, np.float32))


# --- weight names ------------------------------------------------------------------------------

def _w(hf: str | None, gguf: str | None, optional: bool = False) -> WeightName:
    return WeightName(hf, gguf, optional)


_HF_BLK = "model.layers.{i}."
_BASE_TABLE: dict[str, WeightName] = {
    "tok_embed": _w("model.embed_tokens.weight", "token_embd.weight"),
    "blk.{i}.attn_norm": _w(_HF_BLK + "input_layernorm.weight", "blk.{i}.attn_norm.weight"),
    "blk.{i}.attn.q": _w(_HF_BLK + "self_attn.q_proj.weight", "blk.{i}.attn_q.weight"),
    "blk.{i}.attn.k": _w(_HF_BLK + "self_attn.k_proj.weight", "blk.{i}.attn_k.weight"),
    "blk.{i}.attn.v": _w(_HF_BLK + "self_attn.v_proj.weight", "blk.{i}.attn_v.weight"),
    "blk.{i}.attn.o": _w(_HF_BLK + "self_attn.o_proj.weight", "blk.{i}.attn_output.weight"),
    "blk.{i}.ffn_norm": _w(_HF_BLK + "post_attention_layernorm.weight",
                           "blk.{i}.ffn_norm.weight"),
    "blk.{i}.ffn.gate": _w(_HF_BLK + "mlp.gate_proj.weight", "blk.{i}.ffn_gate.weight"),
    "blk.{i}.ffn.up": _w(_HF_BLK + "mlp.up_proj.weight", "blk.{i}.ffn_up.weight"),
    "blk.{i}.ffn.down": _w(_HF_BLK + "mlp.down_proj.weight", "blk.{i}.ffn_down.weight"),
    "out_norm": _w("model.norm.weight", "output_norm.weight"),
}
_HEAD = {"lm_head": _w("lm_head.weight", "output.weight")}
_ATTN_BIAS = {f"blk.{{i}}.attn.{p}_bias": _w(_HF_BLK + f"self_attn.{p}_proj.bias",
                                              f"blk.{{i}}.attn_{g}.bias", optional=True)
              for p, g in (("q", "q"), ("k", "k"), ("v", "v"), ("o", "output"))}
_MLP_BIAS = {f"blk.{{i}}.ffn.{p}_bias": _w(_HF_BLK + f"mlp.{p}_proj.bias",
                                            f"blk.{{i}}.ffn_{p}.bias", optional=True)
             for p in ("gate", "up", "down")}


def weight_table(cfg: LlamaConfig) -> WeightTable:
    """Role -> stored names for ``cfg``: base roles, ``lm_head`` unless tied, optional
    biases (bound when the checkpoint has them)."""
    table = dict(_BASE_TABLE)
    if not cfg.tie_word_embeddings:
        table.update(_HEAD)
    table.update(_ATTN_BIAS)
    table.update(_MLP_BIAS)
    return table


# --- the family --------------------------------------------------------------------------------

@REGISTRY.register
class Llama:
    """The Llama family (see the module docstring). ``config`` is a :class:`LlamaConfig`."""

    family: ClassVar[str] = "llama"
    architectures: ClassVar[tuple[str, ...]] = ("LlamaForCausalLM", "MistralForCausalLM",
                                                 "llama")

    def __init__(self, config: LlamaConfig):
        self.config = config

    @classmethod
    def from_config(cls, cfg: Any, store: Mapping[str, Any] | None = None,
                    gguf_qk: GgufQK = "interleaved") -> "Llama":
        return cls(LlamaConfig.from_model_config(cfg, store, gguf_qk))

    def weight_table(self) -> WeightTable:
        return weight_table(self.config)

    def bind(self, store: Mapping[str, Any]) -> WeightBinding:
        """Bind every role from ``store`` (packed stays packed; see the module docstring for
        GGUF Q/K rows). Raises ModelError naming a missing tensor."""
        cfg = self.config
        rename = self._unpermute if cfg.unpermute_qk else None
        return bind_weights(self.weight_table(), store, cfg.source, cfg.num_layers, rename)

    def _unpermute(self, role: str, t: Any) -> Any:
        """GGUF Q/K (and their biases) back to HF row order, packed rows copied whole."""
        heads = {"q": self.config.num_heads, "k": self.config.num_kv_heads}
        kind = role.split(".")[-1].removesuffix("_bias")
        if ".attn." not in role or kind not in heads:
            return t
        return t.take_rows(llama_rotary_unpermute_rows(t.shape[0], heads[kind]))

    def dims(self) -> StepDims:
        c = self.config
        qkv_o = c.hidden_size * c.head_dim * (2 * c.num_heads + 2 * c.num_kv_heads)
        per_layer = qkv_o + 3 * c.hidden_size * c.intermediate_size + 2 * c.hidden_size
        head = 0 if c.tie_word_embeddings else c.vocab_size * c.hidden_size
        return StepDims(c.num_layers, c.hidden_size, c.intermediate_size, c.vocab_size,
                        c.num_heads, c.num_kv_heads, c.head_dim, ops_per_layer=224,
                        n_weight_elems=c.vocab_size * c.hidden_size + head
                        + c.num_layers * per_layer + c.hidden_size)

    def trace(self, spec: StepSpec, weight_types: Mapping[str, PootType]) -> Graph:
        """The step graph (interface in :mod:`poot.models.base`); ``weight_types`` is
        :attr:`WeightBinding.types`, so packed weights are declared packed."""
        c = self.config
        b = Builder(spec.limits(self.dims()), name=f"llama_{spec.kind}")
        types = dict(weight_types)
        inp = C.step_inputs(b, spec, c.num_layers, c.num_kv_heads, c.head_dim)
        with b.scope("embed"):
            x = ops.embedding(b, C.param(b, types, "tok_embed"), inp.tokens)
        with b.scope("rope"):
            cos, sin = ops.rope_cos_sin(b, inp.positions, c.inv_freq())
        caches = []
        for i in range(c.num_layers):
            with b.scope(f"blk.{i}"):
                x, kv = self._block(b, types, i, x, (cos, sin), inp)
            caches.append(kv)
        with b.scope("out_norm"):
            h = ops.rmsnorm(b, x, C.param(b, types, "out_norm"), c.rms_norm_eps)
        head = None
        if spec.outputs == "logits":
            head = C.param(b, types, "tok_embed" if c.tie_word_embeddings else "lm_head")
        return C.finish_step(b, spec, h, head, caches)

    def _block(self, b: Builder, types: dict[str, PootType], i: int, x: Tensor,
               rope: tuple[Tensor, Tensor], inp: C.StepInputs
               ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """One decoder layer on x f32 [B, T, H]; returns (x', (k_cache', v_cache'))."""
        c = self.config
        with b.scope("attn"):
            h = ops.rmsnorm(b, x, C.param(b, types, f"blk.{i}.attn_norm"), c.rms_norm_eps)
            a, kv = self._attention(b, types, i, h, rope, inp)
        x = x + a
        with b.scope("ffn"):
            h = ops.rmsnorm(b, x, C.param(b, types, f"blk.{i}.ffn_norm"), c.rms_norm_eps)
            x = x + self._mlp(b, types, i, h)
        return x, kv

    def _proj(self, b: Builder, types: dict[str, PootType], role: str, x: Tensor) -> Tensor:
        """``linear(x, role)`` with ``role_bias`` when the checkpoint has it."""
        bias = C.param(b, types, role + "_bias") if role + "_bias" in types else None
        return ops.linear(b, x, C.param(b, types, role), bias)

    def _attention(self, b: Builder, types: dict[str, PootType], i: int, h: Tensor,
                   rope: tuple[Tensor, Tensor], inp: C.StepInputs
                   ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """GQA self-attention of h f32 [B, T, H] over the layer's cache -> f32 [B, T, H]."""
        c = self.config
        bsz, t, _ = h.shape
        heads = lambda y, n: b.reshape(y, (bsz, t, n, c.head_dim))  # noqa: E731
        q = heads(self._proj(b, types, f"blk.{i}.attn.q", h), c.num_heads)
        k = heads(self._proj(b, types, f"blk.{i}.attn.k", h), c.num_kv_heads)
        v = heads(self._proj(b, types, f"blk.{i}.attn.v", h), c.num_kv_heads)
        q = ops.apply_rope(b, q, *rope, layout=c.rope_layout)
        k = ops.apply_rope(b, k, *rope, layout=c.rope_layout)
        out, k_cache, v_cache = C.cached_attention(b, q, k, v, inp.caches[i], inp,
                                                   sliding_window=c.sliding_window)
        out = b.reshape(out, (bsz, t, c.num_heads * c.head_dim))
        return self._proj(b, types, f"blk.{i}.attn.o", out), (k_cache, v_cache)

    def _mlp(self, b: Builder, types: dict[str, PootType], i: int, h: Tensor) -> Tensor:
        """SwiGLU MLP f32 [B, T, H] -> [B, T, H] (biases when present)."""
        if not any(f"blk.{i}.ffn.{p}_bias" in types for p in ("gate", "up", "down")):
            return ops.mlp_glu(b, h, C.param(b, types, f"blk.{i}.ffn.gate"),
                               C.param(b, types, f"blk.{i}.ffn.up"),
                               C.param(b, types, f"blk.{i}.ffn.down"), act=self.config.hidden_act)
        gate = self._proj(b, types, f"blk.{i}.ffn.gate", h)
        up = self._proj(b, types, f"blk.{i}.ffn.up", h)
        act = ops.activation(b, gate, self.config.hidden_act) * up
        return self._proj(b, types, f"blk.{i}.ffn.down", act)
