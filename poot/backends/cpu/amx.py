"""The batched integer matmul tile on AMX (Intel's tile registers: Sapphire Rapids and newer):
``y[m, n] = sum_k x[m, k] * W[n, k]`` for M >= 2 rows of x quantized per 32-block
(:attr:`~poot.dialects.lowering.rules.Strategy.dot_bits`) and W packed Q4_0 / Q4_1 / Q8_0,
chosen where the strategy says ``amx`` (:func:`poot.compiler.target.amx_permitted`).

It computes exactly what the VNNI GEMM tile (:meth:`poot.backends.cpu.gemv._K.tile_gemm`)
computes, bit for bit, so a row's result still does not depend on M (the engine's batch
invariance) and the decode GEMV (M = 1) stays the VNNI lane-order one:

* per tile of 16 W rows (threads over tiles), each block of the 16 rows is decoded once into
  an AMX B tile in VNNI byte order (``B[k / 4, 4 n + k % 4] = W[n, k]``: the 8 x 64-byte rows
  that :meth:`~poot.backends.cpu.gemv._K.quad_words` makes) and the rows' block scales into
  vectors of 16, all on the stack (``memref.alloca``; the OpenMP lowering scopes a parallel
  body's allocas);
* per tile of up to 16 x rows and block ``b``: the x rows' block is an A tile (32 bytes a
  row) and one ``tdpb*d`` gives the 16 x 16 exact integer block sums. int16 x is split into
  bytes, ``x = 256 h + l`` (``h`` signed, ``l`` unsigned): two tile products, ``256 C_h +
  C_l``, the same integer as ``vpdpwssd``'s (|C_h| <= 128 * 127 * 32, far from overflow).
  The sums go through a 1 KiB stack buffer into vector<16xi32> rows, then meet the scales
  in the VNNI tile's f32 operations, in its order
  (:meth:`~poot.backends.cpu.gemv._K._scale_fma`).

Signedness picks the instruction: x bytes signed (int8 x, int16's ``h``) or unsigned
(``l``) times W unsigned (Q4 nibbles: ``zext``) or signed (Q8_0).

x is laid out for the A tiles by :meth:`~poot.backends.cpu.gemv._K.quantize_x`: a row of
``tensor<M x (K * bits / 8) x i8>``, per block 32 bytes (int8) or ``h`` then ``l`` (int16).
Source: Intel's AMX (Intel 64 and IA-32 Architectures Software Developer's Manual, vol. 1,
ch. 18); MLIR's ``amx`` dialect, lowered by ``convert-vector-to-llvm{enable-amx}``.
"""

from __future__ import annotations

#: W rows of an AMX tile: the 16 i32 columns of a C tile
N_TILE = 16
#: x rows of an AMX tile: the 16 rows of an A tile
M_TILE = 16
#: K elements of one tile product: one quant block (its scales differ from the next's)
BLOCK = 32
#: fewest x rows the AMX tile takes: below, the VNNI tile (one x-row tile, no pack) is as
#: fast or faster. Measured on a 2-core Xeon VM (AMX and AVX512-VNNI), SmolLM2 Q4_1, int16 x:
#: the batch-8 decode step 18.9 ms on AMX vs 18.2 on VNNI, the speculative verify steps of
#: 3 and 5 rows 14.7 / 16.2 vs 11.6 / 14.1 ms; a 1536 x 576 GEMM at M = 12 1.47x faster
MIN_ROWS = 9


def fits(k) -> bool:
    """Whether the AMX tile takes the GEMM of ``k`` (a :class:`~poot.backends.cpu.gemv._K`
    whose GEMM tile was chosen): the strategy's ``amx``, at least :data:`MIN_ROWS` rows of x,
    N a multiple of 16, and x int16 or (int8 with a Q4 weight: int8 x meets Q8_0 only in the
    VNNI kernel's sign trick)."""
    g = k.g
    return bool(k.s.amx) and (k.gemm or k.r16) and g.m >= MIN_ROWS and g.n % N_TILE == 0 \
        and (k.bits == 16 or _ggml_name(g.wtype.format) != "q8_0")


def _ggml_name(fmt) -> str:
    """The ggml format of ``fmt`` (itself, or the one a row-interleaved layout regroups)."""
    return fmt.base or fmt.name


