"""Decode steps over requests, issued on the :class:`~poot.engine.runner.ModelRunner`.

:class:`DecodeIssuer` turns a list of requests (rows, in order) into one decode step: their
columns (:class:`~poot.engine.runner.DecodeBatch`: token, position, block table, sampling
parameters, this step's uniform, history row, LoRA slot), the sampler spec that serves them
all (the union of their features, kept per micro-batch lane while its rows do not change),
and, for a guided batch, each guided row's allowed-token mask computed on the host while the
forward pass runs (:meth:`DecodeIssuer.issue_sampler`). What it issued is a
:class:`DecodeStep` until the engine reads it (:meth:`DecodeIssuer.collect`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from poot.engine.guided import ALL_ALLOWED
from poot.engine.output_processor import SampledTokens
from poot.engine.request import RUNNING, Request
from poot.engine.runner import (DecodeBatch, DecodeHandle, ModelRunner, RaggedBatch,
                               TokenFeed, sampler_spec_for)
from poot.engine.scheduler import PrefillChunk
from poot.graph import sampling


@dataclass
class DecodeStep:
    """A decode step issued and not yet read.

    Attributes:
        handle: the runner's handle of it.
        rows: its requests, row i = ``rows[i]`` (the rows it samples).
        lane: its micro-batch lane (0: not micro-batched, or the first).
        fed_back: its sampler copies the sampled tokens into its decode entry's token input
            (a decode step; a ragged step's sampler copies nothing).
    """

    handle: DecodeHandle
    rows: list[Request]
    lane: int = 0
    fed_back: bool = True

    def feed(self, rows: Sequence[Request]) -> TokenFeed:
        """The :class:`~poot.engine.runner.TokenFeed` of the token rows ``rows`` (those of
        ``rows`` that are rows of this step, in their order) from this step's sampled
        tokens."""
        where = {id(s): i for i, s in enumerate(self.rows)}
        return TokenFeed(self.handle, tuple((where[id(s)], j) for j, s in enumerate(rows)
                                            if id(s) in where))


class DecodeIssuer:
    """Issues and reads decode steps over requests (module doc).

    Attributes:
        guided_masks, guided_mask_s: allowed-token masks computed on the host, and their
            seconds.
    """

    def __init__(self, runner: ModelRunner):
        self.runner = runner
        self._specs: dict = {}                 # lane -> (rows' ids, their SamplerSpec)
        self._masks: np.ndarray | None = None  # i32 [max_batch, mask words]
        self.guided_masks = 0
        self.guided_mask_s = 0.0

    def issue(self, rows: Sequence[Request], chained: bool, lane: int = 0,
              source: DecodeStep | None = None) -> DecodeStep:
        """Issue the decode step of ``rows`` (non-empty, each with a block for its position)
        on ``lane``'s entries: its forward pass, and its sampler unless the batch is guided
        (then :meth:`issue_sampler`). ``chained``: every row is a row of the step in flight
        ``source``, one position further, its token fed on the device from what ``source``
        samples: by ``source``'s own sampler where that is a decode step of the same rows on
        this lane, else by a row copy (:class:`~poot.engine.runner.TokenFeed`)."""
        rows = list(rows)
        key = tuple(s.id for s in rows)
        cached = self._specs.get(lane)
        if cached is None or cached[0] != key:
            cached = self._specs[lane] = (key, sampler_spec_for([s.params for s in rows]))
        spec = cached[1]
        batch = self._batch(rows, chained)
        if chained and source is not None and not (
                source.fed_back and source.lane == lane
                and tuple(s.id for s in source.rows) == key):
            batch.feed = source.feed(rows)
        if spec.guided:                    # the sampler waits for the rows' masks
            handle = self.runner.submit_model(batch, spec, lane)
        else:
            handle = self.runner.submit_decode(batch, spec, lane=lane)
        return DecodeStep(handle, rows, lane)

    def _batch(self, rows: list[Request], chained: bool) -> DecodeBatch:
        n = len(rows)
        shift = 1 if chained else 0
        pos = np.fromiter((len(s.tokens) - 1 + shift for s in rows), np.int32, n)
        tokens = None if chained else np.fromiter((s.tokens[-1] for s in rows), np.int32, n)
        uniforms = np.fromiter((0.0 if s.params.greedy else s.uniforms.next() for s in rows),
                               np.float32, n)
        return DecodeBatch(tokens, pos, np.stack([s.table for s in rows]),
                           [s.params for s in rows], uniforms,
                           np.fromiter((s.history_row for s in rows), np.int32, n),
                           tuple(s.id for s in rows),
                           np.fromiter((s.lora_slot for s in rows), np.int32, n)
                           if self.runner.lora is not None else None)

    def issue_ragged(self, decode: Sequence[Request], chunks: Sequence[PrefillChunk],
                     source: DecodeStep | None = None) -> DecodeStep | None:
        """Issue one ragged step: a token row per request of ``decode`` (its last token at
        its position) then every token of ``chunks``, each row with its request's block
        table; the rows sampled are the decode rows and each chunk's last token where the
        chunk ends the prompt. Its sampler too, unless the batch is guided (then
        :meth:`issue_sampler`). None when no row is sampled (the step only prefills).
        ``source``: a step in flight whose rows include every decode row: each decodes one
        position further, its token the one ``source`` samples (fed on the device)."""
        reqs = list(decode) + [c.request for c in chunks]
        counts = [1] * len(decode) + [len(c.token_ids) for c in chunks]
        shift = 0 if source is None else 1
        tokens = [0 if source is not None else s.tokens[-1] for s in decode] + \
            [t for c in chunks for t in c.token_ids]
        positions = [len(s.tokens) - 1 + shift for s in decode] + \
            [c.start + i for c in chunks for i in range(len(c.token_ids))]
        ends = np.cumsum(counts) - 1
        sampled = list(decode) + [c.request for c in chunks if c.sample]
        logit_rows = list(range(len(decode))) + \
            [int(ends[len(decode) + i]) for i, c in enumerate(chunks) if c.sample]
        lora = None
        if self.runner.lora is not None:
            lora = np.repeat(np.fromiter((s.lora_slot for s in reqs), np.int32, len(reqs)),
                             counts)
        batch = RaggedBatch(np.asarray(tokens, np.int32), np.asarray(positions, np.int32),
                            np.repeat(np.stack([s.table for s in reqs]), counts, axis=0),
                            np.asarray(logit_rows, np.int32),
                            self._batch(sampled, chained=False) if sampled else None, lora,
                            source.feed(decode) if source is not None and decode else None)
        spec = sampler_spec_for([s.params for s in sampled]) if sampled else None
        handle = self.runner.submit_ragged(batch, spec)
        return None if handle is None else DecodeStep(handle, sampled, fed_back=False)

    def issue_sampler(self, step: DecodeStep | None, guided) -> None:
        """Issue the sampler of a guided step whose forward pass is running (nothing for
        another step, or None): each guided row's allowed tokens are computed now, on the
        host, by ``guided`` (the :class:`~poot.engine.guided.GuidedCompiler`) from its
        matcher, which has consumed every token accepted so far; other rows (unconstrained,
        or finished since the step was issued: their token is discarded) allow every
        token."""
        if step is None or step.handle.submitted is not None:
            return
        seqs = step.rows
        words = sampling.mask_words(self.runner.vocab)
        if self._masks is None or self._masks.shape[0] < len(seqs):
            self._masks = np.empty((max(self.runner.max_batch, len(seqs)), words), np.int32)
        masks = self._masks[:len(seqs)]
        t0 = time.perf_counter()
        rows = [i for i, s in enumerate(seqs) if s.guide is not None and s.status == RUNNING]
        masks[:] = ALL_ALLOWED
        if rows:
            block = np.empty((len(rows), words), np.int32)
            guided.fill_masks([seqs[i].guide for i in rows], block)
            masks[rows] = block
        self.guided_masks += len(rows)
        self.guided_mask_s += time.perf_counter() - t0
        self.runner.submit_sampler(step.handle, masks)

    def collect(self, step: DecodeStep) -> SampledTokens:
        """Wait for ``step``'s sampled tokens (and log-probs)."""
        return SampledTokens.of(self.runner.collect(step.handle))


__all__ = ["DecodeIssuer", "DecodeStep"]
