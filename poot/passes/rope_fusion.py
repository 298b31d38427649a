"""``poot-rope-fusion``: each rotary-embedding application (RoPE) becomes one elementwise
dispatch: the rotate-and-combine group is outlined into ``func.func private @<fn>_rope_<n>``
with ``poot.dispatch = {kind = "rope", ops = <n>}`` and replaced by one ``func.call``.

Why outlining (and not a new op or a rewrite of the arithmetic): RoPE is elementwise given
its inputs -- every output element reads x at its own channel and at its pair partner's, and
the cos/sin of its frequency -- so the dispatch-fusion mechanism (one outlined function = one
kernel, :mod:`poot.passes.fuse_dispatch`) already expresses "one kernel" without a new
primitive. Recognizing the rotation first makes the region exactly the rotation (its slices,
negations, products, sums and concats), whatever ops surround it, and leaves the arithmetic
untouched: the outlined graph computes bit-for-bit what the original computed. (A gather-free
"x * C + swap(x) * S" rewrite would still need a concat or gather for ``swap``: the views have
no reverse, so it saves nothing.)

Recognized (on semantics: use-def structure, commutation and op order free):

* the rotation of pairs ``(a, b)``: first half ``a*C - b*S``, second half ``b*C + a*S`` with
  the same ``C`` and ``S`` (through reshape/broadcast views, the views joining the region
  when only it uses them) in both, spelled with mul (either operand order), add/sub/neg or
  ``fma`` in any association;
* *half* layout (HF ``rotate_half``, GPT-NeoX): ``a = x[..., 0:h]``, ``b = x[..., h:2h]``
  (unit-stride slices of the last axis), ``concat([first, second], last axis)``;
* *interleaved* layout (GPT-J, GGUF): ``a = x[..., 0:2h:2]``, ``b = x[..., 1:2h:2]``, each
  half reshaped to ``[..., h, 1]``, concatenated on that new axis and reshaped to
  ``[..., 2h]`` (or, without a tail, to any shape: canonicalize folds the reshape into the
  consumer's view);
* partial rotary: the untouched tail ``x[..., 2h:D]`` concatenated after (flat or nested).

Not recognized (left alone): wrong signs (not a rotation), pairs taken from different
tensors, different C/S in the two halves, slices that do not pair channels as above, and a
group whose intermediate values are used outside it (their values would have to leave the
kernel).
"""

from __future__ import annotations

from mlir import ir

from poot.passes.analysis import defining_op, functions, is_dispatch_function, \
    new_dispatch_function, sym_name, users
from poot.passes.dce import dce
from poot.passes.ir_utils import NoMatch, clone_into, fn_attr, i64s, need, same_value, shape_of
from poot.passes.registry import PassFailure, register_pass

VIEWS = ("poot.reshape", "poot.broadcast")


def _is(op, name: str, fn: str | None = None) -> bool:
    return op is not None and op.name == name and (fn is None or fn_attr(op) == fn)


class _Group:
    """Ops of one candidate rotation: ``core`` (must be exclusively used inside) and
    ``views`` (cos/sin views and x slices: join the region only if used only inside)."""

    def __init__(self):
        self.core: list[ir.Operation] = []
        self.soft: list[ir.Operation] = []

    def add(self, op, soft=False):
        lst = self.soft if soft else self.core
        if op not in lst:
            lst.append(op)


def _trig(v: ir.Value, g: _Group) -> ir.Value:
    """The base of a cos/sin factor through reshape/broadcast views."""
    cur = v
    while (p := defining_op(cur)) is not None and p.name in VIEWS:
        g.add(p, soft=True)
        cur = p.operands[0]
    return cur


def _terms(v: ir.Value, g: _Group, depth: int = 0) -> list[tuple[int, ir.Operation, ir.Value]]:
    """``v`` as a signed sum of products ``sign * slice * trig``: [(sign, slice op, trig)]."""
    need(depth < 8, "expression too deep")
    p = defining_op(v)
    need(p is not None, "argument inside the rotation")
    if _is(p, "poot.binary", "add") or _is(p, "poot.binary", "sub"):
        g.add(p)
        a = _terms(p.operands[0], g, depth + 1)
        b = _terms(p.operands[1], g, depth + 1)
        if fn_attr(p) == "sub":
            b = [(-s, x, t) for s, x, t in b]
        return a + b
    if _is(p, "poot.unary", "neg"):
        g.add(p)
        return [(-s, x, t) for s, x, t in _terms(p.operands[0], g, depth + 1)]
    if _is(p, "poot.ternary", "fma"):
        g.add(p)
        return _product(p.operands[0], p.operands[1], g) + _terms(p.operands[2], g, depth + 1)
    if _is(p, "poot.binary", "mul"):
        g.add(p)
        return _product(p.operands[0], p.operands[1], g)
    raise NoMatch(f"{p.name} in the rotation")


