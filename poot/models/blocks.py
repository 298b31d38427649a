"""The blocks every family's step trace is built of: step inputs, the paged KV cache, weights
and their projections (with per-sequence LoRA terms), the output head.

Every family's tracer uses these, so the step interface described in :mod:`poot.models.base`
is spelled once: each layer's K and V block pools ``[NB, bs, Hkv, D]`` are step inputs and
outputs; a step scatters its K/V rows at ``slot_mapping`` (flat slot ``block * bs + offset``)
and attention gathers each sequence's blocks through its ``block_table`` (key j of the
gathered axis is position j), keys masked by position.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Sequence

from poot.dialects.kv_quant import FP8_MAX, KvQuant
from poot.dialects.types import DType, PootType, TensorType
from poot.graph import ops, sampling
from poot.graph.builder import Builder, Tensor
from poot.models.base import StepSpec
from poot.models.lora import COLUMN_SLOT, shrink_param


@dataclass
class StepInputs:
    """The traced step inputs.

    Attributes:
        tokens: i32 [B, T]. positions: i32 [B, T]. block_table: i32 [B, W].
        kv_index: i32 [B*T, 2] rows ``(slot // bs, slot % bs)`` of ``slot_mapping``: where
            this step's K/V rows go in a pool (a negative slot gives an offset out of range:
            the row is dropped).
        caches: per layer its pools (``(k, v)``, each kv [NB, bs, Hkv, D]; multi-head
            latent attention's one ``(latent,)``: :mod:`poot.models.mla`); None in a pooled
            step (:mod:`poot.models.pooling`: no cache, attention over the step's own keys).
        cache_names: the pools' names in ``kv.{i}.<name>``, in the order of each layer's
            tuple.
        mask: i1 [B, T, T], the keys each query may see besides the causal mask (a pooled
            step's padding mask), or None.
        lora_mask: f32 [B, 1, L*R], which slot columns of the LoRA terms each sequence
            uses (:func:`lora_row_mask` of the step input ``lora_index``), or None when the
            step carries no LoRA slots.
    """

    tokens: Tensor
    positions: Tensor
    block_table: Tensor | None
    kv_index: Tensor | None
    caches: list[tuple[Tensor, ...]] | None
    mask: Tensor | None = None
    lora_mask: Tensor | None = None
    cache_names: tuple[str, ...] = ("k", "v")



#: A layer's KV pools: (name, heads, head dim) each.
KvPools = tuple[tuple[str, int, int], ...]


@dataclass(frozen=True)
class QuantPool:
    """A block-quantized KV pool in a trace (:mod:`poot.dialects.kv_quant`): its values plane
    (q8_0: i8 [NB, bs, H, D], step input ``kv.{i}.<name>``) and scales plane (f16
    [NB, bs, H, D / 32], ``kv.{i}.<name>_scale``)."""

    values: Tensor
    scales: Tensor

    @property
    def shape(self) -> tuple[int, ...]:
        return self.values.shape


def _declare_pool(b: Builder, name: str, storage, shape) -> "Tensor | QuantPool":
    """Step input(s) of one pool of ``shape`` in ``storage`` (a DType or a KvQuant)."""
    if isinstance(storage, KvQuant):
        vt, st = storage.planes(shape)
        return QuantPool(b.input(name, vt), b.input(f"{name}_scale", st))
    return b.input(name, TensorType(shape, storage))



def step_inputs(b: Builder, spec: StepSpec, n_layers: int, n_kv_heads: int,
                head_dim: int, kv_dtype: DType = DType.F32,
                pools: KvPools | None = None) -> StepInputs:
    """Declare ``tokens``, ``positions``, ``block_table``, ``slot_mapping`` then each layer's
    pools ``kv.{i}.<name>`` (``pools``: (name, heads, dim) each, default
    ``(("k", n_kv_heads, head_dim), ("v", n_kv_heads, head_dim))``; kv [NB, bs, heads, dim]
    of ``spec.kv_dtype``, else ``kv_dtype``), in that argument order, and build the pool
    write index."""
    t = {name: b.input(name, ty) for name, ty in spec.input_types().items()}
    pools = pools or (("k", n_kv_heads, head_dim), ("v", n_kv_heads, head_dim))
    types = [(spec.cache_storage(name, kv_dtype), spec.cache_type(h, d).shape)
             for name, h, d in pools]
    caches = [tuple(_declare_pool(b, f"kv.{i}.{name}", st, shape)
                    for (name, _, _), (st, shape) in zip(pools, types))
              for i in range(n_layers)]
    with b.scope("kv_index"):
        index = kv_write_index(b, t["slot_mapping"], spec.bs)
    return StepInputs(t["tokens"], t["positions"], t["block_table"], index, caches,
                      cache_names=tuple(name for name, _, _ in pools))



def kv_write_index(b: Builder, slot_mapping: Tensor, block_size: int) -> Tensor:
    """i32 [N, 2] pool coordinates ``(slot / bs, slot - (slot / bs) * bs)`` of flat slots
    i32 [N] (C division, truncating: a slot of -1 gives ``(0, -1)``, out of range)."""
    (n,) = slot_mapping.shape
    bs = b.scalar(block_size, DType.I32)
    blk = slot_mapping / bs
    off = slot_mapping - blk * bs
    col = lambda x: b.reshape(x, (n, 1))  # noqa: E731
    return b.concat([col(blk), col(off)], axis=1)



def cached_kv(b: Builder, pool: "Tensor | QuantPool", new: Tensor, kv_index: Tensor,
              block_table: Tensor) -> tuple["Tensor | QuantPool", Tensor]:
    """Write ``new`` f32 [B, T, Hkv, D] into ``pool`` kv [NB, bs, Hkv, D] at ``kv_index``
    (rounded to the pool's dtype; a :class:`QuantPool` quantized, :func:`quantize_q8_0` or
    :func:`quantize_fp8`) and
    gather each sequence's blocks back.

    Returns ``(updated_pool, keys)``: the updated pool (same type as ``pool``; a step output)
    and f32 [B, W * bs, Hkv, D], row j holding position j of sequence b (block
    ``block_table[b, j // bs]``, offset ``j % bs``). Rows at an out-of-range coordinate are
    dropped by the scatter.
    """
    bsz, t, hkv, d = new.shape
    nb, bs = pool.shape[:2]
    w = block_table.shape[1]
    rows = b.reshape(new, (bsz * t, hkv, d))
    if isinstance(pool, QuantPool):
        fp8 = pool.scales.dtype is DType.F32        # fp8's per-head f32 scales; q8_0's f16
        q, scales = (quantize_fp8 if fp8 else quantize_q8_0)(b, ops.as_f32(b, rows))
        updated = QuantPool(b.scatter(pool.values, kv_index, q),
                            b.scatter(pool.scales, kv_index, scales))
        vals = b.gather(updated.values, block_table, axis=0)
        sc = b.gather(updated.scales, block_table, axis=0)
        keys = b.op("dequantize_fp8" if fp8 else "dequantize_q8_0", [vals, sc])
        return updated, b.reshape(keys, (bsz, w * bs, hkv, d))
    if rows.dtype is not pool.dtype:
        rows = b.cast(rows, pool.dtype)
    updated = b.scatter(pool, kv_index, rows)
    keys = b.reshape(b.gather(updated, block_table, axis=0), (bsz, w * bs, hkv, d))
    return updated, ops.as_f32(b, keys)



def quantize_q8_0(b: Builder, x: Tensor) -> tuple[Tensor, Tensor]:
    """``x`` f32 [..., D] as q8_0 (:mod:`poot.dialects.kv_quant`: per 32 values
    ``d = max|x| / 127``, ``q = round(x / d)`` half away from zero, 0 where ``d == 0``):
    ``(q i8 [..., D], d f16 [..., D / 32])``."""
    *lead, d = x.shape
    g = b.reshape(x, tuple(lead) + (d // 32, 32))
    amax = b.reduce("max", b.unary("abs", g), -1, keepdims=True)
    scale = amax / 127.0
    zero = b.full(scale.shape, 0.0)
    inv = b.select(b.compare("gt", scale, zero), b.full(scale.shape, 1.0) / scale, zero)
    v = g * b.broadcast_to(inv, g.shape)
    half = b.select(b.compare("lt", v, b.full(v.shape, 0.0)), b.full(v.shape, -0.5),
                    b.full(v.shape, 0.5))
    q = b.cast(v + half, DType.I8)
    return (b.reshape(q, x.shape),
            b.reshape(b.cast(scale, DType.F16), tuple(lead) + (d // 32,)))



def quantize_fp8(b: Builder, x: Tensor) -> tuple[Tensor, Tensor]:
    """``x`` f32 [..., D] as fp8 (:mod:`poot.dialects.kv_quant`: per head vector
    ``s = max|x| / 448``, ``q = e4m3fn(x / s)`` rounded to nearest even, saturated, 0 where
    ``s == 0``): ``(q i8 [..., D] (bit patterns), s f32 [..., 1])``."""
    amax = b.reduce("max", b.unary("abs", x), -1, keepdims=True)
    scale = amax / FP8_MAX
    return b.op("quantize_fp8", [x, scale]), scale


def cached_attention(b: Builder, q: Tensor, k: Tensor, v: Tensor, cache: tuple[Tensor, Tensor],
                     inputs: StepInputs, *, sliding_window: int | None = None,
                     softcap: float | None = None, scale: float | None = None
                     ) -> tuple[Tensor, Tensor, Tensor]:
    """Attention of this step's queries over each sequence's blocks, after writing this
    step's keys and values.

    Args:
        q: f32 [B, T, Hq, D]; k, v: f32 [B, T, Hkv, D] (already rotated).
        cache: the layer's ``(k_pool, v_pool)`` kv [NB, bs, Hkv, D].
    Returns:
        ``(out, k_pool', v_pool')``: out f32 [B, T, Hq, D]; the updated pools. Key j is
        position j (causal by position, optional sliding window).
    """
    k_pool, k_all = cached_kv(b, cache[0], k, inputs.kv_index, inputs.block_table)
    v_pool, v_all = cached_kv(b, cache[1], v, inputs.kv_index, inputs.block_table)
    out = ops.attention(b, q, k_all, v_all, q_pos=inputs.positions, causal=True,
                        sliding_window=sliding_window, softcap=softcap, scale=scale)
    return out, k_pool, v_pool



def param(b: Builder, types: dict[str, PootType], role: str) -> Tensor:
    """``b.param(role, types[role])``: dense or packed as bound."""
    return b.param(role, types[role])



def finish_step(b: Builder, spec: StepSpec, hidden: Tensor, head: Tensor | None,
                caches: list[tuple[Tensor, ...]], final_softcap: float | None = None,
                cache_names: tuple[str, ...] = ("k", "v")):
    """Close the step: ``logits`` = ``linear(hidden, head)`` f32 [B, T, V] (optionally
    soft-capped; a ragged step's: [S, 1, V] of the rows its input ``logit_rows`` i32 [S]
    names, :attr:`StepSpec.logit_rows`) or ``hidden`` f32 [B, T, H], then each layer's
    updated pools ``kv.{i}.<cache_names[j]>`` (pool j of layer i)."""
    if spec.outputs == "logits":
        if spec.logit_rows is not None:
            hidden = logit_rows(b, spec, hidden)
        with b.scope("head"):
            out = ops.linear(b, hidden, head)
            if final_softcap:
                out = b.unary("tanh", out / final_softcap) * final_softcap
        outputs = {"logits": out}
    else:
        outputs = {"hidden": b.cast(hidden, DType.F32)}
    for i, pools in enumerate(caches):
        for name, pool in zip(cache_names, pools, strict=True):
            if isinstance(pool, QuantPool):
                outputs[f"kv.{i}.{name}"] = pool.values
                outputs[f"kv.{i}.{name}_scale"] = pool.scales
            else:
                outputs[f"kv.{i}.{name}"] = pool
    if spec.sampler is not None:
        outputs.update(sampling_suffix(b, spec, outputs["logits"]))
    return b.finish(outputs)



def logit_rows(b: Builder, spec: StepSpec, hidden: Tensor) -> Tensor:
    """The rows of ``hidden`` f32 [B, 1, H] a ragged step computes logits of: declares the
    input ``logit_rows`` i32 [S] (row indices in ``[0, B)``) and returns f32 [S, 1, H]."""
    bsz, t, h = hidden.shape
    rows = b.input("logit_rows", TensorType((spec.logit_rows,), DType.I32))
    picked = b.gather(b.reshape(hidden, (bsz * t, h)), rows, axis=0)
    return b.reshape(picked, (spec.logit_rows, 1, h))



def sampling_suffix(b: Builder, spec: StepSpec, logits: Tensor) -> dict[str, Tensor]:
    """The on-device sampling suffix (:func:`poot.graph.sampling.sample`) on a decode step's
    logits f32 [B, 1, V]: declares the ``sampling.*`` inputs (after the caches) and returns
    the named outputs (``sampling.token`` i32 [B], ``sampling.token_counts_out`` ...)."""
    bsz, _, vocab = logits.shape
    si = sampling.declare_inputs(b, bsz, vocab, spec.sampler)
    return sampling.sample(b, b.reshape(logits, (bsz, vocab)), si, spec.sampler).outputs()



def proj(b: Builder, types: dict[str, PootType], role: str, x: Tensor,
         lora_mask: Tensor | None = None) -> Tensor:
    """``linear(x, role)``, adding ``role_bias`` when it is bound, and the per-sequence LoRA
    term when ``lora_mask`` is given and ``role``'s slots are bound
    (:func:`lora_shrink`, :func:`lora_expand`)."""
    return projs(b, types, [role], x, lora_mask)[0]



def projs(b: Builder, types: dict[str, PootType], roles: Sequence[str], x: Tensor,
          lora_mask: Tensor | None = None) -> list[Tensor]:
    """:func:`proj` of each of ``roles`` on the same x, traced in three waves: every base
    projection, then every LoRA shrink ``x A^T`` (one for the roles whose A's are stacked
    together: :func:`poot.models.lora.shrink_param`), then every masked expand added to its
    base. Each wave's projections read nothing the wave computes, so sibling fusion can run a
    wave as one launch (the q/k/v or gate/up GEMVs and their shrink)."""
    out = []
    for role in roles:
        bias = param(b, types, role + "_bias") if role + "_bias" in types else None
        out.append(ops.linear(b, x, param(b, types, role), bias))
    lora = [i for i, r in enumerate(roles)
            if lora_mask is not None and f"lora.{r}.b" in types]
    shrunk = lora_shrink(b, types, [roles[i] for i in lora], x)
    for i, xa in zip(lora, shrunk):   # expand first: the add fuses into it, not the base
        out[i] = lora_expand(b, types, roles[i], xa, lora_mask) + out[i]
    return out



def lora_row_mask(b: Builder, types: dict[str, PootType], lora_index: Tensor) -> Tensor:
    """f32 [B, 1, L*R]: 1 where stacked rank ``j`` of the LoRA terms belongs to sequence b's
    slot (``lora.column_slot[j] == lora_index[b]``), else 0; slot 0 (the base model) matches
    no column (:mod:`poot.models.lora`)."""
    col = param(b, types, COLUMN_SLOT)                                            # [L*R]
    bsz, lr = lora_index.shape[0], col.shape[0]
    hit = b.compare("eq", b.reshape(col, (1, lr)), b.reshape(lora_index, (bsz, 1)))
    return b.reshape(b.cast(hit, DType.F32), (bsz, 1, lr))



def lora_shrink(b: Builder, types: dict[str, PootType], roles: Sequence[str], x: Tensor
                ) -> list[Tensor]:
    """f32 [B, T, L*R] per role of ``roles`` (all read x [B, T, in]): ``x A^T``, every slot's
    ranks stacked in A [L*R, in]. A stacked param whose roles are all here
    (:func:`poot.models.lora.shrink_param`) is one matmul sliced per role; a role met alone
    reads its rows of the stack."""
    xf, out, whole = ops.as_f32(b, x), [], {}
    where = [shrink_param(r, types) for r in roles]
    here = Counter(name for name, _, _ in where)            # roles here per stacked param
    for name, row0, lr in where:
        if here[name] * lr == types[name].shape[0]:
            if name not in whole:
                whole[name] = ops.linear(b, xf, param(b, types, name))
            t = whole[name]
            out.append(b.slice_axis(t, t.rank - 1, row0, row0 + lr))
        else:
            a = param(b, types, name)
            out.append(ops.linear(b, xf, b.slice_axis(a, 0, row0, row0 + lr)))
    return out



def lora_expand(b: Builder, types: dict[str, PootType], role: str, xa: Tensor,
                lora_mask: Tensor) -> Tensor:
    """f32 [B, T, out]: ``(xa * mask) B`` for the shrunk xa f32 [B, T, L*R],
    ``lora.{role}.b`` [L*R, out] (rank-major) and ``lora_mask`` f32 [B, 1, L*R]
    (:func:`lora_row_mask`) keeping each sequence's own slot.

    With :func:`lora_shrink`, two plain matmuls: no per-row gather of adapter weights; the
    cost is L times one adapter's FLOPs and bytes (:mod:`poot.models.lora`)."""
    w = ops.as_f32(b, param(b, types, f"lora.{role}.b"))                       # [L*R, out]
    x = xa * b.broadcast_to(lora_mask, xa.shape)
    lead = x.shape[:-1]
    y = b.matmul(b.reshape(x, (math.prod(lead), x.shape[-1])), w)
    return b.reshape(y, lead + (w.shape[1],))
