"""The draft-model proposer: a smaller checkpoint of the target's tokenizer proposes its
greedy continuation; the target verifies it (:mod:`poot.engine.spec.speculator`).

The draft is any checkpoint poot loads, run by the same engine code on the same backend
(the target's compile target, precision and threads) as a second
:class:`~poot.engine.runner.ModelRunner` over its **own paged KV pool** and
:class:`~poot.engine.blocks.BlockManager`, sized for the target's batch and context
(``poot.api.model`` builds it; :func:`check_draft` refuses a pair that cannot work, before
any step compiles).

**Proposals are the draft's greedy tokens** (argmax of its logits). The draft distribution q
is then a point mass on the proposal x, so the acceptance the verify step already does is the
rejection-sampling rule exactly: greedy, exact match against the target's argmax; sampling,
accept x with probability ``min(1, p(x)/q(x)) = p(x)`` and otherwise sample
``norm(max(p - q, 0))``, which is p without x -- what "sample y from p, accept when y == x,
else emit y" does. Nothing in the acceptance changes, and the output is the target's,
token for token for greedy and seeded requests (a sampled draft would need q in the
sampler's rule: docs/speculative.md).

**One iteration's drafting** (:meth:`DraftProposer.propose`), batched over every speculating
sequence:

1. one ragged *catch-up* step on the draft runner with, for every sequence, the tokens whose
   draft K/V are not computed yet (on first use its prompt, chunked to the draft's prompt
   budget; afterwards the accepted proposals and the target's own token of the last verify),
   its last row sampled greedily: proposal 1. In the steady state every sequence is one or
   two tokens behind (the target's token; the last proposal too when all were accepted):
   the catch-up is then one or two decode steps, far cheaper than a ragged entry's rows on
   a CPU;
2. ``k - 1`` decode steps, one row per sequence still proposing: proposals 2..k.

The draft's computed length (:attr:`DraftSeq.computed`) covers positions whose draft K/V
hold the sequence's tokens; after a verify it is ``min(computed, len(tokens) - 1)`` (the
rejected proposals' positions are written again by the next catch-up; blocks past the new
end are released). A sequence whose draft blocks do not fit the draft's pool does not
speculate that iteration (a draft never preempts). Its blocks are released when the request
finishes, is aborted or preempted (:meth:`DraftSpeculator.release`).

**Cost**: the catch-up and decode steps are timed (per decode bucket of the speculating
sequences, compile iterations and each shape's first run excluded) and added to the verify
step's time in the cost model (:func:`~poot.engine.spec.adaptive.choose`): speculation runs
only where drafting plus verifying yields more tokens a second than plain decoding; after
:data:`~poot.engine.spec.adaptive.EXPLORE_EVERY` drafting iterations in a row one plain step
is run and timed again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from poot.engine.blocks import BlockManager
from poot.engine.request import Request
from poot.engine.runner import GREEDY, TOKEN, DecodeBatch, RaggedBatch
from poot.engine.spec.adaptive import choose
from poot.engine.spec.config import SpeculativeConfig, SpeculativeConfigError
from poot.engine.spec.speculator import Speculator, penalized
from poot.sampling_params import SamplingParams

#: A catch-up at most this many tokens behind runs as decode steps
#: (:meth:`DraftProposer._catch_up`).
DECODE_CATCH_UP = 2
#: The draft's rows sample greedily.
_GREEDY_PARAMS = SamplingParams(temperature=0.0)


def check_draft(target_vocab: int, target_tokenizer, context: int, draft_vocab: int,
                draft_tokenizer, draft_context: int | None, draft_path: str = "") -> None:
    """Refuse a draft the target cannot verify, naming what differs: the vocabulary size
    (field ``draft_vocab``), the tokenizer (``draft_tokenizer``: one has a tokenizer and the
    other none, their sizes, a special id -- BOS, EOS, stop ids --, or the first id whose
    token text differs), or a trained context (``draft_context``) shorter than ``context``,
    the positions the target's KV pool gives a sequence (``draft_path`` names the draft in
    the tokenizer's message). Raises
    :class:`~poot.engine.spec.config.SpeculativeConfigError`."""
    if draft_vocab != target_vocab:
        raise SpeculativeConfigError("draft_vocab", draft_vocab,
                                     f"the draft's vocabulary has {draft_vocab} ids, the "
                                     f"target's {target_vocab}")
    why = tokenizer_difference(target_tokenizer, draft_tokenizer)
    if why is not None:
        raise SpeculativeConfigError("draft_tokenizer", draft_path, why)
    if draft_context is not None and draft_context < context:
        raise SpeculativeConfigError("draft_context", draft_context,
                                     f"the draft's context of {draft_context} tokens is "
                                     f"shorter than the target's {context} "
                                     f"(lower --kv-capacity)")


def tokenizer_difference(target, draft) -> str | None:
    """What differs between two tokenizers (None: the same token -> id table and special
    ids; two checkpoints without a tokenizer count as the same)."""
    if target is None and draft is None:
        return None
    if target is None or draft is None:
        which = "draft" if draft is None else "target"
        return f"the {which} has no tokenizer and the other has one"
    if target.vocab_size != draft.vocab_size:
        return (f"the draft's tokenizer has {draft.vocab_size} tokens, the target's "
                f"{target.vocab_size}")
    for name in ("bos_id", "eos_id", "stop_ids", "special_ids"):
        a, b = getattr(target, name, None), getattr(draft, name, None)
        if a != b:
            return f"{name} differ: target {_show(a)}, draft {_show(b)}"
    for i in range(target.vocab_size):
        a, b = target.id_to_token(i), draft.id_to_token(i)
        if a != b:
            return f"token id {i} is {a!r} in the target's tokenizer, {b!r} in the draft's"
    return None


def _show(v) -> str:
    return str(sorted(v)) if isinstance(v, (set, frozenset)) else repr(v)


@dataclass
class DraftSeq:
    """A sequence's state in the draft: its blocks of the draft's pool, their table row
    (i32 [W]) and ``computed``, the positions whose draft K/V hold its tokens."""

    blocks: list[int]
    table: np.ndarray
    computed: int = 0


class DraftProposer:
    """Runs the draft (module doc).

    Args:
        runner: the draft's :class:`~poot.engine.runner.ModelRunner`.
        budget: the most token rows of one catch-up step (the target's prompt budget, or
            a full batch of catch-ups if larger).
    """

    def __init__(self, runner, budget: int):
        kv = runner.kv
        self.runner = runner
        self.blocks = BlockManager(kv.num_blocks, kv.block_size, prefix_caching=False)
        self.budget = max(1, budget)
        #: seconds of this iteration's catch-up and decode steps (for the cost model)
        self.seconds = 0.0
        #: (shape, seconds) of the draft steps just run, compile iterations and each
        #: shape's first run (its one-time set-up) left out
        self.timed: list[tuple[tuple, float]] = []
        self._ran: set[tuple] = set()

    def state(self, seq: Request) -> DraftSeq:
        st = seq.spec.draft
        if st is None:
            st = seq.spec.draft = DraftSeq([], self.runner.table_row([]))
        return st

    def reserve(self, seq: Request, k: int) -> int:
        """Draft blocks for proposing ``k`` tokens (positions up to ``len(tokens) + k -
        2``), free ones only; returns the proposals they hold (0: none fit)."""
        st, bm = self.state(seq), self.blocks
        need = len(seq.tokens) - 1 + k            # positions written: 0 .. need - 1
        while k and bm.blocks_for(need) - len(st.blocks) > bm.num_free():
            k, need = k - 1, need - 1
        if not k:
            return 0
        for b in bm.allocate(max(0, bm.blocks_for(need) - len(st.blocks))):
            st.table[len(st.blocks)] = b
            st.blocks.append(b)
        return k

    def rollback(self, seq: Request) -> None:
        """After a verify: the draft's K/V count only up to the accepted tokens; blocks
        past the sequence's end are released."""
        st = seq.spec.draft if seq.spec is not None else None
        if st is None:
            return
        st.computed = min(st.computed, len(seq.tokens) - 1)
        keep = self.blocks.blocks_for(len(seq.tokens))
        if len(st.blocks) > keep:
            extra = st.blocks[keep:]
            del st.blocks[keep:]
            st.table[keep:keep + len(extra)] = 0
            self.blocks.release(extra)

    def release(self, seq: Request) -> None:
        """Give back every draft block of ``seq`` (finished, aborted or preempted)."""
        st = seq.spec.draft if seq.spec is not None else None
        if st is not None:
            self.blocks.release(st.blocks)
            seq.spec.draft = None

    def propose(self, ks: dict[Request, int]) -> dict[Request, list[int]]:
        """The greedy continuation of ``k`` tokens of every sequence of ``ks`` (each with
        its draft blocks reserved, k >= 1): one catch-up step (more where the backlog
        exceeds :attr:`budget`), then ``max(k) - 1`` decode steps."""
        self.seconds, self.timed = 0.0, []
        if not ks:
            return {}
        n = self.runner.bucket(len(ks))
        first = self._timed(("draft_catchup", n), lambda: self._catch_up(list(ks)))
        out = {s: [self.proposal(s, 0, first[s])] for s in ks}
        for j in range(1, max(ks.values())):
            rows = [s for s in ks if ks[s] > j]
            toks = self._timed(("draft_decode", n), lambda: self._decode(
                rows, [len(s.tokens) - 1 + j for s in rows], [out[s][-1] for s in rows]))
            for s, t in zip(rows, toks):
                out[s].append(self.proposal(s, j, int(t)))
        return out

    def proposal(self, seq: Request, j: int, token: int) -> int:
        """Proposal ``j`` (0-based) of ``seq``, the draft's greedy ``token``; the next draft
        step reads what this returns. Here ``token`` itself; a benchmark's wrapper
        (:class:`~poot.engine.spec.bench_acceptance.SetAcceptanceDraft`) replaces some."""
        return token

    def _timed(self, shape: tuple, fn):
        t0, compiled = time.perf_counter(), len(self.runner.compile_s)
        out = fn()
        dt = time.perf_counter() - t0
        self.seconds += dt
        if len(self.runner.compile_s) == compiled and shape in self._ran:
            self.timed.append((shape, dt))
        self._ran.add(shape)
        return out

    def _catch_up(self, seqs: list[Request]) -> dict[Request, int]:
        """Compute every sequence's uncomputed tokens; each one's last row sampled (its
        first proposal): decode steps where none is more than :data:`DECODE_CATCH_UP`
        tokens behind (after a verify: the target's token, and the last proposal when all
        were accepted), else ragged steps (a prompt: the ragged entry's rows cost far more
        than a decode step's one on a CPU)."""
        # at least the last token each (it is the row that samples)
        pending = [(s, min(self.state(s).computed, len(s.tokens) - 1), len(s.tokens))
                   for s in seqs]
        behind = max(end - start for _, start, end in pending)
        if behind <= DECODE_CATCH_UP:
            return self._catch_up_decoding(pending, behind)
        out: dict[Request, int] = {}
        while pending:
            budget, rows, later = self.budget, [], []
            for s, start, end in pending:
                n = min(end - start, budget)
                if n <= 0:
                    later.append((s, start, end))
                    continue
                rows.append((s, start, n, start + n == end))
                if start + n < end:
                    later.append((s, start + n, end))
                budget -= n
            out.update(self._ragged(rows))
            pending = later
        return out

    def _catch_up_decoding(self, pending, behind: int) -> dict[Request, int]:
        """``behind`` decode steps; a sequence ``b`` tokens behind takes part in the last
        ``b`` of them (all in the last, which samples)."""
        toks = None
        for i in range(behind, 0, -1):              # i: tokens from each sequence's end
            part = [(s, end - i) for s, start, end in pending if end - start >= i]
            rows = [s for s, _ in part]
            toks = self._decode(rows, [p for _, p in part], [s.tokens[p] for s, p in part])
        return {s: int(t) for (s, _, _), t in zip(pending, toks)}

    def _ragged(self, rows) -> dict[Request, int]:
        """One ragged step of ``(seq, start, n, sample)`` chunks; the sampled ones' tokens."""
        tokens, positions, tables, logit_rows, sampled = [], [], [], [], []
        for s, start, n, sample in rows:
            st = self.state(s)
            tokens += s.tokens[start:start + n]
            positions += range(start, start + n)
            tables += [st.table] * n
            st.computed = start + n
            if sample:
                logit_rows.append(len(tokens) - 1)
                sampled.append(s)
        pos = np.asarray(positions, np.int32)
        table = np.stack(tables)
        lr = np.asarray(logit_rows, np.int32)
        batch = RaggedBatch(np.asarray(tokens, np.int32), pos, table, lr,
                            self._sampled(sampled, pos[lr], table[lr]))
        handle = self.runner.submit_ragged(batch, GREEDY if sampled else None)
        if handle is None:
            return {}
        toks = self.runner.collect(handle)[TOKEN]
        return {s: int(t) for s, t in zip(sampled, toks)}

    def _decode(self, rows: list[Request], positions: list[int], tokens: list[int]
                ) -> np.ndarray:
        """One decode step: each row's token at its position (the proposals 2..k, or a
        short catch-up); the greedy tokens after them."""
        pos = np.asarray(positions, np.int32)
        table = np.stack([self.state(s).table for s in rows])
        batch = self._sampled(rows, pos, table)
        batch.tokens = np.asarray(tokens, np.int32)
        toks = self.runner.collect(self.runner.submit_decode(batch, GREEDY))[TOKEN]
        for s, p in zip(rows, positions):
            self.state(s).computed = p + 1
        return toks

    def _sampled(self, seqs: Sequence[Request], pos, table) -> DecodeBatch:
        n = len(seqs)
        return DecodeBatch(None, pos, table, [_GREEDY_PARAMS] * n, np.zeros(n, np.float32),
                           np.full(n, self.runner.history_slots - 1, np.int32),
                           tuple(s.id for s in seqs))


