"""Region folding for GPU plans: a dispatch region without an anchor (elementwise ops, views,
row reductions: RoPE tables, RoPE, masks, norms), or a matmul region, is folded into the
regions that consume it when every consumer, so merged, is still one synthesized kernel
sequence. (A matmul folded into a matmul of the same x is the SwiGLU gate: one GEMV kernel then
computes the gate and up columns side by side, see :mod:`.strategies.matmul`; a consumer
that cannot compute a matmul per element refuses, so other matmuls stay their own regions.)

Why: on a GPU a decode step is latency-bound; each region is at least one kernel launch
(~2-3 us in a CUDA graph even when tiny), while recomputing a cheap producer inside its
consumer costs next to nothing (a RoPE rotation inside the KV write, a mask inside attention).
Whether a fold is taken is decided by the strategies themselves (:func:`~poot.backends.gpu.
strategies.synthesize` on the merged body): a consumer that cannot evaluate the producer's
values per element refuses, and then nothing is folded for that producer (it stays one region
for all its consumers, so nothing is computed twice by accident of order).

The step function is rewritten in place: each folded consumer call now calls a new private
function ``<consumer>_f<n>`` whose arguments are the consumer's other operands followed by the
producer's operands, and whose body is the producer's body followed by the consumer's, with
common subexpressions merged (``poot-cse``: a norm folded into both halves of a SwiGLU is
computed once, so both matmuls read one x); the producer's call goes. The semantics of the
step are unchanged (the oracle runs it as before).
"""

from __future__ import annotations

import hashlib
from typing import Callable

from mlir import ir

from poot.passes.analysis import DISPATCH_ATTR
from poot.passes.cse import cse
from poot.passes.dce import dce
from poot.passes.ir_utils import clone_into

#: region kinds folded into their consumers: those that hold no anchor (gather, scatter,
#: attention), cheap to recompute, and matmuls, plain or indexed (taken only where a
#: consumer's strategy computes the matmul per output element, as a GEMV sharing its x
#: does: a MoE layer's gate experts beside its up experts)
FOLDABLE = frozenset({"elementwise", "rope", "reduction", "matmul", "indexed_matmul"})
MATMULS = ("poot.matmul", "poot.indexed_matmul")
#: the largest merged function a fold may make, in poot ops (as ``poot-fuse-dispatch``'s
#: largest region): folding a chain of reductions into each next one (a sampler's top-p over
#: a 49k vocabulary) otherwise grows kernels of 700 ops that recompute the chain per row
#: loop, and kernel synthesis and PTX generation take tens of seconds on them
FOLD_MAX_OPS = 256


def _name(op: ir.Operation) -> str:
    return ir.StringAttr(op.attributes["sym_name"]).value


def dispatch_kind(fn: ir.Operation) -> str:
    """The ``kind`` of a dispatch function's ``poot.dispatch`` attribute (``?`` if none)."""
    if DISPATCH_ATTR not in fn.attributes:
        return "?"
    d = ir.DictAttr(fn.attributes[DISPATCH_ATTR])
    return ir.StringAttr(d["kind"]).value if "kind" in d else "?"


def body_key(fn: ir.Operation) -> str:
    """A key equal for dispatch functions with the same body (names aside)."""
    text = str(fn).replace(f"@{_name(fn)}(", "@dispatch(")
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def _has_matmul(fn: ir.Operation) -> bool:
    """Whether ``fn``'s body holds a ``poot.matmul`` or ``poot.indexed_matmul`` (a merged
    function keeps its consumer's kind, so a matmul folded into an elementwise region is found
    by its body, not its kind)."""
    return any(o.operation.name in MATMULS for o in fn.regions[0].blocks[0].operations)


def _result_of(v: ir.Value, calls: list):
    """(i, k) when ``v`` is result k of ``calls[i]``, else None."""
    if isinstance(v.owner, ir.Block):
        return None
    o = v.owner.operation if hasattr(v.owner, "operation") else v.owner
    for i, c in enumerate(calls):
        if o == c:
            return i, ir.OpResult(v).result_number
    return None


def _merged(prod_call, prod_fn, cons_call, cons_fn, name: str, module_body) -> tuple:
    """A new function: ``prod_fn``'s body feeding ``cons_fn``'s (see the module doc); returns
    (function op, call operands)."""
    produced = {r: k for k, r in enumerate(prod_call.results)}
    operands = [v for v in cons_call.operands if v not in produced]
    for v in prod_call.operands:
        if v not in operands:
            operands.append(v)
    with cons_fn.context, cons_fn.location:
        fn, outer, ip = _dispatch_like(cons_fn, name, operands, module_body)
        pblock = prod_fn.regions[0].blocks[0]
        pret = _inline(pblock, {a: outer[v] for a, v in zip(pblock.arguments,
                                                             prod_call.operands)}, ip)
        cblock = cons_fn.regions[0].blocks[0]
        mapping = {a: (pret[produced[v]] if v in produced else outer[v])
                   for a, v in zip(cblock.arguments, cons_call.operands)}
        ir.Operation.create("func.return", operands=_inline(cblock, mapping, ip), ip=ip)
    cse(fn)
    dce(fn)
    return fn, operands


