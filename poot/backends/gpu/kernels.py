"""Kernel generation for one dispatch region, shared by every gpu-dialect backend.

    launches = build_dispatch(linalg_text, caps)    # -> DispatchKernels (module + launch plan)

A dispatch function (``poot-fuse-dispatch``'s ``@<fn>_dispatch_N``, lowered to linalg on
tensors by :func:`poot.dialects.lowering.function.lower_function`) becomes a sequence of GPU
kernels:

1. elementwise fusion on tensors, then one-shot bufferization over the function boundary
   (identity layouts, every argument read-only, results as caller-allocated out-parameters);
   no deallocation: every temporary ``memref.alloc`` is hoisted into a *scratch* argument the
   runtime allocates once;
2. whole-buffer ``memref.copy`` ops become device-to-device copies of the plan; others become
   ``linalg.copy``;
3. ``convert-linalg-to-parallel-loops`` (reduction dims stay serial ``scf.for`` per thread),
   ``fold-memref-alias-ops`` (loads and stores through views index the base buffers);
4. each top-level ``scf.parallel`` is linearized into a 2-level nest over (blocks, threads)
   with a bounds guard, its block size chosen from the iteration count and the target's
   subgroup size; any other top-level op with effects (serial loops, e.g. a scatter's loop
   over the batch) becomes a one-thread kernel; ``gpu-map-parallel-loops``,
   ``convert-parallel-loops-to-gpu``, ``gpu-launch-sink-index-computations``,
   ``gpu-kernel-outlining``;
5. the host function is read back as a launch plan (kernel, grid, block, argument slots) and
   erased: what remains is ``gpu.module``s, ready for a target's lowering (NVVM, SPIR-V,
   ROCDL) in :mod:`poot.backends.cuda.codegen` and its siblings.

Argument slots of a dispatch: ``("arg", i)`` the dispatch function's i-th argument,
``("out", j)`` its j-th result, ``("scratch", k)`` its k-th temporary.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mlir import ir
from mlir.dialects import arith, scf
from mlir.dialects import memref as memref_d
from mlir.passmanager import PassManager

from poot.backends.pass_pipelines import BUFFERIZE_TO_OUT_PARAMS, FUSE
from poot.errors import PootError

# Bufferize (shared with the CPU backend), then hoist the buffers out of loops (no
# deallocation pass).
#: the attribute every workgroup attribution carries: 16-byte alignment. LLVM's NVPTX
#: load/store vectorizer merges neighbouring f32 stores into ``st.shared.v4`` (16 bytes) where
#: the index arithmetic allows, but an attribution is only aligned to its element (4 bytes) and
#: packed after the previous one: the flash-decode merge buffer landed at an offset of 8 mod 16
#: and the store faulted (CUDA_ERROR_MISALIGNED_ADDRESS, compute-sanitizer "Invalid __shared__
#: write of size 16 bytes ... misaligned").
WG_ALIGN = "{llvm.align = 16 : i64}"

BUFFERIZE = (
    BUFFERIZE_TO_OUT_PARAMS + ","
    "func.func(buffer-hoisting,buffer-loop-hoisting),"
    "convert-bufferization-to-memref"
)

TO_LOOPS = ("func.func(convert-linalg-to-parallel-loops),fold-memref-alias-ops,"
            "canonicalize,cse")

TO_GPU = ("func.func(gpu-map-parallel-loops),func.func(convert-parallel-loops-to-gpu),"
          "gpu-launch-sink-index-computations,gpu-kernel-outlining,canonicalize")


class GpuCodegenError(PootError):
    """A dispatch region the GPU kernel generator cannot map."""


@dataclass
class Launch:
    """One step of a dispatch: a kernel launch or a device-to-device copy.

    ``kind`` is ``"kernel"`` (``module``/``kernel`` name the outlined ``gpu.func``) or
    ``"copy"`` (``args`` = [src, dst], ``nbytes``)."""

    kind: str
    args: list[tuple[str, int]]
    module: str = ""
    kernel: str = ""
    grid: tuple[int, int, int] = (1, 1, 1)
    block: tuple[int, int, int] = (1, 1, 1)
    nbytes: int = 0
    strategy: str = "naive"
    #: bytes of dynamic workgroup memory the kernel takes (``gpu.dynamic_shared_memory``);
    #: 0: only its static workgroup buffers
    shared: int = 0


@dataclass
class DispatchKernels:
    """A dispatch function compiled to gpu.modules plus the launches that run it."""

    module: ir.Module
    launches: list[Launch]
    arg_types: list[str]
    out_types: list[str]
    scratch: list[tuple[str, int]] = field(default_factory=list)   # (type, nbytes)
    consts: list[tuple[str, int, bytes]] = field(default_factory=list)  # (type, nbytes, data)


# ---- helpers ---------------------------------------------------------------------------------

def gpu_kernels(module: ir.Module):
    """The ``gpu.func`` kernels (``gpu.kernel`` attribute) of every ``gpu.module`` of a
    planned ``module``, in order (the walk the backends' kernel passes share)."""
    for gm in module.body.operations:
        if gm.operation.name != "gpu.module":
            continue
        for f in gm.operation.regions[0].blocks[0].operations:
            f = f.operation
            if f.name == "gpu.func" and "gpu.kernel" in f.attributes:
                yield f


def memref_nbytes(t: ir.Type) -> int:
    m = ir.MemRefType(t)
    n = 1
    for s in m.shape:
        n *= s
    w = m.element_type.width if hasattr(m.element_type, "width") else None
    if w is None:
        et = str(m.element_type)
        w = {"f32": 32, "f16": 16, "bf16": 16, "f64": 64, "index": 64}.get(et, 32)
    return n * max(8, w) // 8


def _global_bytes(g: ir.Operation, t: ir.Type) -> bytes:
    """The initial contents of a constant ``memref.global`` as raw little-endian bytes."""
    import numpy as np

    attr = ir.DenseElementsAttr(g.attributes["initial_value"])
    m = ir.MemRefType(t)
    et = str(m.element_type)
    np_t = {"f32": np.float32, "f64": np.float64, "i32": np.int32, "i64": np.int64,
            "i8": np.int8, "i16": np.int16, "f16": np.float16, "i1": np.bool_}.get(et)
    shape = tuple(m.shape)
    if attr.is_splat:
        sv = attr.get_splat_value()
        val = sv.value if hasattr(sv, "value") else sv
        if et == "bf16":
            import ml_dtypes
            return np.full(shape, float(val), ml_dtypes.bfloat16).tobytes()
        return np.full(shape, val, np_t).tobytes()
    if et == "bf16" or np_t is None:
        raise GpuCodegenError(f"a constant of {et} elements")
    return np.asarray(np.array(attr), np_t).reshape(shape).tobytes()


def _const_index(v: ir.Value) -> int | None:
    owner = v.owner
    if isinstance(owner, ir.Block):
        return None
    op = owner.operation if hasattr(owner, "operation") else owner
    if op.name == "arith.constant":
        return ir.IntegerAttr(op.attributes["value"]).value
    return None


def _base(v: ir.Value) -> ir.Value:
    """The buffer under a chain of contiguous reshapes (expand/collapse), else ``v``."""
    while True:
        owner = v.owner
        if isinstance(owner, ir.Block):
            return v
        op = owner.operation if hasattr(owner, "operation") else owner
        if op.name in ("memref.expand_shape", "memref.collapse_shape", "memref.cast",
                       "memref.reinterpret_cast"):
            v = op.operands[0]
            continue
        return v


def _top_ops(fn: ir.Operation) -> list[ir.Operation]:
    return [o.operation for o in fn.regions[0].blocks[0].operations]


def _parallel_op(lbs, ubs, steps) -> tuple[ir.Operation, ir.Block]:
    op = scf.ParallelOp([], lbs, ubs, steps, [])
    idx = ir.IndexType.get()
    blk = op.operation.regions[0].blocks.append(*([idx] * len(lbs)))
    with ir.InsertionPoint(blk):
        scf.ReduceOp([], 0)
    return op.operation, blk


def _cidx(n: int) -> ir.Value:
    return arith.ConstantOp(ir.IndexType.get(), n).result


def block_size(n: int, caps) -> int:
    """Threads per block for ``n`` independent work items: whole subgroups, at most 256."""
    sg = getattr(caps, "subgroup_size", None) or 32
    t = 256
    while t > sg and t >= 2 * n:
        t //= 2
    return max(sg, t) if n > 1 else 1


def _block_thread_nest(at: ir.Operation, nb: int | None, t: int) -> tuple:
    """Before op ``at``: an ``scf.parallel`` over ``nb`` blocks (None: one, its bound the
    shared constant 1) holding one over ``t`` threads: (outer op, its block, inner op, its
    block)."""
    with ir.InsertionPoint(at), at.location:
        c0, c1 = _cidx(0), _cidx(1)
        outer, ob = _parallel_op([c0], [c1 if nb is None else _cidx(nb)], [c1])
    with ir.InsertionPoint.at_block_begin(ob), at.location:
        inner, ib = _parallel_op([c0], [_cidx(t)], [c1])
    return outer, ob, inner, ib


def _linearize(par: ir.Operation, caps) -> None:
    """Replace a top-level ``scf.parallel`` (static bounds) by a (blocks, threads) nest over
    its linearized iteration space with a bounds guard."""
    nd = len(par.regions[0].blocks[0].arguments)
    lb, st, counts = _counts(par)
    n = 1
    for c in counts:
        n *= c
    t = block_size(n, caps)
    nb = max(1, (n + t - 1) // t)
    _, ob, _, ib = _block_thread_nest(par, nb, t)
    with ir.InsertionPoint.at_block_begin(ib), par.location:
        lin = arith.AddIOp(arith.MulIOp(ob.arguments[0], _cidx(t)).result,
                           ib.arguments[0]).result
        cond = arith.CmpIOp(arith.CmpIPredicate.ult, lin, _cidx(n)).result
        ifop = scf.IfOp(cond)
    then = ifop.then_block
    with ir.InsertionPoint(then), par.location:
        ivs = []
        rem = lin
        for d in reversed(range(nd)):
            if d == 0:
                q = rem
            else:
                q = arith.RemUIOp(rem, _cidx(counts[d])).result
                rem = arith.DivUIOp(rem, _cidx(counts[d])).result
            iv = arith.AddIOp(arith.MulIOp(q, _cidx(st[d])).result, _cidx(lb[d])).result
            ivs.append(iv)
        ivs.reverse()
        yield_op = scf.YieldOp([])
    body = par.regions[0].blocks[0]
    for arg, iv in zip(body.arguments, ivs):
        arg.replace_all_uses_with(iv)
    for op in list(body.operations):
        op = op.operation
        if op.name == "scf.reduce":
            continue
        op.move_before(yield_op.operation)
    par.erase()


_COMBINE = {"arith.addf": "add", "arith.maximumf": "max", "arith.minimumf": "min"}


def _row_reduction(par: ir.Operation):
    """If ``par`` is a row reduction (its body: pure ops, then one ``scf.for`` over the
    reduction dim that loads ``out[idx]``, combines it with a contribution and stores it
    back), return (pre_ops, for_op, load, combine, store, contribution); else None."""
    body = list(par.regions[0].blocks[0].operations)
    ops = [o.operation for o in body if o.operation.name != "scf.reduce"]
    if not ops or ops[-1].name != "scf.for":
        return None
    loop = ops[-1]
    pre = ops[:-1]
    if any(len(o.regions) or o.name in ("memref.store", "memref.copy") for o in pre):
        return None
    if len(loop.results) or _const_index(loop.operands[0]) != 0 or \
            _const_index(loop.operands[2]) != 1 or _const_index(loop.operands[1]) is None:
        return None
    lops = [o.operation for o in loop.regions[0].blocks[0].operations]
    if len(lops) < 3 or lops[-1].name != "scf.yield" or lops[-2].name != "memref.store":
        return None
    store = lops[-2]
    comb = store.operands[0].owner
    if isinstance(comb, ir.Block):
        return None
    comb = comb.operation
    if comb.name not in _COMBINE or str(comb.results[0].type) != "f32":
        return None
    load = None
    for i, v in enumerate(comb.operands):
        o = v.owner
        if not isinstance(o, ir.Block) and o.operation.name == "memref.load" and \
                o.operation.operands[0] == store.operands[1] and \
                list(o.operation.operands)[1:] == list(store.operands)[2:]:
            load, contrib = o.operation, comb.operands[1 - i]
    if load is None or len(list(load.results[0].uses)) != 1:
        return None
    iv = loop.regions[0].blocks[0].arguments[0]
    if any(v == iv for v in list(store.operands)[2:]):
        return None
    for o in lops[:-2]:
        if len(o.regions) or o.name in ("memref.store", "memref.copy"):
            return None
    return pre, loop, load, comb, store, contrib


def _warp_rows(par: ir.Operation, caps) -> bool:
    """Map a top-level row reduction to one subgroup (warp) per row: the reduction dim is
    split across the lanes (lane-strided, so neighbouring lanes read neighbouring elements),
    partial results are combined with ``gpu.shuffle xor`` butterflies, and lane 0 merges the
    row's result into the output. Several rows per block. Returns False if ``par`` is not a
    row reduction or the target's subgroup size is unknown (a SPIR-V device that reports
    none, or a range of them)."""
    from mlir.dialects import gpu as gpu_d

    m = _row_reduction(par)
    if m is None:
        return False
    pre, loop, load, comb, store, contrib = m
    lb, st, counts = _counts(par)
    n = 1
    for c in counts:
        n *= c
    k = _const_index(loop.operands[1])
    sg = getattr(caps, "subgroup_size", None)
    if not sg or k < 2 * sg:
        return False                # shuffles need the device's real subgroup width
    rows = max(1, min(256 // sg, n))
    t = rows * sg
    nb = (n + rows - 1) // rows
    f32 = ir.F32Type.get()
    kind = _COMBINE[comb.name]
    init = {"add": 0.0, "max": float("-inf"), "min": float("inf")}[kind]
    _, ob, _, ib = _block_thread_nest(par, nb, t)
    with ir.InsertionPoint.at_block_begin(ib), par.location:
        tid = ib.arguments[0]
        row = arith.AddIOp(arith.MulIOp(ob.arguments[0], _cidx(rows)).result,
                           arith.DivUIOp(tid, _cidx(sg)).result).result
        lane = arith.RemUIOp(tid, _cidx(sg)).result
        cond = arith.CmpIOp(arith.CmpIPredicate.ult, row, _cidx(n)).result
        ifop = scf.IfOp(cond)
    with ir.InsertionPoint(ifop.then_block), par.location:
        ivs = _delinearize(row, lb, st, counts)
        y_if = scf.YieldOp([])
    body = par.regions[0].blocks[0]
    for arg, iv in zip(body.arguments, ivs):
        arg.replace_all_uses_with(iv)
    for o in pre:
        o.move_before(y_if.operation)
    with ir.InsertionPoint(y_if.operation), par.location:
        zero = arith.ConstantOp(f32, init).result
        new = scf.ForOp(lane, _cidx(k), _cidx(sg), [zero])
    with ir.InsertionPoint(new.body), par.location:
        acc = new.inner_iter_args[0]
        y_for = scf.YieldOp([acc])      # operand replaced below
    old_iv = loop.regions[0].blocks[0].arguments[0]
    old_iv.replace_all_uses_with(new.induction_variable)
    for o in [o.operation for o in loop.regions[0].blocks[0].operations]:
        if o.name in ("scf.yield", "memref.store") or o == comb or o == load:
            continue
        o.move_before(y_for.operation)
    with ir.InsertionPoint(y_for.operation), par.location:
        part = _combine(kind, acc, contrib)
    y_for.operation.operands[0] = part
    with ir.InsertionPoint(y_if.operation), par.location:
        v = new.results[0]
        i32 = ir.IntegerType.get_signless(32)
        width = arith.ConstantOp(i32, sg).result
        off = sg // 2
        while off:
            sh = gpu_d.ShuffleOp(v, arith.ConstantOp(i32, off).result, width,
                                 gpu_d.ShuffleMode.XOR)
            v = _combine(kind, v, sh.results[0])
            off //= 2
        is0 = arith.CmpIOp(arith.CmpIPredicate.eq, lane, _cidx(0)).result
        if0 = scf.IfOp(is0)
    with ir.InsertionPoint(if0.then_block), par.location:
        y0 = scf.YieldOp([])
    load.move_before(y0.operation)
    comb.move_before(y0.operation)
    store.move_before(y0.operation)
    for i, x in enumerate(comb.operands):
        if x == contrib:
            comb.operands[i] = v
    loop.erase()
    par.erase()
    return True


def _combine(kind: str, a: ir.Value, b: ir.Value) -> ir.Value:
    if kind == "add":
        return arith.AddFOp(a, b).result
    if kind == "max":
        return arith.MaximumFOp(a, b).result
    return arith.MinimumFOp(a, b).result


def _counts(par: ir.Operation):
    """(lower bounds, steps, trip counts) per dimension of an ``scf.parallel`` with static
    bounds; raises :class:`GpuCodegenError` for dynamic ones."""
    nd = len(par.regions[0].blocks[0].arguments)
    lbs, ubs, steps = (list(par.operands[i * nd:(i + 1) * nd]) for i in range(3))
    lb = [_const_index(v) for v in lbs]
    ub = [_const_index(v) for v in ubs]
    st = [_const_index(v) for v in steps]
    if None in lb or None in ub or None in st:
        raise GpuCodegenError("a parallel loop with dynamic bounds (static shapes only)")
    counts = [max(0, (u - l + s - 1) // s) for l, u, s in zip(lb, ub, st)]
    return lb, st, counts


def _delinearize(lin: ir.Value, lb, st, counts) -> list:
    ivs, rem = [], lin
    for d in reversed(range(len(counts))):
        if d == 0:
            q = rem
        else:
            q = arith.RemUIOp(rem, _cidx(counts[d])).result
            rem = arith.DivUIOp(rem, _cidx(counts[d])).result
        ivs.append(arith.AddIOp(arith.MulIOp(q, _cidx(st[d])).result, _cidx(lb[d])).result)
    return ivs[::-1]


def _move_body(par: ir.Operation, ivs, before: ir.Operation) -> None:
    body = par.regions[0].blocks[0]
    for arg, iv in zip(body.arguments, ivs):
        arg.replace_all_uses_with(iv)
    for op in list(body.operations):
        op = op.operation
        if op.name != "scf.reduce":
            op.move_before(before)


def _numel(par: ir.Operation) -> int:
    n = 1
    for c in _counts(par)[2]:
        n *= c
    return n


def _wrap_serial(op: ir.Operation, caps) -> None:
    """A top-level op with effects that is no parallel loop (a loop over key blocks, a
    scatter's loop over the batch) becomes one *cooperative* block: its nested parallel
    loops are spread over the block's threads (thread-strided, a barrier after each), and
    its other writes are made by thread 0 between barriers."""
    from mlir.dialects import gpu as gpu_d

    nested: list[ir.Operation] = []
    writes: list[ir.Operation] = []

    # outermost nested scf.parallel ops, and writes outside them
    def walk(region_op):
        for region in region_op.regions:
            for blk in region.blocks:
                for o in blk.operations:
                    o = o.operation
                    if o.name == "scf.parallel":
                        nested.append(o)
                    elif o.name in ("memref.store", "memref.copy"):
                        writes.append(o)
                    else:
                        walk(o)
    walk(op)
    if op.name in ("memref.store", "memref.copy"):
        writes.append(op)
    width = max([_numel(p) for p in nested] or [1])
    t = block_size(width, caps) if nested else 1
    outer, ob, _, ib = _block_thread_nest(op, None, t)
    outer.attributes["poot.mapped"] = ir.UnitAttr.get()
    tid = ib.arguments[0]
    term = list(ib.operations)[-1].operation
    op.move_before(term)
    for p in nested:
        lb, st, counts = _counts(p)
        n = 1
        for c in counts:
            n *= c
        with ir.InsertionPoint(p), p.location:
            loop = scf.ForOp(tid, _cidx(n), _cidx(t))
        with ir.InsertionPoint(loop.body), p.location:
            ivs = _delinearize(loop.induction_variable, lb, st, counts)
            y = scf.YieldOp([])
        _move_body(p, ivs, y.operation)
        with ir.InsertionPoint(p), p.location:
            gpu_d.BarrierOp()
        p.erase()
    for w in writes:
        with ir.InsertionPoint(w), w.location:
            gpu_d.BarrierOp()
            first = arith.CmpIOp(arith.CmpIPredicate.eq, tid, _cidx(0)).result
            ifop = scf.IfOp(first)
        with ir.InsertionPoint(ifop.then_block), w.location:
            y = scf.YieldOp([])
        w.move_before(y.operation)
        with ir.InsertionPoint.after(ifop.operation), w.location:
            gpu_d.BarrierOp()


def _has_parallel(op: ir.Operation) -> bool:
    found = []

    def visit(o):
        if o.operation.name == "scf.parallel":
            found.append(o)
            return ir.WalkResult.INTERRUPT
        return ir.WalkResult.ADVANCE
    op.walk(visit)
    return bool(found)


def _sinkable(op: ir.Operation) -> bool:
    """A top-level op without regions or writes that a kernel can recompute (scalar
    arithmetic, loads, views)."""
    if len(op.regions) or not len(op.results) or op.name in _PURE_TOP - _VIEWS:
        return False
    d = op.name.split(".")[0]
    return d in ("arith", "math", "index", "affine") or op.name in (
        "memref.load", "memref.dim") or op.name in _VIEWS


def _sink_into(par: ir.Operation, fn_block: ir.Block) -> None:
    """Clone into ``par``'s body every top-level sinkable op it (transitively) uses, so no
    scalar computed on the host crosses into a kernel."""
    top = {}
    for o in fn_block.operations:
        o = o.operation
        if _sinkable(o) and o.name != "arith.constant":
            for r in o.results:
                top[r] = o
    needed: list[ir.Operation] = []
    seen = set()

    def visit_value(v):
        o = top.get(v)
        if o is None or id(o) in seen:
            return
        for x in o.operands:
            visit_value(x)
        if id(o) not in seen:
            seen.add(id(o))
            needed.append(o)

    inner = []

    def collect(o):
        inner.append(o.operation)
        return ir.WalkResult.ADVANCE
    par.walk(collect)
    for o in inner:
        for v in o.operands:
            visit_value(v)
    if not needed:
        return
    # keep the ops in their original program order
    order = {}
    for i, o in enumerate(fn_block.operations):
        order[o.operation] = i
    needed.sort(key=lambda o: order.get(o, 0))
    body = par.regions[0].blocks[0]
    first = list(body.operations)[0].operation
    mapping = {}
    for o in needed:
        c = o.clone(ip=ir.InsertionPoint(first))
        for i, v in enumerate(c.operands):
            if v in mapping:
                c.operands[i] = mapping[v]
        for r_old, r_new in zip(o.results, c.results):
            mapping[r_old] = r_new
    for o in inner:
        if o == par:
            continue
        for i, v in enumerate(o.operands):
            if v in mapping:
                o.operands[i] = mapping[v]


_VIEWS = {"memref.expand_shape", "memref.collapse_shape", "memref.cast", "memref.subview",
          "memref.reinterpret_cast"}

_PURE_TOP = {"arith.constant", "memref.alloc", "memref.expand_shape", "memref.collapse_shape",
             "memref.cast", "memref.subview", "memref.reinterpret_cast", "func.return",
             "memref.dealloc", "memref.get_global"}


def _top_ancestor(op: ir.Operation, block: ir.Block) -> ir.Operation:
    while op.parent is not None and op.block != block:
        op = op.parent
    return op


def _results_in_place(fn: ir.Operation, n_args: int, n_outs: int) -> None:
    """Write each result straight into its out-parameter.

    ``buffer-results-to-out-params`` computes a result into a temporary and ends with a copy
    into the caller's buffer: a whole extra pass over the result (a device copy per region).
    When the temporary (through contiguous reshapes) feeds only that copy and nothing touches
    it after the copy, the temporary becomes a view of the out-parameter and the copy goes."""
    block = fn.regions[0].blocks[0]
    outs = list(block.arguments)[n_args:n_args + n_outs]
    order = {o.operation: i for i, o in enumerate(block.operations)}
    for op in _top_ops(fn):
        if op.name != "memref.copy" or op.operands[1] not in outs:
            continue
        dst = op.operands[1]
        if len(list(dst.uses)) != 1:
            continue
        base = _base(op.operands[0])
        owner = base.owner
        if isinstance(owner, ir.Block) or owner.operation.name != "memref.alloc" or \
                len(owner.operation.operands):
            continue
        alloc = owner.operation
        at = order[op]
        users, stack = [], [base]
        while stack:                      # every use of the temporary, through its views
            for u in stack.pop().uses:
                o = u.owner.operation if hasattr(u.owner, "operation") else u.owner
                if o.name in ("memref.expand_shape", "memref.collapse_shape", "memref.cast"):
                    stack.append(o.results[0])
                users.append(o)
        if any(u.name == "memref.copy" and u != op and u.operands[0] != base and
               _base(u.operands[0]) == base for u in users):
            continue                      # copied into a second result as well
        if any(order.get(_top_ancestor(u, block), at) > at for u in users):
            continue                      # touched after the copy
        at_ = ir.MemRefType(base.type)
        shape = list(at_.shape)
        strides, acc = [], 1
        for d in reversed(shape):
            strides.append(acc)
            acc *= d
        strides.reverse()
        with ir.InsertionPoint(alloc), alloc.location:
            view = memref_d.ReinterpretCastOp(
                at_, dst, [], [], [], static_offsets=[0], static_sizes=shape,
                static_strides=strides).result
        base.replace_all_uses_with(view)
        op.erase()
        alloc.erase()


# ---- the generator ---------------------------------------------------------------------------

def build_dispatch(text: str, caps, context: ir.Context | None = None,
                   strategy: str = "auto") -> DispatchKernels:
    """Compile one dispatch function (linalg on tensors, as text) to gpu.modules + launches.

    ``strategy``: ``"naive"`` maps every parallel loop one thread per output element
    (reductions serial per thread: the correctness baseline); ``"auto"`` also maps row
    reductions (GEMV rows, RMSNorm/softmax sums and maxima) one warp per row. Raises
    :class:`GpuCodegenError` for a body it cannot map (a dynamically sized temporary, a host
    op left outside the kernels, a launch of dynamic size)."""
    ctx = context or ir.Context()
    ctx.allow_unregistered_dialects = True
    with ctx, ir.Location.unknown():
        module = ir.Module.parse(text)
        fn, n_args, n_outs = _bufferize(module)
        block = fn.regions[0].blocks[0]
        arg_types = [str(a.type) for a in list(block.arguments)[:n_args]]
        out_types = [str(a.type) for a in list(block.arguments)[n_args:]]
        if len(out_types) != n_outs:
            raise GpuCodegenError("results were not all turned into out-parameters")

        _results_in_place(fn, n_args, n_outs)
        scratch = _scratch_arguments(fn, block)
        slot = _SlotOf(module, list(block.arguments), n_args, n_outs)
        copies = _plan_copies(fn, slot)
        fn.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(
            [a.type for a in block.arguments], []))
        PassManager.parse(f"builtin.module({TO_LOOPS})").run(module.operation)
        kinds = _map_loops(fn, block, caps, strategy)
        PassManager.parse(f"builtin.module({TO_GPU})").run(module.operation)
        launches = _launches(fn, slot, copies, kinds)
        fn.erase()
        for g in slot.globals.values():
            g.erase()
        return DispatchKernels(module, launches, arg_types, out_types, scratch, slot.consts)


def _bufferize(module: ir.Module) -> tuple[ir.Operation, int, int]:
    """Fuse and bufferize the module's dispatch function in place (results become
    out-parameters; arguments read-only): (the function, its argument and result counts)."""
    fn = next(o.operation for o in module.body.operations
              if o.operation.name == "func.func")
    if "sym_visibility" in fn.attributes:
        del fn.attributes["sym_visibility"]
    n_args = len(fn.regions[0].blocks[0].arguments)
    fn.attributes["arg_attrs"] = ir.ArrayAttr.get(
        [ir.DictAttr.get({"bufferization.writable": ir.BoolAttr.get(False)})] * n_args)
    for k in ("res_attrs",):
        if k in fn.attributes:
            del fn.attributes[k]
    n_outs = len(ir.FunctionType(ir.TypeAttr(fn.attributes["function_type"]).value).results)
    PassManager.parse(f"builtin.module({FUSE},{BUFFERIZE})").run(module.operation)
    return fn, n_args, n_outs


def _scratch_arguments(fn: ir.Operation, block: ir.Block) -> list[tuple[str, int]]:
    """Turn the function's top-level temporaries into scratch arguments (appended after the
    out-parameters): ``(memref type, nbytes)`` each. Raises :class:`GpuCodegenError` for a
    dynamically sized temporary or one allocated inside a loop."""
    scratch = []
    for op in _top_ops(fn):
        if op.name == "memref.alloc":
            if len(op.operands):
                raise GpuCodegenError("a dynamically sized temporary")
            t = op.results[0].type
            arg = block.add_argument(t, op.location)
            op.results[0].replace_all_uses_with(arg)
            scratch.append((str(t), memref_nbytes(t)))
            op.erase()
        elif op.name == "memref.dealloc":
            op.erase()

    def nested_alloc(o):
        if o.operation.name in ("memref.alloc", "memref.alloca"):
            raise GpuCodegenError("a temporary allocated inside a loop")
        return ir.WalkResult.ADVANCE
    fn.walk(nested_alloc)
    return scratch


class _SlotOf:
    """The plan slot of a buffer value of the dispatch: ``("arg", i)``, ``("out", j)``,
    ``("scratch", k)``, or ``("const", c)`` for a ``memref.get_global`` (its bytes recorded
    in :attr:`consts` on first use); None for any other value."""

    def __init__(self, module: ir.Module, args: list, n_args: int, n_outs: int):
        self.args, self.n_args, self.n_outs = args, n_args, n_outs
        self.globals = {ir.StringAttr(o.operation.attributes["sym_name"]).value: o.operation
                        for o in module.body.operations
                        if o.operation.name == "memref.global"}
        self.consts: list[tuple[str, int, bytes]] = []
        self.const_ids: dict[str, int] = {}

    def __call__(self, v: ir.Value):
        v = _base(v)
        owner = v.owner
        if not isinstance(owner, ir.Block) and owner.operation.name == "memref.get_global":
            name = ir.FlatSymbolRefAttr(owner.operation.attributes["name"]).value
            if name not in self.const_ids:
                self.const_ids[name] = len(self.consts)
                self.consts.append((str(v.type), memref_nbytes(v.type),
                                    _global_bytes(self.globals[name], v.type)))
            return ("const", self.const_ids[name])
        n_args, n_outs = self.n_args, self.n_outs
        for i, a in enumerate(self.args):
            if a == v:
                if i < n_args:
                    return ("arg", i)
                if i < n_args + n_outs:
                    return ("out", i - n_args)
                return ("scratch", i - n_args - n_outs)
        return None


def _plan_copies(fn: ir.Operation, slot: _SlotOf) -> dict[int, tuple]:
    """Whole-buffer copies between slots become plan copies (a ``poot.copy_mark`` left in
    their place, keyed by the returned ``{mark: (src, dst, nbytes)}``); other copies become
    ``linalg.copy`` (mapped to a kernel like any loop nest)."""
    from mlir.dialects import linalg

    args, n_args, n_outs = slot.args, slot.n_args, slot.n_outs
    copies: dict[int, tuple] = {}
    for op in _top_ops(fn):
        if op.name != "memref.copy":
            continue
        s, d = slot(op.operands[0]), slot(op.operands[1])
        if s is not None and d is not None and \
                memref_nbytes(op.operands[0].type) == memref_nbytes(args[_flat(d, n_args, n_outs)].type):
            mark = len(copies)
            copies[mark] = (s, d, memref_nbytes(op.operands[0].type))
            with ir.InsertionPoint(op):
                ir.Operation.create("poot.copy_mark", attributes={
                    "id": ir.IntegerAttr.get(ir.IntegerType.get_signless(64), mark)})
            op.erase()
        else:
            with ir.InsertionPoint(op):
                linalg.copy(op.operands[0], outs=[op.operands[1]])
            op.erase()
    return copies


def _map_loops(fn: ir.Operation, block: ir.Block, caps, strategy: str) -> list[str]:
    """Map the function's top-level loop nests to GPU loops (cooperative, one warp per row,
    or one thread per element): the mapping kind of each ``scf.parallel`` in order. Raises
    :class:`GpuCodegenError` for a host op that would stay on the host."""
    for op in _top_ops(fn):
        if op.name in _PURE_TOP or op.name in ("scf.parallel", "poot.copy_mark") \
                or _sinkable(op):
            continue
        if strategy != "naive" and op.name == "scf.for" and not _has_parallel(op):
            # a reduction whose parallel dims all folded away: a one-row nest, so the
            # row-reduction mapping can take it
            with ir.InsertionPoint(op), op.location:
                c0, c1 = _cidx(0), _cidx(1)
                _, pb = _parallel_op([c0], [c1], [c1])
            op.move_before(list(pb.operations)[-1].operation)
            continue
        _wrap_serial(op, caps)
    for op in _top_ops(fn):
        if op.name == "scf.parallel":
            _sink_into(op, block)
    for op in reversed(_top_ops(fn)):
        if _sinkable(op) and all(not list(r.uses) for r in op.results):
            op.erase()
    kinds = []
    for op in _top_ops(fn):
        if op.name == "scf.parallel" and "poot.mapped" in op.attributes:
            del op.attributes["poot.mapped"]
            kinds.append("cooperative")
        elif op.name == "scf.parallel":
            if strategy != "naive" and _warp_rows(op, caps):
                kinds.append("warp_rows")
            else:
                _linearize(op, caps)
                kinds.append("naive")
        elif not (op.name in _PURE_TOP or op.name == "poot.copy_mark"):
            raise GpuCodegenError(f"host op {op.name} would stay on the host")
    return kinds


def _launch_sizes(op: ir.Operation) -> tuple[list, list]:
    """(grid and block sizes, kernel operands) of a ``gpu.launch_func``."""
    ops = list(op.operands)
    # operands: [asyncDeps..., gridXYZ, blockXYZ, (clusterXYZ), dynSmem?, args...]
    sizes = [_const_index(v) for v in ops[:6]]
    kargs = ops[6:]
    if "operandSegmentSizes" in op.attributes:
        seg = list(ir.DenseI32ArrayAttr(op.attributes["operandSegmentSizes"]))
        # asyncDeps, grid xyz, block xyz, cluster xyz, dynamic smem, args, object
        if seg[0] or any(seg[7:11]):
            raise GpuCodegenError("a launch with async deps, clusters or "
                                  "dynamic shared memory")
        pos, parts = 0, []
        for s_ in seg:
            parts.append(ops[pos:pos + s_])
            pos += s_
        sizes = [_const_index(v) for v in sum(parts[1:7], [])]
        kargs = parts[11]
    if None in sizes:
        raise GpuCodegenError("a launch with dynamic grid/block sizes")
    return sizes, kargs


def _launches(fn: ir.Operation, slot: _SlotOf, copies: dict[int, tuple], kinds: list[str]
              ) -> list[Launch]:
    """The plan's launches, in the function's order: a kernel launch per
    ``gpu.launch_func`` (its mapping kind from ``kinds``), a copy per ``poot.copy_mark``."""
    launches: list[Launch] = []
    for op in _top_ops(fn):
        if op.name == "gpu.launch_func":
            kref = ir.SymbolRefAttr(op.attributes["kernel"])
            mod_name, kname = kref.value[0], kref.value[1]
            sizes, kargs = _launch_sizes(op)
            slots = []
            for v in kargs:
                s_ = slot(v)
                if s_ is None:
                    raise GpuCodegenError(f"kernel {kname}: argument {v.type} is not a "
                                          "buffer of the dispatch")
                slots.append(s_)
            launches.append(Launch("kernel", slots, mod_name, kname,
                                   tuple(sizes[:3]), tuple(sizes[3:6]),
                                   strategy=kinds[sum(L.kind == "kernel"
                                                      for L in launches)]))
        elif op.name == "poot.copy_mark":
            s, d, nb = copies[ir.IntegerAttr(op.attributes["id"]).value]
            launches.append(Launch("copy", [s, d], nbytes=nb))
        elif op.name in _PURE_TOP:
            continue
        else:
            raise GpuCodegenError(f"host op {op.name} left after kernel outlining")
    return launches


def _flat(s, n_args, n_outs) -> int:
    k, i = s
    return i if k == "arg" else n_args + i if k == "out" else n_args + n_outs + i


__all__ = ["DispatchKernels", "GpuCodegenError", "Launch", "block_size", "build_dispatch",
           "memref_nbytes"]
