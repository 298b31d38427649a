"""The model's compiled steps over one paged KV pool: what the engine loop runs.

:class:`ModelRunner` owns the runtime :class:`~poot.runtime.Session` of one loaded model
(:attr:`~RunnerBase.session`) and its entries, each compiled once (through the compile
cache) the first time it is needed:

* **prefill** (an engine with ``EngineConfig.ragged`` off): ``StepSpec.prefill(T, batch=1,
  outputs="hidden")``, one chunk of T prompt tokens of one sequence (padding rows write
  nothing: slot -1). No LM head runs: the last prompt token goes through decode.
* **ragged** per token bucket T (:meth:`ModelRunner.ragged_bucket`: ``prefill_chunk * 2**k``,
  and below the chunk the :func:`mixed_ragged_buckets` of 1.5 and 2 times the largest
  decode batch):
  ``StepSpec.ragged(T, logit_rows=min(T, max_batch))``, a decode-shaped step whose T rows
  are tokens of several sequences (decode rows and prompt chunks, each row with its
  position and its sequence's block table), logits ``[S, 1, V]`` of the rows named by its
  ``logit_rows`` input. What the engine runs whenever prompt tokens are to be computed
  (:meth:`ModelRunner.submit_ragged`).
* **decode** per batch bucket B (:func:`decode_buckets`): ``StepSpec.decode(batch=B)``, one
  token per sequence, logits ``[B, 1, V]`` left on the device. Rows past the running
  sequences are idle: null block table, slot -1 (they write nothing), outputs ignored.
* **sampler** per (B, :class:`~poot.graph.sampling.SamplerSpec`)
  (:func:`poot.graph.sampling.trace_sampler`): reads the ``logits`` buffer of a decode (or
  ragged) entry in place (no host round trip), samples every row with its own parameters, and copies the
  sampled tokens into the decode entry's ``tokens`` input on the device (so a next step over
  the same rows needs no token upload). The spec is the union of the batch's features, so
  one model program per bucket serves every sampling setting; the sampler programs are small
  (a greedy one compiles in well under a second). Which program runs
  (:meth:`ModelRunner.sampler_for`): the exact spec's when it is loaded or in the compile
  cache, else a loaded program that covers it (:func:`~poot.graph.sampling.covers`: the
  same tokens, a few more passes over the logits), else the exact one compiled. Warming up
  the :data:`~poot.graph.sampling.FULL` sampler of batch 1 (the CLI does) lets a request with
  any sampling options (but log-probs) start without compiling.

Carried state, shared by every entry: the KV pools ``kv.{i}.k/v`` (updated in place where
the backend does so) and, with penalties, the token-history pool
``sampling.token_counts [history_slots, V]`` (one row per running sequence plus a scratch row
for idle batch rows).

Inputs are written only when they change (a row's block table changes when it gains a
block; its tokens only when the batch changes, otherwise they are fed back on the device).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from poot.dialects.kv_quant import KvDType, kv_value_bytes
from poot.dialects.types import DType
from poot.engine.guided import ALL_ALLOWED
from poot.engine.blocks import NULL_BLOCK
from poot.engine.lora import slot_column
from poot.engine.scheduler import idle_prefill_budget
from poot.runtime import Session, Entry, RowFeed, Submitted
from poot.graph import sampling
from poot.graph.sampling import GREEDY, SamplerSpec, SamplerStep, covers
from poot.models import StepSpec
from poot.sampling_params import SamplingParams, history_row

#: The decode entry's sampled-token output copied into its token input.
TOKEN = sampling.OUTPUTS["token"]


def smallest_bucket(n: int, buckets: Sequence[int], what: str = "bucket") -> int:
    """The first of ``buckets`` (ascending) that is at least ``n``; ValueError (naming
    ``what``) when ``n`` exceeds the last."""
    for b in buckets:
        if b >= n:
            return b
    raise ValueError(f"{n} exceeds the largest {what} {buckets[-1]}")


def decode_buckets(max_batch: int) -> tuple[int, ...]:
    """Decode batch sizes: powers of two below ``max_batch``, then ``max_batch``."""
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    out, b = [], 1
    while b < max_batch:
        out.append(b)
        b *= 2
    return tuple(out + [max_batch])


def mixed_ragged_buckets(prefill_chunk: int, max_batch: int, stall_bounded: bool = False
                         ) -> tuple[int, ...]:
    """The ragged buckets below ``prefill_chunk``, ascending: ``2 * max_batch`` rows rounded
    up to a power of two and, when ``stall_bounded``, ``1.5 * max_batch`` rows rounded up to
    a multiple of 4; each kept where it is smaller than the chunk (none for ``max_batch`` 1).

    A step that decodes a full batch and computes a few prompt tokens runs on one of them
    instead of padding to a whole chunk. That is the usual step of a server under load: an
    arrival whose prompt the prefix cache mostly holds (chat turns after a shared system
    prompt) has a few tokens left to compute, and on a device whose step cost grows with its
    rows (the CPU) a chunk-sized step costs the decoding sequences a multiple of their step
    time (SmolLM2 Q4_1, 2-core Xeon, max batch 8, 16 streaming chat clients: inter-token
    latency p99 / p50 2.8 -> 2.2 with the 16-row bucket, ``bench/results/ragged_step.md``).
    The 1.5x bucket is what a decode-stall bound (:attr:`EngineConfig.max_decode_stall
    <poot.engine.scheduler.EngineConfig>`, ``stall_bounded``) runs such a step on: 8 decode
    rows cost 12 ms there, 16 rows 20.5 ms, 12 rows 16 ms. Without a bound it is not
    compiled (one more step to compile at a cold start)."""
    if max_batch < 2:
        return ()
    pow2 = 1
    while pow2 < 2 * max_batch:
        pow2 *= 2
    sizes = {pow2}
    if stall_bounded:
        sizes.add(-(-(max_batch + -(-max_batch // 2)) // 4) * 4)
    return tuple(t for t in sorted(sizes) if t < prefill_chunk)


def ragged_ladder(prefill_chunk: int, max_batch: int, n: int, stall_bounded: bool = False
                  ) -> int:
    """The token rows of the ragged entry a step of ``n`` token rows runs on: the smallest
    of the :func:`mixed_ragged_buckets` that holds them, else the smallest
    ``prefill_chunk * 2**k`` that does."""
    for t in mixed_ragged_buckets(prefill_chunk, max_batch, stall_bounded):
        if n <= t:
            return t
    t = prefill_chunk
    while t < n:
        t *= 2
    return t


def ragged_token_buckets(prefill_chunk: int, max_batch: int,
                         max_prefill_tokens: int | None = None,
                         idle_prefill_tokens: int | None = None,
                         max_model_len: int | None = None, stall_bounded: bool = False
                         ) -> tuple[int, ...]:
    """The ragged entries' token rows an engine may run
    (:meth:`~poot.engine.scheduler.Scheduler.schedule`): the :func:`mixed_ragged_buckets`,
    then ``prefill_chunk * 2**k`` up to the
    bucket holding the larger of a full decode batch plus the prompt budget
    (``max_prefill_tokens``, default one chunk) and the budget of a step that decodes
    nothing (:func:`~poot.engine.scheduler.idle_prefill_budget`), that capped at the
    tokens ``max_batch`` sequences of ``max_model_len`` positions hold."""
    idle = idle_prefill_budget(prefill_chunk, max_prefill_tokens, idle_prefill_tokens)
    budget = max(idle, max_batch + (max_prefill_tokens or prefill_chunk))
    if max_model_len is not None:
        budget = min(budget, max_batch * max_model_len)
    out = list(mixed_ragged_buckets(prefill_chunk, max_batch, stall_bounded))
    t = prefill_chunk
    while True:
        out.append(t)
        if t >= max(budget, max_batch + 1):
            return tuple(out)
        t *= 2


@dataclass(frozen=True)
class KVConfig:
    """The paged KV pool.

    Attributes:
        block_size: positions per block (bs).
        num_blocks: blocks per pool, the null block included.
        max_model_len: positions one sequence may hold: the context limit, prompt plus
            generated tokens (its block table has ``W = ceil(max_model_len / bs)`` entries).
        kv_dtype: the pools' storage (a float dtype or q8_0, :mod:`poot.dialects.kv_quant`).
        kv_dtype_v: the V pools' storage where it differs from K's; None: ``kv_dtype``.
    """

    block_size: int
    num_blocks: int
    max_model_len: int
    kv_dtype: KvDType
    kv_dtype_v: KvDType | None = None

    @property
    def table_width(self) -> int:
        return -(-self.max_model_len // self.block_size)

    def bytes(self, dims: Any) -> int:
        """Bytes of every layer's KV pools for a model of ``dims``
        (:class:`~poot.models.StepDims`): layers x blocks x block size x
        :meth:`token_bytes`."""
        return dims.n_layers * self.num_blocks * self.block_size * self.token_bytes(dims)

    def token_bytes(self, dims: Any) -> int:
        """Bytes one position takes in one layer's pools: ``kv_token_elems`` values, half K
        and half V when they differ in storage, each at its storage's bytes a value (q8_0:
        34 / 32, its scales included; fp8: 1 + 4 / D)."""
        width = dims.head_dim if dims.kv_elems_per_token is None else dims.kv_token_elems
        k = kv_value_bytes(self.kv_dtype, width)
        v = k if self.kv_dtype_v is None else kv_value_bytes(self.kv_dtype_v, width)
        return int(round(dims.kv_token_elems * (k + v) / 2))


@dataclass(frozen=True)
class TokenFeed:
    """Token rows of a step taken on the device from what a step issued before it sampled,
    so the step is issued before the host has read those tokens.

    Attributes:
        source: the earlier step's handle (its sampler's sampled-token output is read).
        rows: ``(sampled row of source, token row of this step)`` pairs.
    """

    source: "DecodeHandle"
    rows: tuple[tuple[int, int], ...]

    def row_feed(self) -> RowFeed:
        """The session's :class:`~poot.runtime.session.RowFeed` of it (into ``tokens``)."""
        return RowFeed(self.source.sampler, TOKEN, "tokens",
                       tuple((s, d, 1) for s, d in self.rows))


