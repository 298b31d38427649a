"""Long row reductions split into independent lane accumulators.

A ``linalg.generic`` reducing a long innermost dimension (the vocabulary of the greedy
sampler's max, argmax and non-finite checks: ``[B, V]`` into ``[B]``) lowers to a scalar
loop carrying one accumulator in memory: each element waits on the previous one and stores
it back (the B = 32 greedy sampler over SmolLM2's 49,152 tokens took 4.2 ms of one Zen 4
core). :func:`split_row_reductions` rewrites such a
reduction of K elements into two generics:

1. the K elements as ``[K / LANES, LANES]``: the reduction over ``K / LANES`` into a partial
   result with one more, parallel, dimension of ``LANES`` accumulators (each starting at the
   combiner's identity), its loop innermost: LLVM unrolls it into ``LANES`` independent
   scalar chains (3.0 ms for that sampler; LLVM 22 does not turn them into vector
   instructions, hence the next step);
2. the ``LANES`` partials combined into the original output (from its original init).

:func:`vectorize_split_reductions` then turns step 1 into vector code where its body is plain
scalar arithmetic (MLIR's own rewrites, run by the transform dialect's interpreter): the
partial is tiled to one row (its other dimensions 1) and ``T`` steps of the reduced
dimension (the largest of 64, 32, ... dividing ``K / LANES``), and each tile vectorized by
``transform.structured.vectorize``: a ``vector<T x LANES>`` read (unrolled into ``T``
16-lane reads by ``convert-vector-to-scf{full-unroll}``, not a stack buffer in the loop) and
a ``vector.multi_reduction`` lowered as ``T`` elementwise combines into the ``vector<LANES>``
accumulator. An i1 combiner kept in bytes becomes the byte combiner that gives the same
bytes (``ori``: ``maxui``), which the vectorizer recognizes. The vector code
keeps the lanes' order (lane j combines ``j, j + LANES, ...`` in order), so vector code gives
the split's bits. The greedy sampler over 49,152 tokens on a 2-core Xeon VM: B = 32 3.2 ->
0.67 ms, B = 1 92 -> 14 us.

The combiners split: integer ``addi``, the bitwise ``ori`` / ``andi`` / ``xori`` (also on i1
stored as bytes: ``extui(ori(trunci(acc), x))``), the integer min/max and ``maximumf`` /
``minimumf`` / ``maxnumf`` / ``minnumf``, whose results do not depend on the order of
combination (bitwise the same as the sequential loop), and the float sum ``addf``, whose
rounding does: a split sum adds lane j's elements ``j, j + LANES, ...`` in that order (from
-0.0), then the ``LANES`` lane sums in lane order into the original init. That order is fixed
by K alone, so a row gets the same bits in every batch, step program and run (the engine's
batch invariance); it differs from the sequential sum by rounding only, as the GPU's tree
sums do (the sampler's softmax denominators and inverse-CDF bisections, RMSNorm's sum of
squares). ``linalg.index`` of the split dimension becomes ``k1 * LANES + k2``.
"""

from __future__ import annotations

import re
from math import prod

from mlir import ir
from mlir.dialects import arith, linalg, tensor

from poot.backends.cpu.parallelize import MIN_ELEMENTS, loop_extents
from poot.backends.cpu.transform_script import ANY_OP, run_transform

#: accumulators a split reduction keeps: one AVX-512 vector of f32 / i32
LANES = 16
#: the shortest reduced dimension worth splitting
MIN_EXTENT = 256

_FLOAT_IDENTITY = {"arith.maximumf": float("-inf"), "arith.maxnumf": float("-inf"),
                   "arith.minimumf": float("inf"), "arith.minnumf": float("inf"),
                   "arith.addf": -0.0}
_INT_COMBINERS = ("arith.addi", "arith.ori", "arith.xori", "arith.andi", "arith.maxsi",
                  "arith.minsi", "arith.maxui", "arith.minui")


def _int_identity(name: str, width: int) -> int:
    """The identity of integer combiner ``name`` on ``width``-bit values (as a signed
    value, the way ``IntegerAttr`` takes it)."""
    return {"arith.andi": -1, "arith.minui": -1, "arith.maxsi": -(1 << (width - 1)),
            "arith.minsi": (1 << (width - 1)) - 1}.get(name, 0)


def _identity(name: str, t: ir.Type, wrapped: bool) -> ir.Attribute:
    """The identity of combiner ``name`` as an attribute of the accumulator type ``t``
    (``wrapped``: an i1 combiner on values stored as ``t`` bytes: 0 or 1)."""
    if name in _FLOAT_IDENTITY:
        return ir.FloatAttr.get(t, _FLOAT_IDENTITY[name])
    if wrapped:
        return ir.IntegerAttr.get(t, 1 if name == "arith.andi" else 0)
    return ir.IntegerAttr.get(t, _int_identity(name, ir.IntegerType(t).width))


