"""Speculative decoding in the engine loop: drafts, the verify step, acceptance, roll-back.

**Plan** (:meth:`Speculator.plan`, called by the scheduler before it plans prompt chunks,
which the proposals count against): each decoding sequence gets ``k`` proposed tokens (:mod:`~poot.engine.spec.adaptive`,
:mod:`~poot.engine.spec.ngram`), at most ``max_tokens - 1`` past what it has generated, and
KV blocks for their positions (free ones only: a draft never preempts; it is cut to what
fits). When the cost model says verifying costs more than it saves, nobody speculates.

**Verify** (:func:`issue_verify`): one ragged step (a ``verify[T]`` entry, every decoding
row through the head, then the iteration's prompt chunks) with ``1 + k`` rows per
speculating sequence: its last token and its proposals at
consecutive positions, attention causal by position, so row j's logits are the target's
next-token distribution after the sequence plus the first j proposals. The sampler samples
every row with the sequence's own parameters (temperature, top-k/p, min-p, logit bias) and,
for row j, the uniform number the sequence's stream gives its (g + j)-th generated token.
What depends on a row's own history sees it: with penalties, row j > 0 reads a history row
of its own (:attr:`Speculator.scratch`), written from the sequence's output plus the first j
proposals before the step; a guided row j gets the mask of the sequence's matcher after the
first j proposals (consumed, masked, then rolled back; rows after a proposal the constraint
refuses allow every token: they can never be accepted).

**Accept** (:meth:`Speculator.accept`): proposals are accepted while the token sampled at
their row equals them; the token sampled at the first mismatch (or after the last proposal:
the bonus token) is the target's own. For greedy rows that is exact match against the
argmax. For sampled rows it is the rejection-sampling rule of Leviathan et al. / Chen et al.
for a draft distribution that is a point mass on the proposal x: accept x with probability
p(x), else sample from ``norm(max(p - q, 0))`` = p without x: a sample y of p equals x with
probability p(x), and, given y != x, is distributed as p without x. The output is therefore
exactly the target's distribution; with uniforms indexed by generated token (rows past the
first mismatch give theirs back, :meth:`~poot.sampling_params.UniformStream.peek`), it is
even token for token what the sequence samples without speculation.

**Roll back**: the rejected rows' K/V were written past the sequence's new end; attention
reads positions up to each row's own, so they are never read and are overwritten when
those positions are computed again. The sequence's computed length covers accepted tokens
only (prefix-cache keys are made from computed, accepted tokens), and blocks past its new end
are released.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from poot.engine.guided import ALL_ALLOWED
from poot.engine.request import RUNNING, Request
from poot.engine.runner import DecodeBatch, RaggedBatch, sampler_spec_for
from poot.engine.spec.adaptive import EXPLORE_EVERY, Acceptance, StepCosts, choose
from poot.engine.spec.config import SpeculativeConfig
from poot.engine.spec.ngram import NgramIndex
from poot.graph import sampling


@dataclass
class SpecState:
    """One request's speculation state: its n-gram index and recent acceptance."""

    index: NgramIndex
    acceptance: Acceptance
    #: its :class:`~poot.engine.spec.draft.DraftSeq` in a draft model's pool (None: none)
    draft: Any = None


def penalized(seq: Request) -> bool:
    """Whether ``seq``'s sampling reads its token history (penalties)."""
    p = seq.params
    return p.repetition_penalty != 1.0 or p.presence_penalty != 0.0 or \
        p.frequency_penalty != 0.0


