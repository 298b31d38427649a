"""Horizontal fusion for GPU plans: independent sibling dispatches run as ONE kernel launch.

Why: a decode step is latency-bound. Each dispatch is at least one launch (~3-4 us in a CUDA
graph even when tiny), and a transformer layer has several dispatches that read the same
input but not each other's results (the q/k/v GEMVs, the gate/up GEMVs, the K and V cache
writes, a LoRA shrink beside its base projections). Concatenating their grids into one
kernel saves a launch per extra member while every block still does exactly the work it did
before. Members of several kernels (a split-K GEMM: partial products, then their reduction)
fuse phase by phase: every member's first kernel in one launch, then every member's second.

Two halves, so that a merged dispatch is an ordinary dispatch function everywhere:

1. :func:`fuse_siblings` (planning, called by :func:`~poot.backends.gpu.plan.plan_program`
   after :func:`~poot.backends.gpu.merge.fold_regions`) groups calls of the step function
   that are mutually independent (none consumes another member's result, directly or through
   a call in between: a call that reads a member's result closes the group before it) and
   each synthesize to kernel launches only (:func:`kernel_launches`; leading copies of an
   argument into a result, the scatter strategy's form, are allowed). A group becomes one call of a new function
   (:func:`merged_function`) whose body is all members' bodies and whose results are all
   members' results: a valid poot function, so the oracle and the device check evaluate it
   as before. It is placed where the group's last member was: the calls it passes over read
   no member result, so members only ever move later, past calls they do not feed. A call
   joins a group only when the merged function still synthesizes to one kernel per phase
   (the strategy below decides); else the group closes and a new one starts with that call.
2. The ``horizontal`` strategy (:func:`horizontal_kernels`, first in
   :data:`poot.backends.gpu.strategies.STRATEGIES`) recognises a merged function by its ``poot.dispatch``
   attribute (``members``: each member's own dispatch attribute; ``member_results``: how many
   results each member has), splits the body back into the members' functions (the backward
   slice of each member's results), synthesizes each with the other strategies and builds one
   fused kernel per phase (:func:`fuse_kernels`): phase p holds every member's p-th kernel,
   so a member's kernels keep their order and nothing in a phase reads what another member
   of it writes. So a merged function met alone (a region test, a
   device check) gets the same kernel, and identical layers share it (it is body-keyed like
   any dispatch).

The fused kernel: its grid is the concatenation of the members' grids along x (a member's
2-D/3-D grid is linearized), its parameters are the union of the members' buffers (one
parameter per distinct (slot, type, attributes)), and block ids ``[off_i, off_i + n_i)`` run
member i with its block id shifted by ``off_i``. Its block size B is the members' largest; a
member with a smaller block size ``B_s`` runs as *virtual blocks*: each real block hosts
``B/B_s`` of them (virtual block = ``(bid - off) * (B/B_s) + tid / B_s``, virtual thread =
``tid % B_s``, guarded against the virtual blocks past its grid). That needs ``B_s`` to divide
B, to be a multiple of the subgroup size (subgroup operations then see whole subgroups of one
virtual block), and a body without barriers or workgroup memory (they are per real block);
otherwise the member is not merged. Every branch condition is uniform per (virtual) block, so
barriers and shuffles stay in uniform control flow. Workgroup memory is shared between members
(a real block runs exactly one member): attributions of one type are reused, and on targets
whose lowering takes ``memref.view`` of workgroup memory (:data:`WORKGROUP_VIEW`) the
members' tiles of different shapes are views of one buffer (:func:`_pool_workgroup`); what
is left must fit the target's shared memory.

It is built at the MLIR level: a small *scaffold* (the signature, the block-id arithmetic,
one ``scf.if`` per member holding a marker op whose operands are that member's block ids,
thread id, grid and block sizes) is emitted as text, since it is generated code with no
member IR in it; then each member's ``gpu.func`` body is moved into its branch: its
parameters and workgroup attributions replaced by the fused kernel's, its ``gpu.block_id`` /
``gpu.thread_id`` / ``gpu.grid_dim`` / ``gpu.block_dim`` by the marker's operands, its
``gpu.return`` dropped (the branch's ``scf.yield`` ends it). No member IR goes through text.

Cost rule: merging saves a launch per extra member (per phase) and never adds work except
the branch on the block id; it is refused when a member's launches are not kernels only, when
block sizes do not divide (above), when a member uses an index op other than those replaced (``gpu.global_id``,
``gpu.subgroup_id`` in a virtual block, ...), when the concatenated grid exceeds 65535
blocks (the smallest ``maxComputeWorkGroupCount[0]`` Vulkan guarantees), or when the fused
kernel does not verify. ``POOT_GPU_HORIZONTAL=0`` turns it off (to compare).
"""

