"""The text builders of the flash-decoding kernels: :class:`Body` (straight-line SSA text
with hoisted constants), the flat views of the dispatch's arguments and strided offsets, and
the subgroup idioms the kernels repeat (butterflies, ``scf.for`` with iter_args, the online
softmax's rescale weight and final division).
"""

from __future__ import annotations

import struct

from mlir import ir

from poot.backends.gpu.strategies.emit import (
    KernelEmitter,
    ScalarEmitter,
    buffer_type,
    storage_elem,
)
from poot.backends.gpu.strategies.attention.match import View
from poot.dialects.types import TensorType

F = "f32"

def f32_bits(x: float) -> str:
    """An exact f32 literal (its bit pattern)."""
    return "0x%08X" % struct.unpack("<I", struct.pack("<f", x))[0]


class Body:
    """Straight-line SSA text with hoisted constants (a tiny builder for gpu.func bodies)."""

    def __init__(self):
        self.lines: list[str] = []
        self.consts: dict[tuple[str, str], str] = {}
        self.head: list[str] = []
        self.n = 0

    def fresh(self) -> str:
        self.n += 1
        return f"%v{self.n}"

    def __call__(self, expr: str) -> str:
        name = self.fresh()
        self.lines.append(f"{name} = {expr}")
        return name

    def raw(self, line: str) -> None:
        self.lines.append(line)

    def c(self, value, ty: str = "index") -> str:
        lit = f32_bits(float(value)) if ty == "f32" else str(int(value))
        if ty == "i1":
            lit = "true" if value else "false"
        key = (lit, ty)
        if key not in self.consts:
            name = f"%c{len(self.consts)}"
            self.consts[key] = name
            self.head.append(f"{name} = arith.constant {lit}" + ("" if ty == "i1" else f" : {ty}"))
        return self.consts[key]

    # index arithmetic with constant folding of the trivial cases
    def add(self, a: str, b: str) -> str:
        if a == self.c(0):
            return b
        if b == self.c(0):
            return a
        return self(f"arith.addi {a}, {b} : index")

    def mul(self, a: str, k: int) -> str:
        if k == 0:
            return self.c(0)
        if k == 1:
            return a
        return self(f"arith.muli {a}, {self.c(k)} : index")

    def text(self) -> str:
        return "\n".join(self.head + self.lines)


def merge_dims(shape, strides_list):
    """Drop size-1 dims and merge adjacent dims that every stride vector walks contiguously:
    the same offsets with fewer div/mod."""
    dims = [(n, [st[i] for st in strides_list]) for i, n in enumerate(shape) if n != 1]
    out: list = []
    for n, sts in dims:
        if out and all(p == s * n for p, s in zip(out[-1][1], sts)):
            out[-1] = (out[-1][0] * n, sts)
        else:
            out.append((n, sts))
    return out


def offsets(b: Body, x: str, dims, nvec: int) -> list[str]:
    """Per stride vector (``nvec`` of them): ``sum_k coord_k(x) * stride_k`` for the
    row-major coordinates of the flat index ``x`` over ``dims`` (from :func:`merge_dims`)."""
    acc = [b.c(0)] * nvec
    rem = x
    for i in reversed(range(len(dims))):
        n, sts = dims[i]
        if i == 0:
            coord = rem
        else:
            coord = b(f"arith.remui {rem}, {b.c(n)} : index")
            rem = b(f"arith.divui {rem}, {b.c(n)} : index")
        for j, s in enumerate(sts):
            acc[j] = b.add(acc[j], b.mul(coord, s))
    return acc


def broadcast_strides(view: View, full) -> tuple[int, ...]:
    """Strides of ``view`` read at the broadcast shape ``full`` (size-1 dims: stride 0)."""
    return tuple(0 if n == 1 and f != 1 else s for n, f, s in zip(view.shape, full, view.strides))


class PrefixedNames(KernelEmitter):
    """The scalar emitter's text builder inside an attention kernel: its SSA names carry a
    prefix of their own (``%x_...``) so they never collide with :class:`Body`'s, and its lines
    go into the kernel body's list (set by the caller)."""

    def fresh(self, hint: str = "v") -> str:
        self.count += 1
        return f"%x_{hint}{self.count}"


