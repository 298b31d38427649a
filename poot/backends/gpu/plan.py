"""The step-level launch plan of a GPU program, shared by every gpu-dialect backend.

:func:`plan_program` walks a compiled :class:`~poot.compiler.Program`'s step function (the
``func.call`` of each outlined dispatch region, in step order), compiles each *distinct*
dispatch body once (:func:`poot.backends.gpu.kernels.build_dispatch`; identical layers share
kernels), and assigns a device buffer to every value: step inputs, weights (by name), outputs,
one buffer per intermediate value, per-dispatch scratch and constants (shared by the calls of
one distinct dispatch, which run one after another).

Before that, :func:`poot.backends.gpu.merge.sink_reshapes` moves the reshapes left between
regions into the regions that consume them (a reshape no region consumes aliases its operand's
buffer), :func:`poot.backends.gpu.merge.fold_regions` folds cheap producer regions (RoPE,
masks, norms) into their consumers wherever the consumer's strategy still synthesizes the
merged body (the step function is rewritten in place); then
:func:`poot.backends.gpu.horizontal.fuse_siblings` merges independent single-launch sibling
calls (the q/k/v GEMVs, the K/V cache writes) into one call whose dispatch is ONE kernel
launch (``POOT_GPU_HORIZONTAL=0`` turns that off).

In-place state: an output that ``Program.storage`` says aliases an input (a KV cache written
by a scatter) reuses that input's buffer when the input's only use is the producing call;
otherwise the output gets its own buffer and the plan ends with a copy back.

The result is a :class:`GpuPlan` whose ``module`` holds every kernel (``gpu.module``s, ready
for a target lowering) and whose JSON-able fields are everything a runtime needs.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field

from mlir import ir

from poot.backends.gpu.kernels import DispatchKernels, GpuCodegenError, build_dispatch
from poot.backends.gpu.horizontal import fuse_siblings
from poot.backends.gpu.merge import body_key, dispatch_kind, fold_regions, sink_reshapes
from poot.backends.gpu.strategies import synthesize
from poot.compiler.planning import Refusal
from poot.dialects.lowering.function import lower_function
from poot.dialects.types import DType, PackedType, TensorType, type_from_mlir
from poot.progress import Tracker


def host_spec(t) -> dict:
    """How a runtime holds a value of poot type ``t``: numpy dtype name, shape, bytes.
    Packed weights are uint8 bytes; bf16/f16 as uint16 words; i1 as one byte."""
    if isinstance(t, PackedType):
        return {"dtype": "uint8", "shape": [t.nbytes], "nbytes": t.nbytes,
                "poot": f"packed:{t.format.name}:{list(t.shape)}"}
    assert isinstance(t, TensorType)
    if t.dtype in (DType.BF16, DType.F16):
        dt = "uint16"
    elif t.dtype == DType.I1:
        dt = "uint8"
    else:
        dt = str(t.dtype.numpy)
    import numpy as np

    n = 1
    for s in t.shape:
        n *= s
    return {"dtype": dt, "shape": list(t.shape), "nbytes": n * np.dtype(dt).itemsize,
            "poot": str(t.dtype.value)}


@dataclass
class GpuPlan:
    """See the module doc. ``buffers[i]``: ``{"role", "name", "nbytes", ...}``; ``launches``:
    ``{"op": "kernel", "kernel", "grid", "block", "args"[, "shared"]}`` (``shared``: bytes of
    dynamic workgroup memory) or ``{"op": "copy", "src", "dst",
    "nbytes"}``; ``dispatches``: per call ``{"callee", "kind", "args", "outs", "first",
    "count"}`` (its launches are ``launches[first:first + count]``)."""

    entry: str
    module: ir.Module
    kernels: list[str]
    buffers: list[dict]
    launches: list[dict]
    dispatches: list[dict]
    inputs: list[dict]
    params: list[dict]
    outputs: list[dict]
    strategies: dict[str, int] = field(default_factory=dict)

    def launch_plan(self) -> dict:
        """The fields every backend's serialized plan shares (``entry``, ``kernels``,
        ``buffers``, ``launches``, ``dispatches``, ``inputs``, ``params``, ``outputs``): JSON
        data a runtime reads without MLIR; a backend adds its ``target`` and own fields."""
        return {"entry": self.entry, "kernels": self.kernels, "buffers": self.buffers,
                "launches": self.launches, "dispatches": self.dispatches,
                "inputs": self.inputs, "params": self.params, "outputs": self.outputs}


def _fn_name(op) -> str:
    return ir.StringAttr(op.attributes["sym_name"]).value


def plan_program(program, caps, strategy: str = "auto", progress=None) -> GpuPlan:
    """Plan ``program`` (a :class:`~poot.compiler.Program`) for a GPU target of ``caps``
    (``strategy``: see :func:`~poot.backends.gpu.kernels.build_dispatch`). ``progress``: a
    :class:`~poot.progress.Tracker`, told once per dispatch region of the step (identical
    regions, e.g. the layers, are built once: the later ones are quick). Raises
    :class:`~poot.backends.gpu.kernels.GpuCodegenError` for a step it cannot plan and
    :class:`~poot.compiler.planning.Refusal` for a kernel binding more buffers than the
    target allows."""
    track = Tracker.of(progress)
    g = program.graph
    track.add(1 + sum(1 for o in g.func.regions[0].blocks[0].operations
                      if o.operation.name == "func.call"))
    track("GPU kernel synthesis")
    planner = _Planner(program, caps, strategy)
    planner.rewrite_regions()
    planner.bind_inputs()
    for op in planner.block.operations:
        op = op.operation
        if op.name in ("poot.param", "poot.packed_param"):
            planner.bind_param(op)
            continue
        if op.name == "func.return":
            break
        if op.name == "poot.reshape":
            # a view left between regions (one no region consumes): its operand's buffer,
            # row-major, the same bytes
            planner.value_buf[op.results[0]] = planner.value_buf[op.operands[0]]
            continue
        if op.name != "func.call":
            raise GpuCodegenError(f"the step function holds '{op.name}' outside any dispatch "
                                  "region")
        track("GPU kernels per dispatch region")
        planner.plan_call(op)
    planner.name_outputs()
    _pin_block_sizes(planner.kmodule, planner.kernels, planner.launches)
    return GpuPlan(g.name, planner.kmodule, planner.kernels, planner.buffers, planner.launches,
                   planner.dispatches, planner.inputs, planner.params, planner.outputs,
                   planner.strategies)


class _Planner:
    """The state of one :func:`plan_program` run and its steps, in the order it calls them:
    :meth:`rewrite_regions` (sink reshapes, fold regions, fuse siblings), :meth:`bind_inputs`,
    then per op of the step :meth:`bind_param` or :meth:`plan_call`, and :meth:`name_outputs`."""

    def __init__(self, program, caps, strategy: str):
        self.program, self.caps, self.strategy = program, caps, strategy
        self.g = g = program.graph
        self.kctx = ir.Context()
        self.kctx.allow_unregistered_dialects = True
        self.known: dict = {}     # body key -> synthesized kernels (None: no strategy takes it)
        self.block = g.func.regions[0].blocks[0]
        with self.kctx, ir.Location.unknown():
            self.kmodule = ir.Module.create()
            self.kmodule.operation.attributes["gpu.container_module"] = ir.UnitAttr.get()
        self.kernels: list[str] = []
        self.compiled: dict[str, tuple[DispatchKernels, dict]] = {}
        self.buffers: list[dict] = []
        self.value_buf: dict = {}
        self.inputs: list[dict] = []
        self.params: list[dict] = []
        self.outputs: list[dict] = []
        self.param_buf: dict[str, int] = {}
        self.launches: list[dict] = []
        self.dispatches: list[dict] = []
        self.strategies: dict[str, int] = {}

    def rewrite_regions(self) -> None:
        """Sink the reshapes between regions, then (unless ``naive``) fold producer regions
        into their consumers and fuse independent siblings, memoizing each body's kernels."""
        g, caps, kctx, known = self.g, self.caps, self.kctx, self.known
        sink_reshapes(g)
        if self.strategy != "naive":
            known.update(fold_regions(g, lambda fn: synthesize(fn, caps, kctx)))

            def kernels_of(fn):
                key = body_key(fn)
                if key not in known:
                    known[key] = synthesize(fn, caps, kctx)
                return known[key]
            fuse_siblings(g, kernels_of)
        self.funcs = {_fn_name(o.operation): o.operation for o in g.module.body.operations
                      if o.operation.name == "func.func"}
        self.block = g.func.regions[0].blocks[0]

    def new_buffer(self, role, name, spec, **extra) -> int:
        """Append a buffer of ``role`` (input, param, value, scratch, const, output); its id."""
        self.buffers.append({"id": len(self.buffers), "role": role, "name": name, **spec,
                             **extra})
        return len(self.buffers) - 1

    def bind_inputs(self) -> None:
        """A buffer per step input; what outputs alias and what the step returns."""
        g, block = self.g, self.block
        for (name, t), arg in zip(g.inputs, block.arguments):
            b = self.new_buffer("input", name, host_spec(t))
            self.value_buf[arg] = b
            self.inputs.append({"name": name, "buffer": b, **host_spec(t)})
        self.aliases = {b.name: b.aliases for b in self.program.storage
                        if b.role == "output" and b.aliases}
        self.ret = list(block.operations)[-1].operation
        self.out_names = [n for n, _ in g.outputs]
        self.returned: dict = {}
        for i, v in enumerate(self.ret.operands):
            self.returned.setdefault(v, []).append(i)
        self.in_arg = {name: arg for (name, _), arg in zip(g.inputs, block.arguments)}

    def bind_param(self, op: ir.Operation) -> None:
        """A buffer per weight (by name; a weight read twice is one buffer)."""
        pname = ir.StringAttr(op.attributes["name"]).value
        if pname not in self.param_buf:
            t = self.g.params[pname]
            self.param_buf[pname] = self.new_buffer("param", pname, host_spec(t))
            self.params.append({"name": pname, "buffer": self.param_buf[pname],
                                **host_spec(t)})
        self.value_buf[op.results[0]] = self.param_buf[pname]

    def dispatch_kernels(self, fn: ir.Operation, callee: str, key: str) -> tuple:
        """The kernels of dispatch ``fn`` (body key ``key``), built once per distinct body:
        a strategy's, else the generic mapping's; with their kernel names, scratch and
        constant buffers."""
        if key not in self.compiled:
            kctx = self.kctx
            dk = self.known[key] if key in self.known else (
                synthesize(fn, self.caps, kctx) if self.strategy != "naive" else None)
            if dk is None:
                with self.g.context, ir.Location.unknown():
                    text = lower_function(fn)
                with kctx, ir.Location.unknown():
                    dk = build_dispatch(text.replace(f"@{callee}(", f"@d_{key}("), self.caps,
                                        kctx, self.strategy)
            with kctx, ir.Location.unknown():
                names = _merge_kernels(dk, self.kmodule, self.kernels, key)
            scratch = [self.new_buffer("scratch", f"d_{key}.scratch{i}",
                                       {"nbytes": nb, "type": t})
                       for i, (t, nb) in enumerate(dk.scratch)]
            consts = [self.new_buffer("const", f"d_{key}.const{i}",
                                      {"nbytes": nb, "type": t,
                                       "data": base64.b64encode(data).decode()})
                      for i, (t, nb, data) in enumerate(dk.consts)]
            self.compiled[key] = (dk, {"kernels": names, "scratch": scratch, "consts": consts})
        return self.compiled[key]

    def result_buffers(self, op: ir.Operation, callee: str) -> list[int]:
        """A buffer per result of call ``op``: the aliased input's own where the output
        aliases a step input used only by this call (state written in place), else a new
        one."""
        out_bufs = []
        for r in op.results:
            b = None
            for i in self.returned.get(r, []):
                inp = self.aliases.get(self.out_names[i])
                if inp is not None and inp in self.in_arg:
                    a = self.in_arg[inp]
                    uses = list(a.uses)
                    if len(uses) == 1 and uses[0].owner == op and a in list(op.operands):
                        b = self.value_buf[a]
            if b is None:
                b = self.new_buffer("value", f"{callee}.out{len(out_bufs)}",
                                    host_spec(type_from_mlir(r.type)))
            self.value_buf[r] = b
            out_bufs.append(b)
        return out_bufs

    def plan_call(self, op: ir.Operation) -> None:
        """The launches of one ``func.call`` of a dispatch region, and its dispatch entry."""
        callee = ir.FlatSymbolRefAttr(op.attributes["callee"]).value
        fn = self.funcs[callee]
        # identical bodies (the layers) share kernels: key on the poot-level body
        key = body_key(fn)
        dk, info = self.dispatch_kernels(fn, callee, key)
        arg_bufs = [self.value_buf[v] for v in op.operands]
        out_bufs = self.result_buffers(op, callee)
        slots = {"arg": arg_bufs, "out": out_bufs, "scratch": info["scratch"],
                 "const": info["consts"]}

        def buf(s):
            k, i = s
            return slots[k][i]
        first = len(self.launches)
        for L in dk.launches:
            if L.kind == "copy":
                if buf(L.args[0]) != buf(L.args[1]):   # else: state updated in place
                    self.launches.append({"op": "copy", "src": buf(L.args[0]),
                                          "dst": buf(L.args[1]), "nbytes": L.nbytes})
                continue
            most = getattr(self.caps, "max_kernel_buffers", None)
            if most is not None and len(L.args) > most:
                raise Refusal(callee, f"kernels binding {len(L.args)} buffers (its kernels "
                              f"bind at most {most})", str(fn.location))
            self.launches.append({"op": "kernel", "kernel": info["kernels"][(L.module, L.kernel)],
                                  "grid": list(L.grid), "block": list(L.block),
                                  "args": [buf(s) for s in L.args], "strategy": L.strategy,
                                  **({"shared": L.shared} if L.shared else {})})
            self.strategies[L.strategy] = self.strategies.get(L.strategy, 0) + 1
        self.dispatches.append({"callee": callee, "kind": dispatch_kind(fn), "key": key,
                                "args": arg_bufs, "outs": out_bufs, "first": first,
                                "count": len(self.launches) - first})

    def name_outputs(self) -> None:
        """Name the step's outputs; copies where a returned value's buffer is not its own;
        which carried outputs are written in place."""
        buffers, aliases = self.buffers, self.aliases
        seen_out: set[int] = set()
        for i, v in enumerate(self.ret.operands):
            name = self.out_names[i]
            b = self.value_buf[v]
            if b in seen_out or buffers[b]["role"] in ("input", "param"):
                if aliases.get(name) and buffers[b]["role"] == "input" and \
                        buffers[b]["name"] == aliases[name]:
                    pass                  # written in place: the input's buffer is the output
                else:
                    nb = self.new_buffer("output", name, {k: buffers[b][k] for k in
                                                          ("dtype", "shape", "nbytes", "poot")})
                    self.launches.append({"op": "copy", "src": b, "dst": nb,
                                          "nbytes": buffers[b]["nbytes"]})
                    b = nb
            elif buffers[b]["role"] == "value":
                buffers[b]["role"], buffers[b]["name"] = "output", name
            seen_out.add(b)
            self.outputs.append({"name": name, "buffer": b, "aliases": aliases.get(name),
                                 **{k: buffers[b][k] for k in ("dtype", "shape", "nbytes",
                                                               "poot")}})
        # carried outputs not written in place: copy back into the input at the end
        for o in self.outputs:
            if o["aliases"]:
                ib = next(x["buffer"] for x in self.inputs if x["name"] == o["aliases"])
                o["in_place"] = ib == o["buffer"]