@dataclass
class DecodeBatch:
    """The running sequences of one decode step, as columns (row i = one sequence).

    Attributes:
        tokens: i32 [n], the token fed at each row's position; None: fed on the device,
            by ``feed``, or else (no ``feed``) by the previous step's sampler, which copied
            its tokens into this entry's token input (the rows are the previous step's, in
            the same order).
        positions: i32 [n]; each row's K/V go to slot ``table[pos // bs] * bs + pos % bs``.
        tables: i32 [n, W], each row's block table (:meth:`ModelRunner.table_row`).
        params: each row's :class:`~poot.sampling_params.SamplingParams`.
        uniforms: f32 [n], this step's u per row (0 for greedy rows).
        history_rows: i32 [n], each row's row of the token-history pool.
        keys: identifies the rows' requests: rows whose keys are unchanged keep the
            parameters already written.
        lora_slots: i32 [n], each row's LoRA slot (0: the base model); None: all 0. Written
            only when the model carries LoRA slots (:mod:`poot.engine.lora`).
        feed: the rows' tokens taken on the device from an earlier step's sampled tokens
            (:class:`TokenFeed`; with ``tokens`` None).
    """

    tokens: np.ndarray | None
    positions: np.ndarray
    tables: np.ndarray
    params: Sequence[Any]
    uniforms: np.ndarray
    history_rows: np.ndarray
    keys: tuple
    lora_slots: np.ndarray | None = None
    feed: TokenFeed | None = None


