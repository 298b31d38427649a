"""A model's steps on an engine: the prefill and decode entries over one KV cache.

:class:`StepRunner` owns the :class:`~poot.executor.Engine` of one loaded model. Entries are
compiled lazily, once per shape:

* **prefill** ``StepSpec.prefill(T, outputs="hidden")``: writes T prompt tokens' K/V into the
  cache. The prompt is fed in chunks of a fixed T; the last chunk is padded with rows whose
  position is the capacity C, which the cache scatter drops (their outputs are ignored). No
  LM head runs during prefill.
* **decode** ``StepSpec.decode(sampler=spec)``: one token per sequence, the model step plus
  the on-device sampling suffix. The last prompt token goes through decode, so the first
  generated token is sampled on the device like every later one. One decode entry per
  :class:`~poot.graph.sampling.SamplerSpec` (features a request does not use are not traced;
  log-probs only when asked).

Carried state: the caches ``kv.{i}.k/v`` (aliases declared by ``Program.storage``) and the
token history ``sampling.token_counts`` (carried explicitly), shared by both entries.

Feedback: a decode entry copies its sampled token (``sampling.token`` i32 [B]) into its own
``tokens`` input (i32 [B, 1]) on the device at the end of every step (:data:`TOKEN_FEEDBACK`),
so the next decode step needs no host upload of the token (what lets the driver pipeline).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from poot.executor import Engine, Entry
from poot.graph import sampling
from poot.graph.sampling import SamplerSpec
from poot.models import StepSpec

HISTORY_CARRY = {sampling.OUTPUTS["history"]: sampling.INPUTS["token_counts"]}
#: The decode step's sampled token, copied on the device into its next token input.
TOKEN_FEEDBACK = {sampling.OUTPUTS["token"]: "tokens"}


def sampler_spec(params) -> SamplerSpec:
    """The smallest :class:`SamplerSpec` serving ``params`` (a greedy request traces no
    filters, penalties or bias)."""
    greedy = params.greedy
    return SamplerSpec(
        penalties=(params.repetition_penalty != 1.0 or params.presence_penalty != 0.0
                   or params.frequency_penalty != 0.0),
        logit_bias=bool(params.logit_bias),
        top_k=not greedy and params.top_k > 0,
        top_p=not greedy and params.top_p < 1.0,
        min_p=not greedy and params.min_p > 0.0,
        logprobs=params.logprobs,
        stochastic=not greedy)


def entry_name(spec: StepSpec) -> str:
    """A short name for an entry (``compile_s`` key, progress text): ``prefill``, ``decode``,
    or ``decode+top_k+top_p...`` naming the sampler features a decode entry traces."""
    s = spec.sampler
    if s is None:
        return spec.kind
    feats = (["sample"] if s.stochastic else []) + \
        [f for f in ("penalties", "logit_bias", "top_k", "top_p", "min_p") if getattr(s, f)] + \
        (["logprobs"] if s.logprobs is not None else [])
    return "+".join([spec.kind, *feats])


@dataclass
class StepRunner:
    """The engine-side half of a loaded model (see the module docstring).

    Attributes:
        model / weights: the family instance and its :class:`WeightBinding`.
        engine: the executor; compile: ``graph -> Program`` (cached compile for the target).
        kv_capacity: cache positions per sequence (C); prefill_chunk: prefill tokens per step.
        compile_s: seconds spent compiling (or fetching from the compile cache) per entry,
            keyed by :func:`entry_name` (``"prefill"``, ``"decode"``, ...).
        model_context: the model's trained context when known (how far kv_capacity may go).
        pipeline: whether the driver issues decode step n+1 before reading step n's token
            (:func:`poot.driver.generate.pipelining`): None = ``POOT_PIPELINE`` if set, else
            where the device overlaps host and device work (CUDA); True/False force it.
    """

    model: Any
    weights: Any
    engine: Engine
    compile: Callable[[Any], Any]
    kv_capacity: int
    prefill_chunk: int
    compile_s: dict[str, float] = field(default_factory=dict)
    _entries: dict[Any, Entry] = field(default_factory=dict)
    on_compile: Callable[[str], None] | None = None
    model_context: int | None = None   # the model's trained context (max kv_capacity)
    #: ``(spec, trace) -> Program`` replacing ``compile(trace())``: lets a compile cache find
    #: a step's program without tracing (``trace`` is called only on a miss).
    compile_step: Callable[[StepSpec, Callable[[], Any]], Any] | None = None
    pipeline: bool | None = None

    @property
    def vocab_size(self) -> int:
        return self.model.dims().vocab

    def _entry(self, key, spec: StepSpec, carry=None, feedback=None) -> Entry:
        e = self._entries.get(key)
        if e is None:
            label = entry_name(spec)
            if self.on_compile:
                self.on_compile(label)
            t0 = time.perf_counter()
            trace = lambda: self.model.trace(spec, self.weights.types)  # noqa: E731
            program = self.compile_step(spec, trace) if self.compile_step else \
                self.compile(trace())
            e = self._entries[key] = self.engine.add_entry(program, carry=carry,
                                                           feedback=feedback)
            self.compile_s[label] = time.perf_counter() - t0
        return e

    def prefill_spec(self) -> StepSpec:
        return StepSpec.prefill(min(self.prefill_chunk, self.kv_capacity),
                                kv_capacity=self.kv_capacity, outputs="hidden")

    def decode_spec(self, spec: SamplerSpec) -> StepSpec:
        return StepSpec.decode(kv_capacity=self.kv_capacity, sampler=spec)

    def prefill_entry(self) -> Entry:
        spec = self.prefill_spec()
        return self._entry(("prefill", spec.tokens), spec)

    def decode_entry(self, spec: SamplerSpec) -> Entry:
        return self._entry(("decode", spec), self.decode_spec(spec), carry=HISTORY_CARRY,
                           feedback=TOKEN_FEEDBACK)

    def prefill(self, ids, start: int = 0, slot: int = 0) -> int:
        """Write the K/V of ``ids`` at positions ``start..`` of ``slot``; returns the number
        of prefill steps run (0 for no ids)."""
        ids = list(ids)
        if not ids:
            return 0
        entry = self.prefill_entry()
        t = next(a.type.shape[1] for a in entry.kernel.args
                 if a.role == "input" and a.name == "tokens")
        steps = 0
        for off in range(0, len(ids), t):
            chunk = ids[off:off + t]
            tokens = np.zeros((1, t), np.int32)
            positions = np.full((1, t), self.kv_capacity, np.int32)  # padding rows: dropped
            tokens[0, :len(chunk)] = chunk
            positions[0, :len(chunk)] = np.arange(start + off, start + off + len(chunk))
            self.engine.step(entry, {"tokens": tokens, "positions": positions,
                                     "slots": np.array([slot], np.int32)}, read=())
            steps += 1
        return steps

    def warm_up(self, spec: SamplerSpec | None = None, prefill: bool = True) -> None:
        """Compile the entries a request of ``spec`` needs (greedy by default)."""
        if prefill:
            self.prefill_entry()
        self.decode_entry(spec or GREEDY)


#: The sampler of a greedy request with no penalties, bias or filters (what ``warm_up``
#: compiles and ``poot bench`` runs).
GREEDY = SamplerSpec(penalties=False, logit_bias=False, top_k=False, top_p=False, min_p=False,
                     stochastic=False)
