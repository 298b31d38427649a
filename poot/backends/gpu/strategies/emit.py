"""The emit helpers every GPU kernel strategy shares (not a strategy itself): what a strategy
returns (:class:`Synthesized`), the ``gpu.func``/``gpu.module`` text builders
(:func:`gpu_kernel`, :func:`gpu_module`), and the per-element scalar emission of a poot
dispatch body (:class:`ScalarEmitter`).

A strategy decides *which* elements a thread computes; this module writes the MLIR text
(``arith``/``math``/``memref``/``scf``) that computes *one* element of a poot value, recursively
through its producers, without materializing any intermediate tensor::

    em = KernelEmitter()
    se = ScalarEmitter(fn, em)                       # fn: the poot-level dispatch func.func
    idx = se.delinearize(lin, result_type.shape)     # index coordinates (SSA names or ints)
    x = se.value(fn_result_value, idx)               # the element, in its compute type
    se.store(x, "%out0", result_type, idx)           # written in its storage type
    body = em.text()                                 # constants first, then the ops

API summary:

* **Index coordinates** are a list with one entry per dimension: an ``index``-typed SSA name
  (``"%v12"``) or a Python ``int`` (a known coordinate; every dimension of size 1 has the
  coordinate ``0``). Ints fold through the index arithmetic, so views of unit dimensions cost
  nothing.
* :meth:`ScalarEmitter.value` ``(v, idx) -> str``: the element of poot value ``v`` (an
  ``ir.Value`` of ``fn``: a block argument or an op result) at ``idx``, as a scalar of its
  *compute type*: f32 for f32/f16/bf16 (an f16/bf16 value is carried as the f32 holding exactly
  the rounded f16/bf16 number, so every op rounds as the oracle does), ``i1`` for booleans, the
  integer type itself for i8/i32/i64.
* **Buffers**: function argument ``i`` is read from the memref ``arg_names[i]`` (default
  ``%arg{i}``) of type :func:`buffer_type` (the tensor's shape in its storage type: i1 as i8,
  bf16 as i16 words, f16 as f16; a packed weight as ``memref<NBYTESxi8>``) with ``memref.load``
  at its natural coordinates. :meth:`ScalarEmitter.buffer_params` lists ``(name, type)`` for the
  kernel signature, arguments first, then the constant buffers.
* **Constants**: a splat ``poot.constant`` (or a non-splat one read at coordinates all known)
  is an immediate; otherwise it is read from a constant buffer, ``se.consts[k]`` = ``(memref
  type, nbytes, raw little-endian bytes)`` (the plan's ``("const", k)`` slot, i.e.
  :attr:`Synthesized.consts`), bound to the kernel parameter
  ``se.const_names[k]``.
* **Memoization**: an element of a value at the same coordinates is emitted once per *scope*
  (as is the index arithmetic). Open a scope (``with se.scope():``) around code emitted inside
  a nested region (``scf.if``/``scf.for`` body): what it computes is forgotten on exit, since it
  does not dominate later code.
* **Hook**: ``provide(v, idx) -> str | None`` is asked first for every value; a name it
  returns is used as that element (in the compute type) instead of computing it: e.g. the
  accumulated result of a GEMV for its epilogue, or a row's reduced value. It may raise
  :class:`ScalarUnsupported` to refuse (e.g. an index it cannot serve).
* A *small contraction* (:func:`small_contraction`: a float ``poot.matmul`` whose K is at
  most :data:`SCALAR_MAX_K` and a quarter of N, e.g. a LoRA expand over the stacked ranks of
  its slots) is
  computed per element, accumulating ``lhs[..., m, k] * rhs[..., k, n]`` in f32 (k
  ascending), :data:`CONTRACTION_UNROLL` terms at a time.
* A *small reduction* (:func:`small_reduction`: a float or i32 ``poot.reduce`` folding at
  most :data:`SCALAR_MAX_REDUCE` elements into each result element, over any axes, e.g. a
  MoE layer's weighted sum over its top-k experts' rows) is computed per element, its
  terms in row-major order of the reduced axes, floats in f32, rounded to the result's dtype.
* Anything else outside the elementwise class (larger reductions, larger matmuls, attention,
  scatter without a hook, a packed value not read through ``poot.dequantize``, a format
  without a decoder) raises :class:`ScalarUnsupported`: a strategy catches it and returns
  ``None``.

Semantics follow each op's definition in :mod:`poot.dialects.ops` and its linalg lowering in
:mod:`poot.dialects.lowering` element by element: elementwise bodies are the lowering's own
scalar functions (:mod:`poot.dialects.lowering.elementwise`); packed weights use the same
per-format decoders (:data:`poot.dialects.lowering.packed.DECODERS`) over ``memref.load``;
gather clamps its index in i64 as :mod:`poot.dialects.lowering.indexing` does (the
``maxsi``/``minsi`` -> ``index_cast`` -> ``memref.load`` chain the Vulkan backend's range
check recognizes). bf16 <-> f32 conversions are spelled in integer arithmetic (round to nearest
even, NaN kept quiet: the expansion of MLIR's ``arith-expand{include-bf16}``), so no backend
needs a bf16 type.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable, Sequence

import ml_dtypes
import numpy as np
from mlir import ir

from poot.backends.gpu.kernels import WG_ALIGN, GpuCodegenError, Launch
from poot.dialects.lowering.elementwise import (
    _CMP_BOOL,
    _CMP_FLOAT,
    _CMP_INT,
    _binary,
    _ternary,
    _unary,
    convert_scalar,
)
from poot.dialects.lowering.emit import HALF, Emitter, compute_type
from poot.dialects.lowering.packed import DECODERS, _Block
from poot.dialects.opdef import dense_from_mlir, lookup, read_attrs
from poot.dialects.types import DType, PackedType, TensorType, type_from_mlir

Index = str | int
Provide = Callable[[ir.Value, tuple], "str | None"]


@dataclass
class Synthesized:
    """What a strategy returns: ``text`` holds one or more ``gpu.module``s; ``launches``
    (kernel launches naming ``module``/``kernel`` in ``text``, in order, and plan copies);
    ``scratch``: ``(memref type text, nbytes)`` per temporary buffer (``("scratch", k)``);
    ``consts``: ``(memref type text, nbytes, raw bytes)`` per constant (``("const", k)``)."""

    text: str
    launches: list[Launch]
    scratch: list[tuple[str, int]] = field(default_factory=list)
    consts: list[tuple[str, int, bytes]] = field(default_factory=list)

class ScalarUnsupported(GpuCodegenError):
    """An op or value the scalar emitter does not compute (the strategy refuses the region)."""


#: the largest contraction length a ``poot.matmul`` may have to be computed per element
#: (:func:`small_contraction`): K multiply-adds and K reads of each operand per element, as
#: cheap as a few elementwise ops for LoRA's stacked ranks (slots x rank: 16 to 64 in
#: practice); a projection's K (hundreds to thousands) stays a GEMV/GEMM's
SCALAR_MAX_K = 128
#: ... and only a low-rank expansion, K at most 1/LOW_RANK of the output width N (a LoRA
#: expand: slots x rank << out). A square or narrowing product (a toy model's 64 x 64
#: projection) keeps its own region: the GEMV/GEMM reads its weight once for all rows
LOW_RANK = 4
#: terms of a small contraction written together (see ScalarEmitter._contraction)
CONTRACTION_UNROLL = 8
#: the most operand elements a ``poot.reduce`` may fold into one result element to be
#: computed per element (:func:`small_reduction`): a MoE layer's sum over its top-k experts'
#: rows (k is 2 to 8); a row reduction of a norm or a softmax (hundreds to thousands) stays
#: the row kernels'. Why: a reduction over a middle axis is no row reduction, and the
#: generic mapping gave the top-2 sum of a Mixtral-shaped layer 5 launches (single-thread
#: ones among them) where one elementwise kernel does it
SCALAR_MAX_REDUCE = 8

_REDUCE_BINARY = {"sum": "add", "max": "max", "min": "min"}


def small_contraction(op: ir.Operation) -> bool:
    """Whether ``op`` is a float ``poot.matmul`` [..., M, K] x [..., K, N] with K <=
    :data:`SCALAR_MAX_K` and LOW_RANK * K <= N, which the scalar emitter computes per
    element."""
    if op.name != "poot.matmul":
        return False
    t = type_from_mlir(op.operands[0].type)
    r = type_from_mlir(op.results[0].type)
    return isinstance(t, TensorType) and isinstance(r, TensorType) and t.dtype.is_float \
        and t.shape[-1] <= SCALAR_MAX_K and LOW_RANK * t.shape[-1] <= r.shape[-1]


def small_reduction(op: ir.Operation) -> bool:
    """Whether ``op`` is a ``poot.reduce`` of a float or i32 tensor folding 1 to
    :data:`SCALAR_MAX_REDUCE` elements into each result element, which the scalar emitter
    computes per element."""
    if op.name != "poot.reduce":
        return False
    t = type_from_mlir(op.operands[0].type)
    a = read_attrs(lookup(op.name), op)
    if not isinstance(t, TensorType) or not (t.dtype.is_float or t.dtype is DType.I32) or \
            a["fn"] not in _REDUCE_BINARY:
        return False
    n = int(np.prod([t.shape[i] for i in a["axes"]], dtype=np.int64))
    return 1 <= n <= SCALAR_MAX_REDUCE


# ---- types -----------------------------------------------------------------------------------

def storage_elem(d: DType) -> str:
    """The element type a buffer of dtype ``d`` is accessed with in kernels: i1 as i8 (0/1),
    bf16 as i16 words, everything else as itself."""
    return {DType.I1: "i8", DType.BF16: "i16"}.get(d, d.value)


def buffer_type(t) -> str:
    """The kernel memref type of a poot value's buffer: its shape in :func:`storage_elem`
    (``memref<4x8xf32>``, ``memref<f32>`` for rank 0), a packed weight as its bytes."""
    if isinstance(t, PackedType):
        return f"memref<{t.nbytes}xi8>"
    return f"memref<{'x'.join([str(s) for s in t.shape] + [storage_elem(t.dtype)])}>"


def poot_type(v: ir.Value):
    return type_from_mlir(v.type)


# ---- text emission -----------------------------------------------------------------------------

class KernelEmitter(Emitter):
    """An :class:`~poot.dialects.lowering.emit.Emitter` whose scalar constants are emitted
    once each into a prologue (so they dominate every nested region); :meth:`text` is the
    prologue followed by the body."""

    def __init__(self, indent: int = 2):
        super().__init__(indent)
        self.prologue: list[str] = []
        self._consts: dict[tuple, str] = {}

    def const(self, value, type_: str) -> str:
        key = (type_, repr(value) if isinstance(value, float) else value)
        if key not in self._consts:
            lines, depth = self.lines, self.depth
            self.lines, self.depth = self.prologue, 2
            try:
                self._consts[key] = super().const(value, type_)
            finally:
                self.lines, self.depth = lines, depth
        return self._consts[key]

    def text(self) -> str:
        return "\n".join(self.prologue + self.lines)


def gpu_kernel(name: str, params: Sequence[tuple[str, str]], body: str,
               workgroup: Sequence[tuple[str, str]] = ()) -> str:
    """A ``gpu.func ... kernel`` (text) taking ``params`` ((ssa name, type) pairs), with
    workgroup-memory attributions ``workgroup`` ((ssa name, memref type in address space
    workgroup)); ``body`` is the kernel's ops (without the final ``gpu.return``)."""
    sig = ", ".join(f"{n}: {t}" for n, t in params)
    wg = f" workgroup({', '.join(f'{n}: {t} {WG_ALIGN}' for n, t in workgroup)})" \
        if workgroup else ""
    return f"  gpu.func @{name}({sig}){wg} kernel {{\n{body}\n    gpu.return\n  }}"