def _uses(v: ir.Value) -> list[ir.Operation]:
    return [u.owner for u in v.uses]


def _combiner(body: ir.Block):
    """(combiner op, unwrap op or None, wrap op or None, which operand of the combiner
    carries the accumulator) when the body's output argument is used once, by a combiner
    this module splits (optionally as i1 between ``trunci`` and ``extui``) whose result
    the body yields; else None."""
    acc = body.arguments[len(body.arguments) - 1]
    ops = [o.operation for o in body.operations]
    yield_op = ops[-1]
    if len(yield_op.operands) != 1:
        return None
    users = _uses(acc)
    if len(users) != 1:
        return None
    op, unwrap = users[0], None
    if op.name == "arith.trunci":
        unwrap, wanted = op, op.results[0]
        if len(_uses(wanted)) != 1:
            return None
        op = _uses(wanted)[0]
    if op.name not in _FLOAT_IDENTITY and op.name not in _INT_COMBINERS:
        return None
    if unwrap is not None and op.name not in ("arith.ori", "arith.andi", "arith.xori"):
        return None
    src = unwrap.results[0] if unwrap is not None else acc
    which = [i for i, v in enumerate(op.operands) if v == src]
    if len(which) != 1 or len(_uses(op.results[0])) != 1:
        return None
    wrap = None
    nxt = _uses(op.results[0])[0]
    if unwrap is not None:
        if nxt.name != "arith.extui" or len(_uses(nxt.results[0])) != 1:
            return None
        wrap, nxt = nxt, _uses(nxt.results[0])[0]
    if nxt != yield_op:
        return None
    return op, unwrap, wrap, which[0]


def _dims_in(expr: ir.AffineExpr) -> set[int]:
    return {int(d) for d in re.findall(r"\bd(\d+)\b", str(expr))}


def _plan(op: ir.Operation):
    """What :func:`split_row_reductions` needs to split ``op`` (a ``linalg.generic``), or
    None when it does not apply."""
    if len(op.results) != 1 or "indexing_maps" not in op.attributes:
        return None
    iters = [str(a) for a in ir.ArrayAttr(op.attributes["iterator_types"])]
    if not iters or "reduction" not in iters[-1]:
        return None
    maps = [ir.AffineMapAttr(a).value for a in ir.ArrayAttr(op.attributes["indexing_maps"])]
    n = len(iters)
    last = n - 1
    operands = list(op.operands)
    out_map = maps[-1]
    if any(last in _dims_in(e) or not isinstance(e, ir.AffineDimExpr)
           for e in out_map.results):
        return None
    extent, split = None, []
    for v, m in zip(operands[:-1], maps[:-1]):
        res = list(m.results)
        if not any(last in _dims_in(e) for e in res):
            split.append(False)
            continue
        if any(last in _dims_in(e) for e in res[:-1]) or str(res[-1]) != f"d{last}":
            return None
        t = ir.RankedTensorType(v.type)
        extent = t.shape[-1]
        split.append(True)
    if extent is None or extent < MIN_EXTENT or extent % LANES:
        return None
    found = _combiner(op.regions[0].blocks[0])
    if found is None:
        return None
    return maps, iters, split, extent, found


