"""How many tokens to propose: per sequence from its recent acceptance, per batch from the
cost of the verify step (the cost model below).

**Per sequence** (:class:`Acceptance`): alpha, the estimated chance that a proposed token is
accepted, from decayed counts of accepted tokens ``A`` and of rejections ``R`` (a verify step
rejects at most once: at its first mismatch), ``alpha = (A + 1) / (A + R + 2)``. A sequence
proposes ``k = max{j <= k_max : alpha**j >= THRESHOLD}`` tokens: the j-th proposed token is
only worth a row while the chance that it is reached and accepted, ``alpha**j``, is at least
:data:`THRESHOLD`. A sequence whose proposals keep missing falls below it at j = 1 and stops
speculating (k = 0); every step it does not speculate decays its rejections, so it tries
again (one token) some steps later. A new sequence starts from the engine's recent
acceptance over all sequences (:meth:`Acceptance.seeded`: worth :data:`PRIOR_WEIGHT`
observations), so on a workload that copies its input it speculates from its first steps.

**Per batch** (:class:`StepCosts`, :func:`choose`): a step of the n decoding sequences
yields n tokens in ``t_decode(n)``; verifying their proposals yields ``sum_i E_i`` tokens in
``t_verify(n + sum_i k_i)``, where ``E_i = (1 - alpha_i**(k_i + 1)) / (1 - alpha_i)`` is the
expected tokens of a sequence proposing ``k_i`` (the accepted ones and the target's own
token after them). Verify steps run on entries of a power-of-two number of rows, so for each
such size ``b`` up to the one holding every proposal the proposals are cut to fit ``b`` rows
(the last token of the longest proposal first: it is the least likely to be reached), and
the size with the most expected tokens per second wins; speculation runs when that beats
``n / t_decode``. The step
times are the engine's own measurements of recent iterations of that shape (the fastest of
the last :data:`TIME_WINDOW`: other work on the machine only ever adds time); before a shape has been timed, ``t_verify(R) = t_decode(1) * (1 +
row_cost * (R - 1))`` (:attr:`SpeculativeConfig.row_cost
<poot.engine.spec.config.SpeculativeConfig.row_cost>`). On a device where extra rows are
nearly free (a GPU at small batch) it speculates up to large batches; where each row costs
close to a whole step (a CPU GEMV per row) it stops early.

**A draft model's cost** (:mod:`poot.engine.spec.draft`) is added to ``t_verify``: its
catch-up step plus ``max_i k_i - 1`` decode steps at the speculating sequences' decode
bucket, each timed like the target's steps (shapes ``("draft_catchup", B)``,
``("draft_decode", B)``).
"""

from __future__ import annotations

from collections import deque
from typing import Callable

#: A proposed token is worth its row while its chance of being reached and accepted is at
#: least this.
THRESHOLD = 0.3
#: Decay of the acceptance counts per verify step (about the last 3 steps weigh most).
DECAY = 0.7
#: Decay of the rejection count per step a sequence does not speculate (it tries again
#: after about a dozen steps).
RETRY_DECAY = 0.85
#: Observations the engine-wide acceptance is worth to a new sequence.
PRIOR_WEIGHT = 4.0
#: Iterations of one step shape whose fastest is its time.
TIME_WINDOW = 16
#: After this many iterations in a row where the cost model refused to speculate, one
#: speculates anyway (its verify step is timed again: a time taken while the machine was
#: busy does not switch speculation off for good); after this many in a row where it chose
#: to speculate, one plain step runs (timed again: nor does it keep speculation on for good).
#: Both proposers (:meth:`~poot.engine.spec.speculator.Speculator._explore`).
EXPLORE_EVERY = 32