from __future__ import annotations

from dataclasses import dataclass

from mlir import ir

from poot.backends.gpu.kernels import WG_ALIGN, DispatchKernels, Launch, memref_nbytes
from poot.backends.gpu.merge import dispatch_kind
from poot.passes.analysis import DISPATCH_ATTR
from poot.passes.ir_utils import clone_into
from poot import settings

#: the smallest maxComputeWorkGroupCount[0] Vulkan guarantees; CUDA allows 2^31 - 1
MAX_GRID_X = 65535
#: set to 0 to plan without horizontal fusion
ENV = "POOT_GPU_HORIZONTAL"
#: the target feature saying its lowering takes ``memref.view`` of workgroup memory (NVVM
#: does; the SPIR-V conversion does not), so members' tiles of different shapes may share
#: one buffer (:func:`_pool_workgroup`)
WORKGROUP_VIEW = "workgroup_view"

_MODULE, _KERNEL = "poot_horizontal", "horizontal"
#: index ops replaced per member (by the marker's operands)
_REPLACED = {"gpu.block_id", "gpu.thread_id", "gpu.grid_dim", "gpu.block_dim"}
#: index ops that stay valid in a member running on whole real blocks only
_REAL_BLOCK_ONLY = {"gpu.subgroup_id", "gpu.num_subgroups", "gpu.barrier"}
#: index ops that stay valid anywhere (a virtual block is whole subgroups)
_ANYWHERE = {"gpu.lane_id", "gpu.subgroup_size", "gpu.shuffle", "gpu.subgroup_reduce",
             "gpu.return"}
#: of those, the ops whose lanes must not straddle two virtual blocks (a known subgroup width
#: dividing the virtual block size guarantees it)
_SUBGROUP_OPS = {"gpu.shuffle", "gpu.subgroup_reduce"}
#: target ops of one thread each (no collective): fine in a virtual block (a GEMV's wait on
#: its predecessor grid, placed after its weight prefetch)
_PER_THREAD = {"nvvm.griddepcontrol"}

# Functions built here (merged candidates, members split back out) live in scratch modules
# that are never erased: erasing a function whose ops Python still references can crash the
# MLIR bindings (see merge.py).
_KEEP: list = []


def enabled() -> bool:
    """Whether horizontal fusion runs (``POOT_GPU_HORIZONTAL`` unset or not ``0``)."""
    return settings.get_flag(ENV)


def _name(op: ir.Operation) -> str:
    return ir.StringAttr(op.attributes["sym_name"]).value


def _callee(call: ir.Operation) -> str:
    return ir.FlatSymbolRefAttr(call.attributes["callee"]).value


def _ops_under(op: ir.Operation) -> list[ir.Operation]:
    """Every operation nested in ``op`` (pre-order, ``op`` excluded)."""
    out = []
    for region in op.regions:
        for block in region.blocks:
            for o in block.operations:
                o = o.operation
                out.append(o)
                out += _ops_under(o)
    return out


# ---- the poot level: a merged function and its members --------------------------------------

def kernel_launches(dk: DispatchKernels | None) -> list[Launch] | None:
    """The kernel launches of ``dk`` (its *phases*, in order) when it is copies of an
    argument into a result (a scatter's destination, dropped by the plan when updated in
    place) followed by kernels only; None otherwise."""
    if dk is None:
        return None
    i = 0
    while i < len(dk.launches) and dk.launches[i].kind == "copy":
        L = dk.launches[i]
        if L.args[0][0] != "arg" or L.args[1][0] != "out":
            return None
        i += 1
    rest = dk.launches[i:]
    if not rest or any(L.kind != "kernel" for L in rest):
        return None
    return rest


