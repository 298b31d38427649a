"""Pipeline partition: one traced step cut into N stages that run on N devices in order.

Pipeline parallelism (docs/architecture.md): a layer pipeline across devices, each stage
captured into its own CUDA graph on its own device, the activations that cross a stage
boundary copied peer to peer. This is the compiler half: it rewrites one step's
``func.func`` into N stage functions, each an ordinary step graph that :func:`compile` takes
for its own device (:func:`compile_pipeline`: a :class:`PipelineProgram`); the runtime half
(:mod:`poot.runtime.pipeline_parallel`) runs them and moves the boundary values.

The cut fires on the graph's dataflow, not on names:

* **weights** are the ``poot.param`` / ``poot.packed_param`` ops of rank >= 2 (matrices, packed
  blocks). They never cross a boundary: each stage declares the weights its ops read (a tied
  embedding read by the first and the last stage is bound on both devices).
* **replicable** values are computed from step inputs, constants and rank <= 1 params only
  (positions -> RoPE tables, block-table arithmetic, masks, norm scales, a LoRA slot mask):
  cheap, so each stage that needs one computes its own copy instead of receiving it.
* every other op is **staged**. Staged ops keep their trace order; a cut at position ``p``
  puts staged ops ``[.., p)`` before it and ``[p, ..)`` after it, and its *crossing* is the
  set of staged values defined before ``p`` and read after it. Cut points are the positions
  where as few values cross as anywhere, of at most twice the fewest bytes: in a decoder the
  residual stream between two blocks (or between a block's attention and its MLP), one
  ``[B, T, D]`` tensor (f32, or the bf16 embedding before the first block).
* among the cut points, cut ``k`` of ``N - 1`` is the one whose preceding cost is closest
  to ``k / N`` of the total. An op's cost is the weight bytes it reads each step (a gather
  reads the rows it gathers, so a tied embedding counts where the LM head reads it), or a
  caller's per-op cost (measured kernel time).

Each crossing value becomes an output of the stage that defines it and an input of every
later stage that reads it, named ``pipeline.v{i}`` (``i``: the defining op's position in the
traced function); the copy between them is point to point. Carried state (an input that is
also an output under the same name: a KV pool) must be read and written by one stage only.

Refused (:class:`PipelineRefusal`, before anything is compiled): fewer cut points than
``N - 1``; carried state that two stages would read (a gather across stages); an op with
regions (the partition runs on the primitive graph, before dispatch regions exist).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from poot.lazy import lazy_module
ir = lazy_module("mlir.ir")
func = lazy_module("mlir.dialects.func")

from poot.compiler.planning import Refusal
from poot.dialects.types import PackedType, type_from_mlir
from poot.graph.builder import Graph, _name_attrs

#: the name prefix of values that cross a stage boundary
BOUNDARY_PREFIX = "pipeline.v"
_WEIGHT_OPS = ("poot.param", "poot.packed_param")


class PipelineRefusal(Refusal):
    """A step the layer pipeline cannot run in ``stages`` stages; ``reason`` says why."""

    def __init__(self, stages: int, reason: str, op: str = "pipeline"):
        self.stages, self.reason = stages, reason
        Refusal.__init__(self, op, reason)
        self.args = (f"cannot split the step into {stages} pipeline stages: {reason}",)

    def __str__(self) -> str:
        return self.args[0]


@dataclass(frozen=True)
class Boundary:
    """A value copied between stages: ``name`` (``pipeline.v{i}``), its type, the stage that
    defines it and the later stages that read it."""

    name: str
    type: object
    src: int
    dst: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return self.type.nbytes


@dataclass
class Stage:
    """One stage: its step graph (inputs: the step inputs it reads, then the boundaries it
    receives; outputs: the step outputs it defines, then the boundaries it sends), the
    bytes of the weights it binds, and the names of those weights."""

    index: int
    graph: Graph
    weight_bytes: int
    weights: tuple[str, ...]
    receives: tuple[str, ...] = ()
    sends: tuple[str, ...] = ()


@dataclass
class Partition:
    """A step cut into stages (see the module doc). ``graph``: the step as traced;
    ``cuts``: the staged-op positions cut at; ``boundaries`` by name."""

    graph: Graph
    stages: list[Stage]
    boundaries: dict[str, Boundary] = field(default_factory=dict)
    cuts: tuple[int, ...] = ()

    def describe(self) -> dict:
        """Stage sizes for reports: weight bytes, op counts, bytes sent a step."""
        return {"stages": [{"weight_bytes": s.weight_bytes, "ops": s.graph.op_count(),
                            "weights": len(s.weights),
                            "sends_bytes": sum(self.boundaries[b].nbytes for b in s.sends)}
                           for s in self.stages]}


def _is_weight(op) -> bool:
    if op.name not in _WEIGHT_OPS:
        return False
    t = type_from_mlir(op.results[0].type)
    return isinstance(t, PackedType) or len(t.shape) >= 2


@dataclass
class _Ops:
    """The traced step's ops classified (module doc): ``kind[i]`` is ``weight``,
    ``replicable`` or ``staged``; ``staged`` the staged positions in trace order; values by
    identity (hashable ``ir.Value``)."""

    graph: Graph
    ops: list
    ret: object
    arg_index: dict
    def_of: dict = field(default_factory=dict)      # value -> op position in ops
    kind: list = field(default_factory=list)
    staged: list = field(default_factory=list)

    def staged_def(self, v) -> int | None:
        """The position of the staged op defining ``v``; None for anything else."""
        j = self.def_of.get(v)
        return j if j is not None and self.kind[j] == "staged" else None


def partition(graph: Graph, stages: int,
              cost: Callable[[int, object], float] | None = None,
              placement: Mapping[str, int] | None = None) -> Partition:
    """Cut ``graph`` into ``stages`` stage graphs (module doc).

    Args:
        graph: a traced step (primitive poot ops, no regions).
        stages: N >= 1. One stage returns the step unchanged as its only stage.
        cost: ``(staged position, op) -> cost`` to balance by instead of the bytes of the
            weights each staged op reads (e.g. measured kernel microseconds).
        placement: carried input name -> stage, from another step of the same model
            (:func:`state_placement`): cut ``k`` then falls after every reader of a state
            placed before stage ``k`` and before every reader of one placed at or after it,
            so every step keeps each KV pool on one device (a prefill without the LM head
            would otherwise balance differently from the decode step).

    Returns a :class:`Partition`; raises :class:`PipelineRefusal` (module doc).
    """
    if not isinstance(stages, int) or isinstance(stages, bool) or stages < 1:
        raise PipelineRefusal(stages, "the stage count must be a positive integer")
    c = _classify(graph, stages)
    if stages == 1:
        names = tuple(sorted(graph.params))
        return Partition(graph, [Stage(0, graph, sum(t.nbytes for t in graph.params.values()),
                                       names)])
    if len(c.staged) < 2:
        raise PipelineRefusal(stages, f"the {graph.name} step can be cut into at most 1 "
                              "stage (it has no place to cut)")
    op_cost = _op_costs(c, cost)
    crossing, count, readers = _crossings(c)
    points = _cut_points(c, crossing, count, stages, readers)
    lo, hi = _windows(readers, placement, stages, len(c.staged))
    cuts = _choose_cuts(points, op_cost, lo, hi, stages)
    bounds = [0, *cuts, len(c.staged)]
    stage_of = {i: s for s in range(stages) for i in c.staged[bounds[s]:bounds[s + 1]]}
    _check_carried_state(c, readers, stage_of, stages)
    bnd, boundaries = _boundaries(c, stage_of)
    vname = {v: f"{BOUNDARY_PREFIX}{c.def_of[v]}" for v in bnd}
    result = []
    for s in range(stages):
        mine = [i for i in c.staged if stage_of[i] == s]
        outs = [(n, v) for (n, _), v in zip(graph.outputs, c.ret.operands)
                if (c.staged_def(v) is not None and stage_of[c.def_of[v]] == s)
                or (s == stages - 1 and c.staged_def(v) is None)]
        sends = [v for v in bnd if stage_of[c.def_of[v]] == s]
        result.append(_stage_graph(graph, s, c.ops, c.kind, c.def_of, c.arg_index, mine,
                                   outs, sends, vname, stage_of))
    return Partition(graph, result, boundaries, tuple(c.staged[k] for k in cuts))


def _classify(graph: Graph, stages: int) -> _Ops:
    """Each op of the step as weight / replicable / staged; :class:`PipelineRefusal` for an
    op with regions."""
    block = graph.func.regions[0].blocks[0]
    ops = [op.operation for op in block.operations]
    c = _Ops(graph, ops[:-1], ops[-1], {a: i for i, a in enumerate(block.arguments)})
    for i, op in enumerate(c.ops):
        if len(op.regions):
            raise PipelineRefusal(stages, f"'{op.name}' has regions (partition the step "
                                  "before dispatch regions are formed)", op.name)
        for r in op.results:
            c.def_of[r] = i
        if _is_weight(op):
            c.kind.append("weight")
        elif all(o in c.arg_index or c.kind[c.def_of[o]] == "replicable"
                 for o in op.operands):
            c.kind.append("replicable")
        else:
            c.kind.append("staged")
    c.staged = [i for i, k in enumerate(c.kind) if k == "staged"]
    return c


def _op_costs(c: _Ops, cost) -> list[float]:
    """The cost of each staged op: ``cost(position, op)`` when given, else the weight bytes
    it reads (the weights reached through its replicable / weight operands: a transpose, a
    dequantize); a gather reads its rows."""
    def reach(i: int, out: set[int], memo: set[int]) -> None:
        for o in c.ops[i].operands:
            j = c.def_of.get(o)
            if j is None or j in memo or c.kind[j] == "staged":
                continue
            memo.add(j)
            if c.kind[j] == "weight":
                out.add(j)
            reach(j, out, memo)

    op_cost = []
    for p, i in enumerate(c.staged):
        if cost is not None:
            op_cost.append(float(cost(p, c.ops[i])))
            continue
        ws: set[int] = set()
        reach(i, ws, set())
        if c.ops[i].name == "poot.gather" and ws:
            op_cost.append(float(type_from_mlir(c.ops[i].results[0].type).nbytes))
        else:
            op_cost.append(float(sum(type_from_mlir(c.ops[j].results[0].type).nbytes
                                     for j in ws)))
    return op_cost


def _crossings(c: _Ops) -> tuple[list[int], list[int], dict[str, list[int]]]:
    """What crosses each cut position p (0..S): the bytes and the count of staged values
    defined before p and read by a staged op at or after p; and, per step input name, the
    staged positions reading it."""
    S = len(c.staged)
    pos = {i: p for p, i in enumerate(c.staged)}
    delta, dcount = [0] * (S + 1), [0] * (S + 1)
    last_use: dict = {}
    readers: dict[str, list[int]] = {}
    for p, i in enumerate(c.staged):
        for o in c.ops[i].operands:
            if c.staged_def(o) is not None:
                last_use[o] = max(last_use.get(o, -1), p)
            elif o in c.arg_index:
                where = readers.setdefault(c.graph.inputs[c.arg_index[o]][0], [])
                if not where or where[-1] != p:
                    where.append(p)
    for v, u in last_use.items():
        d = pos[c.def_of[v]]
        if u > d:
            nb = type_from_mlir(v.type).nbytes
            delta[d + 1] += nb
            delta[u + 1] -= nb
            dcount[d + 1] += 1
            dcount[u + 1] -= 1
    crossing, count, run, runc = [0] * (S + 1), [0] * (S + 1), 0, 0
    for p in range(S + 1):
        run += delta[p]
        runc += dcount[p]
        crossing[p], count[p] = run, runc
    return crossing, count, readers


def _cut_points(c: _Ops, crossing, count, stages: int, readers=None) -> list[int]:
    """Positions where as few values cross as anywhere, of at most twice the fewest bytes
    among the positions up to the last reader of carried state (the residual stream after
    any block, f32, as well as the bf16 embedding before the first; not a tail that keeps
    fewer rows, such as a ragged step's logit rows before its head);
    :class:`PipelineRefusal` when there are fewer than ``stages - 1``."""
    interior = range(1, len(c.staged))
    fewest = min(count[p] for p in interior)
    carried = {n for n, _ in c.graph.outputs} & set(readers or ())
    last = max((max(readers[n]) for n in carried if readers[n]), default=len(c.staged))
    least = [p for p in interior if count[p] == fewest]
    floor = min(crossing[p] for p in ([p for p in least if p <= last + 1] or least))
    points = [p for p in interior if count[p] == fewest and crossing[p] <= 2 * floor]
    if len(points) < stages - 1:
        raise PipelineRefusal(stages, f"the {c.graph.name} step can be cut into at most "
                              f"{len(points) + 1} stages (it has {len(points)} places where "
                              f"only {fewest} value(s) of at most {2 * floor} bytes cross, "
                              "such as the residual stream between two blocks)")
    return points


def _windows(readers, placement, stages: int, S: int) -> tuple[list[int], list[int]]:
    """The window ``[lo[k], hi[k]]`` cut ``k`` must fall in: after the readers of states
    placed before it, before the readers of states placed at or after it."""
    lo, hi = [1] * stages, [S - 1] * stages
    for name, where in readers.items() if placement else ():
        if name not in placement:
            continue
        st = placement[name]
        if not 0 <= st < stages:
            raise PipelineRefusal(stages, f"carried state '{name}' is placed on stage {st}")
        for k in range(1, stages):
            if where and st < k:
                lo[k] = max(lo[k], max(where) + 1)
            elif where:
                hi[k] = min(hi[k], min(where))
    return lo, hi


def _choose_cuts(points, op_cost, lo, hi, stages: int) -> list[int]:
    """Cut ``k`` of ``stages - 1``: the point whose preceding cost is closest to ``k /
    stages`` of the total, inside its window, after the previous cut, leaving room for the
    cuts to come."""
    prefix = [0.0]
    for c in op_cost:
        prefix.append(prefix[-1] + c)
    cuts: list[int] = []
    prev = 0
    for k in range(1, stages):
        want = prefix[-1] * k / stages
        later = stages - 1 - k
        choices = [p for p in points if max(lo[k], prev + 1) <= p <= hi[k]
                   and sum(1 for q in points if q > p) >= later]
        if not choices:
            raise PipelineRefusal(stages, f"no cut point for stage {k} keeps every carried "
                                  "state on the stage it has in the other steps")
        prev = min(choices, key=lambda p: abs(prefix[p] - want))
        cuts.append(prev)
    return cuts


def _check_carried_state(c: _Ops, readers, stage_of, stages: int) -> None:
    """:class:`PipelineRefusal` when carried state would be read by two stages."""
    out_names = {n for n, _ in c.graph.outputs}
    for name, where in readers.items():
        read_by = sorted({stage_of[c.staged[p]] for p in where})
        if name in out_names and len(read_by) > 1:
            raise PipelineRefusal(stages, f"carried state '{name}' would be read by stages "
                                  f"{read_by} (a gather across stages)")


def _boundaries(c: _Ops, stage_of) -> tuple[dict, dict[str, Boundary]]:
    """Staged values read by a later stage: value -> the reading stages, and the
    :class:`Boundary` of each by name."""
    bnd: dict = {}
    for i in c.staged:
        s = stage_of[i]
        for o in c.ops[i].operands:
            j = c.staged_def(o)
            if j is not None and stage_of[j] != s:
                bnd.setdefault(o, set()).add(s)
    boundaries = {}
    for v, dst in bnd.items():
        j = c.def_of[v]
        name = f"{BOUNDARY_PREFIX}{j}"
        boundaries[name] = Boundary(name, type_from_mlir(v.type), stage_of[j],
                                    tuple(sorted(dst)))
    return bnd, boundaries


def _stage_graph(graph: Graph, s: int, ops, kind, def_of, arg_index, mine: Sequence[int],
                 outs, sends, vname, stage_of) -> Stage:
    """Build stage ``s``'s function: its staged ops, the replicable ops and weights they
    read (each stage its own copy), boundary values as extra inputs and outputs."""
    need: set[int] = set(mine)
    receives: list = []
    args_used: set = set()

    def close(v) -> None:
        if v in arg_index:
            args_used.add(v)
            return
        j = def_of[v]
        if kind[j] == "staged" and stage_of[j] != s:
            if v not in receives:
                receives.append(v)
            return
        if j in need:
            return
        need.add(j)
        for o in ops[j].operands:
            close(o)

    for i in list(mine):
        for o in ops[i].operands:
            close(o)
    for _, v in outs:
        close(v)
    order = sorted(need)
    in_args = [a for a in arg_index if a in args_used]
    receives.sort(key=lambda v: def_of[v])
    with graph.context, ir.Location.unknown():
        module = ir.Module.create()
        types = ([a.type for a in in_args] + [v.type for v in receives])
        with ir.InsertionPoint(module.body):
            fop = func.FuncOp(f"{graph.name}_stage{s}", ir.FunctionType.get(types, []))
        blk = fop.add_entry_block()
        vmap = dict(zip(in_args + receives, blk.arguments))
        params = {}
        with ir.InsertionPoint(blk):
            for j in order:
                op = ops[j]
                new = ir.Operation.create(
                    op.name, results=[r.type for r in op.results],
                    operands=[vmap[o] for o in op.operands],
                    attributes={k: op.attributes[k] for k in op.attributes}, loc=op.location)
                for r, nr in zip(op.results, new.results):
                    vmap[r] = nr
                if op.name in _WEIGHT_OPS:
                    pname = ir.StringAttr(op.attributes["name"]).value
                    params[pname] = graph.params[pname]
            results = [vmap[v] for _, v in outs] + [vmap[v] for v in sends]
            func.ReturnOp(results)
        in_names = [graph.inputs[arg_index[a]][0] for a in in_args] + \
            [vname[v] for v in receives]
        out_names = [n for n, _ in outs] + [vname[v] for v in sends]
        f = fop.operation
        f.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(
            types, [v.type for v in results]))
        f.attributes["arg_attrs"] = _name_attrs(in_names)
        f.attributes["res_attrs"] = _name_attrs(out_names)
    g = Graph.from_module(module)
    return Stage(s, g, sum(t.nbytes for t in params.values()), tuple(sorted(params)),
                 tuple(vname[v] for v in receives), tuple(vname[v] for v in sends))


def state_placement(part: Partition) -> dict[str, int]:
    """Carried input name (an input that is also an output: a KV pool) -> its stage in
    ``part``: what :func:`partition` takes as ``placement`` for the model's other steps."""
    out_names = {n for n, _ in part.graph.outputs}
    return {n: s.index for s in part.stages for n, _ in s.graph.inputs if n in out_names}


@dataclass
class PipelineProgram:
    """A step compiled as N stages (stage ``s`` runs on device ``s``:
    :class:`poot.runtime.pipeline_parallel.PipelineDevice`).

    Attributes:
        stages: each stage's compiled program (``executable`` + ``storage``), in order.
        storage: the step's buffers as one program's (stage storage merged, boundary values
            left out: :func:`merged_storage`): the engine reads the carried aliases from it.
        boundaries: boundary name -> (sending stage, receiving stages).
        weight_bytes: bytes of the weights each stage binds.
    """

    stages: list
    storage: list
    boundaries: dict[str, tuple[int, tuple[int, ...]]]
    weight_bytes: list[int] = field(default_factory=list)
    #: the compile cache's index key of the whole pipeline (None: not cached)
    cache_key: str | None = None

    @property
    def executable(self):
        return self

    @property
    def dispatches(self) -> dict:
        out: dict = {}
        for p in self.stages:
            for k, v in getattr(p, "dispatches", {}).items():
                out[k] = out.get(k, 0) + v
        return out

    def record(self) -> dict:
        """What the compile cache's index keeps besides the stage programs (JSON):
        ``boundaries`` and ``weight_bytes``; :meth:`from_record` reverses it."""
        return {"boundaries": {n: [src, list(dst)] for n, (src, dst)
                               in self.boundaries.items()},
                "weight_bytes": self.weight_bytes}

    @classmethod
    def from_record(cls, stages: list, record: dict) -> "PipelineProgram":
        """The pipeline of ``stages`` (programs, in order) and a :meth:`record`."""
        return cls(stages, merged_storage(stages), {
            n: (int(src), tuple(dst)) for n, (src, dst) in record["boundaries"].items()},
            list(record["weight_bytes"]))


def merged_storage(programs) -> list:
    """The step's buffers from its stage programs' (boundary values left out, each buffer
    once): what :class:`PipelineProgram` keeps as ``storage``."""
    out, seen = [], set()
    for p in programs:
        for b in p.storage:
            if not b.name.startswith(BOUNDARY_PREFIX) and (b.role, b.name) not in seen:
                seen.add((b.role, b.name))
                out.append(b)
    return out


def compile_pipeline(graph: Graph, stages: int, compile_fn: Callable, cost=None,
                     placement=None) -> PipelineProgram:
    """Partition ``graph`` into ``stages`` (:func:`partition`, with ``cost`` and the carried
    states' ``placement``; refusals before anything compiles) and compile each stage with
    ``compile_fn(graph)``."""
    part = partition(graph, stages, cost, placement)
    programs = [compile_fn(s.graph) for s in part.stages]
    return PipelineProgram(programs, merged_storage(programs),
                           {n: (b.src, b.dst) for n, b in part.boundaries.items()},
                           [s.weight_bytes for s in part.stages])


__all__ = ["BOUNDARY_PREFIX", "Boundary", "Partition", "PipelineProgram", "PipelineRefusal",
           "Stage", "compile_pipeline", "merged_storage", "partition", "state_placement"]
