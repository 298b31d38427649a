"""Strategy ``scatter``: a region whose result is a ``poot.scatter`` into one of its arguments
(a KV-cache write) becomes a copy of the destination (dropped by the plan when the result is
the argument's own buffer, i.e. state updated in place) and ONE kernel that writes only the
addressed slices.

Semantics (:class:`poot.dialects.ops.indexing.Scatter`, ONNX ScatterND with no reduction):
row ``n`` of ``indices [N, r]`` addresses the slice ``dest[idx[n, 0], ..., idx[n, r-1]]``
(shape ``dest.shape[r:]``) that receives ``updates[n]``; rows with a coordinate out of range are
dropped; when rows repeat an address the later row wins.

Mapping: one thread per (row ``n``, element ``e`` of a slice): grid y is the row, grid x the
slice's elements. Thread (n, e) stores ``updates[n, e]`` when row ``n`` is in range and no
later row ``m > n`` addresses the same slice (it compares the later rows' coordinates first:
integer work on a few cached indices), so a repeated address ends with the later row's value
and no two threads ever write the same element. Rows are independent otherwise: a batch of
B decode rows, or a prefill chunk, writes its K/V in one wave instead of one thread walking
every row in turn (which made a batch-32 decode step's K/V write of the Llama-3.2-1B shape,
RoPE included, 19 us a layer on an H200). ``indices`` and ``updates`` may be any
elementwise-class expression of the arguments (:mod:`~poot.backends.gpu.strategies.emit`).

Narrow destinations on a target that stores no 16-bit value (wgpu: naga has neither 8- nor
16-bit storage, and the emulated narrow store loses a negative byte): an i8 or f16
destination (a q8_0 KV pool's values and scales planes) is written as 32-bit words, ``K = 4``
bytes or 2 halves a word, ONE thread a word (thread ``(n, w)`` computes the word's ``K``
elements of row ``n``'s slice and stores the whole word): no two threads ever write parts of
one word (head dim 32: the scales of two heads share a word). A slice must then be whole
words (``K`` divides its size; else a typed refusal); an f16 element is rounded to its bits
in integer arithmetic (:func:`f16_bits`), an i8 one masked to its byte.
"""

from __future__ import annotations

from mlir import ir

from poot.backends.gpu.kernels import Launch, block_size
from poot.backends.gpu.strategies.emit import (
    KernelEmitter,
    ScalarEmitter,
    ScalarUnsupported,
    Synthesized,
    buffer_type,
    one_kernel_module,
    poot_type,
)
from poot.compiler.planning import Refusal
from poot.dialects.types import DType, TensorType

#: elements a 32-bit word holds, per narrow destination dtype written as words
WORD_ELEMS = {DType.I8: 4, DType.F16: 2}


def word_elems(dtype: DType, caps) -> int | None:
    """Elements of ``dtype`` a 32-bit word holds where a scatter into it is written as words
    (module doc: a target that stores no f16), else None."""
    if DType.F16 in getattr(caps, "storage_dtypes", (DType.F16,)):
        return None
    return WORD_ELEMS.get(dtype)


def f16_bits(se: ScalarEmitter, x: str) -> str:
    """The IEEE binary16 bits (an i32, high half 0) of f32 ``x`` rounded to nearest even:
    overflow to inf, NaN to a quiet NaN, subnormals by an f32 add that rounds them (F.
    Giesen's ``float_to_half_fast3_rtne``); integer arithmetic only (no 16-bit float)."""
    em = se.em
    c = lambda v: em.const(v, "i32")  # noqa: E731
    op = se.op
    u = op(f"arith.bitcast {x} : f32 to i32")
    sign = op(f"arith.andi {u}, {c(-0x80000000)} : i32")
    a = op(f"arith.xori {u}, {sign} : i32")
    big = op(f"arith.cmpi uge, {a}, {c(0x47800000)} : i32")      # >= 65536: inf (or NaN)
    nan = op(f"arith.cmpi ugt, {a}, {c(0x7F800000)} : i32")
    inf = op(f"arith.select {nan}, {c(0x7E00)}, {c(0x7C00)} : i32")
    small = op(f"arith.cmpi ult, {a}, {c(0x38800000)} : i32")    # < 2^-14: subnormal
    af = op(f"arith.bitcast {a} : i32 to f32")
    sf = op(f"arith.addf {af}, {em.const(0.5, 'f32')} : f32")
    sub = op(f"arith.subi {op(f'arith.bitcast {sf} : f32 to i32')}, {c(0x3F000000)} : i32")
    odd = op(f"arith.andi {op(f'arith.shrui {a}, {c(13)} : i32')}, {c(1)} : i32")
    r = op(f"arith.addi {op(f'arith.addi {a}, {c(-0x37FFF001)} : i32')}, {odd} : i32")
    nrm = op(f"arith.shrui {r}, {c(13)} : i32")
    h = op(f"arith.select {small}, {sub}, {nrm} : i32")
    h = op(f"arith.select {big}, {inf}, {h} : i32")
    return op(f"arith.ori {h}, {op(f'arith.shrui {sign}, {c(16)} : i32')} : i32")