def _poot_ops(fn: ir.Operation) -> int:
    """The number of poot ops in ``fn``."""
    n = [0]

    def visit(op):
        n[0] += op.operation.name.startswith("poot.")
        return ir.WalkResult.ADVANCE

    fn.walk(visit)
    return n[0]


def _fold_one(block, funcs, module_body, scratch, accept, made, refused, counter) -> bool:
    """Fold the first foldable producer call of ``block`` into all its consumers; False when
    there is none left."""
    for call in [o.operation for o in block.operations]:
        if call.name != "func.call":
            continue
        pname = ir.FlatSymbolRefAttr(call.attributes["callee"]).value
        pfn = funcs[pname]
        if pname in refused or dispatch_kind(pfn) not in FOLDABLE:
            continue
        consumers = []
        for r in call.results:
            for u in r.uses:
                o = u.owner.operation if hasattr(u.owner, "operation") else u.owner
                if o not in consumers:
                    consumers.append(o)
        if not consumers or any(u.name != "func.call" for u in consumers) or \
                (len(consumers) > 1 and _has_matmul(pfn)):
            refused.add(pname)       # (a matmul is never computed twice)
            continue
        new = []
        for c in consumers:
            cfn = funcs[ir.FlatSymbolRefAttr(c.attributes["callee"]).value]
            counter[0] += 1
            fn, operands = _merged(call, pfn, c, cfn, f"{_name(cfn)}_f{counter[0]}",
                                   scratch)
            if _poot_ops(fn) > FOLD_MAX_OPS:
                break
            key = body_key(fn)
            if key not in made:
                made[key] = accept(fn)
            if made[key] is None:
                break
            new.append((c, fn, operands))
        if len(new) != len(consumers):
            refused.add(pname)       # candidates stay in the scratch module, unused
            continue
        # a consumer may feed another: replace them in step order, and find those operands
        # before any call is replaced
        pos = {o.operation: i for i, o in enumerate(block.operations)}
        new.sort(key=lambda t: pos[t[0]])
        cons = [c for c, _, _ in new]
        refs = [[_result_of(v, cons) for v in operands] for _, _, operands in new]
        replaced: list = []
        for (c, fn, operands), ref in zip(new, refs):
            fn.detach_from_parent()
            ir.InsertionPoint(module_body).insert(fn)
            funcs[_name(fn)] = fn
            ops_ = [replaced[r[0]][r[1]] if r else v for v, r in zip(operands, ref)]
            replaced.append(_recall(c, fn, ops_))
        call.erase()
        return True
    return False


def _recall(call: ir.Operation, fn: ir.Operation, operands: list) -> list:
    """Replace ``func.call`` ``call`` by a call of ``fn`` on ``operands`` (same result types);
    the new call's results, which took over every use of the old one's."""
    with call.context, call.location:
        new = ir.Operation.create(
            "func.call", results=[r.type for r in call.results], operands=operands,
            attributes={"callee": ir.FlatSymbolRefAttr.get(_name(fn))},
            ip=ir.InsertionPoint(call))
    for r, n in zip(call.results, new.results):
        r.replace_all_uses_with(n)
    call.erase()
    return list(new.results)


def _drop_uncalled(g, block: ir.Block, funcs: dict, scratch: ir.Module) -> None:
    """Move the dispatch functions no ``func.call`` of ``block`` names any more out of the
    step's module into ``scratch``."""
    called = {ir.FlatSymbolRefAttr(o.operation.attributes["callee"]).value
              for o in block.operations if o.operation.name == "func.call"}
    for name, fn in list(funcs.items()):
        if name not in called and fn != g.func and DISPATCH_ATTR in fn.attributes:
            fn.detach_from_parent()
            ir.InsertionPoint(scratch.body).insert(fn)


def _with_reshape(call: ir.Operation, callee: ir.Operation, reshape: ir.Operation, name: str,
                  module_body) -> tuple:
    """A new private function ``name`` computing ``callee`` with ``reshape`` applied inside:
    it takes ``reshape``'s operand where ``call`` passed its result (once, however many
    arguments received it). Returns (function, call operands: ``call``'s with that
    substitution)."""
    src, res = reshape.operands[0], reshape.results[0]
    operands = []
    for v in call.operands:
        w = src if v == res else v
        if w not in operands:
            operands.append(w)
    with callee.context, callee.location:
        fn, outer, ip = _dispatch_like(callee, name, operands, module_body)
        clone_into(reshape, outer, ip)          # outer[res] = the reshape inside
        cblock = callee.regions[0].blocks[0]
        mapping = {a: outer[v] for a, v in zip(cblock.arguments, call.operands)}
        ir.Operation.create("func.return", operands=_inline(cblock, mapping, ip), ip=ip)
    return fn, operands


