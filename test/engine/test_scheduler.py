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

    def ragged_bucket(self, n):
        t = self.prefill_chunk
        while t < n:
            t *= 2
        return t

    def table_row(self, blocks):
        row = np.zeros(16, np.int32)
        row[:len(blocks)] = blocks
        return row


def _scheduler(usable_blocks: int, **config) -> Scheduler:
    """A scheduler over ``usable_blocks`` blocks; prefill chunks as steps of their own
    unless ``ragged=True``."""
    blocks = BlockManager(usable_blocks + 1, BS)          # + the null block
    return Scheduler(EngineConfig(**{"ragged": False, **config}), blocks, _Runner())


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


def test_ragged_plan_budgets_actual_tokens_and_samples_the_last_prompt_token():
    """Ragged, chunk 4, a budget of 6 tokens: a step runs on the bucket holding its decode
    rows and the budget (8 rows) and prompts fill it. a's 10 tokens: positions 0..7, then
    8..9 including its last token (sampled: a decodes from the next plan on) with b, admitted
    meanwhile, given the 6 rows left; then a decodes and b's last token fills the bucket of
    1 + 6 rows."""
    sch = _scheduler(8, max_batch=8, watermark_blocks=0, max_prefill_tokens=6,
                     idle_prefill_tokens=6, ragged=True)
    a, b = _request("a", list(range(10, 20))), _request("b", list(range(30, 37)))
    sch.waiting.append(a)
    plan = sch.schedule()
    assert plan.ragged and plan.admitted == [a] and plan.decode == []
    assert [(c.request, c.start, c.token_ids, c.sample) for c in plan.prefill] == \
        [(a, 0, list(range(10, 18)), False)]
    sch.waiting.append(b)
    plan = sch.schedule()
    assert plan.admitted == [b]
    assert [(c.request, c.start, len(c.token_ids), c.sample) for c in plan.prefill] == \
        [(a, 8, 2, True), (b, 0, 6, False)]
    assert a.status == RUNNING and a.n_computed == 10 and b.status == PREFILL
    a.tokens.append(7)                                 # a's sampled token
    plan = sch.schedule()
    assert plan.ragged and plan.decode == [a]
    assert [(c.request, c.start, len(c.token_ids), c.sample) for c in plan.prefill] == \
        [(b, 6, 1, True)]
    b.tokens.append(7)
    plan = sch.schedule()
    assert not plan.ragged and plan.prefill == [] and plan.decode == [a, b]


def test_ragged_plan_gives_prompts_the_budget_past_the_decode_rows():
    """Ragged: with 7 requests decoding and a budget of 4 (one chunk) the step runs on the
    bucket of 16 rows holding both, so a new prompt gets its 9 free rows (never fewer than
    the budget: keeping the 8-row bucket of the decode rows would leave it 1); decode rows
    are given their blocks before any chunk is planned."""
    sch = _scheduler(16, max_batch=8, watermark_blocks=0, max_prefill_tokens=4,
                     idle_prefill_tokens=4, ragged=True)
    running = [_request(r, [i + 3]) for i, r in enumerate("abcdefg")]
    sch.waiting.extend(running)
    def sample(plan):                                 # each sampled row's token
        for seq in plan.decode + [c.request for c in plan.prefill if c.sample]:
            seq.tokens.append(7)

    plan = sch.schedule()
    assert plan.ragged and len(plan.prefill) == 4     # 1-token prompts sampled at once
    sample(plan)
    plan = sch.schedule()                              # 4 decode rows, the other 3 prompts
    assert len(plan.decode) == 4 and len(plan.prefill) == 3
    sample(plan)
    new = _request("h", list(range(40, 50)))
    sch.waiting.append(new)
    plan = sch.schedule()
    assert plan.ragged and len(plan.decode) == 7
    assert [(c.request, c.start, len(c.token_ids)) for c in plan.prefill] == [(new, 0, 9)]
    assert all(len(s.blocks) * BS >= len(s.tokens) for s in plan.decode)