def gpu_module(name: str, kernels: Sequence[str]) -> str:
    """A ``gpu.module`` (text) holding ``kernels`` (:func:`gpu_kernel` texts)."""
    return f"gpu.module @{name} {{\n" + "\n".join(kernels) + "\n}\n"


def one_kernel_module(name: str, se: "ScalarEmitter", outs: Sequence[tuple[str, str]],
                      workgroup: Sequence[tuple[str, str]] = ()) -> tuple[str, list]:
    """A ``gpu.module @name`` holding the one kernel ``@k`` whose body ``se`` emitted: its
    parameters are the buffers ``se`` read (:meth:`ScalarEmitter.buffer_params`), then the
    results ``outs`` (``(ssa name, memref type)`` each, result ``j`` the ``("out", j)``
    slot). Returns (module text, launch slots)."""
    params = se.buffer_params() + list(outs)
    text = gpu_module(name, [gpu_kernel("k", params, se.em.text(), workgroup)])
    return text, se.buffer_slots() + [("out", j) for j in range(len(outs))]


def const_bytes(value: np.ndarray, d: DType) -> bytes:
    """The raw little-endian bytes of a constant as its buffer holds it (:func:`storage_elem`)."""
    a = np.ascontiguousarray(np.asarray(value).astype(d.numpy))
    if d is DType.I1:
        a = a.astype(np.uint8)
    return a.tobytes()


