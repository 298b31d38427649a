"""The Llama family: Llama 2/3.x, SmolLM2, Mistral (dense, optional sliding window).

Pre-norm decoder: ``x += o(attn(rope(q(n1(x))), rope(k(n1(x))), v(n1(x))))``,
``x += down(silu(gate(n2(x))) * up(n2(x)))``, with RMSNorm, grouped-query attention over the
KV cache, RoPE with the checkpoint's scaling (default, linear, llama3, yarn) and a tied or
untied output head. HF safetensors and GGUF (``general.architecture = llama``) checkpoints.
Traced by :func:`poot.models.components.trace_decoder`; this module reads the config (with
GGUF ``rope_freqs.weight`` factors), names the weights and picks the GGUF Q/K treatment.

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
RoPE; tests check that both give the same logits. Kept as stored, the binding records the
Q/K row order (``WeightBinding.row_order``): a LoRA adapter's ``lora_B`` rows of q_proj /
k_proj, in HF's order, are permuted the same way when loaded into its slots.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Mapping

import numpy as np

from poot.graph import ops
from poot.load.store import llama_rotary_permute_rows, llama_rotary_unpermute_rows
from poot.models import components as C
from poot.models.base import REGISTRY, DecoderShape, ModelError, WeightBinding, WeightTable

GgufQK = Literal["interleaved", "unpermute"]


@dataclass(frozen=True)
class LlamaConfig(DecoderShape):
    """Llama hyper-parameters (from :class:`~poot.load.config.ModelConfig`).

    Attributes (beside the :class:`~poot.models.base.DecoderShape`):
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
            **DecoderShape.of(cfg), rms_norm_eps=float(cfg.rms_norm_eps),
            rope_theta=float(cfg.rope_theta),
            rope_scaling=C.ops_rope_scaling(cfg, "llama"),
            tie_word_embeddings=cfg.tie_word_embeddings,
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
        return C.rope_inv_freq(self.head_dim, self.rope_theta, self.rope_scaling,
                               freq_factors=self.rope_freq_factors)

    def options(self) -> C.DecoderOptions:
        """The :class:`~poot.models.components.DecoderOptions` this config traces as: RMSNorm,
        RoPE in ``rope_layout`` with :meth:`inv_freq` (cos/sin are not multiplied by yarn's
        attention factor: this family never applied it), the ``hidden_act`` gated MLP,
        ``sliding_window`` on every layer."""
        return C.DecoderOptions(
            **DecoderShape.of(self), norm_eps=self.rms_norm_eps,
            inv_freq=tuple(float(x) for x in self.inv_freq()),
            tie_word_embeddings=self.tie_word_embeddings, source=self.source,
            rope_layout=self.rope_layout, act=self.hidden_act,
            layer_windows=(() if self.sliding_window is None
                           else (self.sliding_window,) * self.num_layers))


def _rope_freq_factors(store: Mapping[str, Any] | None) -> tuple[float, ...] | None:
    if store is None or "rope_freqs.weight" not in store:
        return None
    return tuple(float(x) for x in np.asarray(store["rope_freqs.weight"].data, np.float32))


# --- weight names ------------------------------------------------------------------------------

def weight_table(cfg: LlamaConfig) -> WeightTable:
    """Role -> stored names (HF and GGUF) for ``cfg``: the shared decoder roles, ``lm_head``
    unless tied, optional q/k/v/o and gate/up/down biases (bound when the checkpoint has
    them)."""
    return {**C.decoder_weight_names(cfg.options(), attn_bias=True),
            **C.dense_ffn_names(bias=True)}


# --- the family --------------------------------------------------------------------------------

@REGISTRY.register
class Llama(C.DecoderModel):
    """The Llama family (see the module docstring). ``config`` is a :class:`LlamaConfig`;
    the step graph is :func:`poot.models.components.trace_decoder` of its options."""

    family: ClassVar[str] = "llama"
    architectures: ClassVar[tuple[str, ...]] = ("LlamaForCausalLM", "MistralForCausalLM",
                                                 "llama", "LlamaModel", "MistralModel",
                                                 "LlamaForSequenceClassification")

    config: LlamaConfig

    @classmethod
    def from_config(cls, cfg: Any, store: Mapping[str, Any] | None = None,
                    gguf_qk: GgufQK = "interleaved") -> "Llama":
        return cls(LlamaConfig.from_model_config(cfg, store, gguf_qk))

    def options(self) -> C.DecoderOptions:
        return self.config.options()

    def weight_table(self) -> WeightTable:
        return weight_table(self.config)

    def bind(self, store: Mapping[str, Any]) -> WeightBinding:
        """Bind every role from ``store`` (packed stays packed; see the module docstring for
        GGUF Q/K rows). GGUF Q/K kept as stored get their llama.cpp row order recorded in
        ``row_order`` (so a LoRA adapter's ``lora_B`` is laid out like them). Raises
        ModelError naming a missing tensor."""
        out = super().bind(store, self._unpermute if self.config.unpermute_qk else None)
        if self.config.rope_layout == "interleaved":
            for role, t in out.types.items():
                heads = self._qk_heads(role)
                if heads is not None:
                    out.row_order[role] = llama_rotary_permute_rows(t.shape[0], heads)
        return out

    def _qk_heads(self, role: str) -> int | None:
        """The head count of a Q or K projection role (or its bias), else None."""
        heads = {"q": self.config.num_heads, "k": self.config.num_kv_heads}
        kind = role.split(".")[-1].removesuffix("_bias")
        return heads[kind] if ".attn." in role and kind in heads else None

    def _unpermute(self, role: str, t: Any) -> Any:
        """GGUF Q/K (and their biases) back to HF row order, packed rows copied whole."""
        heads = self._qk_heads(role)
        if heads is None:
            return t
        return t.take_rows(llama_rotary_unpermute_rows(t.shape[0], heads))
