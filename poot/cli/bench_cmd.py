"""``poot bench``: greedy decode speed and time to first token, as JSON.

    poot bench [--model MODEL] [--backend B] [--prompt-tokens N] [--tokens N] [--runs R]

Runs R greedy requests of N new tokens (EOS ignored) on a synthetic prompt of
``--prompt-tokens`` ids (or ``--prompt`` text) after one warm-up request, and prints
``{"model", "backend", "prompt_tokens", "generated_tokens", "ttft_s", "decode_tokens_per_s",
"load_s", "compile_s", "runs": [...]}`` (the best run's numbers at the top level;
``compile_s`` maps entry names such as ``"prefill"`` and ``"decode"`` to seconds).
"""

from __future__ import annotations

import argparse
import json

from poot.cli.generate_cmd import add_model_args, check_options, load_handle


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("bench", help="print decode tokens/s and time to first token",
                              description="Print greedy decode speed and time to first "
                              "token as one JSON object.")
    add_model_args(p)
    p.add_argument("--prompt", default=None, help="prompt text (default: synthetic ids)")
    p.add_argument("--prompt-tokens", type=int, default=32, metavar="N",
                   help="length of the synthetic prompt when no --prompt (default: 32)")
    p.add_argument("--tokens", type=int, default=64, metavar="N",
                   help="new tokens per run, EOS ignored (default: 64)")
    p.add_argument("--runs", type=int, default=3, metavar="R",
                   help="timed runs after one warm-up; the best is reported (default: 3)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from poot.api import Driver
    from poot.driver.params import SamplingParams

    check_options(args, "tokens", "runs", "prompt_tokens", "kv_capacity", "prefill_chunk")
    handle = load_handle(args)
    if args.prompt is not None:
        prompt = handle.encode(args.prompt)
    else:
        vocab = handle.runner.vocab_size
        prompt = [(17 + 31 * i) % vocab for i in range(args.prompt_tokens)]
    params = SamplingParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True)
    drv = Driver(handle)
    drv.complete(prompt, SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True))
    runs = [drv.complete(prompt, params).stats.to_dict() for _ in range(args.runs)]
    best = max(runs, key=lambda r: r["decode_tokens_per_s"] or 0.0)
    out = {"model": str(handle.path), "backend": handle.backend,
           "prompt_tokens": best["prompt_tokens"], "generated_tokens": best["generated_tokens"],
           "ttft_s": min(r["ttft_s"] for r in runs),
           "decode_tokens_per_s": best["decode_tokens_per_s"],
           "kv_capacity": handle.runner.kv_capacity,
           "load_s": handle.load_s, "compile_s": handle.runner.compile_s, "runs": runs}
    print(json.dumps(out))
    return 0