class WordScalars(ScalarEmitter):
    """The scalar emitter of a scatter written as words: a value rounded to f16 is rounded by
    :func:`f16_bits` and widened back from its bits (no 16-bit float arithmetic)."""

    def round_to(self, x: str, d: DType) -> str:
        if d is not DType.F16:
            return super().round_to(x, d)
        h = self.op(f"arith.trunci {f16_bits(self, x)} : i32 to i16")
        return self.op(f"arith.extf {self.op(f'arith.bitcast {h} : i16 to f16')} : f16 to f32")

    def word_bits(self, x: str, d: DType) -> str:
        """Compute-type element ``x`` of dtype ``d`` as its bits in the low end of an i32."""
        if d is DType.F16:
            return f16_bits(self, x)
        w = self.op(f"arith.extui {x} : i8 to i32")
        return self.op(f"arith.andi {w}, {self.em.const(0xFF, 'i32')} : i32")


def _returned_scatter(fn: ir.Operation):
    """(scatter op, index of its destination argument) when ``fn`` returns exactly one value,
    a ``poot.scatter`` (through reshapes) into one of ``fn``'s arguments; else None."""
    block = fn.regions[0].blocks[0]
    ret = list(block.operations)[-1].operation
    if len(ret.operands) != 1:
        return None
    v = ret.operands[0]
    while not isinstance(v.owner, ir.Block) and v.owner.operation.name == "poot.reshape":
        v = v.owner.operation.operands[0]
    if isinstance(v.owner, ir.Block) or v.owner.operation.name != "poot.scatter":
        return None
    op = v.owner.operation
    dest = op.operands[0]
    if not isinstance(dest.owner, ir.Block):
        return None
    args = list(block.arguments)
    return op, next(i for i, a in enumerate(args) if a == dest)


