"""Family-neutral pieces of a step trace: step inputs, the per-layer KV cache, the output head.

Every family's tracer uses these, so the step interface described in :mod:`poot.models.base`
is spelled once: the caches are step inputs and outputs of type f32 [n_slots, C, Hkv, D]; a
step scatters its K/V at (slot, position) and attention reads the batch's slots back with a
gather on axis 0, keys masked by position (key index = position).
"""

from __future__ import annotations

from dataclasses import dataclass

from poot.dialects.types import DType, PootType
from poot.graph import ops
from poot.graph.builder import Builder, Tensor
from poot.models.base import StepSpec


@dataclass
class StepInputs:
    """The traced step inputs.

    Attributes:
        tokens: i32 [B, T]. positions: i32 [B, T]. slots: i32 [B].
        kv_index: i32 [B*T, 2] rows ``(slot[b], positions[b, t])``: where this step's K/V go.
        caches: per layer ``(k, v)``, each f32 [n_slots, C, Hkv, D].
    """

    tokens: Tensor
    positions: Tensor
    slots: Tensor
    kv_index: Tensor
    caches: list[tuple[Tensor, Tensor]]


def step_inputs(b: Builder, spec: StepSpec, n_layers: int, n_kv_heads: int,
                head_dim: int) -> StepInputs:
    """Declare ``tokens``, ``positions``, ``slots`` then ``kv.{i}.k``/``kv.{i}.v`` for each
    layer, in that argument order, and build the cache write index."""
    t = {name: b.input(name, ty) for name, ty in spec.input_types().items()}
    ctype = spec.cache_type(n_kv_heads, head_dim)
    caches = [(b.input(f"kv.{i}.k", ctype), b.input(f"kv.{i}.v", ctype))
              for i in range(n_layers)]
    with b.scope("kv_index"):
        index = kv_write_index(b, t["slots"], t["positions"])
    return StepInputs(t["tokens"], t["positions"], t["slots"], index, caches)


def kv_write_index(b: Builder, slots: Tensor, positions: Tensor) -> Tensor:
    """i32 [B*T, 2] scatter coordinates ``(slots[b], positions[b, t])`` in row-major (b, t)
    order, from slots i32 [B] and positions i32 [B, T]."""
    bsz, t = positions.shape
    slot_bt = b.broadcast_to(slots, (bsz, t), dims=(0,))
    col = lambda x: b.reshape(x, (bsz * t, 1))  # noqa: E731
    return b.concat([col(slot_bt), col(positions)], axis=1)


def cached_kv(b: Builder, cache: Tensor, new: Tensor, kv_index: Tensor, slots: Tensor
              ) -> tuple[Tensor, Tensor]:
    """Write ``new`` f32 [B, T, Hkv, D] into ``cache`` f32 [n_slots, C, Hkv, D] at
    ``kv_index`` and read the batch's slots back.

    Returns ``(updated_cache, keys)``: the updated cache (same type as ``cache``; a step
    output) and f32 [B, C, Hkv, D], row c holding position c of sequence b's slot. Positions
    outside ``[0, C)`` are dropped by the scatter.
    """
    bsz, t, hkv, d = new.shape
    rows = b.reshape(ops.as_f32(b, new), (bsz * t, hkv, d))
    updated = b.scatter(cache, kv_index, rows)
    return updated, b.gather(updated, slots, axis=0)


def cached_attention(b: Builder, q: Tensor, k: Tensor, v: Tensor, cache: tuple[Tensor, Tensor],
                     inputs: StepInputs, *, sliding_window: int | None = None,
                     softcap: float | None = None, scale: float | None = None
                     ) -> tuple[Tensor, Tensor, Tensor]:
    """Attention of this step's queries over its slot's cache, after writing this step's keys.

    Args:
        q: f32 [B, T, Hq, D]; k, v: f32 [B, T, Hkv, D] (already rotated).
        cache: the layer's ``(k_cache, v_cache)`` f32 [n_slots, C, Hkv, D].
    Returns:
        ``(out, k_cache', v_cache')``: out f32 [B, T, Hq, D]; the updated caches. Key c is
        position c (causal by position, optional sliding window).
    """
    k_cache, k_all = cached_kv(b, cache[0], k, inputs.kv_index, inputs.slots)
    v_cache, v_all = cached_kv(b, cache[1], v, inputs.kv_index, inputs.slots)
    out = ops.attention(b, q, k_all, v_all, q_pos=inputs.positions, causal=True,
                        sliding_window=sliding_window, softcap=softcap, scale=scale)
    return out, k_cache, v_cache


def param(b: Builder, types: dict[str, PootType], role: str) -> Tensor:
    """``b.param(role, types[role])``: dense or packed as bound."""
    return b.param(role, types[role])


def finish_step(b: Builder, spec: StepSpec, hidden: Tensor, head: Tensor | None,
                caches: list[tuple[Tensor, Tensor]], final_softcap: float | None = None):
    """Close the step: ``logits`` = ``linear(hidden, head)`` f32 [B, T, V] (optionally
    soft-capped) or ``hidden`` f32 [B, T, H], then ``kv.{i}.k``/``kv.{i}.v`` per layer."""
    if spec.outputs == "logits":
        with b.scope("head"):
            out = ops.linear(b, hidden, head)
            if final_softcap:
                out = b.unary("tanh", out / final_softcap) * final_softcap
        outputs = {"logits": out}
    else:
        outputs = {"hidden": b.cast(hidden, DType.F32)}
    for i, (k, v) in enumerate(caches):
        outputs[f"kv.{i}.k"], outputs[f"kv.{i}.v"] = k, v
    if spec.sampler is not None:
        outputs.update(sampling_suffix(b, spec, outputs["logits"]))
    return b.finish(outputs)


def sampling_suffix(b: Builder, spec: StepSpec, logits: Tensor) -> dict[str, Tensor]:
    """The on-device sampling suffix (:func:`poot.graph.sampling.sample`) on a decode step's
    logits f32 [B, 1, V]: declares the ``sampling.*`` inputs (after the caches) and returns
    the named outputs (``sampling.token`` i32 [B], ``sampling.token_counts_out`` ...)."""
    from poot.graph import sampling

    bsz, _, vocab = logits.shape
    si = sampling.declare_inputs(b, bsz, vocab, spec.sampler)
    return sampling.sample(b, b.reshape(logits, (bsz, vocab)), si, spec.sampler).outputs()
