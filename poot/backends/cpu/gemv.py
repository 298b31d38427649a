"""The row-streaming matmul kernel: ``y[m, n] = sum_k x[m, k] * W[n, k]`` with ``W`` a weight
stored ``[N, K]`` row-major (the ``matmul(x, transpose(W))`` of every linear layer), read in
place -- dense (f32, or f16/bf16 widened in registers) or packed (Q4_0, Q4_1, Q8_0 blocks
decoded in registers from their stored bytes; no dequantized copy of the weight).

The CPU backend's :class:`~poot.dialects.lowering.rules.MatmulKernels` (:data:`KERNELS`, put
in the :class:`~poot.dialects.lowering.rules.Strategy` by
:func:`poot.backends.cpu.codegen.strategy_for`): the contraction rules try it first and it
takes the ops :func:`match` fits. The kernel, on tensors (one-shot bufferization makes it in place):

* rows ``n`` of W: ``scf.forall`` (threads, when the weight is big enough to pay for a
  fork/join) or ``scf.for``;
* inside a row, tiles of ``m_tile`` rows of x (decode M = 1: one tile; prefill: a loop of
  tiles, so each decoded row of W is reused from L1 by every row of x);
* the K loop walks 32-element chunks (one quant block): the chunk's 32 weights are decoded into
  two ``vector<16xf32>`` (f16 scales through ``vector.bitcast`` + ``extf``; nibbles with
  ``andi``/``shrui``), multiplied into two vector accumulators per x row with ``math.fma``,
  reduced once per row at the end (``vector.reduction``). A dense K that is not a multiple of
  32 finishes with one masked chunk (padding 0).

Results agree with the oracle (dequantize, then an f32 matmul) up to f32 summation order.
"""

from __future__ import annotations

from dataclasses import dataclass

from poot.dialects.lowering.contraction import clamped_index
from poot.dialects.lowering.emit import Emitter, tt
from poot.dialects.lowering.rules import OpInfo, Strategy
from poot.dialects.types import DType, PackedType, TensorType

#: declared functions standing for LLVM intrinsics: name -> (intrinsic, function type)
INTRINSIC_PREFIX = "__poot_intr_"
INTRINSICS: dict[str, tuple[str, str]] = {}


def intrinsic_declarations(text: str) -> str:
    """``func.func private`` declarations of the intrinsic stand-ins that ``text`` calls."""
    out = []
    for fn, (_, sig) in INTRINSICS.items():
        if f"@{fn}(" in text:
            out.append(f"func.func private @{fn}{sig.replace(') ->', ') -> ', 1)}")
    return "\n".join(out)


#: packed formats with a vector decoder here (others keep the portable lowering)
PACKED = ("q4_0", "q4_1", "q8_0")
CHUNK = 32  # K elements per step: one quant block
HALF_DTYPES = (DType.F16, DType.BF16)


@dataclass
class Gemv:
    """One matched ``x[M, K] @ W[N, K]^T``.

    Attributes:
        x: SSA name of x (tensor<MxKxf32>); w: SSA name of W (dense tensor, or the packed
        bytes ``tensor<NBYTESxi8>``); wtype: W's type (TensorType or PackedType); m, k, n: sizes.
    """

    x: str
    w: str
    wtype: object
    m: int
    k: int
    n: int
    #: an index SSA name added to every W row (rows ``row_base .. row_base + n`` of a
    #: weight holding ``total_rows``: one slab of :func:`emit_indexed`), or None
    row_base: str | None = None
    total_rows: int | None = None

    @property
    def packed(self) -> bool:
        return isinstance(self.wtype, PackedType)

    @property
    def weight_bytes(self) -> int:
        """Bytes of W this kernel streams (one slab's, for a slab)."""
        if self.packed:
            return self.wtype.nbytes * self.n // (self.total_rows or self.n)
        return self.n * self.k * self.wtype.dtype.itemsize


def _weight_source(t: OpInfo | None) -> tuple[str, object] | None:
    """(ssa, type) of the [N, K] weight behind ``transpose(W)``, looking through a dequantize
    of a supported format or a widening cast of a dense half tensor; None when not a weight
    read in place."""
    if t is None or t.name != "transpose" or tuple(t.attrs["perm"]) != (1, 0):
        return None
    src = t.producer(0)
    wt = t.types[0]
    if src is None:
        if isinstance(wt, TensorType) and (wt.dtype is DType.F32 or wt.dtype in HALF_DTYPES):
            return t.args[0], wt
        return None
    if src.name == "dequantize" and src.result.dtype is DType.F32:
        pt = src.types[0]
        if pt.format.name in PACKED and src.producer(0) is None:
            return src.args[0], pt
        return None
    if src.name == "cast" and src.producer(0) is None and src.result.dtype is DType.F32 and \
            src.types[0].dtype in HALF_DTYPES:
        return src.args[0], src.types[0]
    return None