class FlatArgs(ScalarEmitter):
    """:class:`ScalarEmitter` reading the dispatch's arguments through the attention kernels'
    flat buffers (``memref<N x storage>`` per argument, row-major; a packed weight as its
    bytes) and recording which arguments it reads (``on_use(index)``)."""

    def __init__(self, fn, em, names, types, on_use):
        super().__init__(fn, em, names)
        self.flat = dict(zip(names, types))
        self.on_use = on_use

    def _arg(self, v: ir.Value) -> str:
        name = super()._arg(v)
        self.on_use(self.arg_names.index(name))
        return name

    def load(self, buf, t, idx):
        if buf not in self.flat:
            return super().load(buf, t, idx)
        lin = self.ix(self.linearize(idx, t.shape))
        key = ("load", buf, lin)
        got = self._get(key)
        if got is None:
            x = self.em.op(f"memref.load {buf}[{lin}] : {self.flat[buf]}")
            got = self._put(key, self.from_storage(x, t.dtype))
        return got


def flat_type(t) -> str:
    """The flat kernel buffer type of an argument of poot type ``t``."""
    if isinstance(t, TensorType):
        return f"memref<{max(1, t.numel)}x{storage_elem(t.dtype)}>"
    return buffer_type(t)


def lane_store(b: Body, store: str, dv: str, Dv: int, ragged: bool) -> None:
    """Emit ``store`` of output column ``dv`` (a lane's share of ``Dv``), guarded by
    ``dv < Dv`` when the lane's last round may run past the row (``ragged``)."""
    if ragged:
        b.raw(f"scf.if {b(f'arith.cmpi ult, {dv}, {b.c(Dv)} : index')} {{")
        b.raw(store)
        b.raw("}")
    else:
        b.raw(store)


def butterfly(b: Body, x: str, op: str, lo: int, hi: int, sg: int, ty: str = F) -> str:
    """``x`` reduced by ``arith.<op>`` over the lanes ``lane ^ lo, lane ^ 2 lo, ...`` below
    ``hi`` of a subgroup of ``sg`` (a ``gpu.shuffle xor`` butterfly)."""
    off = lo
    while off < hi:
        s = b.fresh()
        b.raw(f"{s}, {s}_ok = gpu.shuffle xor {x}, {b.c(off, 'i32')}, "
              f"{b.c(sg, 'i32')} : {ty}")
        x = b(f"arith.{op} {x}, {s} : {ty}")
        off *= 2
    return x


def rescale_w(b: Body, m: str, mn: str) -> str:
    """``exp(m - mn)``, exactly 1 where ``m == mn`` (also ``-inf == -inf``: no NaN)."""
    same = b(f"arith.cmpf oeq, {m}, {mn} : f32")
    ex = b(f"math.exp {b(f'arith.subf {m}, {mn} : f32')} : f32")
    return b(f"arith.select {same}, {b.c(1.0, F)}, {ex} : f32")


def denom_div(b: Body, acc: str, ll: str, mask_kind: str) -> str:
    """The output ``acc / l``: with an i1 mask ``acc / max(l, 1)`` (zeros for a row that sees
    no key); with a bias 0 where ``l`` is 0 (every score -inf)."""
    if mask_kind == "i1":
        den = b(f"arith.maximumf {ll}, {b.c(1.0, F)} : f32")
        return b(f"arith.divf {acc}, {den} : f32")
    q = b(f"arith.divf {acc}, {ll} : f32")
    pos = b(f"arith.cmpf ogt, {ll}, {b.c(0.0, F)} : f32")
    return b(f"arith.select {pos}, {q}, {b.c(0.0, F)} : f32")


def for_(b: Body, iv: str, lo: str, hi: str, step: str, init: list[str]):
    """Open ``scf.for iv = lo to hi step step`` carrying f32 ``init``: (the loop's result
    name, its iter_args' names). Close it with :func:`yield_`."""
    res = b.fresh()
    its = [f"{res}_i{j}" for j in range(len(init))]
    b.raw(f"{res}:{len(init)} = scf.for {iv} = {lo} to {hi} step {step} iter_args("
          + ", ".join(f"{c} = {i}" for c, i in zip(its, init)) + ") -> ("
          + ", ".join([F] * len(init)) + ") {")
    return res, its


def yield_(b: Body, vals: list[str]) -> None:
    """``scf.yield`` of f32 ``vals`` and the region's closing brace."""
    b.raw("scf.yield " + ", ".join(vals) + " : " + ", ".join([F] * len(vals)))
    b.raw("}")


def yield_open(b: Body, vals: list[str]) -> None:
    """``scf.yield`` of f32 ``vals`` closing the then-region of an ``scf.if``, and its
    ``else``."""
    b.raw("scf.yield " + ", ".join(vals) + " : " + ", ".join([F] * len(vals)))
    b.raw("} else {")


__all__ = ["Body", "FlatArgs", "PrefixedNames", "broadcast_strides", "butterfly",
           "denom_div", "f32_bits", "flat_type", "for_", "lane_store", "merge_dims",
           "offsets", "rescale_w", "yield_", "yield_open"]
