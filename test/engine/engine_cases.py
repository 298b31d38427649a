"""Shared by the engine tests: prompts, a staggered-arrival driver, and the single-request
reference each batched result is checked against."""

from __future__ import annotations

import numpy as np

from poot.sampling_params import SamplingParams


def prompts(vocab: int, n: int, seed: int = 0, lo: int = 3, hi: int = 40) -> list[list[int]]:
    """``n`` distinct random prompts of ``lo..hi`` tokens."""
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < n:
        p = rng.integers(3, vocab, int(rng.integers(lo, hi + 1))).tolist()
        if p not in out:
            out.append(p)
    return out


def alone(engine, ids, params: SamplingParams) -> list[int]:
    """The tokens a request gets run by itself (the engine otherwise idle)."""
    assert not engine.has_unfinished()
    outs = [o for o in engine.generate(ids, params)]
    return list(outs[-1].output_ids)


def staggered(engine, items, every: int = 2) -> dict[str, object]:
    """Add ``items`` ((ids, params) pairs) one every ``every`` engine steps, run to the end;
    returns request id -> its final RequestOutput, and the order of ids."""
    pending = list(items)
    rids, final = [], {}
    step = 0
    while pending or engine.has_unfinished():
        if pending and step % every == 0:
            ids, params = pending.pop(0)
            rids.append(engine.add_request(ids, params))
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out
        step += 1
    return {"ids": rids, "final": final}
