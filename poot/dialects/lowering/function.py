"""Assembling a lowered ``func.func`` from the per-op rules."""

from __future__ import annotations

from mlir import ir

from poot.dialects.lowering import (  # noqa: F401  (rule registration side effects)
    attention,
    contraction,
    elementwise,
    indexing,
    packed,
    reduce,
    sources,
    views,
)
from poot.dialects.lowering.emit import Emitter, tt
from poot.dialects.lowering.rules import RULES, LoweringRefusal, OpInfo, Strategy
from poot.dialects.opdef import lookup, read_attrs
from poot.dialects.types import PackedType, type_from_mlir

PARAM_OPS = ("poot.param", "poot.packed_param")


def location_text(op: ir.Operation) -> str:
    """``file:3:8`` for ``loc("file":3:8)`` (the diagnostics convention), else the raw text."""
    text = str(op.location)
    if text.startswith("loc(") and text.endswith(")"):
        text = text[4:-1].replace('"', "")
    return text


def arg_type(t) -> str:
    """The lowered function's argument type for a poot value: a tensor as its stored type
    (i1 as i8), a packed weight as its stored bytes."""
    if isinstance(t, PackedType):
        return f"tensor<{t.nbytes}xi8>"
    return tt(t)


def _str_attr(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _dict_names(fn: ir.Operation, key: str, n: int) -> list[str]:
    """The ``poot.name`` entries of ``arg_attrs``/``res_attrs`` ('' where absent)."""
    if key not in fn.attributes:
        return [""] * n
    out = []
    for d in ir.ArrayAttr(fn.attributes[key]):
        d = ir.DictAttr(d)
        out.append(ir.StringAttr(d["poot.name"]).value if "poot.name" in d else "")
    return out


def _lower_call(em: Emitter, op: ir.Operation, names: dict) -> None:
    """``func.call`` of another function of the module (a dispatch function, lowered
    alongside): the same call on the lowered (tensor-form) types."""
    callee = ir.FlatSymbolRefAttr(op.attributes["callee"]).value
    args = ", ".join(names[v] for v in op.operands)
    ins = ", ".join(arg_type(type_from_mlir(v.type)) for v in op.operands)
    outs = [arg_type(type_from_mlir(r.type)) for r in op.results]
    text = f"call @{callee}({args}) : ({ins}) -> ({', '.join(outs)})"
    if not outs:
        em.line(text)
        return
    res = em.op(text + "", "call")
    if len(outs) == 1:
        names[op.results[0]] = res
        return
    # a multi-result call: rename to the `%name:N` form
    em.lines[-1] = em.lines[-1].replace(f"{res} = ", f"{res}:{len(outs)} = ", 1)
    for i, r in enumerate(op.results):
        names[r] = f"{res}#{i}"


def lower_function(fn: ir.Operation, strategy: Strategy | None = None) -> str:
    """The text of a ``func.func`` equivalent to ``fn`` (a poot function) in upstream dialects.

    Raises :class:`~poot.dialects.lowering.LoweringRefusal` for an op no rule can lower.
    """
    block = fn.regions[0].blocks[0]
    em = Emitter()
    names: dict[ir.Value, str] = {}
    sig: list[str] = []
    in_names = _dict_names(fn, "arg_attrs", len(block.arguments))
    for i, (arg, nm) in enumerate(zip(block.arguments, in_names)):
        names[arg] = f"%in{i}"
        attr = f" {{poot.name = {_str_attr(nm)}}}" if nm else ""
        sig.append(f"%in{i}: {arg_type(type_from_mlir(arg.type))}{attr}")
    params: dict[str, str] = {}
    infos: dict[ir.Value, OpInfo] = {}
    for op in block.operations:
        op = op.operation
        if op.name in PARAM_OPS:
            pname = ir.StringAttr(op.attributes["name"]).value
            t = type_from_mlir(op.results[0].type)
            if pname not in params:
                params[pname] = f"%param{len(params)}"
                extra = f", poot.packed = \"{t.format.name}\"" if isinstance(t, PackedType) else ""
                sig.append(f"{params[pname]}: {arg_type(t)} "
                           f"{{poot.param = {_str_attr(pname)}{extra}}}")
            names[op.results[0]] = params[pname]
    for op in block.operations:
        op = op.operation
        if op.name in PARAM_OPS:
            continue
        if op.name == "func.call":
            _lower_call(em, op, names)
            continue
        if op.name == "func.return":
            vals = [names[v] for v in op.operands]
            types = [arg_type(type_from_mlir(v.type)) for v in op.operands]
            em.line(f"return {', '.join(vals)} : {', '.join(types)}" if vals else "return")
            continue
        opdef = lookup(op.name)
        if opdef is None or opdef.name not in RULES:
            raise LoweringRefusal(op.name, "no lowering rule for this op", location_text(op))
        info = OpInfo(opdef.name, read_attrs(opdef, op), [names[v] for v in op.operands],
                      [type_from_mlir(v.type) for v in op.operands],
                      type_from_mlir(op.results[0].type), location_text(op),
                      [infos.get(v) for v in op.operands], strategy)
        infos[op.results[0]] = info
        try:
            names[op.results[0]] = RULES[opdef.name](em, info)
        except LoweringRefusal as e:
            if not e.location:
                e.location = info.location
            raise
    ret = list(block.operations)[-1].operation
    out_names = _dict_names(fn, "res_attrs", len(ret.operands))
    results = [arg_type(type_from_mlir(v.type)) + (f" {{poot.name = {_str_attr(n)}}}" if n else "")
               for v, n in zip(ret.operands, out_names)]
    fname = ir.StringAttr(fn.attributes["sym_name"]).value
    plist = ", ".join(_str_attr(p) for p in params)
    vis = ""
    if "sym_visibility" in fn.attributes:
        vis = ir.StringAttr(fn.attributes["sym_visibility"]).value + " "
    extra = ""
    if "poot.dispatch" in fn.attributes:  # the region's kind, for backends and profiles
        extra = f", poot.dispatch = {fn.attributes['poot.dispatch']}"
    head = (f"func.func {vis}@{fname}({', '.join(sig)}) -> ({', '.join(results)}) "
            f"attributes {{poot.params = [{plist}]{extra}}} {{")
    return "\n".join([head, em.text(), "}"])


def lower_module(module: ir.Operation, strategy: Strategy | None = None) -> None:
    """Replace every ``func.func`` of ``module`` that holds poot ops (or nothing but its
    return) by its lowering, in place.

    All functions are lowered before any is replaced, so a refusal leaves ``module`` unchanged.
    """
    body = module.regions[0].blocks[0]
    todo = []
    for op in body.operations:
        op = op.operation
        if op.name != "func.func" or not op.regions[0].blocks:
            continue
        ops = [o.operation.name for o in op.regions[0].blocks[0].operations]
        if any(n.startswith("poot.") or n == "func.call" for n in ops) or ops == ["func.return"]:
            with module.context, ir.Location.unknown():
                todo.append((op, lower_function(op, strategy)))
    if not todo:
        return
    todo, dropped = _dedupe(todo)
    joined = "\n".join(text for _, text in todo)
    kernels = strategy.kernels if strategy is not None else None
    decls = kernels.declarations(joined) if kernels is not None else ""
    with module.context, ir.Location.unknown():
        parsed = ir.Module.parse(joined + "\n" + decls)
    new_ops = list(parsed.body.operations)
    for extra in new_ops[len(todo):]:  # declarations go after the lowered functions
        extra = extra.operation
        extra.detach_from_parent()
        module.regions[0].blocks[0].append(extra)
    for (old, _), new in zip(todo, new_ops):
        new = new.operation
        new.detach_from_parent()
        ir.InsertionPoint(old).insert(new)
        old.erase()
    for old in dropped:
        old.erase()


def _dedupe(todo: list) -> tuple[list, list]:
    """Private functions whose lowerings are identical but for their name (the same dispatch
    region in every layer) are kept once; calls go to the one kept. A step of a 30-layer
    model then compiles a handful of kernels per kind instead of hundreds."""
    canon: dict[str, str] = {}
    rename: dict[str, str] = {}
    kept, dropped = [], []
    for old, text in todo:
        fname = ir.StringAttr(old.attributes["sym_name"]).value
        vis = ir.StringAttr(old.attributes["sym_visibility"]).value \
            if "sym_visibility" in old.attributes else ""
        if vis != "private":
            kept.append((old, text))
            continue
        key = text.replace(f"@{fname}(", "@__poot_fn(", 1)
        if key in canon:
            rename[fname] = canon[key]
            dropped.append(old)
        else:
            canon[key] = fname
            kept.append((old, text))
    if rename:
        import re

        pat = re.compile(r"call @([\w.$-]+)\(")
        kept = [(old, pat.sub(lambda m: f"call @{rename.get(m.group(1), m.group(1))}(", text))
                for old, text in kept]
    return kept, dropped


__all__ = ["RULES", "OpInfo", "lower_function", "lower_module", "location_text", "arg_type"]
