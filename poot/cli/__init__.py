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
from poot.sampling_params import InvalidRequest

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


#: a value that starts like a negative quantity (``-5``, ``-5GiB``, ``-.5``): never an option
_NEGATIVE = re.compile(r"-\.?\d")


def _value_options(parser: argparse.ArgumentParser) -> set[str]:
    """The option strings, over every subcommand, that take exactly one value."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return {s for sub in subs for p in sub.choices.values() for a in p._actions
            if a.option_strings and a.nargs is None for s in a.option_strings}


def attach_negative_values(argv: list[str], options: set[str]) -> list[str]:
    """``argv`` with ``--opt -5GiB`` written ``--opt=-5GiB`` for each of ``options``:
    argparse reads a value that starts with '-' as a missing value unless it is a bare
    number, so a negative quantity with a unit would be refused as the wrong error. The
    option's own check then refuses the negative value by name."""
    out: list[str] = []
    for a in argv:
        if out and out[-1] in options and _NEGATIVE.match(a):
            out[-1] = f"{out[-1]}={a}"
        else:
            out.append(a)
    return out


def option_error(e: InvalidRequest, command: argparse.ArgumentParser) -> str:
    """The one-line CLI message of an invalid value: ``--kv-dtype='q9': must be one of ...``
    when ``e.field`` is (or spells, with '_' for '-') an option of ``command``; else ``e``'s
    own message."""
    opt = e.field if e.field.startswith("-") else "--" + e.field.replace("_", "-")
    if opt not in command._option_string_actions:
        return str(e)
    return f"{opt}={e.value!r}: {e.reason}"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    args, unknown = parser.parse_known_args(attach_negative_values(argv, _value_options(parser)))
    if unknown:       # the subcommand's usage and error (exit 2), not the top level's
        args.command_parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        return int(args.func(args) or 0)
    except InvalidRequest as e:
        print(f"poot: error: {option_error(e, args.command_parser)}", file=sys.stderr)
        return 2
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
