"""``poot matrix``: the feature matrix, compiled now (:mod:`poot.matrix`).

    poot matrix                                   # every family x format x backend
    poot matrix --family llama --backend cpu --format q4_1
    poot matrix --json cells.json                 # also every cell, with its reason
    poot matrix --readme README.md                # rewrite the README's table in place

Each cell compiles one step of a family's tiny random-init fixture (``test/fixtures/tiny``,
or ``--fixtures DIR``) with every weight matrix in one format, for one backend, compile-only
(no device needed), and reports ok or the typed refusal. Prints the Markdown table: a row per
family, a column per format, each cell naming the backends that compile it, then each
reason once. Exits 1 if a cell failed with an error that is not a typed refusal (a bug).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from poot.cli import plain

#: the README's table lies between these two lines (``--readme``)
BEGIN, END = "<!-- poot matrix: begin -->", "<!-- poot matrix: end -->"


def register(subparsers: argparse._SubParsersAction) -> None:
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.backends.registry import BACKENDS
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.matrix import FORMATS

    p = subparsers.add_parser("matrix", help="compile every family x weight format x backend "
                              "and print what compiles", description=plain(__doc__),
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", action="append", default=None, metavar="NAME",
                   help="a family to include (repeatable; default: all)")
    p.add_argument("--format", action="append", choices=FORMATS, default=None)
    p.add_argument("--backend", action="append", choices=tuple(BACKENDS), default=None)
    p.add_argument("--fixtures", default=None, metavar="DIR",
                   help="config folders to take each family's first from")
    p.add_argument("--json", default=None, metavar="FILE", help="write every cell as JSON")
    p.add_argument("--readme", default=None, metavar="FILE",
                   help=f"replace the table between {BEGIN!r} and {END!r} in FILE")
    p.add_argument("--quiet", action="store_true", help="no per-cell progress on stderr")
    p.set_defaults(func=run)


def replace_block(text: str, table: str, where: str) -> str:
    """``text`` with the lines between :data:`BEGIN` and :data:`END` replaced by ``table``.
    Raises :class:`~poot.matrix.MatrixError` naming ``where`` when the markers are missing."""
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.matrix import MatrixError

    i, j = text.find(BEGIN), text.find(END)
    if i < 0 or j < i:
        raise MatrixError(f"{where} has no '{BEGIN}' ... '{END}' block to replace")
    return text[:i + len(BEGIN)] + "\n" + table + text[j:]


def run(args) -> int:
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.matrix import feature_matrix, fixtures_root, markdown, to_json

    root = Path(args.fixtures) if args.fixtures else fixtures_root()

    def progress(c):
        if not args.quiet:
            print(f"{c.family}/{c.fmt}/{c.backend}: {c.status}", file=sys.stderr, flush=True)

    cells = feature_matrix(root, args.family, args.format, args.backend, on_cell=progress)
    table = markdown(cells)
    if args.json:
        Path(args.json).write_text(to_json(cells))
    if args.readme:
        path = Path(args.readme)
        path.write_text(replace_block(path.read_text(), table, str(path)))
    print(table, end="")
    return 1 if any(c.status == "error" for c in cells) else 0
