"""Kernel synthesis for a dispatch region, chosen by the region's root op (the GPU analogue
of a kernel configuration): before the generic mapping of :mod:`poot.backends.gpu.kernels`
(linalg -> parallel loops -> one thread or one warp per row), planning tries the strategies
of :data:`STRATEGIES` in order; each looks at the region's *poot-level* body and either
returns the region's kernels or ``None`` (the next strategy, and finally the generic mapping,
takes it). The first that returns kernels wins, so the order is the policy: the list says
why each entry sits where it does.

A strategy is a function ``(fn, caps) -> Synthesized | None``:

* ``fn``: the outlined dispatch ``func.func`` (poot dialect, static shapes), in the graph's
  context; its arguments are ``("arg", i)`` slots, its results ``("out", j)`` slots.
* ``caps``: the target's :class:`~poot.compiler.target.Capabilities` (subgroup size, shared
  memory, cores).

It matches on semantics (what the ops compute and how the values flow), never on a model or
on one tracer's spelling, and refuses (``None``) anything it does not cover exactly. The
kernels it returns (:class:`~poot.backends.gpu.strategies.emit.Synthesized`) are
``gpu.module`` text (``gpu.func ... kernel`` taking one memref per argument, static shapes),
lowered by every gpu-dialect backend (NVVM, SPIR-V) like the generic kernels; the emit helpers
they share are in :mod:`poot.backends.gpu.strategies.emit`. ``POOT_GPU_STRATEGIES=generic``
turns every strategy off (to compare); ``POOT_GPU_STRATEGIES=a,b`` keeps only the strategies
named ``a`` and ``b``.
"""

from __future__ import annotations

from typing import Callable

from mlir import ir

from poot import settings
from poot.backends.gpu.horizontal import horizontal_kernels
from poot.backends.gpu.kernels import DispatchKernels, GpuCodegenError
# the modules, not their strategy functions: several share their module's name (gemm,
# pointwise, rowreduce, scatter), and a function bound here would hide the submodule
from poot.backends.gpu.strategies import (
    attention,
    gemm,
    gemm_decode,
    gemm_decode_wgmma,
    indexed,
    matmul,
    pointwise,
    rowreduce,
    scatter,
)
from poot.backends.gpu.strategies.emit import Synthesized

Strategy = Callable[[ir.Operation, object], "Synthesized | None"]


def horizontal(fn: ir.Operation, caps) -> Synthesized | None:
    """Strategy ``horizontal`` (:func:`poot.backends.gpu.horizontal.horizontal_kernels`): a
    merged function's members, each synthesized by this same list, as one kernel per phase."""
    got = horizontal_kernels(fn, caps, synthesize)
    return None if got is None else Synthesized(*got)


#: The strategies planning tries, in order: ``(name, strategy)``. The first that returns
#: kernels takes the region; none: the generic mapping (:func:`~poot.backends.gpu.kernels.
#: build_dispatch`).
STRATEGIES: tuple[tuple[str, Strategy], ...] = (
    # first: it recognises a merged function by its poot.dispatch members attribute, which
    # only it may split back into members (every other strategy would see one big body)
    ("horizontal", horizontal),
    # attention (one poot.attention / paged_attention root): nothing below takes it
    ("flash_decode", attention.flash_decode),
    # last-axis row reductions and their elementwise consumers (norms, softmax, sampling):
    # ahead of the matmul strategies, so a region both could take (row reductions whose
    # consumers hold a small contraction, computed per element) stays one row kernel
    ("rowreduce", rowreduce.rowreduce),
    # decode matmuls (a few rows of x times a weight, a norm folded in front): before the
    # GEMM, which it consults itself (matmul.gemm_defers) to leave it the rows it takes
    ("gemv", matmul.gemv),
    # the same regions on sm_90a's warpgroup MMA (wgmma): before the mma.sync decode GEMM,
    # which takes them on targets without it
    ("gemm_decode_wgmma", gemm_decode_wgmma.gemm_decode_wgmma),
    # batched-decode matmuls on tensor cores (3..128 rows of 16-bit weights, 9..128 of packed
    # ones): before the tiled GEMM, which would take the same rows with tiles that stream
    # the weight at a fraction of the bandwidth at these M
    ("gemm_decode", gemm_decode.gemm_decode),
    # prefill matmuls on tensor cores (mma / MFMA / WMMA), the rows the GEMV leaves it
    ("gemm", gemm.gemm),
    # a MoE layer's expert GEMVs selected by an index (poot.indexed_matmul): after the GEMV,
    # whose indexed match streams them faster; this takes what it refuses (formats without
    # a unit decoder, an x with a folded norm)
    ("indexed_gemv", indexed.indexed_gemv),
    # KV cache writes (a poot.scatter root)
    ("scatter", scatter.scatter),
    # last: it takes any region of the elementwise class (small contractions computed per
    # element), so every specialised strategy above matching the same region wins: a
    # projection the GEMV or GEMM matches stays theirs
    ("pointwise", pointwise.pointwise),
)


def synthesize(fn: ir.Operation, caps, kctx: ir.Context) -> DispatchKernels | None:
    """The first strategy's kernels for dispatch ``fn``, parsed into ``kctx``; None when no
    strategy takes it (or ``POOT_GPU_STRATEGIES=generic``). Raises
    :class:`~poot.backends.gpu.kernels.GpuCodegenError` when a strategy emits invalid IR."""
    only = settings.get_str("POOT_GPU_STRATEGIES") or ""
    if only == "generic":
        return None
    allowed = set(only.split(",")) if only else None
    for name, strat in STRATEGIES:
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


__all__ = ["STRATEGIES", "Strategy", "Synthesized", "horizontal", "synthesize"]