def _split(op: ir.Operation, plan) -> None:
    maps, iters, split, extent, (comb, unwrap, wrap, which) = plan
    n = len(iters)
    ins = list(op.operands)[:-1]
    init = op.operands[len(op.operands) - 1]
    out_t = ir.RankedTensorType(op.results[0].type)
    elem = out_t.element_type
    part_t = ir.RankedTensorType.get(list(out_t.shape) + [LANES], elem)
    dims = [ir.AffineDimExpr.get(i) for i in range(n + 1)]
    red = ir.Attribute.parse("#linalg.iterator_type<reduction>")
    par = ir.Attribute.parse("#linalg.iterator_type<parallel>")
    with ir.InsertionPoint(op), op.location:
        new_ins, new_maps = [], []
        for v, m, s in zip(ins, maps[:-1], split):
            res = list(m.results)
            if s:
                t = ir.RankedTensorType(v.type)
                shape = list(t.shape[:-1]) + [extent // LANES, LANES]
                r = t.rank
                assoc = [[i] for i in range(r - 1)] + [[r - 1, r]]
                v = tensor.ExpandShapeOp(ir.RankedTensorType.get(shape, t.element_type), v,
                                         assoc, [], shape).result
                res = res[:-1] + [dims[n - 1], dims[n]]
            new_ins.append(v)
            new_maps.append(ir.AffineMap.get(n + 1, 0, res))
        new_maps.append(ir.AffineMap.get(n + 1, 0, list(maps[-1].results) + [dims[n]]))
        ident = _identity(comb.name, elem, unwrap is not None)
        start = arith.ConstantOp(part_t, ir.DenseElementsAttr.get_splat(part_t, ident)).result
        first = op.clone()
        for i, v in enumerate(new_ins + [start]):
            first.operands[i] = v
        first.attributes["indexing_maps"] = ir.ArrayAttr.get(
            [ir.AffineMapAttr.get(m) for m in new_maps])
        first.attributes["iterator_types"] = ir.ArrayAttr.get(
            [red if "reduction" in i else par for i in iters[:-1]] + [red, par])
        first.results[0].set_type(part_t)
        _split_index(first, n - 1)
        if unwrap is not None:
            _combine_bytes(first)
        if _vector_body(first):
            tiles = [1] * (n - 1) + [_k_tile(extent // LANES), 0]
            first.attributes[VECTORIZE] = ir.StringAttr.get(",".join(map(str, tiles)))
        r = out_t.rank
        second = linalg.GenericOp(
            [out_t], [first.results[0]], [init],
            ir.ArrayAttr.get([ir.AffineMapAttr.get(ir.AffineMap.get(r + 1, 0, dims[:r + 1])),
                              ir.AffineMapAttr.get(ir.AffineMap.get(r + 1, 0, dims[:r]))]),
            ir.ArrayAttr.get([par] * r + [red]))
        block = second.regions[0].blocks.append(elem, elem)
        with ir.InsertionPoint(block):
            part, acc = block.arguments
            if unwrap is not None:
                vals = []
                for v in (acc, part):
                    u = unwrap.clone()
                    u.operands[0] = v
                    vals.append(u.results[0])
                acc, part = vals
            c = comb.clone()
            c.operands[which] = acc
            c.operands[1 - which] = part
            res = c.results[0]
            if wrap is not None:
                w = wrap.clone()
                w.operands[0] = res
                res = w.results[0]
            linalg.YieldOp([res])
    op.results[0].replace_all_uses_with(second.results[0])
    op.erase()


#: the attribute naming a split reduction's tile sizes for :func:`vectorize_split_reductions`
VECTORIZE = "poot.vectorize"
#: ops a body may hold for the vectorizer (anything else keeps the scalar loops)
_VECTOR_OPS = re.compile(r"^(arith\.[a-z_]+|math\.[a-z0-9_]+|linalg\.index|linalg\.yield)$")


def _k_tile(n: int) -> int:
    """Steps of the reduced dimension (``n`` of them) one vector tile reads: the largest of
    64, 32, ... 1 dividing ``n``."""
    return next(t for t in (64, 32, 16, 8, 4, 2, 1) if n % t == 0)


def _vector_body(op: ir.Operation) -> bool:
    """Whether ``op``'s body is plain scalar arithmetic the vectorizer takes."""
    return all(_VECTOR_OPS.match(o.operation.name)
               for o in op.regions[0].blocks[0].operations)


def _row_threads(op: ir.Operation, threads: int) -> int:
    """Threads a tagged partial reduction's rows spread over: ``threads`` where its outermost
    (row) loop has at least that many rows and the whole op at least
    :data:`~poot.backends.cpu.parallelize.MIN_ELEMENTS` points (the greedy sampler's
    ``[B, V]`` at B >= 2), else 1."""
    if threads < 2:
        return 1
    iters = [str(a) for a in ir.ArrayAttr(op.attributes["iterator_types"])]
    ext = loop_extents(op)
    if not iters or "parallel" not in iters[0] or any(e is None for e in ext) \
            or ext[0] < threads:
        return 1
    return threads if prod(ext) >= MIN_ELEMENTS else 1


def vectorize_split_reductions(module: ir.Module, threads: int = 1) -> int:
    """Vectorize the partial reductions :func:`split_row_reductions` tagged (module doc):
    per tag (tile sizes), ``transform.structured.tile_using_for`` then
    ``transform.structured.vectorize``, run by the ``transform-interpreter`` pass on a
    named sequence added to ``module`` and removed after. With ``threads`` > 1 a large
    reduction's rows are first cut into ``threads`` ``scf.forall`` chunks
    (``tile_using_forall``; the OpenMP loop of the kernels' row loops): each row is reduced
    as before, so its bits do not change (the greedy sampler at B = 32 ran on one of two
    cores while the other waited). Returns how many were tagged."""
    tags: dict[str, int] = {}

    def visit(op):
        op = op.operation
        if op.name == "linalg.generic" and VECTORIZE in op.attributes:
            t = f"{ir.StringAttr(op.attributes[VECTORIZE]).value};{_row_threads(op, threads)}"
            op.attributes[VECTORIZE] = ir.StringAttr.get(t, context=op.context)
            tags[t] = tags.get(t, 0) + 1
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    if not tags:
        return 0
    any_op = ANY_OP
    lines = []
    for i, tag in enumerate(sorted(tags)):
        sizes, n_threads = tag.split(";")
        sizes = sizes.split(",")
        loops = sum(1 for x in sizes if x != "0")
        lines.append(f"%m{i} = transform.structured.match ops{{[\"linalg.generic\"]}} "
                     f"attributes {{{VECTORIZE} = \"{tag}\"}} in %root : ({any_op}) -> "
                     f"{any_op}")
        target = f"%m{i}"
        if n_threads != "1":
            chunks = ", ".join([n_threads] + ["0"] * (len(sizes) - 1))
            lines.append(f"%r{i}, %rf{i} = transform.structured.tile_using_forall %m{i} "
                         f"num_threads [{chunks}] : ({any_op}) -> ({any_op}, {any_op})")
            target = f"%r{i}"
        lines += [f"%t{i}, %l{i}:{loops} = transform.structured.tile_using_for {target} "
                  f"tile_sizes [{', '.join(sizes)}] : ({any_op}) -> "
                  f"({', '.join([any_op] * (loops + 1))})",
                  f"transform.structured.vectorize %t{i} : {any_op}"]
    # the vector<1 x T x LANES> reduction as T - 1 elementwise ops on vector<LANES>
    lines += [f"%f = transform.structured.match ops{{[\"func.func\"]}} in %root : ({any_op}) -> "
              f"{any_op}",
              "transform.apply_patterns to %f {",
              "transform.apply_patterns.vector.lower_multi_reduction "
              "lowering_strategy = \"innerparallel\"",
              "transform.apply_patterns.vector.cast_away_vector_leading_one_dim",
              f"}} : {any_op}"]
    run_transform(module, lines)
    return sum(tags.values())


#: an i1 combiner on 0 / 1 bytes as a byte combiner: the same bytes
_BYTE_COMBINER = {"arith.ori": arith.MaxUIOp, "arith.andi": arith.MinUIOp,
                  "arith.xori": arith.XOrIOp}


def _combine_bytes(op: ir.Operation) -> None:
    """In ``op``'s body, an i1 combiner between ``trunci`` and ``extui`` of its byte
    accumulator (``extui(ori(trunci(acc), x))``) becomes the byte combiner that gives the
    same bytes while every byte is 0 or 1 (``maxui(acc, extui(x))``; ``andi``: ``minui``;
    ``xori`` stays): no i1 in the accumulator's chain, so the vectorizer finds it."""
    comb, unwrap, wrap, which = _combiner(op.regions[0].blocks[0])
    acc = op.regions[0].blocks[0].arguments[len(op.regions[0].blocks[0].arguments) - 1]
    with ir.InsertionPoint(wrap), wrap.location:
        x = arith.ExtUIOp(wrap.results[0].type, comb.operands[1 - which]).result
        new = _BYTE_COMBINER[comb.name](acc, x).result
    wrap.results[0].replace_all_uses_with(new)
    for dead in (wrap, comb, unwrap):
        dead.erase()


def _split_index(op: ir.Operation, dim: int) -> None:
    """In ``op``'s body, ``linalg.index dim`` (the split dimension) becomes
    ``index(dim) * LANES + index(dim + 1)``."""
    block = op.regions[0].blocks[0]
    for o in list(block.operations):
        o = o.operation
        if o.name != "linalg.index" or ir.IntegerAttr(o.attributes["dim"]).value != dim:
            continue
        with ir.InsertionPoint(o), o.location:
            hi, lo = linalg.IndexOp(dim), linalg.IndexOp(dim + 1)
            lanes = arith.ConstantOp(ir.IndexType.get(), LANES)
            k = arith.AddIOp(arith.MulIOp(hi.result, lanes.result).result, lo.result)
        o.results[0].replace_all_uses_with(k.result)
        o.erase()


def split_row_reductions(module: ir.Module) -> int:
    """Split every ``linalg.generic`` of ``module`` (on tensors) that reduces an innermost
    dimension of at least :data:`MIN_EXTENT` elements (a multiple of :data:`LANES`) with a
    combiner of the module doc into a :data:`LANES`-wide partial reduction and its final
    combination. Returns how many were split. Results are bitwise unchanged except a float
    sum's, whose order becomes the lanes' (module doc)."""
    found = []

    def visit(op):
        op = op.operation
        if op.name == "linalg.generic":
            plan = _plan(op)
            if plan is not None:
                found.append((op, plan))
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    with module.context, ir.Location.unknown():
        for op, plan in found:
            _split(op, plan)
    return len(found)


__all__ = ["LANES", "MIN_EXTENT", "VECTORIZE", "split_row_reductions", "vectorize_split_reductions"]