def _product(a: ir.Value, b: ir.Value, g: _Group):
    pa, pb = defining_op(a), defining_op(b)
    # the x side is a slice; the trig side is anything else (seen through views)
    if _is(pa, "poot.slice") and not _is(pb, "poot.slice"):
        xs, t = pa, b
    elif _is(pb, "poot.slice") and not _is(pa, "poot.slice"):
        xs, t = pb, a
    else:
        raise NoMatch("a product that is not slice * factor")
    g.add(xs, soft=True)
    return [(1, xs, _trig(t, g))]


def _rotation(first: ir.Value, second: ir.Value, g: _Group):
    """Check ``first = a*C - b*S``, ``second = b*C + a*S``; return (a slice, b slice)."""
    t1, t2 = _terms(first, g), _terms(second, g)
    need(len(t1) == 2 and len(t2) == 2, "each half is two products")
    pos1 = [t for t in t1 if t[0] == 1]
    neg1 = [t for t in t1 if t[0] == -1]
    need(len(pos1) == 1 and len(neg1) == 1, "first half is not a*C - b*S")
    need(all(s == 1 for s, _, _ in t2), "second half is not b*C + a*S")
    _, a, c = pos1[0]
    _, b, s = neg1[0]
    need(not same_value(c, s), "C and S are one value")
    got = {}
    for _, x, t in t2:
        if x == b and same_value(t, c):
            got["bc"] = True
        elif x == a and same_value(t, s):
            got["as"] = True
    need(len(got) == 2, "second half does not pair with the first")
    need(a.operands[0] == b.operands[0] or same_value(a.operands[0], b.operands[0]),
          "the pair comes from two tensors")
    return a, b


def _slice_last(op: ir.Operation):
    """(x, start, limit, stride) of a slice that only cuts the last axis."""
    x = op.operands[0]
    shp = shape_of(x)
    st, li, sd = i64s(op, "start"), i64s(op, "limit"), i64s(op, "stride")
    n = len(shp)
    need(all(st[i] == 0 and li[i] == shp[i] and sd[i] == 1 for i in range(n - 1)),
          "slice cuts more than the channel axis")
    return x, st[-1], li[-1], sd[-1]