def _pin_block_sizes(kmodule: ir.Module, kernels: list[str], launches: list[dict]) -> None:
    """Tell each kernel the block size it is launched with (``known_block_size``): the NVVM
    lowering turns it into ``.reqntid``, so ptxas keeps the registers per thread within what
    a block of that size may use (a 1024-thread block over 64 registers per thread cannot
    launch: CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES), and index arithmetic knows its bounds."""
    block = {}
    for L in launches:
        if L["op"] == "kernel":
            if block.setdefault(L["kernel"], tuple(L["block"])) != tuple(L["block"]):
                raise GpuCodegenError(f"kernel {kernels[L['kernel']]} is launched with two "
                                      "block sizes")
    with kmodule.context:
        for gm in kmodule.body.operations:
            if gm.operation.name != "gpu.module":
                continue
            for f in gm.operation.regions[0].blocks[0].operations:
                f = f.operation
                if f.name == "gpu.func":
                    k = kernels.index(_fn_name(f))
                    if k in block:
                        f.attributes["known_block_size"] = ir.DenseI32ArrayAttr.get(
                            list(block[k]))


def _merge_kernels(dk: DispatchKernels, kmodule: ir.Module, kernels: list[str], key: str
                   ) -> dict:
    """Move the dispatch's kernels into the program's one ``gpu.module`` (unique names)."""
    target = None
    for o in kmodule.body.operations:
        if o.operation.name == "gpu.module":
            target = o.operation
    if target is None:
        with ir.InsertionPoint(kmodule.body):
            target = ir.Operation.create("gpu.module", attributes={
                "sym_name": ir.StringAttr.get("poot_kernels")}, regions=1)
            target.regions[0].blocks.append()
    tblock = target.regions[0].blocks[0]
    names = {}
    for o in list(dk.module.body.operations):
        o = o.operation
        if o.name != "gpu.module":
            continue
        mname = _fn_name(o)
        for f in list(o.regions[0].blocks[0].operations):
            f = f.operation
            if f.name != "gpu.func":
                continue
            new = f"k{len(kernels)}_{key[:8]}"
            old = _fn_name(f)
            f.attributes["sym_name"] = ir.StringAttr.get(new)
            f.detach_from_parent()
            ir.InsertionPoint(tblock).insert(f)
            kernels.append(new)
            names[(mname, old)] = len(kernels) - 1
    return names


__all__ = ["GpuPlan", "host_spec", "plan_program"]
