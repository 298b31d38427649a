"""``poot-fuse-dispatch``: partition each function's poot ops into fusable regions and outline
each region into one ``func.func private @<fn>_dispatch_<n>`` (one region = one kernel),
replaced by a ``func.call``.

The partition is decided on op semantics only (never on op order or tracer names):

* **elementwise** regions: any connected set of pointwise ops -- elementwise
  (unary/binary/ternary/compare/select/cast), ``broadcast``, views (reshape/transpose/slice),
  ``concat`` and ``dequantize``. Every output element is a function of input elements at
  computable indices, so a kernel recomputes producers at the indices it needs.
* **reduction** regions: ``poot.reduce`` ops that all share one iteration space (same operand
  shape S, same reduced axes A), their pointwise producers (a prologue, evaluated per element of
  S) and the consumers of reduced values, as long as every value that depends on a reduction is
  either *row-level* (shape S without A, or its keep-dims form, through elementwise ops and the
  reshape between those two forms) or *full-level* (shape S, reached only by a broadcast that
  puts the row back on the kept axes). A reduced value used at any other shape (another
  broadcast map, a transpose, a slice, a reshape to something else) is not fused: it needs the
  whole reduction before it can be read. RMSNorm, LayerNorm and softmax become one region each.
* **matmul** / **gather** regions: one contraction or gather (never two), a prologue of
  re-indexing and decoding ops on its operands (dequantize, cast, reshape, transpose, slice,
  broadcast, used only inside the region: a packed-weight matmul) and an elementwise epilogue on
  its result (bias, activation, residual; through bijective views: reshape, transpose).
* **scatter** regions: a scatter with re-indexing prologues; no epilogue.
* **attention** regions (the fused op of the flash-attention rewrite): like a matmul, one
  attention op with re-indexing prologues and an elementwise epilogue.
* a poot op with no rule here is a region of its own (kind: its mnemonic), never merged.

Views and ``dequantize`` are free when they re-index: one with several users is cloned per user
and joins the consuming region. Constants, iota and pointwise ops computed only from them are
cloned into each region that uses them; params and other values are region inputs. A merge that
would create a cycle (a region whose output reaches, through outside ops, its own input) is
refused. Results used outside a region become the call's results. Regions made only of reshapes
(aliases) are not outlined.

Option: ``max-region-ops`` (the largest region, in poot ops; cloned constants not counted).
"""

from __future__ import annotations

import heapq
from collections import defaultdict

from mlir import ir

from poot.dialects.types import type_from_mlir
from poot.passes.analysis import (ANCHORS, ELEMENTWISE, KNOWN, POINTWISE, REMATERIALIZABLE,
                                  SOURCES, VIEWS, defining_op, functions, is_dispatch_function,
                                  is_poot, new_dispatch_function, sym_name, users)
from poot.passes.dce import dce
from poot.passes.ir_utils import clone_into, op_attributes
from poot.passes.registry import PassFailure, register_pass

# ops that may feed an anchor (matmul/gather/scatter) inside its region: they only re-index
# or decode the operand
PROLOGUE = frozenset({"poot.dequantize", "poot.cast", "poot.reshape", "poot.transpose",
                      "poot.slice", "poot.broadcast"})
# ops pulled into the region of their consumer rather than their producer
PULLED = VIEWS | frozenset({"poot.dequantize"})


def _attrs_key(op: ir.Operation) -> str:
    return str(sorted((op.attributes[i].name, str(op.attributes[i].attr))
                      for i in range(len(op.attributes))))


def _shape(v: ir.Value) -> tuple[int, ...]:
    return type_from_mlir(v.type).shape


def _dims(op: ir.Operation) -> tuple[int, ...]:
    return tuple(ir.DenseI64ArrayAttr(op.attributes["dims"]))


