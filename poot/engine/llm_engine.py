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

**One iteration** (:meth:`LLMEngine.step`):

1. *Commands*: new requests join the waiting queue (FCFS); aborts free their blocks.
2. *Admission*: while there is room (``max_batch`` sequences) and KV blocks, the first waiting
   request is admitted: the cached prefix of its tokens is looked up (full blocks, chained
   keys: :mod:`poot.engine.blocks`), those blocks are shared, blocks for the rest of its
   tokens are allocated, and it gets a row of the token-history pool.
3. *Prefill*, under a token budget (``max_prefill_tokens`` per iteration, chunks of
   ``prefill_chunk``): sequences prefill the tokens not yet in the cache, all but the last
   one, oldest first; a long prompt spreads over iterations, and running sequences decode in
   every iteration meanwhile, so a prompt delays their next token by at most the budget.
4. *Decode*: every sequence whose prefill is complete feeds its last token (the last prompt
   token, or the last sampled one) at its position; each first gets a block for that
   position. When no block is free, the most recently admitted sequence is *preempted*: its
   blocks are released and it rejoins the head of the waiting queue with its generated
   tokens appended to its prompt, to be recomputed (prefix cache hits included) when blocks
   free up. One decode step runs all of them in the smallest compiled batch bucket, then the
   sampler with the union of their sampling features; each row samples with its own
   parameters, seed stream and history. A batch with guided requests (JSON schema, regex,
   grammar: :mod:`poot.engine.guided`) issues the forward pass first, computes each guided
   row's allowed-token mask on the host while it runs, then issues the sampler with the
   masks (unconstrained rows allow every token).
5. *Outputs*: per sequence, a guided request's matcher consumes the new token (its next
   mask allows EOS only where the constraint is complete), the token is checked against the
   stop token ids, detokenized
   incrementally, held back while it may begin a stop string, and emitted with its
   log-probs; a stop token, a stop string or ``max_tokens`` finishes it; full blocks are
   registered in the prefix cache; a finished sequence releases its blocks.

**Output transparency**: a request's tokens do not depend on what else runs (each row of a
step computes from its own inputs only; idle rows write nothing), nor on the prefix cache (a
cached block holds the K/V its chain key names), nor on preemption (recomputation writes the
same positions). Tests check each against the request run alone.

**Pipelining** (devices that overlap host and device work, :attr:`Engine.overlaps`): while
the batch does not change, decode step n+1 is issued before step n's tokens are read (the
sampler copies its tokens into the next step's token input on the device), so the device
runs step n+1 while the host detokenizes step n. A sequence that stops at step n had a row in
step n+1: its token is discarded, and its K/V write lands past its end, in one of its own
blocks, before they are released (never a full block: full blocks hold only positions of
real tokens).
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import numpy as np

from poot.sampling_params import InvalidRequest, SamplingParams
from poot.engine.stops import StopMatcher
from poot.engine.blocks import BlockManager, block_keys
from poot.engine.runner import DecodeBatch, ModelRunner, sampler_spec_for
from poot.errors import PootError
from poot.graph import sampling
from poot import settings


#: How a request's ``RequestOutput.error`` begins when its guided-decoding constraint failed
#: while it ran (finish reason ``"error"``; the request's own failure, not the engine's).
GUIDED_ERROR = "guided decoding: "

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


@dataclass(frozen=True)
class EngineConfig:
    """Scheduling settings.

    Attributes:
        max_batch: sequences running at once (the largest decode bucket).
        max_prefill_tokens: prefill tokens per iteration (None: two chunks); bounds the
            delay a prompt adds to running sequences' next token.
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
    """

    max_batch: int = 8
    max_prefill_tokens: int | None = None
    prefix_caching: bool = True
    pipeline: bool | None = None
    watermark_blocks: int = 1
    micro_batches: int | None = None


