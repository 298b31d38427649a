"""The scheduler: which requests run next, with which KV blocks (vLLM v1's ``Scheduler``).

It owns the waiting queue (FCFS), the running list (admission order), the rows of the
token-history pool and, through the :class:`~poot.engine.blocks.BlockManager`, the KV blocks
and the prefix cache. It decides; the engine runs what it decides on the
:class:`~poot.engine.runner.ModelRunner`. :meth:`Scheduler.schedule` returns one iteration's
:class:`SchedulerOutput`:

1. *Admission*: while fewer than ``max_batch`` requests run, the first waiting request is
   admitted if its blocks fit: the cached prefix of its tokens (all but the last; full
   blocks, chained keys) is shared, fresh blocks hold the rest, and ``watermark_blocks``
   stay free for the running requests to grow into (none when nothing runs). A request that
   does not fit stops admission (FCFS: none behind it is admitted) and is not counted as a
   prefix-cache query.
2. *Prefill*, under a token budget (``max_prefill_tokens``, default two chunks): requests in
   prefill, oldest first, are given chunks of at most ``prefill_chunk`` of their tokens not
   yet computed (all but the last, which decode feeds); every chunk costs a whole
   ``prefill_chunk`` of the budget. A request whose prefill completes decodes in the same
   iteration. The plan counts its chunks as computed (and registers the blocks they fill in
   the prefix cache) when it is made, as vLLM's does: the engine runs them before anything
   else reads the cache.
3. *Decode*: every running request feeds one token. With ``micro_batches`` M > 1 and at
   least M rows, the rows are cut into M micro-batches (lanes) of ``ceil(rows / M)``.

With ``EngineConfig.ragged`` (the default) an iteration that has prompt tokens to prefill is
*one ragged step* instead (vLLM v1's token-budget step): the decoding requests' tokens (one
each, given their blocks first) and prompt chunks of the requests in prefill, oldest first,
under the token budget (``max_prefill_tokens`` actual tokens, default one chunk), flattened into one token
dimension. A chunk may include the prompt's last token: its logits row is sampled in the same
step, so a request's first token comes with the step that finishes its prompt. Arrivals
no longer stall the running sequences: they decode in the step that prefills the newcomer.

Blocks for the decode positions are taken when a step is issued (:meth:`Scheduler.grow`):
when none is free, the most recently admitted request is *preempted* (its blocks and history
row released; it rejoins the head of the waiting queue with its generated tokens, to be
recomputed, prefix-cache hits included).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from poot.engine.blocks import BlockManager, block_keys
from poot.engine.request import FINISHED, PREFILL, RUNNING, WAITING, Request


#: the prompt budget of a ragged step that decodes nothing, in prefill chunks
#: (:attr:`EngineConfig.idle_prefill_tokens`)
IDLE_PREFILL_CHUNKS = 8


def idle_prefill_budget(prefill_chunk: int, max_prefill_tokens: int | None = None,
                        idle_prefill_tokens: int | None = None) -> int:
    """Prompt tokens a ragged step with no decoding sequence takes
    (:attr:`EngineConfig.idle_prefill_tokens`, given ``EngineConfig``'s two budgets)."""
    busy = max_prefill_tokens or prefill_chunk
    return max(busy, idle_prefill_tokens or IDLE_PREFILL_CHUNKS * prefill_chunk)


def stall_prompt_budget(costs: dict[int, float], n_decode: int, max_stall: float
                        ) -> int | None:
    """Prompt tokens a ragged step beside ``n_decode`` decode rows may take so that it costs
    at most ``max_stall`` times a step of the decode rows alone, or None (no bound).

    ``costs``: seconds a ragged step of T token rows takes, for the buckets measured
    (:meth:`~poot.engine.runner.ModelRunner.measure_ragged_costs`). The decode rows' own
    step is estimated on the line through the two smallest buckets (the marginal cost of a
    row where the step is smallest: a step's cost is concave in its rows, so a line through
    larger buckets would underestimate it there). The budget is the rows of the largest
    measured bucket within ``max_stall`` times that estimate, less the decode rows; at least
    the smallest bucket's share (prompts always progress). None where fewer than two
    buckets are measured, the cost does not grow with the rows, or the largest measured
    bucket is within the bound (larger ones are taken to be too: the step's cost in rows is
    then flat as far as it was measured).

    SmolLM2 Q4_1 on a 2-core Xeon, max batch 8, costs as measured (idle rows: 12, 16, 32
    rows 11.6, 14.5, 26.1 ms): 8 decode rows estimated at 8.7 ms, a 1.5x bound takes the
    12-row bucket, 4 prompt tokens (real steps: 12 ms decoding, 16 ms with the 4 tokens)."""
    ts = sorted(costs)
    if len(ts) < 2 or n_decode < 1:
        return None
    (t1, c1), (t2, c2) = (ts[0], costs[ts[0]]), (ts[1], costs[ts[1]])
    slope = (c2 - c1) / (t2 - t1)
    if slope <= 0:
        return None
    limit = max_stall * max(c1 - slope * (t1 - n_decode), 0.0)
    if costs[ts[-1]] <= limit:
        return None
    over = [t for t in ts if t > n_decode]
    if not over:
        return None
    fits = [t for t in over if costs[t] <= limit]
    return (fits[-1] if fits else over[0]) - n_decode


@dataclass(frozen=True)
class EngineConfig:
    """Scheduling settings.

    Attributes:
        max_batch: sequences running at once (the largest decode bucket).
        max_prefill_tokens: prefill tokens per iteration (None: one chunk in a ragged step,
            two chunks otherwise); bounds the delay a prompt adds to running sequences' next
            token.
        idle_prefill_tokens: prompt tokens a ragged step takes when no sequence decodes in it
            (None: :data:`IDLE_PREFILL_CHUNKS` chunks; never below ``max_prefill_tokens``).
            Such a step delays no running sequence, so a lone long prompt prefills in fewer,
            larger steps, whose matmuls reuse each weight over more rows (SmolLM2 Q4_1, 2-core
            Xeon: a 512-token prompt at 960 tok/s in 32-token steps, 1,063 in 256-token
            ones).
        prefix_caching: reuse cached full KV blocks.
        pipeline: chain decode steps (None: where the device overlaps host work;
            ``POOT_PIPELINE=0`` turns it off).
        watermark_blocks: blocks admission leaves free for running sequences to grow into.
        micro_batches: M > 1 splits a decode step of at least M sequences into M micro-batches
            issued one after another before any is read, each on its own entries
            (:meth:`~poot.engine.runner.ModelRunner.decode_entry` lanes), so the stages of
            a layer pipeline work on different micro-batches at once (stage 0 on micro-batch
            k while stage 1 runs k - 1). Where the engine pipelines, the micro-batches
            roll: each is issued again as soon as it is read, while the others are still
            in flight, so the pipeline does not drain between decode steps (it drains to
            admit, prefill, or when blocks run short). None: the device's pipeline stage
            count (1 without a pipeline).
        ragged: an iteration with prompt tokens to prefill runs them and the decoding
            sequences' tokens as one ragged step (module doc); False: the prefill chunks run
            as steps of their own, one sequence each, before the decode step.
        max_decode_stall: a ragged step that decodes sequences takes only as many prompt
            tokens as keep its time within this multiple of a decode step of its decode rows
            alone, estimated from the measured ragged steps
            (:meth:`~poot.engine.runner.ModelRunner.measure_ragged_costs`,
            :func:`stall_prompt_budget`): an arrival then delays the running sequences'
            next token by at most that factor, and a long prompt prefills in more, smaller
            steps while others decode (Sarathi-Serve's stall-free batching, its token budget
            from the step costs). None (the default; ``poot serve`` sets 1.5), or before
            the costs are measured: ``max_prefill_tokens`` alone. Where the step's time
            hardly grows with its rows (a GPU below its compute bound) the bound takes
            every bucket and changes nothing.
        speculative: speculative decoding (:mod:`poot.engine.spec`): a
            :class:`~poot.engine.spec.SpeculativeConfig` or its text (``"ngram:4"``); None:
            off. Needs ``ragged``.
    """

    max_batch: int = 8
    max_prefill_tokens: int | None = None
    idle_prefill_tokens: int | None = None
    prefix_caching: bool = True
    pipeline: bool | None = None
    watermark_blocks: int = 1
    micro_batches: int | None = None
    ragged: bool = True
    max_decode_stall: float | None = None
    speculative: Any = None


@dataclass
class PrefillChunk:
    """Prompt tokens of one request to prefill: ``token_ids`` at positions ``start..``;
    ``sample``: they end with the request's last token, whose logits give its next token
    (a ragged step's chunk that completes the prefill)."""

    request: Request
    start: int
    token_ids: list[int]
    sample: bool = False


@dataclass
class SchedulerOutput:
    """One iteration's plan (module doc).

    Attributes:
        admitted: requests admitted now, in order (each got a fresh history row).
        prefill: the chunks to prefill, in order.
        decode: the requests that decode, in admission order (empty: no decode step).
        lanes: ``decode`` cut into micro-batches (None: one decode step).
        ragged: ``decode`` and ``prefill`` run as one ragged step.
        drafts: proposed tokens of the decoding requests that speculate: the decode rows
            (and the prompt chunks) run as one verify step (:mod:`poot.engine.spec`).
    """

    admitted: list[Request] = field(default_factory=list)
    prefill: list[PrefillChunk] = field(default_factory=list)
    decode: list[Request] = field(default_factory=list)
    lanes: list[list[Request]] | None = None
    ragged: bool = False
    drafts: dict = field(default_factory=dict)


class Scheduler:
    """Admission, prefill budget, decode rows and preemption over one KV pool (module doc).

    Args:
        config: :class:`EngineConfig`.
        blocks: the pool's :class:`~poot.engine.blocks.BlockManager`.
        runner: the :class:`~poot.engine.runner.ModelRunner` (its block-table rows, prefill
            chunk, history rows and LoRA slots).
        micro_batches: M (module doc), resolved.
    """

    def __init__(self, config: EngineConfig, blocks: BlockManager, runner,
                 micro_batches: int = 1):
        self.config, self.blocks, self.runner = config, blocks, runner
        self.micro_batches = micro_batches
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.free_rows = list(range(runner.history_slots - 1))     # last: scratch
        self.preemptions = 0
        #: the engine's :class:`~poot.engine.spec.speculator.Speculator` (None: off)
        self.speculator = None

    # ---- the plan -------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        """Admit, plan the prefill chunks and the decode rows of one iteration."""
        if self.config.ragged:
            return self._schedule_ragged()
        out = SchedulerOutput(admitted=self._admit(), prefill=self._plan_prefill())
        out.decode = [s for s in self.running if s.status == RUNNING]
        return self._cut_lanes(out)

    def _cut_lanes(self, out: SchedulerOutput) -> SchedulerOutput:
        """``out`` with its decode rows cut into micro-batches where planned."""
        m = self.micro_batches
        if m > 1 and len(out.decode) >= m:
            size = -(-len(out.decode) // m)
            out.lanes = [out.decode[k * size:(k + 1) * size] for k in range(m)]
        return out

    def _schedule_ragged(self) -> SchedulerOutput:
        """The ragged plan (module doc): the decoding requests, each given a block for its
        position first (preempting where blocks run out), then prompt chunks under the token
        budget; a plan without prefill is a plain decode step."""
        admitted = self._admit()
        decode = self.grow([s for s in self.running if s.status == RUNNING], chained=False)
        drafts = self.speculator.plan(decode) if decode and self.speculator else {}
        rows = len(decode) + sum(len(d) for d in drafts.values())
        out = SchedulerOutput(admitted=[s for s in admitted if s.status == PREFILL],
                              prefill=self._plan_chunks(rows), decode=decode, drafts=drafts)
        out.ragged = bool(out.prefill)
        return out if out.ragged or out.drafts else self._cut_lanes(out)

    def _plan_chunks(self, n_decode: int) -> list[PrefillChunk]:
        """A ragged step's prompt chunks, oldest request first: ``max_prefill_tokens``
        tokens (default one chunk), or the idle budget (:func:`idle_prefill_budget`) when
        nothing decodes (``n_decode`` 0), plus the rows the step's ragged bucket (the one
        holding the ``n_decode`` decode rows and that budget) would otherwise pad. So a
        prompt always gets at least the budget: shrinking it to keep the decode rows'
        bucket starved prompts when the batch sat just below a bucket's size (28
        decoding sequences in a 32-row bucket left 4 prompt tokens a step, and the batch
        never grew past 28 with 64 clients). A chunk may end at the request's last
        token: it then samples (and the request decodes from the next step on)."""
        budget = self.config.max_prefill_tokens or self.runner.prefill_chunk
        if n_decode == 0:               # nobody waits on this step but its prompts
            budget = idle_prefill_budget(self.runner.prefill_chunk,
                                         self.config.max_prefill_tokens,
                                         self.config.idle_prefill_tokens)
        elif self.config.max_decode_stall is not None:
            bound = stall_prompt_budget(self.runner.ragged_costs, n_decode,
                                        self.config.max_decode_stall)
            budget = budget if bound is None else min(budget, bound)
        # the step runs on the bucket holding the decode rows and the budget: its padding
        # rows are computed anyway, so prompts fill them
        budget = self.runner.ragged_bucket(n_decode + budget) - n_decode
        plan = []
        for seq in self.running:
            if budget <= 0:
                break
            if seq.status != PREFILL:
                continue
            end = len(seq.tokens)
            n = min(budget, end - seq.n_computed)
            start = seq.n_computed
            plan.append(PrefillChunk(seq, start, seq.tokens[start:start + n], start + n == end))
            seq.n_computed += n
            budget -= n
            self.register(seq)
            if seq.n_computed == end:
                seq.status = RUNNING
        return plan

    def _admit(self) -> list[Request]:
        admitted = []
        while self.waiting and len(self.running) < self.config.max_batch:
            seq = self.waiting[0]
            if not self._take_blocks(seq):
                break
            if seq.t_admitted is None:
                seq.stats.cached_tokens = seq.n_computed
                seq.stats.queue_s = time.perf_counter() - seq.t_arrival
            seq.t_admitted = time.perf_counter()
            seq.history_row = self.free_rows.pop()
            seq.status = PREFILL
            self.waiting.popleft()
            self.running.append(seq)
            admitted.append(seq)
        return admitted

    def _take_blocks(self, seq: Request) -> bool:
        """Give ``seq`` its cached prefix and fresh blocks for the rest of its tokens, if
        they fit above the watermark; else take nothing (and count no query)."""
        bm, bs = self.blocks, self.blocks.block_size
        ids = seq.tokens
        keys = block_keys(ids[:len(ids) - 1], bs, seq.lora_salt) if bm.prefix_caching else []
        hit = bm.cached_prefix(keys)
        bm.take(hit)
        need = bm.blocks_for(len(ids)) - len(hit)
        reserve = self.config.watermark_blocks if self.running else 0
        if need > bm.num_free() - reserve:
            bm.release(hit)
            bm.query_blocks -= len(keys)          # not admitted: not a query
            bm.hit_blocks -= len(hit)
            return False
        seq.blocks = hit + bm.allocate(need)
        seq.table = self.runner.table_row(seq.blocks)
        seq.keys = keys[:len(hit)]
        seq.n_computed = len(hit) * bs
        return True

    def _plan_prefill(self) -> list[PrefillChunk]:
        chunk = self.runner.prefill_chunk
        budget = self.config.max_prefill_tokens or 2 * chunk
        plan = []
        for seq in self.running:
            if seq.status != PREFILL:
                continue
            end = len(seq.tokens) - 1             # the last token goes through decode
            while seq.n_computed < end and budget > 0:
                n = min(chunk, end - seq.n_computed)
                plan.append(PrefillChunk(seq, seq.n_computed,
                                         seq.tokens[seq.n_computed:seq.n_computed + n]))
                seq.n_computed += n
                budget -= chunk
                self.register(seq)
            if seq.n_computed >= end:
                seq.status = RUNNING
            if budget <= 0:
                break
        return plan

    # ---- blocks ---------------------------------------------------------------------------
    def register(self, seq: Request) -> None:
        """Register the request's newly full blocks in the prefix cache."""
        bm, bs = self.blocks, self.blocks.block_size
        if not bm.prefix_caching:
            return
        full = seq.n_computed // bs
        if full > len(seq.keys):
            start = len(seq.keys)
            seq.keys += block_keys(seq.tokens[start * bs:full * bs], bs, seq.lora_salt,
                                   parent=seq.keys[-1] if seq.keys else None)
            for i in range(start, full):
                bm.register(seq.blocks[i], seq.keys[i])

    def grow(self, rows: Sequence[Request], chained: bool) -> list[Request]:
        """Give every request of ``rows`` a block for the position its next decode step
        writes (``chained``: one past its last token, the step in flight's token being
        still unread; else its last token's), preempting the most recently admitted requests
        when blocks run out; returns the rows still admitted."""
        bm = self.blocks
        shift = 0 if chained else -1
        for seq in rows:
            if seq.status not in (RUNNING, PREFILL):
                continue                                  # preempted meanwhile
            while bm.blocks_for(len(seq.tokens) + shift + 1) > len(seq.blocks):
                if bm.num_free() > 0:
                    b = bm.allocate(1)[0]
                    seq.table[len(seq.blocks)] = b
                    seq.blocks.append(b)
                    continue
                victim = self.running[-1]
                self._preempt(victim)
                if victim is seq:
                    break
        return [s for s in rows if s.status in (RUNNING, PREFILL)]

    def _preempt(self, seq: Request) -> None:
        self.blocks.release(seq.blocks)
        if self.speculator is not None:
            self.speculator.release(seq)
        seq.blocks, seq.keys, seq.n_computed, seq.table = [], [], 0, None
        self.free_rows.append(seq.history_row)
        seq.history_row = None
        seq.status = WAITING
        seq.stats.preemptions += 1
        self.preemptions += 1
        self.running.remove(seq)
        self.waiting.appendleft(seq)

    def free(self, seq: Request) -> None:
        """``seq`` ended: out of the running list, its blocks, history row and LoRA slot
        released (once); its status :data:`~poot.engine.request.FINISHED`."""
        if seq in self.running:
            self.running.remove(seq)
        if seq.blocks:
            self.blocks.release(seq.blocks)
            seq.blocks = []
        if self.speculator is not None:
            self.speculator.release(seq)
        if seq.history_row is not None:
            self.free_rows.append(seq.history_row)
            seq.history_row = None
        if seq.lora_slot and seq.status != FINISHED:
            self.runner.lora.release(seq.lora_slot)
        seq.status = FINISHED

    def take_waiting(self, ids: Iterable[str]) -> list[Request]:
        """Remove the waiting requests whose id is in ``ids`` (aborted) and return them."""
        ids = set(ids)
        out = [s for s in self.waiting if s.id in ids]
        for seq in out:
            self.waiting.remove(seq)
        return out

    # ---- going on without the scheduler (pipelined decode) --------------------------------
    def room_ahead(self, rows: Sequence[Request]) -> bool:
        """Whether decode steps over ``rows`` may go on without scheduling: no request waits
        to be prefilled or admitted, and free blocks for every running row's next position
        (so growing one step never preempts a row still in flight)."""
        if any(s.status != RUNNING for s in self.running):
            return False
        if self.waiting and len(self.running) < self.config.max_batch:
            return False
        return self._room_to_grow([s for s in rows if s.status == RUNNING])

    def _room_to_grow(self, rows: Sequence[Request]) -> bool:
        """Whether the pool's free blocks cover what ``rows`` need for the position one past
        their last token (the step after the one in flight writes there)."""
        need = sum(1 for s in rows if self.blocks.blocks_for(len(s.tokens) + 1) > len(s.blocks))
        return need <= self.blocks.num_free()

    def plan_ahead(self, in_flight: Sequence[Request]) -> SchedulerOutput | None:
        """The next iteration's plan made while the step over ``in_flight`` (the rows it
        samples) is still running, or None where it cannot be made before that step is read:
        the decode rows are the rows of ``in_flight`` that go on after it (not aborted, not
        ending by length at it: a stop token cannot be foreseen, its row's extra token is
        discarded), each one position further, their tokens the ones the step in flight
        samples; then admissions and prompt chunks as :meth:`schedule` plans them. None
        where a running request is not a row of ``in_flight`` (it needs the host's token),
        where growing the decode rows would preempt, or where no row goes on."""
        rows = {id(s) for s in in_flight}
        if any(s.status == RUNNING and id(s) not in rows for s in self.running):
            return None
        decode = [s for s in in_flight if s.status == RUNNING and not s.aborted
                  and s.generated + 1 < s.params.max_tokens]
        if not decode:
            return None
        if not self._room_to_grow(decode):
            return None
        self.grow(decode, chained=True)
        admitted = self._admit()
        out = SchedulerOutput(admitted=[s for s in admitted if s.status == PREFILL],
                              prefill=self._plan_chunks(len(decode)), decode=decode)
        out.ragged = bool(out.prefill)
        return out

    @staticmethod
    def chainable(rows: Sequence[Request]) -> bool:
        """Whether the step after the one in flight over ``rows`` can be issued before that
        one is read (tokens fed on the device): no row aborted, none ends by length at the
        step in flight (a stop token cannot be foreseen: its row's extra token is
        discarded)."""
        return all(not s.aborted and s.generated + 1 < s.params.max_tokens for s in rows)


__all__ = ["EngineConfig", "IDLE_PREFILL_CHUNKS", "PrefillChunk", "Scheduler", "SchedulerOutput",
           "idle_prefill_budget", "stall_prompt_budget"]
