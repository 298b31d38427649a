"""The CPU's paged attention: ``poot.paged_attention``
(:class:`~poot.dialects.ops.attention.PagedAttention`) over f32 / f16 / bf16 KV pools and q8_0
ones (:mod:`poot.dialects.kv_quant`), as explicit vector code that widens each key's values in
registers where it loads them (f16 / bf16: ``vcvtph2ps``-style ``extf``; q8_0: ``vpmovsxbd``
+ ``vcvtdq2ps``, times the group's f16 scale), never into a tile in memory.

The generic lowering (:mod:`poot.dialects.lowering.attention`) runs each block's online-softmax
update as a dozen ``linalg.generic`` ops over small tensors, with a q8_0 block first
dequantized into an f32 tile; on the CPU that is loop and memory overhead on every 32-key
block, far from the FMA rate (SmolLM2's shapes, f16 pools, 2 threads: a decode step of 32
sequences at 100 keys 259 -> 139 us a layer, a 256-token prefill chunk at 512 keys 10.2 ->
4.1 ms). Here one work item (a sequence and KV head, as there: threads
over the items) keeps its query rows' state in registers across the whole block loop:

* query rows in tiles of :func:`row_tile` rows (their accumulators, ``Dv / 16`` vectors a row,
  fill about half the 32 AVX-512 registers), unrolled up to :data:`MAX_ROWS` rows a work item
  (decode, short verify steps), else the full tiles as a loop (prefill chunks); per tile an
  ``scf.for`` over the visited blocks and, inside, over chunks of ``n`` keys (16, or the
  largest power of two dividing the block size), the unit of the online softmax;
* scores of a chunk: each key's D values are loaded as ``vector<16xi8>`` pieces, widened to
  f32 and scaled by their group's scale once for all the tile's rows; per (row, key) one
  ``vector<16xf32>`` of partial products (FMAs over D), and the chunk's ``n`` partial vectors
  are summed across lanes by one shuffle tree (:func:`_hsum`) into a ``vector<n x f32>`` whose
  lane j is key j's score;
* masked keys (i1 mask: not visible; f32 bias: ``-inf``) get a ``-inf`` score whatever the
  stored key holds; ``m' = max(m, max_j x)``, ``p = exp(x - m')`` (a vector polynomial, the
  same Cephes ``expf`` as :mod:`poot.passes.expand_exp`), ``l' = l * a + sum p``,
  ``acc' = acc * a + sum_j p_j v_j`` with ``a = exp(m - m')``;
* a key no row of the tile sees adds nothing: its V scale (a float V: its values) is
  selected to 0 before the multiply, so a reused block's stale scale (inf, NaN) cannot reach
  the accumulators;
* each chunk first prefetches the K and V rows (and q8_0 scales) of the chunk
  :data:`PREFETCH` chunks ahead (the next block's first after a block's last), through
  read-only buffer views of the pools: in decode the cache is read from DRAM once a step,
  one head's row of every ``H`` (SmolLM2: 128 of every 384 bytes), which the hardware
  prefetchers follow poorly (SmolLM2, batch 32 at position 128, 2-core Xeon VM: 35.2 ->
  33.4 ms a step).

Results agree with the op's oracle up to f32 summation order (``1e-5`` relative), the same
bound as the generic lowering. A soft cap, or head dims that are not multiples of 16, keep the
generic lowering: this kernel returns None for them.
"""

from __future__ import annotations

from math import prod

import numpy as np

from poot.dialects.lowering.attention import item_blocks, paged_items, scf_for, table_block
from poot.dialects.lowering.emit import Emitter, float_hex, tt
from poot.dialects.lowering.rules import OpInfo
from poot.dialects.types import DType, TensorType
from poot.passes.expand_exp import HI, LN2_HI, LN2_LO, LO, LOG2E, POLY

#: lanes of one f32 vector (one AVX-512 register)
LANES = 16
#: the most query rows of one work item whose tiles are unrolled and whose blocks may be
#: split over the cores (decode's GQA group times a few tokens); more run their tiles as a loop
MAX_ROWS = 16
#: accumulator registers one row tile may hold
ACC_REGS = 16
#: whether each chunk of keys prefetches the K and V rows of the chunk this many chunks
#: ahead (``_Tile._prefetch_next``); 0: no prefetch
PREFETCH = 1


def _memref(t: TensorType) -> str:
    """The identity-layout memref type of tensor type ``t``."""
    return "memref<" + "x".join([str(d) for d in t.shape] + [t.dtype.value]) + ">"


