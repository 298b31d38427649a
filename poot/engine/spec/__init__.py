"""Speculative decoding: proposals for several tokens of a decoding sequence, verified by the
target model in one ragged step (docs/speculative.md).

* :mod:`~poot.engine.spec.config`: :class:`SpeculativeConfig` (``ngram[:k]``,
  ``draft:PATH[:k]``) and its typed errors, checked before anything compiles;
* :mod:`~poot.engine.spec.ngram`: the n-gram prompt-lookup proposer;
* :mod:`~poot.engine.spec.draft`: the draft-model proposer (a second runner over its own
  paged KV, greedy), its checks against the target, its batched drafting;
* :mod:`~poot.engine.spec.adaptive`: the number of tokens proposed per sequence from its
  recent acceptance, and the batch-level cost model that turns speculation off;
* :mod:`~poot.engine.spec.speculator`: the scheduler's and the engine's side: drafts and
  their KV blocks, acceptance of the verified rows, roll-back of the rejected ones;
* :mod:`~poot.engine.spec.bench_acceptance`: **benchmarks only**, a draft proposer whose
  acceptance is set (``bench/speculative_draft.py``); no user option.
"""

from poot.engine.spec.config import (MAX_SPECULATIVE_TOKENS, SpeculativeConfig,
                                     SpeculativeConfigError, parse_speculative)

__all__ = ["MAX_SPECULATIVE_TOKENS", "SpeculativeConfig", "SpeculativeConfigError",
           "parse_speculative"]
