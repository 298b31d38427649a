"""Shared IR facts for poot's passes, and the dispatch analysis of a fused module.

Op classes (decided by op semantics, from the op's definition name only):

* sources: ``param``, ``packed_param``, ``constant``, ``iota`` -- they introduce values;
  constants and iota are cheap to rematerialize, params are bound at load.
* pointwise: elementwise ops (``unary``, ``binary``, ``ternary``, ``compare``, ``select``,
  ``cast``), ``broadcast``, the views (``reshape``, ``transpose``, ``slice``), ``concat`` and
  ``dequantize``: every output element is a function of input elements at computable indices.
* reduction: ``reduce``; anchors: ``matmul``, ``gather``, ``scatter``, ``attention`` (the fused
  op the flash-attention rewrite introduces), ``indexed_matmul`` (MoE experts read in place).
* any other poot op is opaque: a kernel of its own, never merged with others.

All poot ops are pure (value semantics on tensors): an op whose results are unused can be
erased and two identical ops compute the same value.

:func:`dispatch_count` / :func:`dispatch_report` count the kernels a module needs: one per call
to a ``poot.dispatch`` function in an entry function, plus one per poot op left outside any
region that needs a kernel (every op but params, constants and reshapes, which alias).
"""

from __future__ import annotations

from collections import Counter

from poot.lazy import lazy_module
ir = lazy_module("mlir.ir")

SOURCES = frozenset({"poot.param", "poot.packed_param", "poot.constant", "poot.iota"})
REMATERIALIZABLE = frozenset({"poot.constant", "poot.iota"})
ELEMENTWISE = frozenset({"poot.unary", "poot.binary", "poot.ternary", "poot.compare",
                         "poot.select", "poot.cast"})
VIEWS = frozenset({"poot.reshape", "poot.transpose", "poot.slice"})
POINTWISE = ELEMENTWISE | VIEWS | frozenset({"poot.broadcast", "poot.concat",
                                             "poot.dequantize", "poot.quantize_fp8"})
ANCHORS = {"poot.matmul": "matmul", "poot.gather": "gather", "poot.scatter": "scatter",
           "poot.attention": "attention", "poot.indexed_matmul": "indexed_matmul"}
KNOWN = POINTWISE | SOURCES | frozenset(ANCHORS) | frozenset({"poot.reduce"})
# ops that never need a kernel of their own when left outside a region
NO_KERNEL = frozenset({"poot.param", "poot.packed_param", "poot.constant", "poot.reshape"})

DISPATCH_ATTR = "poot.dispatch"


def is_poot(op) -> bool:
    return op.operation.name.startswith("poot.")


def users(op: ir.Operation) -> list[ir.Operation]:
    """Operations using any result of ``op`` (with repetition removed, in use-list order)."""
    out, seen = [], set()
    for r in op.results:
        for u in r.uses:
            o = u.owner.operation
            if o not in seen:
                seen.add(o)
                out.append(o)
    return out


def has_uses(op: ir.Operation) -> bool:
    return any(True for r in op.results for _ in r.uses)


def defining_op(v: ir.Value) -> ir.Operation | None:
    """The operation defining ``v``, or None for a block argument."""
    if isinstance(v, ir.BlockArgument):
        return None
    owner = v.owner
    return owner.operation if not isinstance(owner, ir.Block) else None


def functions(module) -> list[ir.Operation]:
    root = module.operation if isinstance(module, ir.Module) else module
    if root.name == "func.func":
        return [root]
    out = []
    for region in root.regions:
        for block in region.blocks:
            for op in block.operations:
                if op.operation.name == "func.func":
                    out.append(op.operation)
    return out


def is_dispatch_function(fn: ir.Operation) -> bool:
    return DISPATCH_ATTR in fn.attributes


def new_dispatch_function(module_body, name: str, kind: str, n_ops: int, inputs: list,
                          result_types: list):
    """A private ``func.func @name`` marked a dispatch of ``kind`` (``{poot.dispatch = {kind,
    ops = n_ops}}``) taking ``inputs``' types and returning ``result_types``, created at the
    end of ``module_body`` (call inside the module's context and a location). Returns
    ``(callee, entry block, {input value: its block argument})``."""
    ftype = ir.FunctionType.get([v.type for v in inputs], list(result_types))
    callee = ir.Operation.create(
        "func.func", regions=1,
        attributes={"sym_name": ir.StringAttr.get(name),
                    "function_type": ir.TypeAttr.get(ftype),
                    "sym_visibility": ir.StringAttr.get("private"),
                    DISPATCH_ATTR: ir.DictAttr.get({
                        "kind": ir.StringAttr.get(kind),
                        "ops": ir.IntegerAttr.get(ir.IntegerType.get_signless(64), n_ops)})},
        ip=ir.InsertionPoint(module_body))
    entry = callee.regions[0].blocks.append(*[v.type for v in inputs])
    return callee, entry, dict(zip(inputs, entry.arguments))


def dispatch_kind(fn: ir.Operation) -> str:
    a = fn.attributes[DISPATCH_ATTR]
    return ir.StringAttr(ir.DictAttr(a)["kind"]).value


def sym_name(fn: ir.Operation) -> str:
    return ir.StringAttr(fn.attributes["sym_name"]).value


def op_kind(name: str) -> str:
    """The kernel kind a lone op ``name`` would need."""
    if name in ANCHORS:
        return ANCHORS[name]
    if name == "poot.reduce":
        return "reduction"
    if name == "poot.dequantize":
        return "dequantize"
    if name in VIEWS:
        return "copy"
    if name == "poot.iota":
        return "iota"
    if name not in KNOWN:  # an op this analysis has no class for: a kernel of its own kind
        return name.removeprefix("poot.")
    return "elementwise"


def dispatch_report(module) -> dict[str, int]:
    """Kernels per kind over the module's entry functions (those without ``poot.dispatch``)."""
    fns = functions(module)
    kinds = {sym_name(f): dispatch_kind(f) for f in fns if is_dispatch_function(f)}
    report: Counter = Counter()
    for fn in fns:
        if is_dispatch_function(fn):
            continue
        for region in fn.regions:
            for block in region.blocks:
                for op in block.operations:
                    op = op.operation
                    if op.name == "func.call":
                        callee = ir.FlatSymbolRefAttr(op.attributes["callee"]).value
                        if callee in kinds:
                            report[kinds[callee]] += 1
                    elif is_poot(op) and op.name not in NO_KERNEL and has_uses(op):
                        report[op_kind(op.name)] += 1
    return dict(report)


def dispatch_count(module) -> int:
    """Number of kernels (dispatches) the entry functions of ``module`` need."""
    return sum(dispatch_report(module).values())
