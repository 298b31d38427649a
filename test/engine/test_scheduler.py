"""The scheduler as a unit (no model, no device): admission under the watermark and the
prefill token budget, preemption order, prefix-cache hit accounting. Every expected value
below is worked out from the policy in :mod:`poot.engine.scheduler`'s docstring."""

from __future__ import annotations

import time

import numpy as np

from poot.engine.blocks import BlockManager
from poot.engine.request import PREFILL, RUNNING, WAITING, Request
from poot.engine.scheduler import EngineConfig, Scheduler
from poot.sampling_params import SamplingParams

BS = 4          # positions per block


class _Runner:
    """What the scheduler reads of a ModelRunner: prefill chunk, history rows, table rows."""

    prefill_chunk = 4
    history_slots = 9
    lora = None

    def table_row(self, blocks):
        row = np.zeros(16, np.int32)
        row[:len(blocks)] = blocks
        return row


def _scheduler(usable_blocks: int, **config) -> Scheduler:
    blocks = BlockManager(usable_blocks + 1, BS)          # + the null block
    return Scheduler(EngineConfig(**config), blocks, _Runner())


def _request(rid: str, prompt: list[int], salt: str = "") -> Request:
    seq = Request(rid, prompt, SamplingParams(temperature=0, max_tokens=8), None,
                  time.perf_counter(), None)
    seq.lora_salt = salt
    return seq


def test_admission_is_fcfs_above_the_watermark_and_prefill_spends_whole_chunks():
    sch = _scheduler(6, max_batch=8, watermark_blocks=1, max_prefill_tokens=8)
    a, b, c = (_request("a", list(range(10, 20))), _request("b", list(range(30, 40))),
               _request("c", list(range(50, 55))))
    sch.waiting.extend([a, b, c])
    plan = sch.schedule()
    # a: 10 tokens = 3 blocks of 6 (nothing runs: no watermark). b: 3 blocks, but only 3
    # are free and 1 stays free for a to grow into; c (2 blocks) would fit, but is behind b
    assert plan.admitted == [a] and list(sch.waiting) == [b, c]
    assert len(a.blocks) == 3 and sch.blocks.num_free() == 3
    assert a.status == PREFILL and a.history_row is not None
    # a prefills positions 0..8 (its last token goes through decode): a budget of 8 is two
    # chunks of 4, positions 0..7; position 8 waits for the next iteration
    assert [(c.request, c.start, c.token_ids) for c in plan.prefill] == \
        [(a, 0, list(range(10, 14))), (a, 4, list(range(14, 18)))]
    assert a.n_computed == 8 and plan.decode == [] and plan.lanes is None
    # a's 2 full blocks were looked up; b's refused admission is not counted as a query
    assert (sch.blocks.query_blocks, sch.blocks.hit_blocks) == (2, 0)

    plan = sch.schedule()
    assert plan.admitted == [] and list(sch.waiting) == [b, c]
    assert [(c.start, c.token_ids) for c in plan.prefill] == [(8, [18])]
    assert a.status == RUNNING and plan.decode == [a]


def test_preemption_takes_the_most_recently_admitted_first():
    sch = _scheduler(4, max_batch=4, watermark_blocks=0, max_prefill_tokens=100)
    reqs = [_request(r, [i * 10 + k for k in range(1, 5)]) for i, r in enumerate("abc")]
    a, b, c = reqs
    sch.waiting.extend(reqs)
    plan = sch.schedule()
    assert plan.admitted == reqs and plan.decode == reqs       # 1 block each, 1 left
    for seq in reqs:                      # each sampled a token: its next write is position 4
        seq.tokens.append(7)
    # a takes the free block; b finds none: c (admitted last) is preempted for it
    assert sch.grow(reqs, chained=False) == [a, b]
    assert c.status == WAITING and c.blocks == [] and c.n_computed == 0
    assert c.history_row is None and c.stats.preemptions == 1
    assert list(sch.waiting) == [c] and sch.running == [a, b] and sch.preemptions == 1
    for seq in (a, b):                    # 4 more tokens each: position 8 needs a third block
        seq.tokens += [7] * 4
    # a needs a block, none is free: b (the last admitted still running) goes, and rejoins
    # the queue ahead of c, the admission order again
    assert sch.grow([a, b], chained=False) == [a]
    assert list(sch.waiting) == [b, c] and sch.preemptions == 2
    assert len(a.blocks) == 3 and sch.blocks.num_free() == 1


def test_prefix_cache_hits_are_counted_in_blocks_and_shared():
    sch = _scheduler(16, max_batch=4, max_prefill_tokens=8)
    a = _request("a", list(range(1, 10)))                  # 9 tokens: keys of 8 = 2 blocks
    sch.waiting.append(a)
    sch.schedule()                        # prefills positions 0..7: both blocks registered
    assert a.status == RUNNING and (sch.blocks.query_blocks, sch.blocks.hit_blocks) == (2, 0)

    b = _request("b", list(range(1, 9)) + [20, 21])        # a's first 8 tokens, then others
    c = _request("c", list(range(1, 10)), salt="adapter")  # a's tokens under another salt
    sch.waiting.extend([b, c])
    plan = sch.schedule()
    assert plan.admitted == [b, c]
    # b: keys of its first 9 tokens = 2 blocks, both a's; 1 fresh block for positions 8..9
    assert b.blocks[:2] == a.blocks[:2] and len(b.blocks) == 3
    assert b.stats.cached_tokens == 8
    assert all(sch.blocks.ref[x] == 2 for x in a.blocks[:2])
    # c: same tokens, another salt: other keys, no hit
    assert c.stats.cached_tokens == 0 and not set(c.blocks) & set(a.blocks)
    assert (sch.blocks.query_blocks, sch.blocks.hit_blocks) == (6, 2)
    # b prefills only position 8 (its last token, 21, goes through decode), then decodes
    assert [(x.request, x.start, x.token_ids) for x in plan.prefill][0] == (b, 8, [20])
    assert b.n_computed == 9 and b.status == RUNNING and plan.decode == [a, b]