@dataclass
class RaggedBatch:
    """One ragged step: decode rows and prefill chunks of several sequences flattened into one
    token dimension (:meth:`ModelRunner.submit_ragged`).

    Attributes:
        tokens, positions: i32 [n], each token row's token and position (a row ``feed``
            fills: any token, overwritten on the device).
        tables: i32 [n, W], each token row's sequence's block table (rows of one sequence
            repeat it).
        logit_rows: i32 [s], the token rows sampled (a decode row; the last prompt token of a
            sequence whose prefill completes in this step), in the order of ``sampled``.
        sampled: the sampled rows as a :class:`DecodeBatch` of s rows (their parameters,
            uniforms, history rows and keys; its ``tokens`` unused).
        lora_slots: i32 [n], each token row's LoRA slot, or None (all 0).
        feed: token rows taken on the device from an earlier step's sampled tokens
            (:class:`TokenFeed`), or None.
    """

    tokens: np.ndarray
    positions: np.ndarray
    tables: np.ndarray
    logit_rows: np.ndarray
    sampled: DecodeBatch
    lora_slots: np.ndarray | None = None
    feed: TokenFeed | None = None


@dataclass
class DecodeHandle:
    """A decode + sample issued by :meth:`ModelRunner.submit_decode`, or a decode whose
    sampler is still to be issued (:meth:`ModelRunner.submit_model`: ``submitted`` is None
    until :meth:`ModelRunner.submit_sampler`)."""

    submitted: Submitted | None
    rows: int
    spec: SamplerSpec
    read: list[str]
    bucket: int = 0
    sampler: Entry | None = None
    inputs: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class _EntryState:
    """The host copy of what was last written into an entry's inputs (write-if-changed)."""

    last: dict[str, Any] = field(default_factory=dict)


def sampler_spec_for(params_list: Sequence[Any]) -> SamplerSpec:
    """The smallest :class:`SamplerSpec` serving every request of ``params_list`` (their
    features' union; log-prob width rounded up to :data:`~poot.graph.sampling.LOGPROB_WIDTHS`)."""
    pen = bias = top_k = top_p = min_p = stoch = guided = False
    lp = None
    for p in params_list:
        guided |= getattr(p, "guided", None) is not None
        greedy = p.greedy
        pen |= (p.repetition_penalty != 1.0 or p.presence_penalty != 0.0
                or p.frequency_penalty != 0.0)
        bias |= bool(p.logit_bias)
        stoch |= not greedy
        top_k |= not greedy and p.top_k > 0
        top_p |= not greedy and p.top_p < 1.0
        min_p |= not greedy and p.min_p > 0.0
        if p.logprobs is not None:
            w = next(x for x in sampling.LOGPROB_WIDTHS if x >= p.logprobs)
            lp = w if lp is None else max(lp, w)
    return SamplerSpec(penalties=pen, logit_bias=bias, top_k=top_k, top_p=top_p, min_p=min_p,
                       logprobs=lp, stochastic=stoch, guided=guided)


def step_trace(key_model, types, spec) -> Callable[[], Any]:
    """The trace of a step as the compile cache keys it: ``key_model.trace(spec, types)``
    for a model step, :func:`~poot.graph.sampling.trace_sampler` for a
    :class:`SamplerProgram`'s (``spec``: its :class:`SamplerStep`). Not called here: a cache
    hit never traces."""
    if isinstance(key_model, SamplerProgram):
        return lambda: sampling.trace_sampler(spec)
    return lambda: key_model.trace(spec, types)


def _sampler_cost(s: SamplerSpec) -> int:
    """The features a sampler program runs (fewer: cheaper per step)."""
    return sum(map(bool, (s.penalties, s.logit_bias, s.top_k, s.top_p, s.min_p, s.guided,
                          s.logprobs is not None)))


def _sampler_reads(spec: SamplerSpec) -> list[str]:
    """The sampler outputs a step of ``spec`` reads back: the tokens, and the log-probs it
    asks for."""
    read = [TOKEN]
    if spec.logprobs is not None:
        read.append(sampling.OUTPUTS["logprob"])
        if spec.logprobs > 0:
            read += [sampling.OUTPUTS["top_logprobs"], sampling.OUTPUTS["top_ids"]]
    return read


def spec_tag(spec: SamplerSpec) -> str:
    """A short name of a sampler spec's features (``""`` for the greedy one), for entry
    names: ``":sample+pen+bias+topk+topp+minp+guided+lp5"``."""
    feats = [name for name, on in (("sample", spec.stochastic), ("pen", spec.penalties),
                                   ("bias", spec.logit_bias), ("topk", spec.top_k),
                                   ("topp", spec.top_p), ("minp", spec.min_p),
                                   ("guided", spec.guided)) if on]
    if spec.logprobs is not None:
        feats.append(f"lp{spec.logprobs}")
    return ":" + "+".join(feats) if feats else ""


def step_spec(kv: KVConfig, kind: str, batch: int = 1, prefill_chunk: int = 32,
              logit_rows: int | None = None) -> StepSpec:
    """The StepSpec a :class:`ModelRunner` over ``kv`` compiles: the prefill chunk
    (``min(prefill_chunk, max_model_len)`` tokens of one sequence, hidden output), the
    decode step of ``batch`` rows, or the ragged step (``kind="ragged"``) of ``batch`` token
    rows sampling ``min(batch, logit_rows)`` of them."""
    kw = dict(kv_capacity=kv.table_width * kv.block_size, block_size=kv.block_size,
              num_blocks=kv.num_blocks, kv_dtype=kv.kv_dtype, kv_dtype_v=kv.kv_dtype_v)
    if kind == "prefill":
        return StepSpec.prefill(max(1, min(prefill_chunk, kv.max_model_len)), batch=1,
                                outputs="hidden", **kw)
    if kind == "ragged":
        return StepSpec.ragged(batch, logit_rows=min(batch, logit_rows or batch), **kw)
    return StepSpec.decode(batch=batch, **kw)