def _dispatch_like(like: ir.Operation, name: str, operands: list, module_body) -> tuple:
    """A new private dispatch function ``name`` at the end of ``module_body``, taking one
    argument per value of ``operands`` and returning ``like``'s results (its dispatch
    attribute copied), with an empty entry block: (function, operand -> its argument,
    insertion point in the entry). Call it inside ``like``'s context and location."""
    results = ir.FunctionType(ir.TypeAttr(like.attributes["function_type"]).value).results
    ftype = ir.FunctionType.get([v.type for v in operands], list(results))
    fn = ir.Operation.create(
        "func.func", regions=1,
        attributes={"sym_name": ir.StringAttr.get(name),
                    "function_type": ir.TypeAttr.get(ftype),
                    "sym_visibility": ir.StringAttr.get("private"),
                    DISPATCH_ATTR: like.attributes[DISPATCH_ATTR]},
        ip=ir.InsertionPoint(module_body))
    entry = fn.regions[0].blocks.append(*[v.type for v in operands])
    return fn, dict(zip(operands, entry.arguments)), ir.InsertionPoint(entry)


def _inline(block: ir.Block, mapping: dict, ip: ir.InsertionPoint) -> list:
    """Clone ``block``'s ops up to its ``func.return`` at ``ip`` (``mapping``: its arguments
    -> values there, extended with every clone's results); the returned values, mapped."""
    for o in block.operations:
        o = o.operation
        if o.name == "func.return":
            return [mapping[v] for v in o.operands]
        clone_into(o, mapping, ip)
    raise ValueError("a function body without func.return")


def sink_reshapes(g) -> int:
    """Move each ``poot.reshape`` left in the step function (between dispatch regions: a view,
    no kernel of its own) into the dispatch functions that consume it, so every region sees
    its operands' views as the fusion pass would have put them (a q reshaped for attention,
    a mask's views). A reshape with a user other than a call (a step output, another op)
    stays; the plan aliases its buffer. Returns how many reshapes were moved."""
    module_body = g.module.body
    funcs = {_name(o.operation): o.operation for o in module_body.operations
             if o.operation.name == "func.func"}
    block = g.func.regions[0].blocks[0]
    moved, counter = 0, 0
    with g.module.context, ir.Location.unknown():
        scratch = ir.Module.create()
    g._sink_scratch = scratch
    changed = True
    while changed:
        changed = False
        for op in reversed([o.operation for o in block.operations]):
            if op.name != "poot.reshape":
                continue
            users = []
            for u in op.results[0].uses:
                o = u.owner.operation if hasattr(u.owner, "operation") else u.owner
                if o not in users:
                    users.append(o)
            if not users or any(u.name != "func.call" or DISPATCH_ATTR not in funcs[
                    ir.FlatSymbolRefAttr(u.attributes["callee"]).value].attributes
                    for u in users):
                continue
            for c in users:
                cfn = funcs[ir.FlatSymbolRefAttr(c.attributes["callee"]).value]
                counter += 1
                fn, operands = _with_reshape(c, cfn, op, f"{_name(cfn)}_v{counter}",
                                             module_body)
                funcs[_name(fn)] = fn
                _recall(c, fn, operands)
            op.erase()
            moved += 1
            changed = True
            break
    if moved:
        _drop_uncalled(g, block, funcs, scratch)
    return moved


def fold_regions(g, accept: Callable[[ir.Operation], object | None]) -> dict[str, object]:
    """Fold producer regions of the step function of graph ``g`` into their consumers (see
    the module doc). ``accept(fn)`` synthesizes a candidate merged function (None: refused).
    Returns what ``accept`` produced per body key of every merged function kept, so the plan
    does not synthesize them again."""
    module_body = g.module.body
    funcs = {_name(o.operation): o.operation for o in module_body.operations
             if o.operation.name == "func.func"}
    block = g.func.regions[0].blocks[0]
    made: dict[str, object] = {}
    refused: set[str] = set()
    counter = [0]
    # Candidates are built in a scratch module kept alive with the graph: erasing a function
    # whose ops Python still references can crash the MLIR bindings, so nothing is erased.
    with g.module.context, ir.Location.unknown():
        scratch = ir.Module.create()
    g._fold_scratch = scratch
    while _fold_one(block, funcs, module_body, scratch.body, accept, made, refused, counter):
        pass
    _drop_uncalled(g, block, funcs, scratch)
    return {k: v for k, v in made.items() if v is not None}


__all__ = ["FOLDABLE", "body_key", "dispatch_kind", "fold_regions", "sink_reshapes"]