def _count(start, limit, stride) -> int:
    return max(0, (limit - start + stride - 1) // stride)


def _match(root: ir.Operation):
    """Match a rotation whose final op is ``root``. Returns (group, x, layout)."""
    g = _Group()
    tail = None
    top = root
    rv = root.results[0]
    n = len(shape_of(rv))
    body = rv
    # partial rotary: concat([rot..., tail]) (flat or nested) on the channel axis
    parts = None
    if _is(root, "poot.concat") and ir.IntegerAttr(root.attributes["axis"]).value == n - 1:
        ops_ = list(root.operands)
        last = defining_op(ops_[-1])
        if len(ops_) == 3 and _is(last, "poot.slice"):
            parts, tail = ops_[:2], last
        elif len(ops_) == 2 and _is(last, "poot.slice") and (
                _is(defining_op(ops_[0]), "poot.concat") or
                _is(defining_op(ops_[0]), "poot.reshape")):
            inner = defining_op(ops_[0])
            tail = last
            g.add(root)
            top = inner
            body = ops_[0]
        elif len(ops_) == 2:
            parts = ops_
    if tail is not None:
        g.add(tail, soft=True)
    if parts is None:
        p = top
        if _is(p, "poot.concat") and ir.IntegerAttr(p.attributes["axis"]).value == n - 1 \
                and len(p.operands) == 2:
            parts = list(p.operands)
        elif _is(p, "poot.reshape"):
            inner = defining_op(p.operands[0])
            need(_is(inner, "poot.concat") and len(inner.operands) == 2, "not a rotation")
            isz = shape_of(inner.results[0])
            need(isz[-1] == 2 and
                  ir.IntegerAttr(inner.attributes["axis"]).value == len(isz) - 1,
                  "interleaved halves are not stacked pairwise")
            g.add(p)
            g.add(inner)
            halves = []
            for h in inner.operands:
                rp = defining_op(h)
                need(_is(rp, "poot.reshape") and shape_of(rp.operands[0]) == isz[:-1],
                      "interleaved half is not a [..., h, 1] view")
                g.add(rp)
                halves.append(rp.operands[0])
            a, b = _rotation(halves[0], halves[1], g)
            x, s0, l0, d0 = _slice_last(a)
            x1, s1, l1, d1 = _slice_last(b)
            h = isz[-2]
            need(d0 == 2 and d1 == 2 and s0 == 0 and s1 == 1 and
                  _count(s0, l0, 2) == h and _count(s1, l1, 2) == h, "not pairs (2i, 2i+1)")
            if tail is None:   # any reshape of the stacked pairs (canonicalize folds views)
                need(isz[:-2] == shape_of(x)[:-1] and 2 * h == shape_of(x)[-1],
                      "rotation does not cover x")
            else:
                need(shape_of(p.results[0]) == shape_of(x)[:-1] + (2 * h,), "not [..., 2h]")
                _check_tail(tail, x, 2 * h, rv)
            g.add(p)
            return g, x, "interleaved"
        else:
            raise NoMatch("not a concat of two rotated halves")
    g.add(top)
    a, b = _rotation(parts[0], parts[1], g)
    x, s0, l0, d0 = _slice_last(a)
    _, s1, l1, d1 = _slice_last(b)
    h = shape_of(parts[0])[-1]
    need(d0 == 1 and d1 == 1 and s0 == 0 and l0 == h and s1 == h and l1 == 2 * h,
          "not halves (i, i + h)")
    _check_tail(tail, x, 2 * h, rv)
    return g, x, "half"


def _check_tail(tail, x, r, out):
    if tail is None:
        need(shape_of(out) == shape_of(x), "rotation does not cover x")
        return
    tx, st, li, sd = _slice_last(tail)
    need((tx == x or same_value(tx, x)) and st == r and li == shape_of(x)[-1] and sd == 1,
          "tail is not x[..., 2h:D]")
    need(shape_of(out) == shape_of(x), "rotation does not cover x")


def _region(g: _Group, root: ir.Operation) -> list[ir.Operation]:
    """The ops to outline: core ops (all must be used only inside, root excepted) and the
    soft ops used only inside (repeated until stable)."""
    inside = set(g.core) | set(g.soft)
    changed = True
    while changed:
        changed = False
        for o in list(inside):
            if o is root:
                continue
            if any(u not in inside for u in users(o)):
                if o in g.core:
                    raise NoMatch("an intermediate of the rotation is used outside it")
                inside.discard(o)
                changed = True
    return list(inside)


def _outline(ops: list[ir.Operation], root: ir.Operation, fn: ir.Operation,
             module_body: ir.Block, name: str, order: dict | None = None) -> None:
    """Outline ``ops`` (root last) into ``@name``; ``order``: op -> position in the block (of
    the ops there before any outlining; computed when not given)."""
    if order is None or any(o not in order for o in ops):
        order = {o.operation: i for i, o in enumerate(root.block.operations)}
    ops = sorted(ops, key=order.__getitem__)
    inside = set(ops)
    consts, inputs = [], []
    for o in ops:
        for v in o.operands:
            p = defining_op(v)
            if p is not None and p in inside:
                continue
            if p is not None and p.name == "poot.constant":
                if p not in consts:
                    consts.append(p)
            elif v not in inputs:
                inputs.append(v)
    with fn.context, fn.location:
        _, entry, mapping = new_dispatch_function(module_body, name, "rope", len(ops), inputs,
                                                  [root.results[0].type])
        ip = ir.InsertionPoint(entry)
        for o in sorted(consts, key=order.__getitem__) + ops:
            clone_into(o, mapping, ip)
        ir.Operation.create("func.return", operands=[mapping[root.results[0]]], ip=ip)
        call = ir.Operation.create("func.call", results=[root.results[0].type],
                                   operands=inputs,
                                   attributes={"callee": ir.FlatSymbolRefAttr.get(name)},
                                   ip=ir.InsertionPoint(root))
    root.results[0].replace_all_uses_with(call.results[0])
    for o in reversed(ops):
        o.erase()


def rope_fusion(module, trace: list | None = None) -> int:
    """Outline every RoPE rotation under ``module`` into a ``rope`` dispatch; returns the
    number outlined. ``trace`` receives (location, layout) per outlined rotation."""
    root_op = module.operation if isinstance(module, ir.Module) else module
    if root_op.name != "builtin.module":
        raise PassFailure("poot-rope-fusion runs on a builtin.module")
    body = root_op.regions[0].blocks[0]
    fns = functions(root_op)
    names = {sym_name(f) for f in fns}
    total = 0
    for fn in fns:
        if is_dispatch_function(fn) or not fn.regions[0].blocks:
            continue
        count = 0
        # One pass over the candidates in block order (a rotation only reads ops before its
        # root, so outlining one does not change whether a later one matches). ``gone``
        # holds the ops outlined so far by pointer (an Operation's hash, taken while it lives;
        # Python objects of one op are not unique): a candidate among them was part of an
        # earlier rotation and is not touched again.
        block = fn.regions[0].blocks[0]
        order = {o.operation: i for i, o in enumerate(block.operations)}
        candidates = [(hash(o), o) for o in order if o.name in ("poot.concat", "poot.reshape")]
        gone: set[int] = set()
        for key, op in candidates:
            if key in gone:
                continue
            try:
                g, _x, layout = _match(op)
                ops = _region(g, op)
            except NoMatch:
                continue
            while f"{sym_name(fn)}_rope_{count}" in names:
                count += 1
            name = f"{sym_name(fn)}_rope_{count}"
            names.add(name)
            if trace is not None:
                trace.append((str(op.location), layout))
            gone.update(hash(o) for o in ops)
            _outline(ops, op, fn, body, name, order)
            total += 1
        dce(fn)
    return total


@register_pass("poot-rope-fusion",
               "outline each RoPE rotation (half or interleaved pairs) into one rope dispatch")
def run(module: ir.Operation) -> None:
    rope_fusion(module)