def scatter(fn: ir.Operation, caps):
    """The copy + one-kernel form of a scatter region, or None (see the module doc)."""
    found = _returned_scatter(fn)
    if found is None:
        return None
    op, d_arg = found
    dest, indices, updates = op.operands
    dt, it = poot_type(dest), poot_type(indices)
    if not isinstance(dt, TensorType) or it.rank != 2:
        return None
    n_rows, r = it.shape
    slice_shape = dt.shape[r:]
    elems = 1
    for s in slice_shape:
        elems *= s
    flat = TensorType((dt.numel,), dt.dtype)
    K = word_elems(dt.dtype, caps)
    if K is not None and elems % K:
        raise Refusal("poot.scatter", f"a 32-bit word store of {dt.dtype} slices of {elems} "
                      f"elements (a multiple of {K}: a target without 16-bit storage writes "
                      f"{K} a word, one thread a word)", str(op.location))
    em = KernelEmitter()
    se = ScalarEmitter(fn, em) if K is None else WordScalars(fn, em)
    items = elems if K is None else elems // K        # threads of a row: elements or words
    t = block_size(items, caps)
    ity = it.dtype.value
    em.line("%tid = gpu.thread_id x")
    em.line("%bid = gpu.block_id x")
    em.line("%n = gpu.block_id y")
    try:
        lin = se.iadd(se.imul("%bid", t), "%tid")
        guard = se.op(f"arith.cmpi ult, {se.ix(lin)}, {se.ix(items)} : index")
        em.line(f"scf.if {guard} {{")
        em.depth += 1
        with se.scope():
            e_idx = se.delinearize(lin, slice_shape) if slice_shape and K is None else []
            ok, cs, coords = None, [], []
            for j in range(r):
                c = se.value(indices, ["%n", j])
                lo = se.op(f"arith.cmpi sge, {c}, {em.const(0, ity)} : {ity}")
                hi = se.op(f"arith.cmpi slt, {c}, {em.const(dt.shape[j], ity)} : {ity}")
                both = se.op(f"arith.andi {lo}, {hi} : i1")
                ok = both if ok is None else se.op(f"arith.andi {ok}, {both} : i1")
                cs.append(c)
                coords.append(se.op(f"arith.index_cast {c} : {ity} to index"))
            # a later row at the same address wins: this row then writes nothing
            false = em.const(0, "i1")
            later = se.op(f"arith.addi %n, {se.ix(1)} : index")
            em.line(f"%later_dup = scf.for %m = {later} to {se.ix(n_rows)} step {se.ix(1)} "
                    f"iter_args(%dup = {false}) -> (i1) {{")
            em.depth += 1
            with se.scope():
                same = None
                for j in range(r):
                    eq = se.op(f"arith.cmpi eq, {se.value(indices, ['%m', j])}, {cs[j]} : "
                               f"{ity}")
                    same = eq if same is None else se.op(f"arith.andi {same}, {eq} : i1")
                em.line(f"%dup_next = arith.ori %dup, {same} : i1")
                em.line("scf.yield %dup_next : i1")
            em.depth -= 1
            em.line("}")
            keep = se.op(f"arith.xori %later_dup, {em.const(1, 'i1')} : i1")
            em.line(f"scf.if {se.op(f'arith.andi {ok}, {keep} : i1')} {{")
            em.depth += 1
            with se.scope():
                if K is None:
                    x = se.value(updates, ["%n"] + list(e_idx))
                    at = se.linearize(coords + list(e_idx), dt.shape)
                    se.store(x, "%out0", flat, [at])
                else:
                    store_word(se, updates, dt, coords, lin, slice_shape, K)
            em.depth -= 1
            em.line("}")
        em.depth -= 1
        em.line("}")
    except ScalarUnsupported:
        return None
    out_t = buffer_type(flat) if K is None else f"memref<{dt.numel // K}xi32>"
    text, slots = one_kernel_module("scatter", se, [("%out0", out_t)])
    copy = Launch("copy", [("arg", d_arg), ("out", 0)], nbytes=dt.nbytes)
    kern = Launch("kernel", slots, "scatter", "k", ((items + t - 1) // t, n_rows, 1),
                  (t, 1, 1), strategy="scatter")
    return Synthesized(text, [copy, kern], consts=list(se.consts))


def store_word(se: WordScalars, updates: ir.Value, dt: TensorType, coords: list,
               w: str, slice_shape, K: int) -> None:
    """Store word ``w`` (index) of row ``%n``'s slice at ``coords`` of destination ``dt``,
    whose ``K`` elements it holds (little-endian: element ``w * K`` in the low bits), into
    ``%out0`` read as i32 words."""
    em = se.em
    word = None
    for j in range(K):
        e = se.iadd(se.imul(w, K), j)
        x = se.value(updates, ["%n"] + (se.delinearize(e, slice_shape) if slice_shape else []))
        bits = se.word_bits(x, dt.dtype)
        if j:
            bits = se.op(f"arith.shli {bits}, {em.const(32 // K * j, 'i32')} : i32")
        word = bits if word is None else se.op(f"arith.ori {word}, {bits} : i32")
    r = len(coords)
    words = 1
    for s in slice_shape:
        words *= s
    at = se.iadd(se.imul(se.linearize(coords, dt.shape[:r]), words // K), w)
    em.line(f"memref.store {word}, %out0[{se.ix(at)}] : memref<{dt.numel // K}xi32>")


__all__ = ["WORD_ELEMS", "WordScalars", "f16_bits", "scatter", "store_word", "word_elems"]