class AmxTile:
    """The AMX GEMM of one kernel (``k``: its :class:`~poot.backends.cpu.gemv._K`)."""

    def __init__(self, k):
        self.k = k
        g = k.g
        self.nb = g.k // BLOCK
        self.xbytes = g.k * k.bits // 8        # bytes of one quantized x row
        #: x rows of the quantized x: M rounded up to whole A tiles (every tile product has
        #: one shape, so any number of these kernels fits in one function's tile config:
        #: LLVM binds a shape to each of the 8 tile registers once per function; the rows
        #: past M hold whatever was there, and their sums are never read)
        self.mpad = -(-g.m // M_TILE) * M_TILE
        self.q8 = _ggml_name(g.wtype.format) == "q8_0"
        self.nsc = 1 if self.q8 else 2
        #: the C tiles of one block: int8 x's, or int16's h then l (1 KiB each)
        self.parts = 2 if k.bits == 16 else 1
        self.sums_t = f"memref<{self.parts * M_TILE}x{N_TILE}xi32>"
        self.bufs: tuple | None = None
        self.xmem: str | None = None

    # ---- stack buffers of one W tile ----
    def alloc(self) -> None:
        """The W tile's B tiles, scale vectors and the C tiles' buffers (``memref.alloca``:
        emitted in a parallel loop's body, or once before a sequential loop)."""
        em, nb = self.k.em, self.nb
        pack = em.op(f"memref.alloca() {{alignment = 64}} : memref<{nb * 8}x64xi8>", "pk")
        scales = [em.op(f"memref.alloca() {{alignment = 64}} : memref<{nb}x{N_TILE}xf32>", "sc")
                  for _ in range(self.nsc)]
        sums = em.op(f"memref.alloca() {{alignment = 64}} : {self.sums_t}", "cs")
        self.bufs = (pack, scales, sums)

    def x_buffer(self) -> None:
        """x's quantized bytes as a buffer the A tiles load from."""
        k = self.k
        self.xmem = k.em.op(f"bufferization.to_buffer {k.xq} read_only : {k.tq} to "
                            f"memref<{self.mpad}x{self.xbytes}xi8>")

    def pack(self, row0: str) -> None:
        """Decode the 16 W rows from ``row0``: each block into its B tile (rows ``8 b ..
        8 b + 7`` of the pack) and its scales into row ``b`` of the scale buffers."""
        k, em, nb = self.k, self.k.em, self.nb
        pack, scales, _ = self.bufs
        b = em.fresh("ab")
        em.line(f"scf.for {b} = {k.c(0)} to {k.c(nb)} step {k.c(1)} {{")
        em.depth += 1
        if k.r16:               # a row-interleaved weight: the vectors as stored
            dw, mw, words = k.r16_block(row0, b)
        else:
            offs = k.block_offsets(row0, b, N_TILE)
            k._prefetch(offs)
            dw, mw = k._tile_scales(offs)
            words = k.quad_words(offs)
        base = k.mul(b, 8)
        for word, v in words:
            em.line(f"vector.store {v}, {pack}[{k.add(base, word)}, {k.c(0)}] : "
                    f"memref<{nb * 8}x64xi8>, vector<64xi8>")
        for v, buf in zip([dw, mw][:self.nsc], scales):
            em.line(f"vector.store {v}, {buf}[{b}, {k.c(0)}] : memref<{nb}x{N_TILE}xf32>, "
                    f"vector<{N_TILE}xf32>")
        em.depth -= 1
        em.line("}")

    def _product(self, a_off: str, m0: str, b_tile: str, x_signed: bool, out: str,
                 at: str) -> None:
        """``out[at : at + 16] = A @ B``: A the 16 x rows from ``m0``, their 32 bytes at
        column ``a_off``."""
        k, em = self.k, self.k.em
        a_t, c_t = f"!amx.tile<{M_TILE}x{BLOCK}xi8>", f"!amx.tile<{M_TILE}x{N_TILE}xi32>"
        a = em.op(f"amx.tile_load {self.xmem}[{m0}, {a_off}] : "
                  f"memref<{self.mpad}x{self.xbytes}xi8> into {a_t}")
        z = em.op(f"amx.tile_zero : {c_t}")
        ax = "" if x_signed else " zext"
        bx = "" if self.q8 else " zext"
        c = em.op(f"amx.tile_muli {a}{ax}, {b_tile}{bx}, {z} : {a_t}, !amx.tile<8x64xi8>, {c_t}")
        em.line(f"amx.tile_store {out}[{at}, {k.c(0)}], {c} : {self.sums_t}, {c_t}")

    def tile(self, m0: str, rows: int, dest: str, dest_t: str, col0: str) -> str:
        """Rows ``m0 .. m0 + rows`` (at most 16) of x against the packed W tile: writes the
        sums to ``dest[m0 + i, col0 : col0 + 16]``; returns the new ``dest``."""
        k, em, nb = self.k, self.k.em, self.nb
        pack, scales, sums = self.bufs
        v16, vi = f"vector<{N_TILE}xf32>", f"vector<{N_TILE}xi32>"
        xrows = [k.add(m0, i) for i in range(rows)]
        zero = em.op(f"arith.constant dense<0.0> : {v16}", "cv")
        b, res, its = k._block_loop(("b", "kl", "acc"), nb, [zero] * rows, [v16] * rows)
        b_tile = em.op(f"amx.tile_load {pack}[{k.mul(b, 8)}, {k.c(0)}] : "
                       f"memref<{nb * 8}x64xi8> into !amx.tile<8x64xi8>")
        xoff = k.mul(b, BLOCK * self.parts)
        self._product(xoff, m0, b_tile, True, sums, k.c(0))        # int8 x, or int16's h
        if self.parts == 2:
            self._product(k.add(xoff, BLOCK), m0, b_tile, False, sums, k.c(M_TILE))   # l
        sc = [em.op(f"vector.load {buf}[{b}, {k.c(0)}] : memref<{nb}x{N_TILE}xf32>, {v16}")
              for buf in scales]
        dw, mw = sc[0], sc[1] if len(sc) > 1 else None
        eight = em.op(f"arith.constant dense<8> : {vi}", "cv")
        new = []
        for i, xr in enumerate(xrows):
            d = em.op(f"vector.load {sums}[{k.c(i)}, {k.c(0)}] : {self.sums_t}, {vi}")
            if self.parts == 2:
                lo = em.op(f"vector.load {sums}[{k.c(M_TILE + i)}, {k.c(0)}] : "
                           f"{self.sums_t}, {vi}")
                d = em.op(f"arith.addi {em.op(f'arith.shli {d}, {eight} : {vi}')}, {lo} : {vi}")
            new.append(em.op(f"arith.sitofp {d} : {vi} to {v16}"))
        return k.scale_rows(new, dw, mw, (b, res, its), xrows, dest, dest_t, col0)


__all__ = ["AmxTile", "BLOCK", "MIN_ROWS", "M_TILE", "N_TILE", "fits"]