def single_launch(dk: DispatchKernels | None) -> bool:
    """True when ``dk`` is one kernel launch, preceded only by copies of an argument into a
    result (:func:`kernel_launches` of length 1)."""
    return len(kernel_launches(dk) or ()) == 1


def merged_function(calls: list, funcs: dict, name: str, where: ir.Block):
    """A new private function in ``where`` computing every result of ``calls`` (in order)
    from the union of their operands; returns (function, call operands). Its ``poot.dispatch``
    keeps the members' kind when they share one (else ``horizontal``), the summed op count,
    and what :func:`split_members` needs: ``members`` (each member's own attribute) and
    ``member_results``."""
    operands: list = []
    for c in calls:
        for v in c.operands:
            if v not in operands:
                operands.append(v)
    fns = [funcs[_callee(c)] for c in calls]
    results = [r.type for c in calls for r in c.results]
    with fns[0].context, fns[0].location:
        dicts = [f.attributes[DISPATCH_ATTR] if DISPATCH_ATTR in f.attributes else
                 ir.DictAttr.get({"kind": ir.StringAttr.get("?")}) for f in fns]
        kinds = {dispatch_kind(f) for f in fns}
        nops = sum(ir.IntegerAttr(ir.DictAttr(d)["ops"]).value for d in dicts
                   if "ops" in ir.DictAttr(d))
        attr = ir.DictAttr.get({
            "kind": ir.StringAttr.get(kinds.pop() if len(kinds) == 1 else "horizontal"),
            "ops": ir.IntegerAttr.get(ir.IntegerType.get_signless(64), nops),
            "members": ir.ArrayAttr.get(dicts),
            "member_results": ir.DenseI64ArrayAttr.get([len(c.results) for c in calls])})
        ftype = ir.FunctionType.get([v.type for v in operands], results)
        fn = ir.Operation.create(
            "func.func", regions=1,
            attributes={"sym_name": ir.StringAttr.get(name),
                        "function_type": ir.TypeAttr.get(ftype),
                        "sym_visibility": ir.StringAttr.get("private"),
                        DISPATCH_ATTR: attr},
            ip=ir.InsertionPoint(where))
        entry = fn.regions[0].blocks.append(*[v.type for v in operands])
        outer = dict(zip(operands, entry.arguments))
        ip = ir.InsertionPoint(entry)
        rets = []
        for c, f in zip(calls, fns):
            body = f.regions[0].blocks[0]
            mapping = {a: outer[v] for a, v in zip(body.arguments, c.operands)}
            for o in body.operations:
                o = o.operation
                if o.name == "func.return":
                    rets += [mapping[v] for v in o.operands]
                    break
                clone_into(o, mapping, ip)
        ir.Operation.create("func.return", operands=rets, ip=ip)
    return fn, operands


def split_members(fn: ir.Operation, where: ir.Block) -> list | None:
    """The members of a merged function (:func:`merged_function`) as functions of their own
    in ``where``: ``[(function, [merged argument index per member argument], first result)]``;
    None for any other function. Each member's body is the backward slice of its results."""
    if DISPATCH_ATTR not in fn.attributes:
        return None
    d = ir.DictAttr(fn.attributes[DISPATCH_ATTR])
    if "members" not in d or "member_results" not in d:
        return None
    dicts = list(ir.ArrayAttr(d["members"]))
    counts = list(ir.DenseI64ArrayAttr(d["member_results"]))
    block = fn.regions[0].blocks[0]
    ops = [o.operation for o in block.operations]
    ret = ops[-1]
    if len(dicts) != len(counts) or sum(counts) != len(ret.operands):
        return None
    out, first = [], 0
    with fn.context, fn.location:
        for i, (md, n) in enumerate(zip(dicts, counts)):
            want = list(ret.operands)[first:first + n]
            needed = set(want)
            body = []
            for o in reversed(ops[:-1]):
                if any(r in needed for r in o.results):
                    body.append(o)
                    needed.update(o.operands)
            body.reverse()
            args = [k for k, a in enumerate(block.arguments) if a in needed]
            ftype = ir.FunctionType.get([block.arguments[k].type for k in args],
                                        [v.type for v in want])
            attrs = {"sym_name": ir.StringAttr.get(f"{_name(fn)}_m{i}"),
                     "function_type": ir.TypeAttr.get(ftype),
                     "sym_visibility": ir.StringAttr.get("private")}
            kind = ir.DictAttr(md)["kind"] if "kind" in ir.DictAttr(md) else None
            if kind is not None and ir.StringAttr(kind).value != "?":
                attrs[DISPATCH_ATTR] = md         # "?": the member had no attribute
            mfn = ir.Operation.create("func.func", regions=1, attributes=attrs,
                                      ip=ir.InsertionPoint(where))
            entry = mfn.regions[0].blocks.append(*[block.arguments[k].type for k in args])
            mapping = {block.arguments[k]: a for k, a in zip(args, entry.arguments)}
            ip = ir.InsertionPoint(entry)
            for o in body:
                clone_into(o, mapping, ip)
            ir.Operation.create("func.return", operands=[mapping[v] for v in want], ip=ip)
            out.append((mfn, args, first))
            first += n
    return out