@dataclass
class TokenLogprob:
    """A generated token's log-prob (of the raw model distribution; a guided request's after
    its mask) and the top ``n`` alternatives ``[(id, logprob), ...]`` when asked (a guided
    request lists only allowed tokens: fewer than ``n`` where fewer are allowed)."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] | None = None


@dataclass
class RequestStats:
    """Final numbers of one request (seconds). ``generated_tokens`` counts every sampled
    token (a stop token included); ``cached_tokens``: prompt tokens whose K/V came from the
    prefix cache; ``ttft_s``: arrival to first sampled token; ``decode_tokens_per_s`` over
    the tokens after the first (None for fewer than two); ``guided_masks`` /
    ``guided_mask_s``: allowed-token masks a guided request computed on the host, and their
    seconds."""

    prompt_tokens: int = 0
    generated_tokens: int = 0
    cached_tokens: int = 0
    ttft_s: float = 0.0
    decode_tokens_per_s: float | None = None
    total_s: float = 0.0
    queue_s: float = 0.0
    prefill_steps: int = 0
    preemptions: int = 0
    finish_reason: str = ""
    pipelined: bool = False
    guided_masks: int = 0
    guided_mask_s: float = 0.0

    def to_dict(self) -> dict:
        from dataclasses import asdict

        return asdict(self)


@dataclass(slots=True)
class RequestOutput:
    """What one :meth:`LLMEngine.step` produced for one request.

    Attributes:
        request_id: the id :meth:`LLMEngine.add_request` returned.
        token_ids: tokens generated this step (a stop token is never included).
        text: text released this step (held-back text is released later, or dropped if it
            turns out to be a stop string).
        logprobs: one :class:`TokenLogprob` per token of ``token_ids`` when asked.
        finished: the request is done; then ``finish_reason`` is ``"stop"``, ``"length"``,
            ``"abort"`` or ``"error"``, ``stop`` the stop string or stop token id that ended
            it, ``output_ids``/``output_text`` everything generated, ``stats`` its numbers,
            ``error`` the message of an engine fault; ``flushed``: the end of ``text``
            released by the finish (held-back text that turned out not to be a stop string).
    """

    request_id: str
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    logprobs: list[TokenLogprob] | None = None
    finished: bool = False
    finish_reason: str | None = None
    stop: str | int | None = None
    output_ids: list[int] | None = None
    output_text: str | None = None
    stats: RequestStats | None = None
    error: str | None = None
    flushed: str = ""
    _seq: Any = field(default=None, repr=False, compare=False)


@dataclass
class EngineStats:
    """A snapshot: sequences running (admitted), waiting; KV blocks used (referenced),
    cached-free (evictable), free, total; prefix-cache hit rate (blocks hit / blocks looked
    up); steps run and tokens produced so far; preemptions; guided-decoding masks computed
    on the host and their seconds."""

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
    preemptions: int
    max_decode_batch: int
    guided_masks: int = 0
    guided_mask_s: float = 0.0

    def to_dict(self) -> dict:
        from dataclasses import asdict

        return asdict(self)


class _Seq:
    """One request's state in the engine (engine thread only, but ``sink``)."""

    def __init__(self, rid: str, prompt: list[int], params: SamplingParams, tokenizer,
                 arrival: float, sink: queue.Queue | None):
        from poot.text.stream import StreamDecoder

        self.id, self.params = rid, params
        self.prompt = prompt
        self.tokens = list(prompt)           # prompt + generated (the last is fed next)
        self.output_ids: list[int] = []
        self.blocks: list[int] = []
        self.table = None                    # i32 [W]: blocks, then the null block
        self.n_computed = 0                  # positions whose K/V are in the blocks
        self.keys: list[bytes] = []          # chain keys of the full blocks computed
        self.status = "waiting"
        self.history_row: int | None = None
        self.uniforms = params.uniforms()
        self.stop_ids = set(params.stop_token_ids)
        if tokenizer is not None and not params.ignore_eos:
            self.stop_ids |= set(tokenizer.stop_ids)
        self.decoder = StreamDecoder(tokenizer, skip_special_tokens=True, context=prompt) \
            if tokenizer is not None and params.detokenize else None
        self.matcher = StopMatcher(params.stop)
        self.sink = sink
        self.guide = None                    # TokenMatcher of a guided request
        self.lora_slot = 0                   # LoRA slot (0: the base model)
        self.lora_salt = ""                  # prefix-cache salt of its adapter
        self.stats = RequestStats(prompt_tokens=len(prompt))
        self.t_arrival = arrival
        self.t_admitted: float | None = None
        self.t_first: float | None = None
        self.generated = 0
        self.aborted = False


