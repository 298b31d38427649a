"""Kernel synthesis for a dispatch region, chosen by the region's root op (the GPU analogue
of a kernel configuration): before the generic mapping of :mod:`poot.backends.gpu.kernels`
(linalg -> parallel loops -> one thread or one warp per row), each registered strategy looks
at the region's *poot-level* body and either returns the region's kernels or ``None`` (the
next strategy, and finally the generic mapping, takes it).

A strategy is a function ``(fn, caps) -> Synthesized | None``:

* ``fn``: the outlined dispatch ``func.func`` (poot dialect, static shapes), in the graph's
  context; its arguments are ``("arg", i)`` slots, its results ``("out", j)`` slots.
* ``caps``: the target's :class:`~poot.compiler.target.Capabilities` (subgroup size, shared
  memory, cores).

It matches on semantics (what the ops compute and how the values flow), never on a model or
on one tracer's spelling, and refuses (``None``) anything it does not cover exactly. The
kernels it returns are ``gpu.module`` text (``gpu.func ... kernel`` taking one memref per
argument, static shapes), lowered by every gpu-dialect backend (NVVM, SPIR-V) like the generic
kernels. ``POOT_GPU_STRATEGIES=generic`` turns every strategy off (to compare);
``POOT_GPU_STRATEGIES=a,b`` keeps only the strategies named ``a`` and ``b``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from mlir import ir

from poot.backends.gpu.kernels import DispatchKernels, GpuCodegenError, Launch
from poot import settings


@dataclass
class Synthesized:
    """What a strategy returns: ``text`` holds one or more ``gpu.module``s; ``launches``
    (kernel launches naming ``module``/``kernel`` in ``text``, in order, and plan copies);
    ``scratch``: ``(memref type text, nbytes)`` per temporary buffer (``("scratch", k)``);
    ``consts``: ``(memref type text, nbytes, raw bytes)`` per constant (``("const", k)``)."""

    text: str
    launches: list[Launch]
    scratch: list[tuple[str, int]] = field(default_factory=list)
    consts: list[tuple[str, int, bytes]] = field(default_factory=list)


Strategy = Callable[[ir.Operation, object], "Synthesized | None"]
_STRATEGIES: list[tuple[str, Strategy]] = []
_LOADED = False


_FALLBACKS: list[tuple[str, Strategy]] = []


def register(name: str, first: bool = False, fallback: bool = False):
    """Decorator: add a strategy (tried in registration order; ``first``: before all others,
    for a strategy that recognises its functions by an attribute others must not see;
    ``fallback``: after all others, for one that takes any region of a broad class, so a
    specialised strategy matching the same region wins: ``pointwise`` computes small
    contractions per element, but a projection the GEMV or GEMM matches stays theirs)."""
    def deco(fn: Strategy) -> Strategy:
        if fallback:
            _FALLBACKS.append((name, fn))
        elif first:
            _STRATEGIES.insert(0, (name, fn))
        else:
            _STRATEGIES.append((name, fn))
        return fn
    return deco


def _load() -> None:
    # strategy modules register themselves on import. Keyed on a flag, not on an empty
    # list: a caller that imported one strategy module first (a test importing matmul) must
    # still get every other one (the horizontal fusion strategy among them)
    global _LOADED
    import importlib
    import pkgutil

    _LOADED = True
    for m in pkgutil.iter_modules(__path__):
        if not m.name.startswith("_"):
            importlib.import_module(f"{__name__}.{m.name}")


def synthesize(fn: ir.Operation, caps, kctx: ir.Context) -> DispatchKernels | None:
    """The first strategy's kernels for dispatch ``fn``, parsed into ``kctx``; None when no
    strategy takes it (or ``POOT_GPU_STRATEGIES=generic``)."""
    only = settings.get_str("POOT_GPU_STRATEGIES") or ""
    if only == "generic":
        return None
    allowed = set(only.split(",")) if only else None
    if not _LOADED:
        _load()
    for name, strat in _STRATEGIES + _FALLBACKS:
        if allowed is not None and name not in allowed:
            continue
        with fn.context, ir.Location.unknown():
            s = strat(fn, caps)
        if s is None:
            continue
        with kctx, ir.Location.unknown():
            try:
                module = ir.Module.parse(s.text)
            except Exception as e:  # noqa: BLE001 - MLIR reports parse errors as Exception
                raise GpuCodegenError(f"strategy {name} emitted invalid IR: {e}") from e
        for L in s.launches:
            if L.kind == "kernel" and L.strategy == "naive":
                L.strategy = name
        ftype = ir.FunctionType(ir.TypeAttr(fn.attributes["function_type"]).value)
        return DispatchKernels(module, s.launches, [str(t) for t in ftype.inputs],
                               [str(t) for t in ftype.results], s.scratch, s.consts)
    return None


__all__ = ["Synthesized", "register", "synthesize"]