# ---- the kernel level -----------------------------------------------------------------------

@dataclass
class _Member:
    """One member kernel: its ``gpu.func``, launch, and the fused kernel's view of it."""

    func: ir.Operation
    launch: Launch
    slots: list                 # the fused dispatch's slot of each kernel parameter
    n_params: int
    wg_types: list[str]         # its workgroup attributions
    grid: tuple[int, int, int]
    bs: int                     # its block size (x; y = z = 1)
    ratio: int = 1              # virtual blocks per real block
    blocks: int = 0             # real blocks it takes
    offset: int = 0             # its first real block
    param_ix: list | None = None   # the fused kernel's parameter of each of its parameters
    wg_src: list | None = None     # per attribution of its own: the fused kernel's
    #                                (``%w<k>``), or (byte offset, type) of a view into %w0


def _find_kernel(dk: DispatchKernels, L: Launch) -> ir.Operation | None:
    """The ``gpu.func`` launch ``L`` names, when its ``gpu.module`` holds only kernels (a
    split-K GEMM's two share one; nothing a kernel might call)."""
    for gm in dk.module.body.operations:
        gm = gm.operation
        if gm.name != "gpu.module" or _name(gm) != L.module:
            continue
        inner = [o.operation for o in gm.regions[0].blocks[0].operations]
        if all(o.name == "gpu.func" and "gpu.kernel" in o.attributes for o in inner):
            return next((o for o in inner if _name(o) == L.kernel), None)
    return None


def _member(dk: DispatchKernels, L: Launch, slot_of) -> _Member | None:
    """The member kernel of ``dk``'s kernel launch ``L``, its slots mapped through
    ``slot_of``; None when its kernel is not one block-structured ``gpu.func`` with a 1-D
    block."""
    f = _find_kernel(dk, L)
    if f is None or L.block[1] != 1 or L.block[2] != 1:
        return None
    blocks = f.regions[0].blocks
    if len(blocks) != 1:
        return None
    entry = blocks[0]
    ops = [o.operation for o in entry.operations]
    if not ops or ops[-1].name != "gpu.return" or len(ops[-1].operands):
        return None
    n_params = len(ir.FunctionType(ir.TypeAttr(f.attributes["function_type"]).value).inputs)
    n_wg = ir.IntegerAttr(f.attributes["workgroup_attributions"]).value \
        if "workgroup_attributions" in f.attributes else 0
    if n_params != len(L.args) or len(entry.arguments) != n_params + n_wg:
        return None                       # private attributions, or a mismatched launch
    wg = [str(a.type) for a in list(entry.arguments)[n_params:]]
    return _Member(f, L, [slot_of(s) for s in L.args], n_params, wg, tuple(L.grid),
                   L.block[0])