class Speculator:
    """The engine's speculative decoding (module doc).

    Args:
        config: :class:`~poot.engine.spec.config.SpeculativeConfig`.
        runner: the :class:`~poot.engine.runner.ModelRunner` (buckets, block tables).
        blocks: the pool's :class:`~poot.engine.blocks.BlockManager`.

    Attributes:
        costs: the :class:`~poot.engine.spec.adaptive.StepCosts` the engine times.
        scratch: rows of the token-history pool for the proposal rows of sequences with
            penalties (set by the engine; none: such sequences do not speculate).
        draft_tokens, accepted_tokens, verify_steps: totals over every request.
    """

    def __init__(self, config: SpeculativeConfig, runner, blocks):
        self.config, self.runner, self.blocks = config, runner, blocks
        self.costs = StepCosts(config.row_cost)
        self.refused = 0                        # iterations the cost model refused in a row
        self.streak = 0                         # iterations it chose speculating in a row
        #: acceptance over every sequence (a new sequence's prior)
        self.overall = Acceptance()
        self.scratch: list[int] = []
        self.draft_tokens = self.accepted_tokens = self.verify_steps = 0

    def _state(self, seq: Request) -> SpecState:
        if seq.spec is None:
            c = self.config
            seq.spec = SpecState(NgramIndex(c.prompt_lookup_min, c.prompt_lookup_max),
                                 Acceptance.seeded(self.overall))
        return seq.spec

    def propose(self, seq: Request, k: int) -> list[int]:
        """Up to ``k`` tokens to follow ``seq`` (the n-gram proposer; a draft model, or a
        test's oracle, replaces this method)."""
        return self._state(seq).index.propose(seq.tokens, k)

    def _k(self, seq: Request) -> int:
        """Tokens ``seq`` may propose now: adaptive (or k), within ``max_tokens``."""
        if seq.aborted or seq.status != RUNNING:
            return 0
        if penalized(seq) and not (self.scratch and sampling.INPUTS["token_counts"]
                                   in self.runner.session.state_names()):
            return 0
        k = self.config.num_speculative_tokens
        if self.config.adaptive:
            k = self._state(seq).acceptance.k(k)
        return max(0, min(k, seq.params.max_tokens - seq.generated - 1))

    def may_propose(self, rows: Sequence[Request]) -> bool:
        """Whether some row of ``rows`` would propose now (cheap: the engine asks before
        chaining a plain decode step)."""
        return bool(self.proposals(rows))

    def spent(self) -> float:
        """Seconds this iteration's proposing took outside the verify step (a draft
        model's steps; the engine leaves them out of the verify step's time), counted
        from zero again after each call."""
        return 0.0

    def release(self, seq: Request) -> None:
        """``seq`` finished or was preempted: give back what its proposer holds."""

    def step_model(self) -> dict:
        """The cost model's inputs for a report: the fastest recent seconds of every step
        shape timed (``"decode[B]"``, ``"verify[T]"``, a draft's ``"draft_catchup[B]"``,
        ``"draft_decode[B]"``) and the acceptance over every sequence."""
        return {"step_s": {f"{k[0]}[{k[1]}]": v for k, v in sorted(self.costs.seconds.items())},
                "alpha": self.overall.alpha,
                "acceptance_rate": self.accepted_tokens / self.draft_tokens
                if self.draft_tokens else 0.0}

    def proposals(self, rows: Sequence[Request]) -> dict[Request, list[int]]:
        """Each row's proposal (non-empty ones only), before blocks and the cost model."""
        out = {}
        for seq in rows:
            k = self._k(seq)
            draft = list(self.propose(seq, k))[:k] if k else []
            if draft:
                out[seq] = draft
        return out

    def plan(self, rows: Sequence[Request]) -> dict[Request, list[int]]:
        """The drafts of an iteration's decoding ``rows`` (each already holding a block for
        its position), their blocks taken from the free ones (a draft is cut to what is
        free); {} when nobody speculates (module doc)."""
        drafts = self.proposals(rows)
        if drafts and self.config.adaptive:
            alphas = [(self._state(s).acceptance.alpha, len(drafts.get(s, ()))) for s in rows]
            ks = self._explore(choose(self.costs, self.runner.bucket(len(rows)), alphas),
                               [k for _, k in alphas])
            drafts = {s: drafts[s][:k] for s, k in zip(rows, ks or []) if k}
        drafts = self._cut_penalized(drafts)
        for seq in rows:
            if seq not in drafts and seq.spec is not None:
                seq.spec.acceptance.idle()
        drafts = {seq: draft[:self._reserve(seq, len(draft), self.blocks)]
                  for seq, draft in drafts.items()}
        return {seq: draft for seq, draft in drafts.items() if draft}

    def _explore(self, cut: list[int] | None, ks: list[int]) -> list[int] | None:
        """The cost model's choice ``cut``, but every :data:`EXPLORE_EVERY` iterations in
        a row of one kind the other (``ks`` whole, or a plain step): both sides of the
        comparison are timed again (a time taken while the machine was busy does not
        decide for good)."""
        if cut is None:
            self.refused, self.streak = self.refused + 1, 0
            if self.refused >= EXPLORE_EVERY:
                cut, self.refused = ks, 0
            return cut
        self.refused, self.streak = 0, self.streak + 1
        if self.streak >= EXPLORE_EVERY:
            cut, self.streak = None, 0
        return cut

    def _cut_penalized(self, drafts: dict) -> dict:
        """``drafts`` with the proposals of penalized sequences cut to the history rows
        there are for them (:attr:`scratch`)."""
        room, out = len(self.scratch), {}
        for seq, draft in drafts.items():
            if penalized(seq):
                draft = draft[:room]
                room -= len(draft)
            if draft:
                out[seq] = draft
        return out

    def _reserve(self, seq: Request, k: int, bm) -> int:
        """Blocks for positions ``len(tokens) .. len(tokens) + k - 1`` of ``seq`` (free
        ones only); returns the proposals they hold."""
        while k and bm.blocks_for(len(seq.tokens) + k) - len(seq.blocks) > bm.num_free():
            k -= 1
        for b in bm.allocate(max(0, bm.blocks_for(len(seq.tokens) + k) - len(seq.blocks))):
            seq.table[len(seq.blocks)] = b
            seq.blocks.append(b)
        return k

    def trim(self, seq: Request, bm) -> None:
        """Release ``seq``'s blocks past its end (the next step writes position
        ``len(tokens) - 1``)."""
        keep = bm.blocks_for(len(seq.tokens))
        if len(seq.blocks) > keep:
            extra = seq.blocks[keep:]
            del seq.blocks[keep:]
            seq.table[keep:keep + len(extra)] = 0
            bm.release(extra)

    def observe(self, seq: Request, proposed: int, accepted: int) -> None:
        """A verify step accepted ``accepted`` of ``seq``'s ``proposed`` tokens."""
        self._state(seq).acceptance.observe(proposed, accepted)
        self.overall.observe(proposed, accepted)
        st = seq.stats
        st.draft_tokens += proposed
        st.accepted_tokens += accepted
        st.verify_steps += 1
        st.acceptance_rate = st.accepted_tokens / st.draft_tokens
        st.mean_accepted_length = 1.0 + st.accepted_tokens / st.verify_steps
        self.draft_tokens += proposed
        self.accepted_tokens += accepted
        self.verify_steps += 1

    def stats(self) -> dict:
        """Totals: draft and accepted tokens, verify steps, acceptance rate, mean accepted
        length (tokens a verify step yields per sequence, the target's own included)."""
        n = self.verify_steps
        return {"spec_draft_tokens": self.draft_tokens,
                "spec_accepted_tokens": self.accepted_tokens, "spec_verify_steps": n,
                "spec_acceptance_rate": self.accepted_tokens / self.draft_tokens
                if self.draft_tokens else 0.0,
                "spec_mean_accepted_length": 1.0 + self.accepted_tokens / n if n else 0.0}


