"""Per-request sampling parameters: validation, and packing into the sampling step's inputs.

A request's :class:`SamplingParams` is validated when it is made (every range check that needs
no model) and against the model's vocabulary when it is admitted (:meth:`SamplingParams.check`).
A violation is an :class:`InvalidRequest` naming the field and the bad value.

The device side is :mod:`poot.graph.sampling`. Per-slot parameters are written into the slot
buffers when a request enters a slot (:meth:`SamplingParams.pack`); the only value that changes
per step is the uniform number ``u`` each sequence draws from its own seeded generator
(:class:`UniformStream`), so a seeded request samples the same tokens whatever batch it shares.

A request's output constraint (guided decoding) is a :class:`Guide`: data checked here,
compiled against the model's tokenizer by :mod:`poot.engine.guided`.
"""

from __future__ import annotations

import json
import math
import numbers
from dataclasses import dataclass, field, fields
from typing import Any, Mapping, Sequence

import numpy as np

from poot.errors import PootError
from poot.graph.sampling import GREEDY_EPS, INPUTS, SamplerSpec, input_type

MAX_LOGPROBS = 20          # OpenAI's top_logprobs bound
LOGIT_BIAS_RANGE = 100.0   # OpenAI: bias values in [-100, 100]
#: the largest finite f32: every real sampling parameter reaches the sampling step as f32
F32_MAX = float(np.finfo(np.float32).max)
PENALTY_RANGE = 2.0        # OpenAI: presence/frequency penalties in [-2, 2]
#: repetition_penalty r in [2^-64, 2^64]: the sampler divides a seen token's positive logit
#: by r (multiplies a negative one), then by the temperature (>= GREEDY_EPS > 2^-17), which
#: stays finite in f32 (< 2^109) for any logit below 2^28 in magnitude; far past the bounds a
#: logit becomes inf and the distribution NaN (token 0)
REPETITION_PENALTY_RANGE = (2.0 ** -64, 2.0 ** 64)
#: the smallest normal f32: devices flush smaller magnitudes (subnormals) to 0
F32_TINY = float(np.finfo(np.float32).tiny)
#: the most characters (code points) one request's stop strings may total. Real stop
#: sequences are a few characters (OpenAI takes 4 of them); the matcher holds back up to the
#: longest one's length - 1 characters of streamed text and keeps one int per character.
MAX_STOP_CHARS = 4096


class InvalidRequest(PootError):
    """A request parameter outside its domain.

    Attributes:
        field: the parameter's name (``"top_p"``, ``"logit_bias[50000]"``, ...).
        value: the offending value.
        reason: what the value must be.
    """

    def __init__(self, field: str, value: Any, reason: str):
        self.field, self.value, self.reason = field, value, reason
        super().__init__(f"invalid request: {field}={value!r}: {reason}")


# ---- guided decoding: a request's output constraint (compiled in poot.engine.guided) ---

#: Guide kinds.
GUIDE_KINDS = ("json_object", "json_schema", "regex", "grammar")
#: The largest schema, pattern or grammar accepted (bytes of its text).
MAX_GUIDE_BYTES = 1 << 20


class GuidedDecodingError(InvalidRequest):
    """A constraint that cannot be honored: malformed (bad JSON schema, regex or grammar) or
    using a feature llguidance does not support; ``reason`` names it (one line)."""

    def __init__(self, field: str, value, reason: str):
        super().__init__(field, value, _one_line(reason))


def _one_line(text: str) -> str:
    """llguidance's multi-line parse messages (source excerpts, caret markers) as one line."""
    lines = [ln.strip() for ln in str(text).splitlines()]
    keep = [ln for ln in lines if ln and not set(ln) <= set("^|~ 0123456789")]
    return "; ".join(keep)


