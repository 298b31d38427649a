"""Text emission helpers shared by the lowering rules.

Rules write MLIR in its textual form, one op per line, through an :class:`Emitter` that hands
out fresh SSA names (unique across nested regions, as MLIR requires). The helpers here spell
the recurring shapes: ``tensor.empty``, scalar constants, and ``linalg.generic`` with a body
written by a callback.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from poot.dialects.types import DType, TensorType, bfloat16

HALF = (DType.F16, DType.BF16)


_FLOAT_BITS = {"f64": (np.float64, np.uint64), "f32": (np.float32, np.uint32),
               "f16": (np.float16, np.uint16), "bf16": (None, np.uint16)}   # bf16: bfloat16()


def float_hex(value, type_: str) -> str:
    """A float literal as its exact bit pattern (``0x3F800000``), which MLIR parses for any
    float type, NaN and infinities included."""
    ft, it = _FLOAT_BITS[type_]
    ft = bfloat16() if ft is None else ft
    bits = int(np.array(value, dtype=np.float64).astype(ft).reshape(1).view(it)[0])
    return f"0x{bits:0{2 * np.dtype(it).itemsize}X}"


def storage(d: DType) -> str:
    """The element type a tensor of ``d`` is stored with in the lowered IR: i1 is stored as
    one i8 byte holding 0 or 1 (numpy's bool layout; memrefs and GPU buffers of i1 are not
    portable), everything else as itself. Scalars inside bodies are i1."""
    return "i8" if d is DType.I1 else d.value


def tt(t: TensorType) -> str:
    """The lowered tensor type: ``tensor<4x8xf32>`` (``tensor<f32>`` for rank 0); i1
    tensors are stored as i8 (:func:`storage`)."""
    return f"tensor<{'x'.join([str(d) for d in t.shape] + [storage(t.dtype)])}>"


def compute_type(d: DType) -> str:
    """The scalar type arithmetic on ``d`` is done in: f16/bf16 compute in f32 (the oracle's
    convention, :func:`poot.dialects.opdef.float_compute`)."""
    return "f32" if d in HALF else d.value


def dims(n: int) -> str:
    return ", ".join(f"d{i}" for i in range(n))


def affine_map(n: int, results: Sequence[str]) -> str:
    return f"affine_map<({dims(n)}) -> ({', '.join(results)})>"


def identity_map(n: int) -> str:
    return affine_map(n, [f"d{i}" for i in range(n)])


class Emitter:
    """Collects lines of MLIR text and numbers SSA values."""

    def __init__(self, indent: int = 2):
        self.lines: list[str] = []
        self.count = 0
        self.depth = indent

    def fresh(self, hint: str = "v") -> str:
        self.count += 1
        return f"%{hint}{self.count}"

    def line(self, text: str) -> None:
        self.lines.append("  " * self.depth + text)

    def op(self, text: str, hint: str = "v") -> str:
        """Emit ``%name = text``; return ``%name``."""
        name = self.fresh(hint)
        self.line(f"{name} = {text}")
        return name

    def text(self) -> str:
        return "\n".join(self.lines)

    # ---- scalars ---------------------------------------------------------------------------
    def const(self, value, type_: str) -> str:
        """A scalar ``arith.constant`` (floats printed exactly, ints as ints, i1 as bool)."""
        if type_ == "index":
            return self.op(f"arith.constant {int(value)} : index", "c")
        if type_ == "i1":
            return self.op(f"arith.constant {'true' if value else 'false'}", "c")
        if type_ in _FLOAT_BITS:
            return self.op(f"arith.constant {float_hex(value, type_)} : {type_}", "c")
        return self.op(f"arith.constant {int(value)} : {type_}", "c")

    def ext(self, x: str, d: DType) -> str:
        """Widen a scalar of dtype ``d`` to its compute type (no-op unless f16/bf16)."""
        return self.op(f"arith.extf {x} : {d.value} to f32") if d in HALF else x

    def trunc(self, x: str, d: DType) -> str:
        """Round a compute-type scalar back to ``d`` (no-op unless f16/bf16)."""
        return self.op(f"arith.truncf {x} : f32 to {d.value}") if d in HALF else x

    def from_storage(self, x: str, d: DType) -> str:
        """A stored scalar as its logical type (i8 -> i1 for bools)."""
        return self.op(f"arith.trunci {x} : i8 to i1") if d is DType.I1 else x

    def to_storage(self, x: str, d: DType) -> str:
        """A logical scalar as its stored type (i1 -> i8 0/1 for bools)."""
        return self.op(f"arith.extui {x} : i1 to i8") if d is DType.I1 else x

    # ---- tensors ---------------------------------------------------------------------------
    def empty(self, t: TensorType) -> str:
        return self.op(f"tensor.empty() : {tt(t)}", "e")

    def generic(self, out: TensorType, ins: Sequence[tuple[str, TensorType, str]],
                body: Callable[[list[str], str], str], iterators: Sequence[str] | None = None,
                out_map: str | None = None, init: str | None = None,
                loop_rank: int | None = None, reads_out: bool = False) -> str:
        """``linalg.generic`` writing ``out``.

        ``ins``: (ssa, type, indexing map) per input. ``body(args, out_arg)`` emits the region
        body (scalars named ``args``) and returns the value to yield. Defaults: an all-parallel
        loop nest over ``out``'s shape with the identity output map and a ``tensor.empty``
        init.
        """
        n = out.rank if loop_rank is None else loop_rank
        iterators = list(iterators) if iterators is not None else ["parallel"] * n
        init = init or self.empty(out)
        maps = [m for _, _, m in ins] + [out_map or identity_map(n)]
        its = ", ".join(f'"{i}"' for i in iterators)
        name = self.fresh("g")
        ins_txt = (f"ins({', '.join(s for s, _, _ in ins)} : "
                   f"{', '.join(tt(t) for _, t, _ in ins)}) ") if ins else ""
        self.line(f"{name} = linalg.generic {{indexing_maps = [{', '.join(maps)}], "
                  f"iterator_types = [{its}]}} {ins_txt}outs({init} : {tt(out)}) {{")
        args = [self.fresh("a") for _ in ins]
        out_arg = self.fresh("o")
        typed = [(a, t.dtype) for a, (_, t, _) in zip(args, ins)] + [(out_arg, out.dtype)]
        self.line(f"^bb0({', '.join(f'{a}: {storage(d)}' for a, d in typed)}):")
        self.depth += 1
        args = [self.from_storage(a, t.dtype) for a, (_, t, _) in zip(args, ins)]
        if reads_out:
            out_arg = self.from_storage(out_arg, out.dtype)
        y = self.to_storage(body(args, out_arg), out.dtype)
        self.line(f"linalg.yield {y} : {storage(out.dtype)}")
        self.depth -= 1
        self.line(f"}} -> {tt(out)}")
        return name

    def pointwise(self, out: TensorType, ins: Sequence[tuple[str, TensorType]],
                  body: Callable[[list[str]], str]) -> str:
        """An elementwise ``linalg.generic`` (all operands share ``out``'s shape)."""
        idm = identity_map(out.rank)
        return self.generic(out, [(s, t, idm) for s, t in ins], lambda a, _o: body(a))