class _Partition:
    """Greedy producer/consumer merging of one block's poot ops into legal, acyclic regions."""

    def __init__(self, block: ir.Block, max_ops: int):
        self.block = block
        self.max_ops = max_ops
        self.ops = [o.operation for o in block.operations]
        self.pos = {o: i for i, o in enumerate(self.ops)}
        self.remat: set = set()
        self.compute: list = []
        for o in self.ops:
            if not is_poot(o) or o.name in ("poot.param", "poot.packed_param"):
                continue
            if o.name in REMATERIALIZABLE or (
                    o.name in POINTWISE and o.operands and
                    all(defining_op(v) in self.remat for v in o.operands)):
                self.remat.add(o)
            else:
                self.compute.append(o)
        self.parent = {o: o for o in self.compute}
        self.members = {o: [o] for o in self.compute}
        # per region root: (opaque ops, reduces, anchors (ops)), what decides the kind
        self.census = {o: (int(o.name not in KNOWN), int(o.name == "poot.reduce"),
                           (o,) if o.name in ANCHORS else ()) for o in self.compute}
        self._users: dict = {}      # op -> its users (the IR does not change while merging)
        self._outside: dict = {}    # region root -> users of its members outside it
        self._keys: dict = {}       # op -> its operands as (defining op, result number)
        self._shapes: dict = {}     # op -> (operand shapes, result shape)

    def users(self, o) -> list:
        """:func:`~poot.passes.analysis.users` of ``o``, computed once per op."""
        got = self._users.get(o)
        if got is None:
            got = self._users[o] = users(o)
        return got

    def operand_keys(self, o) -> tuple:
        """``o``'s operands as hashable ``(defining op, result number)`` (block arguments:
        ``(None, id)``), computed once per op: the walks below hash these, not MLIR values."""
        got = self._keys.get(o)
        if got is None:
            got = self._keys[o] = tuple(
                (v.owner.operation, v.result_number) if isinstance(v, ir.OpResult)
                else (None, id(v)) for v in o.operands)
        return got

    def shapes(self, o) -> tuple:
        """``(operand shapes, first result's shape)`` of ``o``, computed once per op."""
        got = self._shapes.get(o)
        if got is None:
            got = self._shapes[o] = (tuple(_shape(v) for v in o.operands),
                                     _shape(o.results[0]) if len(o.results) else ())
        return got

    def outside_users(self, root) -> set:
        """The users of region ``root``'s members that are not members (kept per region as
        regions merge: the cycle check walks region boundaries, not members)."""
        got = self._outside.get(root)
        if got is None:
            got = self._outside[root] = {u for u in self.users(root) if u is not root}
        return got

    # ---- union-find ----
    def find(self, o):
        while self.parent[o] is not o:
            self.parent[o] = self.parent[self.parent[o]]
            o = self.parent[o]
        return o

    def group_of(self, v: ir.Value):
        p = defining_op(v)
        return p if p is not None and p in self.parent else None

    # ---- legality ----
    def classify(self, members: list) -> str | None:
        opaque = [o for o in members if o.name not in KNOWN]
        if opaque:  # an op without a fusion rule is a region of its own
            return opaque[0].name.removeprefix("poot.") if len(members) == 1 else None
        anchors = [o for o in members if o.name in ANCHORS]
        reduces = [o for o in members if o.name == "poot.reduce"]
        if len(anchors) > 1 or (anchors and reduces):
            return None
        if anchors:
            return self._anchor(members, anchors[0])
        if reduces:
            return self._reduction(members, reduces)
        return "elementwise"

    def _reduction(self, members, reduces) -> str | None:
        s = self.shapes(reduces[0])[0][0]
        axes = tuple(ir.DenseI64ArrayAttr(reduces[0].attributes["axes"]))
        for r in reduces[1:]:
            if self.shapes(r)[0][0] != s or \
                    tuple(ir.DenseI64ArrayAttr(r.attributes["axes"])) != axes:
                return None
        kept = tuple(i for i in range(len(s)) if i not in axes)
        row = tuple(s[i] for i in kept)
        keep = tuple(1 if i in axes else d for i, d in enumerate(s))
        level: dict = {}            # (op, result number) -> "row" | "full"
        for o in members:
            deps = {level[k] for k in self.operand_keys(o) if k in level}
            if o.name == "poot.reduce":
                if deps and deps != {"full"}:
                    return None
                level[(o, 0)] = "row"
                continue
            if not deps:
                continue  # prologue / independent operand of the epilogue
            if len(deps) != 1:
                return None
            dep = deps.pop()
            ins, out = self.shapes(o)
            if o.name in ELEMENTWISE:
                level[(o, 0)] = dep
            elif o.name == "poot.reshape" and dep == "row" and out in (row, keep):
                level[(o, 0)] = "row"
            elif o.name == "poot.broadcast" and dep == "row" and out == s and (
                    (ins[0] == row and _dims(o) == kept) or
                    (ins[0] == keep and _dims(o) == tuple(range(len(s))))):
                level[(o, 0)] = "full"
            else:
                return None  # a reduced value used at a different shape
        return "reduction"

    def _anchor(self, members, anchor) -> str | None:
        kind = ANCHORS[anchor.name]
        inside = set(members)
        # prologue: the anchor's in-region ancestors only re-index/decode, and feed only it
        stack = [defining_op(v) for v in anchor.operands]
        seen = set()
        while stack:
            p = stack.pop()
            if p is None or p not in inside or p in seen:
                continue
            seen.add(p)
            if p.name not in PROLOGUE or any(u not in inside for u in self.users(p)):
                return None
            stack.extend(defining_op(v) for v in p.operands)
        sig = {anchor.results[0]: ()}
        for o in members:
            if o is anchor or self.pos[o] < self.pos[anchor]:
                continue
            deps = {sig[v] for v in o.operands if v in sig}
            if not deps:
                continue
            if kind == "scatter" or len(deps) != 1:
                return None
            dep = deps.pop()
            if o.name in ELEMENTWISE:
                sig[o.results[0]] = dep
            elif o.name in ("poot.reshape", "poot.transpose"):  # bijective re-index
                sig[o.results[0]] = dep + ((o.name, _attrs_key(o), str(o.results[0].type)),)
            else:
                return None
        return kind

    def creates_cycle(self, members, start=None, last: int | None = None) -> bool:
        """Whether a region of the ops ``members`` would reach itself through outside ops or
        regions, searching from ``start`` (its members' users, or a superset; computed when
        None); ``last``: the members' last block position (computed when None).

        The search runs on the quotient graph (an outside region is one node: a path may enter
        it at one member and leave from another, so it goes on from that region's outside
        users), pruned by block position: nothing that starts after the region's last op can
        reach it."""
        inside = members if isinstance(members, (set, frozenset)) else set(members)
        if last is None:
            last = max(self.pos[o] for o in inside)
        if start is None:
            start = [u for o in inside for u in self.users(o)]
        stack = [u for u in start if u not in inside]
        seen = set()
        while stack:
            u = stack.pop()
            if u not in self.pos:
                continue
            if u in self.parent:
                node = self.find(u)
                if node in seen:
                    continue
                seen.add(node)
                if self.pos[self.members[node][0]] > last:
                    continue
                nxt = self.outside_users(node)
            else:
                if u in seen:
                    continue
                seen.add(u)
                if self.pos[u] > last:
                    continue
                nxt = self.users(u)
            for w in nxt:
                if w in inside:
                    return True
                stack.append(w)
        return False

    def _kind_could_be(self, census, kinds) -> bool:
        """What :meth:`classify` would decide from the op counts alone, before its walk: a
        merged region with an opaque op, two anchors or an anchor and a reduction is never
        legal, and its kind (reduction, the anchor's, elementwise) must be in ``kinds``."""
        opaque, reduces, anchors = census
        if opaque or len(anchors) > 1 or (anchors and reduces):
            return False
        if kinds is None:
            return True
        kind = "reduction" if reduces else ANCHORS[anchors[0].name] if anchors \
            else "elementwise"
        return kind in kinds

    def try_merge(self, a, b, kinds=None) -> bool:
        ra, rb = self.find(a), self.find(b)
        if ra is rb:
            return False
        if len(self.members[ra]) + len(self.members[rb]) > self.max_ops:
            return False
        (oa, ra_, aa), (ob, rb_, ab) = self.census[ra], self.census[rb]
        census = (oa + ob, ra_ + rb_, aa + ab)
        if not self._kind_could_be(census, kinds):
            return False
        merged = sorted(self.members[ra] + self.members[rb], key=self.pos.__getitem__)
        kind = self.classify(merged)
        if kind is None or (kinds is not None and kind not in kinds):
            return False
        inside = set(merged)
        start = self.outside_users(ra) | self.outside_users(rb)
        if self.creates_cycle(inside, start, self.pos[merged[-1]]):
            return False
        self.parent[rb] = ra
        self.members[ra] = merged
        self.census[ra] = census
        self._outside[ra] = {u for u in start if u not in inside}
        del self.members[rb], self._outside[rb]
        return True

    def producers(self, o):
        """Compute producers of ``o``: direct ones first, then through pulled views."""
        out, stack = [], [o]
        while stack:
            cur = stack.pop(0)
            for v in cur.operands:
                p = self.group_of(v)
                if p is not None and p not in out:
                    out.append(p)
                    if p.name in PULLED:
                        stack.append(p)
        return out

    def run(self) -> list[list]:
        # Reductions first (they gain the most: a prologue that is not materialized, an
        # epilogue that reads the reduced row in registers), then the anchors' prologues and
        # epilogues, then plain elementwise regions.
        for kinds in (("reduction",), tuple(ANCHORS.values()), None):
            for o in self.compute:
                if o.name in PULLED:
                    continue
                for p in self.producers(o):
                    self.try_merge(o, p, kinds)
        for o in self.compute:  # views left alone (e.g. outputs) join their producer
            if o.name in PULLED and len(self.members.get(self.find(o), ())) == 1:
                for p in self.producers(o):
                    if self.try_merge(p, o):
                        break
        return sorted(self.members.values(), key=lambda m: self.pos[m[0]])