@dataclass(frozen=True)
class Guide:
    """One request's output constraint, as data: checked here (kind, JSON, size), compiled
    against a tokenizer when the request is added (:class:`poot.engine.guided.GuidedCompiler`).

    Attributes:
        kind: ``"json_object"`` (any JSON object), ``"json_schema"`` (``spec``: the schema,
            a dict or its JSON text), ``"regex"`` (``spec``: the pattern, Rust regex syntax),
            ``"grammar"`` (``spec``: a Lark or GBNF grammar; GBNF when it uses ``::=``).
        spec: as above (None for json_object).
    """

    kind: str
    spec: Any = None

    def __post_init__(self):
        if self.kind not in GUIDE_KINDS:
            raise GuidedDecodingError("guided", self.kind, f"kind must be one of "
                                      f"{', '.join(GUIDE_KINDS)}")
        if self.kind == "json_object":
            return
        spec = self.spec
        if self.kind == "json_schema":
            if isinstance(spec, str):
                try:
                    spec = json.loads(spec)
                except json.JSONDecodeError as e:
                    raise GuidedDecodingError("json_schema", spec[:60],
                                              f"is not valid JSON ({e.msg} at {e.pos})") \
                        from None
            if not isinstance(spec, (Mapping, bool)):
                raise GuidedDecodingError("json_schema", str(spec)[:60],
                                          "must be a JSON object (or true/false)")
            text = json.dumps(spec)   # key order kept: llguidance emits properties in it
            object.__setattr__(self, "spec", json.loads(text))
        elif not isinstance(spec, str) or not spec:
            raise GuidedDecodingError(self.kind, spec, "must be a non-empty string")
        else:
            text = spec
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError as e:
            raise GuidedDecodingError(self.kind, short_spec(text.encode("utf-8", "replace")
                                                            .decode()),
                                      f"is not valid Unicode: a lone surrogate "
                                      f"U+{ord(text[e.start]):04X} at character {e.start}") \
                from None
        if size > MAX_GUIDE_BYTES:
            raise GuidedDecodingError(self.kind, f"{len(text)} characters",
                                      f"exceeds {MAX_GUIDE_BYTES} bytes")

    @staticmethod
    def json_object() -> "Guide":
        return Guide("json_object")

    @staticmethod
    def json_schema(schema: Mapping | str) -> "Guide":
        return Guide("json_schema", schema)

    @staticmethod
    def regex(pattern: str) -> "Guide":
        return Guide("regex", pattern)

    @staticmethod
    def grammar(text: str) -> "Guide":
        return Guide("grammar", text)


def short_spec(spec) -> str:
    """``spec`` (a pattern, a grammar, a schema) as at most 60 characters of text, for
    messages."""
    text = spec if isinstance(spec, str) else json.dumps(spec)
    return text if len(text) <= 60 else text[:57] + "..."


def _real(name: str, v, lo: float | None = None, hi: float | None = None,
          lo_open: bool = False, why: str = "") -> float:
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise InvalidRequest(name, v, "must be a number")
    f = float(v)
    if not math.isfinite(f) or abs(f) > F32_MAX:    # the sampler takes its parameters as f32
        raise InvalidRequest(name, v, f"must be finite as a 32-bit float (|x| <= {F32_MAX:.4g})")
    rng = ("(" if lo_open else "[") + f"{lo:.6g}, " if lo is not None else "(-inf, "
    rng += f"{hi:.6g}]" if hi is not None else "inf)"
    if not _in_range(f, lo, hi, lo_open):
        raise InvalidRequest(name, v, f"must be in {rng}{why}")
    d = device_f32(f)
    if not _in_range(d, lo, hi, lo_open):
        raise InvalidRequest(name, v, f"must be in {rng} as a 32-bit float on the device, "
                                      f"where it is {d:.9g} (nonzero magnitudes below "
                                      f"{F32_TINY:.4g} flush to 0)")
    return f


def _in_range(x: float, lo: float | None, hi: float | None, lo_open: bool) -> bool:
    return (lo is None or (x > lo if lo_open else x >= lo)) and (hi is None or x <= hi)


def device_f32(x: float) -> float:
    """``x`` as the sampling step sees it: rounded to f32, and 0 where that is subnormal
    (devices flush subnormals to zero). ``x`` must be finite and within f32's range."""
    d = float(np.float32(x))
    return 0.0 if abs(d) < F32_TINY else d