def verify_batch(runner, groups: Sequence[tuple[Request, list[int]]],
                 scratch: Sequence[int] = (), chunks: Sequence = ()
                 ) -> tuple[RaggedBatch, list[Request]]:
    """The verify step's rows (module doc): per decoding ``(seq, draft)`` its last token and
    the draft at positions ``len(tokens) - 1 ..``, every row sampled, then the prompt
    ``chunks`` (:class:`~poot.engine.scheduler.PrefillChunk`), the last row of each that
    ends its prompt sampled; the sampled rows' requests (a decoding one repeated ``1 +
    len(draft)`` times). A penalized sequence's proposal rows take history rows from
    ``scratch``, written here; others share the idle rows' one."""
    tokens, positions, tables, reqs, uniforms, hist = [], [], [], [], [], []
    idle, free = runner.history_slots - 1, list(scratch)
    for seq, draft in groups:
        n = 1 + len(draft)
        last = len(seq.tokens) - 1
        tokens += [seq.tokens[-1]] + list(draft)
        positions += range(last, last + n)
        reqs += [seq] * n
        uniforms += [0.0] * n if seq.params.greedy else seq.uniforms.peek(n)
        hist.append(seq.history_row)
        for j in range(1, n):
            if penalized(seq):
                hist.append(free.pop())
                runner.reset_history(hist[-1], seq.output_ids + list(draft[:j]))
            else:
                hist.append(idle)
    logit_rows = list(range(len(reqs)))
    rows = list(reqs)
    for c in chunks:
        n = len(c.token_ids)
        tokens += c.token_ids
        positions += range(c.start, c.start + n)
        reqs += [c.request] * n
        if c.sample:
            seq = c.request
            logit_rows.append(len(reqs) - 1)
            rows.append(seq)
            uniforms += [0.0] if seq.params.greedy else seq.uniforms.peek(1)
            hist.append(seq.history_row)
    pos = np.asarray(positions, np.int32)
    table = np.stack([s.table for s in reqs])
    lora = None
    if runner.lora is not None:
        lora = np.fromiter((s.lora_slot for s in reqs), np.int32, len(reqs))
    sampled = DecodeBatch(None, pos[logit_rows], table[logit_rows], [s.params for s in rows],
                          np.asarray(uniforms, np.float32), np.asarray(hist, np.int32),
                          tuple(s.id for s in rows),
                          None if lora is None else lora[logit_rows])
    return RaggedBatch(np.asarray(tokens, np.int32), pos, table,
                       np.asarray(logit_rows, np.int32), sampled, lora), rows


