"""Ragged steps against separate prefill steps on one engine: what an arrival costs the
sequences already decoding, and a lone prompt's prefill rate. Prints one JSON object.

    python bench/ragged_step.py [--model GGUF] [--max-batch 8] [--arrivals 12]

* ``arrivals``: ``--max-batch - 1`` sequences decode (32-token prompts) while a new request
  (``--prompt-tokens`` prompt, 8 new tokens) arrives every ``--every`` engine steps. For each
  engine (``ragged``: the default; ``separate``: ``EngineConfig(ragged=False)``, each
  prompt chunk a step of its own before the decode step) it reports the inter-token
  latency of the long-running sequences (p50, p99, max, ms) and their output tok/s.
* ``prefill``: one prompt of ``--pp`` tokens alone, prefix cache off: time to first token
  and prompt tok/s, per prompt budget (``max_prefill_tokens``), for both engines.

The prefix cache is off throughout, so every prompt token is computed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from poot.api import ModelHandle  # noqa: E402
from poot.engine import EngineConfig, LLMEngine  # noqa: E402
from poot.load.bundled import smollm2_gguf  # noqa: E402
from poot.sampling_params import SamplingParams  # noqa: E402


def _prompt(rng, vocab: int, n: int) -> list[int]:
    return rng.integers(100, vocab - 1, n).tolist()


def arrivals(handle, ragged: bool, args) -> dict:
    """ITL of ``max_batch - 1`` long sequences while requests arrive (module doc)."""
    rng = np.random.default_rng(0)
    vocab = handle.runner.vocab
    cfg = EngineConfig(max_batch=args.max_batch, prefix_caching=False, ragged=ragged)
    eng = LLMEngine(handle.runner, handle.tokenizer, cfg)
    long = SamplingParams(temperature=0.0, max_tokens=900, ignore_eos=True,
                          detokenize=False)
    short = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, detokenize=False)
    ids = [eng.add_request(_prompt(rng, vocab, 32), long) for _ in range(args.max_batch - 1)]
    while any(len(s.output_ids) == 0 for s in eng.running) or eng.waiting:
        eng.step()                               # every long sequence decoding
    last: dict[str, float] = {}
    gaps: list[float] = []
    tokens, step, added = 0, 0, 0
    t0 = time.perf_counter()
    while added < args.arrivals or any(s.id not in ids for s in eng.running) or eng.waiting:
        if step % args.every == 0 and added < args.arrivals:
            eng.add_request(_prompt(rng, vocab, args.prompt_tokens), short)
            added += 1
        outs = eng.step()
        now = time.perf_counter()
        for o in outs:
            if o.request_id in ids:
                if o.request_id in last:
                    gaps.append(now - last[o.request_id])
                last[o.request_id] = now
                tokens += 1
        step += 1
    wall = time.perf_counter() - t0
    for rid in ids:
        eng.abort(rid)
    eng.run_until_done()
    g = np.array(gaps) * 1e3
    return {"itl_p50_ms": float(np.percentile(g, 50)), "itl_p99_ms": float(np.percentile(g, 99)),
            "itl_max_ms": float(g.max()), "p99_over_p50": float(np.percentile(g, 99)
                                                                 / np.percentile(g, 50)),
            "long_seq_tokens_per_s": tokens / wall, "steps": step}


def prefill(handle, ragged: bool, budget: int, n: int) -> dict:
    """Time to first token of one ``n``-token prompt alone (best of 3)."""
    rng = np.random.default_rng(1)
    cfg = EngineConfig(max_batch=handle.runner.max_batch, prefix_caching=False, ragged=ragged,
                       max_prefill_tokens=budget)
    eng = LLMEngine(handle.runner, handle.tokenizer, cfg)
    sp = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, detokenize=False)
    best = None
    for i in range(4):                            # the first compiles the buckets it needs
        p = _prompt(rng, handle.runner.vocab, n)
        t0 = time.perf_counter()
        list(eng.generate(p, sp))
        dt = time.perf_counter() - t0
        if i and (best is None or dt < best):
            best = dt
    return {"ttft_s": best, "prompt_tokens_per_s": n / best}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="GGUF (default: the bundled SmolLM2)")
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--arrivals", type=int, default=12)
    ap.add_argument("--every", type=int, default=4, help="engine steps between arrivals")
    ap.add_argument("--prompt-tokens", type=int, default=96)
    ap.add_argument("--pp", type=int, default=512, help="lone prompt length (0: skip)")
    ap.add_argument("--budgets", default="32,128,256")
    a = ap.parse_args(argv)
    handle = ModelHandle.load(a.model or smollm2_gguf(), kv_capacity=1024,
                              max_batch=a.max_batch)
    out: dict = {"model": Path(handle.path).name, "max_batch": a.max_batch,
                 "prefill_chunk": handle.runner.prefill_chunk, "arrivals": {}, "prefill": {}}
    for name, ragged in (("separate", False), ("ragged", True)):
        warm = argparse.Namespace(**{**vars(a), "arrivals": 2})
        arrivals(handle, ragged, warm)            # compiles the steps it needs, untimed
        out["arrivals"][name] = arrivals(handle, ragged, a)
    r, s = out["arrivals"]["ragged"], out["arrivals"]["separate"]
    out["arrivals"]["ratios_ragged_vs_separate"] = {
        k: r[k] / s[k] for k in ("itl_p99_ms", "itl_max_ms", "long_seq_tokens_per_s")}
    if a.pp:
        for budget in map(int, a.budgets.split(",")):
            out["prefill"][str(budget)] = {name: prefill(handle, ragged, budget, a.pp)
                                           for name, ragged in (("separate", False),
                                                                ("ragged", True))}
    json.dump(out, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