def _int(name: str, v, lo: int | None = None, hi: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise InvalidRequest(name, v, "must be an integer")
    i = int(v)
    if lo is not None and i < lo:
        raise InvalidRequest(name, v, f"must be >= {lo}" if hi is None else
                             f"must be in [{lo}, {hi}]")
    if hi is not None and i > hi:
        raise InvalidRequest(name, v, f"must be in [{lo}, {hi}]" if lo is not None else
                             f"must be <= {hi}")
    return i


@dataclass(frozen=True)
class SamplingParams:
    """How one request samples (vLLM / OpenAI semantics; see :mod:`poot.graph.sampling`).

    Attributes:
        temperature: >= 0; below ``GREEDY_EPS`` (1e-5) the request is greedy.
        top_k: keep the k most likely tokens; ``<= 0`` is off, and a k of the vocabulary's
            size or more keeps every token (it is packed as the vocabulary size, so any
            integer is served).
        top_p: nucleus mass in (0, 1]; 1 is off.
        min_p: keep tokens with ``p >= min_p * max(p)``, in [0, 1]; 0 is off.
        repetition_penalty: in [2^-64, 2^64] (HF/CTRL; 1 is off; bounded so a penalized
            logit stays finite in f32), for tokens in the history.
        presence_penalty / frequency_penalty: in [-2, 2], subtracted once / per occurrence.
        logit_bias: token id -> bias in [-100, 100], added to the logits (JSON string keys are
            accepted and converted).
        seed: the request's generator seed (an int in [0, 2^64)); ``None``: fresh entropy.
        max_tokens: >= 1 generated tokens at most.
        stop: stop strings (one string or a sequence; none empty; at most
            :data:`MAX_STOP_CHARS` characters in all); the matched stop string is not part
            of the output.
        stop_token_ids: token ids that end generation.
        logprobs: ``None``: no log-probs; ``n`` in [0, 20]: the chosen token's log-prob and the
            top ``n`` alternatives.
        ignore_eos: keep generating past the tokenizer's EOS / end-of-turn ids
            (``stop_token_ids`` still stop).
        detokenize: produce text (False: token ids only, as vLLM's ``detokenize``; stop
            strings then cannot be used).
        guided: a :class:`Guide` (a JSON schema, any JSON object, a
            regular expression or a grammar the output must match; a mapping
            ``{"kind": ..., "spec": ...}`` is converted), or None. The request ends when the
            constraint is complete and the model emits EOS (so not with ``ignore_eos``).
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    seed: int | None = None
    max_tokens: int = 16
    stop: Sequence[str] = ()
    stop_token_ids: Sequence[int] = ()
    logprobs: int | None = None
    ignore_eos: bool = False
    detokenize: bool = True
    guided: Any = None

    def __post_init__(self):
        put = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731  (frozen)
        put("temperature", _real("temperature", self.temperature, 0.0))
        put("top_k", _int("top_k", self.top_k))
        put("top_p", _real("top_p", self.top_p, 0.0, 1.0, lo_open=True))
        put("min_p", _real("min_p", self.min_p, 0.0, 1.0))
        put("repetition_penalty", _real("repetition_penalty", self.repetition_penalty,
                                        *REPETITION_PENALTY_RANGE,
                                        why=" (2^-64 to 2^64: a seen token's logit divided "
                                            "or multiplied by it, then by the temperature, "
                                            "must stay a finite 32-bit float)"))
        put("presence_penalty", _real("presence_penalty", self.presence_penalty,
                                      -PENALTY_RANGE, PENALTY_RANGE))
        put("frequency_penalty", _real("frequency_penalty", self.frequency_penalty,
                                       -PENALTY_RANGE, PENALTY_RANGE))
        if not isinstance(self.logit_bias, Mapping):
            raise InvalidRequest("logit_bias", self.logit_bias, "must be a mapping id -> bias")
        bias = {}
        for key, v in self.logit_bias.items():
            tid = key
            if isinstance(key, str):
                try:
                    tid = int(key)
                except ValueError:
                    raise InvalidRequest("logit_bias", key, "keys must be token ids") from None
            tid = _int("logit_bias", tid, 0)
            bias[tid] = _real(f"logit_bias[{tid}]", v, -LOGIT_BIAS_RANGE, LOGIT_BIAS_RANGE)
        put("logit_bias", bias)
        if self.seed is not None:
            put("seed", _int("seed", self.seed, 0, 2 ** 64 - 1))
        put("max_tokens", _int("max_tokens", self.max_tokens, 1))
        stop = self.stop
        if stop is None:
            stop = ()
        if isinstance(stop, str):
            stop = (stop,)
        if not isinstance(stop, Sequence):
            raise InvalidRequest("stop", stop, "must be a string or a list of strings")
        for s in stop:
            if not isinstance(s, str) or not s:
                raise InvalidRequest("stop", s, "stop strings must be non-empty strings")
        total = sum(len(s) for s in stop)
        if total > MAX_STOP_CHARS:
            raise InvalidRequest("stop", f"<{total} characters>", f"the stop strings may "
                                 f"total at most {MAX_STOP_CHARS} characters")
        put("stop", tuple(stop))
        ids = self.stop_token_ids
        if ids is None:
            ids = ()
        if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
            raise InvalidRequest("stop_token_ids", ids, "must be a list of token ids")
        put("stop_token_ids", tuple(_int("stop_token_ids", i, 0) for i in ids))
        if self.logprobs is not None:
            put("logprobs", _int("logprobs", self.logprobs, 0, MAX_LOGPROBS))
        if not isinstance(self.ignore_eos, bool):
            raise InvalidRequest("ignore_eos", self.ignore_eos, "must be a boolean")
        if not isinstance(self.detokenize, bool):
            raise InvalidRequest("detokenize", self.detokenize, "must be a boolean")
        if self.stop and not self.detokenize:
            raise InvalidRequest("stop", list(self.stop), "stop strings need detokenize=True")
        if self.guided is not None:
            g = self.guided
            if isinstance(g, Mapping):
                unknown = set(g) - {"kind", "spec"}
                if unknown or "kind" not in g:
                    raise InvalidRequest("guided", dict(g), "must be a Guide or a mapping with "
                                         "'kind' and, but for json_object, 'spec'")
                g = Guide(g["kind"], g.get("spec"))
            if not isinstance(g, Guide):
                raise InvalidRequest("guided", g, "must be a poot.Guide")
            put("guided", g)
            if self.ignore_eos:
                raise InvalidRequest("ignore_eos", True, "a constrained (guided) request ends "
                                     "at EOS when its constraint is complete")

    # ---- construction and checks -------------------------------------------------------------
    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "SamplingParams":
        """From a request body's fields (``null`` means the default); an unknown field is an
        :class:`InvalidRequest`."""
        names = {f.name for f in fields(cls)}
        for k in d:
            if k not in names:
                raise InvalidRequest(str(k), d[k], "unknown sampling parameter")
        return cls(**{k: v for k, v in d.items() if v is not None})

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_EPS

    def check(self, vocab_size: int) -> "SamplingParams":
        """Validate the token ids against a vocabulary of ``vocab_size``; returns ``self``."""
        for tid in self.logit_bias:
            if tid >= vocab_size:
                raise InvalidRequest("logit_bias", tid,
                                     f"token id out of the vocabulary [0, {vocab_size})")
        for tid in self.stop_token_ids:
            if tid >= vocab_size:
                raise InvalidRequest("stop_token_ids", tid,
                                     f"token id out of the vocabulary [0, {vocab_size})")
        return self

    def uniforms(self) -> "UniformStream":
        """A fresh per-sequence generator of the step's ``u`` (seeded by :attr:`seed`)."""
        return UniformStream(self.seed)

    # ---- packing -----------------------------------------------------------------------------
    def _row(self, role: str):
        return {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p,
                "min_p": self.min_p, "repetition_penalty": self.repetition_penalty,
                "presence_penalty": self.presence_penalty,
                "frequency_penalty": self.frequency_penalty}[role]

    @staticmethod
    def pack(batch: Sequence["SamplingParams | None"], vocab_size: int,
             uniforms: Sequence["UniformStream | None"] | None = None,
             spec: SamplerSpec | None = None) -> dict[str, np.ndarray]:
        """The sampling step's inputs for a batch of slots, by input name
        (:data:`poot.graph.sampling.INPUTS`), for the inputs ``spec`` declares.

        ``None`` is an empty slot: greedy, no bias. The per-slot parameters and the logit bias
        are written when a request enters its slot; ``uniforms`` (one stream per slot) draws
        this step's ``u`` and is the only per-step part (without it ``u`` is 0); a guided
        spec's ``allowed_tokens`` mask is packed allowing every token (the engine writes each
        constrained row's mask every step). The token
        history (``token_counts``) is device-resident and is not packed here
        (:func:`history_row` makes a row to start a slot with).
        """
        spec = spec or SamplerSpec()
        B, V = len(batch), vocab_size
        out: dict[str, np.ndarray] = {}
        empty = SamplingParams(temperature=0.0)
        for role in spec.input_roles():
            if role == "token_counts":
                continue
            t = input_type(role, B, V)
            a = np.zeros(t.shape, t.dtype.numpy)
            if role == "uniform":
                if uniforms is not None:
                    if len(uniforms) != B:
                        raise ValueError(f"{len(uniforms)} uniform streams for {B} slots")
                    a[:] = [0.0 if s is None else s.next() for s in uniforms]
            elif role == "allowed_tokens":
                a[:] = (1 << 16) - 1            # every token allowed (poot.engine.guided)
            elif role == "logit_bias":
                for i, p in enumerate(batch):
                    if p is not None:
                        p.check(V)
                        for tid, v in p.logit_bias.items():
                            a[i, tid] = v
            elif role == "top_k":       # k >= V keeps every token: V fits the i32 input
                a[:] = [min((empty if p is None else p).top_k, V) for p in batch]
            else:
                a[:] = [(empty if p is None else p)._row(role) for p in batch]
            out[INPUTS[role]] = a
        return out


def history_row(vocab_size: int, token_ids: Sequence[int] = ()) -> np.ndarray:
    """i32 [V]: a slot's starting token history, counting ``token_ids`` (the tokens the
    penalties should see before the first generated one; OpenAI counts generated tokens only,
    so by default none)."""
    return np.bincount(np.asarray(token_ids, dtype=np.int64),
                       minlength=vocab_size)[:vocab_size].astype(np.int32)


class UniformStream:
    """One sequence's stream of uniform numbers in ``[0, 1)``, one per step.

    ``numpy.random.Generator(PCG64(seed)).random(dtype=float32)``: reproducible for a seed,
    independent of the batch and the backend (the host draws it; only the f32 crosses to the
    device). ``seed=None`` draws fresh OS entropy. The generator is made at the first draw:
    a greedy request never draws, and making one (with OS entropy) costs about as much as
    the rest of admitting a request.
    """

    def __init__(self, seed: int | None):
        self.seed = seed
        self._gen: np.random.Generator | None = None
        self._ahead: list[np.float32] = []      # drawn by peek, not yet consumed

    def _draw(self) -> np.float32:
        if self._gen is None:
            self._gen = np.random.Generator(np.random.PCG64(self.seed))
        return self._gen.random(dtype=np.float32)

    def next(self) -> np.float32:
        if self._ahead:
            return self._ahead.pop(0)
        return self._draw()

    def peek(self, n: int) -> list[np.float32]:
        """The next ``n`` numbers without consuming them (a speculative step samples
        several tokens of one sequence; :meth:`advance` consumes those it kept)."""
        while len(self._ahead) < n:
            self._ahead.append(self._draw())
        return self._ahead[:n]

    def advance(self, n: int) -> None:
        """Consume ``n`` numbers (as ``n`` calls of :meth:`next`)."""
        for _ in range(n):
            self.next()