def issue_verify(speculator: Speculator, groups: Sequence[tuple[Request, list[int]]],
                 guided=None, chunks: Sequence = ()):
    """Issue the verify step of ``groups`` (and prompt ``chunks``) and its sampler (a
    guided batch's masks computed meanwhile by ``guided``, the
    :class:`~poot.engine.guided.GuidedCompiler`): the runner's handle, and the groups of
    the sampled rows (``groups``, then ``(seq, [])`` per chunk that ends its prompt)."""
    runner = speculator.runner
    batch, rows = verify_batch(runner, groups, speculator.scratch, chunks)
    groups = list(groups) + [(c.request, []) for c in chunks if c.sample]
    spec = sampler_spec_for([s.params for s in rows])
    handle = runner.submit_ragged(batch, spec, verify=True)
    if handle.submitted is None:                      # guided: masks row by row
        runner.submit_sampler(handle, verify_masks(groups, guided, runner.vocab))
    return handle, groups


def verify_masks(groups, guided, vocab: int) -> np.ndarray:
    """i32 [rows, mask words]: each guided row's allowed tokens after its sequence's
    output and the proposals before it (module doc); other rows allow every token."""
    n = sum(1 + len(d) for _, d in groups)
    masks = np.full((n, sampling.mask_words(vocab)), ALL_ALLOWED, np.int32)
    r = 0
    for seq, draft in groups:
        if seq.guide is not None and seq.status == RUNNING:
            taken = 0
            for j in range(len(draft) + 1):
                guided.fill_masks([seq.guide], masks[r + j:r + j + 1])
                if j == len(draft) or not seq.guide.try_consume(draft[j]):
                    break
                taken += 1
            seq.guide.rollback(taken)
        r += 1 + len(draft)
    return masks


def _merge(into, ev):
    """One output of the tokens of ``into`` then ``ev`` (a request's outputs of one step)."""
    if into is None:
        return ev
    into.token_ids = list(into.token_ids) + list(ev.token_ids)
    into.text += ev.text
    if ev.logprobs:
        into.logprobs = (into.logprobs or []) + ev.logprobs
    for f in ("finished", "finish_reason", "stop", "output_ids", "output_text", "stats",
              "error", "flushed"):
        setattr(into, f, getattr(ev, f))
    return into


def accept(speculator: Speculator, output, groups, sampled, now: float) -> tuple[list, int]:
    """Process a verify step's sampled rows (module doc): per ``(seq, draft)`` group, the
    accepted proposals and the target's token, through ``output`` (the
    :class:`~poot.engine.output_processor.OutputProcessor`; one merged output per request),
    the acceptance recorded, blocks past the new end released. Returns (outputs, tokens
    emitted)."""
    events, emitted, i = [], 0, 0
    bm = speculator.blocks
    for seq, draft in groups:
        k, row = len(draft), i
        i += 1 + k
        if seq.status != RUNNING:
            continue
        if seq.aborted:
            events.append(output.finish(seq, "abort"))
            continue
        y = [int(t) for t in sampled.tokens[row:row + 1 + k]]
        m = 0
        while m < k and y[m] == draft[m]:
            m += 1
        if k:
            speculator.observe(seq, k, m)
        if not seq.params.greedy:
            seq.uniforms.advance(m + 1)
        base, ev = len(seq.tokens), None
        for j in range(m + 1):
            seq.n_computed = base + j
            ev = _merge(ev, output.accept(seq, y[j], sampled.logprob(row + j,
                                                                     seq.params.logprobs), now))
            emitted += 1
            if ev.finished:
                break
        events.append(ev)
        if seq.status == RUNNING:
            speculator.trim(seq, bm)
            if k and penalized(seq):          # the sampler counted y[0] only
                speculator.runner.reset_history(seq.history_row, seq.output_ids)
    return events, emitted


__all__ = ["SpecState", "Speculator", "accept", "issue_verify", "penalized", "verify_batch",
           "verify_masks"]