class SamplerProgram:
    """What :func:`poot.compiler.cache.step_key` keys a sampler program by: ``config`` is its
    :class:`~poot.graph.sampling.SamplerStep` (no model, no weights)."""

    family = "sampler"

    def __init__(self, step: SamplerStep):
        self.config = step


class RunnerBase:
    """What :class:`ModelRunner` and :class:`~poot.engine.pooling.PoolingRunner` share: the
    runtime :class:`~poot.runtime.Session` (:attr:`session`) holding one model's weights on
    one device, and compiling its steps through ``compile_step`` (the compile cache), timed
    in :attr:`compile_s`, the weights uploaded after the first compile (so a model whose
    compile is refused uploads nothing).

    Args:
        model, weights: the family instance and its :class:`~poot.models.WeightBinding`.
        device: the runtime device.
        compile_step: ``(key_model, weight_types, spec, trace) -> Program``: compiles (or
            finds in the compile cache) the program of ``trace()``; ``key_model``/``spec``
            identify it without tracing.
        on_compile: called with an entry's name before it is compiled or loaded.
        storage_type: the session's weight storage rule (the target's
            :func:`~poot.compiler.planning.storage_type`; None: the weights' own types).
    """

    def __init__(self, model, weights, device, compile_step: Callable,
                 on_compile: Callable[[str], None] | None = None,
                 storage_type: Callable | None = None):
        self.model, self.weights = model, weights
        self.compile_step = compile_step
        self.on_compile = on_compile
        self.session = Session(device, storage_type=storage_type)
        self._uploaded = False
        self.compile_s: dict[str, float] = {}

    def upload_weights(self) -> None:
        """Upload every weight to the device (once)."""
        if not self._uploaded:
            self.session.load_weights(self.weights.arrays, self.weights.types)
            self._uploaded = True

    def _compile(self, name: str, key_model, types, spec, trace):
        """The program of ``trace()`` (keyed by ``key_model``, ``types``, ``spec``), named
        ``name`` for ``on_compile`` and :attr:`compile_s`."""
        if self.on_compile:
            self.on_compile(name)
        t0 = time.perf_counter()
        prog = self.compile_step(key_model, types, spec, trace)
        self.compile_s[name] = time.perf_counter() - t0
        self.upload_weights()              # after the first compile: refusals come first
        return prog