def _clone_fanout(block: ir.Block) -> None:
    """Give every view/dequantize one user: clone it per extra user (users in this block).
    A user that takes the value as several operands (``concat(v, v)``) gets one clone for all
    of them: a clone per use would be one more op in that region, and where the region is at
    its size limit, one more region."""
    for o in reversed([x.operation for x in block.operations]):
        if o.name not in PULLED:
            continue
        uses = [(u.owner.operation, u.operand_number) for u in o.results[0].uses]
        clones: list[tuple[ir.Operation, ir.Value]] = [(uses[0][0], o.results[0])] \
            if uses else []
        for owner, idx in uses[1:]:
            mine = next((v for user, v in clones if user == owner), None)
            if mine is None:
                with o.context, o.location:
                    c = ir.Operation.create(o.name, results=[o.results[0].type],
                                            operands=list(o.operands),
                                            attributes=op_attributes(o),
                                            ip=ir.InsertionPoint(owner) if owner.block == block
                                            else ir.InsertionPoint(o))
                mine = c.results[0]
                clones.append((owner, mine))
            owner.operands[idx] = mine


class _Outliner:
    def __init__(self, module_body: ir.Block, fn: ir.Operation, names: set):
        self.module_body = module_body
        self.fn = fn
        self.names = names
        self.count = 0

    def fresh(self) -> str:
        base = sym_name(self.fn)
        while f"{base}_dispatch_{self.count}" in self.names:
            self.count += 1
        name = f"{base}_dispatch_{self.count}"
        self.names.add(name)
        return name

    def outline(self, members: list, kind: str, part: _Partition, ip) -> ir.Operation:
        inside = set(members)
        inputs, remat_needed = [], set()

        def need(v):
            p = defining_op(v)
            if p is not None and p in inside:
                return
            if p is not None and p in part.remat:
                if p not in remat_needed:
                    remat_needed.add(p)
                    for w in p.operands:
                        need(w)
                return
            if v not in inputs:
                inputs.append(v)

        for o in members:
            for v in o.operands:
                need(v)
        outputs = [r for o in members for r in o.results
                   if any(u.owner.operation not in inside for u in r.uses)]
        name = self.fresh()
        ctx = self.fn.context
        with ctx, self.fn.location:
            _, entry, mapping = new_dispatch_function(
                self.module_body, name, kind, len(members), inputs, [r.type for r in outputs])
            body_ip = ir.InsertionPoint(entry)
            for o in sorted(remat_needed, key=part.pos.__getitem__):
                clone_into(o, mapping, body_ip)
            for o in members:
                clone_into(o, mapping, body_ip)
            ir.Operation.create("func.return", operands=[mapping[r] for r in outputs],
                                ip=body_ip)
            call = ir.Operation.create("func.call", results=[r.type for r in outputs],
                                       operands=inputs,
                                       attributes={"callee": ir.FlatSymbolRefAttr.get(name)},
                                       ip=ip)
        for r, n in zip(outputs, call.results):
            r.replace_all_uses_with(n)
        for o in reversed(members):
            o.erase()
        return call


