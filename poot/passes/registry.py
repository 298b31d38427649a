"""The registry of poot's Python passes and the pipeline runner that mixes them with upstream
MLIR passes.

A poot pass is a function ``run(module_op: ir.Operation, **options)`` registered with
:func:`register_pass` under a ``poot-<name>`` argument; it raises :class:`PassFailure` (or
returns normally). MLIR 22 does not accept Python pass names inside ``PassManager.parse``
strings, so :func:`build_pass_manager` splits a textual pipeline into runs of upstream passes
(one ``pm.add("a,b,c")`` each) and poot passes (``pm.add(fn)``), in order.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

from poot.lazy import lazy_module
ir = lazy_module("mlir.ir")
passmanager = lazy_module("mlir.passmanager")

from poot.errors import PootError
import poot.passes as pkg


class PassFailure(PootError):
    """A pass could not transform the IR; the message names the pass and the op."""


class PipelineError(PootError):
    """A textual pipeline that does not parse or names an unknown pass option."""


@dataclass(frozen=True)
class PassInfo:
    """A registered poot pass: its ``poot-...`` argument, a one-line summary, the function
    and its options (name -> (type, default, help))."""

    argument: str
    summary: str
    run: Callable[..., None]
    options: dict[str, tuple[type, object, str]] = field(default_factory=dict)


PASSES: dict[str, PassInfo] = {}


def register_pass(argument: str, summary: str, options: dict | None = None):
    """Decorator registering ``fn(module_op, **options)`` as pass ``argument``."""
    if not argument.startswith("poot-"):
        raise ValueError(f"poot pass arguments are namespaced poot-*: {argument}")

    def deco(fn):
        PASSES[argument] = PassInfo(argument, summary, fn, dict(options or {}))
        return fn

    return deco


def load_all_passes() -> dict[str, PassInfo]:
    """Import every pass module (registration happens at import)."""
    import importlib
    import pkgutil

    for m in pkgutil.iter_modules(pkg.__path__):
        if m.name not in ("registry", "pipelines"):
            importlib.import_module(f"poot.passes.{m.name}")
    return PASSES


def split_top_level(text: str) -> list[str]:
    """Split ``a,b{x=1,y=2},func.func(c,d)`` at top-level commas."""
    items, depth, cur = [], 0, []
    for ch in text:
        if ch in "({":
            depth += 1
        elif ch in ")}":
            depth -= 1
        if ch == "," and depth == 0:
            items.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if depth != 0:
        raise PipelineError(f"unbalanced brackets in pipeline '{text}'")
    if "".join(cur).strip():
        items.append("".join(cur).strip())
    return items


def parse_pipeline(text: str) -> list[str]:
    """The top-level pass items of ``builtin.module(...)`` (or of a bare list)."""
    text = text.strip()
    m = re.fullmatch(r"builtin\.module\((.*)\)", text, re.S)
    return split_top_level(m.group(1) if m else text)


def _parse_options(info: PassInfo, text: str) -> dict:
    opts = {}
    for item in filter(None, (s.strip() for s in text.split(" "))):
        key, eq, value = item.partition("=")
        if key not in info.options:
            raise PipelineError(f"pass '{info.argument}' has no option '{key}'; options: "
                                f"{', '.join(info.options) or 'none'}")
        typ = info.options[key][0]
        try:
            opts[key] = (value.lower() in ("1", "true")) if typ is bool else typ(value)
        except ValueError:
            raise PipelineError(f"pass '{info.argument}' option '{key}': bad value "
                                f"'{value}'") from None
        if not eq:
            opts[key] = True
    return opts


def run_verified(info: PassInfo, op: ir.Operation, opts: dict) -> None:
    """Run a poot pass, then check every poot op it left against its rule."""
    from poot.dialects.verify import verify_module  # lazy: MLIR

    info.run(op, **opts)
    diags = verify_module(op)
    if diags:
        raise PassFailure(f"{info.argument} produced invalid IR:\n" +
                          "\n".join(str(d) for d in diags))


def _wrap(info: PassInfo, opts: dict):
    def run(op, pass_):
        try:
            run_verified(info, op, opts)
        except PassFailure as e:
            _FAILURES.append(str(e))
            pass_.signal_pass_failure()

    return run


_FAILURES: list[str] = []


def take_failures() -> list[str]:
    """Messages of poot passes that failed since the last call."""
    out = list(_FAILURES)
    _FAILURES.clear()
    return out


def build_pass_manager(pipeline: str, ctx: ir.Context) -> "passmanager.PassManager":
    """A PassManager running ``pipeline``: poot and upstream passes mixed, in order."""
    load_all_passes()
    pm = passmanager.PassManager("builtin.module", context=ctx)
    upstream: list[str] = []

    def flush():
        if upstream:
            try:
                pm.add(",".join(upstream))
            except Exception as e:  # noqa: BLE001 - MLIR raises a bare ValueError/RuntimeError
                raise PipelineError(f"bad upstream pipeline '{','.join(upstream)}': {e}")
            upstream.clear()

    for item in parse_pipeline(pipeline):
        name, _, rest = item.partition("{")
        info = PASSES.get(name.strip())
        if info is None:
            if name.strip().startswith("poot-"):
                raise PipelineError(f"unknown poot pass '{name.strip()}'; registered: "
                                    f"{', '.join(sorted(PASSES))}")
            upstream.append(item)
            continue
        flush()
        opts = _parse_options(info, rest.rstrip("}")) if rest else {}
        pm.add(_wrap(info, opts), name=info.argument, argument=info.argument)
    flush()
    return pm