class ModelRunner(RunnerBase):
    """The steps of one model on one device over one paged KV pool (module doc).

    Args:
        model, weights, device, compile_step, on_compile, storage_type: as
            :class:`RunnerBase`'s.
        find_step: ``(key_model, weight_types, spec) -> Program | None``: the program when
            the compile cache has it, without compiling (None: not known).
        kv: the pool; max_batch: the largest decode bucket; prefill_chunk: tokens per
            prefill step (clamped to ``kv.max_model_len``).
        upload: upload the weights now (False: at :meth:`upload_weights`, or before the first
            entry is added).
    """

    def __init__(self, model, weights, device, compile_step: Callable, kv: KVConfig,
                 max_batch: int, prefill_chunk: int,
                 on_compile: Callable[[str], None] | None = None, upload: bool = True,
                 find_step: Callable | None = None, storage_type: Callable | None = None):
        super().__init__(model, weights, device, compile_step, on_compile, storage_type)
        self.kv = kv
        self.find_step = find_step
        self.buckets = decode_buckets(max_batch)
        self.max_batch = max_batch
        self.prefill_chunk = max(1, min(prefill_chunk, kv.max_model_len))
        self.vocab = model.dims().vocab
        #: rows of the token-history pool: one per running sequence, a scratch row (the
        #: last), rounded up (:func:`~poot.graph.sampling.history_pool_rows`)
        self.history_slots = sampling.history_pool_rows(max_batch)
        if upload:
            self.upload_weights()
        self._entries: dict[Any, Entry] = {}
        self._written: dict[int, _EntryState] = {}
        self.prefill_steps = 0
        self.decode_steps = 0
        self.ragged_steps = 0
        #: the most rows a verify step samples (set by a speculating engine: every sequence's
        #: last token and proposals); None: every row
        self.verify_rows_cap: int | None = None
        #: token-history rows added for speculative proposal rows (:mod:`poot.engine.spec`)
        self.history_scratch: list[int] = []
        #: whether the engine runs prompts as ragged steps (set by the engine from
        #: :attr:`EngineConfig.ragged <poot.engine.scheduler.EngineConfig.ragged>`)
        self.ragged = True
        #: whether the engine bounds a ragged step's stall (set by the engine from
        #: :attr:`EngineConfig.max_decode_stall <poot.engine.scheduler.EngineConfig>`): the
        #: ladder then has the 1.5x mixed bucket (:func:`mixed_ragged_buckets`)
        self.stall_bounded = False
        #: the :class:`~poot.engine.lora.LoraManager` when the weights carry LoRA slots
        self.lora = None
        #: (batch, spec) of warm samplers left to compile workers (:mod:`poot.api.compile_ahead`):
        #: loaded (waited for) when a request first needs one
        self.deferred: set[tuple[int, SamplerSpec]] = set()
        #: seconds a ragged step of T token rows takes (:meth:`measure_ragged_costs`; empty
        #: until measured)
        self.ragged_costs: dict[int, float] = {}

    # ---- entries ------------------------------------------------------------------------
    def step_spec(self, kind: str, batch: int = 1) -> StepSpec:
        """The StepSpec of the prefill entry (``kind="prefill"``), of the decode entry of
        ``batch`` rows, or of the ragged entry of ``batch`` token rows."""
        return step_spec(self.kv, kind, batch, self.prefill_chunk, self.max_batch)

    def _step_entry(self, key, name: str, spec: Callable[[], StepSpec]) -> Entry:
        """The model entry cached under ``key``: on first use the step ``spec()`` traced,
        compiled (or found in the compile cache) as ``name`` (a format string of the spec
        ``sp``) and added to the session."""
        e = self._entries.get(key)
        if e is None:
            sp = spec()
            prog = self._compile(name.format(sp=sp), self.model, self.weights.types, sp,
                                 lambda: self.model.trace(sp, self.weights.types))
            e = self._entries[key] = self.session.add_entry(prog)
        return e

    def prefill_entry(self) -> Entry:
        """The prefill entry of one prompt chunk (the engine with ``ragged`` off)."""
        return self._step_entry("prefill", "prefill[{sp.tokens}]",
                                lambda: self.step_spec("prefill"))

    def decode_entry(self, batch: int, lane: int = 0) -> Entry:
        """The decode entry of bucket ``batch``; ``lane`` k > 0: another entry of the same
        program (own input slots, outputs and recordings) for micro-batch k, so micro-batches
        in flight together never share a buffer."""
        if lane:
            key = ("decode", batch, lane)
            e = self._entries.get(key)
            if e is None:
                e = self._entries[key] = self.session.add_entry(
                    self.decode_entry(batch).program)
            return e
        return self._step_entry(("decode", batch), f"decode[B={batch}]",
                                lambda: self.step_spec("decode", batch))

    def _model_entry(self, source: tuple) -> Entry:
        """The model entry ``source`` names: ``("decode", B)``, ``("decode", B, lane)`` or
        ``("ragged", T)``."""
        if source[0] == "ragged":
            return self.ragged_entry(source[1])
        if source[0] == "verify":
            return self.verify_entry(source[1])
        return self.decode_entry(*source[1:])

    def sampler_entry(self, batch: int, spec: SamplerSpec, program=None,
                      source: tuple | None = None) -> Entry:
        """The sampler entry of exactly ``spec`` for ``batch`` rows (compiled, or found in the
        compile cache, on first use; ``program``: already found), reading the logits of the
        model entry ``source`` (default: the decode entry of bucket ``batch``, whose token
        input it feeds; a ragged entry's: nothing fed back, the step is read before the
        next is issued)."""
        source = source or ("decode", batch)
        key = ("sampler", batch, spec) if source == ("decode", batch) else \
            ("sampler", batch, spec, source)
        e = self._entries.get(key)
        if e is None:
            model = self._model_entry(source)
            step = SamplerStep(batch, self.vocab, self.history_slots, spec)
            prog = program or next((e.program for k, e in self._entries.items()
                                    if k[:3] == ("sampler", batch, spec)), None) or \
                self._compile(f"sampler[B={batch}{spec_tag(spec)}]", SamplerProgram(step), {},
                              step, lambda: sampling.trace_sampler(step))
            feedback = {TOKEN: (model, "tokens")} if source[0] == "decode" else None
            e = self._entries[key] = self.session.add_entry(
                prog, share={sampling.LOGITS: (model, "logits")}, feedback=feedback)
        return e

    def sampler_for(self, batch: int, spec: SamplerSpec, lane: int = 0,
                    source: tuple | None = None) -> tuple[Entry, SamplerSpec]:
        """The sampler entry a step of ``batch`` rows whose rows need ``spec`` runs, and the
        spec it was traced for (module doc: exact if loaded or cached, else a loaded one that
        covers it, else a warm one left to a compile worker (:attr:`deferred`, waited for),
        else compiled). It reads the logits of ``source`` (:meth:`sampler_entry`; default
        the decode entry of bucket ``batch``); ``lane`` k > 0: micro-batch k's decode
        entry. One program serves every entry it reads from."""
        source = source or (("decode", batch, lane) if lane else ("decode", batch))
        loaded = {k[2]: e.program for k, e in self._entries.items()
                  if k[0] == "sampler" and k[1] == batch and covers(k[2], spec)}
        if spec in loaded:
            return self.sampler_entry(batch, spec, loaded[spec], source), spec
        if self.find_step is not None:
            step = SamplerStep(batch, self.vocab, self.history_slots, spec)
            prog = self.find_step(SamplerProgram(step), {}, step)
            if prog is not None:
                return self.sampler_entry(batch, spec, prog, source), spec
        # the one with the fewest features (cheapest per step), loaded or a warm one left
        # to a compile worker (which it has compiled or is compiling)
        deferred = [s for b, s in self.deferred if b == batch and covers(s, spec)]
        if loaded or deferred:
            best = min(list(loaded) + deferred, key=_sampler_cost)
            self.deferred.discard((batch, best))
            return self.sampler_entry(batch, best, loaded.get(best), source), best
        return self.sampler_entry(batch, spec, None, source), spec

    # ---- ragged steps ---------------------------------------------------------------------
    def ragged_bucket(self, n: int) -> int:
        """The token rows of the ragged entry a step of ``n`` token rows runs on
        (:func:`ragged_ladder`: a :func:`mixed_ragged_buckets` bucket, else
        ``prefill_chunk * 2**k``)."""
        return ragged_ladder(self.prefill_chunk, self.max_batch, n, self.stall_bounded)

    def ragged_entry(self, tokens: int) -> Entry:
        """The ragged entry of ``tokens`` token rows (a :func:`ragged_bucket` size), sampling
        up to ``min(tokens, max_batch)`` rows (:meth:`StepSpec.ragged
        <poot.models.StepSpec.ragged>`)."""
        return self._step_entry(("ragged", tokens), f"ragged[T={tokens}]",
                                lambda: self.step_spec("ragged", tokens))

    def measure_ragged_costs(self, reps: int = 3) -> dict[int, float]:
        """Time the loaded ragged entries of the :func:`mixed_ragged_buckets` and of one
        prompt chunk (none is compiled for it): each entry's step with every row idle (no
        KV written, the null block table), issued ``reps`` times after one untimed run and
        waited for each time; the fastest kept. Stores and returns ``{T: seconds}`` in
        :attr:`ragged_costs` (what a decode-stall bound schedules by:
        :func:`~poot.engine.scheduler.stall_prompt_budget`).

        Idle rows skip the attention over a sequence's context, so the times are those of
        the matmuls and the rest of the step: what grows with the rows."""
        costs: dict[int, float] = {}
        for t in [*mixed_ragged_buckets(self.prefill_chunk, self.max_batch,
                                        self.stall_bounded), self.prefill_chunk]:
            entry = self._entries.get(("ragged", t))
            if entry is None:
                continue
            values = self._ragged_inputs(entry, t, self.ragged_rows(t))
            best = float("inf")
            for i in range(reps + 1):
                t0 = time.perf_counter()
                self.session.submit(entry, self._write(entry, values), read=())
                self.synchronize()
                if i:
                    best = min(best, time.perf_counter() - t0)
            costs[t] = best
        self.ragged_costs = costs
        return costs

    def verify_bucket(self, n: int) -> int:
        """The token rows of the verify entry a speculative step of ``n`` rows runs on: the
        smallest power of two (at least 2) holding them."""
        t = 2
        while t < n:
            t *= 2
        return t

    def verify_rows(self, tokens: int) -> int:
        """Rows the verify entry of ``tokens`` token rows samples: all of them, up to
        :attr:`verify_rows_cap` (every decoding sequence's last token and proposals; the
        rest of a step that also prefills are prompt tokens)."""
        return min(tokens, self.verify_rows_cap or tokens)

    def verify_entry(self, tokens: int) -> Entry:
        """The verify entry of ``tokens`` token rows: a ragged step whose rows go through
        the head up to :meth:`verify_rows` (a speculating sequence's last token and its
        proposals, :mod:`poot.engine.spec`). Keyed by its sampled rows too: engines of
        other ``max_batch`` or k over one runner sample other rows of the same size."""
        return self._step_entry(("verify", tokens, self.verify_rows(tokens)),
                                f"verify[T={tokens}]",
                                lambda: step_spec(self.kv, "ragged", tokens,
                                                  self.prefill_chunk, self.verify_rows(tokens)))

    def ragged_rows(self, tokens: int) -> int:
        """Rows the ragged entry of ``tokens`` token rows samples: its logits' batch."""
        return min(tokens, self.max_batch)

    def submit_ragged(self, batch: RaggedBatch, spec: SamplerSpec | None,
                      verify: bool = False) -> DecodeHandle | None:
        """Issue one ragged step over ``batch`` (padded to its :meth:`ragged_bucket`: padding
        rows write nothing) and, unless ``spec`` is None (no row sampled), its sampler
        (``spec`` covering every sampled row; a guided one waits for
        :meth:`submit_sampler`). ``verify``: on the :meth:`verify_entry` of
        :meth:`verify_bucket` rows instead, up to :meth:`verify_rows` sampled. Returns the handle
        :meth:`collect` reads, or None."""
        n, s = len(batch.tokens), len(batch.logit_rows)
        t = self.verify_bucket(n) if verify else self.ragged_bucket(n)
        rows = self.verify_rows(t) if verify else self.ragged_rows(t)
        if s > rows:
            raise ValueError(f"{s} sampled rows exceed the {rows} of a ragged "
                             f"step of {t} tokens")
        entry = self.verify_entry(t) if verify else self.ragged_entry(t)
        values = self._ragged_inputs(entry, t, rows, batch)
        # the token input is written every step: a fed step leaves device rows the host
        # copy of what was last written does not know
        self.session.submit(entry, self._write(entry, values, force={"tokens"}), read=(),
                            feed=batch.feed.row_feed() if batch.feed is not None else None)
        self.ragged_steps += 1
        if spec is None:
            return None
        smp, spec = self.sampler_for(rows, spec, source=("verify" if verify else "ragged", t))
        handle = DecodeHandle(None, s, spec, _sampler_reads(spec), rows, smp,
                              self._sampler_inputs(smp, batch.sampled, rows, spec))
        return handle if spec.guided else self.submit_sampler(handle)

    def _ragged_inputs(self, entry: Entry, t: int, rows: int,
                       batch: RaggedBatch | None = None) -> dict[str, np.ndarray]:
        """The inputs of a ragged ``entry`` of ``t`` token rows sampling ``rows``: ``batch``'s
        rows first (their slots from their block tables), then padding rows that write
        nothing (token and position 0, the null block table, slot -1); with no ``batch``
        every row is padding (:meth:`measure_ragged_costs`)."""
        w, bs = self.kv.table_width, self.kv.block_size
        tokens = np.zeros((t, 1), np.int32)
        positions = np.zeros((t, 1), np.int32)
        table = np.full((t, w), NULL_BLOCK, np.int32)
        slots = np.full(t, -1, np.int32)
        logit_rows = np.zeros(rows, np.int32)
        n = 0
        if batch is not None:
            n, pos = len(batch.tokens), batch.positions
            tokens[:n, 0] = batch.tokens
            positions[:n, 0] = pos
            table[:n] = batch.tables
            slots[:n] = table[np.arange(n), pos // bs] * bs + pos % bs
            logit_rows[:len(batch.logit_rows)] = batch.logit_rows
        values = {"tokens": tokens, "positions": positions, "block_table": table,
                  "slot_mapping": slots, "logit_rows": logit_rows}
        if "lora_index" in entry.input_names:
            values["lora_index"] = slot_column(batch.lora_slots if batch else None, n, t)
        return values

    def bucket(self, n: int) -> int:
        """The smallest decode bucket holding ``n`` rows (ValueError past the largest)."""
        return smallest_bucket(n, self.buckets, "decode bucket")

    def warm_targets(self, batches: Sequence[int] = (1,)) -> list[tuple[int, tuple]]:
        """``(sampler batch, model entry)`` pairs a warm-up loads samplers for: where the
        engine runs ragged steps (:attr:`ragged`), the ragged entry of a prompt chunk's
        bucket (a prompt's first token comes from it) and the :func:`mixed_ragged_buckets`'
        (the steps of an arrival while others decode, so a loaded server never waits on
        their compile), then the decode entries of ``batches``."""
        out = []
        if self.ragged:
            for t in [self.prefill_chunk, *mixed_ragged_buckets(
                    self.prefill_chunk, self.max_batch, self.stall_bounded)]:
                out.append((self.ragged_rows(t), ("ragged", t)))
        return out + [(b, ("decode", b)) for b in batches]

    def warm_up(self, batches: Sequence[int] = (1,), specs: Sequence[SamplerSpec] = ()
                ) -> None:
        """Compile (or load) the ragged entries of :meth:`warm_targets` (the prefill entry
        where the engine does not run ragged steps), the decode entries of ``batches`` and
        the greedy sampler plus ``specs`` (e.g. :data:`~poot.graph.sampling.FULL`) of each
        (:meth:`warm_targets`), in the order of :meth:`warm_up_steps`."""
        if not self.ragged:
            self.prefill_entry()
        for b, source in self.warm_targets(batches):
            for s in [GREEDY, *specs]:
                self.sampler_entry(b, s, source=source)

    def warm_up_steps(self, batches: Sequence[int] = (1,), specs: Sequence[SamplerSpec] = ()
                      ) -> list[tuple[str, Any, Any, Any]]:
        """The steps :meth:`warm_up` compiles, in its order: ``(name, key model, weight
        types, spec)`` as the compile cache keys them (what :mod:`poot.api.compile_ahead`'s
        workers are given)."""
        out, seen = [], set()
        for b, (kind, size) in self.warm_targets(batches):
            out.append(self.model_step(kind, size))
            for s in dict.fromkeys([GREEDY, *specs]):
                step = SamplerStep(b, self.vocab, self.history_slots, s)
                name = f"sampler[B={b}{spec_tag(s)}]"
                if name not in seen:
                    seen.add(name)
                    out.append((name, SamplerProgram(step), {}, step))
        if not self.ragged:
            out.insert(0, self.model_step("prefill"))
        return out

    def model_step(self, kind: str, size: int = 1) -> tuple[str, Any, Any, StepSpec]:
        """``(name, key model, weight types, spec)`` of the model step of ``kind`` (prefill,
        decode of ``size`` rows, ragged of ``size`` token rows), as the compile cache keys it
        and :mod:`poot.api.compile_ahead`'s workers take it."""
        spec = self.step_spec(kind, size)
        name = f"prefill[{spec.tokens}]" if kind == "prefill" else \
            f"{kind}[{'T' if kind == 'ragged' else 'B'}={size}]"
        return name, self.model, self.weights.types, spec

    # ---- inputs -------------------------------------------------------------------------
    def _write(self, entry: Entry, values: dict[str, np.ndarray], force: set[str] = frozenset()
               ) -> dict[str, np.ndarray]:
        """The entries of ``values`` that differ from what was last written into ``entry``
        (and those in ``force``); remembers them."""
        st = self._written.setdefault(entry.id, _EntryState())
        out = {}
        for k, v in values.items():
            old = st.last.get(k)
            if k in force or old is None or old.shape != v.shape or not np.array_equal(old, v):
                out[k] = v
                st.last[k] = v.copy()
        return out

    def table_row(self, blocks: Sequence[int]) -> np.ndarray:
        """i32 [W]: ``blocks`` then the null block."""
        w = self.kv.table_width
        if len(blocks) > w:
            raise ValueError(f"{len(blocks)} blocks exceed the table width {w}")
        row = np.full(w, NULL_BLOCK, np.int32)
        row[:len(blocks)] = blocks
        return row

    def slot(self, blocks: Sequence[int], position: int) -> int:
        bs = self.kv.block_size
        return int(blocks[position // bs]) * bs + position % bs

    # ---- prefill ------------------------------------------------------------------------
    def prefill(self, blocks: Sequence[int], token_ids: Sequence[int], start: int,
                lora_slot: int = 0) -> int:
        """Write the K/V of ``token_ids`` at positions ``start..`` of the sequence holding
        ``blocks`` (issued in order on the device; returns the steps issued), under LoRA slot
        ``lora_slot`` when the model carries slots."""
        ids = list(token_ids)
        if not ids:
            return 0
        entry = self.prefill_entry()
        t = self.prefill_chunk
        table = self.table_row(blocks)[None, :]
        steps = 0
        for off in range(0, len(ids), t):
            chunk = ids[off:off + t]
            n = len(chunk)
            tokens = np.zeros((1, t), np.int32)
            positions = np.zeros((1, t), np.int32)
            slots = np.full(t, -1, np.int32)             # padding rows write nothing
            tokens[0, :n] = chunk
            pos = np.arange(start + off, start + off + n)
            positions[0, :n] = pos
            slots[:n] = [self.slot(blocks, int(p)) for p in pos]
            values = {"tokens": tokens, "positions": positions, "block_table": table,
                      "slot_mapping": slots}
            if "lora_index" in entry.input_names:
                values["lora_index"] = np.array([lora_slot], np.int32)
            ins = self._write(entry, values)
            self.session.submit(entry, ins, read=())
            steps += 1
        self.prefill_steps += steps
        return steps

    # ---- decode -------------------------------------------------------------------------
    def submit_decode(self, batch: DecodeBatch, spec: SamplerSpec,
                      masks: np.ndarray | None = None, lane: int = 0) -> DecodeHandle:
        """Issue one decode step over ``batch`` (padded to its bucket) and its sampler (spec
        ``spec``; it must cover every row's parameters): returns at once where the device
        queues work; :meth:`collect` waits for the sampled tokens. ``masks``: the rows'
        allowed-token masks when ``spec.guided`` (:meth:`submit_sampler`). ``lane``: the
        micro-batch (:meth:`decode_entry`)."""
        return self.submit_sampler(self.submit_model(batch, spec, lane), masks)

    def submit_model(self, batch: DecodeBatch, spec: SamplerSpec, lane: int = 0
                     ) -> DecodeHandle:
        """Issue the decode step's forward pass alone; its sampler follows with
        :meth:`submit_sampler` (a guided batch computes its masks on the host meanwhile)."""
        n = len(batch.positions)
        bsz = self.bucket(n)
        dec = self.decode_entry(bsz, lane)
        smp, spec = self.sampler_for(bsz, spec, lane)
        w, bs = self.kv.table_width, self.kv.block_size
        positions = np.zeros((bsz, 1), np.int32)
        table = np.full((bsz, w), NULL_BLOCK, np.int32)
        slots = np.full(bsz, -1, np.int32)
        pos = batch.positions
        positions[:n, 0] = pos
        table[:n] = batch.tables
        slots[:n] = table[np.arange(n), pos // bs] * bs + pos % bs
        values = {"positions": positions, "block_table": table, "slot_mapping": slots}
        if "lora_index" in dec.input_names:
            values["lora_index"] = slot_column(batch.lora_slots, n, bsz)
        st = self._written.setdefault(dec.id, _EntryState())
        if batch.tokens is not None:
            tokens = np.zeros((bsz, 1), np.int32)
            tokens[:n, 0] = batch.tokens
            values["tokens"] = tokens
        elif batch.feed is None and st.last.get("rowkeys") != batch.keys:
            raise ValueError("a batch without tokens whose rows are not the previous step's")
        dins = self._write(dec, values, force={"tokens"} if "tokens" in values else set())
        st.last["rowkeys"] = batch.keys
        sins = self._sampler_inputs(smp, batch, bsz, spec)
        self.session.submit(dec, dins, read=(),
                            feed=batch.feed.row_feed() if batch.feed is not None else None)
        self.decode_steps += 1
        return DecodeHandle(None, n, spec, _sampler_reads(spec), bsz, smp, sins)

    def submit_sampler(self, handle: DecodeHandle, masks: np.ndarray | None = None
                       ) -> DecodeHandle:
        """Issue the sampler of a step :meth:`submit_model` issued. ``masks``: i32 [n,
        mask_words(V)], row i's allowed tokens (:mod:`poot.engine.guided`), used when the
        sampler is a guided one; None (or idle rows): every token allowed."""
        if handle.submitted is not None:
            raise ValueError("the step's sampler was already issued")
        sins = handle.inputs
        if handle.spec.guided:
            full = np.full((handle.bucket, sampling.mask_words(self.vocab)), ALL_ALLOWED,
                           np.int32)
            if masks is not None:
                full[:handle.rows] = masks
            sins[sampling.INPUTS["allowed_tokens"]] = full
        handle.submitted = self.session.submit(handle.sampler, sins, read=handle.read)
        handle.inputs = {}
        return handle

    def _sampler_inputs(self, entry: Entry, batch: DecodeBatch, bsz: int,
                        spec: SamplerSpec) -> dict[str, np.ndarray]:
        st = self._written.setdefault(entry.id, _EntryState())
        n = len(batch.positions)
        out: dict[str, np.ndarray] = {}
        if st.last.get("rowkeys") != batch.keys:
            rows = list(batch.params) + [None] * (bsz - n)
            packed = SamplingParams.pack(rows, self.vocab, spec=spec)
            packed.pop(sampling.INPUTS["uniform"], None)          # per step, below
            packed.pop(sampling.INPUTS["allowed_tokens"], None)   # per step: submit_sampler
            out.update(packed)
            st.last["rowkeys"] = batch.keys
        if spec.stochastic:
            u = np.zeros(bsz, np.float32)
            u[:n] = batch.uniforms
            out[sampling.INPUTS["uniform"]] = u
        if spec.penalties:
            hr = np.full(bsz, self.history_slots - 1, np.int32)     # idle rows: scratch
            hr[:n] = batch.history_rows
            out.update(self._write(entry, {sampling.HISTORY_ROWS: hr}))
        return out

    def collect(self, handle: DecodeHandle) -> dict[str, np.ndarray]:
        """Wait for a decode step's sampled tokens (and log-probs): arrays of its rows."""
        out = self.session.collect(handle.submitted)
        return {k: v[:handle.rows] for k, v in out.items()}

    def reset_history(self, row: int, token_ids: Sequence[int] = ()) -> None:
        """Start token-history row ``row`` counting ``token_ids`` (a new sequence: none; a
        resumed one: its generated tokens). No-op until a penalties sampler exists."""
        name = sampling.INPUTS["token_counts"]
        if name not in self.session.state_names():
            return
        self.session.write_state_row(name, row, history_row(self.vocab, token_ids))

    def synchronize(self) -> None:
        self.session.device.synchronize()


__all__ = ["DecodeBatch", "DecodeHandle", "RaggedBatch", "TokenFeed", "GREEDY", "KVConfig",
           "ModelRunner", "RunnerBase", "mixed_ragged_buckets", "ragged_ladder", "ragged_token_buckets",
           "SamplerProgram", "decode_buckets", "sampler_spec_for", "smallest_bucket",
           "step_spec"]
