"""Lowering of ``poot.dequantize``: a ``linalg.generic`` over the logical result that reads the
packed bytes (a ``tensor<NBYTESxi8>`` function argument) at its block's offset.

Element ``e`` (row-major over the logical shape) lives in block ``e / block_elems`` at byte
``block * block_bytes``; f16 scales are two little-endian bytes joined into an i16 word and
``arith.bitcast`` to f16. Arithmetic is f32 in ggml's order (``q * d``, ``q * d + m``), so the
result equals :mod:`poot.dialects.quant_ref` exactly. Formats with a decoder here: Q4_0, Q4_1,
Q5_0, Q5_1, Q8_0 and the K-quants Q4_K, Q5_K, Q6_K, and the row-interleaved Q4_0 / Q4_1 / Q8_0
(:mod:`poot.dialects.quant_layout`: the same decoders over their block's scattered bytes); a
format without one is a typed refusal.
"""

from __future__ import annotations

from poot.dialects.lowering.emit import Emitter
from poot.dialects.quant_layout import scale_bytes
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


class _InterleavedBlock(_Block):
    """Reads inside one block of a row-interleaved weight (:mod:`poot.dialects.quant_layout`):
    ggml's block-relative offsets mapped to where the layout keeps those bytes, for row
    ``jr`` (index SSA) of the tile block at ``base``. ``scale`` bytes of f16 scales (and
    min) lead a ggml block; offset ``o < scale`` lives at ``base + 32 (o / 2) + 2 jr + o % 2``,
    nibble byte ``p = o - scale`` at ``base + 16 scale + 64 (p / 4) + 4 jr + p % 4``."""

    def __init__(self, em: Emitter, w: str, nbytes: int, base: str, jr: str, scale: int):
        super().__init__(em, w, nbytes, base)
        self.jr, self.scale = jr, scale

    def _at(self, off) -> str:
        em = self.em

        def c(v: int) -> str:
            return em.const(v, "index")

        def op(name: str, a: str, b: str) -> str:
            return em.op(f"arith.{name} {a}, {b} : index")

        if isinstance(off, int) and off < self.scale:
            jr2 = op("muli", self.jr, c(2))
            return op("addi", self.base, op("addi", jr2, c(32 * (off // 2) + off % 2)))
        p = c(off - self.scale) if isinstance(off, int) else op("subi", off, c(self.scale))
        at = op("addi", op("muli", op("divui", p, c(4)), c(64)), op("remui", p, c(4)))
        at = op("addi", at, op("muli", self.jr, c(4)))
        return op("addi", self.base, op("addi", at, c(16 * self.scale)))


def _block_at(em: Emitter, pt, w: str, e: str) -> tuple[_Block, str, str]:
    """The block holding element ``e`` (row-major index over ``pt``'s logical shape) of the
    packed weight ``w``, the element's index in it and that index as i32."""
    fmt = pt.format
    nel = em.const(fmt.block_elems, "index")
    j = em.op(f"arith.remui {e}, {nel} : index")
    j32 = em.op(f"arith.index_cast {j} : index to i32")
    if fmt.rows == 1:
        block = em.op(f"arith.divui {e}, {nel} : index")
        base = em.op(f"arith.muli {block}, {em.const(fmt.block_bytes, 'index')} : index")
        return _Block(em, w, pt.nbytes, base), j, j32
    def op(name: str, a: str, v: int) -> str:
        return em.op(f"arith.{name} {a}, {em.const(v, 'index')} : index")

    k = pt.shape[-1]
    n, kk = op("divui", e, k), op("remui", e, k)
    tile = em.op(f"arith.addi {op('muli', op('divui', n, fmt.rows), k // fmt.block_elems)}, "
                 f"{op('divui', kk, fmt.block_elems)} : index")
    base = op("muli", tile, fmt.rows * fmt.block_bytes)
    return (_InterleavedBlock(em, w, pt.nbytes, base, op("remui", n, fmt.rows),
                              scale_bytes(fmt)), j, j32)


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


# ---- K-quants: 256-element super-blocks with per-sub-block scales ----------------------------


def _c(em: Emitter, name: str, a: str, k: int, ty: str = "index") -> str:
    """``arith.<name> a, k`` with a constant right operand."""
    return em.op(f"arith.{name} {a}, {em.const(k, ty)} : {ty}")


def _add(em: Emitter, a: str, b: str, ty: str = "index") -> str:
    return em.op(f"arith.addi {a}, {b} : {ty}")


def _i32(em: Emitter, ix: str) -> str:
    return em.op(f"arith.index_cast {ix} : index to i32")


def _k_scale_min(em: Emitter, blk: _Block, s: str) -> tuple[str, str]:
    """ggml ``get_scale_min_k4`` for sub-block ``s`` (0..7) of the 12 scale bytes at 4: 6-bit
    scale and min, as i32. s < 4: scales[s] & 63, scales[s+4] & 63; s >= 4: low nibble / high
    nibble of scales[s+4] with the top two bits of scales[s-4] / scales[s]."""
    s4 = _c(em, "remui", s, 4)  # s for s < 4, s - 4 for s >= 4
    a = blk.ubyte32(_c(em, "addi", s4, 4))   # scales[s4]
    b = blk.ubyte32(_c(em, "addi", s4, 8))   # scales[s4 + 4]
    c = blk.ubyte32(_c(em, "addi", s4, 12))  # scales[s4 + 8]
    lo_sc, lo_m = _c(em, "andi", a, 63, "i32"), _c(em, "andi", b, 63, "i32")
    top_a = _c(em, "shli", _c(em, "shrui", a, 6, "i32"), 4, "i32")
    top_b = _c(em, "shli", _c(em, "shrui", b, 6, "i32"), 4, "i32")
    hi_sc = em.op(f"arith.ori {_c(em, 'andi', c, 15, 'i32')}, {top_a} : i32")
    hi_m = em.op(f"arith.ori {_c(em, 'shrui', c, 4, 'i32')}, {top_b} : i32")
    upper = em.op(f"arith.cmpi uge, {s}, {em.const(4, 'index')} : index")
    return (em.op(f"arith.select {upper}, {hi_sc}, {lo_sc} : i32"),
            em.op(f"arith.select {upper}, {hi_m}, {lo_m} : i32"))


def _k_low_nibble(em: Emitter, blk: _Block, qs_off: int, j: str) -> str:
    """64-element chunk c = j / 64 holds the low nibbles of qs[32c : 32c+32], then their high
    nibbles."""
    byte = blk.ubyte32(_c(em, "addi", _add(em, _c(em, "muli", _c(em, "divui", j, 64), 32),
                                           _c(em, "remui", j, 32)), qs_off))
    shift = _c(em, "muli", _i32(em, _c(em, "remui", _c(em, "divui", j, 32), 2)), 4, "i32")
    return _c(em, "andi", em.op(f"arith.shrui {byte}, {shift} : i32"), 15, "i32")


def _k_affine(em: Emitter, blk: _Block, j: str, q: str) -> str:
    """(d * scale_s) * q - (dmin * min_s) for sub-block s = j / 32, in ggml's order."""
    sc, m = _k_scale_min(em, blk, _c(em, "divui", j, 32))
    d1 = em.op(f"arith.mulf {blk.f16(0)}, {_tof(em, sc)} : f32")
    m1 = em.op(f"arith.mulf {blk.f16(2)}, {_tof(em, m)} : f32")
    return em.op(f"arith.subf {em.op(f'arith.mulf {d1}, {_tof(em, q)} : f32')}, {m1} : f32")


def _q4_k(em, blk, j, j32):
    return _k_affine(em, blk, j, _k_low_nibble(em, blk, 16, j))


def _q5_k(em, blk, j, j32):
    # The 5th bit of element j is bit (j / 32) of qh[j % 32].
    qh = blk.ubyte32(_c(em, "addi", _c(em, "remui", j, 32), 16))
    bit = em.op(f"arith.shrui {qh}, {_i32(em, _c(em, 'divui', j, 32))} : i32")
    hi = _c(em, "shli", _c(em, "andi", bit, 1, "i32"), 4, "i32")
    q = em.op(f"arith.ori {_k_low_nibble(em, blk, 48, j)}, {hi} : i32")
    return _k_affine(em, blk, j, q)


def _q6_k(em, blk, j, j32):
    # Half h = j / 128 of ql[128] (64 bytes each) and qh[64] (32 each); in it, group g of 32
    # takes low 4 bits from ql[64h + 32(g % 2) + l] (low nibble for g < 2, high for g >= 2)
    # and its top 2 bits from bits 2g..2g+1 of qh[32h + l]; one int8 scale per 16 elements.
    h, e = _c(em, "divui", j, 128), _c(em, "remui", j, 128)
    g, l = _c(em, "divui", e, 32), _c(em, "remui", e, 32)
    ql_at = _add(em, _add(em, _c(em, "muli", h, 64), _c(em, "muli", _c(em, "remui", g, 2), 32)),
                 l)
    g32 = _i32(em, g)
    lo_shift = _c(em, "muli", _c(em, "divui", g32, 2, "i32"), 4, "i32")
    lo = _c(em, "andi", em.op(f"arith.shrui {blk.ubyte32(ql_at)}, {lo_shift} : i32"), 15, "i32")
    qh = blk.ubyte32(_c(em, "addi", _add(em, _c(em, "muli", h, 32), l), 128))
    hi = _c(em, "andi", em.op(f"arith.shrui {qh}, {_c(em, 'muli', g32, 2, 'i32')} : i32"), 3,
            "i32")
    q = _c(em, "subi", em.op(f"arith.ori {lo}, {_c(em, 'shli', hi, 4, 'i32')} : i32"), 32,
           "i32")
    sc = em.op(f"arith.sitofp {blk.byte(_c(em, 'addi', _c(em, 'divui', j, 16), 192))} : i8 to f32")
    scale = em.op(f"arith.mulf {blk.f16(208)}, {sc} : f32")
    return em.op(f"arith.mulf {scale}, {_tof(em, q)} : f32")


DECODERS = {"q8_0": _q8_0, "q4_0": _q4_0, "q4_1": _q4_1, "q5_0": _q5_0, "q5_1": _q5_1,
            "q4_k": _q4_k, "q5_k": _q5_k, "q6_k": _q6_k,
            # row-interleaved layouts: the same decoders over an _InterleavedBlock
            "q4_0_r16": _q4_0, "q4_1_r16": _q4_1, "q8_0_r16": _q8_0}


def decode_at(em: Emitter, deq: OpInfo, coords: list[str]) -> str:
    """The element of ``dequantize(packed)`` at ``coords`` (index SSA names), decoded in place
    from the packed bytes, as the dequantize's result dtype: a consumer that reads a few
    elements (a gather of embedding rows) decodes only those."""
    pt, out = deq.types[0], deq.result
    fmt = pt.format
    decode = DECODERS.get(fmt.name)
    if decode is None:
        deq.refuse(f"no in-kernel decoder for packed format {fmt.name}")
    e, stride = None, 1
    for c, d in zip(reversed(coords), reversed(pt.shape)):
        term = c if stride == 1 else em.op(f"arith.muli {c}, {em.const(stride, 'index')} : index")
        e = term if e is None else em.op(f"arith.addi {e}, {term} : index")
        stride *= d
    blk, j, j32 = _block_at(em, pt, deq.args[0], e)
    x = decode(em, blk, j, j32)
    if out.dtype is DType.F32:
        return x
    return em.op(f"arith.truncf {x} : f32 to {out.dtype.value}")


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
        blk, j, j32 = _block_at(em, pt, op.args[0], e)
        x = decode(em, blk, j, j32)
        if out.dtype is DType.F32:
            return x
        return em.op(f"arith.truncf {x} : f32 to {out.dtype.value}")

    return em.generic(out, [], body)
