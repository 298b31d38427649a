"""The ``poot`` command line: one module per subcommand, each exposing ``register(sub)``.

A :class:`~poot.errors.PootError` raised by a subcommand is printed as one line
``poot: error: ...`` on stderr with exit status 2; no traceback reaches the user.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys

from poot.errors import PootError

# Subcommand modules, in --help order. Each defines register(subparsers).
_SUBCOMMANDS = ("generate", "chat", "serve", "embed", "bench", "compile", "inspect",
                "tokenize", "devices", "devcheck", "matrix")


class InputError(PootError):
    """Command-line input poot cannot use (stdin that is not UTF-8, ...)."""


def read_stdin_text(what: str = "stdin") -> str:
    """All of stdin decoded as strict UTF-8; :class:`InputError` naming the first bad byte."""
    data = sys.stdin.buffer.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{what} is not valid UTF-8 at byte {e.start} "
                         f"(0x{data[e.start]:02x})") from None


def check_utf8(text: str, what: str) -> None:
    """:class:`InputError` when ``text`` (a command-line argument, decoded by Python with
    ``surrogateescape``) holds bytes that are not UTF-8."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        at = len(text[:e.start].encode("utf-8", "surrogateescape"))
        raise InputError(f"{what} is not valid UTF-8 at byte {at}") from None


def plain(doc: str) -> str:
    """A docstring as plain ``--help`` text: RST roles (``:class:`~a.B``` -> ``B``) and double
    backticks removed."""
    doc = re.sub(r":[a-z]+:`~?([^`]*?)`", lambda m: m.group(1).rsplit(".", 1)[-1]
                 if m.group(0).count("~") else m.group(1), doc)
    return doc.replace("``", "")


def build_parser() -> argparse.ArgumentParser:
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    import poot

    parser = argparse.ArgumentParser(prog="poot", description="poot: an LLM inference compiler")
    parser.add_argument("--version", action="version", version=f"poot {poot.__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in _SUBCOMMANDS:
        importlib.import_module(f"poot.cli.{name}_cmd").register(sub)
    for command in sub.choices.values():
        command.set_defaults(command_parser=command)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:       # the subcommand's usage and error (exit 2), not the top level's
        args.command_parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        return int(args.func(args) or 0)
    except PootError as e:
        print(f"poot: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        print("poot: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