class DraftSpeculator(Speculator):
    """The :class:`~poot.engine.spec.speculator.Speculator` whose proposals come from a
    draft model (module doc): k is chosen first (adaptive, the cost model with the draft's
    time, the history rows of penalized sequences, free blocks in both pools), then the
    draft runs once for every speculating sequence.

    Args:
        config, runner, blocks: as the base class's (the target's runner and pool).
        draft: the :class:`DraftProposer`.
    """

    def __init__(self, config: SpeculativeConfig, runner, blocks, draft: DraftProposer):
        super().__init__(config, runner, blocks)
        self.draft = draft

    def may_propose(self, rows: Sequence[Request]) -> bool:
        return any(self._k(s) for s in rows)

    def proposals(self, rows: Sequence[Request]) -> dict[Request, list[int]]:
        """Each row's proposal (non-empty ones), drafted at once for every row (no cost
        model, no target blocks)."""
        return self._draft({s: self._k(s) for s in rows})

    def plan(self, rows: Sequence[Request]) -> dict[Request, list[int]]:
        """The drafts of an iteration's decoding ``rows`` (module doc); {} when nobody
        speculates."""
        self.draft.seconds, self.draft.timed = 0.0, []
        ks = {s: self._k(s) for s in rows}
        if any(ks.values()) and self.config.adaptive:
            alphas = [(self._state(s).acceptance.alpha, ks[s]) for s in rows]
            cut = choose(self.costs, self.runner.bucket(len(rows)), alphas,
                         extra=self.draft_seconds)
            cut = self._explore(cut, [k for _, k in alphas])
            ks = dict(zip(rows, cut or [0] * len(rows)))
        room = len(self.scratch)
        for s in rows:
            if penalized(s):
                ks[s] = min(ks[s], room)
                room -= ks[s]
            if ks[s]:
                ks[s] = self._reserve(s, ks[s], self.blocks)
            if not ks[s] and s.spec is not None:
                s.spec.acceptance.idle()
        return self._draft(ks)

    def _draft(self, ks: dict[Request, int]) -> dict[Request, list[int]]:
        ks = {s: self.draft.reserve(s, k) for s, k in ks.items()
              if k and self._state(s) is not None}
        drafts = self.draft.propose({s: k for s, k in ks.items() if k})
        for shape, dt in self.draft.timed:
            self.costs.observe(shape, dt)
        return {s: d for s, d in drafts.items() if d}

    def draft_seconds(self, ks: Sequence[int]) -> float | None:
        """The draft's seconds for proposals of lengths ``ks`` (one per decoding
        sequence): the catch-up step plus ``max(ks) - 1`` decode steps at the speculating
        sequences' bucket; None while not timed."""
        n = sum(1 for k in ks if k)
        if not n:
            return 0.0
        b = self.draft.runner.bucket(n)
        t = self.costs.seconds.get(("draft_catchup", b))
        depth = max(ks)
        if depth > 1:
            d = self.costs.seconds.get(("draft_decode", b))
            t = None if t is None or d is None else t + (depth - 1) * d
        return t

    def spent(self) -> float:
        t, self.draft.seconds = self.draft.seconds, 0.0
        return t

    def trim(self, seq: Request, bm) -> None:
        super().trim(seq, bm)
        self.draft.rollback(seq)

    def release(self, seq: Request) -> None:
        self.draft.release(seq)


__all__ = ["DraftProposer", "DraftSeq", "DraftSpeculator", "check_draft",
           "tokenizer_difference"]