def _shape(members: list[_Member], caps) -> int | None:
    """Block size of the fused kernel, after setting each member's ratio, blocks and offset;
    None when a member cannot share it (see the module doc's cost rule)."""
    B = max(m.bs for m in members)
    known_sg = getattr(caps, "subgroup_size", None)
    sg = known_sg or 1
    off = 0
    for m in members:
        names = {o.name for o in _ops_under(m.func)}
        gpu_ops = {n for n in names if n.startswith("gpu.")}
        if gpu_ops - _REPLACED - _REAL_BLOCK_ONLY - _ANYWHERE:
            return None                   # an index op this fusion does not remap
        if B % m.bs:
            return None
        m.ratio = B // m.bs
        if m.ratio > 1 and (m.bs % sg or m.wg_types or gpu_ops & _REAL_BLOCK_ONLY):
            return None                   # only whole-subgroup, barrier-free virtual blocks
        if m.ratio > 1 and (any(n.startswith(("nvgpu.", "nvvm.", "rocdl.", "spirv."))
                                and n not in _PER_THREAD for n in names) or
                            (known_sg is None and gpu_ops & _SUBGROUP_OPS)):
            # target collectives (ldmatrix, mma) and subgroup ops of an unknown width may
            # span what would be two virtual blocks
            return None
        n = m.grid[0] * m.grid[1] * m.grid[2]
        m.blocks, m.offset = -(-n // m.ratio), off
        off += m.blocks
    if off > MAX_GRID_X:
        return None
    return B


def _pool_workgroup(members: list[_Member], caps, kc: ir.Context) -> list[str] | None:
    """The fused kernel's workgroup attributions, setting each member's ``wg_src`` (what
    stands for each of its own attributions); None when they do not fit ``caps``' shared
    memory. Members share memory because a real block runs exactly one member (a member
    with workgroup memory never runs as virtual blocks: :func:`_shape`): a member takes an
    attribution of its own type that it does not already use, else a new one (two GEMM
    tiles of one shape cost one tile's memory). When that does not fit and the target
    reinterprets workgroup memory (feature :data:`WORKGROUP_VIEW`), every member's
    attributions are ``memref.view``s into one byte buffer as large as the largest
    member's (GEMM tiles of different shapes)."""
    def nbytes(t):
        return memref_nbytes(ir.Type.parse(t, kc))
    limit = getattr(caps, "max_shared_bytes", 0) or 0
    pool: list[str] = []
    for m in members:
        m.wg_src = []
        for t in m.wg_types:
            k = next((i for i, u in enumerate(pool) if u == t and
                      f"%w{i}" not in m.wg_src), None)
            if k is None:
                k = len(pool)
                pool.append(t)
            m.wg_src.append(f"%w{k}")
    if not limit or sum(nbytes(t) for t in pool) <= limit:
        return pool
    if WORKGROUP_VIEW not in (getattr(caps, "features", None) or ()):
        return None
    size = 0
    for m in members:
        m.wg_src, off = [], 0
        for t in m.wg_types:
            m.wg_src.append((off, t))
            off += -(-nbytes(t) // 16) * 16          # 16-byte aligned, as WG_ALIGN
        size = max(size, off)
    if size > limit:
        return None
    return [f"memref<{size}xi8, #gpu.address_space<workgroup>>"]


def _param_text(f: ir.Operation, j: int) -> tuple[str, str]:
    """(type, attribute dict text or "") of parameter ``j`` of ``f``."""
    t = str(f.regions[0].blocks[0].arguments[j].type)
    a = ""
    if "arg_attrs" in f.attributes:
        d = ir.ArrayAttr(f.attributes["arg_attrs"])[j]
        if len(ir.DictAttr(d)):
            a = str(d)
    return t, a


def _scaffold(members: list[_Member], B: int, params: list, wg: list, module: str) -> str:
    """The fused kernel's text with one marker op per member (see the module doc)."""
    sig = ", ".join(f"%p{i}: {t}{' ' + a if a else ''}" for i, (_, t, a) in enumerate(params))
    wgs = f" workgroup({', '.join(f'%w{i}: {t} {WG_ALIGN}' for i, t in enumerate(wg))})" \
        if wg else ""
    lines = ["%bid = gpu.block_id x", "%tid = gpu.thread_id x",
             "%c0 = arith.constant 0 : index", "%c1 = arith.constant 1 : index"]
    for i, m in enumerate(members):
        def c(name, v):
            lines.append(f"%{name}{i} = arith.constant {v} : index")
            return f"%{name}{i}"
        lo, hi = c("lo", m.offset), c("hi", m.offset + m.blocks)
        lines += [f"%ge{i} = arith.cmpi uge, %bid, {lo} : index",
                  f"%lt{i} = arith.cmpi ult, %bid, {hi} : index",
                  f"%in{i} = arith.andi %ge{i}, %lt{i} : i1",
                  f"scf.if %in{i} {{",
                  f"%rel{i} = arith.subi %bid, {lo} : index"]
        gx, gy, gz = (c(f"g{d}", v) for d, v in zip("xyz", m.grid))
        bs = c("bs", m.bs)
        closes = 1
        vb, vt = f"%rel{i}", "%tid"
        if m.ratio > 1:
            r, n = c("r", m.ratio), c("n", m.grid[0] * m.grid[1] * m.grid[2])
            lines += [f"%sub{i} = arith.divui %tid, {bs} : index",
                      f"%vb0{i} = arith.muli %rel{i}, {r} : index",
                      f"%vb{i} = arith.addi %vb0{i}, %sub{i} : index",
                      f"%vt{i} = arith.remui %tid, {bs} : index",
                      f"%ok{i} = arith.cmpi ult, %vb{i}, {n} : index",
                      f"scf.if %ok{i} {{"]
            vb, vt = f"%vb{i}", f"%vt{i}"
            closes = 2
        bx, by, bz = vb, "%c0", "%c0"
        if m.grid[1] * m.grid[2] > 1:        # linearized 2-D / 3-D grid
            lines += [f"%bx{i} = arith.remui {vb}, {gx} : index",
                      f"%byz{i} = arith.divui {vb}, {gx} : index",
                      f"%by{i} = arith.remui %byz{i}, {gy} : index",
                      f"%bz{i} = arith.divui %byz{i}, {gy} : index"]
            bx, by, bz = f"%bx{i}", f"%by{i}", f"%bz{i}"
        ids = [bx, by, bz, vt, gx, gy, gz, bs, "%c0", "%c1"]
        types = ["index"] * len(ids)
        for j, src in enumerate(m.wg_src):
            if isinstance(src, tuple):       # a view into the one byte buffer
                off, t = src
                lines += [f"%o{i}_{j} = arith.constant {off} : index",
                          f"%v{i}_{j} = memref.view %w0[%o{i}_{j}][] : {wg[0]} to {t}"]
                src = f"%v{i}_{j}"
            ids.append(src)
            types.append(m.wg_types[j])
        lines.append(f'"hfuse.member"({", ".join(ids)}) {{member = {i} : i64}} : '
                     f'({", ".join(types)}) -> ()')
        lines += ["}"] * closes
    body = "\n    ".join(lines)
    return (f"gpu.module @{module} {{\n  gpu.func @{_KERNEL}({sig}){wgs} kernel attributes "
            f"{{known_block_size = array<i32: {B}, 1, 1>}} {{\n    {body}\n    gpu.return\n"
            f"  }}\n}}\n")


def _dim(op: ir.Operation) -> int:
    return "xyz".index(str(op.attributes["dimension"]).rstrip(">")[-1])


def _move_body(m: _Member, marker: ir.Operation, params: list[ir.Value]) -> None:
    """Move member ``m``'s body in front of its ``marker`` (see the module doc; the marker's
    operands after the ids are the member's workgroup memory)."""
    bx, by, bz, vt, gx, gy, gz, bs, c0, c1 = list(marker.operands)[:10]
    wg = list(marker.operands)[10:]
    entry = m.func.regions[0].blocks[0]
    for a, v in zip(entry.arguments, params + wg):
        a.replace_all_uses_with(v)
    ids = [o for o in _ops_under(m.func) if o.name in _REPLACED]
    for o in ids:
        d = _dim(o)
        if o.name == "gpu.block_id":
            v = (bx, by, bz)[d]
        elif o.name == "gpu.grid_dim":
            v = (gx, gy, gz)[d]
        elif o.name == "gpu.thread_id":
            v = vt if d == 0 else c0
        else:                                               # gpu.block_dim
            v = bs if d == 0 else c1
        o.results[0].replace_all_uses_with(v)
        o.erase()
    for o in [o.operation for o in entry.operations][:-1]:  # all but gpu.return
        o.move_before(marker)


def fuse_kernels(parts: list[tuple[DispatchKernels, dict]], caps, kc: ir.Context):
    """The fused dispatch of dispatches ``parts`` (``(kernels, {member slot: fused slot} for
    its arg and out slots)``, kernels parsed in ``kc``), each copies then kernel launches
    (:func:`kernel_launches`): their copies, then one fused kernel per *phase* p holding every
    member's p-th kernel (a split-K GEMM's partial products beside another's, then their
    reductions side by side: a member's kernels stay in order, and nothing in a phase reads
    what another member writes). Returns (gpu.module text, launches, scratch, consts), or
    None when a phase's kernels cannot share one kernel."""
    copies, scratch, consts, per = [], [], [], []
    for dk, slot_map in parts:
        s0, c0 = len(scratch), len(consts)

        def slot_of(s, slot_map=slot_map, s0=s0, c0=c0):
            k, i = s
            return {"scratch": ("scratch", s0 + i), "const": ("const", c0 + i)}.get(k) or \
                slot_map[s]
        ks = kernel_launches(dk)
        if ks is None:
            return None
        per.append((dk, ks, slot_of))
        copies += [Launch("copy", [slot_of(a) for a in L.args], nbytes=L.nbytes)
                   for L in dk.launches[:len(dk.launches) - len(ks)]]
        scratch += dk.scratch
        consts += dk.consts
    texts, kernels = [], []
    for p in range(max(len(ks) for _, ks, _ in per)):
        members = [_member(dk, ks[p], slot_of) for dk, ks, slot_of in per if p < len(ks)]
        if any(m is None for m in members):
            return None
        got = _fuse_phase(members, caps, kc, f"{_MODULE}_{p}" if p else _MODULE)
        if got is None:
            return None
        texts.append(got[0])
        kernels.append(got[1])
    return "\n".join(texts), copies + kernels, scratch, consts


def _fuse_phase(members: list[_Member], caps, kc: ir.Context, module: str):
    """One fused kernel (gpu.module ``module``) of ``members``: (text, launch), or None."""
    B = _shape(members, caps)
    if B is None:
        return None
    wg = _pool_workgroup(members, caps, kc)
    if wg is None:
        return None
    params: list = []                     # (slot, type, attributes)
    index: dict = {}
    for m in members:
        m.param_ix = []
        for j, s in enumerate(m.slots):
            key = (s, *_param_text(m.func, j))
            if key not in index:
                index[key] = len(params)
                params.append(key)
            m.param_ix.append(index[key])
    most = getattr(caps, "max_kernel_buffers", None)
    if most is not None and len(params) > most:
        return None                       # past the target's bindings: a new group
    with kc, ir.Location.unknown():
        mod = ir.Module.parse(_scaffold(members, B, params, wg, module))
        gm = mod.body.operations[0].operation
        f = gm.regions[0].blocks[0].operations[0].operation
        args = list(f.regions[0].blocks[0].arguments)
        markers = {ir.IntegerAttr(o.attributes["member"]).value: o
                   for o in _ops_under(f) if o.name == "hfuse.member"}
        for i, m in enumerate(members):
            _move_body(m, markers[i], [args[k] for k in m.param_ix])
            markers[i].erase()
        try:
            mod.operation.verify()
        except ir.MLIRError:
            return None
        text = str(gm)
    total = sum(m.blocks for m in members)
    return text, Launch("kernel", [s for s, _, _ in params], module, _KERNEL, (total, 1, 1),
                        (B, 1, 1), strategy="horizontal")


def horizontal_kernels(fn: ir.Operation, caps, synthesize):
    """Strategy ``horizontal``'s kernels: the fused kernel of a merged function (see the module
    doc) as ``(gpu.module text, launches, scratch, consts)`` (the fields of a
    :class:`~poot.backends.gpu.strategies.emit.Synthesized`); None for any other function or
    when its members cannot share one kernel. ``synthesize(fn, caps, kctx)`` synthesizes one
    member (:func:`poot.backends.gpu.strategies.synthesize`, which lists this strategy)."""
    with fn.context, ir.Location.unknown():
        scratch = ir.Module.create()
    _KEEP.append(scratch)
    parts = split_members(fn, scratch.body)
    if parts is None:
        return None
    kc = ir.Context()
    kc.allow_unregistered_dialects = True
    todo = []
    for mfn, args, first in parts:
        dk = synthesize(mfn, caps, kc)
        if kernel_launches(dk) is None:
            return None
        slot_map = {("arg", k): ("arg", a) for k, a in enumerate(args)}
        slot_map.update({("out", j): ("out", first + j) for j in range(len(dk.out_types))})
        todo.append((dk, slot_map))
    got = fuse_kernels(todo, caps, kc)
    if got is None:
        return None
    return got


# ---- planning: group the step's calls --------------------------------------------------------

def _copy_sources(call: ir.Operation, dk: DispatchKernels) -> list:
    """The operands a call's leading copies read (a state written in place by its kernel)."""
    return [call.operands[L.args[0][1]] for L in dk.launches if L.kind == "copy"]


def fuse_siblings(g, kernels_of) -> int:
    """Merge groups of independent single-launch calls of graph ``g``'s step function (see
    the module doc); ``kernels_of(fn)`` is the plan's (memoized) synthesis of a dispatch
    function. Returns how many calls were merged away."""
    if not enabled():
        return 0
    module_body = g.module.body
    funcs = {_name(o.operation): o.operation for o in module_body.operations
             if o.operation.name == "func.func"}
    block = g.func.regions[0].blocks[0]
    with g.module.context, ir.Location.unknown():
        scratch = ir.Module.create()
    g._horizontal_scratch = scratch
    state = {"calls": [], "fn": None, "produced": set(), "reads": [], "states": [],
             "n": 0, "saved": 0}

    def flush():
        calls, fn = state["calls"], state["fn"]
        if len(calls) > 1:
            _replace(calls, fn, module_body, funcs)
            state["saved"] += len(calls) - 1
        state.update(calls=[], fn=None, produced=set(), reads=[], states=[])

    for op in [o.operation for o in block.operations]:
        if op.name != "func.call":
            continue
        if any(v in state["produced"] for v in op.operands):
            flush()                      # it reads a member's result: the group ends here
        dk = kernels_of(funcs[_callee(op)])
        if kernel_launches(dk) is None:
            continue                     # stays; the group's members may move past it
        mine = _copy_sources(op, dk)
        if state["calls"] and (any(v in state["reads"] for v in mine) or
                               any(v in state["states"] for v in op.operands)):
            flush()                      # a state written in place that another member reads
        fn = None
        if state["calls"]:
            state["n"] += 1
            fn = merged_function(state["calls"] + [op], funcs,
                                 f"{_callee(state['calls'][0])}_h{state['n']}", scratch.body)
            got = kernel_launches(kernels_of(fn[0]))
            if got is None or any(L.strategy != "horizontal" for L in got):
                flush()                  # they cannot share one kernel: start a new group
                fn = None
        state["calls"].append(op)
        state["fn"] = fn
        state["produced"].update(op.results)
        state["reads"] += list(op.operands)
        state["states"] += mine
    flush()
    # functions no call uses any more leave the step's module
    called = {_callee(o.operation) for o in block.operations
              if o.operation.name == "func.call"}
    for name, fn in list(funcs.items()):
        if name not in called and fn != g.func and DISPATCH_ATTR in fn.attributes:
            fn.detach_from_parent()
            ir.InsertionPoint(scratch.body).insert(fn)
    return state["saved"]


def _replace(calls: list, built: tuple, module_body: ir.Block, funcs: dict) -> None:
    """Put the merged function ``built`` = (function, operands) in the module and one call of
    it where the group's last call was; the members' calls go."""
    fn, operands = built
    fn.detach_from_parent()
    ir.InsertionPoint(module_body).insert(fn)
    funcs[_name(fn)] = fn
    last = calls[-1]
    with last.context, last.location:
        nc = ir.Operation.create(
            "func.call", results=[r.type for c in calls for r in c.results], operands=operands,
            attributes={"callee": ir.FlatSymbolRefAttr.get(_name(fn))},
            ip=ir.InsertionPoint(last))
    k = 0
    for c in calls:
        for r in c.results:
            r.replace_all_uses_with(nc.results[k])
            k += 1
    for c in calls:
        c.erase()


__all__ = ["ENV", "MAX_GRID_X", "enabled", "fuse_kernels", "fuse_siblings",
           "horizontal_kernels", "kernel_launches", "merged_function", "single_launch",
           "split_members"]