class Acceptance:
    """One sequence's recent acceptance (module doc)."""

    def __init__(self, accepted: float = 0.0, rejected: float = 0.0):
        self.accepted = accepted
        self.rejected = rejected

    @classmethod
    def seeded(cls, overall: "Acceptance") -> "Acceptance":
        """A new sequence's, starting from ``overall``'s alpha (:data:`PRIOR_WEIGHT`)."""
        a = overall.alpha
        return cls(PRIOR_WEIGHT * a, PRIOR_WEIGHT * (1.0 - a))

    @property
    def alpha(self) -> float:
        return (self.accepted + 1.0) / (self.accepted + self.rejected + 2.0)

    def k(self, k_max: int) -> int:
        """Tokens worth proposing now (0: speculation off for this sequence)."""
        a, k = self.alpha, 0
        while k < k_max and a ** (k + 1) >= THRESHOLD:
            k += 1
        return k

    def observe(self, proposed: int, accepted: int) -> None:
        """A verify step accepted ``accepted`` of ``proposed`` tokens."""
        self.accepted = DECAY * self.accepted + accepted
        self.rejected = DECAY * self.rejected + (1.0 if accepted < proposed else 0.0)

    def idle(self) -> None:
        """A step without speculating: old rejections weigh less."""
        self.rejected *= RETRY_DECAY


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens a verify step of k proposals yields on average (accepted plus the target's
    token), each accepted independently with chance ``alpha``."""
    if alpha >= 1.0:
        return k + 1.0
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


class StepCosts:
    """Iteration seconds per step shape (``("decode", B)``, ``("verify", T)``): the fastest
    of the last :data:`TIME_WINDOW`; and the cost model's prior for shapes not yet timed."""

    def __init__(self, row_cost: float):
        self.row_cost = row_cost
        self.seconds: dict[tuple, float] = {}
        self._recent: dict[tuple, deque] = {}

    def observe(self, shape: tuple, seconds: float) -> None:
        recent = self._recent.setdefault(shape, deque(maxlen=TIME_WINDOW))
        recent.append(seconds)
        self.seconds[shape] = min(recent)

    def decode(self, bucket: int) -> float | None:
        return self.seconds.get(("decode", bucket))

    def verify(self, bucket: int, rows: int) -> float | None:
        """Seconds of a verify step of ``rows`` rows on entry ``bucket``: measured, else the
        prior from the one-row decode step (None when that is not timed either)."""
        t = self.seconds.get(("verify", bucket))
        if t is not None:
            return t
        one = self.decode(1)
        return None if one is None else one * (1 + self.row_cost * (rows - 1))


def choose(costs: StepCosts, plain_bucket: int, drafts: list[tuple[float, int]],
           extra: Callable[[list[int]], float | None] | None = None) -> list[int] | None:
    """The proposal lengths to verify (module doc): ``drafts`` is (alpha, k) of every
    decoding sequence (k = 0: no proposal); returns each one's length, cut to the verify
    size with the best expected tokens per second, or None when a plain decode step is
    better. Untimed steps: every proposal whole, but a plain step of this batch's size is
    run (and timed) once a verify step has been. ``extra(cut)``: the seconds of making
    proposals of lengths ``cut`` (a draft model's steps), added to the verify step's; None
    from it counts as untimed."""
    ks = [k for _, k in drafts]
    t_plain = costs.decode(plain_bucket)
    if t_plain is None:
        return None if costs.seconds else ks
    best, best_rate = None, len(drafts) / t_plain
    b = 2
    while True:
        cut = _fit(drafts, b)
        if cut is not None and any(cut):
            t = costs.verify(b, sum(1 + k for k in cut))
            more = 0.0 if extra is None or t is None else extra(cut)
            if t is None or more is None:
                return ks
            t += more
            rate = sum(expected_tokens(a, k) for (a, _), k in zip(drafts, cut)) / t
            if rate > best_rate:
                best, best_rate = cut, rate
        if b >= sum(1 + k for k in ks):
            return best
        b *= 2


def _fit(drafts: list[tuple[float, int]], rows: int) -> list[int] | None:
    """The proposal lengths cut to ``rows`` rows in all (the longest cut first); None when
    the sequences alone exceed them."""
    ks = [k for _, k in drafts]
    over = sum(1 + k for k in ks) - rows
    if len(ks) > rows:
        return None
    while over > 0:
        i = max(range(len(ks)), key=lambda j: (ks[j], -drafts[j][0]))
        ks[i] -= 1
        over -= 1
    return ks


__all__ = ["Acceptance", "StepCosts", "THRESHOLD", "choose", "expected_tokens"]
