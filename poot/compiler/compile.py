"""``compile(graph, target, options) -> Program``: the one compiler entry.

Every model and every backend takes this path:

1. optimization on the poot dialect: ``poot-canonicalize``, ``poot-cse``, ``poot-dce``, the
   flash-attention rewrite and RoPE fusion (when registered);
2. legalization for the target (``poot-legalize``: f32 compute for dtypes it lacks, f32
   storage for 16-bit floats it cannot store);
3. planning: every op is checked against the target's capabilities (a typed
   :class:`~poot.compiler.planning.Refusal` names the op and what is missing) and the step's
   storage is planned (in-place KV writes become aliases);
4. dispatch-region formation (``poot-fuse-dispatch``), one region = one kernel;
5. the backend's code generation (CPU: linalg -> LLVM, run by the ExecutionEngine).

Each pass's output is checked against :class:`~poot.compiler.options.CompileLimits` before the
next runs (a :class:`CompileError` names the pass, the limit and the count).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from poot.backends.registry import BACKENDS
from poot.lazy import lazy_module
ir = lazy_module("mlir.ir")

from poot.compiler.options import CompileOptions
from poot.compiler.planning import (Buffer, Refusal, check_module, plan_storage, storage_type,
                                    target_for_options)
from poot.compiler.target import Target
from poot.dialects.types import PackedType, type_from_mlir
from poot.errors import LimitExceeded, PootError
from poot.graph.builder import Graph
from poot.passes.analysis import dispatch_count, dispatch_report
from poot.passes.registry import PASSES, PassFailure, load_all_passes, run_verified
from poot.progress import Tracker


class CompileError(PootError):
    """A compile that cannot finish: a pass failed or the graph outgrew a limit."""


class CompileLimitExceeded(CompileError, LimitExceeded):
    """A pass produced more than :class:`CompileLimits` allows; nothing further was built."""

    def __init__(self, resource: str, limit: int, attempted: int, where: str):
        LimitExceeded.__init__(self, resource, limit, attempted, where=where)


@dataclass
class Program:
    """A compiled step.

    Attributes:
        graph: the step's interface (inputs, outputs, params) and its optimized poot module.
        target: what it was compiled for.
        ir_text: the optimized poot-dialect module text (dispatch regions outlined).
        dispatches: per-kind dispatch-region counts after fusion (``dispatch_report``).
        dispatches_before: dispatch count before fusion (one kernel per primitive op).
        storage: buffers of the step (inputs, params, outputs; outputs that alias inputs).
        numerics: accumulation types and the tolerance the target promises vs the oracle.
        pass_seconds: wall time per pipeline stage.
        executable: the backend's runnable artifact (CPU: a ``CpuProgram``).
    """

    graph: Graph
    target: Target
    ir_text: str
    dispatches: dict[str, int]
    dispatches_before: int
    storage: list[Buffer]
    numerics: dict[str, object]
    pass_seconds: dict[str, float] = field(default_factory=dict)
    executable: object = None

    @property
    def dispatch_count(self) -> int:
        return sum(self.dispatches.values())

    def run(self, inputs, params=None):
        """Run the compiled step once (outputs by name); see the executor for replay."""
        return self.executable.run(inputs, params or {})


def _op_count(module: ir.Module) -> int:
    n = [0]

    def visit(op):
        n[0] += op.operation.name.startswith("poot.")
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return n[0]


def _clone(graph: Graph) -> Graph:
    """A copy of the graph's module (same context) that the pipeline may rewrite."""
    with graph.context, ir.Location.unknown():
        module = ir.Module.create()
        for op in graph.module.body.operations:
            op.operation.clone(ip=ir.InsertionPoint(module.body))
    return Graph(module, graph.name, list(graph.inputs), list(graph.outputs),
                 dict(graph.params))


def _optimization_pipeline(options: CompileOptions) -> list[str]:
    stages = ["poot-canonicalize", "poot-cse", "poot-dce"]
    if options.flash_attention:
        stages += ["poot-rope-fusion", "poot-flash-attention"]
    return [s for s in stages if s in PASSES and s not in options.disable]


def _run_pass(name: str, module: ir.Module, opts: dict, options: CompileOptions,
              seconds: dict[str, float]) -> None:
    t0 = time.perf_counter()
    try:
        run_verified(PASSES[name], module.operation, opts)
    except PassFailure as e:
        raise CompileError(f"pass {name} failed: {e}") from None
    seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - t0
    n = _op_count(module)
    if n > options.limits.max_graph_ops:
        raise CompileLimitExceeded("graph_ops", options.limits.max_graph_ops, n,
                                   where=f"output of {name}")


