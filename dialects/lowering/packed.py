"""Lowering of ``poot.dequantize``: a ``linalg.generic`` over the logical result that reads the
packed bytes (a ``tensor<NBYTESxi8>`` function argument) at its block's offset.

Element ``e`` (row-major over the logical shape) lives in block ``e / block_elems`` at byte
``block * block_bytes``; f16 scales are two little-endian bytes joined into an i16 word and
``arith.bitcast`` to f16. Arithmetic is f32 in ggml's order (``q * d``, ``q * d + m``), so the
result equals :mod:`poot.dialects.quant_ref` exactly. Formats with a decoder here: Q4_0, Q4_1,
Q5_0, Q5_1, Q8_0. K-quants are a typed refusal.
"""

from __future__ import annotations

from poot.dialects.lowering.emit import Emitter
from poot.dialects.lowering.rules import OpInfo, rule
from poot.dialects.types import DType


class _Block:
    """Reads inside one block of the packed bytes ``w`` starting at index ``base``."""

    def __init__(self, em: Emitter, w: str, nbytes: int, base: str):
        self.em, self.w, self.ty, self.base = em, w, f"tensor<{nbytes}xi8>", base

    def _at(self, off) -> str:
        em = self.em
        off = em.const(off, "index") if isinstance(off, int) else off
        return em.op(f"arith.addi {self.base}, {off} : index")

    def byte(self, off) -> str:
        """The i8 at ``base + off`` (``off``: int or index SSA)."""
        return self.em.op(f"tensor.extract {self.w}[{self._at(off)}] : {self.ty}")

    def ubyte32(self, off) -> str:
        """The byte at ``base + off`` zero-extended to i32."""
        return self.em.op(f"arith.extui {self.byte(off)} : i8 to i32")

    def f16(self, off: int) -> str:
        """The little-endian f16 at ``base + off``, as f32."""
        em = self.em
        lo = em.op(f"arith.extui {self.byte(off)} : i8 to i16")
        hi = em.op(f"arith.extui {self.byte(off + 1)} : i8 to i16")
        hi = em.op(f"arith.shli {hi}, {em.const(8, 'i16')} : i16")
        word = em.op(f"arith.ori {lo}, {hi} : i16")
        h = em.op(f"arith.bitcast {word} : i16 to f16")
        return em.op(f"arith.extf {h} : f16 to f32")


def _nibble(em: Emitter, blk: _Block, qs_off: int, j: str, j32: str) -> str:
    """4-bit value of element j: low nibble of qs[j % 16] for j < 16, else the high nibble."""
    pos = em.op(f"arith.remui {j}, {em.const(16, 'index')} : index")
    q = blk.ubyte32(em.op(f"arith.addi {pos}, {em.const(qs_off, 'index')} : index"))
    half = em.op(f"arith.divui {j32}, {em.const(16, 'i32')} : i32")
    shift = em.op(f"arith.muli {half}, {em.const(4, 'i32')} : i32")
    shifted = em.op(f"arith.shrui {q}, {shift} : i32")
    return em.op(f"arith.andi {shifted}, {em.const(15, 'i32')} : i32")


def _high_bit(em: Emitter, blk: _Block, qh_off: int, j: str, j32: str) -> str:
    """Bit j of the little-endian u32 at qh_off, moved to bit 4."""
    pos = em.op(f"arith.divui {j}, {em.const(8, 'index')} : index")
    byte = blk.ubyte32(em.op(f"arith.addi {pos}, {em.const(qh_off, 'index')} : index"))
    bit = em.op(f"arith.remui {j32}, {em.const(8, 'i32')} : i32")
    shifted = em.op(f"arith.shrui {byte}, {bit} : i32")
    b = em.op(f"arith.andi {shifted}, {em.const(1, 'i32')} : i32")
    return em.op(f"arith.shli {b}, {em.const(4, 'i32')} : i32")


def _tof(em: Emitter, q: str) -> str:
    return em.op(f"arith.sitofp {q} : i32 to f32")


def _q8_0(em, blk, j, j32):
    d = blk.f16(0)
    pos = em.op(f"arith.addi {j}, {em.const(2, 'index')} : index")
    q = em.op(f"arith.sitofp {blk.byte(pos)} : i8 to f32")
    return em.op(f"arith.mulf {q}, {d} : f32")


def _q4_0(em, blk, j, j32):
    d = blk.f16(0)
    q = em.op(f"arith.subi {_nibble(em, blk, 2, j, j32)}, {em.const(8, 'i32')} : i32")
    return em.op(f"arith.mulf {_tof(em, q)}, {d} : f32")


def _affine(em, q, d, m):
    qd = em.op(f"arith.mulf {_tof(em, q)}, {d} : f32")
    return em.op(f"arith.addf {qd}, {m} : f32")


def _q4_1(em, blk, j, j32):
    d, m = blk.f16(0), blk.f16(2)
    return _affine(em, _nibble(em, blk, 4, j, j32), d, m)


def _q5_0(em, blk, j, j32):
    d = blk.f16(0)
    q = em.op(f"arith.ori {_nibble(em, blk, 6, j, j32)}, {_high_bit(em, blk, 2, j, j32)} : i32")
    q = em.op(f"arith.subi {q}, {em.const(16, 'i32')} : i32")
    return em.op(f"arith.mulf {_tof(em, q)}, {d} : f32")


def _q5_1(em, blk, j, j32):
    d, m = blk.f16(0), blk.f16(2)
    q = em.op(f"arith.ori {_nibble(em, blk, 8, j, j32)}, {_high_bit(em, blk, 4, j, j32)} : i32")
    return _affine(em, q, d, m)


DECODERS = {"q8_0": _q8_0, "q4_0": _q4_0, "q4_1": _q4_1, "q5_0": _q5_0, "q5_1": _q5_1}


@rule("dequantize")
def lower_dequantize(em: Emitter, op: OpInfo) -> str:
    pt, out = op.types[0], op.result
    fmt = pt.format
    decode = DECODERS.get(fmt.name)
    if decode is None:
        op.refuse(f"no in-kernel decoder for packed format {fmt.name}")
    strides, s = [], 1
    for d in reversed(pt.shape):
        strides.append(s)
        s *= d
    strides.reverse()

    def body(_a, _o):
        e = None
        for i, st in enumerate(strides):
            term = em.op(f"linalg.index {i} : index")
            if st != 1:
                term = em.op(f"arith.muli {term}, {em.const(st, 'index')} : index")
            e = term if e is None else em.op(f"arith.addi {e}, {term} : index")
        nel = em.const(fmt.block_elems, "index")
        block = em.op(f"arith.divui {e}, {nel} : index")
        j = em.op(f"arith.remui {e}, {nel} : index")
        j32 = em.op(f"arith.index_cast {j} : index to i32")
        base = em.op(f"arith.muli {block}, {em.const(fmt.block_bytes, 'index')} : index")
        x = decode(em, _Block(em, op.args[0], pt.nbytes, base), j, j32)
        if out.dtype is DType.F32:
            return x
        return em.op(f"arith.truncf {x} : f32 to {out.dtype.value}")

    return em.generic(out, [], body)
