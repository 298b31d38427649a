"""On-device sampling: the suffix of the decode graph that turns logits into token ids.

Generation picks the next token on the device for every request (docs/architecture.md): the
sampling step is appended to the decode graph and the host reads back only the chosen ids
(plus a non-finite flag, and top-n log-probs when a request asks). Everything here is a
composition of primitive ops; there is no sampling primitive and no sort.

    b = Builder(limits)
    logits = ...                                   # f32 [B, V] from the LM head
    si = declare_inputs(b, batch=B, vocab=V)       # the per-slot step inputs, named INPUTS[*]
    r = sample(b, logits, si, SamplerSpec(logprobs=5))
    graph = b.finish({"token": r.token, "token_counts": r.history, ...}) # or r.outputs()

The pipeline (vLLM v1 order, OpenAI semantics for the penalties):

0. guided decoding (:attr:`SamplerSpec.guided`): ``logits = allowed ? logits : -inf`` from the
   packed ``allowed_tokens`` bitmask, so every rule below (and the log-probs) sees only the
   tokens the row's constraint allows; an unconstrained row's mask allows every token.
1. ``x = logits + logit_bias``                               (f32 [B, V], host-packed per slot)
2. penalties from the device-resident history ``counts`` (i32 [B, V]):
   repetition (HF/CTRL): where ``count > 0``: ``x > 0 ? x / r : x * r``;
   frequency: ``x -= f * count``; presence: ``x -= p * (count > 0)``.
3. greedy (``temperature < GREEDY_EPS``): argmax of ``x``, lowest id wins ties.
4. otherwise ``p = softmax(x / T)``; the kept set is ``p >= t`` for one per-row threshold
   ``t = min(max(t_minp, t_topk, t_topp), max(p))`` (the most likely token is always kept):
   min-p ``t_minp = min_p * max(p)``; top-k ``t_topk`` = the k-th largest ``p`` (k <= 0 or
   k >= V: off); top-p ``t_topp`` = the largest ``t >= t_1`` whose mass ``sum(p[p >= t])``
   is still ``>= top_p * sum(p[p >= t_1])``, ``t_1 = max(t_minp, t_topk)`` (top-p acts on the
   distribution renormalized after min-p and top-k; ``top_p >= 1``: off).
5. inverse-CDF: ``w = p * kept``, the chosen id is the smallest ``i`` with
   ``sum(w[:i+1]) > u * sum(w)`` (CDF in token-id order; any fixed order gives the same
   distribution). Zero-mass tokens can never be chosen (the inequality is strict).
6. ``counts[b, chosen[b]] += 1`` (a one-hot add) is returned as the updated history.

Thresholds without a sort: the k-th largest value, and the top-p cut, are each found as "the
largest float ``t`` with ``pred(t)``" for a predicate monotone in ``t`` (a count, a mass). A
plain bisection on value cannot separate neighbouring floats near 0 in a fixed number of steps
(resolving ``2^-149`` from a ``[0, 1]`` bracket takes ~173 halvings). Instead the search is done
in two exact stages, emulating a bisection over the float bit pattern (there is no bitcast op):

* stage 1, 8 steps: bisection over the binade index ``j in [0, 150]`` with thresholds
  ``2^-j`` read from a 151-entry constant table by ``gather`` (entry 150 is 0). It finds the
  binade ``[2^-j, 2^(1-j))`` holding the answer. ``ceil(log2 151) = 8``.
* stage 2, 23 steps: bisection on value inside that binade. Floats there are evenly spaced
  (2^23 steps of one ulp; fewer in the subnormal range), and the f32 midpoint ``(lo+hi)/2`` is
  exact while the bracket is a power-of-two number of ulps, so after 23 halvings ``hi - lo`` is
  one ulp and ``lo`` is *exactly* the largest float satisfying ``pred``.

So the threshold equals the sort-based one bit for bit: the kept set is the sort-based set
except at exact ties of ``p`` at the cut (the threshold form keeps every tied token, a sort keeps
some of them). Mass comparisons use the graph's reductions (f32 results; the oracle accumulates
in f64), so a top-p cut within rounding of ``top_p * mass`` is decided by that rounding.
Cost: 31 steps of one [B, V] compare + reduce per search (two searches). A device that flushes
subnormals to zero decides cuts below ``2^-126`` differently, but there every ``p`` it compares
is 0 as well, so no sampled token changes.

The cumulative sum for inverse-CDF: an upper-triangular matmul is O(V^2) (V = 49152: 2.4e9
multiply-adds and a 9.6 GB constant), so the index is found by bisection on the token index:
``ceil(log2 V)`` steps (16 for V = 49152), each one masked [B, V] sum ``sum(w[iota <= mid])``
compared with ``u * W``: O(V log V) work, no constant, and the prefix sums it compares are
plain reductions (what the reference computes, up to summation order).

The random number: the host draws ``u`` in ``[0, 1)`` per sequence per step from a generator
seeded by the request (``poot.sampling_params``) and writes it into the slot's ``uniform`` buffer.
That keeps a seeded request reproducible whatever batch it shares and whichever backend runs it,
needs no PRNG state or integer bit ops on the device (the dialect has no xor/shift), and costs
one f32 per sequence per step across the bus.

Log-probs (a trace-time choice, :attr:`SamplerSpec.logprobs`): the log-softmax of the raw
model logits (before bias/penalties/temperature, as vLLM's default "raw" log-probs; after the
guided mask: a disallowed token's log-prob is -inf), the chosen
token's log-prob, and the top-n values/ids found by ``n`` iterated max passes (lowest id first
at ties).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from poot.dialects.types import DType, TensorType
from poot.graph.builder import Builder, BuilderError, Graph, Tensor, TraceLimits

GREEDY_EPS = 1e-5
"""A row with ``temperature < GREEDY_EPS`` is sampled greedily (vLLM's ``_SAMPLING_EPS``)."""

#: Step-input names, by role. Per-slot parameters are f32/i32 [B]; bias and counts are [B, V].
INPUTS = {
    "temperature": "sampling.temperature",
    "top_k": "sampling.top_k",
    "top_p": "sampling.top_p",
    "min_p": "sampling.min_p",
    "repetition_penalty": "sampling.repetition_penalty",
    "presence_penalty": "sampling.presence_penalty",
    "frequency_penalty": "sampling.frequency_penalty",
    "uniform": "sampling.uniform",
    "logit_bias": "sampling.logit_bias",
    "token_counts": "sampling.token_counts",
    "allowed_tokens": "sampling.allowed_tokens",
}

#: Output names used by :meth:`SampleResult.outputs`.
OUTPUTS = {
    "token": "sampling.token",
    "history": "sampling.token_counts_out",
    "nonfinite": "sampling.nonfinite",
    "logprob": "sampling.logprob",
    "top_logprobs": "sampling.top_logprobs",
    "top_ids": "sampling.top_ids",
}

_I32 = {"top_k"}
_BV = {"logit_bias": DType.F32, "token_counts": DType.I32}

#: Bits of a word of the ``allowed_tokens`` mask: 16, so a word is never negative and unpacks
#: with integer division alone (the dialect has no bitwise ops).
MASK_BITS = 16


def mask_words(vocab: int) -> int:
    """Words of one row of the ``allowed_tokens`` mask: ``ceil(vocab / 16)``."""
    return -(-vocab // MASK_BITS)

STAGE1_STEPS = 8    # ceil(log2(151)): binade index 0..150
STAGE2_STEPS = 23   # f32 mantissa bits: ulps in one binade = 2^23


@dataclass(frozen=True)
class SamplerSpec:
    """Trace-time shape of the sampling suffix. Features switched off are not traced and
    their inputs are not declared (a batch that never uses them gets a smaller graph).

    Attributes:
        penalties: repetition/presence/frequency from ``token_counts`` (the history input
            and output exist either way: the history is always updated).
        logit_bias: add the ``logit_bias`` [B, V] input.
        top_k / top_p / min_p: the filters.
        stochastic: draw from the temperature distribution (the ``temperature`` and
            ``uniform`` inputs, the filters); off, every row is greedy (argmax only: a
            greedy request traces no distribution, no inverse-CDF search over the vocabulary).
        logprobs: ``None``: no log-prob outputs; ``n >= 0``: the chosen token's log-prob and
            the top-``n`` log-probs with their ids.
        guided: the ``allowed_tokens`` input, a packed bitmask i32 [B, ceil(V / 16)] (token
            ``t`` allowed when bit ``t % 16`` of word ``t // 16`` is set): every disallowed
            logit is -inf before any other rule, log-probs included (guided decoding,
            :mod:`poot.engine.guided`). A row with every bit set is unconstrained.
    """

    penalties: bool = True
    logit_bias: bool = True
    top_k: bool = True
    top_p: bool = True
    min_p: bool = True
    logprobs: int | None = None
    stochastic: bool = True
    guided: bool = False

    def __post_init__(self):
        if self.logprobs is not None and (not isinstance(self.logprobs, int)
                                          or isinstance(self.logprobs, bool)
                                          or self.logprobs < 0):
            raise BuilderError(f"SamplerSpec.logprobs must be None or an int >= 0, got "
                               f"{self.logprobs!r}")

    def input_roles(self) -> list[str]:
        roles = ["temperature"] if self.stochastic else []
        roles += [r for r, on in (("top_k", self.top_k), ("top_p", self.top_p),
                                  ("min_p", self.min_p)) if on and self.stochastic]
        if self.penalties:
            roles += ["repetition_penalty", "presence_penalty", "frequency_penalty"]
        if self.stochastic:
            roles.append("uniform")
        if self.logit_bias:
            roles.append("logit_bias")
        roles.append("token_counts")
        if self.guided:
            roles.append("allowed_tokens")
        return roles


#: The sampler of greedy requests with no penalties, bias, filters or log-probs.
GREEDY = SamplerSpec(penalties=False, logit_bias=False, top_k=False, top_p=False, min_p=False,
                     stochastic=False)
#: Every feature but log-probs and guided decoding: serves any request without them (a feature
#: a row does not use is neutral: top_k 0, top_p 1, min_p 0, penalties 1/0/0, bias 0).
FULL = SamplerSpec(penalties=True, logit_bias=True, top_k=True, top_p=True, min_p=True,
                   logprobs=None, stochastic=True)


def covers(a: SamplerSpec, b: SamplerSpec) -> bool:
    """Whether a sampler traced for ``a`` serves every request ``b`` serves, with the same
    tokens: every feature of ``b`` is in ``a`` (a feature a row does not use is neutral), and
    ``a`` has at least ``b``'s log-prob width."""
    feats = ("penalties", "logit_bias", "top_k", "top_p", "min_p", "stochastic", "guided")
    if any(getattr(b, f) and not getattr(a, f) for f in feats):
        return False
    return b.logprobs is None or (a.logprobs is not None and a.logprobs >= b.logprobs)


@dataclass
class SamplingInputs:
    """Handles of the sampling step inputs (``None`` for a feature that is not traced)."""

    token_counts: Tensor
    temperature: Tensor | None = None
    uniform: Tensor | None = None
    top_k: Tensor | None = None
    top_p: Tensor | None = None
    min_p: Tensor | None = None
    repetition_penalty: Tensor | None = None
    presence_penalty: Tensor | None = None
    frequency_penalty: Tensor | None = None
    logit_bias: Tensor | None = None
    allowed_tokens: Tensor | None = None


def input_type(role: str, batch: int, vocab: int) -> TensorType:
    """The type of the step input playing ``role`` (a key of :data:`INPUTS`)."""
    if role == "allowed_tokens":
        return TensorType((batch, mask_words(vocab)), DType.I32)
    if role in _BV:
        return TensorType((batch, vocab), _BV[role])
    return TensorType((batch,), DType.I32 if role in _I32 else DType.F32)


def declare_inputs(b: Builder, batch: int, vocab: int,
                   spec: SamplerSpec | None = None) -> SamplingInputs:
    """Declare the step inputs ``spec`` needs, named by :data:`INPUTS`."""
    spec = spec or SamplerSpec()
    handles = {role: b.input(INPUTS[role], input_type(role, batch, vocab))
               for role in spec.input_roles()}
    return SamplingInputs(**handles)


@dataclass
class SampleResult:
    """The sampling suffix's values.

    Attributes:
        token: i32 [B], the chosen ids.
        history: i32 [B, V], ``token_counts`` with each row's chosen id counted once more.
        nonfinite: i1 [B], the row's raw logits hold a NaN or an infinity.
        logprob: f32 [B] log-prob of the chosen id (``spec.logprobs`` set).
        top_logprobs / top_ids: f32 / i32 [B, n] (``spec.logprobs = n``).
    """

    token: Tensor
    history: Tensor
    nonfinite: Tensor
    logprob: Tensor | None = None
    top_logprobs: Tensor | None = None
    top_ids: Tensor | None = None

    def outputs(self) -> dict[str, Tensor]:
        """The non-empty values by their :data:`OUTPUTS` names (for ``Builder.finish``)."""
        out = {}
        for role, name in OUTPUTS.items():
            v = getattr(self, role)
            if v is not None and not (role in ("top_logprobs", "top_ids") and v.shape[1] == 0):
                out[name] = v
        return out


class _K:
    """Per-call cache of scalar literals, so a constant is emitted once."""

    def __init__(self, b: Builder):
        self.b = b
        self._c: dict[tuple, Tensor] = {}

    def __call__(self, value, dtype: DType = DType.F32) -> Tensor:
        key = (float(value) if dtype.is_float else int(value), dtype)
        if key not in self._c:
            self._c[key] = self.b.scalar(value, dtype)
        return self._c[key]

    def full(self, shape, value, dtype: DType = DType.F32) -> Tensor:
        """A cached broadcast of ``value`` to ``shape``."""
        key = ("full", tuple(shape), float(value) if dtype.is_float else int(value), dtype)
        if key not in self._c:
            self._c[key] = self.b.broadcast_to(self(value, dtype), tuple(shape))
        return self._c[key]

    def iota(self, shape) -> Tensor:
        """A cached i32 iota along the last axis of ``shape``."""
        key = ("iota", tuple(shape))
        if key not in self._c:
            self._c[key] = self.b.iota(tuple(shape), len(shape) - 1)
        return self._c[key]

    def pow2_table(self) -> Tensor:
        """f32 [151]: ``2^-j`` for ``j = 0..149`` (149: the least subnormal), then 0."""
        if ("pow2",) not in self._c:
            table = np.array([2.0 ** -j for j in range(150)] + [0.0], dtype=np.float32)
            assert table[149] > 0 and table[148] == 2 * table[149]
            self._c[("pow2",)] = self.b.constant(table)
        return self._c[("pow2",)]


def _col(b: Builder, x: Tensor) -> Tensor:
    """[B] -> [B, 1]"""
    return b.reshape(x, [x.shape[0], 1])


def _check(logits: Tensor, si: SamplingInputs) -> tuple[int, int]:
    if logits.rank != 2 or logits.dtype is not DType.F32:
        raise BuilderError(f"sample: logits must be f32 [B, V], got {logits.type}")
    batch, vocab = logits.shape
    for role in INPUTS:
        t = getattr(si, role)
        if t is None:
            continue
        want = input_type(role, batch, vocab)
        if t.type != want:
            raise BuilderError(f"sample: input {role} must be {want}, got {t.type}")
    return batch, vocab


def allowed(b: Builder, words: Tensor, vocab: int, k: _K | None = None) -> Tensor:
    """i1 [B, V]: the tokens a packed ``allowed_tokens`` mask (i32 [B, ceil(V / 16)], 16 bits
    a word, each word in [0, 2^16)) allows: bit ``j`` of word ``w`` is
    ``(w / 2^j) - 2 * (w / 2^(j+1))`` in integer division."""
    k = k or _K(b)
    batch, nw = words.shape
    pow2 = b.broadcast_to(b.constant(np.array([1 << j for j in range(MASK_BITS)], np.int32)),
                          (batch, nw, MASK_BITS))
    q = b.broadcast_to(b.reshape(words, (batch, nw, 1)), (batch, nw, MASK_BITS)) / pow2
    bits = q - (q / k(2, DType.I32)) * k(2, DType.I32)
    bits = b.reshape(bits, (batch, nw * MASK_BITS))
    if nw * MASK_BITS != vocab:
        bits = b.slice_axis(bits, 1, 0, vocab)
    return b.compare("ne", bits, k(0, DType.I32))


def apply_mask(b: Builder, logits: Tensor, words: Tensor, k: _K | None = None) -> Tensor:
    """``logits`` with every token the mask ``words`` does not allow set to -inf."""
    k = k or _K(b)
    return b.select(allowed(b, words, logits.shape[1], k), logits,
                    k.full(logits.shape, -math.inf))


def process_logits(b: Builder, logits: Tensor, si: SamplingInputs) -> Tensor:
    """Steps 1-2: logit bias, then repetition, frequency and presence penalties."""
    k = _K(b)
    x = logits
    if si.logit_bias is not None:
        x = x + si.logit_bias
    if si.repetition_penalty is not None or si.frequency_penalty is not None \
            or si.presence_penalty is not None:
        counts = si.token_counts
        seen = b.compare("gt", counts, k(0, DType.I32))
        if si.repetition_penalty is not None:
            r = _col(b, si.repetition_penalty)
            pos = b.compare("gt", x, k(0.0))
            x = b.select(seen, b.select(pos, x / r, x * r), x)
        if si.frequency_penalty is not None:
            x = x - _col(b, si.frequency_penalty) * b.cast(counts, DType.F32)
        if si.presence_penalty is not None:
            x = x - _col(b, si.presence_penalty) * b.cast(seen, DType.F32)
    return x


def argmax(b: Builder, x: Tensor, k: _K | None = None) -> Tensor:
    """i32 [B]: the first index of the row maximum (NaN rows: the last index)."""
    k = k or _K(b)
    batch, vocab = x.shape
    iota = k.iota((batch, vocab))
    m = b.reduce("max", x, 1, keepdims=True)
    idx = b.reduce("min", b.select(b.compare("eq", x, m), iota, k(vocab, DType.I32)), 1)
    return b.binary("min", idx, k(vocab - 1, DType.I32))


def _largest_true(b: Builder, k: _K, batch: int, pred) -> Tensor:
    """f32 [B]: per row, the largest float ``t`` in ``{0} U [2^-149, 2)`` with ``pred(t)``
    (``pred``: f32 [B] -> i1 [B], non-increasing in ``t``, true at 0, false at 2). Exact: see
    the module docstring (8 binade steps, then 23 steps inside the binade)."""
    tab = k.pow2_table()
    lo = k.full((batch,), 0, DType.I32)
    hi = k.full((batch,), tab.shape[0] - 1, DType.I32)
    for _ in range(STAGE1_STEPS):
        mid = (lo + hi) / k(2, DType.I32)
        ok = pred(b.gather(tab, mid, 0))
        hi = b.select(ok, mid, hi)
        lo = b.select(ok, lo, mid + k(1, DType.I32))
    tlo = b.gather(tab, hi, 0)
    thi = tlo * k(2.0)
    for _ in range(STAGE2_STEPS):
        mid = (tlo + thi) * k(0.5)
        ok = pred(mid)
        tlo = b.select(ok, mid, tlo)
        thi = b.select(ok, thi, mid)
    return tlo


@dataclass
class Distribution:
    """The filtered sampling distribution of step 4: ``p`` f32 [B, V] (softmax of
    ``x / T``), ``threshold`` f32 [B] and ``keep`` i1 [B, V] (``p >= threshold``)."""

    p: Tensor
    threshold: Tensor
    keep: Tensor


def distribution(b: Builder, x: Tensor, si: SamplingInputs, k: _K | None = None
                 ) -> Distribution:
    """Step 4 on processed logits ``x``: temperature softmax, then min-p, top-k, top-p."""
    k = k or _K(b)
    batch, vocab = x.shape
    t = si.temperature
    t = b.select(b.compare("lt", t, k(GREEDY_EPS)), k.full(t.shape, 1.0), t)
    z = x / _col(b, t)
    e = b.unary("exp", z - b.reduce("max", z, 1, keepdims=True))
    p = e / b.reduce("sum", e, 1, keepdims=True)
    pmax = b.reduce("max", p, 1)                       # [B]
    zero = k.full((batch,), 0.0)
    t1 = zero
    if si.min_p is not None:
        t1 = b.binary("max", t1, si.min_p * pmax)
    if si.top_k is not None:
        kk = b.binary("min", si.top_k, k(vocab, DType.I32))
        kk = b.select(b.compare("le", kk, k(0, DType.I32)), k.full((batch,), vocab, DType.I32),
                      kk)

        def count_ge(tv):
            c = b.cast(b.compare("ge", p, _col(b, tv)), DType.I32)
            return b.compare("ge", b.reduce("sum", c, 1), kk)

        t1 = b.binary("max", t1, _largest_true(b, k, batch, count_ge))
    thr = t1
    if si.top_p is not None:
        t1c = _col(b, t1)

        def mass_ge(tc):
            return b.reduce("sum", b.select(b.compare("ge", p, tc), p, k.full(p.shape, 0.0)), 1)

        target = si.top_p * mass_ge(t1c)

        def mass_ok(tv):
            return b.compare("ge", mass_ge(b.binary("max", _col(b, tv), t1c)), target)

        tp = _largest_true(b, k, batch, mass_ok)
        tp = b.select(b.compare("ge", si.top_p, k(1.0)), zero, tp)
        thr = b.binary("max", thr, tp)
    thr = b.binary("min", thr, pmax)
    return Distribution(p, thr, b.compare("ge", p, _col(b, thr)))


def inverse_cdf(b: Builder, w: Tensor, u: Tensor, k: _K | None = None) -> Tensor:
    """i32 [B]: the smallest ``i`` with ``sum(w[:i+1]) > u * sum(w)`` for non-negative
    weights ``w`` f32 [B, V] (some positive), found by ``ceil(log2 V)`` bisection steps on the
    index; when rounding leaves no such ``i`` (``u * W`` rounded up to ``W``), the last id of
    positive weight."""
    k = k or _K(b)
    batch, vocab = w.shape
    iota = k.iota((batch, vocab))
    total = b.reduce("sum", w, 1)
    target = u * total
    lo = k.full((batch,), 0, DType.I32)
    hi = k.full((batch,), vocab - 1, DType.I32)
    for _ in range(math.ceil(math.log2(vocab)) if vocab > 1 else 0):
        mid = (lo + hi) / k(2, DType.I32)
        prefix = b.reduce("sum", b.select(b.compare("le", iota, _col(b, mid)), w,
                                          k.full(w.shape, 0.0)), 1)
        gt = b.compare("gt", prefix, target)
        hi = b.select(gt, mid, hi)
        lo = b.select(gt, lo, mid + k(1, DType.I32))
    last = b.reduce("max", b.select(b.compare("gt", w, k(0.0)), iota, k(0, DType.I32)), 1)
    return b.select(b.compare("gt", total, target), hi, last)


def _row_gather(b: Builder, x: Tensor, idx: Tensor, k: _K) -> Tensor:
    """x[b, idx[b]] for x [B, V], idx i32 [B]."""
    batch, vocab = x.shape
    flat = b.reshape(x, [batch * vocab])
    return b.gather(flat, b.iota((batch,), 0) * k(vocab, DType.I32) + idx, 0)


def log_softmax(b: Builder, x: Tensor) -> Tensor:
    m = b.reduce("max", x, 1, keepdims=True)
    s = x - m
    return s - b.unary("log", b.reduce("sum", b.unary("exp", s), 1, keepdims=True))


def top_n(b: Builder, x: Tensor, n: int, k: _K | None = None) -> tuple[Tensor, Tensor]:
    """(values f32 [B, n], ids i32 [B, n]) of the ``n`` largest entries per row, in
    descending order, lowest id first at ties: ``n`` iterated max passes."""
    k = k or _K(b)
    batch, vocab = x.shape
    if n > vocab:
        raise BuilderError(f"top_n: n={n} exceeds the vocabulary ({vocab})")
    iota = k.iota((batch, vocab))
    vals, ids = [], []
    for _ in range(n):
        i = argmax(b, x, k)
        vals.append(_col(b, _row_gather(b, x, i, k)))
        ids.append(_col(b, i))
        x = b.select(b.compare("eq", iota, _col(b, i)), k.full(x.shape, -math.inf), x)
    return b.concat(vals, 1), b.concat(ids, 1)


def sample(b: Builder, logits: Tensor, si: SamplingInputs, spec: SamplerSpec | None = None
           ) -> SampleResult:
    """The sampling suffix on ``logits`` f32 [B, V]; see the module docstring."""
    spec = spec or SamplerSpec()
    batch, vocab = _check(logits, si)
    k = _K(b)
    with b.scope("sample"):
        # spec switches a feature off by leaving its input out of `si`
        on = {"top_k": spec.top_k and spec.stochastic, "top_p": spec.top_p and spec.stochastic,
              "min_p": spec.min_p and spec.stochastic, "temperature": spec.stochastic,
              "uniform": spec.stochastic,
              "logit_bias": spec.logit_bias, "repetition_penalty": spec.penalties,
              "presence_penalty": spec.penalties, "frequency_penalty": spec.penalties,
              "allowed_tokens": spec.guided}
        si = SamplingInputs(**{r: (getattr(si, r) if on.get(r, True) else None)
                               for r in INPUTS})
        bad = b.compare("ne", logits - logits, k(0.0))       # NaN or +-inf
        nonfinite = b.reduce("max", bad, 1)
        if spec.guided:
            logits = apply_mask(b, logits, si.allowed_tokens, k)
        x = process_logits(b, logits, si)
        greedy = argmax(b, x, k)
        token = greedy
        if spec.stochastic:
            d = distribution(b, x, si, k)
            w = b.select(d.keep, d.p, k.full(d.p.shape, 0.0))
            drawn = inverse_cdf(b, w, si.uniform, k)
            token = b.select(b.compare("lt", si.temperature, k(GREEDY_EPS)), greedy, drawn)
        onehot = b.compare("eq", k.iota((batch, vocab)), _col(b, token))
        history = si.token_counts + b.cast(onehot, DType.I32)
        res = SampleResult(token, history, nonfinite)
        if spec.logprobs is not None:
            lp = log_softmax(b, logits)
            res.logprob = _row_gather(b, lp, token, k)
            if spec.logprobs > 0:
                res.top_logprobs, res.top_ids = top_n(b, lp, spec.logprobs, k)
    return res


def trace_cost(batch: int, vocab: int, spec: SamplerSpec | None = None) -> dict[str, int]:
    """What the sampling suffix adds to a builder (``values``, ``ops``, ``literal_bytes``,
    ``owned_bytes``, the :class:`~poot.graph.builder.TraceLimits` resources), measured by
    tracing it on a scratch builder: for callers sizing their limits."""
    big = 1 << 62
    b = Builder(TraceLimits(max_values=big, max_ops=big, max_literal_bytes=big,
                            max_owned_bytes=big))
    lg = b.input("logits", TensorType((batch, vocab), DType.F32))
    base = (b._values, b._ops, b._literal, b._owned)
    sample(b, lg, declare_inputs(b, batch, vocab, spec), spec)
    now = (b._values, b._ops, b._literal, b._owned)
    return {k: n - o for k, n, o in zip(("values", "ops", "literal_bytes", "owned_bytes"),
                                        now, base)}


# ---- the sampler as its own step program (the serving engine's) ----------------------------

#: Inputs of the sampler program beyond :data:`INPUTS`: the decode step's logits and, with
#: penalties, the batch rows' places in the token-history pool.
LOGITS = "logits"
HISTORY_ROWS = "sampling.history_rows"
#: Log-prob widths a sampler program is traced for (a request asking for n top log-probs runs
#: in the smallest width >= n; the rest is cut on the host).
LOGPROB_WIDTHS = (0, 5, 20)


@dataclass(frozen=True)
class SamplerStep:
    """The shape of a standalone sampler program (:func:`trace_sampler`).

    Attributes:
        batch: rows B (the decode bucket it follows).
        vocab: V.
        history_slots: rows of the token-history pool (:func:`history_pool_rows`); used when
            ``spec.penalties``, else set to 1: a sampler without penalties has no pool, so its
            program (and its compile-cache key) does not depend on the engine's batch size.
        spec: the :class:`SamplerSpec` (the union of the features of the batch's requests).
    """

    batch: int
    vocab: int
    history_slots: int
    spec: SamplerSpec

    def __post_init__(self):
        for k in ("batch", "vocab", "history_slots"):
            v = getattr(self, k)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise BuilderError(f"SamplerStep.{k} must be a positive int, got {v!r}")
        if not self.spec.penalties:
            object.__setattr__(self, "history_slots", 1)


#: the token-history pool's rows come in multiples of this (see :func:`history_pool_rows`)
HISTORY_ROW_QUANTUM = 8


def history_pool_rows(max_batch: int) -> int:
    """Rows of the token-history pool (i32 [rows, V]) of an engine running up to
    ``max_batch`` sequences: one a sequence plus a scratch row for idle batch rows (the
    last), rounded up to a multiple of :data:`HISTORY_ROW_QUANTUM`, so that engines of
    nearby batch sizes (1, 2 and 4; 8 and 9) run, and compile, the same penalties sampler
    (the extra rows are free rows like the others: at most ``max_batch`` are in use)."""
    return -(-(max_batch + 1) // HISTORY_ROW_QUANTUM) * HISTORY_ROW_QUANTUM


def trace_sampler(step: SamplerStep) -> Graph:
    """The sampling suffix as a program of its own, run after a decode step of the same
    bucket (it reads that step's ``logits`` buffer on the device).

    Inputs: ``logits`` f32 [B, 1, V]; the per-row parameters ``step.spec`` declares
    (:data:`INPUTS`: [B] each, ``sampling.logit_bias`` [B, V]); with penalties, the
    token-history pool ``sampling.token_counts`` i32 [S, V] and ``sampling.history_rows`` i32
    [B] (the pool row of each batch row; idle rows may all name one scratch row).
    Outputs: :data:`OUTPUTS` ``token`` i32 [B], ``nonfinite`` i1 [B], the log-prob outputs
    when ``spec.logprobs`` is set, and with penalties ``token_counts_out``: the pool with each
    batch row's history row counting its chosen token once more (a scatter into the pool
    input: updated in place). Row b's token depends on row b's inputs only, so a request
    samples the same tokens in any batch.
    """
    s = step
    spec = s.spec
    cost = trace_cost(s.batch, s.vocab, spec)
    # the suffix's own cost, plus the history gather/scatter and the logits view (a margin
    # of 2x on what it measures)
    b = Builder(TraceLimits(max_values=2 * cost["values"] + 1024,
                            max_ops=2 * cost["ops"] + 1024,
                            max_literal_bytes=2 * cost["literal_bytes"] + 4096,
                            max_owned_bytes=2 * cost["owned_bytes"]
                            + 64 * s.batch * s.vocab + 16 * s.history_slots * s.vocab),
                name="sampler")
    logits = b.input(LOGITS, TensorType((s.batch, 1, s.vocab), DType.F32))
    roles = [r for r in spec.input_roles() if r != "token_counts"]
    handles = {r: b.input(INPUTS[r], input_type(r, s.batch, s.vocab)) for r in roles}
    pool = rows = None
    if spec.penalties:
        pool = b.input(INPUTS["token_counts"],
                       TensorType((s.history_slots, s.vocab), DType.I32))
        rows = b.input(HISTORY_ROWS, TensorType((s.batch,), DType.I32))
        counts = b.gather(pool, rows, axis=0)
    else:
        counts = b.broadcast_to(b.scalar(0, DType.I32), (s.batch, s.vocab))
    si = SamplingInputs(token_counts=counts, **handles)
    res = sample(b, b.reshape(logits, (s.batch, s.vocab)), si, spec)
    out = {OUTPUTS["token"]: res.token, OUTPUTS["nonfinite"]: res.nonfinite}
    if res.logprob is not None:
        out[OUTPUTS["logprob"]] = res.logprob
    if res.top_logprobs is not None and res.top_logprobs.shape[1] > 0:
        out[OUTPUTS["top_logprobs"]] = res.top_logprobs
        out[OUTPUTS["top_ids"]] = res.top_ids
    if spec.penalties:
        out[OUTPUTS["history"]] = b.scatter(pool, b.reshape(rows, (s.batch, 1)), res.history)
    return b.finish(out)
