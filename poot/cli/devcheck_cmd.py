"""``poot devcheck``: run compiled CUDA programs on the device against oracle fixtures.

    poot devcheck BUNDLE... [--bench N] [--json OUT]

Each BUNDLE is a folder written by ``bench/cuda_bundle.py`` (``plan.json`` + ``kernels.ptx``
+ ``fixtures.npz`` + ``weights.npz``). Every dispatch is run on its own and whole steps are
replayed from one CUDA graph; results are compared with the oracle's. Exit status 1 when any
result is off or any fixture is missing (a bundle without fixtures is a speed run and never
passes). On a machine without MLIR run ``python poot/backends/cuda/devcheck.py`` instead.
"""

from __future__ import annotations

import argparse

from poot.cli import plain


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("devcheck", help="check compiled CUDA programs on the device "
                              "against oracle fixtures", description=plain(__doc__),
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bundles", nargs="+", metavar="BUNDLE")
    p.add_argument("--bench", type=int, default=0, help="also replay N steps and time them")
    p.add_argument("--json", help="write the full report here")
    p.set_defaults(func=run)


def run(args) -> int:
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.backends.cuda.devcheck import main

    argv = list(args.bundles) + ["--bench", str(args.bench)]
    if args.json:
        argv += ["--json", args.json]
    return main(argv)