# ---- the emitter -----------------------------------------------------------------------------

class ScalarEmitter:
    """Emits one element of the values of the poot function ``fn``: see the module doc.

    Args:
        fn: the poot-level dispatch ``func.func`` (static shapes).
        em: where the text goes (a fresh :class:`KernelEmitter` if None).
        arg_names: kernel SSA name of the buffer of each function argument (default
            ``%arg{i}``).
        provide: the hook asked before computing any element (see the module doc).
    """

    def __init__(self, fn: ir.Operation, em: KernelEmitter | None = None,
                 arg_names: Sequence[str] | None = None, provide: Provide | None = None):
        self.fn = fn
        self.em = em or KernelEmitter()
        block = fn.regions[0].blocks[0]
        self.args = list(block.arguments)
        self.arg_names = list(arg_names) if arg_names is not None else \
            [f"%arg{i}" for i in range(len(self.args))]
        self.provide = provide
        self.consts: list[tuple[str, int, bytes]] = []
        self.const_names: list[str] = []
        self._const_ids: dict = {}
        self._scopes: list[dict] = [{}]
        self._in_contraction = False
        self._in_reduction = False

    def share_consts(self, other: "ScalarEmitter") -> None:
        """Register constant buffers in ``other``'s list (several kernels of one dispatch,
        each with its own emitter, then share the ``("const", k)`` slots)."""
        self.consts, self.const_names, self._const_ids = \
            other.consts, other.const_names, other._const_ids

    # ---- scopes / memo -------------------------------------------------------------------
    @contextlib.contextmanager
    def scope(self):
        """Forget, on exit, every element and index expression emitted inside."""
        self._scopes.append({})
        try:
            yield
        finally:
            self._scopes.pop()

    def _get(self, key):
        for s in reversed(self._scopes):
            if key in s:
                return s[key]
        return None

    def _put(self, key, name):
        self._scopes[-1][key] = name
        return name

    def op(self, text: str, hint: str = "v") -> str:
        """``em.op(text)`` emitted once per scope (for pure ops)."""
        key = ("op", text)
        got = self._get(key)
        return got if got is not None else self._put(key, self.em.op(text, hint))

    # ---- index arithmetic (ints fold) --------------------------------------------------------
    def ix(self, c: Index) -> str:
        """An index coordinate as an SSA name."""
        return self.em.const(c, "index") if isinstance(c, int) else c

    def iadd(self, a: Index, b: Index) -> Index:
        if isinstance(a, int) and isinstance(b, int):
            return a + b
        if b == 0:
            return a
        if a == 0:
            return b
        return self.op(f"arith.addi {self.ix(a)}, {self.ix(b)} : index")

    def isub(self, a: Index, b: int) -> Index:
        if isinstance(a, int):
            return a - b
        return a if b == 0 else self.op(f"arith.subi {a}, {self.ix(b)} : index")

    def imul(self, a: Index, k: int) -> Index:
        if isinstance(a, int):
            return a * k
        if k == 0:
            return 0
        return a if k == 1 else self.op(f"arith.muli {a}, {self.ix(k)} : index")

    def idiv(self, a: Index, k: int) -> Index:
        if isinstance(a, int):
            return a // k
        return a if k == 1 else self.op(f"arith.divui {a}, {self.ix(k)} : index")

    def irem(self, a: Index, k: int) -> Index:
        if isinstance(a, int):
            return a % k
        return 0 if k == 1 else self.op(f"arith.remui {a}, {self.ix(k)} : index")

    def linearize(self, idx: Sequence[Index], shape: Sequence[int]) -> Index:
        """The row-major flat offset of ``idx`` in ``shape``."""
        lin: Index = 0
        for c, d in zip(idx, shape):
            lin = self.iadd(self.imul(lin, d), c)
        return lin

    def delinearize(self, lin: Index, shape: Sequence[int]) -> list[Index]:
        """Coordinates of the row-major flat offset ``lin`` (``0 <= lin < prod(shape)``)."""
        out: list[Index] = []
        for i in reversed(range(len(shape))):
            d = shape[i]
            if d == 1:
                out.append(0)
            elif all(s == 1 for s in shape[:i]):
                out.append(lin)               # the outermost non-unit dim: no remainder
                lin = 0
            else:
                out.append(self.irem(lin, d))
                lin = self.idiv(lin, d)
        return out[::-1]

    def _reshape(self, idx: Sequence[Index], out_shape, in_shape) -> list[Index]:
        """Operand coordinates of a row-major reshape, group by group (runs of dims whose sizes
        multiply to the same number), so unchanged dims keep their coordinate names."""
        o = [(c, d) for c, d in zip(idx, out_shape) if d != 1]
        ins = [d for d in in_shape if d != 1]
        res: list[Index] = []
        i = j = 0
        while i < len(o) or j < len(ins):
            go, gi = [o[i]], [ins[j]]
            i, j = i + 1, j + 1
            po, pi = go[0][1], gi[0]
            while po != pi:
                if po < pi:
                    go.append(o[i])
                    po *= o[i][1]
                    i += 1
                else:
                    gi.append(ins[j])
                    pi *= ins[j]
                    j += 1
            if len(go) == 1 and len(gi) == 1:
                res.append(go[0][0])
            else:
                res.extend(self.delinearize(self.linearize([c for c, _ in go],
                                                           [d for _, d in go]), gi))
        it = iter(res)
        return [0 if d == 1 else next(it) for d in in_shape]

    # ---- dtype helpers ----------------------------------------------------------------------
    def round_to(self, x: str, d: DType) -> str:
        """A compute-type float rounded to ``d``'s precision (still in f32)."""
        em = self.em
        if d is DType.F16:
            h = em.op(f"arith.truncf {x} : f32 to f16")
            return em.op(f"arith.extf {h} : f16 to f32")
        if d is DType.BF16:
            return em.op(f"arith.bitcast {self._bf16_bits32(x)} : i32 to f32")
        return x

    def _bf16_bits32(self, x: str) -> str:
        """The f32 bits of ``x`` rounded to bf16 (nearest even; NaN -> quiet NaN), low 16
        bits zero."""
        em = self.em
        b = em.op(f"arith.bitcast {x} : f32 to i32")
        hi = em.op(f"arith.shrui {b}, {em.const(16, 'i32')} : i32")
        lsb = em.op(f"arith.andi {hi}, {em.const(1, 'i32')} : i32")
        bias = em.op(f"arith.addi {lsb}, {em.const(0x7FFF, 'i32')} : i32")
        r = em.op(f"arith.addi {b}, {bias} : i32")
        r = em.op(f"arith.andi {r}, {em.const(-65536, 'i32')} : i32")
        nan = em.op(f"arith.cmpf uno, {x}, {x} : f32")
        return em.op(f"arith.select {nan}, {em.const(0x7FC00000, 'i32')}, {r} : i32")

    def from_storage(self, x: str, d: DType) -> str:
        """A loaded storage scalar (:func:`storage_elem`) as its compute type."""
        em = self.em
        if d is DType.I1:
            return em.op(f"arith.cmpi ne, {x}, {em.const(0, 'i8')} : i8")
        if d is DType.F16:
            return em.op(f"arith.extf {x} : f16 to f32")
        if d is DType.BF16:
            w = em.op(f"arith.extui {x} : i16 to i32")
            w = em.op(f"arith.shli {w}, {em.const(16, 'i32')} : i32")
            return em.op(f"arith.bitcast {w} : i32 to f32")
        return x

    def to_storage(self, x: str, d: DType) -> str:
        """A compute-type scalar (already rounded to ``d``) as its storage scalar."""
        em = self.em
        if d is DType.I1:
            return em.op(f"arith.extui {x} : i1 to i8")
        if d is DType.F16:
            return em.op(f"arith.truncf {x} : f32 to f16")
        if d is DType.BF16:
            b = em.op(f"arith.bitcast {x} : f32 to i32")
            b = em.op(f"arith.shrui {b}, {em.const(16, 'i32')} : i32")
            return em.op(f"arith.trunci {b} : i32 to i16")
        return x

    # ---- buffers ------------------------------------------------------------------------------
    def buffer_params(self) -> list[tuple[str, str]]:
        """``(ssa name, memref type)`` of every buffer the emitted code reads: the function
        arguments in order, then the constant buffers (``("const", k)``) in order. Call it
        after emitting."""
        return [(n, buffer_type(poot_type(a))) for n, a in zip(self.arg_names, self.args)] + \
            [(n, c[0]) for n, c in zip(self.const_names, self.consts)]

    def buffer_slots(self) -> list[tuple[str, int]]:
        """The launch slots of :meth:`buffer_params`: ``("arg", i)`` per function argument,
        then ``("const", k)`` per constant buffer registered so far."""
        return [("arg", i) for i in range(len(self.args))] + \
            [("const", i) for i in range(len(self.consts))]

    def load(self, buf: str, t: TensorType, idx: Sequence[Index]) -> str:
        """The element of buffer ``buf`` (of :func:`buffer_type` ``t``) at ``idx``, in its
        compute type."""
        key = ("load", buf, tuple(idx))
        got = self._get(key)
        if got is not None:
            return got
        ixs = ", ".join(self.ix(c) for c in idx)
        x = self.em.op(f"memref.load {buf}[{ixs}] : {buffer_type(t)}")
        return self._put(key, self.from_storage(x, t.dtype))

    def store(self, x: str, buf: str, t: TensorType, idx: Sequence[Index]) -> None:
        """Write compute-type scalar ``x`` into buffer ``buf`` (:func:`buffer_type` ``t``)."""
        ixs = ", ".join(self.ix(c) for c in idx)
        self.em.line(f"memref.store {self.to_storage(x, t.dtype)}, {buf}[{ixs}] : "
                     f"{buffer_type(t)}")

    def _arg(self, v: ir.Value) -> str:
        for a, n in zip(self.args, self.arg_names):
            if a == v:
                return n
        raise ScalarUnsupported("a block argument that is not the dispatch's")

    # ---- values ---------------------------------------------------------------------------------
    def value(self, v: ir.Value, idx: Sequence[Index]) -> str:
        """The element of poot value ``v`` at ``idx`` (see the module doc), in its compute
        type."""
        idx = tuple(idx)
        key = ("val", v, idx)
        got = self._get(key)
        if got is not None:
            return got
        if self.provide is not None:
            got = self.provide(v, idx)
            if got is not None:
                return self._put(key, got)
        owner = v.owner
        if isinstance(owner, ir.Block):
            t = poot_type(v)
            if isinstance(t, PackedType):
                raise ScalarUnsupported("a packed weight read other than by poot.dequantize")
            x = self.load(self._arg(v), t, idx)
        else:
            x = self._op_value(owner.operation if hasattr(owner, "operation") else owner, idx)
        return self._put(key, x)

    def _op_value(self, op: ir.Operation, idx: tuple) -> str:
        opdef = lookup(op.name)
        if opdef is None:
            raise ScalarUnsupported(f"{op.name} is not a poot op")
        if op.name == "poot.matmul":
            return self._contraction(op, idx)
        rule = getattr(self, f"_v_{opdef.name}", None)
        if rule is None:
            raise ScalarUnsupported(f"{op.name} is not elementwise-class")
        return rule(op, read_attrs(opdef, op), poot_type(op.results[0]), idx)

    def _contraction(self, op: ir.Operation, idx: tuple) -> str:
        """Element ``idx`` of a small contraction (see the module doc): ``sum_k lhs[...,
        m, k] * rhs[..., k, n]`` in f32, k ascending, rounded to the result's dtype. Written
        :data:`CONTRACTION_UNROLL` terms at a time (straight-line up to
        ``2 * CONTRACTION_UNROLL`` terms, else an ``scf.for`` over such groups): the terms'
        loads are independent, so a thread has them in flight together instead of one load
        latency per term (a loop of single terms made the batch-32 LoRA SwiGLU kernel of
        the Llama-3.2-1B shape 39 us on an H200)."""
        if not small_contraction(op):
            raise ScalarUnsupported(f"a matmul with K > {SCALAR_MAX_K} or K > N / {LOW_RANK} "
                                    f"(or not float) is not computed per element")
        if self._in_contraction:
            raise ScalarUnsupported("a contraction inside a contraction's operand (its cost "
                                    "would multiply)")
        lhs, rhs = op.operands
        K = poot_type(lhs).shape[-1]
        em, U = self.em, CONTRACTION_UNROLL

        def terms(acc: str, ks) -> str:
            with self.scope():
                for k in ks:
                    a = self.value(lhs, idx[:-1] + (k,))
                    b = self.value(rhs, idx[:-2] + (k, idx[-1]))
                    p = em.op(f"arith.mulf {a}, {b} : f32")
                    acc = em.op(f"arith.addf {acc}, {p} : f32")
            return acc

        self._in_contraction = True
        try:
            acc, done = em.const(0.0, "f32"), 0
            if K > 2 * U:
                g, it, a0 = em.fresh("k"), em.fresh("acc"), em.fresh("dot")
                done = K // U * U
                em.line(f"{a0} = scf.for {g} = {self.ix(0)} to {self.ix(done)} step "
                        f"{self.ix(U)} iter_args({it} = {acc}) -> (f32) {{")
                em.depth += 1
                with self.scope():           # the loop's index arithmetic stays inside it
                    out = terms(it, [self.iadd(g, j) for j in range(U)])
                em.line(f"scf.yield {out} : f32")
                em.depth -= 1
                em.line("}")
                acc = a0
            acc = terms(acc, range(done, K))
        finally:
            self._in_contraction = False
        return self.round_to(acc, poot_type(op.results[0]).dtype)

    # views: index arithmetic only
    def _v_reshape(self, op, attrs, r, idx):
        x = op.operands[0]
        return self.value(x, self._reshape(idx, r.shape, poot_type(x).shape))

    def _v_transpose(self, op, attrs, r, idx):
        perm = attrs["perm"]
        src = [0] * len(perm)
        for i, p in enumerate(perm):
            src[p] = idx[i]
        return self.value(op.operands[0], src)

    def _v_broadcast(self, op, attrs, r, idx):
        xs = poot_type(op.operands[0]).shape
        return self.value(op.operands[0],
                          [0 if xs[i] == 1 else idx[d] for i, d in enumerate(attrs["dims"])])

    def _v_slice(self, op, attrs, r, idx):
        return self.value(op.operands[0],
                          [self.iadd(self.imul(c, s), a)
                           for c, a, s in zip(idx, attrs["start"], attrs["stride"])])

    def _v_concat(self, op, attrs, r, idx):
        ax = attrs["axis"]
        a, b = op.operands
        n = poot_type(a).shape[ax]
        nb = poot_type(b).shape[ax]
        c = idx[ax]
        if isinstance(c, int):
            return self.value(a, idx) if c < n else \
                self.value(b, idx[:ax] + (c - n,) + idx[ax + 1:])
        # both operands at clamped coordinates (never out of bounds), then a select
        ca = 0 if n == 1 else self.op(f"arith.minui {c}, {self.ix(n - 1)} : index")
        cb = 0 if nb == 1 else self.op(
            f"arith.subi {self.op(f'arith.maxui {c}, {self.ix(n)} : index')}, "
            f"{self.ix(n)} : index")
        va = self.value(a, idx[:ax] + (ca,) + idx[ax + 1:])
        vb = self.value(b, idx[:ax] + (cb,) + idx[ax + 1:])
        lt = self.op(f"arith.cmpi ult, {c}, {self.ix(n)} : index")
        return self.em.op(f"arith.select {lt}, {va}, {vb} : {compute_type(r.dtype)}")

    # sources
    def _v_iota(self, op, attrs, r, idx):
        c = idx[attrs["axis"]]
        d = r.dtype
        if isinstance(c, int):
            return self.em.const(float(c) if d.is_float else c, compute_type(d))
        if d.is_float:
            i = self.em.op(f"arith.index_cast {c} : index to i64")
            return self.round_to(self.em.op(f"arith.sitofp {i} : i64 to f32"), d)
        return self.em.op(f"arith.index_cast {c} : index to {d.value}")

    def _v_constant(self, op, attrs, r, idx):
        attr = op.attributes["value"]
        d = r.dtype
        dense = ir.DenseElementsAttr(attr)
        if dense.is_splat or all(isinstance(c, int) for c in idx):
            arr = dense_from_mlir(attr)
            s = arr.reshape(-1)[0] if dense.is_splat else arr[tuple(idx)]
            return self._immediate(s, d)
        key = str(attr)
        if key not in self._const_ids:
            arr = dense_from_mlir(attr)
            self._const_ids[key] = len(self.consts)
            self.const_names.append(f"%const{len(self.consts)}")
            self.consts.append((buffer_type(r), len(const_bytes(arr, d)), const_bytes(arr, d)))
        k = self._const_ids[key]
        return self.load(self.const_names[k], r, idx)

    def _immediate(self, s, d: DType) -> str:
        if d.is_float:
            return self.em.const(float(np.float32(s)), "f32")
        if d.is_bool:
            return self.em.const(bool(s), "i1")
        return self.em.const(int(s), d.value)

    # elementwise: the linalg lowering's scalar bodies, in the compute type
    def _elementwise(self, op, attrs, r, idx, scalar):
        d = poot_type(op.operands[0]).dtype
        args = [self.value(x, idx) for x in op.operands]
        return self.round_to(scalar(self.em, attrs["fn"], compute_type(d), *args), d)

    def _v_unary(self, op, attrs, r, idx):
        return self._elementwise(op, attrs, r, idx, _int_abs_unary)

    def _v_binary(self, op, attrs, r, idx):
        return self._elementwise(op, attrs, r, idx, _binary)

    def _v_ternary(self, op, attrs, r, idx):
        return self._elementwise(op, attrs, r, idx, _ternary)

    def _v_compare(self, op, attrs, r, idx):
        d = poot_type(op.operands[0]).dtype
        a, b = (self.value(x, idx) for x in op.operands)
        t, pred = compute_type(d), attrs["pred"]
        if d.is_float:
            return self.em.op(f"arith.cmpf {_CMP_FLOAT[pred]}, {a}, {b} : {t}")
        table = _CMP_BOOL if d.is_bool else _CMP_INT
        return self.em.op(f"arith.cmpi {table[pred]}, {a}, {b} : {t}")

    def _v_select(self, op, attrs, r, idx):
        c, a, b = (self.value(x, idx) for x in op.operands)
        return self.em.op(f"arith.select {c}, {a}, {b} : {compute_type(r.dtype)}")

    def _v_cast(self, op, attrs, r, idx):
        src, dst = poot_type(op.operands[0]).dtype, r.dtype
        x = self.value(op.operands[0], idx)
        s = DType.F32 if src in HALF else src      # carried exactly in f32
        if dst in HALF:
            return self.round_to(convert_scalar(self.em, x, s, DType.F32), dst)
        return convert_scalar(self.em, x, s, dst)

    # data-dependent reads
    def _v_gather(self, op, attrs, r, idx):
        table, indices = op.operands
        tt_, it = poot_type(table), poot_type(indices)
        ax, k = attrs["axis"], it.rank
        n = tt_.shape[ax]
        if n == 1:
            c: Index = 0
        else:
            i = self.value(indices, idx[ax:ax + k])
            if it.dtype is not DType.I64:
                i = self.em.op(f"arith.extsi {i} : {it.dtype.value} to i64")
            i = self.em.op(f"arith.maxsi {i}, {self.em.const(0, 'i64')} : i64")
            i = self.em.op(f"arith.minsi {i}, {self.em.const(n - 1, 'i64')} : i64")
            c = self.em.op(f"arith.index_cast {i} : i64 to index")
        return self.value(table, idx[:ax] + (c,) + idx[ax + k:])

    def _v_reduce(self, op, attrs, r, idx):
        """Element ``idx`` of a small reduction (see the module doc)."""
        if not small_reduction(op):
            raise ScalarUnsupported(f"a reduction of more than {SCALAR_MAX_REDUCE} elements a "
                                    "result (or not float / i32) is not computed per element")
        if self._in_reduction:
            raise ScalarUnsupported("a reduction inside a small reduction's operand (its cost "
                                    "would multiply)")
        x = op.operands[0]
        xt = poot_type(x)
        axes = list(attrs["axes"])
        t, fn = compute_type(xt.dtype), _REDUCE_BINARY[attrs["fn"]]
        self._in_reduction = True
        try:
            acc = None
            for red in np.ndindex(*[xt.shape[a] for a in axes]):
                kept, folded = iter(idx), iter(red)
                at = [int(next(folded)) if i in axes else next(kept) for i in range(xt.rank)]
                v = self.value(x, at)
                acc = v if acc is None else _binary(self.em, fn, t, acc, v)
        finally:
            self._in_reduction = False
        return self.round_to(acc, r.dtype) if r.dtype.is_float else acc

    # fp8 KV values (poot.dialects.kv_quant): the e4m3 conversions of CUDA sm_89+ (planning
    # refuses fp8 on every other target)
    def _v_quantize_fp8(self, op, attrs, r, idx):
        """``e4m3fn(sat(x / s))`` (0 where ``s == 0``) as i8: one
        ``cvt.rn.satfinite.e4m3x2.f32`` (``nvvm.convert.f32x2.to.f8x2``), its low byte."""
        em = self.em
        x = self.value(op.operands[0], idx)
        s = self.value(op.operands[1], tuple(idx[:-1]) + (0,))
        zero = em.const(0.0, "f32")
        v = em.op(f"arith.select {em.op(f'arith.cmpf ogt, {s}, {zero} : f32')}, "
                  f"{em.op(f'arith.divf {x}, {s} : f32')}, {zero} : f32")
        q = em.op(f"nvvm.convert.f32x2.to.f8x2 {zero}, {v} {{rnd = #nvvm.fp_rnd_mode<rn>, "
                  f"sat = #nvvm.sat_mode<satfinite>}} : i16 (f8E4M3FN)")
        return em.op(f"arith.trunci {q} : i16 to i8")

    def _v_dequantize_fp8(self, op, attrs, r, idx):
        """``e4m3fn(values) * scales[..., 0]`` in f32: one ``cvt.rn.f16x2.e4m3x2``
        (``nvvm.convert.f8x2.to.f16x2``) of the value and a zero byte."""
        em = self.em
        q = self.value(op.operands[0], idx)
        s = self.value(op.operands[1], tuple(idx[:-1]) + (0,))
        v = em.op(f"vector.from_elements {q}, {em.const(0, 'i8')} : vector<2xi8>")
        h = em.op(f"nvvm.convert.f8x2.to.f16x2 {v} : vector<2xi8> (f8E4M3FN) -> "
                  f"vector<2xf16>")
        f = em.op(f"arith.extf {em.op(f'vector.extract {h}[0] : f16 from vector<2xf16>')} "
                  f": f16 to f32")
        return em.op(f"arith.mulf {f}, {s} : f32")

    def _v_dequantize(self, op, attrs, r, idx):
        packed = op.operands[0]
        if not isinstance(packed.owner, ir.Block):
            raise ScalarUnsupported("a dequantize of a packed value that is not an argument")
        pt: PackedType = poot_type(packed)
        fmt = pt.format
        decode = DECODERS.get(fmt.name)
        if decode is None:
            raise ScalarUnsupported(f"no in-kernel decoder for packed format {fmt.name}")
        e = self.linearize(idx, pt.shape)
        block, j = self.idiv(e, fmt.block_elems), self.irem(e, fmt.block_elems)
        jx = self.ix(j)
        j32 = self.em.op(f"arith.index_cast {jx} : index to i32")
        base = self.ix(self.imul(block, fmt.block_bytes))
        x = decode(self.em, _MemBlock(self, self._arg(packed), pt.nbytes, base), jx, j32)
        return self.round_to(x, r.dtype)


