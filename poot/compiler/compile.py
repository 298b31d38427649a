"""``compile(graph, target, options) -> Program``: the one compiler entry.

Every model and every backend takes this path:

1. optimization on the poot dialect: ``poot-canonicalize``, ``poot-cse``, ``poot-dce``, the
   flash-attention rewrite and RoPE fusion (when registered);
2. legalization for the target (``poot-legalize``: f32 compute for dtypes it lacks);
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

from poot.lazy import lazy_module
ir = lazy_module("mlir.ir")

from poot.compiler.options import CompileOptions
from poot.compiler.planning import Buffer, Refusal, check_module, plan_storage
from poot.compiler.target import Target
from poot.errors import LimitExceeded, PootError
from poot.graph.builder import Graph
from poot.passes.analysis import dispatch_count, dispatch_report
from poot.passes.registry import PASSES, PassFailure, load_all_passes, run_verified


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


def compile(graph: Graph, target: Target, options: CompileOptions | None = None) -> Program:
    """Compile a traced step for ``target``.

    Raises :class:`Refusal` when the target cannot run an op (naming it and the missing
    capability), :class:`CompileLimitExceeded` when a pass outgrows a limit, and
    :class:`CompileError` when a pass fails.
    """
    options = options or CompileOptions()
    check_codegen(target)
    load_all_passes()
    n = _op_count(graph.module)
    if n > options.limits.max_graph_ops:
        raise CompileLimitExceeded("graph_ops", options.limits.max_graph_ops, n, where="input")
    g = _clone(graph)
    seconds: dict[str, float] = {}
    with g.context, ir.Location.unknown():
        for name in _optimization_pipeline(options):
            _run_pass(name, g.module, {}, options, seconds)
        compute = ",".join(sorted(d.value for d in target.caps.compute_dtypes))
        if "poot-legalize" not in options.disable:
            _run_pass("poot-legalize", g.module, {"compute": compute}, options, seconds)
        check_module(g.module.operation, target)
        storage = plan_storage(g.func, g.inputs, g.outputs, g.params)
        before = dispatch_count(g.module.operation)
        if options.fuse and "poot-fuse-dispatch" not in options.disable:
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
    program.executable = _codegen(program, options)
    seconds["codegen"] = time.perf_counter() - t0
    return program


#: Backends with a code generator in this build.
CODEGEN_BACKENDS = ("cpu", "cuda", "vulkan")


def check_codegen(target: Target) -> None:
    """Raise the :class:`Refusal` of a target whose backend has no code generator in this
    build (before anything is traced or compiled)."""
    if target.backend not in CODEGEN_BACKENDS:
        raise Refusal("builtin.module", f"a code generator for backend '{target.backend}' "
                      f"in this build")


def _codegen(program: Program, options: CompileOptions):
    """The backend's code generator: the one place that depends on the backend. It gets the
    whole program (graph, target, the storage planned before fusion)."""
    from poot.dialects.lowering import LoweringRefusal

    backend = program.target.backend
    try:
        if backend == "cpu":
            from poot.backends.cpu import compile_cpu

            in_place = {b.name: b.aliases for b in program.storage
                        if b.role == "output" and b.aliases}
            return compile_cpu(program.graph, opt_level=options.opt_level, in_place=in_place)
        if backend == "cuda":
            from poot.backends.cuda.codegen import compile_program

            return compile_program(program)
        if backend == "vulkan":
            from poot.backends.vulkan.codegen import compile_program as compile_spirv

            return compile_spirv(program)
    except LoweringRefusal as r:
        raise Refusal(r.op, r.capability, r.location) from None
    raise Refusal("builtin.module", f"a code generator for backend '{backend}' in this build")