def _nested_operands(op: ir.Operation) -> list:
    vals = list(op.operands)
    if op.regions:
        def visit(inner):
            vals.extend(inner.operation.operands)
            return ir.WalkResult.ADVANCE
        op.walk(visit)
    return vals


def fuse_function(fn: ir.Operation, module_body: ir.Block, names: set,
                  max_ops: int) -> list[tuple[str, int]]:
    """Partition and outline ``fn``'s body; returns (kind, ops) per region in order."""
    if len(fn.regions[0].blocks) != 1:
        raise PassFailure(f"poot-fuse-dispatch: function @{sym_name(fn)} has "
                          f"{len(fn.regions[0].blocks)} blocks; one is supported")
    block = fn.regions[0].blocks[0]
    dce(fn)  # a dead op would otherwise become a kernel of its own
    _clone_fanout(block)
    part = _Partition(block, max_ops)
    groups = [g for g in part.run() if any(o.name != "poot.reshape" for o in g)]
    kinds = [part.classify(g) for g in groups]
    # order regions and the remaining ops topologically (regions are acyclic by construction)
    node = {}
    for i, g in enumerate(groups):
        for o in g:
            node[o] = ("g", i)
    ops = [o.operation for o in block.operations]
    term = ops[-1]
    for o in ops[:-1]:
        node.setdefault(o, ("o", o))
    key = {}
    for o in ops[:-1]:
        k = node[o]
        key[k] = min(key.get(k, len(ops)), part.pos[o])
    succ, indeg = defaultdict(set), defaultdict(int)
    for o in ops:
        for v in _nested_operands(o):
            p = defining_op(v)
            if p is None or p not in node or o is term:
                continue
            a, b = node[p], node.get(o)
            if b is None or a == b or b in succ[a]:
                continue
            succ[a].add(b)
            indeg[b] += 1
    heap = [(key[k], n, k) for n, k in enumerate(key) if indeg[k] == 0]
    order_id = {k: n for n, k in enumerate(key)}
    heapq.heapify(heap)
    order = []
    while heap:
        _, _, k = heapq.heappop(heap)
        order.append(k)
        for s in sorted(succ[k], key=order_id.__getitem__):
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(heap, (key[s], order_id[s], s))
    if len(order) != len(key):
        raise PassFailure(f"poot-fuse-dispatch: @{sym_name(fn)}: regions form a cycle")
    outliner = _Outliner(module_body, fn, names)
    ip = ir.InsertionPoint(term)
    for k in order:
        if k[0] == "o":
            k[1].move_before(term)
        else:
            outliner.outline(groups[k[1]], kinds[k[1]], part, ip)
    dce(fn)
    return [(k, len(g)) for k, g in zip(kinds, groups)]


def fuse_dispatch(module, max_region_ops: int = 256) -> dict:
    """Run the pass on every function of ``module`` that is not itself a dispatch region."""
    root = module.operation if isinstance(module, ir.Module) else module
    if root.name != "builtin.module":
        raise PassFailure("poot-fuse-dispatch runs on a builtin.module")
    body = root.regions[0].blocks[0]
    fns = functions(root)
    names = {sym_name(f) for f in fns}
    out = {}
    for fn in fns:
        if is_dispatch_function(fn) or not fn.regions[0].blocks:
            continue
        out[sym_name(fn)] = fuse_function(fn, body, names, max_region_ops)
    return out


@register_pass("poot-fuse-dispatch",
               "pointwise/reduction/epilogue fusion: outline one function per kernel region",
               {"max-region-ops": (int, 256, "largest region, in poot ops")})
def run(module: ir.Operation, **opts) -> None:
    if opts.get("max-region-ops", 256) < 1:
        raise PassFailure("poot-fuse-dispatch: max-region-ops must be >= 1")
    fuse_dispatch(module, opts.get("max-region-ops", 256))
