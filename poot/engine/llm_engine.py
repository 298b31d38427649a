"""The serving engine: continuous batching over a paged KV cache, with prefix caching.

    engine = LLMEngine(runner, tokenizer, EngineConfig(max_batch=16))
    rid = engine.add_request(prompt_ids, SamplingParams(temperature=0, max_tokens=64))
    while engine.has_unfinished():
        for out in engine.step():           # RequestOutput per request that moved
            print(out.request_id, out.text, out.finished)

One loop serves every client (``Driver.generate``, ``poot generate``, :class:`poot.LLM`, the
server): requests are added from any thread (validated at once, in the caller: a request that
can never run raises a typed error there), and one thread calls :meth:`LLMEngine.step`, which
owns the device and every mutable structure (docs/serving.md).

The engine is split as vLLM's v1 engine is:

* :class:`~poot.engine.scheduler.Scheduler` (:mod:`poot.engine.scheduler`) decides: admission
  (FCFS, KV blocks, prefix-cache hits), the prefill token budget, the decode rows and their
  micro-batches, preemption when blocks run short;
* :class:`~poot.engine.runner.ModelRunner` executes the compiled prefill, decode and sampler
  steps; :class:`~poot.engine.decode_steps.DecodeIssuer` turns decode rows into its inputs
  (and a guided batch's allowed-token masks, computed on the host while the forward pass
  runs: :mod:`poot.engine.guided`);
* :class:`~poot.engine.output_processor.OutputProcessor` turns sampled tokens into
  :class:`RequestOutput`: guided matchers, stop tokens and strings, detokenizing, log-probs,
  finish reasons and stats.

**One iteration** (:meth:`LLMEngine.step`): *commands* (new requests join the waiting queue,
aborts finish theirs), then *schedule* (:meth:`Scheduler.schedule
<poot.engine.scheduler.Scheduler.schedule>`), *run* (the planned prefill chunks, then one
decode step over the running requests: each first gets a block for its position, preempting
the most recently admitted request when none is free; the sampler runs with the union of the
rows' sampling features, each row with its own parameters, seed stream and history), and
*process outputs* (per request: the token checked, detokenized, emitted; full blocks
registered in the prefix cache; a finished request releases its blocks).

**Output transparency**: a request's tokens do not depend on what else runs (each row of a
step computes from its own inputs only; idle rows write nothing), nor on the prefix cache (a
cached block holds the K/V its chain key names), nor on preemption (recomputation writes the
same positions). Tests check each against the request run alone.

**Pipelining** (sessions that overlap host and device work,
:attr:`~poot.runtime.session.Session.overlaps`): while the batch does not change, decode
step n+1 is issued before step n's tokens are read (the sampler copies its tokens into the
next step's token input on the device), so the device runs step n+1 while the host
detokenizes step n. A sequence that stops at step n had a row in step n+1: its token is
discarded, and its K/V write lands past its end, in one of its own blocks, before they are
released (never a full block: full blocks hold only positions of real tokens). Micro-batches
(:attr:`EngineConfig.micro_batches`) roll the same way, each lane on its own entries.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any, Iterator, Sequence

from poot.engine.blocks import BlockManager
from poot.engine.decode_steps import DecodeIssuer, DecodeStep
from poot.engine.guided import GuidedCompiler, GuidedDecodingError
from poot.engine.output_processor import OutputProcessor, RequestOutput, SampledTokens
from poot.engine.request import RUNNING, Request
from poot.engine.runner import ModelRunner
from poot.engine.scheduler import EngineConfig, Scheduler, SchedulerOutput
from poot.engine.spec import parse_speculative
from poot.engine.spec.draft import DraftProposer, DraftSpeculator
from poot.engine.spec.speculator import Speculator, accept as accept_drafts, issue_verify
from poot.graph import sampling
from poot import settings
from poot.errors import PootError
from poot.models.lora import LoraError
from poot.sampling_params import InvalidRequest, SamplingParams


class EngineError(PootError):
    """The engine cannot do what was asked (unknown request, engine stopped, a fault)."""


class ContextOverflow(PootError):
    """A request's prompt plus ``max_tokens`` do not fit the context (``max_model_len``).

    Attributes: prompt_tokens, max_tokens (as requested), capacity, model_context (the
    model's trained context, when known: how far the capacity may be raised)."""

    def __init__(self, prompt_tokens: int, max_tokens: int, capacity: int,
                 model_context: int | None = None):
        self.prompt_tokens, self.max_tokens, self.capacity = prompt_tokens, max_tokens, capacity
        self.model_context = model_context

        def n(k):
            return f"{k} token" if k == 1 else f"{k} tokens"

        if model_context is not None and capacity >= model_context:
            raise_it = f" (the capacity is already the model's context of {n(model_context)})"
        else:
            upto = f"up to {model_context}" if model_context else "up to the model's context"
            raise_it = f" or raise --kv-capacity ({upto})"
        if prompt_tokens > capacity:
            msg = (f"the prompt alone is {n(prompt_tokens)} and exceeds the context capacity "
                   f"of {n(capacity)} (max_tokens {max_tokens} requested); shorten the "
                   f"prompt{raise_it}")
        else:
            msg = (f"prompt of {n(prompt_tokens)} + max_tokens {max_tokens} = "
                   f"{prompt_tokens + max_tokens} exceeds the context capacity of "
                   f"{n(capacity)}; lower max_tokens{raise_it}")
        super().__init__(msg)


class KVCapacityExceeded(PootError):
    """A request needs more KV blocks than the whole pool holds: it could never run, even
    alone. Attributes: needed_blocks, pool_blocks, block_size, tokens (prompt + max_tokens)."""

    def __init__(self, tokens: int, needed_blocks: int, pool_blocks: int, block_size: int):
        self.tokens, self.needed_blocks = tokens, needed_blocks
        self.pool_blocks, self.block_size = pool_blocks, block_size
        super().__init__(f"the request needs {needed_blocks} KV blocks ({tokens} tokens: prompt "
                         f"+ max_tokens, {block_size} a block) but the KV pool holds "
                         f"{pool_blocks} blocks ({pool_blocks * block_size} tokens); lower "
                         f"max_tokens or give the pool more blocks (--kv-blocks)")



@dataclass
class EngineStats:
    """A snapshot: sequences running (admitted), waiting; KV blocks used (referenced),
    cached-free (evictable), free, total; prefix-cache hit rate (blocks hit / blocks looked
    up); steps run (plain decode steps, separate prefill chunks, ragged steps mixing decode
    rows and prompt chunks), of them the steps issued ahead across a change of rows (before
    the step in flight was read: ``ahead_steps``), and tokens produced so far; preemptions;
    guided-decoding masks computed on the host and their seconds."""

    running: int
    waiting: int
    kv_blocks_used: int
    kv_blocks_cached: int
    kv_blocks_free: int
    kv_blocks_total: int
    prefix_cache_hit_rate: float
    prefix_cache_hit_tokens: int
    decode_steps: int
    prefill_steps: int
    generated_tokens: int
    ragged_steps: int
    preemptions: int
    max_decode_batch: int
    ahead_steps: int = 0
    guided_masks: int = 0
    guided_mask_s: float = 0.0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    spec_verify_steps: int = 0
    spec_acceptance_rate: float = 0.0
    spec_mean_accepted_length: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


class LLMEngine:
    """The engine loop over one :class:`~poot.engine.runner.ModelRunner` (module doc).

    Args:
        runner: the model's steps over its KV pool.
        tokenizer: detokenizes and supplies the stop (EOS / end-of-turn) ids; None for
            token-id models (no text, no stop strings).
        config: :class:`EngineConfig`.
        model_context: the model's trained context (messages say how far the capacity may
            be raised).
        draft: the draft model's :class:`~poot.engine.runner.ModelRunner` (over its own KV
            pool) when ``config.speculative`` is a draft model's
            (:mod:`poot.engine.spec.draft`); None otherwise.
    """

    def __init__(self, runner: ModelRunner, tokenizer=None, config: EngineConfig | None = None,
                 model_context: int | None = None, draft: ModelRunner | None = None):
        self.runner = runner
        self.tokenizer = tokenizer
        self.config = config or EngineConfig(max_batch=runner.max_batch)
        runner.ragged = self.config.ragged
        runner.stall_bounded = self.config.max_decode_stall is not None
        if self.config.max_batch > runner.max_batch:
            raise EngineError(f"max_batch {self.config.max_batch} exceeds the runner's "
                              f"largest bucket {runner.max_batch}")
        for name in ("max_prefill_tokens", "idle_prefill_tokens"):
            value = getattr(self.config, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 1):
                raise EngineError(f"{name} must be a positive integer, not {value!r}")
        stall = self.config.max_decode_stall
        if stall is not None and (isinstance(stall, bool) or not isinstance(stall, (int, float))
                                  or not stall > 1.0):
            raise EngineError(f"max_decode_stall must be a number > 1 (a multiple of a decode "
                              f"step's time), not {stall!r}")
        self.model_context = model_context
        kv = runner.kv
        self.blocks = BlockManager(kv.num_blocks, kv.block_size, self.config.prefix_caching)
        self.vocab = runner.vocab
        self.max_model_len = kv.max_model_len
        self.micro_batches = _micro_batches(self.config, runner)
        self.scheduler = Scheduler(self.config, self.blocks, runner, self.micro_batches)
        self.output = OutputProcessor(self.scheduler, _pipelined(self.config, runner))
        self.issuer = DecodeIssuer(runner)
        spec = parse_speculative(self.config.speculative)
        if spec is not None and not self.config.ragged:
            raise EngineError("speculative decoding needs the ragged step "
                              "(EngineConfig.ragged)")
        #: the draft model's runner (None: none)
        self.draft = draft
        #: speculative decoding (:mod:`poot.engine.spec`), None: off
        self.speculator = _speculator(spec, runner, self.blocks, self.config, draft)
        if spec is not None:
            runner.verify_rows_cap = self.config.max_batch * (1 + spec.num_speculative_tokens)
            self.speculator.scratch = _history_scratch(runner, self.config.max_batch,
                                                       spec.num_speculative_tokens)
        self.scheduler.speculator = self.speculator
        self._shape = None                       # the step shape this iteration ran
        self._lock = threading.Lock()
        self._adds: deque[Request] = deque()
        self._aborts: set[str] = set()
        self._calls: list = []               # run_in_loop's functions, run between steps
        self._ids = itertools.count()
        self._known: set[str] = set()
        #: streamed requests (``stream=True``) until :meth:`stream` takes them: a request
        #: that finishes before its client calls :meth:`stream` keeps its outputs queued
        self._streams: dict[str, Request] = {}
        self._wake = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        self._stop = False
        self.fault: BaseException | None = None
        self.generated_tokens = 0
        self.max_decode_batch = 0
        #: (time read, rows, prefill steps issued so far) of every decode step collected, and
        #: the tokens it yielded for a speculative verify step (benchmarks derive step rates
        #: from the intervals with no prefill in between)
        self.decode_log: deque[tuple[float, int, int]] = deque(maxlen=1 << 16)
        self._inflight: DecodeStep | None = None   # a decode step not yet read
        self._lanes: list[DecodeStep] | None = None  # micro-batches in flight, issue order
        self._guided = None                    # GuidedCompiler, made on first use
        #: decode steps issued as micro-batches
        self.micro_batched_steps = 0
        #: micro-batch steps issued chained (before the lane's step in flight was read)
        self.chained_lane_steps = 0
        #: steps issued before the step in flight was read although their rows differ from
        #: its rows (:meth:`~poot.engine.scheduler.Scheduler.plan_ahead`)
        self.ahead_steps = 0
        #: chain rolling micro-batches where they can be (``POOT_CHAIN_LANES=0``: re-issue
        #: each only after reading it)
        self.chain_lanes = settings.get_flag("POOT_CHAIN_LANES")

    # ---- the scheduler's and output processor's state, as attributes ----------------------
    @property
    def waiting(self) -> deque[Request]:
        """Requests waiting for admission, in order (the scheduler's queue)."""
        return self.scheduler.waiting

    @property
    def running(self) -> list[Request]:
        """Requests admitted (prefilling or decoding), in admission order."""
        return self.scheduler.running

    @property
    def preemptions(self) -> int:
        return self.scheduler.preemptions

    @property
    def guided_masks(self) -> int:
        return self.issuer.guided_masks

    @property
    def guided_mask_s(self) -> float:
        return self.issuer.guided_mask_s

    @property
    def pipelined(self) -> bool:
        """Whether decode steps are chained (:class:`EngineConfig` ``pipeline``)."""
        return self.output.pipelined

    @pipelined.setter
    def pipelined(self, on: bool) -> None:
        self.output.pipelined = bool(on)

    # ---- submission (any thread) ----------------------------------------------------------
    def check_request(self, prompt_ids: Sequence[int], params: SamplingParams) -> list[int]:
        """Validate a request without queueing it (every check that needs no step): token
        ids in the vocabulary, parameters against it, stop strings need a tokenizer, prompt +
        max_tokens within the context, and within the whole KV pool, a guided request's
        constraint compiles against the tokenizer. Returns the ids as ints. Raises
        :class:`InvalidRequest` (:class:`~poot.engine.guided.GuidedDecodingError` for a
        constraint that is malformed or unsupported), :class:`ContextOverflow` or
        :class:`KVCapacityExceeded`."""
        return self._validate(prompt_ids, params)[0]

    def _validate(self, prompt_ids: Sequence[int], params: SamplingParams):
        """(ids, the guided request's TokenMatcher or None): :meth:`check_request`."""
        if not isinstance(params, SamplingParams):
            raise InvalidRequest("params", type(params).__name__, "must be SamplingParams")
        try:
            ids = [int(i) for i in prompt_ids]
        except (TypeError, ValueError):
            raise InvalidRequest("prompt", str(prompt_ids)[:40], "must be token ids") from None
        if not ids:
            raise InvalidRequest("prompt", "", "the prompt has no tokens")
        bad = [i for i in ids if not 0 <= i < self.vocab]
        if bad:
            raise InvalidRequest("prompt", bad[0],
                                 f"token id out of the vocabulary [0, {self.vocab})")
        params.check(self.vocab)
        if params.stop and self.tokenizer is None:
            raise InvalidRequest("stop", params.stop, "stop strings need a tokenizer")
        total = len(ids) + params.max_tokens
        if total > self.max_model_len:
            raise ContextOverflow(len(ids), params.max_tokens, self.max_model_len,
                                  self.model_context)
        # the positions a sequence may fill: every prompt token and every generated one
        # but the last (its K/V are never written)
        need = self.blocks.blocks_for(total - 1)
        if need > self.blocks.usable:
            raise KVCapacityExceeded(total, need, self.blocks.usable, self.blocks.block_size)
        return ids, (self._matcher(params.guided) if params.guided is not None else None)

    def _matcher(self, guide):
        """A fresh TokenMatcher of ``guide`` (its grammar compiled against the tokenizer)."""
        if self.tokenizer is None:
            raise GuidedDecodingError("guided", guide.kind, "guided decoding needs the "
                                      "model's tokenizer (this engine has none)")
        with self._lock:
            if self._guided is None:
                self._guided = GuidedCompiler(self.tokenizer, self.vocab,
                                              self.tokenizer.stop_ids)
            compiler = self._guided
        return compiler.matcher(guide)

    def add_request(self, prompt_ids: Sequence[int], params: SamplingParams | None = None,
                    request_id: str | None = None, stream: bool = False,
                    sink: Any = None, lora: str | None = None) -> str:
        """Queue a request (thread-safe); returns its id. ``stream``: its outputs also go to a
        queue :meth:`stream` reads (for clients on other threads). ``sink``: instead of that
        queue, any object with ``put(RequestOutput)``, called on the engine thread with each
        output (it must not block or raise: the HTTP server bridges outputs into its event
        loop this way); a sink with a ``batch`` attribute gets a step's outputs through
        ``batch.put_all([(sink, output), ...])`` instead, once per step for all the sinks
        sharing that ``batch`` (the server: one wake-up of its event loop a step, not one an
        output). ``lora``: the name of a loaded LoRA adapter the request runs with
        (None: the base model). Raises what :meth:`check_request` raises,
        :class:`EngineError` for a duplicate id, and
        :class:`~poot.models.lora.LoraError` (field ``model``) for an adapter that is not
        loaded."""
        params = params or SamplingParams()
        ids, matcher = self._validate(prompt_ids, params)
        slot, salt = 0, ""
        if lora is not None:
            if self.runner.lora is None:
                raise LoraError("model", f"adapter {lora!r}: this engine has no LoRA slots "
                                f"(--max-loras)")
            slot, salt = self.runner.lora.acquire(lora)
        with self._lock:
            rid = request_id if request_id is not None else f"req-{next(self._ids)}"
            if self.fault is not None or rid in self._known:
                if slot:
                    self.runner.lora.release(slot)
                if self.fault is not None:
                    raise EngineError(f"the engine stopped after a fault: {self.fault}")
                raise EngineError(f"request id {rid!r} is already in use")
            self._known.add(rid)
            if sink is None and stream:
                sink = queue.Queue()
            seq = Request(rid, ids, params, self.tokenizer, time.perf_counter(), sink)
            if stream:
                self._streams[rid] = seq
            seq.guide = matcher
            seq.lora_slot, seq.lora_salt = slot, salt
            self._adds.append(seq)
            self._wake.notify_all()
        return rid

    def abort(self, request_id: str) -> None:
        """Abort a request (thread-safe; unknown or finished ids are ignored): it finishes
        with reason ``"abort"`` and its blocks are freed at the next step."""
        with self._lock:
            self._aborts.add(request_id)
            self._wake.notify_all()

    def stream(self, request_id: str, timeout: float | None = None) -> Iterator[RequestOutput]:
        """The outputs of a request added with ``stream=True``, until it finishes (for a
        client on another thread while :meth:`start` runs the loop); a request that already
        finished yields its queued outputs. Each request's stream is read once: raises
        :class:`EngineError` for an id not added with ``stream=True`` or already read."""
        with self._lock:
            seq = self._streams.pop(request_id, None)
        if seq is None or seq.sink is None:
            raise EngineError(f"request {request_id!r} was not added with stream=True "
                              f"(or its stream was already read)")
        while True:
            out = seq.sink.get(timeout=timeout)
            yield out
            if out.finished:
                return

    def _find(self, rid: str) -> Request | None:
        with self._lock:
            for s in itertools.chain(self._adds, self.waiting, self.running):
                if s.id == rid:
                    return s
        return None

    def has_unfinished(self) -> bool:
        with self._lock:
            return bool(self._adds or self.waiting or self.running or self._inflight
                        or self._lanes)

    # ---- the loop -------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """One iteration (module doc): commands, then schedule -> run -> process outputs;
        returns the outputs of the requests that moved. Where a decode step is in flight
        and nothing needs the scheduler, its successor is issued instead (pipelining). An
        engine fault fails every request it touched (outputs with ``finish_reason
        "error"``) and is raised again."""
        events = self._commands()
        t0, compiled, self._shape = time.perf_counter(), len(self.runner.compile_s), None
        try:
            if not self._continue_in_flight(events):
                plan = self.scheduler.schedule()
                if plan.drafts:
                    events += self._run_verify(plan)
                elif plan.ragged:
                    events += self._run_ragged(plan)
                else:
                    self._run_prefill(plan)
                    events += self._run_decode(plan)
        except Exception as e:  # noqa: BLE001  (an engine fault: fail the requests it touched)
            events += self._fail(e)
            self._deliver(events)
            raise
        if self.speculator is not None:
            drafting = self.speculator.spent()          # the draft's steps are timed apart
            if self._shape and len(self.runner.compile_s) == compiled:
                self.speculator.costs.observe(self._shape,
                                              time.perf_counter() - t0 - drafting)
        return self._deliver(events)

    def _deliver(self, events: list[RequestOutput]) -> list[RequestOutput]:
        """Forget the ids of finished requests (they may be used again), then hand every
        output to its request's sink."""
        done = [ev.request_id for ev in events if ev.finished]
        if done:
            with self._lock:
                self._known.difference_update(done)
        batches: dict[Any, list[tuple[Any, RequestOutput]]] = {}
        for ev in events:
            seq = getattr(ev, "_seq", None)
            if seq is None or seq.sink is None:
                continue
            batch = getattr(seq.sink, "batch", None)
            if batch is None:
                seq.sink.put(ev)
            else:
                batches.setdefault(batch, []).append((seq.sink, ev))
        for batch, items in batches.items():
            batch.put_all(items)
        return events

    def _commands(self) -> list[RequestOutput]:
        """Run queued calls, queue new requests, finish aborted ones (a running one once
        no step in flight has it as a row)."""
        with self._lock:
            adds, self._adds = self._adds, deque()
            aborts, self._aborts = self._aborts, set()
            calls, self._calls = self._calls, []
        for call in calls:
            call()
        self.waiting.extend(adds)
        if not aborts:
            return []
        events = [self.output.finish(s, "abort") for s in self.scheduler.take_waiting(aborts)]
        for seq in [s for s in self.running if s.id in aborts]:
            seq.aborted = True
            if not self._in_flight(seq):
                events.append(self.output.finish(seq, "abort"))
        return events

    def _fail(self, e: Exception) -> list[RequestOutput]:
        """An engine fault: record it and fail every request admitted or waiting."""
        self.fault = e
        events = [self.output.finish(s, "error", error=f"{type(e).__name__}: {e}")
                  for s in list(self.running) + list(self.waiting)]
        self.running.clear()
        self.waiting.clear()
        self._inflight = self._lanes = None
        return events

    def _run_prefill(self, plan: SchedulerOutput) -> None:
        """Start the admitted requests' history rows, then run the planned prefill chunks."""
        for seq in plan.admitted:
            self.runner.reset_history(seq.history_row, seq.output_ids)
        for c in plan.prefill:
            seq = c.request
            seq.stats.prefill_steps += self.runner.prefill(seq.blocks, c.token_ids, c.start,
                                                           seq.lora_slot)

    def _run_ragged(self, plan: SchedulerOutput) -> list[RequestOutput]:
        """Start the admitted requests' history rows and issue the plan's ragged step (decode
        rows and prompt chunks at once); unless the engine pipelines, read it now: the
        outputs of the rows it sampled."""
        step = self._issue_ragged(plan)
        if step is None:
            return []
        self.issuer.issue_sampler(step, self._guided)
        if self.pipelined and self.runner.session.copies_rows:   # the next step takes its
            self._inflight = step                                 # tokens by a row copy
            return []
        return self._read(step)

    def _issue_ragged(self, plan: SchedulerOutput, source: DecodeStep | None = None
                      ) -> DecodeStep | None:
        """Start the admitted requests' history rows and issue the ragged step of ``plan``
        (its sampler too unless guided); ``source``: the step in flight whose sampled tokens
        its decode rows take (:meth:`DecodeIssuer.issue_ragged
        <poot.engine.decode_steps.DecodeIssuer.issue_ragged>`). None: nothing is sampled."""
        for seq in plan.admitted:
            self.runner.reset_history(seq.history_row, seq.output_ids)
        for c in plan.prefill:
            c.request.stats.prefill_steps += 1
        self.runner.prefill_steps += 1
        step = self.issuer.issue_ragged(plan.decode, plan.prefill, source)
        if step is not None:
            self.max_decode_batch = max(self.max_decode_batch, len(step.rows))
        return step

    def _run_verify(self, plan: SchedulerOutput) -> list[RequestOutput]:
        """Run the plan's verify step (every decoding request's last token and its drafts,
        :mod:`poot.engine.spec`, then the prompt chunks) and accept what the target agrees
        with."""
        for seq in plan.admitted:
            self.runner.reset_history(seq.history_row, seq.output_ids)
        if plan.prefill:
            for c in plan.prefill:
                c.request.stats.prefill_steps += 1
            self.runner.prefill_steps += 1
        groups = [(s, plan.drafts.get(s, [])) for s in plan.decode]
        if not plan.prefill:                 # timed for the cost model by its entry's rows
            self._shape = ("verify", self.runner.verify_bucket(sum(1 + len(d)
                                                                   for _, d in groups)))
        handle, groups = issue_verify(self.speculator, groups, self._guided, plan.prefill)
        self.max_decode_batch = max(self.max_decode_batch, len(groups))
        sampled = SampledTokens.of(self.runner.collect(handle))
        now = time.perf_counter()
        events, n = accept_drafts(self.speculator, self.output, groups, sampled, now)
        self.decode_log.append((now, len(groups), self.runner.prefill_steps, n))
        self.generated_tokens += n
        return events

    def _run_decode(self, plan: SchedulerOutput) -> list[RequestOutput]:
        """Issue the planned decode step (as micro-batches where planned); unless the engine
        pipelines, read it now and return its outputs."""
        if plan.lanes is not None:
            self._issue_lanes(plan.lanes)
            return [] if self.pipelined else self._drain_lanes()
        if not plan.decode:
            return []
        self._inflight = self._issue(plan.decode, chained=False)
        self.issuer.issue_sampler(self._inflight, self._guided)
        return [] if self.pipelined else self._read_inflight()

    # ---- decode steps in flight -----------------------------------------------------------
    def _issue(self, rows: list[Request], chained: bool, lane: int = 0,
               source: DecodeStep | None = None) -> DecodeStep | None:
        """Issue a decode step over ``rows`` on ``lane`` once each has a block for its
        position (:meth:`Scheduler.grow <poot.engine.scheduler.Scheduler.grow>`; ``chained``:
        rows of the step in flight ``source``, one position further, their tokens the ones
        it samples); None when no row is left."""
        rows = self.scheduler.grow(rows, chained)
        if not rows:
            return None
        step = self.issuer.issue(rows, chained, lane, source)
        self._shape = ("decode", step.handle.bucket) if self._shape is None else ("mixed",)
        self.max_decode_batch = max(self.max_decode_batch, len(rows))
        return step

    def _read(self, step: DecodeStep, log: bool = True) -> list[RequestOutput]:
        """Read ``step`` and process its tokens; ``log``: record it in :attr:`decode_log`."""
        sampled = self.issuer.collect(step)
        now = time.perf_counter()
        if log:
            self.decode_log.append((now, len(step.rows), self.runner.prefill_steps))
        events = self.output.process(step.rows, sampled, now)
        self.generated_tokens += len(step.rows)
        return events

    def _read_inflight(self) -> list[RequestOutput]:
        step, self._inflight = self._inflight, None
        return [] if step is None else self._read(step)

    def _in_flight(self, seq: Request) -> bool:
        """Whether ``seq`` is a row of a decode step issued and not yet read."""
        if self._inflight is not None and seq in self._inflight.rows:
            return True
        return any(seq in step.rows for step in self._lanes or ())

    def _continue_in_flight(self, events: list[RequestOutput]) -> bool:
        """Read the decode steps in flight (appending their outputs to ``events``); where
        nothing needs the scheduler, issue their successors first (chained, or the
        micro-batches rolled) and return True: this iteration schedules nothing."""
        if self._inflight is not None:
            nxt = self._issue(self._inflight.rows, chained=True, source=self._inflight) \
                if self._can_chain() else self._issue_ahead()
            if nxt is not None:
                events += self._read_inflight()
                self.issuer.issue_sampler(nxt, self._guided)   # guided: after the matchers
                self._inflight = nxt
                return True
            events += self._read_inflight()
        if self._lanes is not None:
            if self._can_roll():
                events += self._roll_lanes()
                return True
            events += self._drain_lanes()
        return False

    def _issue_ahead(self) -> DecodeStep | None:
        """Where the rows change but the step in flight need not be read first (an arrival
        to prefill, a row ending by length, an abort): issue the next iteration's step now,
        planned by :meth:`Scheduler.plan_ahead
        <poot.engine.scheduler.Scheduler.plan_ahead>`, its decode rows' tokens copied on the
        device from what the step in flight samples (a ragged step where prompts are
        planned, else a decode step). None where it cannot: the engine does not pipeline,
        the device copies no rows, steps are micro-batched or speculative, or the plan
        cannot be made ahead."""
        if not self.pipelined or not self.scheduler.config.ragged or self.micro_batches > 1 \
                or self.speculator is not None or not self.runner.session.copies_rows:
            return None
        src = self._inflight
        plan = self.scheduler.plan_ahead(src.rows)
        if plan is None:
            return None
        if plan.ragged:
            step = self._issue_ragged(plan, source=src)
        else:
            for seq in plan.admitted:
                self.runner.reset_history(seq.history_row, seq.output_ids)
            step = self._issue(plan.decode, chained=True, source=src)
        if step is not None:
            self.ahead_steps += 1
        return step

    def _can_chain(self) -> bool:
        """Whether the next decode step can be issued before the in-flight one is read: the
        same sequences, none of which ends by length at the in-flight step, no admission,
        prefill or abort waiting, and blocks for every next position without preemption."""
        if not self.pipelined or self._inflight is None:
            return False
        rows = self._inflight.rows
        if not self._inflight.fed_back and not self.runner.session.copies_rows:
            return False                  # its tokens reach a decode step by row copies only
        if self.micro_batches > 1 and len(rows) >= self.micro_batches:
            return False                  # the step runs as micro-batches instead
        if not Scheduler.chainable(rows) or len(self.running) != len(rows):
            return False
        if self.speculator is not None and self.speculator.may_propose(rows):
            return False                  # the next step verifies drafts instead
        return self.scheduler.room_ahead(rows)

    # ---- micro-batches (lanes) ------------------------------------------------------------
    def _issue_lanes(self, groups: list[list[Request]]) -> None:
        """Issue one decode step as micro-batches (:class:`EngineConfig`): every
        micro-batch's forward pass and sampler (lane k on its own entries), before any is
        read; they stay in flight (:attr:`_lanes`) until :meth:`_roll_lanes` or
        :meth:`_drain_lanes` reads them."""
        lanes: list[DecodeStep] = []
        for k, group in enumerate(groups):
            self._issue_lane(k, group, lanes)
        self._lanes = lanes or None

    def _issue_lane(self, k: int, group: list[Request], lanes: list[DecodeStep]) -> None:
        """Issue micro-batch ``k``'s decode step and sampler over ``group`` (from the host's
        tokens) and append it to ``lanes``; nothing for no rows."""
        if group:
            step = self._issue(group, chained=False, lane=k)
            if step is not None:
                self.issuer.issue_sampler(step, self._guided)
                lanes.append(step)

    def _log_lanes(self, rows: int) -> None:
        self.decode_log.append((time.perf_counter(), rows, self.runner.prefill_steps))
        self.max_decode_batch = max(self.max_decode_batch, rows)
        self.micro_batched_steps += 1

    def _drain_lanes(self) -> list[RequestOutput]:
        """Read every micro-batch in flight, in issue order; none is issued again."""
        lanes, self._lanes = self._lanes or [], None
        events: list[RequestOutput] = []
        for step in lanes:
            events += self._read(step, log=False)
        self._log_lanes(sum(len(step.rows) for step in lanes))
        return events

    def _can_roll(self) -> bool:
        """Whether the micro-batches in flight can each be issued again as it is read: the
        engine pipelines, no command is queued, at least :attr:`micro_batches` rows, and
        :meth:`Scheduler.room_ahead <poot.engine.scheduler.Scheduler.room_ahead>`."""
        if not self.pipelined or not self._lanes:
            return False
        rows = [s for step in self._lanes for s in step.rows]
        if len(rows) < self.micro_batches or self._adds:
            return False
        return self.scheduler.room_ahead(rows)

    def _lane_can_chain(self, rows: list[Request]) -> bool:
        """Whether a micro-batch's next step can be issued before its step in flight is
        read: every row running and :meth:`Scheduler.chainable
        <poot.engine.scheduler.Scheduler.chainable>`."""
        return all(s.status == RUNNING for s in rows) and Scheduler.chainable(rows)

    def _roll_lanes(self) -> list[RequestOutput]:
        """Take each micro-batch in issue order and issue its next step while the ones
        behind it are still in flight: chained (issued before its step in flight is read, the
        sampled tokens fed on the device, so stage 0 of a layer pipeline goes on without
        waiting for the host) where :meth:`_lane_can_chain`, else right after reading it,
        from the rows still running. A micro-batch whose rows all finished is dropped."""
        events: list[RequestOutput] = []
        rows, lanes = 0, []
        for step in self._lanes:
            rows += len(step.rows)
            if self.chain_lanes and self._lane_can_chain(step.rows):
                nxt = self._issue(step.rows, chained=True, lane=step.lane)
                events += self._read(step, log=False)
                if nxt is not None:
                    self.issuer.issue_sampler(nxt, self._guided)  # after the matchers
                    lanes.append(nxt)
                    self.chained_lane_steps += 1
                continue
            events += self._read(step, log=False)
            self._issue_lane(step.lane, [s for s in step.rows
                                         if s.status == RUNNING and not s.aborted], lanes)
        self._lanes = lanes or None
        self._log_lanes(rows)
        return events

    # ---- convenience ----------------------------------------------------------------------
    def generate(self, prompt_ids: Sequence[int], params: SamplingParams | None = None,
                 request_id: str | None = None) -> Iterator[RequestOutput]:
        """Add one request and yield its outputs until it finishes: stepping the engine
        here when no background loop runs (other requests advance too), else reading its
        stream. Checks run before anything is yielded."""
        if self._thread is not None:
            rid = self.add_request(prompt_ids, params, request_id, stream=True)
            return self.stream(rid)
        rid = self.add_request(prompt_ids, params, request_id)
        return self._drive(rid)

    def _drive(self, rid: str) -> Iterator[RequestOutput]:
        try:
            while True:
                for ev in self.step():
                    if ev.request_id == rid:
                        yield ev
                        if ev.finished:
                            return
        finally:
            if self._find(rid) is not None:      # the consumer stopped early
                self.abort(rid)
                while self._find(rid) is not None:
                    self.step()

    def run_until_done(self) -> list[RequestOutput]:
        """Step until every request finished; every output, in order."""
        out = []
        while self.has_unfinished():
            out += self.step()
        return out

    def stats(self) -> EngineStats:
        b = self.blocks.stats()
        return EngineStats(running=len(self.running), waiting=len(self.waiting) + len(self._adds),
                           kv_blocks_used=b.used, kv_blocks_cached=b.cached_free,
                           kv_blocks_free=b.free, kv_blocks_total=b.total,
                           prefix_cache_hit_rate=b.hit_rate,
                           prefix_cache_hit_tokens=b.hit_blocks * self.blocks.block_size,
                           decode_steps=self.runner.decode_steps,
                           prefill_steps=self.runner.prefill_steps,
                           ragged_steps=self.runner.ragged_steps,
                           generated_tokens=self.generated_tokens,
                           preemptions=self.preemptions,
                           max_decode_batch=self.max_decode_batch,
                           ahead_steps=self.ahead_steps,
                           guided_masks=self.guided_masks, guided_mask_s=self.guided_mask_s,
                           **(self.speculator.stats() if self.speculator else {}))

    def run_in_loop(self, fn, timeout: float | None = 60.0):
        """``fn()`` on the engine thread between steps (where the loop runs; here otherwise),
        its result returned or its exception raised here: device writes (LoRA slots) never
        race a step. Raises :class:`EngineError` if the loop does not get to it in
        ``timeout`` seconds."""
        if self._thread is None:
            return fn()
        done = threading.Event()
        box: dict = {}

        def call():
            try:
                box["value"] = fn()
            except BaseException as e:  # noqa: BLE001  (re-raised on the caller's thread)
                box["error"] = e
            done.set()

        with self._lock:
            self._calls.append(call)
            self._wake.notify_all()
        if not done.wait(timeout):
            raise EngineError("the engine loop did not run the call in time")
        if "error" in box:
            raise box["error"]
        return box.get("value")

    # ---- background loop ------------------------------------------------------------------
    def start(self) -> None:
        """Run the loop on a background thread (clients use :meth:`add_request` with
        ``stream=True`` and :meth:`stream`, or :meth:`generate`)."""
        if self._thread is not None:
            return
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="poot-engine", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            with self._lock:
                while not self._stop and not (self._adds or self._aborts or self.waiting
                                              or self.running or self._inflight or self._lanes
                                              or self._calls):
                    self._wake.wait()
                if self._stop:
                    return
            try:
                self.step()
            except Exception:  # noqa: BLE001  (recorded in self.fault; requests failed)
                return

    def shutdown(self, timeout: float | None = None) -> None:
        """Stop the background loop (requests still queued stay queued)."""
        with self._lock:
            self._stop = True
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None


def _pipelined(config: EngineConfig, runner: ModelRunner) -> bool:
    """Whether the engine chains decode steps: ``config.pipeline``; None: ``POOT_PIPELINE``
    where set, else where the runner's session overlaps host and device work."""
    pipe = config.pipeline
    if pipe is None:
        pipe = settings.get_flag("POOT_PIPELINE")
        pipe = bool(getattr(runner.session, "overlaps", False)) if pipe is None else pipe
    return bool(pipe)


def _speculator(spec, runner: ModelRunner, blocks: BlockManager, config: EngineConfig,
                draft: ModelRunner | None) -> Speculator | None:
    """The engine's :class:`~poot.engine.spec.speculator.Speculator` for ``spec`` (None:
    off): a draft model's runs ``draft`` (:mod:`poot.engine.spec.draft`; its catch-up steps
    take up to the prompt budget or a full batch of proposals, whichever is larger). Raises
    :class:`EngineError` for a draft config without a draft runner."""
    if spec is None:
        return None
    if spec.method != "draft":
        return Speculator(spec, runner, blocks)
    if draft is None:
        raise EngineError("a draft-model speculative config needs the draft's runner "
                          "(ModelHandle.load builds it)")
    budget = max(config.max_prefill_tokens or runner.prefill_chunk,
                 config.max_batch * (1 + spec.num_speculative_tokens))
    return DraftSpeculator(spec, runner, blocks, DraftProposer(draft, budget))


def _history_scratch(runner: ModelRunner, max_batch: int, k: int) -> list[int]:
    """Rows of the token-history pool for speculative proposal rows with penalties
    (:mod:`poot.engine.spec.speculator`): ``max_batch * min(k, 4)`` rows (a row is the
    vocabulary's size in i32) added past the sequences' when the pool does not exist yet
    (no penalties sampler has run), else those added before (another engine over the same
    runner), else none."""
    need = max_batch * min(k, 4)
    if len(runner.history_scratch) >= need or \
            sampling.INPUTS["token_counts"] in runner.session.state_names():
        return runner.history_scratch
    seqs = runner.history_slots - 1 - len(runner.history_scratch)   # the last: idle rows
    runner.history_slots = seqs + need + 1
    runner.history_scratch = list(range(seqs, seqs + need))
    return runner.history_scratch


def _micro_batches(config: EngineConfig, runner: ModelRunner) -> int:
    """``config.micro_batches``; None: the device's pipeline stage count (1 without one).
    Raises :class:`EngineError` for anything but an integer >= 1."""
    mb = config.micro_batches
    if mb is None:
        mb = int(getattr(runner.session.device, "stages", 1))
    if isinstance(mb, bool) or not isinstance(mb, int) or mb < 1:
        raise EngineError(f"micro_batches must be an integer >= 1, got {mb!r}")
    return mb


__all__ = ["ContextOverflow", "EngineError", "EngineStats", "KVCapacityExceeded", "LLMEngine"]