def compile(graph: Graph, target: Target, options: CompileOptions | None = None,
            progress=None) -> Program:
    """Compile a traced step for ``target``.

    ``progress``: a :mod:`poot.progress` callback ``(stage, done, total)`` or a
    :class:`~poot.progress.Tracker` (whose count goes on); one unit per pass, planning, and
    the code generator's own units (per dispatch region, per kernel, LLVM JIT, ...).

    Raises :class:`NoCodeGenerator` (before any pass runs) when this build cannot generate
    code for the target's backend, :class:`Refusal` when the target cannot run an op (naming
    it and the missing capability), :class:`CompileLimitExceeded` when a pass outgrows a
    limit, and :class:`CompileError` when a pass fails.
    """
    options = options or CompileOptions()
    target = target_for_options(target, options)
    require_code_generator(target)
    track = Tracker.of(progress)
    load_all_passes()
    pipeline = _optimization_pipeline(options)
    track.add(len(pipeline) + 3)      # the passes, poot-legalize, planning, poot-fuse-dispatch
    n = _op_count(graph.module)
    if n > options.limits.max_graph_ops:
        raise CompileLimitExceeded("graph_ops", options.limits.max_graph_ops, n, where="input")
    g = _clone(graph)
    seconds: dict[str, float] = {}
    with g.context, ir.Location.unknown():
        for name in pipeline:
            track(f"pass {name}")
            _run_pass(name, g.module, {}, options, seconds)
        compute = ",".join(sorted(d.value for d in target.caps.compute_dtypes))
        stored = ",".join(sorted(d.value for d in target.caps.storage_dtypes))
        repack: dict[str, str] = {}
        if "poot-legalize" not in options.disable:
            track("pass poot-legalize")
            layouts = ",".join(sorted(target.caps.packed_layouts))
            _run_pass("poot-legalize", g.module,
                      {"compute": compute, "storage": stored, "layouts": layouts},
                      options, seconds)
            caps = target.caps          # the interface follows the widened step function
            g.inputs = [(n, type_from_mlir(a.type)) for (n, _), a in
                        zip(g.inputs, g.func.regions[0].blocks[0].arguments)]
            g.outputs = [(n, type_from_mlir(t)) for (n, _), t in
                         zip(g.outputs, ir.FunctionType(ir.TypeAttr(
                             g.func.attributes["function_type"]).value).results)]
            declared = g.params
            g.params = {n: storage_type(t, caps) for n, t in g.params.items()}
            # weights stored in another layout than the file's: their file format
            repack = {n: t.format.name for n, t in declared.items()
                      if isinstance(t, PackedType) and g.params[n] != t}
        track("planning")
        check_module(g.module.operation, target)
        storage = plan_storage(g.func, g.inputs, g.outputs, g.params)
        before = dispatch_count(g.module.operation)
        if options.fuse and "poot-fuse-dispatch" not in options.disable:
            track("pass poot-fuse-dispatch")
            _run_pass("poot-fuse-dispatch", g.module,
                      {"max-region-ops": min(256, options.limits.max_kernel_ops)}, options, seconds)
        report = dispatch_report(g.module.operation)
        text = str(g.module)
    if len(text) > options.limits.max_artifact_bytes:
        raise CompileLimitExceeded("artifact_bytes", options.limits.max_artifact_bytes,
                                   len(text), where="optimized module")
    program = Program(g, target, text, report, before, storage,
                      {"matmul_accumulation": "f32", "reduction_accumulation": "f32",
                       "tolerance_vs_oracle": {"f32": 1e-4, "f16": 1e-2, "bf16": 2e-2}},
                      seconds)
    t0 = time.perf_counter()
    program.executable = _codegen(program, options, track)
    if repack:          # the executable's run() takes the files' bytes and repacks these
        program.executable.repack = repack
    seconds["codegen"] = time.perf_counter() - t0
    return program


class NoCodeGenerator(Refusal):
    """This build has no code generator for the target's backend (refused before tracing
    or compiling anything)."""

    def __init__(self, backend: str):
        Refusal.__init__(self, "builtin.module",
                         f"a code generator for backend '{backend}' in this build")
        built = ", ".join(sorted(_code_generators()))
        self.args = (f"this build has no code generator for backend '{backend}' (it has: "
                     f"{built}); nothing was compiled",)
        self.backend = backend


def require_code_generator(target: Target) -> None:
    """Raise :class:`NoCodeGenerator` unless this build can generate code for ``target``'s
    backend. Needs no MLIR and compiles nothing: callers check it before tracing."""
    if target.backend not in _code_generators():
        raise NoCodeGenerator(target.backend)


def _code_generators() -> dict[str, str]:
    """The code generator of each backend this build has (:mod:`poot.backends.registry`):
    ``module:function`` taking ``(program, options, progress)``. A backend without one
    (``rocm``) is refused by :func:`require_code_generator` before anything is traced or
    compiled."""
    return {b.name: b.codegen for b in BACKENDS.values() if b.codegen}


def _codegen(program: Program, options: CompileOptions, progress=None):
    """The backend's code generator: the one place that depends on the backend. It gets the
    whole program (graph, target, the storage planned before fusion) and the progress
    tracker."""
    import importlib

    from poot.dialects.lowering import LoweringRefusal  # lazy: MLIR

    backend = program.target.backend
    require_code_generator(program.target)
    module, name = _code_generators()[backend].split(":")
    codegen = getattr(importlib.import_module(module), name)
    try:
        return codegen(program, options, progress)
    except LoweringRefusal as r:
        raise Refusal(r.op, r.capability, r.location) from None