def match(op: OpInfo) -> Gemv | None:
    """The kernel for a ``poot.matmul`` whose operands fit: 2-D, f32 x, f32 accumulation,
    rhs = transpose of a weight read in place."""
    at, bt = op.types
    if at.rank != 2 or bt.rank != 2 or at.dtype is not DType.F32 or op.attrs["acc"] is not DType.F32:
        return None
    rhs = op.producer(1)
    if rhs is not None and rhs.name == "cast" and rhs.result.dtype is DType.F32 and \
            rhs.types[0].dtype in HALF_DTYPES:
        # cast(transpose(W)): the same weight, widened after the view
        t = rhs.producer(0)
        src = _weight_source(t) if t is not None and t.producer(0) is None else None
    else:
        src = _weight_source(rhs)
    if src is None:
        return None
    m, k = at.shape
    n = bt.shape[1]
    if m == 0 or n == 0 or k == 0:
        return None
    return Gemv(op.args[0], src[0], src[1], m, k, n)


class _K:
    """Emission helpers for one kernel."""

    def __init__(self, em: Emitter, g: Gemv, s: Strategy):
        self.em, self.g, self.s = em, g, s
        self.vw = 16
        self.vf = f"vector<{self.vw}xf32>"
        #: bits of the quantized x (8 or 16) of the integer dot-product kernel, 0: f32 x
        self.bits = s.dot_bits if g.packed else 0
        self.quant = self.bits > 0
        # x rows x W rows per tile: the integer kernel keeps an accumulator per pair, at most
        # 8 pairs (16 registers with their scalar partners); decode (M = 1) takes n_tile W
        # rows, prefill m_tile x rows times what is left. The f32 kernel: one W row.
        self.mt = max(1, min(s.m_tile, g.m))
        nt = 1
        if self.quant:
            want = s.n_tile if g.m == 1 else max(1, 8 // self.mt)
            nt = next(t for t in (want, 4, 2, 1) if t <= want and g.n % t == 0)
        self.nt = nt
        self._consts: dict = {}

    def c(self, v: int) -> str:
        return self.em.const(v, "index")

    def wrow(self, row: str) -> str:
        """The stored W row of kernel row ``row`` (offset by the slab's first row)."""
        b = self.g.row_base
        return row if b is None else self.idx(f"arith.addi {row}, {b}")

    def idx(self, expr: str) -> str:
        return self.em.op(expr + " : index")

    def add(self, a: str, b) -> str:
        if isinstance(b, int):
            if b == 0:
                return a
            b = self.c(b)
        return self.idx(f"arith.addi {a}, {b}")

    def mul(self, a: str, b: int) -> str:
        return self.idx(f"arith.muli {a}, {self.c(b)}")

    def splat(self, v, ty: str, n: int | None = None) -> str:
        n = n or self.vw
        return self.em.op(f"arith.constant dense<{v}> : vector<{n}x{ty}>", "cv")

    # ---- reads ----
    def read_x(self, row: str, k: str, masked: bool) -> str:
        g, em = self.g, self.em
        pad = em.const(0.0, "f32")
        ib = "false" if masked else "true"
        return em.op(f"vector.transfer_read {g.x}[{row}, {k}], {pad} {{in_bounds = [{ib}]}} : "
                     f"tensor<{g.m}x{g.k}xf32>, {self.vf}")

    def read_bytes(self, off: str, n: int) -> str:
        g, em = self.g, self.em
        pad = em.const(0, "i8")
        return em.op(f"vector.transfer_read {g.w}[{off}], {pad} {{in_bounds = [true]}} : "
                     f"tensor<{g.wtype.nbytes}xi8>, vector<{n}xi8>")

    def scales(self, off: str, count: int) -> list[str]:
        """``count`` consecutive little-endian f16 at byte ``off``, as f32 splats."""
        em = self.em
        raw = self.read_bytes(off, 2 * count)
        h = em.op(f"vector.bitcast {raw} : vector<{2 * count}xi8> to vector<{count}xf16>")
        f = em.op(f"arith.extf {h} : vector<{count}xf16> to vector<{count}xf32>")
        out = []
        for i in range(count):
            x = em.op(f"vector.extract {f}[{i}] : f32 from vector<{count}xf32>")
            out.append(em.op(f"vector.broadcast {x} : f32 to {self.vf}"))
        return out

    def decode(self, row: str, b: str) -> tuple[str, str]:
        """Weights ``W[row, 32b : 32b + 32]`` as two vector<16xf32> (elements 0-15, 16-31)."""
        g, em, vf = self.g, self.em, self.vf
        if not g.packed:
            return self.dense(row, self.mul(b, CHUNK), False)
        fmt = g.wtype.format
        row_bytes = g.k // fmt.block_elems * fmt.block_bytes
        off = self.add(self.mul(self.wrow(row), row_bytes), self.mul(b, fmt.block_bytes))
        v16i8 = "vector<16xi8>"
        if fmt.name == "q8_0":
            (d,) = self.scales(off, 1)
            out = []
            for h in (0, 16):
                q = self.read_bytes(self.add(off, 2 + h), 16)
                qf = em.op(f"arith.sitofp {q} : {v16i8} to {vf}")
                out.append(em.op(f"arith.mulf {qf}, {d} : {vf}"))
            return out[0], out[1]
        qs_off = 2 if fmt.name == "q4_0" else 4
        sc = self.scales(off, 1 if fmt.name == "q4_0" else 2)
        q = self.read_bytes(self.add(off, qs_off), 16)
        lo = em.op(f"arith.andi {q}, {self.splat(15, 'i8', 16)} : {v16i8}")
        hi = em.op(f"arith.shrui {q}, {self.splat(4, 'i8', 16)} : {v16i8}")
        out = []
        for nib in (lo, hi):
            if fmt.name == "q4_0":
                qi = em.op(f"arith.subi {nib}, {self.splat(8, 'i8', 16)} : {v16i8}")
                qf = em.op(f"arith.sitofp {qi} : {v16i8} to {vf}")
                out.append(em.op(f"arith.mulf {qf}, {sc[0]} : {vf}"))
            else:
                qf = em.op(f"arith.uitofp {nib} : {v16i8} to {vf}")
                out.append(em.op(f"math.fma {qf}, {sc[0]}, {sc[1]} : {vf}"))
        return out[0], out[1]

    def dense(self, row: str, k: str, masked: bool) -> tuple[str, str | None]:
        """Dense ``W[row, k : k + 32]`` (masked: padded with 0 past K; the upper half is None
        when it lies wholly past K)."""
        g, em, vf = self.g, self.em, self.vf
        wt: TensorType = g.wtype
        ty = wt.dtype.value
        pad = em.const(0.0, ty)
        ib = "false" if masked else "true"
        out = []
        for h in (0, 16):
            if masked and h and self.tail <= 16:
                out.append(None)
                continue
            kk = self.add(k, h)
            v = em.op(f"vector.transfer_read {g.w}[{self.wrow(row)}, {kk}], {pad} "
                      f"{{in_bounds = [{ib}]}} : "
                      f"{tt(wt)}, vector<{self.vw}x{ty}>")
            if wt.dtype is not DType.F32:
                v = em.op(f"arith.extf {v} : vector<{self.vw}x{ty}> to {vf}")
            out.append(v)
        return out[0], out[1]

    # ---- the kernel ----
    def tile(self, row: str, m0: str, rows: int, dest: str, dest_t: str, col: str) -> str:
        """Rows ``m0 .. m0 + rows`` of x against row ``row`` of W: inserts the ``rows`` sums
        into ``dest`` (type ``dest_t``) at ``[m0 + i, col]``; returns the new ``dest``."""
        g, em, vf = self.g, self.em, self.vf
        nb = g.k // CHUNK
        self.tail = g.k % CHUNK
        zero = em.op(f"arith.constant dense<0.0> : {vf}", "cv")
        xrows = [self.add(m0, i) for i in range(rows)]
        accs = [zero] * (2 * rows)
        if nb:
            b = em.fresh("b")
            iters = [em.fresh("acc") for _ in accs]
            res = em.fresh("kl")
            c0, cnb, c1 = self.c(0), self.c(nb), self.c(1)
            em.line(f"{res}:{len(accs)} = scf.for {b} = {c0} to {cnb} step {c1} iter_args("
                    + ", ".join(f"{a} = {z}" for a, z in zip(iters, accs))
                    + f") -> ({', '.join([vf] * len(accs))}) {{")
            em.depth += 1
            wlo, whi = self.decode(row, b)
            k = self.mul(b, CHUNK)
            k16 = self.add(k, 16)
            new = []
            for i, xr in enumerate(xrows):
                xlo, xhi = self.read_x(xr, k, False), self.read_x(xr, k16, False)
                new.append(em.op(f"math.fma {wlo}, {xlo}, {iters[2 * i]} : {vf}"))
                new.append(em.op(f"math.fma {whi}, {xhi}, {iters[2 * i + 1]} : {vf}"))
            em.line(f"scf.yield {', '.join(new)} : {', '.join([vf] * len(new))}")
            em.depth -= 1
            em.line("}")
            accs = [f"{res}#{i}" for i in range(len(accs))]
        if self.tail:  # dense only: one masked chunk
            k = self.c(nb * CHUNK)
            wlo, whi = self.dense(row, k, True)
            for i, xr in enumerate(xrows):
                accs[2 * i] = em.op(f"math.fma {wlo}, {self.read_x(xr, k, True)}, "
                                    f"{accs[2 * i]} : {vf}")
                if whi is not None:
                    xhi = self.read_x(xr, self.add(k, 16), True)
                    accs[2 * i + 1] = em.op(f"math.fma {whi}, {xhi}, {accs[2 * i + 1]} : {vf}")
        for i, xr in enumerate(xrows):
            both = em.op(f"arith.addf {accs[2 * i]}, {accs[2 * i + 1]} : {vf}")
            s = em.op(f"vector.reduction <add>, {both} : {vf} into f32")
            dest = em.op(f"tensor.insert {s} into {dest}[{xr}, {col}] : {dest_t}")
        return dest

    def rows(self, wrows: list[str], dest: str, dest_t: str, cols: list[str]) -> str:
        """All rows of x against the W rows ``wrows`` (one, except on the integer path), in
        tiles of ``m_tile`` x rows; results go to ``dest[:, cols[j]]``."""
        em, g = self.em, self.g
        mt = self.mt

        def tile(m0: str, rows: int, d: str) -> str:
            if self.quant:
                return self.tile_int(wrows, m0, rows, d, dest_t, cols)
            return self.tile(wrows[0], m0, rows, d, dest_t, cols[0])

        full, rest = divmod(g.m, mt)
        if full == 1:
            dest = tile(self.c(0), mt, dest)
        elif full > 1:
            t, acc, res = em.fresh("t"), em.fresh("d"), em.fresh("ml")
            em.line(f"{res} = scf.for {t} = {self.c(0)} to {self.c(full)} step {self.c(1)} "
                    f"iter_args({acc} = {dest}) -> ({dest_t}) {{")
            em.depth += 1
            em.line(f"scf.yield {tile(self.mul(t, mt), mt, acc)} : {dest_t}")
            em.depth -= 1
            em.line("}")
            dest = res
        if rest:
            dest = tile(self.c(full * mt), rest, dest)
        return dest

    # ---- integer dot products (x quantized per 32-block to int8, as llama.cpp, or int16) ----
    def quantize_x(self) -> None:
        """x quantized per 32-element block to ``self.bits`` signed bits: ``xq``
        (tensor<MxKxi8> or tensor<MxKxi16>), the block scales ``xd`` (amax / qmax, qmax =
        127 or 32767) and ``xs`` (scale * sum of the block's integers), tensor<MxNBxf32>."""
        em, g, vf = self.em, self.g, self.vf
        nb = g.k // CHUNK
        qt = f"i{self.bits}"
        tq, tf = f"tensor<{g.m}x{g.k}x{qt}>", f"tensor<{g.m}x{nb}xf32>"
        inits = [em.op(f"tensor.empty() : {t}", "e") for t in (tq, tf, tf)]
        m, res = em.fresh("qm"), em.fresh("xq")
        its = [em.fresh("qi") for _ in inits]
        em.line(f"{res}:3 = scf.for {m} = {self.c(0)} to {self.c(g.m)} step {self.c(1)} "
                f"iter_args({', '.join(f'{a} = {b}' for a, b in zip(its, inits))}) -> "
                f"({tq}, {tf}, {tf}) {{")
        em.depth += 1
        b, res2 = em.fresh("qb"), em.fresh("xqb")
        its2 = [em.fresh("qj") for _ in inits]
        em.line(f"{res2}:3 = scf.for {b} = {self.c(0)} to {self.c(nb)} step {self.c(1)} "
                f"iter_args({', '.join(f'{a} = {b_}' for a, b_ in zip(its2, its))}) -> "
                f"({tq}, {tf}, {tf}) {{")
        em.depth += 1
        k = self.mul(b, CHUNK)
        v = [self.read_x(m, k, False), self.read_x(m, self.add(k, 16), False)]
        a = [em.op(f"math.absf {x} : {vf}") for x in v]
        mx = em.op(f"arith.maximumf {a[0]}, {a[1]} : {vf}")
        amax = em.op(f"vector.reduction <maximumf>, {mx} : {vf} into f32")
        cmax = em.const(float((1 << (self.bits - 1)) - 1), "f32")
        dx = em.op(f"arith.divf {amax}, {cmax} : f32")
        nz = em.op(f"arith.cmpf ogt, {amax}, {em.const(0.0, 'f32')} : f32")
        inv = em.op(f"arith.select {nz}, {em.op(f'arith.divf {cmax}, {amax} : f32')}, "
                    f"{em.const(0.0, 'f32')} : f32")
        invv = em.op(f"vector.broadcast {inv} : f32 to {vf}")
        q = []
        for x in v:
            r = em.op(f"math.roundeven {em.op(f'arith.mulf {x}, {invv} : {vf}')} : {vf}")
            q.append(em.op(f"arith.fptosi {r} : {vf} to vector<16x{qt}>"))
        idx = ", ".join(str(i) for i in range(32))
        qq = em.op(f"vector.shuffle {q[0]}, {q[1]} [{idx}] : vector<16x{qt}>, vector<16x{qt}>")
        wide = em.op(f"arith.extsi {qq} : vector<32x{qt}> to vector<32xi32>")
        qsum = em.op(f"vector.reduction <add>, {wide} : vector<32xi32> into i32")
        xs = em.op(f"arith.mulf {em.op(f'arith.sitofp {qsum} : i32 to f32')}, {dx} : f32")
        n0 = em.op(f"vector.transfer_write {qq}, {its2[0]}[{m}, {k}] {{in_bounds = [true]}} : "
                   f"vector<32x{qt}>, {tq}")
        n1 = em.op(f"tensor.insert {dx} into {its2[1]}[{m}, {b}] : {tf}")
        n2 = em.op(f"tensor.insert {xs} into {its2[2]}[{m}, {b}] : {tf}")
        em.line(f"scf.yield {n0}, {n1}, {n2} : {tq}, {tf}, {tf}")
        em.depth -= 1
        em.line("}")
        em.line(f"scf.yield {res2}#0, {res2}#1, {res2}#2 : {tq}, {tf}, {tf}")
        em.depth -= 1
        em.line("}")
        self.xq, self.xd, self.xs = f"{res}#0", f"{res}#1", f"{res}#2"
        self.tq, self.tf = tq, tf

    def _intr(self, name: str, args: list[str], ins: str, out: str) -> str:
        """An LLVM intrinsic, spelled as a call of a declared function ``@__poot_intr_<name>``
        (bufferization refuses ``llvm.call_intrinsic``, whose memory effects it cannot see);
        the backend turns the calls into intrinsics after bufferization
        (:func:`intrinsic_declarations`, :data:`INTRINSIC_PREFIX`)."""
        fn = INTRINSIC_PREFIX + name.replace(".", "_")
        INTRINSICS[fn] = (name, f"({ins}) -> {out}")
        return self.em.op(f"func.call @{fn}({', '.join(args)}) : ({ins}) -> {out}")

    def _dot_i8(self, wu: str, xq: str) -> str:
        """``sum(wu[4l:4l+4] * xq[4l:4l+4])`` per i32 lane ``l`` (vector<8xi32>): unsigned
        weight bytes times signed x bytes; AVX-VNNI / AVX512-VNNI ``vpdpbusd`` in one
        instruction, else AVX2 ``pmaddubsw`` (pairs to i16) and ``pmaddwd`` by ones (to i32).
        The i16 pairs cannot saturate: weights are at most 15 (4-bit) or 127 (|q8|)."""
        em, v32i8 = self.em, "vector<32xi8>"
        if self.s.vnni:
            zero = em.op("arith.constant dense<0> : vector<8xi32>", "cv")
            return self._intr("llvm.x86.avx512.vpdpbusd.256", [zero, wu, xq],
                              f"vector<8xi32>, {v32i8}, {v32i8}", "vector<8xi32>")
        p16 = self._intr("llvm.x86.avx2.pmadd.ub.sw", [wu, xq], f"{v32i8}, {v32i8}",
                         "vector<16xi16>")
        return self._intr("llvm.x86.avx2.pmadd.wd", [p16, self.splat(1, "i16", 16)],
                          "vector<16xi16>, vector<16xi16>", "vector<8xi32>")

    def _dot_i16(self, w: tuple[str, ...], x: tuple[str, ...]) -> str:
        """``sum(w[h][2l:2l+2] * x[h][2l:2l+2])`` over both halves ``h`` per i32 lane ``l``
        (vector<8xi32>) of two vector<16xi16> pairs: AVX-VNNI / AVX512-VNNI ``vpdpwssd``
        (the second accumulating onto the first), else AVX2 ``pmaddwd`` twice and an add.
        Exact: |w| <= 127 and |x| <= 32767, so a block's sum stays below 2^28.

        Measured against two alternatives on a Zen 4 (single Q4_1 GEMVs, 1536x576 and
        576x1536, thread CPU time): one 512-bit ``vpdpwssd`` per block (16-lane
        accumulators) took 1.2x the time of this; splitting x = 256 h + l into bytes and
        taking two ``vpdpbusd`` on the unwidened nibbles (``(q.h << 8) + l.q``) 1.06x."""
        em, v16 = self.em, "vector<16xi16>"
        if self.s.vnni:
            acc = em.op("arith.constant dense<0> : vector<8xi32>", "cv")
            for wh, xh in zip(w, x):
                acc = self._intr("llvm.x86.avx512.vpdpwssd.256", [acc, wh, xh],
                                 f"vector<8xi32>, {v16}, {v16}", "vector<8xi32>")
            return acc
        p = [self._intr("llvm.x86.avx2.pmadd.wd", [wh, xh], f"{v16}, {v16}", "vector<8xi32>")
             for wh, xh in zip(w, x)]
        return em.op(f"arith.addi {p[0]}, {p[1]} : vector<8xi32>")

    def _weights_int(self, off: str) -> tuple[str, str | None, object]:
        """The block of one W row at byte ``off`` for the integer kernel: (scale d, the
        scalar term's weight m or None, integer weights). The weights: for int8 x, (unsigned
        bytes, signed bytes or None) as vector<32xi8> (Q8_0: |w| and w for the sign trick);
        for int16 x, two vector<16xi16> halves (zero- or sign-extended). Q4_0's ``q - 8``
        goes to the scalar side as m = -8 d (times the block's scale * sum of x)."""
        em, fmt = self.em, self.g.wtype.format
        nsc = 2 if fmt.name == "q4_1" else 1
        raw = self.read_bytes(off, 2 * nsc)
        h = em.op(f"vector.bitcast {raw} : vector<{2 * nsc}xi8> to vector<{nsc}xf16>")
        f = em.op(f"arith.extf {h} : vector<{nsc}xf16> to vector<{nsc}xf32>")
        dw = em.op(f"vector.extract {f}[0] : f32 from vector<{nsc}xf32>")
        mw = em.op(f"vector.extract {f}[1] : f32 from vector<{nsc}xf32>") if nsc == 2 else None
        v16i8, v16i16, v32i8 = "vector<16xi8>", "vector<16xi16>", "vector<32xi8>"
        if fmt.name == "q8_0":
            if self.bits == 16:
                halves = [self.read_bytes(self.add(off, 2 + h), 16) for h in (0, 16)]
                return dw, None, tuple(em.op(f"arith.extsi {q} : {v16i8} to {v16i16}")
                                       for q in halves)
            w = self.read_bytes(self.add(off, 2), 32)
            return dw, None, (em.op(f"math.absi {w} : {v32i8}"), w)
        q = self.read_bytes(self.add(off, 2 if fmt.name == "q4_0" else 4), 16)
        lo = em.op(f"arith.andi {q}, {self.splat(15, 'i8', 16)} : {v16i8}")
        hi = em.op(f"arith.shrui {q}, {self.splat(4, 'i8', 16)} : {v16i8}")
        if mw is None:
            mw = em.op(f"arith.mulf {dw}, {em.const(-8.0, 'f32')} : f32")
        if self.bits == 16:
            return dw, mw, tuple(em.op(f"arith.extui {n} : {v16i8} to {v16i16}")
                                 for n in (lo, hi))
        idx = ", ".join(str(i) for i in range(32))
        wu = em.op(f"vector.shuffle {lo}, {hi} [{idx}] : {v16i8}, {v16i8}")
        return dw, mw, (wu, None)

    def _x_int(self, xr: str, b: str):
        """Row ``xr``'s quantized block ``b``: vector<32xi8> (int8 x) or two vector<16xi16>
        halves (int16 x)."""
        em, pad = self.em, self.em.const(0, f"i{self.bits}")
        k = self.mul(b, CHUNK)
        if self.bits == 8:
            return em.op(f"vector.transfer_read {self.xq}[{xr}, {k}], {pad} "
                         f"{{in_bounds = [true]}} : {self.tq}, vector<32xi8>")
        return tuple(em.op(f"vector.transfer_read {self.xq}[{xr}, {self.add(k, h)}], {pad} "
                           f"{{in_bounds = [true]}} : {self.tq}, vector<16xi16>")
                     for h in (0, 16))

    def _dot(self, w, xq) -> str:
        """One block's integer dot product per i32 lane (vector<8xi32>) of the decoded
        weights ``w`` (:meth:`_weights_int`) and the x block ``xq`` (:meth:`_x_int`)."""
        if self.bits == 16:
            return self._dot_i16(w, xq)
        wu, wsigned = w
        if wsigned is not None:  # q8_0: |w| * (x * sign(w))
            v32i8 = "vector<32xi8>"
            xq = self._intr("llvm.x86.avx2.psign.b", [xq, wsigned], f"{v32i8}, {v32i8}", v32i8)
        return self._dot_i8(wu, xq)

    def tile_int(self, wrows: list[str], m0: str, rows: int, dest: str, dest_t: str,
                  cols: list[str]) -> str:
        """Rows ``m0 .. m0 + rows`` of the quantized x against the W rows ``wrows``: one K
        loop whose body decodes each W row's block once and reads each x row's block once,
        with an independent accumulator per (x row, W row) pair (the FMA chains overlap);
        inserts the sums into ``dest`` at ``[m0 + i, cols[j]]``."""
        g, em = self.g, self.em
        fmt = g.wtype.format
        nb = g.k // CHUNK
        v8, vi = "vector<8xf32>", "vector<8xi32>"
        row_bytes = nb * fmt.block_bytes
        xrows = [self.add(m0, i) for i in range(rows)]
        pairs = [(i, j) for i in range(rows) for j in range(len(wrows))]
        zero_v = em.op(f"arith.constant dense<0.0> : {v8}", "cv")
        zero_s = em.const(0.0, "f32")
        inits = [zero_v, zero_s] * len(pairs)
        types = [v8, "f32"] * len(pairs)
        b, res = em.fresh("b"), em.fresh("kl")
        its = [em.fresh("acc") for _ in inits]
        em.line(f"{res}:{len(its)} = scf.for {b} = {self.c(0)} to {self.c(nb)} step {self.c(1)} "
                f"iter_args({', '.join(f'{a} = {z}' for a, z in zip(its, inits))}) -> "
                f"({', '.join(types)}) {{")
        em.depth += 1
        boff = self.mul(b, fmt.block_bytes)
        ws = [self._weights_int(self.add(self.mul(self.wrow(wr), row_bytes), boff))
              for wr in wrows]
        xs = []  # per x row: (quantized block, scale, scale * sum of the block)
        for xr in xrows:
            dx = em.op(f"tensor.extract {self.xd}[{xr}, {b}] : {self.tf}")
            sx = None if fmt.name == "q8_0" else \
                em.op(f"tensor.extract {self.xs}[{xr}, {b}] : {self.tf}")
            xs.append((self._x_int(xr, b), dx, sx))
        new = []
        for p, (i, j) in enumerate(pairs):
            dw, mw, w = ws[j]
            xq, dx, sx = xs[i]
            fd = em.op(f"arith.sitofp {self._dot(w, xq)} : {vi} to {v8}")
            sc = em.op(f"vector.broadcast {em.op(f'arith.mulf {dw}, {dx} : f32')} : f32 to {v8}")
            new.append(em.op(f"math.fma {fd}, {sc}, {its[2 * p]} : {v8}"))
            acc_s = its[2 * p + 1]
            if mw is not None:
                acc_s = em.op(f"math.fma {mw}, {sx}, {acc_s} : f32")
            new.append(acc_s)
        em.line(f"scf.yield {', '.join(new)} : {', '.join(types)}")
        em.depth -= 1
        em.line("}")
        for p, (i, j) in enumerate(pairs):
            r = em.op(f"vector.reduction <add>, {res}#{2 * p} : {v8} into f32")
            r = em.op(f"arith.addf {r}, {res}#{2 * p + 1} : f32")
            dest = em.op(f"tensor.insert {r} into {dest}[{xrows[i]}, {cols[j]}] : {dest_t}")
        return dest

    def emit(self) -> str:
        em, g = self.em, self.g
        if self.quant:
            self.quantize_x()
        nt = self.nt
        out_t = f"tensor<{g.m}x{g.n}xf32>"
        init = em.op(f"tensor.empty() : {out_t}", "e")
        n, res = em.fresh("n"), em.fresh("gemv")
        o = em.fresh("o")
        if self.s.cores > 1 and g.n > nt and g.weight_bytes >= self.s.parallel_min_bytes:
            em.line(f"{res} = scf.forall ({n}) in ({g.n // nt}) shared_outs({o} = {init}) -> "
                    f"({out_t}) {{")
            em.depth += 1
            base = self.mul(n, nt)
            col_t = f"tensor<{g.m}x{nt}xf32>"
            sl = em.op(f"tensor.extract_slice {o}[0, {base}] [{g.m}, {nt}] [1, 1] : {out_t} to "
                       f"{col_t}")
            sl = self.rows([self.add(base, j) for j in range(nt)], sl, col_t,
                           [self.c(j) for j in range(nt)])
            em.line("scf.forall.in_parallel {")
            em.line(f"  tensor.parallel_insert_slice {sl} into {o}[0, {base}] [{g.m}, {nt}] "
                    f"[1, 1] : {col_t} into {out_t}")
            em.line("}")
            em.depth -= 1
            em.line("}")
        else:
            em.line(f"{res} = scf.for {n} = {self.c(0)} to {self.c(g.n // nt)} step {self.c(1)} "
                    f"iter_args({o} = {init}) -> ({out_t}) {{")
            em.depth += 1
            base = self.mul(n, nt)
            wrows = [self.add(base, j) for j in range(nt)]
            em.line(f"scf.yield {self.rows(wrows, o, out_t, wrows)} : {out_t}")
            em.depth -= 1
            em.line("}")
        return res


def emit(em: Emitter, g: Gemv, strategy: Strategy) -> str:
    """Emit the kernel; returns the SSA name of its ``tensor<MxNxf32>`` result."""
    return _K(em, g, strategy).emit()


def emit_indexed(em: Emitter, op: OpInfo, src: tuple) -> str | None:
    """``poot.indexed_matmul`` (row t of x against slab ``idx[t]`` of w, w read in place as
    ``src`` = (ssa, type, producer)): a loop over the T rows, each running the kernel over its
    slab's O rows at the slab's offset, so only the selected slabs are read. None, emitting
    nothing, for a packed format without a decoder here, a non-f32 x or an empty shape."""
    x, _w, idx = op.args
    xt, wt, it = op.types
    T, K = xt.shape
    E, O, _ = wt.shape
    w, wtype, _ = src
    if isinstance(wtype, PackedType) and wtype.format.name not in PACKED or \
            xt.dtype is not DType.F32 or not (T and O and K):
        return None
    if isinstance(wtype, TensorType):           # dense [E, O, K] -> [E * O, K] rows
        flat = TensorType((E * O, K), wtype.dtype)
        w = em.op(f"tensor.collapse_shape {w} [[0, 1], [2]] : {tt(wtype)} into {tt(flat)}")
        wtype = flat
    out_t = tt(op.result)
    init = em.empty(op.result)
    t, res, acc = em.fresh("t"), em.fresh("im"), em.fresh("acc")
    c0, c1, cT = (em.const(v, "index") for v in (0, 1, T))
    em.line(f"{res} = scf.for {t} = {c0} to {cT} step {c1} iter_args({acc} = {init}) -> "
            f"({out_t}) {{")
    em.depth += 1
    raw = em.op(f"tensor.extract {idx}[{t}] : {tt(it)}")
    e = clamped_index(em, raw, it.dtype, E)
    base = em.op(f"arith.muli {e}, {em.const(O, 'index')} : index")
    row_t = f"tensor<1x{K}xf32>"
    xr = em.op(f"tensor.extract_slice {x}[{t}, 0] [1, {K}] [1, 1] : {tt(xt)} to {row_t}")
    g = Gemv(xr, w, wtype, 1, K, O, row_base=base, total_rows=E * O)
    y = emit(em, g, op.strategy)
    nxt = em.op(f"tensor.insert_slice {y} into {acc}[{t}, 0] [1, {O}] [1, 1] : "
                f"tensor<1x{O}xf32> into {out_t}")
    em.line(f"scf.yield {nxt} : {out_t}")
    em.depth -= 1
    em.line("}")
    return res


class GemvKernels:
    """The row-streaming kernels as the lowering's
    :class:`~poot.dialects.lowering.rules.MatmulKernels`."""

    def matmul(self, em: Emitter, op: OpInfo) -> str | None:
        kernel = match(op)
        return emit(em, kernel, op.strategy) if kernel is not None else None

    def indexed_matmul(self, em: Emitter, op: OpInfo, weight: tuple) -> str | None:
        return emit_indexed(em, op, weight)

    def declarations(self, text: str) -> str:
        return intrinsic_declarations(text)


#: what the CPU backend's strategies carry (:func:`poot.backends.cpu.codegen.strategy_for`)
KERNELS = GemvKernels()


__all__ = ["Gemv", "GemvKernels", "INTRINSICS", "INTRINSIC_PREFIX", "KERNELS", "PACKED", "emit",
           "emit_indexed", "intrinsic_declarations", "match"]
