"""Decode tokens/s of a MoE model with its experts read in place (``poot.indexed_matmul``,
the sparse spelling of :func:`poot.graph.ops.moe`) vs the dense all-experts graph it
replaces, on one backend. Prints one JSON object.

    python bench/moe_bench.py --config bench/shapes/mixtral-mini.json --dtype q4_0
    python bench/moe_bench.py --config bench/shapes/mixtral-mini.json --dtype bf16 \\
        --backend cuda                                                 # the GPU machine

Two handles of the same random-weight model (``--dtype``: stored as that, packed formats
kept packed): one traced with ``POOT_MOE=sparse``, one with ``POOT_MOE=dense``. One request
of a 16-token prompt generates ``--tokens`` tokens greedily (EOS ignored); tok/s counts
the generated tokens over the decode time (the first token's time, prefill, excluded), the
best of ``--repeats`` runs after a warm-up. ``step_us_*``: the device's time per decode step
(its recording replayed ``--replays`` times back to back, no host work between:
:func:`poot.cli.bench_cmd.replay_entry_us`; where the device records steps), and
``step_ratio`` the dense step's over the sparse one's: the per-token ratio without the host
loop's jitter, which on a GPU is tens of microseconds a token against steps of 0.2-0.4 ms.
``same_tokens``: both spellings chose the same tokens; ``max_logprob_diff``: the largest
difference of the chosen tokens' log-probs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def run(handle, prompt, tokens: int, repeats: int, logprobs: bool = True):
    """(best decode tok/s, token ids, chosen-token log-probs) of greedy generation."""
    from poot.api import Driver
    from poot.api.generate import TokenEvent
    from poot.sampling_params import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True,
                            logprobs=0 if logprobs else None)
    best, ids, lps = 0.0, [], []
    for r in range(repeats + 1):
        t0 = first = None
        ids, lps = [], []
        t0 = time.perf_counter()
        for ev in Driver(handle).generate(prompt, params):
            if isinstance(ev, TokenEvent):
                if first is None:
                    first = time.perf_counter()
                ids.append(ev.token_id)
                lps.append(ev.logprob)
        dt = time.perf_counter() - (first or t0)
        if r:                                  # the first run warms up
            best = max(best, (len(ids) - 1) / dt)
    return best, ids, lps


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--dtype", default="q4_0")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--kv-capacity", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--replays", type=int, default=200,
                    help="replays of the recorded decode step timed for step_us_*")
    ap.add_argument("--no-logprobs", action="store_true",
                    help="no log-probs (a machine without MLIR runs only the samplers "
                         "poot compile built: the greedy one)")
    ap.add_argument("--precision", default="int16", choices=("int16", "int8", "exact"),
                    help="exact: f32 activations (int16/int8 multiply packed weights by "
                         "quantized x on the CPU, so their log-probs differ by that rounding)")
    args = ap.parse_args(argv)

    from poot.api import ModelHandle
    from poot.cli.bench_cmd import decode_entry, replay_entry_us
    from poot.compiler import CompileOptions

    cfg = Path(args.config)
    vocab = json.loads((cfg / "config.json" if cfg.is_dir() else cfg).read_text())["vocab_size"]
    prompt = list(map(int, np.random.default_rng(1).integers(3, min(1000, vocab), 16)))
    out = {"model": Path(args.config).stem, "backend": args.backend, "dtype": args.dtype,
           "precision": args.precision, "tokens": args.tokens}
    res = {}
    for spelling in ("sparse", "dense"):
        os.environ["POOT_MOE"] = spelling
        t0 = time.perf_counter()
        h = ModelHandle.load(args.config, backend=args.backend, kv_capacity=args.kv_capacity,
                             max_batch=1, random_weights=args.dtype,
                             compile_options=CompileOptions(precision=args.precision))
        load_s = time.perf_counter() - t0
        res[spelling] = run(h, prompt, args.tokens, args.repeats, not args.no_logprobs)
        out[f"tok_per_s_{spelling}"] = round(res[spelling][0], 2)
        us = replay_entry_us(h, decode_entry(h), args.replays)
        out[f"step_us_{spelling}"] = None if us is None else round(us, 2)
        out[f"load_s_{spelling}"] = round(load_s, 1)
        del h
    os.environ.pop("POOT_MOE")
    out["ratio"] = round(res["sparse"][0] / res["dense"][0], 3)
    if out["step_us_sparse"] and out["step_us_dense"]:
        out["step_ratio"] = round(out["step_us_dense"] / out["step_us_sparse"], 3)
    out["same_tokens"] = res["sparse"][1] == res["dense"][1]
    n = next((i for i, (a, b) in enumerate(zip(res["sparse"][1], res["dense"][1])) if a != b),
             len(res["sparse"][1]))
    lp = [r[2][:n] for r in (res["sparse"], res["dense"])]
    out["max_logprob_diff"] = float(np.max(np.abs(np.subtract(*lp)))) \
        if n and None not in lp[0] + lp[1] else None
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