def _int_abs_unary(em: Emitter, fn: str, t: str, x: str) -> str:
    """The lowering's unary bodies, except integer ``abs`` as compare/negate/select (the same
    wrapping result as ``math.absi``, which SPIR-V has no i64 form of)."""
    if fn == "abs" and t in ("i8", "i32", "i64"):
        neg = em.op(f"arith.cmpi slt, {x}, {em.const(0, t)} : {t}")
        m = em.op(f"arith.subi {em.const(0, t)}, {x} : {t}")
        return em.op(f"arith.select {neg}, {m}, {x} : {t}")
    return _unary(em, fn, t, x)


class _MemBlock(_Block):
    """The packed decoders' block reader over a ``memref<NBYTESxi8>`` kernel argument."""

    def __init__(self, se: ScalarEmitter, w: str, nbytes: int, base: str):
        super().__init__(se.em, w, nbytes, base)
        self.se, self.ty = se, f"memref<{nbytes}xi8>"

    def _at(self, off) -> str:
        return self.se.ix(self.se.iadd(self.base, off))

    def byte(self, off) -> str:
        at = self._at(off)
        key = ("byte", self.w, at)
        got = self.se._get(key)
        if got is None:
            got = self.se._put(key, self.em.op(f"memref.load {self.w}[{at}] : {self.ty}"))
        return got


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """bf16 array as its uint16 words (what a bf16 buffer holds)."""
    return np.asarray(x, ml_dtypes.bfloat16).view(np.uint16)


