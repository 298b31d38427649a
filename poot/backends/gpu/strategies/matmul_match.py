"""Matching a matmul region against weights (decode GEMV or prefill GEMM): the
:class:`GemvMatch` of a dispatch body, ``epilogue(x @ W)`` with x an argument or an
elementwise expression (a folded norm's row reductions as its prologue) and W a dense or
packed weight argument, and the kernel parameters of such a match. Shared by the GEMV
(:mod:`.matmul`) and the tensor-core GEMM (:mod:`.gemm`), which take different rows of the
same regions (:func:`gemm_rows`); it emits no kernel itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mlir import ir

from poot.backends.gpu.strategies.emit import (
    KernelEmitter,
    ScalarEmitter,
    ScalarUnsupported,
    arg_number,
    buffer_type,
    defining_op,
    maybe_poot_type,
)
from poot.backends.gpu.strategies.rowreduce import per_element_reduction, reduce_kind
from poot.dialects.types import DType, PackedType, TensorType


#: largest M (rows of x: batch x new tokens) taken; larger M (prefill) stays generic
MAX_M = 8


#: ... and narrow matmuls: N <= SMALL_N output columns with M <= SMALL_N_MAX_M rows (a rank-16
#: LoRA shrink at batch 32, an MoE router) where the tensor-core GEMM (tried first) refuses
#: them: f32 weights, a folded norm, targets without mma. The GEMM takes the others: its
#: split-K spreads their K over blocks, while the GEMV's warp a column re-reads all of x per
#: column (a 16 x 8192 bf16 shrink at M = 32: 16 us as a GEMV on an H200, 5.3 as the GEMM).
SMALL_N, SMALL_N_MAX_M = 64, 32


#: ... and dense 16-bit weights from GEMM_FROM_M rows up: the GEMM's where it takes them
#: (:func:`.matmul.gemm_defers`). Measured on an H200 (weights streamed from DRAM, Llama-3.2-1B
#: projections and LM head, bench/results/gemm.md): at M = 2 the split-K GEMM was
#: already 3-13% faster than this kernel, at M = 4 1.3-2x, at M = 8 2-3.7x (the GEMV's M
#: accumulators a lane and re-reads of x per column). Below it the GEMV keeps what the GEMM
#: lacks: a folded norm, several matmuls of one x in one launch.
GEMM_FROM_M = 3


def gemv_rows(M: int, N: int) -> bool:
    """Whether the GEMV takes an [M, K] x [K, N] matmul region: M <= :data:`MAX_M`, or a
    narrow one (N <= :data:`SMALL_N`, M <= :data:`SMALL_N_MAX_M`) that the GEMM refused."""
    return M <= MAX_M or (N <= SMALL_N and M <= SMALL_N_MAX_M)


#: packed formats this kernel decodes, by IR name -> (block bytes, elements per block)
PACKED = {"q4_0": (18, 32), "q4_1": (20, 32), "q8_0": (34, 32), "q4_k": (144, 256),
          "q6_k": (210, 256)}


_DENSE = (DType.F32, DType.BF16, DType.F16)


@dataclass
class _Weight:
    arg: int
    layout: str                    # "packed" [N, K] | "nk" dense [N, K] | "kn" dense [K, N]
    fmt: str = ""                  # packed format name
    dtype: DType = DType.F32       # dense storage dtype
    nbytes: int = 0


@dataclass
class GemvMatch:
    """A matched decode GEMV region: ``outs[j][l] = epilogue_j(sum_k x[m, k] * w[k, n])`` at
    row-major flat index ``l = m * N + n`` of every result ``outs[j]`` (of poot type
    ``out_ts[j]``; e.g. the logits and the sampler's ``logits - logits`` finiteness probe);
    ``x`` is the matmul's [M, K] f32 LHS, ``x_arg`` the function argument it views (None:
    ``x`` is an expression, whose row reductions are ``prologue``: ``(poot.reduce op,
    coordinates of its result)`` in dependency order). ``weights[i]`` (a function argument)
    is the RHS of the matmul whose result is ``roots[i]``: a region may hold several matmuls
    of the same x (all [M, K] x [K, N], weights of one storage format), whose results the
    epilogue combines elementwise (the SwiGLU ``silu(x @ Wg) * (x @ Wu)`` once the gate's
    region is folded into the up projection's)."""

    M: int
    N: int
    K: int
    x: ir.Value
    x_arg: int | None
    weights: list
    roots: list
    outs: list
    out_ts: list
    prologue: list = field(default_factory=list)
    #: x = k-factors * row factors (see :func:`_defer`): (k factors, row factors) or None
    deferred: tuple | None = None
    #: an indexed region (``poot.indexed_matmul``: row m of x against slab ``idx[m]`` of
    #: [E, N, K] weights): the [M] index tensor, else None; ``E`` slabs a weight
    idx: ir.Value | None = None
    E: int = 1

    @property
    def weight(self) -> _Weight:
        """The (first) weight: the only one of a region with one matmul."""
        return self.weights[0]

    @property
    def root(self) -> ir.Value:
        """The (first) matmul result."""
        return self.roots[0]


def _strip(v: ir.Value, names: tuple[str, ...]) -> ir.Value:
    while (o := defining_op(v)) is not None and o.name in names:
        v = o.operands[0]
    return v


def _f32_cast(o) -> bool:
    """A ``poot.cast`` widening a float tensor to f32 (legalization of bf16/f16 compute)."""
    if o is None or o.name != "poot.cast":
        return False
    a, r = maybe_poot_type(o.operands[0]), maybe_poot_type(o.results[0])
    return isinstance(a, TensorType) and a.dtype in _DENSE and r.dtype is DType.F32


def _match_weight(v: ir.Value, N: int, K: int) -> _Weight | None:
    o = defining_op(v)
    if _f32_cast(o):
        v, o = o.operands[0], defining_op(o.operands[0])
    if o is not None and o.name == "poot.transpose":
        if list(ir.DenseI64ArrayAttr(o.attributes["perm"])) != [1, 0]:
            return None
        v = o.operands[0]
        o = defining_op(v)
        if o is not None and o.name == "poot.dequantize":
            a = arg_number(o.operands[0])
            t = maybe_poot_type(o.operands[0])
            if a is None or not isinstance(t, PackedType) or t.format.name not in PACKED \
                    or tuple(t.shape) != (N, K) or K % PACKED[t.format.name][1]:
                return None
            return _Weight(a, "packed", fmt=t.format.name, nbytes=t.nbytes)
        if _f32_cast(o):
            v = o.operands[0]
        layout, shape = "nk", (N, K)
    else:
        layout, shape = "kn", (K, N)
    a, t = arg_number(v), maybe_poot_type(v)
    if a is None or not isinstance(t, TensorType) or t.dtype not in _DENSE or \
            tuple(t.shape) != shape or t.nbytes % 4:
        return None
    return _Weight(a, layout, dtype=t.dtype, nbytes=t.nbytes)


def _match_slabs(v: ir.Value, E: int, N: int, K: int) -> _Weight | None:
    """The weight of an indexed matmul: E slabs [N, K] stored [E, N, K] (slab e's row n is row
    ``e * N + n`` of an [E * N, K] weight), dense (widened by a cast) or packed (dequantized)."""
    o = defining_op(v)
    if _f32_cast(o):
        v, o = o.operands[0], defining_op(o.operands[0])
    if o is not None and o.name == "poot.dequantize":
        a, t = arg_number(o.operands[0]), maybe_poot_type(o.operands[0])
        if a is None or not isinstance(t, PackedType) or t.format.name not in PACKED \
                or tuple(t.shape) != (E, N, K) or K % PACKED[t.format.name][1]:
            return None
        return _Weight(a, "packed", fmt=t.format.name, nbytes=t.nbytes)
    a, t = arg_number(v), maybe_poot_type(v)
    if a is None or not isinstance(t, TensorType) or t.dtype not in _DENSE or \
            tuple(t.shape) != (E, N, K) or t.nbytes % 4:
        return None
    return _Weight(a, "nk", dtype=t.dtype, nbytes=t.nbytes)


def match_indexed(fn: ir.Operation, max_matmuls: int = 1) -> GemvMatch | None:
    """A region rooted at ``poot.indexed_matmul`` (a MoE layer's selected experts:
    ``y[m, n] = sum_k x[m, k] * w[idx[m], n, k]``, up to ``max_matmuls`` of one x and one idx,
    the SwiGLU gate folded into the up projection) as a GEMV whose every row ``m`` reads its
    own slab: the kernel takes one row a block row (grid y), so each block streams one
    expert's rows exactly as the plain GEMV streams a weight's, and only the selected slabs
    are read. x is an argument or an elementwise expression (no folded norm); None otherwise."""
    return match(fn, max_matmuls=max_matmuls, indexed=True)


def match(fn: ir.Operation, gemv_only: bool = True, max_matmuls: int = 1,
          indexed: bool = False) -> GemvMatch | None:
    """The region's GEMV, or None when ``fn`` is not exactly one (see the module doc).
    ``gemv_only``: only shapes :func:`gemv_rows` gives the GEMV (False: any M; the GEMM
    strategy of :mod:`.gemm` matches the same regions for the other shapes);
    ``max_matmuls``: the most matmuls of the same x taken (see :class:`GemvMatch`);
    ``indexed``: match ``poot.indexed_matmul`` instead (:func:`match_indexed`)."""
    block = fn.regions[0].blocks[0]
    ops = [o.operation for o in block.operations]
    name, other = ("poot.indexed_matmul", "poot.matmul") if indexed else \
        ("poot.matmul", "poot.indexed_matmul")
    mms = [o for o in ops if o.name == name]
    if not mms or len(mms) > max_matmuls or ops[-1].name != "func.return" or \
            not len(ops[-1].operands) or any(o.name == other for o in ops):
        return None
    shapes = set()
    for mm in mms:
        lt, rt, yt = (maybe_poot_type(v) for v in (mm.operands[0], mm.operands[1], mm.results[0]))
        if not all(isinstance(t, TensorType) for t in (lt, rt, yt)) or lt.rank != 2 or \
                lt.dtype is not DType.F32 or yt.dtype is not DType.F32 or \
                mm.operands[0] != mms[0].operands[0] or \
                (indexed and (rt.rank != 3 or mm.operands[2] != mms[0].operands[2])):
            return None
        shapes.add((lt.shape[0], lt.shape[1], rt.shape[-2] if indexed else rt.shape[1],
                    rt.shape[0] if indexed else 1))
    if len(shapes) != 1:
        return None
    M, K, N, E = shapes.pop()
    if gemv_only and not indexed and not gemv_rows(M, N):
        return None
    x = _strip(mms[0].operands[0], ("poot.reshape",))
    xa, xt = arg_number(x), maybe_poot_type(x)
    if xa is not None and (not isinstance(xt, TensorType) or xt.dtype is not DType.F32):
        return None
    ws = [_match_slabs(mm.operands[1], E, N, K) if indexed else
          _match_weight(mm.operands[1], N, K) for mm in mms]
    if any(w is None or w.arg == xa for w in ws) or len({w.arg for w in ws}) != len(ws) or \
            len({(w.layout, w.fmt, w.dtype) for w in ws}) != 1:
        return None                  # one storage format: one unit loop decodes them all
    outs = list(ops[-1].operands)
    ots = [maybe_poot_type(o) for o in outs]
    if any(not isinstance(ot, TensorType) or ot.numel != M * N for ot in ots):
        return None
    m = GemvMatch(M, N, K, mms[0].operands[0], xa, ws, [mm.results[0] for mm in mms],
                  outs, ots, idx=mms[0].operands[2] if indexed else None, E=E)
    if xa is None:
        pro = _prologue(fn, m)
        if pro is None or (pro and indexed):
            return None              # (an indexed region's x: elementwise only)
        m.prologue = pro
        m.deferred = _defer(fn, m)
    return m if _elementwise_epilogue(fn, m) else None


def _prologue(fn: ir.Operation, m: GemvMatch) -> list | None:
    """The row reductions the expression ``x`` reads (see :class:`GemvMatch`), found by
    emitting (and throwing away) x's elements ``(row, k)`` for every row at a symbolic ``k``:
    the row of each reduction read must fold to integers (a read at another coordinate of k
    would be another row per element), and so must the rows its own operand reads. None when
    x is not that (an op outside the elementwise class, a reduction :func:`~.rowreduce.
    reduce_kind` refuses, ...)."""
    order: list = []
    busy: set = set()
    se = ScalarEmitter(fn, KernelEmitter())

    def provide(v, idx):
        o = defining_op(v)
        if o is None or o.name != "poot.reduce" or per_element_reduction(o):
            return None               # (a small reduction: the emitter computes it per element)
        if reduce_kind(o) is None or not all(isinstance(c, int) for c in idx):
            raise ScalarUnsupported("not a row reduction read at a known row")
        key = (v, tuple(idx))
        if key not in busy:
            busy.add(key)
            with se.scope():
                se.value(o.operands[0], list(idx) + [f"%c{len(busy)}"])
            order.append((o, tuple(idx)))
        return "%r"

    se.provide = provide
    try:
        for row in range(m.M):
            with se.scope():
                se.value(m.x, (row, "%k"))
    except ScalarUnsupported:
        return None
    return order


def _mul_factors(v: ir.Value, M: int, K: int) -> list[ir.Value]:
    """The factors of ``v`` (M * K elements, last axis K) through ``poot.binary mul`` and
    row-preserving reshapes (M * K elements, last axis K): each factor's element at row-major
    flat index ``m * K + k`` multiplies into ``v``'s."""
    t, o = maybe_poot_type(v), defining_op(v)
    if not isinstance(t, TensorType) or t.numel != M * K or not t.rank or t.shape[-1] != K \
            or o is None:
        return [v]
    if o.name == "poot.reshape":
        return _mul_factors(o.operands[0], M, K)
    if o.name == "poot.binary" and ir.StringAttr(o.attributes["fn"]).value == "mul":
        return _mul_factors(o.operands[0], M, K) + _mul_factors(o.operands[1], M, K)
    return [v]


def factor_at(se: ScalarEmitter, f: ir.Value, row: int, k) -> str:
    """Coordinates of element ``(row, k)`` of x in the factor ``f`` (:func:`_mul_factors`:
    last axis k, the rows laid out row-major over the others)."""
    return se.delinearize(row, maybe_poot_type(f).shape[:-1]) + [k]


def _defer(fn: ir.Operation, m: GemvMatch) -> tuple | None:
    """``(k factors, row factors)`` when an expression x (a folded norm) is a product whose
    factors either read no row reduction (``h``, the norm's weight) or read only reductions
    and are constant along k (RMSNorm's ``rsqrt(mean(h^2) + eps)``), and every reduction is
    a single-pass f32 ``sum`` whose operand reads no other reduction; else None.

    Then ``sum_k x[m, k] w[k, n] = s[m] * sum_k a[m, k] w[k, n]`` with ``a`` the product of
    the k factors and ``s`` the row factors' (a per-row scale commutes with the dot), and the
    sums the row factors read accumulate in the same pass over k as the dot: no reduction
    pass before the main loop, so the norm folds into any GEMV (split-K ones included) at
    the cost of reading its weight next to h. LayerNorm (its variance reads the mean) is
    refused here and keeps the per-warp prologue."""
    if not m.prologue:
        return None
    for r, _ in m.prologue:
        rt = maybe_poot_type(r.operands[0])
        if reduce_kind(r) != "sum" or rt.dtype is not DType.F32 or rt.shape[-1] != m.K:
            return None              # (its sum accumulates over the dot's own k elements)
    kf, rf = [], []
    for f in _mul_factors(m.x, m.M, m.K):
        ft = maybe_poot_type(f)
        if not isinstance(ft, TensorType) or ft.dtype is not DType.F32:
            return None
        reads = []
        probe = "%kprobe"

        def provide(v, idx, reads=reads):
            o = defining_op(v)
            if o is not None and o.name == "poot.reduce" and not per_element_reduction(o):
                reads.append(v)
                return "%r"
            return None
        em = KernelEmitter()
        se = ScalarEmitter(fn, em, provide=provide)
        try:
            for row in range(m.M):
                with se.scope():
                    se.value(f, factor_at(se, f, row, probe))
        except ScalarUnsupported:
            return None
        if not reads:
            kf.append(f)
        elif probe not in em.text():
            rf.append(f)
        else:
            return None               # reads a reduction and varies along k
    if not rf:
        return None
    for r, row in m.prologue:          # each reduction's operand: no reduction read
        def refuse(v, idx):
            o = defining_op(v)
            if o is not None and o.name == "poot.reduce" and not per_element_reduction(o):
                raise ScalarUnsupported("a reduction reads another")
            return None
        try:
            ScalarEmitter(fn, KernelEmitter(), provide=refuse).value(
                r.operands[0], list(row) + ["%kprobe"])
        except ScalarUnsupported:
            return None
    return kf, rf


def _elementwise_epilogue(fn: ir.Operation, m: GemvMatch) -> bool:
    """Whether output element ``l = m * N + n`` needs the matmul result at ``(m, n)`` only
    and otherwise what :mod:`.emit` computes: emitted (and thrown away) at sample
    coordinates, which fold to integers through every view, so a reordering view (a transpose,
    a broadcast of the result) or a data-dependent read of the result shows as another
    coordinate."""
    ns = sorted({0, 1, 2, m.N // 3, m.N // 2, m.N - 2, m.N - 1} & set(range(m.N)))
    # every row of a decode GEMV; sample rows of a prefill GEMM (M up to thousands) as columns
    rows = range(m.M) if m.M <= MAX_M else \
        sorted({0, 1, 2, m.M // 3, m.M // 2, m.M - 2, m.M - 1} & set(range(m.M)))
    for row in rows:
        for n in ns:
            def provide(v, idx, want=(row, n)):
                if v in m.roots:
                    if tuple(idx) != want:
                        raise ScalarUnsupported("the epilogue reorders the matmul result")
                    return f"%acc{m.roots.index(v)}"
                return None
            se = ScalarEmitter(fn, KernelEmitter(), provide=provide)
            try:
                for out, ot in zip(m.outs, m.out_ts):
                    se.value(out, se.delinearize(row * m.N + n, ot.shape))
            except ScalarUnsupported:
                return False
    return True


def kernel_params(fn: ir.Operation, m: GemvMatch, se: "ArgsSeenEmitter", x_reads: set[str],
                  ro: str, x: tuple[str, str], ws: list[tuple[str, str]]
                  ) -> tuple[list[tuple[str, str]], list[tuple[str, int]]]:
    """(kernel parameters as (SSA name, memref type), launch slots) of a matmul kernel: x
    (when an argument) and the weights ``ws`` (``(name, type)`` per ``m.weights``), the
    arguments the scalar emitter ``se`` read (``ro``, the read-only attributes, on x's own
    reads ``x_reads``), its constant buffers, then the results ``%o{j}`` (shared by the GEMV
    and GEMM kernels)."""
    params = [(name, t + ro) for name, t in ws]
    slots = [("arg", w.arg) for w in m.weights]
    if m.x_arg is not None:
        params.insert(0, (x[0], x[1] + ro))
        slots.insert(0, ("arg", m.x_arg))
    more, more_slots = region_params(fn, m, se, x_reads, ro)
    return params + more, slots + more_slots


def region_params(fn: ir.Operation, m: GemvMatch, se: "ArgsSeenEmitter",
                  x_reads: frozenset[str] | set[str] = frozenset(), ro: str = "",
                  const0: int = 0) -> tuple[list[tuple[str, str]], list[tuple[str, int]]]:
    """(parameters, launch slots) for what the scalar emitter ``se`` read: the arguments
    (``ro`` on those in ``x_reads``), its constant buffers (slots numbered from ``const0``),
    then the results ``%o{j}`` (:func:`kernel_params`; the split-K reduction's own)."""
    params, slots = [], []
    for i, a in enumerate(fn.regions[0].blocks[0].arguments):
        if f"%e{i}" in se.seen:
            params.append((f"%e{i}", buffer_type(maybe_poot_type(a)) +
                           (ro if f"%e{i}" in x_reads else "")))
            slots.append(("arg", i))
    for k, (name, c) in enumerate(zip(se.const_names, se.consts)):
        params.append((name, c[0]))
        slots.append(("const", const0 + k))
    for j, ot in enumerate(m.out_ts):
        params.append((f"%o{j}", buffer_type(ot)))
        slots.append(("out", j))
    return params, slots


def dense16(m: GemvMatch) -> bool:
    """Whether every weight of ``m`` is dense bf16/f16 stored [N, K]."""
    return all(w.layout == "nk" and w.dtype in (DType.BF16, DType.F16) for w in m.weights)


def gemm_rows(m: GemvMatch) -> bool:
    """Whether ``m``'s rows are the tensor-core GEMM's (where it takes the region): past
    :data:`MAX_M`, or from :data:`GEMM_FROM_M` with dense 16-bit weights."""
    return m.M > MAX_M or (m.M >= GEMM_FROM_M and dense16(m))


__all__ = ["GEMM_FROM_M", "MAX_M", "PACKED", "SMALL_N", "SMALL_N_MAX_M", "GemvMatch",
           "dense16", "factor_at", "gemm_rows", "gemv_rows", "kernel_params", "match",
           "match_indexed", "region_params"]
