"""Planning: decide, per op, whether the target can run it, and the storage of a step.

Capability is decided here and only here: an op the target cannot run is a typed
:class:`Refusal` naming the op, where it is, and the missing capability. Nothing above this
layer branches on a backend.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from poot.lazy import lazy_module
ir = lazy_module("mlir.ir")

from poot.compiler.target import Target
from poot.dialects.types import DType, PackedType, TensorType, type_from_mlir
from poot.errors import PootError
from poot.passes.legalize import COMPUTE_OPS, stored_type


class Refusal(PootError):
    """The target cannot run an op.

    Attributes:
        op: the op name (``poot.matmul``); capability: what the target lacks (``f16
        storage``); location: the op's location (builder scope), when known.
    """

    def __init__(self, op: str, capability: str, location: str = ""):
        self.op, self.capability, self.location = op, capability, location
        at = f" at {location}" if location and location != "loc(unknown)" else ""
        super().__init__(f"target cannot run '{op}'{at}: missing {capability}")


def _types(op: ir.Operation):
    for v in list(op.operands) + list(op.results):
        try:
            yield type_from_mlir(v.type)
        except TypeError:
            continue


def storage_type(t, caps):
    """The type a value of type ``t`` is stored in on a target with capabilities ``caps``:
    ``t`` itself, or -- for an f16/bf16 tensor on a target without that storage but with f32
    storage (a wgpu adapter: naga has no 16-bit types) -- the same shape in f32, so a bf16
    checkpoint runs there at twice the bytes instead of being refused. The rule is
    ``poot-legalize``'s (:func:`poot.passes.legalize.stored_type`, which widens the graph by
    it); the executor allocates weights by it, so the two always agree. A 2-D Q4_0 / Q4_1 / Q8_0 weight
    on a target listing its row-interleaved layout (``Capabilities.packed_layouts``) is stored
    in that layout, repacked on upload (:func:`poot.dialects.quant_layout.to_stored`)."""
    return stored_type(t, caps.storage_dtypes, caps.packed_layouts)


def target_for_options(target, options):
    """``target`` as a compile with ``options`` uses it: row-interleaved weight layouts
    (``Capabilities.packed_layouts``) serve the integer dot-product kernels, so at precision
    ``exact`` (f32 activations, no integer kernels) weights keep the file's layout. The loader
    stores weights by the target this returns, the compiler compiles for it: the two agree."""
    if target.caps.packed_layouts and getattr(options, "precision", None) == "exact":
        return replace(target, caps=replace(target.caps, packed_layouts=frozenset()))
    return target


def _kv_scales_stored(t: TensorType, caps) -> bool:
    """Whether ``t`` may be a q8_0 KV scales plane the target stores although it stores no
    other f16: a target listing q8_0 in ``Capabilities.kv_formats`` reads and writes the
    scales' f16 bits itself, and ``poot-legalize`` widens every other f16 value
    (:func:`poot.passes.legalize.kv_scale_planes`)."""
    return t.dtype is DType.F16 and "q8_0" in caps.kv_formats


def check_op(op: ir.Operation, target: Target) -> None:
    """Raise :class:`Refusal` when ``target`` lacks what ``op`` needs."""
    caps = target.caps
    loc = str(op.location)
    for t in _types(op):
        if isinstance(t, TensorType) and t.dtype not in caps.storage_dtypes and \
                not _kv_scales_stored(t, caps):
            raise Refusal(op.name, f"{t.dtype} storage", loc)
        if caps.max_buffer_bytes is not None and t.nbytes > caps.max_buffer_bytes:
            raise Refusal(op.name, f"buffers of {t.nbytes} bytes (its largest binds "
                          f"{caps.max_buffer_bytes})", loc)
        if isinstance(t, PackedType) and op.name == "poot.dequantize" and \
                t.format.name not in caps.packed_formats:
            raise Refusal(op.name, f"in-kernel decoding of packed format {t.format.name}", loc)
    for fmt in sorted(kv_formats(op) - caps.kv_formats):
        raise Refusal(op.name, f"an attention kernel reading {fmt} KV pools" if fmt == "q8_0"
                      else "fp8 (e4m3) conversions in hardware (CUDA sm_89 or newer)", loc)
    if op.name in COMPUTE_OPS and op.operands:
        t = type_from_mlir(op.operands[0].type)
        if isinstance(t, TensorType) and t.dtype not in caps.compute_dtypes:
            raise Refusal(op.name, f"{t.dtype} arithmetic", loc)


#: ops that read or write fp8 KV values (:mod:`poot.dialects.kv_quant`)
FP8_OPS = ("poot.quantize_fp8", "poot.dequantize_fp8")


def kv_formats(op: ir.Operation) -> set[str]:
    """The block-quantized KV formats ``op`` reads or writes: ``"q8_0"``/``"fp8"`` per
    scales operand of a ``poot.paged_attention`` (fp8's are f32, q8_0's f16), ``"fp8"`` for
    the fp8 quantize/dequantize ops; empty otherwise."""
    if op.name in FP8_OPS:
        return {"fp8"}
    if op.name != "poot.paged_attention":
        return set()
    return {"fp8" if type_from_mlir(v.type).dtype is DType.F32 else "q8_0"
            for v in list(op.operands)[5:]}


def check_module(module: ir.Operation, target: Target) -> None:
    """Check every poot op under ``module``; the first refusal is raised."""
    refusal: list[Refusal] = []

    def visit(op):
        op = op.operation
        if op.name.startswith("poot."):
            try:
                check_op(op, target)
            except Refusal as r:
                refusal.append(r)
                return ir.WalkResult.INTERRUPT
        return ir.WalkResult.ADVANCE

    module.walk(visit)
    if refusal:
        raise refusal[0]


def kv_block_size(target: Target) -> int:
    """Positions per paged-KV block for ``target``: a GPU's subgroup width (a subgroup reads a
    block's keys with no partial batch), at least 16 (vLLM's default); 32 on the CPU, where
    each block is one step of the attention kernel's loop (fewer, longer blocks amortize it)."""
    sg = target.caps.subgroup_size
    return max(16, sg) if sg else 32


@dataclass(frozen=True)
class Buffer:
    """One buffer of a step: a role (input/param/output), a name, its type and byte size;
    ``aliases`` names the input an output may share storage with (updated in place)."""

    role: str
    name: str
    type: object
    nbytes: int
    aliases: str | None = None


def plan_storage(func: ir.Operation, inputs, outputs, params) -> list[Buffer]:
    """Buffers of the entry function, planned before fusion. An output that is a
    ``poot.scatter`` into an input (a KV-cache write) aliases that input: the runtime may
    update it in place."""
    block = func.regions[0].blocks[0]
    arg_names = {block.arguments[i]: n for i, (n, _) in enumerate(inputs)}
    ret = list(block.operations)[-1]
    out: list[Buffer] = [Buffer("input", n, t, t.nbytes) for n, t in inputs]
    out += [Buffer("param", n, t, t.nbytes) for n, t in params.items()]
    for (name, t), v in zip(outputs, ret.operands):
        out.append(Buffer("output", name, t, t.nbytes, _scatter_base(v, arg_names)))
    return out


def _scatter_base(v: ir.Value, arg_names) -> str | None:
    owner = v.owner
    if isinstance(owner, ir.Block):
        return None
    op = owner.operation
    if op.name == "poot.scatter" and op.operands[0] in arg_names:
        return arg_names[op.operands[0]]
    return None