# ---- small IR and text helpers the matmul strategies share ------------------------------------

def defining_op(v: ir.Value):
    """The op that defines ``v``; None for a block argument."""
    o = v.owner
    if isinstance(o, ir.Block):
        return None
    return o.operation if hasattr(o, "operation") else o


def arg_number(v: ir.Value) -> int | None:
    """The argument number of block argument ``v``; None for an op result."""
    return ir.BlockArgument(v).arg_number if isinstance(v.owner, ir.Block) else None


def maybe_poot_type(v: ir.Value):
    """The poot type of ``v``; None where its MLIR type is none (:func:`poot_type` raises)."""
    try:
        return type_from_mlir(v.type)
    except TypeError:
        return None


class EmitShorthands:
    """Shorthands over a :class:`~.emit.KernelEmitter` (constants hoisted to the entry)."""

    def __init__(self):
        self.k = KernelEmitter()

    def name(self) -> str:
        return self.k.fresh()

    def op(self, text: str) -> str:
        return self.k.op(text)

    def raw(self, text: str) -> None:
        self.k.line(text)

    def c(self, v, t: str = "index") -> str:
        return self.k.const(v, t)

    # index / i32 / f32 shorthands
    def add(self, a, b, t="index"):
        return self.op(f"arith.addi {a}, {b} : {t}")

    def mul(self, a, b, t="index"):
        return self.op(f"arith.muli {a}, {b} : {t}")

    def fadd(self, a, b):
        return self.op(f"arith.addf {a}, {b} : f32")

    def fmul(self, a, b):
        return self.op(f"arith.mulf {a}, {b} : f32")

    def fma(self, a, b, c):
        return self.op(f"math.fma {a}, {b}, {c} : f32")

    def shr(self, a, k):
        return a if k == 0 else self.op(f"arith.shrui {a}, {self.c(k, 'i32')} : i32")

    def shl(self, a, k):
        return a if k == 0 else self.op(f"arith.shli {a}, {self.c(k, 'i32')} : i32")

    def band(self, a, k):
        return self.op(f"arith.andi {a}, {self.c(k, 'i32')} : i32")

    def u2f(self, a):
        return self.op(f"arith.uitofp {a} : i32 to f32")

    def s2f(self, a):
        return self.op(f"arith.sitofp {a} : i32 to f32")

    def half(self, w, hi: bool):
        """The f16 in the low (``hi`` False) or high half of i32 ``w``, as f32."""
        h = self.op(f"arith.trunci {self.shr(w, 16) if hi else w} : i32 to i16")
        f = self.op(f"arith.bitcast {h} : i16 to f16")
        return self.op(f"arith.extf {f} : f16 to f32")


class ArgsSeenEmitter(ScalarEmitter):
    """A scalar emitter that records which argument buffers it reads."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.seen: set[str] = set()

    def _arg(self, v: ir.Value) -> str:
        name = super()._arg(v)
        self.seen.add(name)
        return name


__all__ = ["SCALAR_MAX_K", "ArgsSeenEmitter", "EmitShorthands", "KernelEmitter", "ScalarEmitter",
           "ScalarUnsupported", "Synthesized", "arg_number", "buffer_type", "const_bytes",
           "defining_op", "gpu_kernel", "gpu_module", "maybe_poot_type", "one_kernel_module", "poot_type",
           "small_contraction", "small_reduction", "storage_elem"]
