"""Flash-decoding for a ``poot.attention`` or ``poot.paged_attention`` dispatch region: a
*split* kernel over chunks of the key axis and a *combine* kernel that merges the chunks
(one kernel when one chunk covers every key: short decode contexts take blocks of several
subgroups so that one launch does it all), synthesized from the shapes and the target's
subgroup size and core count.

The strategy (:func:`flash_decode`) is three steps, one module each:

* :mod:`.match` (:func:`match_attention`): what it takes, as an :class:`AttentionRegion`
  of strided operand views (k, v, a paged block table) and computed operands (a RoPE'd q, a
  causal mask), or None;
* :mod:`.plan` (:func:`plan_attention`): the block shapes (:class:`AttentionPlan`: rows per
  block, lanes per key, chunks, subgroups per block) for a target's capabilities, or None;
* :mod:`.emit` (:func:`emit_attention`): the ``gpu.module`` text of the split (and combine)
  kernels and their launches; :mod:`.body` holds its text builders.
"""

from __future__ import annotations

from mlir import ir

from poot.backends.gpu.strategies.emit import ScalarUnsupported, Synthesized, small_contraction
from poot.backends.gpu.strategies.attention.emit import MASKED_SCORE, emit_attention
from poot.backends.gpu.strategies.attention.match import (
    AttentionRegion,
    PagedKV,
    View,
    match_attention,
    reshape_strides,
    resolve_view,
    slice_ops,
)
from poot.backends.gpu.strategies.attention.plan import (
    MAX_BLOCK_THREADS,
    SINGLE_MAX_KEYS,
    SINGLE_MAX_ROWS,
    TABLE_MAX_ENTRIES,
    AttentionPlan,
    plan_attention,
    table_entries,
)


def flash_decode(fn: ir.Operation, caps) -> Synthesized | None:
    """The strategy: :func:`match_attention`, :func:`plan_attention`,
    :func:`emit_attention` (None where any of them refuses)."""
    reg = match_attention(fn)
    if reg is None:
        return None
    if reg.q_value is not None and \
            any(small_contraction(o) for o in slice_ops([reg.q_value])):
        # each block evaluates its q rows, and each chunk of a split plan again: a folded
        # LoRA expand (K terms an element) cost more there (the 1B shape's 32-token prefill
        # chunk: 8 chunks, the attention 27 -> 45 us a layer) than beside the KV write
        return None
    plan = plan_attention(reg, caps)
    if plan is None:
        return None
    try:
        return emit_attention(reg, plan)
    except ScalarUnsupported:
        return None           # a computed q or mask the scalar emitter does not cover


__all__ = ["MASKED_SCORE", "MAX_BLOCK_THREADS", "SINGLE_MAX_KEYS", "SINGLE_MAX_ROWS",
           "TABLE_MAX_ENTRIES", "AttentionPlan", "AttentionRegion", "PagedKV", "View",
           "emit_attention", "flash_decode", "match_attention", "plan_attention",
           "reshape_strides", "resolve_view", "table_entries"]