def test_a_step_that_decodes_nothing_takes_the_idle_budget():
    """Ragged, chunk 4, no budgets given: a lone 40-token prompt runs in steps of the idle
    budget, 8 chunks (32 tokens, then its last 8, sampled); a prompt arriving while a request
    decodes gets the busy budget, one chunk, and the rest of its bucket (1 decode row + 4
    -> 8 rows: 7 prompt tokens), however large the idle budget."""
    sch = _scheduler(32, max_batch=8, watermark_blocks=0, ragged=True)
    a = _request("a", list(range(100, 140)))
    sch.waiting.append(a)
    plan = sch.schedule()
    assert plan.decode == [] and [(c.start, len(c.token_ids), c.sample)
                                  for c in plan.prefill] == [(0, 32, False)]
    plan = sch.schedule()
    assert [(c.start, len(c.token_ids), c.sample) for c in plan.prefill] == [(32, 8, True)]
    a.tokens.append(7)
    b = _request("b", list(range(200, 220)))
    sch.waiting.append(b)
    plan = sch.schedule()
    assert plan.decode == [a]
    assert [(c.request, c.start, len(c.token_ids)) for c in plan.prefill] == [(b, 0, 7)]


def test_the_idle_budget_is_never_below_the_busy_one_and_is_configurable():
    from poot.engine.runner import ragged_token_buckets
    from poot.engine.scheduler import IDLE_PREFILL_CHUNKS, idle_prefill_budget

    assert idle_prefill_budget(32) == IDLE_PREFILL_CHUNKS * 32
    assert idle_prefill_budget(32, idle_prefill_tokens=64) == 64
    assert idle_prefill_budget(32, max_prefill_tokens=512, idle_prefill_tokens=64) == 512
    # the engine's ragged entries (what ``poot compile`` fills the cache with) reach it
    assert ragged_token_buckets(32, 16) == (32, 64, 128, 256)
    # a full batch plus the busy budget: 16 + 32 rows
    assert ragged_token_buckets(32, 16, idle_prefill_tokens=32) == (32, 64)
    assert ragged_token_buckets(32, 64, idle_prefill_tokens=32) == (32, 64, 128)
    # never more prompt tokens than the sequences can hold
    assert ragged_token_buckets(16, 1, max_model_len=16) == (16,)
    assert ragged_token_buckets(32, 2, max_model_len=48) == (4, 32, 64, 128)


def test_the_mixed_buckets_hold_a_full_batch_and_a_half_or_twice_as_many_rows():
    """Below the prompt chunk the ragged bucket of twice the largest decode batch (rounded
    up to a power of two) and, under a decode-stall bound, of 1.5 times it (rounded up to a
    multiple of 4): a full batch's decode rows and a short prompt tail run on one of them
    rather than on a whole chunk; only those below the chunk, none for a single sequence
    (nothing decodes beside a prompt)."""
    from poot.engine.runner import mixed_ragged_buckets, ragged_ladder, ragged_token_buckets

    assert mixed_ragged_buckets(32, 8) == (16,)
    assert mixed_ragged_buckets(32, 8, stall_bounded=True) == (12, 16)
    assert mixed_ragged_buckets(32, 5, stall_bounded=True) == (8, 16)   # 5 + 3 -> 8; 10 -> 16
    assert mixed_ragged_buckets(32, 2, stall_bounded=True) == (4,)      # 3 -> 4, and 4
    assert mixed_ragged_buckets(32, 16) == ()         # 32 rows: the chunk's own bucket
    assert mixed_ragged_buckets(32, 16, stall_bounded=True) == (24,)
    assert mixed_ragged_buckets(32, 64, stall_bounded=True) == ()
    assert mixed_ragged_buckets(32, 1, stall_bounded=True) == ()
    assert ragged_token_buckets(32, 8) == (16, 32, 64, 128, 256)
    assert ragged_token_buckets(32, 8, stall_bounded=True) == (12, 16, 32, 64, 128, 256)
    assert ragged_token_buckets(32, 8, idle_prefill_tokens=32) == (16, 32, 64)
    assert [ragged_ladder(32, 8, n) for n in (1, 9, 16, 17, 33, 200)] == \
        [16, 16, 16, 32, 64, 256]
    assert [ragged_ladder(32, 8, n, stall_bounded=True) for n in (1, 12, 13, 17)] == \
        [12, 12, 16, 32]
    assert [ragged_ladder(32, 64, n) for n in (1, 33)] == [32, 64]


