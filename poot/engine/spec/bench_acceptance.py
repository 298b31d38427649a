"""**Benchmarks only**: a draft-model proposer whose acceptance is set, not earned.

A pair of random-weight models of real shapes (a 1B-shape target, a SmolLM2-shape draft)
measures what drafting and verifying cost, but its draft agrees with the target almost
never. :class:`SetAcceptanceDraft` still runs the draft model for every proposal (its
catch-up and decode steps cost what they cost), then replaces each proposed token, with
probability ``p`` per proposal (seeded), by the target's own greedy token at that position,
known from a plain greedy run of the same prompts done first (``refs``); otherwise it keeps
the draft's token. The replaced token is what the draft's next step reads, so the draft's
K/V hold the sequence's tokens once they are accepted, as with a draft that agrees.

Verification is exact, so the output stays the plain greedy one; only the acceptance moves:
with a draft that never agrees by itself, a proposal is accepted with probability ``p``,
independently, which is the cost model's alpha (:mod:`poot.engine.spec.adaptive`).

This is no option of ``poot generate``/``serve``/``bench`` nor of :class:`~poot.api.LLM`:
``bench/speculative_draft.py`` installs it with :func:`set_acceptance`.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from poot.engine.request import Request
from poot.engine.spec.draft import DraftProposer


class SetAcceptanceDraft(DraftProposer):
    """A :class:`~poot.engine.spec.draft.DraftProposer` whose proposals are the target's
    greedy tokens with probability ``p`` (module doc; benchmarks only).

    Args:
        runner, budget: as :class:`~poot.engine.spec.draft.DraftProposer`'s.
        refs: prompt (tuple of ids) -> the target's greedy output ids for it (a plain run);
            a position past the end of its reference keeps the draft's token.
        p: the chance, per proposal, that it is replaced (0 <= p <= 1).
        seed: of the replacement draws (one per proposal, in drafting order).

    Raises ValueError for ``p`` outside [0, 1].
    """

    def __init__(self, runner, budget: int, refs: Mapping[tuple, Sequence[int]], p: float,
                 seed: int = 0):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"acceptance p {p!r} must be in [0, 1]")
        super().__init__(runner, budget)
        self.refs, self.p = refs, p
        self.rng = np.random.default_rng(seed)
        #: proposals made, and those replaced by the target's token
        self.proposed = self.replaced = 0

    def proposal(self, seq: Request, j: int, token: int) -> int:
        """The target's greedy token at output position ``len(output) + j`` with
        probability :attr:`p`, else the draft's ``token``."""
        self.proposed += 1
        ref = self.refs.get(tuple(seq.prompt), ())
        g = len(seq.output_ids) + j
        if self.rng.random() < self.p and g < len(ref):
            self.replaced += 1
            return int(ref[g])
        return token


def set_acceptance(engine, refs: Mapping[tuple, Sequence[int]], p: float,
                   seed: int = 0) -> SetAcceptanceDraft:
    """Replace the draft proposer of ``engine`` (an :class:`~poot.engine.LLMEngine` with a
    draft model, before it runs any request) by a :class:`SetAcceptanceDraft` over the same
    draft runner (benchmarks only); returns it. Raises ValueError when the engine has no
    draft model, or for ``p`` outside [0, 1]."""
    spec = engine.speculator
    draft = getattr(spec, "draft", None)
    if not isinstance(draft, DraftProposer):
        raise ValueError("set_acceptance needs an engine with a draft model")
    spec.draft = SetAcceptanceDraft(draft.runner, draft.budget, refs, p, seed)
    return spec.draft


__all__ = ["SetAcceptanceDraft", "set_acceptance"]