class LLMEngine:
    """The engine loop over one :class:`~poot.engine.runner.ModelRunner` (module doc).

    Args:
        runner: the model's steps over its KV pool.
        tokenizer: detokenizes and supplies the stop (EOS / end-of-turn) ids; None for
            token-id models (no text, no stop strings).
        config: :class:`EngineConfig`.
        model_context: the model's trained context (messages say how far the capacity may
            be raised).
    """

    def __init__(self, runner: ModelRunner, tokenizer=None, config: EngineConfig | None = None,
                 model_context: int | None = None):
        self.runner = runner
        self.tokenizer = tokenizer
        self.config = config or EngineConfig(max_batch=runner.max_batch)
        if self.config.max_batch > runner.max_batch:
            raise EngineError(f"max_batch {self.config.max_batch} exceeds the runner's "
                              f"largest bucket {runner.max_batch}")
        self.model_context = model_context
        kv = runner.kv
        self.blocks = BlockManager(kv.num_blocks, kv.block_size, self.config.prefix_caching)
        self.vocab = runner.vocab
        self.max_model_len = kv.max_model_len
        self.waiting: deque[_Seq] = deque()
        self.running: list[_Seq] = []
        self._free_rows = list(range(runner.history_slots - 1))     # last: scratch
        self._lock = threading.Lock()
        self._adds: deque[_Seq] = deque()
        self._aborts: set[str] = set()
        self._calls: list = []               # run_in_loop's functions, run between steps
        self._ids = itertools.count()
        self._known: set[str] = set()
        #: streamed requests (``stream=True``) until :meth:`stream` takes them: a request
        #: that finishes before its client calls :meth:`stream` keeps its outputs queued
        self._streams: dict[str, _Seq] = {}
        self._wake = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        self._stop = False
        self.fault: BaseException | None = None
        self.generated_tokens = 0
        self.preemptions = 0
        self.max_decode_batch = 0
        #: (time read, rows, prefill steps issued so far) of every decode step collected
        #: (benchmarks derive step rates from the intervals with no prefill in between)
        self.decode_log: deque[tuple[float, int, int]] = deque(maxlen=1 << 16)
        self._inflight = None            # (handle, seqs) of a decode step not yet collected
        self._lanes: list | None = None  # micro-batches in flight: [(lane, (handle, seqs))]
        self._spec_cache: dict = {}            # lane -> (rows' ids, their SamplerSpec)
        self._guided = None                    # GuidedCompiler, made on first use
        self._masks: np.ndarray | None = None  # i32 [max_batch, mask words]
        self.guided_masks = 0
        self.guided_mask_s = 0.0
        pipe = self.config.pipeline
        if pipe is None:
            pipe = settings.get_flag("POOT_PIPELINE")
            pipe = bool(getattr(runner.engine, "overlaps", False)) if pipe is None else pipe
        self.pipelined = bool(pipe)
        mb = self.config.micro_batches
        if mb is None:
            mb = int(getattr(runner.engine.device, "stages", 1))
        if isinstance(mb, bool) or not isinstance(mb, int) or mb < 1:
            raise EngineError(f"micro_batches must be an integer >= 1, got {mb!r}")
        self.micro_batches = mb
        #: decode steps issued as micro-batches
        self.micro_batched_steps = 0
        #: micro-batch steps issued chained (before the lane's step in flight was read)
        self.chained_lane_steps = 0
        #: chain rolling micro-batches where they can be (``POOT_CHAIN_LANES=0``: re-issue
        #: each only after reading it)
        self.chain_lanes = settings.get_flag("POOT_CHAIN_LANES")

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
        from poot.engine.guided import GuidedCompiler, GuidedDecodingError

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
        loop this way). ``lora``: the name of a loaded LoRA adapter the request runs with
        (None: the base model). Raises what :meth:`check_request` raises,
        :class:`EngineError` for a duplicate id, and
        :class:`~poot.models.lora.LoraError` (field ``model``) for an adapter that is not
        loaded."""
        params = params or SamplingParams()
        ids, matcher = self._validate(prompt_ids, params)
        slot, salt = 0, ""
        if lora is not None:
            if self.runner.lora is None:
                from poot.models.lora import LoraError

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
            seq = _Seq(rid, ids, params, self.tokenizer, time.perf_counter(), sink)
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

    def _find(self, rid: str) -> _Seq | None:
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
        """One iteration (module doc); returns the outputs of the requests that moved. An
        engine fault fails every request it touched (outputs with ``finish_reason
        "error"``) and is raised again."""
        events: list[RequestOutput] = []
        self._commands(events)
        try:
            if self._inflight is not None:
                if self._can_chain():
                    nxt = self._issue_decode(chained=True)
                    events += self._finish_decode()
                    self._issue_sampler(nxt)
                    self._inflight = nxt
                    return self._deliver(events)
                events += self._finish_decode()
            if self._lanes is not None:
                if self._can_roll():
                    events += self._roll_lanes()
                    return self._deliver(events)
                events += self._drain_lanes()
            self._admit()
            self._prefill()
            running = [s for s in self.running if s.status == "running"]
            if self.micro_batches > 1 and len(running) >= self.micro_batches:
                self._issue_lanes(running)
                if not self.pipelined:
                    events += self._drain_lanes()
            elif running:
                self._inflight = self._issue_decode(chained=False)
                self._issue_sampler(self._inflight)
                if not self.pipelined:
                    events += self._finish_decode()
        except Exception as e:  # noqa: BLE001  (an engine fault: fail the requests it touched)
            self.fault = e
            for s in list(self.running) + list(self.waiting):
                events.append(self._finish(s, "error", error=f"{type(e).__name__}: {e}"))
            self.running.clear()
            self.waiting.clear()
            self._inflight = self._lanes = None
            self._deliver(events)
            raise
        return self._deliver(events)

    def _deliver(self, events: list[RequestOutput]) -> list[RequestOutput]:
        for ev in events:
            seq = getattr(ev, "_seq", None)
            if seq is not None and seq.sink is not None:
                seq.sink.put(ev)
        return events

    def _commands(self, events: list[RequestOutput]) -> None:
        with self._lock:
            adds, self._adds = self._adds, deque()
            aborts, self._aborts = self._aborts, set()
            calls, self._calls = self._calls, []
        for call in calls:
            call()
        self.waiting.extend(adds)
        if not aborts:
            return
        for seq in [s for s in self.waiting if s.id in aborts]:
            self.waiting.remove(seq)
            events.append(self._finish(seq, "abort"))
        for seq in [s for s in self.running if s.id in aborts]:
            seq.aborted = True
            if not self._in_flight(seq):
                events.append(self._finish(seq, "abort"))

    # ---- admission and prefill ------------------------------------------------------------
    def _admit(self) -> None:
        bm, bs = self.blocks, self.blocks.block_size
        while self.waiting and len(self.running) < self.config.max_batch:
            seq = self.waiting[0]
            ids = seq.tokens
            keys = block_keys(ids[:len(ids) - 1], bs, seq.lora_salt) \
                if bm.prefix_caching else []
            hit = bm.cached_prefix(keys)
            bm.take(hit)
            need = bm.blocks_for(len(ids)) - len(hit)
            reserve = self.config.watermark_blocks if self.running else 0
            if need > bm.num_free() - reserve:
                bm.release(hit)
                bm.query_blocks -= len(keys)          # not admitted: not a query
                bm.hit_blocks -= len(hit)
                break
            seq.blocks = hit + bm.allocate(need)
            seq.table = self.runner.table_row(seq.blocks)
            seq.keys = keys[:len(hit)]
            seq.n_computed = len(hit) * bs
            if seq.t_admitted is None:
                seq.stats.cached_tokens = seq.n_computed
                seq.stats.queue_s = time.perf_counter() - seq.t_arrival
            seq.t_admitted = time.perf_counter()
            seq.history_row = self._free_rows.pop()
            self.runner.reset_history(seq.history_row, seq.output_ids)
            seq.status = "prefill"
            self.waiting.popleft()
            self.running.append(seq)

    def _prefill(self) -> None:
        chunk = self.runner.prefill_chunk
        budget = self.config.max_prefill_tokens or 2 * chunk
        for seq in self.running:
            if seq.status != "prefill":
                continue
            end = len(seq.tokens) - 1             # the last token goes through decode
            while seq.n_computed < end and budget > 0:
                n = min(chunk, end - seq.n_computed)
                seq.stats.prefill_steps += self.runner.prefill(
                    seq.blocks, seq.tokens[seq.n_computed:seq.n_computed + n], seq.n_computed,
                    seq.lora_slot)
                seq.n_computed += n
                budget -= chunk
                self._register(seq)
            if seq.n_computed >= end:
                seq.status = "running"
            if budget <= 0:
                break

    def _register(self, seq: _Seq) -> None:
        """Register the sequence's newly full blocks in the prefix cache."""
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

    # ---- decode ---------------------------------------------------------------------------
    def _grow(self, seqs: list[_Seq], position_of) -> list[_Seq]:
        """Give every sequence of ``seqs`` a block for its next position, preempting the
        most recently admitted sequences when blocks run out; returns those still running."""
        bm = self.blocks
        for seq in seqs:
            if seq.status not in ("running", "prefill"):
                continue                                  # preempted meanwhile
            while bm.blocks_for(position_of(seq) + 1) > len(seq.blocks):
                if bm.num_free() > 0:
                    b = bm.allocate(1)[0]
                    seq.table[len(seq.blocks)] = b
                    seq.blocks.append(b)
                    continue
                victim = self.running[-1]
                self._preempt(victim)
                if victim is seq:
                    break
        return [s for s in seqs if s.status in ("running", "prefill")]

    def _preempt(self, seq: _Seq) -> None:
        self.blocks.release(seq.blocks)
        seq.blocks, seq.keys, seq.n_computed, seq.table = [], [], 0, None
        self._free_rows.append(seq.history_row)
        seq.history_row = None
        seq.status = "waiting"
        seq.stats.preemptions += 1
        self.preemptions += 1
        self.running.remove(seq)
        self.waiting.appendleft(seq)

    def _in_flight(self, seq: _Seq) -> bool:
        """Whether ``seq`` is a row of a decode step issued and not yet read."""
        if self._inflight is not None and seq in self._inflight[1]:
            return True
        return any(seq in seqs for _, seqs in self._lanes or ())

    def _issue_lanes(self, running: list[_Seq]) -> None:
        """Issue one decode step as :attr:`micro_batches` micro-batches (EngineConfig):
        every micro-batch's forward pass and sampler (lane k on its own entries), before any
        is read; they stay in flight (:attr:`_lanes`) until :meth:`_roll_lanes` or
        :meth:`_drain_lanes` reads them."""
        m = self.micro_batches
        size = -(-len(running) // m)
        lanes: list = []
        for k in range(m):
            self._issue_lane(k, running[k * size:(k + 1) * size], lanes)
        self._lanes = lanes or None

    def _issue_lane(self, k: int, group: list[_Seq], lanes: list) -> None:
        """Issue micro-batch ``k``'s decode step and sampler over ``group`` (from the host's
        tokens) and append ``(k, (handle, rows))`` to ``lanes``; nothing for no rows."""
        if group:
            inf = self._issue_decode(chained=False, seqs=group, lane=k)
            if inf is not None:
                self._issue_sampler(inf)
                lanes.append((k, inf))

    def _read_lane(self, inf) -> list[RequestOutput]:
        return self._finish_decode(inf, log=False)

    def _log_lanes(self, rows: int) -> None:
        self.decode_log.append((time.perf_counter(), rows, self.runner.prefill_steps))
        self.max_decode_batch = max(self.max_decode_batch, rows)
        self.micro_batched_steps += 1

    def _drain_lanes(self) -> list[RequestOutput]:
        """Read every micro-batch in flight, in issue order; none is issued again."""
        lanes, self._lanes = self._lanes or [], None
        events: list[RequestOutput] = []
        for _, inf in lanes:
            events += self._read_lane(inf)
        self._log_lanes(sum(len(inf[1]) for _, inf in lanes))
        return events

    def _room_ahead(self, seqs: list[_Seq]) -> bool:
        """Whether decode steps over ``seqs`` may go on without the scheduler: no sequence
        waits to be prefilled or admitted, and free blocks for every running row's next
        position (so growing one step never preempts a row still in flight)."""
        if any(s.status != "running" for s in self.running):
            return False
        if self.waiting and len(self.running) < self.config.max_batch:
            return False
        need = sum(1 for s in seqs if s.status == "running"
                   and self.blocks.blocks_for(len(s.tokens) + 1) > len(s.blocks))
        return need <= self.blocks.num_free()

    @staticmethod
    def _chainable(seqs: list[_Seq]) -> bool:
        """Whether the step after the one in flight over ``seqs`` can be issued before that
        one is read (tokens fed on the device): no row aborted, none ends by length at the
        step in flight (a stop token cannot be foreseen: its row's extra token is
        discarded)."""
        return all(not s.aborted and s.generated + 1 < s.params.max_tokens for s in seqs)

    def _can_roll(self) -> bool:
        """Whether the micro-batches in flight can each be issued again as it is read: the
        engine pipelines, no command is queued, at least :attr:`micro_batches` rows, and
        :meth:`_room_ahead`."""
        if not self.pipelined or not self._lanes:
            return False
        seqs = [s for _, (_, ss) in self._lanes for s in ss]
        if len(seqs) < self.micro_batches or self._adds:
            return False
        return self._room_ahead(seqs)

    def _lane_can_chain(self, seqs: list[_Seq]) -> bool:
        """Whether a micro-batch's next step can be issued before its step in flight is
        read: every row running and :meth:`_chainable`."""
        return all(s.status == "running" for s in seqs) and self._chainable(seqs)

    def _roll_lanes(self) -> list[RequestOutput]:
        """Take each micro-batch in issue order and issue its next step while the ones
        behind it are still in flight: chained (issued before its step in flight is read, the
        sampled tokens fed on the device, so stage 0 of a layer pipeline goes on without
        waiting for the host) where :meth:`_lane_can_chain`, else right after reading it,
        from the rows still running. A micro-batch whose rows all finished is dropped."""
        events: list[RequestOutput] = []
        rows, lanes = 0, []
        for k, inf in self._lanes:
            rows += len(inf[1])
            if self.chain_lanes and self._lane_can_chain(inf[1]):
                nxt = self._issue_decode(chained=True, seqs=inf[1], lane=k)
                events += self._read_lane(inf)
                if nxt is not None:
                    self._issue_sampler(nxt)      # guided: after the matchers took the tokens
                    lanes.append((k, nxt))
                    self.chained_lane_steps += 1
                continue
            events += self._read_lane(inf)
            self._issue_lane(k, [s for s in inf[1] if s.status == "running" and not s.aborted],
                             lanes)
        self._lanes = lanes or None
        self._log_lanes(rows)
        return events

    def _decode_batch(self, seqs: list[_Seq], chained: bool) -> DecodeBatch:
        n = len(seqs)
        shift = 1 if chained else 0
        pos = np.fromiter((len(s.tokens) - 1 + shift for s in seqs), np.int32, n)
        tokens = None if chained else np.fromiter((s.tokens[-1] for s in seqs), np.int32, n)
        uniforms = np.fromiter((0.0 if s.params.greedy else s.uniforms.next() for s in seqs),
                               np.float32, n)
        return DecodeBatch(tokens, pos, np.stack([s.table for s in seqs]),
                           [s.params for s in seqs], uniforms,
                           np.fromiter((s.history_row for s in seqs), np.int32, n),
                           tuple(s.id for s in seqs),
                           np.fromiter((s.lora_slot for s in seqs), np.int32, n)
                           if self.runner.lora is not None else None)

    def _issue_decode(self, chained: bool, seqs: list[_Seq] | None = None, lane: int = 0):
        """Issue a decode step (forward pass, and the sampler unless it is guided:
        :meth:`_issue_sampler`) over ``seqs`` (default: every running sequence) on
        micro-batch ``lane``'s entries. ``chained``: the rows of the step in flight on that
        lane (default :attr:`_inflight`'s), one position further, their tokens fed on the
        device by that step's sampler. Returns (handle, rows) or None."""
        if chained:
            seqs = list(self._inflight[1] if seqs is None else seqs)
            seqs = self._grow(seqs, lambda s: len(s.tokens))
        else:
            if seqs is None:
                seqs = [s for s in self.running if s.status == "running"]
            seqs = self._grow(seqs, lambda s: len(s.tokens) - 1)
        if not seqs:
            return None
        key = tuple(s.id for s in seqs)
        cached = self._spec_cache.get(lane)
        if cached is None or cached[0] != key:
            cached = self._spec_cache[lane] = (key, sampler_spec_for([s.params for s in seqs]))
        spec = cached[1]
        batch = self._decode_batch(seqs, chained)
        if spec.guided:                    # the sampler waits for the rows' masks
            handle = self.runner.submit_model(batch, spec, lane)
        else:
            handle = self.runner.submit_decode(batch, spec, lane=lane)
        self.max_decode_batch = max(self.max_decode_batch, len(seqs))
        return handle, seqs

    def _issue_sampler(self, inflight) -> None:
        """Issue the sampler of a guided step whose forward pass is running: each guided
        row's allowed tokens are computed now, on the host, from its matcher (which has
        consumed every token accepted so far); other rows (unconstrained, or finished since
        the step was issued: their token is discarded) allow every token."""
        if inflight is None or inflight[0].submitted is not None:
            return
        handle, seqs = inflight
        from poot.engine.guided import ALL_ALLOWED

        words = sampling.mask_words(self.vocab)
        if self._masks is None or self._masks.shape[0] < len(seqs):
            self._masks = np.empty((self.runner.max_batch, words), np.int32)
        masks = self._masks[:len(seqs)]
        t0 = time.perf_counter()
        rows = [i for i, s in enumerate(seqs) if s.guide is not None and s.status == "running"]
        masks[:] = ALL_ALLOWED
        if rows:
            block = np.empty((len(rows), words), np.int32)
            self._guided.fill_masks([seqs[i].guide for i in rows], block)
            masks[rows] = block
        dt = time.perf_counter() - t0
        self.guided_masks += len(rows)
        self.guided_mask_s += dt
        self.runner.submit_sampler(handle, masks)

    def _can_chain(self) -> bool:
        """Whether the next decode step can be issued before the in-flight one is read: the
        same sequences, none of which ends by length at the in-flight step, no admission,
        prefill or abort waiting, and blocks for every next position without preemption."""
        if not self.pipelined or self._inflight is None:
            return False
        seqs = self._inflight[1]
        if self.micro_batches > 1 and len(seqs) >= self.micro_batches:
            return False                  # the step runs as micro-batches instead
        if not self._chainable(seqs) or len(self.running) != len(seqs):
            return False
        return self._room_ahead(seqs)

    def _finish_decode(self, inflight=None, log: bool = True) -> list[RequestOutput]:
        """Read a decode step (``inflight``: (handle, seqs); default the one in flight) and
        accept its tokens; ``log``: record it in :attr:`decode_log`."""
        if inflight is None:
            inflight, self._inflight = self._inflight, None
        if inflight is None:
            return []
        handle, seqs = inflight
        out = self.runner.collect(handle)
        now = time.perf_counter()
        if log:
            self.decode_log.append((now, len(seqs), self.runner.prefill_steps))
        events = []
        tok = out[sampling.OUTPUTS["token"]]
        lp = out.get(sampling.OUTPUTS["logprob"])
        top_v = out.get(sampling.OUTPUTS["top_logprobs"])
        top_i = out.get(sampling.OUTPUTS["top_ids"])
        for i, seq in enumerate(seqs):
            if seq.status != "running":
                continue                  # finished or preempted meanwhile: a wasted row
            seq.n_computed = len(seq.tokens)
            if seq.aborted:
                events.append(self._finish(seq, "abort"))
                continue
            logprob = None
            if seq.params.logprobs is not None and lp is not None:
                n = seq.params.logprobs
                top = [(int(a), float(b)) for a, b in zip(top_i[i][:n], top_v[i][:n])
                       if b != -np.inf] if n and top_i is not None else \
                    ([] if n == 0 else None)
                logprob = TokenLogprob(int(tok[i]), float(lp[i]), top)
            events.append(self._accept(seq, int(tok[i]), logprob, now))
        self.generated_tokens += len(seqs)
        return [e for e in events if e is not None]

    def _accept(self, seq: _Seq, token: int, logprob: TokenLogprob | None, now: float
                ) -> RequestOutput:
        seq.generated += 1
        if seq.t_first is None:
            seq.t_first = now
        if seq.guide is not None and not seq.guide.consume(token):
            # the mask allowed only what the matcher accepts, so the constraint itself failed
            # (llguidance's lexer or parser ran past a limit on this input: a{1000000})
            return self._finish(seq, "error", error=f"{GUIDED_ERROR}the constraint failed "
                                f"at generated token {seq.generated} (sampled {token}): "
                                f"{seq.guide.error}")
        if token in seq.stop_ids:
            return self._finish(seq, "stop", stop=token)
        seq.tokens.append(token)
        seq.output_ids.append(token)
        self._register(seq)
        text = ""
        if seq.decoder is not None:
            text = seq.matcher.feed(seq.decoder.push(token)).text
        ev = RequestOutput(seq.id, [token], text, [logprob] if logprob is not None else None)
        ev._seq = seq
        if seq.matcher.stopped:
            return self._finish(seq, "stop", stop=seq.matcher.stop, last=ev)
        if seq.generated >= seq.params.max_tokens:
            return self._finish(seq, "length", last=ev)
        return ev

    def _finish(self, seq: _Seq, reason: str, stop=None, last: RequestOutput | None = None,
                error: str | None = None) -> RequestOutput:
        """End a sequence: flush held text, free its blocks and history row."""
        now = time.perf_counter()
        ev = last or RequestOutput(seq.id)
        ev._seq = seq
        if seq.decoder is not None and not seq.matcher.stopped and reason not in ("abort",
                                                                                "error"):
            upd = seq.matcher.feed(seq.decoder.finish())
            if upd.stopped:
                reason, stop = "stop", upd.stop
                ev.flushed = upd.text
            else:
                ev.flushed = upd.text + seq.matcher.flush()
            ev.text += ev.flushed
        if seq in self.running:
            self.running.remove(seq)
        if seq.blocks:
            self.blocks.release(seq.blocks)
            seq.blocks = []
        if seq.history_row is not None:
            self._free_rows.append(seq.history_row)
            seq.history_row = None
        if seq.lora_slot and seq.status != "finished":
            self.runner.lora.release(seq.lora_slot)
        seq.status = "finished"
        st = seq.stats
        st.generated_tokens, st.finish_reason = seq.generated, reason
        if seq.guide is not None:
            st.guided_masks, st.guided_mask_s = seq.guide.masks, seq.guide.mask_s
        st.total_s = now - seq.t_arrival
        st.pipelined = self.pipelined
        if seq.t_first is not None:
            st.ttft_s = seq.t_first - seq.t_arrival
            if seq.generated > 1:
                st.decode_tokens_per_s = (seq.generated - 1) / max(now - seq.t_first, 1e-9)
        ev.finished, ev.finish_reason, ev.stop, ev.error = True, reason, stop, error
        ev.output_ids = list(seq.output_ids)
        ev.output_text = seq.matcher.text if seq.decoder is not None else ""
        ev.stats = st
        with self._lock:
            self._known.discard(seq.id)
        return ev

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
                           generated_tokens=self.generated_tokens,
                           preemptions=self.preemptions,
                           max_decode_batch=self.max_decode_batch,
                           guided_masks=self.guided_masks, guided_mask_s=self.guided_mask_s)

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


__all__ = ["ContextOverflow", "EngineConfig", "EngineError", "EngineStats",
           "KVCapacityExceeded", "LLMEngine", "RequestOutput", "RequestStats", "TokenLogprob"]
