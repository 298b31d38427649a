"""CPU benchmark of the sampler step alone: the engine's standalone sampler program
(:func:`poot.graph.sampling.trace_sampler`) compiled for the host and timed on fixed random
logits. Prints one JSON object: microseconds a step for each feature set asked.

    python bench/cpu_sampler.py [--batch 32] [--vocab 49152] [--steps 20]
                                [--specs greedy stochastic stochastic+top_p ...]

A spec is ``greedy`` or ``+``-joined :class:`~poot.graph.sampling.SamplerSpec` features
(``stochastic``, ``top_k``, ``top_p``, ``min_p``, ``penalties``, ``logit_bias``); ``all`` is
every feature (the default ``SamplerSpec()``). The default vocabulary is SmolLM2's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cpu_step import _timeit, prepared_call  # noqa: E402

FEATURES = ("penalties", "logit_bias", "top_k", "top_p", "min_p", "stochastic")


def spec_of(name: str):
    from poot.graph.sampling import GREEDY, SamplerSpec

    if name in ("all", "greedy"):
        return SamplerSpec() if name == "all" else GREEDY
    on = set(name.split("+"))
    bad = on - set(FEATURES)
    if bad:
        raise SystemExit(f"unknown sampler feature(s) {sorted(bad)}; known: {FEATURES}")
    return SamplerSpec(**{f: f in on for f in FEATURES})


def step_us(batch: int, vocab: int, spec, steps: int) -> float:
    from poot.compiler import CompileOptions, compile
    from poot.compiler.target import host_cpu
    from poot.graph import sampling
    from poot.graph.sampling import SamplerStep

    step = SamplerStep(batch, vocab, batch + 1, spec)
    prog = compile(sampling.trace_sampler(step), host_cpu(), CompileOptions()).executable
    rng = np.random.default_rng(0)
    inputs = {n: np.zeros(t.shape, t.dtype.numpy) for n, t in prog.inputs}
    inputs[sampling.LOGITS][...] = rng.standard_normal(inputs[sampling.LOGITS].shape) * 3
    for name, value in (("temperature", 0.8), ("top_p", 0.9), ("top_k", 40), ("min_p", 0.05),
                        ("repetition_penalty", 1.1), ("uniform", 0.5)):
        key = sampling.INPUTS[name]
        if key in inputs:
            inputs[key][...] = value
    if sampling.HISTORY_ROWS in inputs:
        inputs[sampling.HISTORY_ROWS][...] = np.arange(batch)
    return _timeit(prepared_call(prog, inputs, {}), steps) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--specs", nargs="+",
                    default=["greedy", "stochastic", "stochastic+top_p", "penalties", "all"])
    args = ap.parse_args()
    out = {"batch": args.batch, "vocab": args.vocab, "us_per_step": {}}
    for name in args.specs:
        out["us_per_step"][name] = round(step_us(args.batch, args.vocab, spec_of(name),
                                                 args.steps), 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