def row_tile(dv: int) -> int:
    """Query rows computed together: their ``Dv / 16`` accumulator vectors each fill at most
    :data:`ACC_REGS` registers."""
    return max(1, ACC_REGS // (dv // LANES))


def chunk_keys(bs: int) -> int:
    """Keys of one online-softmax chunk: 16, or the largest power of two dividing ``bs``."""
    return min(LANES, bs & -bs)


def hsum_masks(n: int, width: int = LANES) -> list[tuple[list[int], list[int]]]:
    """The ``(lo, hi)`` shuffle masks of :func:`_hsum` on ``n`` (a power of two) vectors of
    ``width`` lanes, stage by stage: first pairs of vectors (each holding ``k`` keys in runs of
    ``width / k`` lanes: the first halves of a's runs then of b's, and the second halves),
    then, once one vector is left, halves of its runs within it (its width halving) until a
    key is one lane."""
    out, k = [], 1
    while k < n:                                    # vectors pairwise: keys per vector doubles
        run = width // k
        half = run // 2
        lo = [s * width + r * run + e for s in (0, 1) for r in range(k) for e in range(half)]
        out.append((lo, [i + half for i in lo]))
        k *= 2
    w = width
    while w > n:                                    # one vector: runs halve within it
        run = w // n
        half = run // 2
        lo = [r * run + e for r in range(n) for e in range(half)]
        out.append((lo, [i + half for i in lo]))
        w //= 2
    return out


def _hsum(em: Emitter, parts: list[str]) -> str:
    """``vector<n x f32>`` whose lane j is the sum of the lanes of ``parts[j]`` (``n`` a power
    of two of ``vector<16xf32>``): :func:`hsum_masks`' shuffle-and-add tree."""
    n, width = len(parts), LANES
    cur = list(parts)
    for lo, hi in hsum_masks(n, width):
        ty = f"vector<{width}xf32>"
        if len(cur) > 1:
            pairs = list(zip(cur[::2], cur[1::2]))
        else:
            pairs = [(cur[0], cur[0])]
            width //= 2
        rt = f"vector<{len(lo)}xf32>"
        cur = [em.op(f"arith.addf {_shuffle(em, a, b, lo, ty)}, {_shuffle(em, a, b, hi, ty)} "
                     f": {rt}") for a, b in pairs]
    return cur[0]


def _shuffle(em: Emitter, a: str, b: str, mask: list[int], ty: str) -> str:
    return em.op(f"vector.shuffle {a}, {b} [{', '.join(map(str, mask))}] : {ty}, {ty}")


def _splat(em: Emitter, value: float, n: int, ty: str = "f32") -> str:
    lit = float_hex(value, ty) if ty == "f32" else str(int(value))
    return em.op(f"arith.constant dense<{lit}> : vector<{n}x{ty}>", "cv")


def vexp(em: Emitter, x: str, n: int) -> str:
    """``exp`` of ``x`` (``vector<n x f32>``) as straight-line arithmetic: the algorithm and
    edges of :mod:`poot.passes.expand_exp` (``exp(-inf) = 0`` exactly), on vectors."""
    vf, vi = f"vector<{n}xf32>", f"vector<{n}xi32>"

    def c(v):
        return _splat(em, v, n)

    def ci(v):
        return _splat(em, v, n, "i32")

    xc = em.op(f"arith.minnumf {em.op(f'arith.maxnumf {x}, {c(LO)} : {vf}')}, {c(HI)} : {vf}")
    nn = em.op(f"math.roundeven {em.op(f'arith.mulf {xc}, {c(LOG2E)} : {vf}')} : {vf}")
    r = em.op(f"arith.subf {xc}, {em.op(f'arith.mulf {nn}, {c(LN2_HI)} : {vf}')} : {vf}")
    r = em.op(f"arith.subf {r}, {em.op(f'arith.mulf {nn}, {c(LN2_LO)} : {vf}')} : {vf}")
    p = c(POLY[0])
    for k in POLY[1:]:
        p = em.op(f"arith.addf {em.op(f'arith.mulf {p}, {r} : {vf}')}, {c(k)} : {vf}")
    y = em.op(f"arith.mulf {em.op(f'arith.mulf {p}, {r} : {vf}')}, {r} : {vf}")
    y = em.op(f"arith.addf {em.op(f'arith.addf {y}, {r} : {vf}')}, {c(1.0)} : {vf}")
    ni = em.op(f"arith.fptosi {nn} : {vf} to {vi}")
    e1 = em.op(f"arith.shrsi {ni}, {ci(1)} : {vi}")
    e2 = em.op(f"arith.subi {ni}, {e1} : {vi}")

    def pow2(e):
        bits = em.op(f"arith.shli {em.op(f'arith.addi {e}, {ci(127)} : {vi}')}, {ci(23)} : {vi}")
        return em.op(f"arith.bitcast {bits} : {vi} to {vf}")

    v = em.op(f"arith.mulf {em.op(f'arith.mulf {y}, {pow2(e1)} : {vf}')}, {pow2(e2)} : {vf}")
    under = em.op(f"arith.cmpf olt, {x}, {c(LO)} : {vf}")
    v = em.op(f"arith.select {under}, {c(0.0)}, {v} : vector<{n}xi1>, {vf}")
    over = em.op(f"arith.cmpf ogt, {x}, {c(HI)} : {vf}")
    v = em.op(f"arith.select {over}, {c(float('inf'))}, {v} : vector<{n}xi1>, {vf}")
    nan = em.op(f"arith.cmpf uno, {x}, {x} : {vf}")
    return em.op(f"arith.select {nan}, {x}, {v} : vector<{n}xi1>, {vf}")


class _Pool:
    """One KV pool as the kernel reads it: ``(ssa, [NB, bs, H, C] type)`` and, for q8_0, its
    scales ``(ssa, [NB, bs, H, C / 32] type)``."""

    def __init__(self, em: Emitter, x: str, t: TensorType, scales):
        self.em, self.x, self.t, self.scales = em, x, t, scales
        self.c = t.shape[-1]
        # read-only buffer views, for the prefetches only (the reads stay on the tensors)
        self.mem = em.op(f"bufferization.to_buffer {x} read_only : {tt(t)} to "
                         f"{_memref(t)}") if PREFETCH else None
        self.smem = em.op(f"bufferization.to_buffer {scales[0]} read_only : {tt(scales[1])} "
                          f"to {_memref(scales[1])}") if PREFETCH and scales else None

    def prefetch(self, blk: str, keys: list[str], hh: str) -> None:
        """Software prefetch of head ``hh``'s row of each of ``keys`` of block ``blk``: every
        64-byte line of its values, and the lines its q8_0 scales fall on."""
        if self.mem is None:
            return
        em = self.em
        per_line = max(1, 64 // self.t.dtype.itemsize)
        c0 = em.const(0, "index")
        for key in keys:
            for o in range(0, self.c, per_line):
                em.line(f"memref.prefetch {self.mem}[{blk}, {key}, {hh}, {em.const(o, 'index')}]"
                        f", read, locality<3>, data : {_memref(self.t)}")
        if self.smem is not None:                   # H * C / 32 f16 scales a key
            st = self.scales[1]
            step = max(1, 64 // (st.shape[2] * st.shape[3] * 2))
            for key in keys[::step]:
                em.line(f"memref.prefetch {self.smem}[{blk}, {key}, {hh}, {c0}], read, "
                        f"locality<3>, data : {_memref(st)}")

    def key(self, blk: str, key: str, hh: str, live: str | None = None) -> list[str]:
        """Key ``key`` of block ``blk``, head ``hh``: ``C / 16`` ``vector<16xf32>``. ``live``
        (an i1): when false the values are 0, whatever is stored."""
        em, vf = self.em, f"vector<{LANES}xf32>"
        ty = self.t.dtype.value
        pad = em.const(0, "i8") if self.scales is not None else em.const(0.0, ty)
        raw = [em.op(f"vector.transfer_read {self.x}[{blk}, {key}, {hh}, {em.const(o, 'index')}]"
                     f", {pad} {{in_bounds = [true]}} : {tt(self.t)}, vector<{LANES}x{ty}>")
               for o in range(0, self.c, LANES)]
        if self.scales is None:
            out = [em.op(f"arith.extf {r} : vector<{LANES}x{ty}> to {vf}") if ty != "f32" else r
                   for r in raw]
            if live is None:
                return out
            zero = _splat(em, 0.0, LANES)
            return [em.op(f"arith.select {live}, {v}, {zero} : {vf}") for v in out]
        s, st = self.scales
        g = self.c // 32
        hs = em.op(f"vector.transfer_read {s}[{blk}, {key}, {hh}, {em.const(0, 'index')}], "
                   f"{em.const(0.0, 'f16')} {{in_bounds = [true]}} : {tt(st)}, vector<{g}xf16>")
        d = em.op(f"arith.extf {hs} : vector<{g}xf16> to vector<{g}xf32>")
        if live is not None:
            d = em.op(f"arith.select {live}, {d}, {_splat(em, 0.0, g)} : vector<{g}xf32>")
        ds = [em.op(f"vector.broadcast "
                    f"{em.op(f'vector.extract {d}[{i}] : f32 from vector<{g}xf32>')} : f32 "
                    f"to {vf}") for i in range(g)]
        return [em.op(f"arith.mulf {em.op(f'arith.sitofp {r} : vector<{LANES}xi8> to {vf}')}, "
                      f"{ds[i // 2]} : {vf}") for i, r in enumerate(raw)]


def paged_attention(em: Emitter, op: OpInfo) -> str | None:
    """``poot.paged_attention`` ``op`` as the module doc says; None, emitting nothing, for
    what it leaves to the generic lowering (a soft cap, head dims not multiples of 16)."""
    q, kp, vp, _table, mask, *sargs = op.args
    qt, kpt, vpt, _tbt, mt, *stypes = op.types
    if float(op.attrs["softcap"]):
        return None
    _, bs, _, d = kpt.shape
    dv = vpt.shape[-1]
    rowdims = qt.shape[2:-1]
    n_rows = prod(rowdims)
    out_t = TensorType(qt.shape[:-1] + (dv,), DType.F32)
    if d % LANES or dv % LANES or not n_rows or op.result != out_t or \
            mt.dtype not in (DType.I1, DType.F32):
        return None
    scales = [None, None]
    for i, pt in enumerate((kpt, vpt)):
        if pt.dtype is DType.I8:
            scales[i] = (sargs.pop(0), stypes.pop(0))
    kpool, vpool = _Pool(em, kp, kpt, scales[0]), _Pool(em, vp, vpt, scales[1])
    acc_t = TensorType((1,) + rowdims + (dv,), DType.F32)
    rows = [tuple(int(i) for i in ix) for ix in np.ndindex(*rowdims)] if rowdims else [()]
    rt = row_tile(dv)
    tiles = [rows[i:i + rt] for i in range(0, n_rows, rt)]
    scale = float(op.attrs["scale"])

    def tile(t, b, hh, mb):
        return _Tile(em, op, t, q, b, hh, mb, kpool, vpool, scale)

    n_split = splits(op) if n_rows <= MAX_ROWS else 1
    if n_split > 1:
        return _split_items(em, op, rows, tiles, n_split, tile)
    n_loop = n_rows // rt if n_rows > MAX_ROWS else 0    # full tiles run as a loop

    def one_item(b: str, hh: str) -> str:
        mb, w_lo, w_hi = item_blocks(em, op, b, hh)
        res = em.empty(acc_t)
        if n_loop:
            res = scf_for(em, em.const(0, "index"), em.const(n_loop, "index"),
                          em.const(1, "index"), [res], [tt(acc_t)],
                          lambda ti, st: [tile(_tile_rows(em, ti, rt, rowdims), b, hh, mb)
                                          .emit(w_lo, w_hi, st[0], acc_t)])[0]
        for t in tiles[n_loop:]:
            res = tile(t, b, hh, mb).emit(w_lo, w_hi, res, acc_t)
        return res

    return paged_items(em, op, acc_t, one_item)


def _tile_rows(em: Emitter, ti: str, rt: int, rowdims) -> list[tuple[str, ...]]:
    """The row indices (index values, one per row dim) of the ``rt`` rows of tile ``ti``."""
    out = []
    for i in range(rt):
        base = em.op(f"arith.muli {ti}, {em.const(rt, 'index')} : index")
        flat = em.op(f"arith.addi {base}, {em.const(i, 'index')} : index")
        idx = []
        for n in reversed(rowdims):
            cn = em.const(n, "index")
            idx.append(em.op(f"arith.remui {flat}, {cn} : index"))
            flat = em.op(f"arith.divui {flat}, {cn} : index")
        out.append(tuple(reversed(idx)))
    return out


def _ix(em: Emitter, x) -> str:
    """An index value: ``x`` itself (an SSA name) or a constant of int ``x``."""
    return x if isinstance(x, str) else em.const(x, "index")


def splits(op: OpInfo) -> int:
    """Parts each work item's visited blocks are split into, each a thread's task: 1 when
    one sequence's KV heads already spread evenly over the cores (or there is one core, or
    four heads a core); else the fewest parts that make them a multiple of the cores
    (SmolLM2's decode: 3 KV heads on 2 cores, 2 parts: 3 tasks a core, not 2 and 1). Decided
    per sequence, never by the batch size: the parts change the f32 summation order, and a
    sequence must get the same bits whatever it is batched with."""
    cores = op.strategy.cores if op.strategy is not None else 1
    items = op.types[1].shape[2]
    if cores <= 1 or items >= 4 * cores:
        return 1
    return next(s for s in range(1, cores + 1) if items * s % cores == 0)


def _split_items(em: Emitter, op: OpInfo, rows, tiles, n_split: int, tile) -> str:
    """Flash-decoding on the cores: an ``scf.forall`` over (sequence, KV head, part), part s
    running its tiles over its share of the item's visited blocks into unnormalized
    ``(acc, m, l)`` rows of a ``[B, H, parts, rows, Dv + 2]`` scratch; then, per item and row,
    the parts merged: ``M = max m_s``, ``w_s = exp(m_s - M)`` (0 for an empty part),
    ``out = sum w_s acc_s / sum w_s l_s`` (an i1 mask: over ``max(., 1)``, as unsplit)."""
    bsz, h = op.types[3].shape[0], op.types[1].shape[2]
    dv = op.types[2].shape[-1]
    nr = len(rows)
    part_t = TensorType((bsz, h, n_split, nr, dv + 2), DType.F32)
    unit_t = TensorType((1, 1, 1, nr, dv + 2), DType.F32)
    def c(v: int) -> str:
        return em.const(v, "index")

    res, o, b, hh, sp = (em.fresh(x) for x in ("pp", "o", "b", "hh", "sp"))
    em.line(f"{res} = scf.forall ({b}, {hh}, {sp}) in ({bsz}, {h}, {n_split}) "
            f"shared_outs({o} = {em.empty(part_t)}) -> ({tt(part_t)}) {{")
    em.depth += 1
    mb, w_lo, w_hi = item_blocks(em, op, b, hh)
    n = em.op(f"arith.maxsi {em.op(f'arith.subi {w_hi}, {w_lo} : index')}, {c(0)} : index")
    span = em.op(f"arith.divui {em.op(f'arith.addi {n}, {c(n_split - 1)} : index')}, "
                 f"{c(n_split)} : index")
    lo = em.op(f"arith.addi {w_lo}, {em.op(f'arith.muli {sp}, {span} : index')} : index")
    hi = em.op(f"arith.minsi {em.op(f'arith.addi {lo}, {span} : index')}, {w_hi} : index")
    unit = em.empty(unit_t)
    first = 0
    for t in tiles:
        unit = tile(t, b, hh, mb).emit_raw(lo, hi, unit, unit_t, first)
        first += len(t)
    em.line("scf.forall.in_parallel {")
    em.line(f"  tensor.parallel_insert_slice {unit} into {o}[{b}, {hh}, {sp}, 0, 0] "
            f"[1, 1, 1, {nr}, {dv + 2}] [1, 1, 1, 1, 1] : {tt(unit_t)} into {tt(part_t)}")
    em.line("}")
    em.depth -= 1
    em.line("}")
    return _merge(em, op, rows, res, part_t, n_split)


def _merge(em: Emitter, op: OpInfo, rows, part: str, part_t: TensorType, n_split: int) -> str:
    """The op's result from the parts' ``(acc, m, l)`` rows (:func:`_split_items`)."""
    idx: dict[int, str] = {}

    def c(v: int) -> str:                  # index constants, made once before the loops
        if v not in idx:
            idx[v] = em.const(v, "index")
        return idx[v]

    for v in (0, 1, op.types[2].shape[-1], op.types[2].shape[-1] + 1, *range(n_split),
              *range(len(rows)), *range(0, op.types[2].shape[-1], LANES),
              *{x for r in rows for x in r}):
        c(v)
    dv = op.types[2].shape[-1]
    visible = op.types[4].dtype is DType.I1
    vf = f"vector<{LANES}xf32>"
    out_t = op.result
    ninf, zero, one = (em.const(v, "f32") for v in (float("-inf"), 0.0, 1.0))
    pad = em.const(0.0, "f32")

    acc_t = TensorType((1,) + out_t.shape[2:-1] + (dv,), DType.F32)

    def item(b: str, hh: str) -> str:
        """Item ``(b, hh)``'s rows (``acc_t``)."""
        out = em.empty(acc_t)
        for i, r in enumerate(rows):
            ms = [em.op(f"tensor.extract {part}[{b}, {hh}, {c(s)}, {c(i)}, {c(dv)}] "
                        f": {tt(part_t)}") for s in range(n_split)]
            ls = [em.op(f"tensor.extract {part}[{b}, {hh}, {c(s)}, {c(i)}, {c(dv + 1)}] "
                        f": {tt(part_t)}") for s in range(n_split)]
            big = ms[0]
            for m in ms[1:]:
                big = em.op(f"arith.maximumf {big}, {m} : f32")
            none = em.op(f"arith.cmpf oeq, {big}, {ninf} : f32")
            ws = []
            for m in ms:
                e = em.op(f"math.exp {em.op(f'arith.subf {m}, {big} : f32')} : f32")
                ws.append(em.op(f"arith.select {none}, {zero}, {e} : f32"))
            den = zero
            for w, lv in zip(ws, ls):
                den = em.op(f"math.fma {w}, {lv}, {den} : f32")
            if visible:
                den = em.op(f"arith.maximumf {den}, {one} : f32")
            inv = em.op(f"arith.divf {one}, {den} : f32")
            wv = [em.op(f"vector.broadcast {em.op(f'arith.mulf {w}, {inv} : f32')} : f32 "
                        f"to {vf}") for w in ws]
            for v in range(0, dv, LANES):
                acc = None
                for s in range(n_split):
                    a = em.op(f"vector.transfer_read {part}[{b}, {hh}, {c(s)}, {c(i)}, {c(v)}]"
                              f", {pad} {{in_bounds = [true]}} : {tt(part_t)}, {vf}")
                    acc = (em.op(f"arith.mulf {a}, {wv[s]} : {vf}") if acc is None else
                           em.op(f"math.fma {a}, {wv[s]}, {acc} : {vf}"))
                at = ", ".join([c(0)] + [c(x) for x in r] + [c(v)])
                out = em.op(f"vector.transfer_write {acc}, {out}[{at}] {{in_bounds = [true]}} "
                            f": {vf}, {tt(acc_t)}")
        return out

    # the items over the cores, as the attention's own (a serial merge left the other
    # threads waiting: ~1 % of SmolLM2's batch-32 decode step)
    return paged_items(em, op, acc_t, item)


class _Tile:
    """One tile of query rows of one work item: the block loop carrying its (m, l, acc)."""

    def __init__(self, em, op, rows, q, b, hh, mb, kpool, vpool, scale):
        self.em, self.op, self.rows, self.b, self.hh = em, op, rows, b, hh
        self.kpool, self.vpool, self.scale = kpool, vpool, scale
        qt, mt = op.types[0], op.types[4]
        self.bs = op.types[1].shape[1]
        self.n = chunk_keys(self.bs)
        self.mb, self.mbt = mb, TensorType((1,) + mt.shape[2:], mt.dtype)
        self.visible = mt.dtype is DType.I1
        self.dv = op.types[2].shape[-1]
        self.vf = f"vector<{LANES}xf32>"
        c = [em.const(o, "index") for o in range(0, qt.shape[-1], LANES)]
        pad = em.const(0.0, "f32")
        self.q = [[em.op(f"vector.transfer_read {q}[{b}, {hh}, "
                         f"{', '.join(_ix(em, i) for i in r)}{', ' if r else ''}{o}]"
                         f", {pad} {{in_bounds = [true]}} : {tt(qt)}, {self.vf}") for o in c]
                  for r in rows]

    def loop(self, w_lo: str, w_hi: str) -> list[str]:
        """The tile's block loop over table entries ``w_lo .. w_hi``: its final ``(m..., l...,
        acc...)``."""
        em, vf, nr, nv = self.em, self.vf, len(self.rows), self.dv // LANES
        state = ([em.const(float("-inf"), "f32")] * nr + [em.const(0.0, "f32")] * nr
                 + [_splat(em, 0.0, LANES)] * (nr * nv))
        types = ["f32"] * (2 * nr) + [vf] * (nr * nv)
        self.w_hi = w_hi
        return scf_for(em, w_lo, w_hi, em.const(1, "index"), state, types, self.block)

    def emit_raw(self, w_lo: str, w_hi: str, res: str, res_t: TensorType, first: int) -> str:
        """The tile's block loop, its rows' unnormalized state written into ``res``
        (``[1, 1, 1, rows, Dv + 2]``: acc, then m and l) from row ``first`` on."""
        em, vf, nr, nv = self.em, self.vf, len(self.rows), self.dv // LANES
        state = self.loop(w_lo, w_hi)
        c0 = em.const(0, "index")
        for i in range(nr):
            row = em.const(first + i, "index")
            for v in range(nv):
                at = ", ".join([c0, c0, c0, row, em.const(v * LANES, "index")])
                res = em.op(f"vector.transfer_write {state[2 * nr + i * nv + v]}, {res}[{at}] "
                            f"{{in_bounds = [true]}} : {vf}, {tt(res_t)}")
            for k, x in ((0, state[i]), (1, state[nr + i])):
                at = ", ".join([c0, c0, c0, row, em.const(self.dv + k, "index")])
                res = em.op(f"tensor.insert {x} into {res}[{at}] : {tt(res_t)}")
        return res

    def emit(self, w_lo: str, w_hi: str, res: str, acc_t: TensorType) -> str:
        """The tile's block loop and its rows' results written into ``res`` (``acc_t``)."""
        em, vf, nr, nv = self.em, self.vf, len(self.rows), self.dv // LANES
        state = self.loop(w_lo, w_hi)
        one = em.const(1.0, "f32")
        for i, r in enumerate(self.rows):
            den = state[nr + i]
            if self.visible:                # no visible key: l = 0, acc = 0, zeros
                den = em.op(f"arith.maximumf {den}, {one} : f32")
            inv = em.op(f"vector.broadcast {em.op(f'arith.divf {one}, {den} : f32')} : f32 "
                        f"to {vf}")
            for v in range(nv):
                o = em.op(f"arith.mulf {state[2 * nr + i * nv + v]}, {inv} : {vf}")
                idx = ", ".join(_ix(em, x) for x in (0, *r, v * LANES))
                res = em.op(f"vector.transfer_write {o}, {res}[{idx}] {{in_bounds = [true]}} "
                            f": {vf}, {tt(acc_t)}")
        return res

    def block(self, wv: str, st: list[str]) -> list[str]:
        em, n = self.em, self.n
        blk = table_block(em, self.op, self.b, wv)
        base = em.op(f"arith.muli {wv}, {em.const(self.bs, 'index')} : index")
        types = ["f32"] * (2 * len(self.rows)) + [self.vf] * (len(st) - 2 * len(self.rows))
        def step(j0: str, s: list[str]) -> list[str]:
            self._prefetch_next(wv, j0)
            return self.chunk(blk, base, j0, s)

        return scf_for(em, em.const(0, "index"), em.const(self.bs, "index"),
                       em.const(n, "index"), st, types, step)

    def _prefetch_next(self, wv: str, j0: str) -> None:
        """Prefetch the K and V rows of the chunk after keys ``j0 ..`` of table entry ``wv``
        (the next block's first chunk after a block's last; the last entry's own rows again
        at the item's end): a decode step's attention reads each sequence's KV from DRAM
        once, one 128-byte row of a head every 384 bytes (SmolLM2's 3 KV heads), a pattern the
        hardware prefetchers follow poorly."""
        if not PREFETCH:
            return
        em, n, bs = self.em, self.n, self.bs
        nxt = em.op(f"arith.addi {j0}, {em.const(n * PREFETCH, 'index')} : index")
        cbs = em.const(bs, "index")
        entry = em.op(f"arith.addi {wv}, {em.op(f'arith.divui {nxt}, {cbs} : index')} : index")
        last = em.op(f"arith.subi {self.w_hi}, {em.const(1, 'index')} : index")
        entry = em.op(f"arith.minui {entry}, {last} : index")
        k0 = em.op(f"arith.remui {nxt}, {cbs} : index")
        blk = table_block(em, self.op, self.b, entry)
        keys = [em.op(f"arith.addi {k0}, {em.const(j, 'index')} : index") for j in range(n)]
        self.kpool.prefetch(blk, keys, self.hh)
        self.vpool.prefetch(blk, keys, self.hh)

    def _keep(self, r: tuple[int, ...], key0: str) -> str:
        """``vector<n x i1>``: which of the chunk's keys (from ``key0`` of the mask's key axis)
        row ``r`` may see (the i1 mask; a bias: not ``-inf``)."""
        em, n, mbt = self.em, self.n, self.mbt
        idx = [em.const(0, "index")] + [_ix(em, x if mbt.shape[1 + a] != 1 else 0)
                                        for a, x in enumerate(r)]
        vi = f"vector<{n}xi1>"
        if mbt.shape[-1] == 1:              # one mask value for every key
            x = em.op(f"tensor.extract {self.mb}[{', '.join(idx + [em.const(0, 'index')])}] "
                      f": {tt(mbt)}")
            if self.visible:
                x = em.op(f"arith.cmpi ne, {x}, {em.const(0, 'i8')} : i8")
                return em.op(f"vector.broadcast {x} : i1 to {vi}")
            return em.op(f"vector.broadcast {x} : f32 to vector<{n}xf32>")
        ty = "i8" if self.visible else "f32"
        pad = em.const(0, "i8") if self.visible else em.const(0.0, "f32")
        m = em.op(f"vector.transfer_read {self.mb}[{', '.join(idx + [key0])}], {pad} "
                  f"{{in_bounds = [true]}} : {tt(mbt)}, vector<{n}x{ty}>")
        if self.visible:
            return em.op(f"arith.cmpi ne, {m}, {_splat(em, 0, n, 'i8')} : vector<{n}xi8>")
        return m

    def chunk(self, blk: str, base: str, j0: str, st: list[str]) -> list[str]:
        """The online-softmax update of the tile's state ``st`` by keys ``j0 .. j0 + n`` of
        block ``blk`` (mask keys from ``base + j0``)."""
        em, n, vf, nr = self.em, self.n, self.vf, len(self.rows)
        nv = self.dv // LANES
        vn = f"vector<{n}xf32>"
        m, lsum, acc = st[:nr], st[nr:2 * nr], st[2 * nr:]
        keys = [em.op(f"arith.addi {j0}, {em.const(j, 'index')} : index") for j in range(n)]
        # scores: per row, one partial-product vector a key, summed across lanes
        parts = [[] for _ in self.rows]
        for key in keys:
            kv = self.kpool.key(blk, key, self.hh)
            for i in range(nr):
                s = em.op(f"arith.mulf {self.q[i][0]}, {kv[0]} : {vf}")
                for qv, k in zip(self.q[i][1:], kv[1:]):
                    s = em.op(f"math.fma {qv}, {k}, {s} : {vf}")
                parts[i].append(s)
        key0 = em.op(f"arith.addi {base}, {j0} : index")
        ninf, sc = _splat(em, float("-inf"), n), _splat(em, self.scale, n)
        probs, new_m, new_l, alphas = [], [], [], []
        for i, r in enumerate(self.rows):
            x = em.op(f"arith.mulf {_hsum(em, parts[i])}, {sc} : {vn}")
            keep = self._keep(r, key0)
            if self.visible:
                x = em.op(f"arith.select {keep}, {x}, {ninf} : vector<{n}xi1>, {vn}")
            else:                            # a -inf bias is -inf whatever the score
                y = em.op(f"arith.addf {x}, {keep} : {vn}")
                dead = em.op(f"arith.cmpf oeq, {keep}, {ninf} : {vn}")
                x = em.op(f"arith.select {dead}, {ninf}, {y} : vector<{n}xi1>, {vn}")
            bmax = em.op(f"vector.reduction <maximumf>, {x} : {vn} into f32")
            mn = em.op(f"arith.maximumf {m[i]}, {bmax} : f32")
            same = em.op(f"arith.cmpf oeq, {m[i]}, {mn} : f32")
            a = em.op(f"math.exp {em.op(f'arith.subf {m[i]}, {mn} : f32')} : f32")
            a = em.op(f"arith.select {same}, {em.const(1.0, 'f32')}, {a} : f32")
            p = vexp(em, em.op(f"arith.subf {x}, "
                               f"{em.op(f'vector.broadcast {mn} : f32 to {vn}')} : {vn}"), n)
            empty = em.op(f"arith.cmpf oeq, {mn}, {em.const(float('-inf'), 'f32')} : f32")
            p = em.op(f"arith.select {empty}, {_splat(em, 0.0, n)}, {p} : {vn}")
            psum = em.op(f"vector.reduction <add>, {p} : {vn} into f32")
            new_l.append(em.op(f"math.fma {lsum[i]}, {a}, {psum} : f32"))
            probs.append(p)
            new_m.append(mn)
            alphas.append(em.op(f"vector.broadcast {a} : f32 to {vf}"))
        new_acc = [em.op(f"arith.mulf {acc[i * nv + v]}, {alphas[i]} : {vf}")
                   for i in range(nr) for v in range(nv)]
        # p . v: a key no row sees adds nothing, whatever its stored values
        zero = _splat(em, 0.0, n)
        live = em.op(f"arith.cmpf une, {probs[0]}, {zero} : {vn}")
        for p in probs[1:]:
            live = em.op(f"arith.ori {live}, {em.op(f'arith.cmpf une, {p}, {zero} : {vn}')} "
                         f": vector<{n}xi1>")
        for j, key in enumerate(keys):
            lj = em.op(f"vector.extract {live}[{j}] : i1 from vector<{n}xi1>")
            vv = self.vpool.key(blk, key, self.hh, lj)
            for i in range(nr):
                pj = em.op(f"vector.broadcast "
                           f"{em.op(f'vector.extract {probs[i]}[{j}] : f32 from {vn}')} : f32 "
                           f"to {vf}")
                for v in range(nv):
                    new_acc[i * nv + v] = em.op(f"math.fma {pj}, {vv[v]}, "
                                                f"{new_acc[i * nv + v]} : {vf}")
        return new_m + new_l + new_acc


__all__ = ["MAX_ROWS", "chunk_keys", "hsum_masks", "paged_attention", "row_tile", "vexp"]