#: seconds of the ragged steps of 12, 16 and 32 rows as measured on a 2-core Xeon (SmolLM2
#: Q4_1, max batch 8): the cost grows with the rows, steeper where the step is small
CPU_COSTS = {12: 0.0116, 16: 0.0145, 32: 0.0261}


def test_the_stall_budget_keeps_an_arrivals_step_within_the_bound():
    """Worked from the rule: the line through the two smallest buckets has slope
    (14.5 - 11.6) / 4 = 0.725 ms a row, so 8 decode rows alone cost 11.6 - 4 * 0.725 = 8.7
    ms and a 1.5x bound allows 13.05 ms: the 12-row bucket (11.6) fits, 16 (14.5) does not,
    4 prompt tokens. A 2x bound (17.4 ms) allows 16 rows: 8 tokens. 3 decode rows alone (5.1
    ms) fit no bucket within 1.5x: the smallest bucket's 9 free rows (prompts always
    progress)."""
    from poot.engine.scheduler import stall_prompt_budget

    assert stall_prompt_budget(CPU_COSTS, 8, 1.5) == 4
    assert stall_prompt_budget(CPU_COSTS, 7, 1.5) == 5
    assert stall_prompt_budget(CPU_COSTS, 8, 2.0) == 8
    assert stall_prompt_budget(CPU_COSTS, 3, 1.5) == 9


def test_the_stall_budget_is_no_bound_where_it_cannot_be_told():
    """None (the prompt budget alone): a step whose cost is flat in its rows (a GPU below
    its compute bound) or falls; fewer than two buckets timed; nothing decoding; the
    largest timed bucket within the bound (larger ones are taken to be too)."""
    from poot.engine.scheduler import stall_prompt_budget

    assert stall_prompt_budget({32: 0.002, 64: 0.002, 128: 0.0021}, 64, 1.5) is None
    assert stall_prompt_budget({12: 0.003, 16: 0.0029, 32: 0.004}, 8, 1.5) is None
    assert stall_prompt_budget({32: 0.026}, 8, 1.5) is None
    assert stall_prompt_budget({}, 8, 1.5) is None
    assert stall_prompt_budget(CPU_COSTS, 0, 1.5) is None
    assert stall_prompt_budget(CPU_COSTS, 8, 4.0) is None


def test_a_stall_bound_splits_an_arrivals_prompt_while_others_decode():
    """Ragged, chunk 32, max batch 8, the CPU costs measured, a 1.5x bound: beside 7
    decoding requests a 20-token prompt gets 5 tokens a step (the 12-row bucket) where the
    prompt budget alone would take all 20 (a 32-row step); without decode rows it takes the
    idle budget. Without the costs measured the bound changes nothing."""
    def run(costs):
        runner = _Runner()
        runner.prefill_chunk = 32
        runner.ragged_costs = costs
        runner.ragged_bucket = lambda n: next(t for t in (12, 16, 32, 64, 128, 256) if t >= n)
        sch = Scheduler(EngineConfig(max_batch=8, ragged=True, max_decode_stall=1.5,
                                     watermark_blocks=0), BlockManager(65, BS), runner)
        running = [_request(r, [i + 3]) for i, r in enumerate("abcdefg")]
        sch.waiting.extend(running)
        plan = sch.schedule()
        assert len(plan.prefill) == 7 and not plan.decode   # nothing decodes: all at once
        for c in plan.prefill:
            c.request.tokens.append(7)
        new = _request("h", list(range(40, 61)))              # 21 tokens: 20 before decode
        sch.waiting.append(new)
        sizes = []
        while new.status != RUNNING:
            plan = sch.schedule()
            assert len(plan.decode) == 7
            sizes.append(sum(len(c.token_ids) for c in plan.prefill))
            for seq in plan.decode + [c.request for c in plan.prefill if c.sample]:
                seq.tokens.append(7)
        return sizes

    assert run(CPU_COSTS) == [5, 5, 5, 5, 1]
    assert run({}) == [21]
