"""What a model family is, and how a checkpoint finds its family.

A family (``poot.models.llama`` ...) is four things, and nothing outside ``poot/models`` names
one:

* a **config type**: a frozen dataclass built from the shared
  :class:`~poot.load.config.ModelConfig` (HF ``config.json`` or GGUF metadata);
* a **weight-name table**: role -> stored tensor name per checkpoint kind (``"hf"``
  safetensors, ``"gguf"``). A role is the name the tracer's ``b.param(role, type)`` uses;
* a **tracer**: ``trace(spec, weight_types) -> Graph`` over :class:`~poot.graph.Builder` and
  the shared compositions in :mod:`poot.graph.ops`;
* its **registration**: the architecture names it answers to (HF ``architectures[0]`` such
  as ``LlamaForCausalLM``, GGUF ``general.architecture`` such as ``llama``).

The step interface every family traces (see :class:`StepSpec`): the KV cache is **paged**
(vLLM's PagedAttention layout; docs/serving.md)::

    inputs   tokens       i32 [B, T]           token ids
             positions    i32 [B, T]           absolute position of each token
             block_table  i32 [B, W]           the KV blocks of each sequence, in position
                                               order: position p lives in block
                                               block_table[b, p // bs] at offset p % bs
             slot_mapping i32 [B*T]            where this step's K/V rows go: flat slot
                                               block * bs + offset (row-major (b, t)); a slot
                                               outside [0, NB*bs) writes nothing (padding)
             kv.{i}.k     kv [NB, bs, Hkv, D]  layer i's key block pool (and kv.{i}.v), in the
                                               KV dtype (f32, f16 or bf16; q8_0: i8 values
                                               and kv.{i}.k_scale f16 [NB, bs, Hkv, D/32],
                                               poot.dialects.kv_quant)
    outputs  logits       f32 [B, T, V]        (or hidden f32 [B, T, hidden])
             kv.{i}.k, kv.{i}.v                the pools with this step's K/V written at
                                               slot_mapping; a runtime updates them in place

Attention gathers each sequence's blocks through its table (key j of the gathered
``[W * bs]`` axis is position j) and masks keys by position (causal, optional sliding
window), so a decode graph (T = 1) has one shape for every position, every block placement
and every batch composition. The flash-attention rewrite turns that composition into one
``poot.paged_attention`` that reads the pools in place.

A contiguous per-sequence cache is the special case ``block_size = kv_capacity`` (one block a
sequence, ``W = 1``): :func:`contiguous_inputs` builds those inputs from per-sequence slots.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import (Any, Callable, ClassVar, Collection, Literal, Mapping, Protocol,
                    runtime_checkable)

import numpy as np

from poot.dialects.kv_quant import FP8, KvDType, KvQuant, Q8_0
from poot.dialects.types import DType, PackedType, PootType, TensorType
from poot.errors import PootError
from poot.graph.builder import Graph, TraceLimits
from poot.graph.sampling import trace_cost

StepKind = Literal["prefill", "decode"]
StepOutputs = Literal["logits", "hidden"]


class ModelError(PootError):
    """A checkpoint a family cannot serve (missing tensor, unsupported setting, bad spec)."""


class UnknownArchitecture(ModelError):
    """No family is registered for ``architecture``; ``registered`` lists the known names."""

    def __init__(self, architecture: str, registered: list[str]):
        self.architecture, self.registered = architecture, list(registered)
        super().__init__(f"unknown architecture {architecture!r}; registered: "
                         f"{', '.join(self.registered) or '(none)'}")


# --- step specs --------------------------------------------------------------------------------

#: KV storage dtypes a step may declare (float; the formats of KV_STORAGE add q8_0 and fp8).
KV_DTYPES = (DType.F32, DType.F16, DType.BF16)
#: Every KV storage a step may declare.
KV_STORAGE = KV_DTYPES + (Q8_0, FP8)


@dataclass(frozen=True)
class StepSpec:
    """The shape of one traced step.

    Attributes:
        kind: ``"prefill"`` (T tokens per sequence, T >= 1) or ``"decode"`` (T = 1).
        batch: sequences per step, B >= 1.
        tokens: tokens per sequence, T (1 for decode).
        kv_capacity: positions one sequence may hold, ``W * block_size`` (its block table has
            ``W = kv_capacity / block_size`` entries); positions lie in ``[0, kv_capacity)``.
        kv_slots: sequences the pool holds at full capacity when ``num_blocks`` is not given
            (``num_blocks = kv_slots * W``), >= 1.
        outputs: ``"logits"`` (f32 [B, T, V]) or ``"hidden"`` (final-normed f32 [B, T, H]).
        sampler: a :class:`~poot.graph.sampling.SamplerSpec` to append the on-device sampling
            suffix to a decode step's logits (inputs ``sampling.*``, outputs
            ``sampling.token`` i32 [B], ``sampling.token_counts_out`` ...), or ``None``. The
            serving engine runs sampling as its own program instead
            (:mod:`poot.engine.runner`).
        block_size: positions per KV block, bs (None: ``kv_capacity``, one block a sequence);
            must divide ``kv_capacity``.
        num_blocks: blocks in each layer's pool, NB (None: ``kv_slots * W``).
        kv_dtype: the pools' storage (f32, f16, bf16 or q8_0,
            :mod:`poot.dialects.kv_quant`); None: the model's default
            (:func:`default_kv_dtype`).
        logit_rows: S, for a *ragged* step (:meth:`ragged`): a decode step whose B rows are
            tokens of any sequences (several rows may be one sequence's consecutive
            positions, each with that sequence's block table), the step input
            ``logit_rows`` i32 [S] naming the rows whose logits are computed: logits f32
            [S, 1, V] (the head runs on those rows only). None: every row's.
        kv_dtype_v: the V pools' storage when it differs from K's (``kv_dtype``); None:
            ``kv_dtype``.

    Raises :class:`ModelError` on a field out of its domain.
    """

    kind: StepKind
    batch: int
    tokens: int
    kv_capacity: int
    kv_slots: int = 1
    outputs: StepOutputs = "logits"
    sampler: Any = None
    block_size: int | None = None
    num_blocks: int | None = None
    kv_dtype: KvDType | None = None
    logit_rows: int | None = None
    kv_dtype_v: KvDType | None = None

    def __post_init__(self):
        if self.kind not in ("prefill", "decode"):
            raise ModelError(f"StepSpec.kind must be 'prefill' or 'decode', got {self.kind!r}")
        if self.outputs not in ("logits", "hidden"):
            raise ModelError(f"StepSpec.outputs must be 'logits' or 'hidden', got "
                             f"{self.outputs!r}")
        for k in ("batch", "tokens", "kv_capacity", "kv_slots"):
            v = getattr(self, k)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ModelError(f"StepSpec.{k} must be a positive int, got {v!r}")
        for k in ("block_size", "num_blocks"):
            v = getattr(self, k)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v <= 0):
                raise ModelError(f"StepSpec.{k} must be a positive int or None, got {v!r}")
        if self.kv_capacity % self.bs:
            raise ModelError(f"StepSpec.block_size {self.bs} does not divide kv_capacity "
                             f"{self.kv_capacity}")
        for k in ("kv_dtype", "kv_dtype_v"):
            v = getattr(self, k)
            if v is not None and v not in KV_STORAGE:
                raise ModelError(f"StepSpec.{k} must be one of "
                                 f"{', '.join(d.value for d in KV_STORAGE)}, got {v!r}")
        if self.kind == "decode" and self.tokens != 1:
            raise ModelError(f"a decode step has T = 1, got tokens={self.tokens}")
        if self.tokens > self.kv_capacity:
            raise ModelError(f"T = {self.tokens} tokens do not fit a KV capacity of "
                             f"{self.kv_capacity}")
        if self.logit_rows is not None and (
                self.kind != "decode" or self.outputs != "logits" or self.sampler is not None
                or not isinstance(self.logit_rows, int) or isinstance(self.logit_rows, bool)
                or not 1 <= self.logit_rows <= self.batch):
            raise ModelError(f"StepSpec.logit_rows must be an int in [1, batch={self.batch}] "
                             f"of a decode step with outputs='logits' and no sampler, got "
                             f"{self.logit_rows!r}")
        if self.sampler is not None and (self.tokens != 1 or self.outputs != "logits"):
            raise ModelError("the sampling suffix needs one logits row per sequence "
                             "(a decode step with outputs='logits')")

    @staticmethod
    def prefill(tokens: int, *, batch: int = 1, kv_capacity: int, kv_slots: int = 1,
                outputs: StepOutputs = "logits", block_size: int | None = None,
                num_blocks: int | None = None, kv_dtype: KvDType | None = None,
                kv_dtype_v: KvDType | None = None) -> "StepSpec":
        return StepSpec("prefill", batch, tokens, kv_capacity, kv_slots, outputs, None,
                        block_size, num_blocks, kv_dtype, kv_dtype_v=kv_dtype_v)

    @staticmethod
    def decode(*, batch: int = 1, kv_capacity: int, kv_slots: int = 1,
               outputs: StepOutputs = "logits", sampler: Any = None,
               block_size: int | None = None, num_blocks: int | None = None,
               kv_dtype: KvDType | None = None, kv_dtype_v: KvDType | None = None
               ) -> "StepSpec":
        return StepSpec("decode", batch, 1, kv_capacity, kv_slots, outputs, sampler,
                        block_size, num_blocks, kv_dtype, kv_dtype_v=kv_dtype_v)

    @staticmethod
    def ragged(tokens: int, *, logit_rows: int, kv_capacity: int, kv_slots: int = 1,
               block_size: int | None = None, num_blocks: int | None = None,
               kv_dtype: KvDType | None = None, kv_dtype_v: KvDType | None = None
               ) -> "StepSpec":
        """A ragged step of ``tokens`` token rows (decode rows and prefill chunks of any
        sequences, flattened) computing the logits of ``logit_rows`` of them (attribute
        doc)."""
        return StepSpec("decode", tokens, 1, kv_capacity, kv_slots, "logits", None,
                        block_size, num_blocks, kv_dtype, logit_rows, kv_dtype_v)

    def limits(self, dims: "StepDims") -> TraceLimits:
        """The :class:`TraceLimits` of this step for a model of ``dims``
        (:func:`trace_limits`)."""
        return trace_limits(self, dims)

    @property
    def bs(self) -> int:
        """Positions per KV block."""
        return self.block_size or self.kv_capacity

    @property
    def table_width(self) -> int:
        """W: block-table entries per sequence (``kv_capacity / bs``)."""
        return self.kv_capacity // self.bs

    @property
    def n_blocks(self) -> int:
        """NB: blocks per pool."""
        return self.num_blocks or self.kv_slots * self.table_width

    @property
    def n_tokens(self) -> int:
        """B * T: token rows the step computes."""
        return self.batch * self.tokens

    def input_types(self) -> dict[str, TensorType]:
        """The non-cache step inputs: tokens/positions i32 [B, T], block_table i32 [B, W],
        slot_mapping i32 [B*T]."""
        bt = (self.batch, self.tokens)
        return {"tokens": TensorType(bt, DType.I32), "positions": TensorType(bt, DType.I32),
                "block_table": TensorType((self.batch, self.table_width), DType.I32),
                "slot_mapping": TensorType((self.n_tokens,), DType.I32)}

    def cache_storage(self, pool: str, default_dtype: DType = DType.F32) -> KvDType:
        """The storage of the pool named ``pool`` (``"k"``, ``"v"``, MLA's ``"latent"``):
        ``kv_dtype_v`` for ``"v"`` when set, else ``kv_dtype``, else ``default_dtype``."""
        if pool == "v" and self.kv_dtype_v is not None:
            return self.kv_dtype_v
        return self.kv_dtype or default_dtype

    @property
    def kv_quantized(self) -> bool:
        """Whether a pool is block-quantized (q8_0)."""
        return any(isinstance(t, KvQuant) for t in (self.kv_dtype, self.kv_dtype_v))

    def cache_type(self, n_kv_heads: int, head_dim: int,
                   default_dtype: DType = DType.F32) -> TensorType:
        """One layer's K (or V) block pool: kv [NB, bs, Hkv, D] (``kv_dtype``, else
        ``default_dtype``; a q8_0 pool's values plane, i8)."""
        st = self.kv_dtype or default_dtype
        return TensorType((self.n_blocks, self.bs, n_kv_heads, head_dim),
                          st.values if isinstance(st, KvQuant) else st)


def contiguous_inputs(kv_capacity: int, tokens, positions, slots) -> dict[str, np.ndarray]:
    """Step inputs for a contiguous cache (a step with ``block_size = kv_capacity``: sequence
    slot s owns block s): ``tokens``/``positions`` [B, T], ``slots`` [B] -> ``tokens``,
    ``positions``, ``block_table`` (``[[s]]``) and ``slot_mapping``
    (``s * kv_capacity + position``; a position outside ``[0, kv_capacity)`` becomes -1, a
    padding row that writes nothing)."""
    tokens = np.asarray(tokens, np.int32)
    positions = np.asarray(positions, np.int32).reshape(tokens.shape)
    slots = np.asarray(slots, np.int32).reshape(tokens.shape[0])
    c = int(kv_capacity)
    ok = (positions >= 0) & (positions < c)
    slot_mapping = np.where(ok, slots[:, None] * c + positions, -1).astype(np.int32)
    return {"tokens": tokens, "positions": positions, "block_table": slots[:, None].copy(),
            "slot_mapping": slot_mapping.reshape(-1)}


def default_kv_dtype(weight_types: Mapping[str, PootType],
                     storage: Collection[DType] | None = None) -> DType:
    """The KV dtype a model's weights suggest: the dtype most of its dense float weights
    have (bf16 / f16 / f32); f16 when most weights are packed (a GGUF quantized checkpoint,
    llama.cpp's default KV type). ``storage``: the dtypes the target's buffers may hold (its
    capabilities); a suggestion outside them falls back to f32."""
    counts: dict[DType, int] = {}
    for t in weight_types.values():
        if isinstance(t, PackedType):
            key = DType.F16
        elif isinstance(t, TensorType) and t.dtype in KV_DTYPES and t.rank >= 2:
            key = t.dtype
        else:
            continue
        counts[key] = counts.get(key, 0) + 1
    if not counts:
        return DType.F32
    best = max(counts, key=lambda d: (counts[d], d is DType.F32))
    return best if storage is None or best in storage else DType.F32


@dataclass(frozen=True)
class DecoderShape:
    """The shape of a decoder, as every config of one states it (a family's config, the shared
    decoder's options; :class:`~poot.load.config.ModelConfig` has the same fields).

    Attributes:
        vocab_size: rows of the embedding table. hidden_size: the residual width.
        intermediate_size: the FFN's inner width. num_layers: decoder layers.
        num_heads, num_kv_heads: query and KV heads (GQA groups ``num_heads // num_kv_heads``
            queries a KV head). head_dim: channels a head.
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int

    @staticmethod
    def of(cfg: Any) -> dict[str, int]:
        """The shape fields of ``cfg`` (any object with them: a ModelConfig, a family's
        config) by name, to build another config of the same shape."""
        return {f.name: getattr(cfg, f.name) for f in fields(DecoderShape)}


@dataclass(frozen=True)
class StepDims:
    """The sizes a family reports so :func:`trace_limits` can bound a step's graph.

    Attributes:
        n_layers, hidden, intermediate, vocab, n_heads, n_kv_heads, head_dim: model shape.
        n_weight_elems: logical elements of all weights (each may be dequantized to f32 once).
        ops_per_layer: a bound on the ops one layer traces (the family's own estimate).
        token_elems_per_layer: f32 elements one token's activations hold in one layer beyond
            the decoder estimate of :func:`trace_limits` (a family whose layers keep more:
            LayerNorm's centred copies, GELU through erf).
        kv_elems_per_token: KV-cache elements one position holds in one layer, all of the
            layer's pools together; None: a K and a V of ``n_kv_heads * head_dim`` each
            (:attr:`kv_token_elems`). Multi-head latent attention keeps
            ``kv_lora_rank + qk_rope_head_dim``.
    """

    n_layers: int
    hidden: int
    intermediate: int
    vocab: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    n_weight_elems: int
    ops_per_layer: int = 400
    token_elems_per_layer: int = 0
    kv_elems_per_token: int | None = None

    @property
    def kv_token_elems(self) -> int:
        """KV-cache elements a position holds in one layer (every pool of the layer)."""
        if self.kv_elems_per_token is not None:
            return self.kv_elems_per_token
        return 2 * self.n_kv_heads * self.head_dim


def trace_limits(spec: StepSpec, dims: StepDims) -> TraceLimits:
    """:class:`TraceLimits` for one step, derived from its shape with a 2x margin.

    Owned bytes bound every f32 result: each weight dequantized/cast once, per-layer
    activations over N = B*T rows, attention scores over [B, Hq, T, C] (several passes), the
    caches (scatter result + slot gather + GQA expansion), and the output head.
    """
    n, d = spec.n_tokens, dims
    qkv = (d.n_heads + 2 * d.n_kv_heads) * d.head_dim
    per_layer = (n * (16 * d.hidden + 8 * d.intermediate + 8 * qkv + d.token_elems_per_layer)
                 + 12 * spec.batch * d.n_heads * spec.tokens * spec.kv_capacity
                 + 2 * spec.n_blocks * spec.bs * d.kv_token_elems
                 + 6 * spec.batch * spec.kv_capacity * d.n_heads * d.head_dim)
    elems = (2 * d.n_weight_elems + d.n_layers * per_layer
             + n * (4 * d.vocab + 8 * d.hidden) + 8 * d.head_dim * n)
    ops = 256 + d.n_layers * d.ops_per_layer
    values, literal, owned = 2 * ops, 1 << 20, 2 * 4 * elems
    if spec.sampler is not None:
        cost = trace_cost(spec.batch, d.vocab, spec.sampler)
        values += cost["values"] + 64
        ops += cost["ops"] // 2 + 32
        literal += cost["literal_bytes"]
        owned += cost["owned_bytes"]
    return TraceLimits(max_values=values, max_ops=2 * ops, max_literal_bytes=literal,
                       max_owned_bytes=owned, max_tokens=n)


# --- weights -----------------------------------------------------------------------------------

#: Checkpoint kinds a weight-name table covers (``WeightStore.kind``).
SOURCES = ("hf", "gguf")


@dataclass(frozen=True)
class WeightName:
    """Where one role is stored: its tensor name per checkpoint kind (None: not stored
    there), and whether the role may be absent (optional biases, tied heads). ``stack`` > 0:
    the name holds ``{e}`` and the role is the ``stack`` tensors ``e = 0 .. stack-1``
    stacked on a new leading axis at bind time (HF's per-expert MoE weights: one
    ``[E, ...]`` weight a kernel can index in place)."""

    hf: str | None
    gguf: str | None
    optional: bool = False
    stack: int = 0

    def stored(self, source: str) -> str | None:
        return self.hf if source == "hf" else self.gguf


#: role -> where it is stored; roles with ``{i}`` expand per layer.
WeightTable = Mapping[str, WeightName]


@dataclass
class WeightBinding:
    """Param role -> stored array and its graph type.

    ``types[role]`` is what the tracer declares with ``b.param(role, type)``; ``arrays[role]``
    is what the oracle binds: dense tensors in their stored dtype (f32/f16/bf16; other
    dtypes converted to f32), packed tensors as their stored ``uint8`` block bytes with a
    :class:`PackedType`. ``stored[role]`` names the checkpoint tensor.

    ``row_order[role]`` (int64 [out]) is recorded by the family for a projection whose
    output rows are bound in another order than the HF checkpoint's (llama's GGUF Q/K kept
    in llama.cpp's permuted order): bound row ``r`` is HF row ``row_order[role][r]``.
    Anything added to that projection's output in HF's order (a PEFT ``lora_B``) is laid
    out like the base by taking those rows (:class:`~poot.models.lora.LoraTable`).
    """

    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    types: dict[str, PootType] = field(default_factory=dict)
    stored: dict[str, str] = field(default_factory=dict)
    row_order: dict[str, np.ndarray] = field(default_factory=dict)

    def __getitem__(self, role: str) -> np.ndarray:
        return self.arrays[role]

    def __contains__(self, role: object) -> bool:
        return role in self.arrays

    def __call__(self, role: str) -> np.ndarray:
        """Callable form for :func:`poot.oracle.evaluate` (raises KeyError if unbound)."""
        return self.arrays[role]

    def add(self, role: str, tensor: Any) -> None:
        """Bind ``role`` to a :class:`~poot.load.store.StoredTensor` without dequantizing."""
        array, type_ = stored_param(tensor)
        self.arrays[role], self.types[role], self.stored[role] = array, type_, tensor.name

    def add_stacked(self, role: str, tensors: list, name: str) -> None:
        """Bind ``role`` to ``tensors`` (same shape, dtype and format) stacked on a new
        leading axis (``name``: their names' pattern, for messages): one host copy (packed
        blocks concatenated as stored, each tensor's bytes being its rows in order). Raises
        ModelError naming a tensor that differs."""
        parts = [stored_param(t) for t in tensors]
        t0 = parts[0][1]
        for t, (_, ty) in zip(tensors, parts):
            if ty != t0:
                raise ModelError(f"{t.name}: {ty} differs from {tensors[0].name}'s {t0}; "
                                 f"the tensors of role {role!r} must match to be stacked")
        if isinstance(t0, PackedType):
            array = np.concatenate([np.asarray(a).reshape(-1) for a, _ in parts])
            type_ = PackedType(t0.format, (len(parts),) + tuple(t0.shape))
        else:
            array = np.stack([np.asarray(a) for a, _ in parts])
            type_ = TensorType((len(parts),) + tuple(t0.shape), t0.dtype)
        self.arrays[role], self.types[role] = array, type_
        self.stored[role] = name


_ORACLE_DTYPES = {"f32": DType.F32, "f16": DType.F16, "bf16": DType.BF16}


def stored_param(t: Any) -> tuple[np.ndarray, PootType]:
    """(array, graph type) for a stored tensor: packed stays packed (uint8 bytes +
    :class:`PackedType`); f32/f16/bf16 stay as stored; other dense dtypes become f32."""
    if t.quant is not None:
        return t.data, PackedType(t.quant, t.shape)
    dt = _ORACLE_DTYPES.get(t.dtype.value)
    if dt is None:
        return np.asarray(t.data, dtype=np.float32), TensorType(t.shape, DType.F32)
    return t.data, TensorType(t.shape, dt)


def bind_weights(table: WeightTable, store: Mapping[str, Any], source: str, n_layers: int,
                 rename: Callable[[str, Any], Any] | None = None) -> WeightBinding:
    """Bind every role of ``table`` (``{i}`` expanded over ``n_layers``) from ``store``.

    ``rename(role, tensor)`` may return a replacement tensor (for example rows permuted with
    ``take_rows``). Raises :class:`ModelError` naming the first missing required tensor.
    """
    out = WeightBinding()
    for role_t, where in table.items():
        name_t = where.stored(source)
        layers = range(n_layers) if "{i}" in role_t else [None]
        for i in layers:
            role = role_t.format(i=i) if i is not None else role_t
            name = name_t.format(i=i, e="{e}") if (name_t and i is not None) else name_t
            names = [name.format(e=e) for e in range(where.stack)] \
                if where.stack and name is not None else [name]
            missing = next((n for n in names if n is None or n not in store), False)
            if missing is not False:
                if where.optional:
                    continue
                raise ModelError(f"checkpoint has no tensor {missing!r} (role {role!r}, "
                                 f"{source} naming)")
            if where.stack:
                out.add_stacked(role, [store[n] for n in names], name)
                continue
            t = store[name]
            out.add(role, rename(role, t) if rename else t)
    return out


# --- the family protocol and registry ----------------------------------------------------------

@runtime_checkable
class Model(Protocol):
    """A model family instance: a config plus a tracer over shared components.

    Class attributes:
        family: the family's name (``"llama"``), for messages only.
        architectures: the architecture names it is registered under.
    """

    family: ClassVar[str]
    architectures: ClassVar[tuple[str, ...]]
    config: Any

    @classmethod
    def from_config(cls, cfg: Any, store: Mapping[str, Any] | None = None) -> "Model":
        """Build the family's config type from a :class:`~poot.load.config.ModelConfig`
        (``store``, when given, lets a family read tensors that carry settings)."""
        ...

    def weight_table(self) -> WeightTable:
        """Role -> stored names for this config (tied heads drop their own role)."""
        ...

    def bind(self, store: Any) -> WeightBinding:
        """Bind every role from an opened :class:`~poot.load.store.WeightStore`."""
        ...

    def dims(self) -> StepDims:
        """Sizes for :func:`trace_limits`."""
        ...

    def trace(self, spec: StepSpec, weight_types: Mapping[str, PootType]) -> Graph:
        """The step graph for ``spec``; params are declared with ``weight_types[role]``."""
        ...


class Registry:
    """Architecture name -> family class. Lookups are exact and case-sensitive."""

    def __init__(self):
        self._families: dict[str, type] = {}

    def register(self, family: type) -> type:
        """Register ``family`` under each of its ``architectures``; usable as a decorator.
        Raises ModelError if a name is already taken by another family."""
        for arch in family.architectures:
            prev = self._families.get(arch)
            if prev is not None and prev is not family:
                raise ModelError(f"architecture {arch!r} is already registered to "
                                 f"{prev.family}")
            self._families[arch] = family
        return family

    def lookup(self, architecture: str) -> type:
        """The family for ``architecture``; raises :class:`UnknownArchitecture`."""
        try:
            return self._families[architecture]
        except KeyError:
            raise UnknownArchitecture(architecture, self.names()) from None

    def names(self) -> list[str]:
        return sorted(self._families)

    def __contains__(self, architecture: object) -> bool:
        return architecture in self._families


#: The registry families add themselves to when imported (:mod:`poot.models.families`).
REGISTRY = Registry()


@dataclass
class LoadedModel:
    """A family instance with its config and the weights bound to its roles."""

    model: Any
    weights: WeightBinding
    store: Any

    def __iter__(self):  # model, weights = load_model(path)
        return iter((self.model, self.weights))


