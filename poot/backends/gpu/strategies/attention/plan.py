"""Plan: the block shapes of the flash-decoding kernels (:func:`plan_attention`): rows per
block, lanes per key, keys per chunk and chunks, subgroups per block, from the region's shapes
and the target's subgroup size, workgroup memory and core count.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from poot.backends.gpu.strategies.attention.match import AttentionRegion
from poot.dialects.types import DType

#: register budget of the split kernel: accumulators per lane (rows x Dv / subgroup)
MAX_ACC_PER_LANE = 64
#: query rows one split block serves at most
MAX_ROWS = 16
#: split blocks aimed for per core (fills the GPU for decode, where rows are few)
BLOCKS_PER_CORE = 4
#: grid dimensions this strategy emits at most (Vulkan's guaranteed minimum)
MAX_GRID = 65535
#: subgroups one block of the single-kernel path holds at most
MAX_SUBGROUPS = 16
#: threads per block at most (256 when a lane holds more than MAX_ACC_PER_LANE / 2
#: accumulators: CUDA then keeps up to 255 registers per thread)
MAX_BLOCK_THREADS = 512
#: keys one subgroup walks at most (at the full capacity S) for the single-kernel path; past
#: it the key axis is split over blocks and a combine launch merges them (see plan_attention)
SINGLE_MAX_KEYS = 64
#: key elements (keys x head dim) the busiest subgroup of the single-kernel path may walk at
#: the full capacity S. Measured on an H200 (graph-replayed, bench/gpu_run/attn_bench.py):
#: with D = 128 (8 kv heads: 8 blocks) one launch beat split + combine at S = 512 (32 keys a
#: warp: 5.2-20.7 us over positions 0-511 against a flat 15-16 us) but lost at S = 1024 (64
#: keys: up to 37 us against 17.8); with D = 64, 64 keys a warp (S = 1024) still won on
#: average over the positions
SINGLE_MAX_KEY_ELEMS = 64 * 64
#: threads a block whose kernel reads a q8_0 K pool as 32-bit words holds at most (four
#: values a load, :meth:`~.emit.SplitKernel.k_words`): CUDA then leaves a thread up to 255
#: registers (at 512 threads, 64, which word loads overran at D = 128)
WORD_MAX_THREADS = 256
#: query rows per block at most for the single-kernel path (decode: the q heads of a kv head)
SINGLE_MAX_ROWS = 8
#: block-table entries a paged block stages in workgroup memory at most (4 KiB): a chunk
#: spans at most this many KV blocks (longer chunks split)
TABLE_MAX_ENTRIES = 1024


@dataclass(frozen=True)
class AttentionPlan:
    """``sg`` lanes per subgroup, ``DL`` lanes per key (``KL = sg // DL`` keys at a time);
    ``R`` rows per block, ``RG`` row groups; ``C`` keys per chunk, ``NS`` chunks (splits);
    ``CT`` threads per combine block; ``W`` subgroups per split block (``TB = W * sg``
    threads), which walk the chunk's key batches interleaved and merge their states through
    workgroup memory. ``scale_words``: the q8_0 scales planes are read as 32-bit words, two
    f16 scales a word decoded in registers (a target without 16-bit storage:
    :func:`scale_words`)."""

    sg: int
    DL: int
    R: int
    RG: int
    C: int
    NS: int
    CT: int
    W: int = 1
    scale_words: bool = False

    @property
    def KL(self) -> int:
        return self.sg // self.DL

    @property
    def TB(self) -> int:
        return self.W * self.sg


def _pow2_floor(n: int) -> int:
    p = 1
    while 2 * p <= n:
        p *= 2
    return p


def unroll(D: int, DL: int) -> tuple[int, int, int]:
    """How the split kernel walks a key's ``D`` elements over its ``DL`` lanes: ``V``
    consecutive elements per step, ``J`` steps, ``JU`` of them unrolled (their loads issue
    together)."""
    V = next(x for x in (4, 2, 1) if D % (DL * x) == 0)
    J = D // (DL * V)
    JU = max(1, min(J, 16 // V))
    while J % JU:
        JU -= 1
    return V, J, JU


def batch_rounds(D: int, sg: int, DL: int) -> int:
    """Dependent memory round trips of one key batch in the split kernel: the unrolled rounds
    of K loads (``J / JU``) then the rounds of V loads (``KL / TU``, ``TU = min(KL, 8)``)."""
    _, J, JU = unroll(D, DL)
    KL = sg // DL
    return J // JU + -(-KL // min(KL, 8))


def table_entries(reg: AttentionRegion, C: int) -> int:
    """Block-table entries a block of a paged region stages for a chunk of ``C`` keys (the
    KV blocks a chunk ``[s, s + C)`` can touch; 0 for a dense region)."""
    pg = reg.paged
    if pg is None:
        return 0
    n = C // pg.bs if C % pg.bs == 0 else (C + pg.bs - 2) // pg.bs + 1
    return max(1, min(pg.TW, n))


def subgroup_budget(reg: AttentionRegion, caps, sg: int, R: int, C: int,
                    words: bool = False) -> int:
    """The most subgroups (a power of two, at most :data:`MAX_SUBGROUPS`) a block of ``R``
    rows walking a chunk of ``C`` keys holds, or 0 when not even one fits: within its threads
    (:data:`MAX_BLOCK_THREADS`, half where a lane holds many accumulators;
    :data:`WORD_MAX_THREADS` with ``words``) and the workgroup memory (a computed q of ``R x
    D``, the chunk's block-table entries, and each subgroup's partial states, ``R x (Dv +
    2)`` f32)."""
    ndv = -(-reg.Dv // sg)
    threads = MAX_BLOCK_THREADS if R * ndv <= MAX_ACC_PER_LANE // 2 else MAX_BLOCK_THREADS // 2
    if words:
        threads = min(threads, WORD_MAX_THREADS)
    w = _pow2_floor(max(1, min(MAX_SUBGROUPS, threads // sg)))
    shared = getattr(caps, "max_shared_bytes", 0) or 16384
    fixed = (4 * R * reg.D if reg.q is None else 0) + 4 * table_entries(reg, C)
    while w > 1 and fixed + 4 * w * R * (reg.Dv + 2) > shared:
        w //= 2
    return w if fixed + 4 * w * R * (reg.Dv + 2) <= shared else 0


def _single_plan(reg: AttentionRegion, caps, sg: int, R: int, RG: int, dl_max: int,
                 CT: int) -> AttentionPlan | None:
    """The one-launch plan (``NS = 1``, ``W`` subgroups per block), or None when a subgroup
    would walk more than :data:`SINGLE_MAX_KEYS` keys or :data:`SINGLE_MAX_KEY_ELEMS` key
    elements (or nothing fits)."""
    # a paged region stages its whole table row (one chunk: every key)
    if table_entries(reg, reg.S) > TABLE_MAX_ENTRIES:
        return None
    wmax = subgroup_budget(reg, caps, sg, R, reg.S)
    if wmax == 0:
        return None
    best = None
    DL = 1
    while DL <= dl_max:
        if reg.D % DL == 0:
            KL = sg // DL
            nb = -(-reg.S // KL)                  # key batches at capacity
            W = 1
            while W <= wmax:
                per = -(-nb // W)                 # batches of the busiest subgroup
                key = (per * batch_rounds(reg.D, sg, DL), W, -DL)
                if best is None or key < best[0]:
                    best = (key, W, DL, per * KL)
                W *= 2
        DL *= 2
    if best is None or best[3] > SINGLE_MAX_KEYS or best[3] * reg.D > SINGLE_MAX_KEY_ELEMS:
        return None
    _, W, DL, _ = best
    KL = sg // DL
    C = -(-reg.S // KL) * KL
    return AttentionPlan(sg, DL, R, RG, C, 1, CT, W)


def split_subgroups(reg: AttentionRegion, caps, sg: int, R: int, C: int, KL: int) -> int:
    """Subgroups a split block of ``R`` rows gives its chunk of ``C`` keys (batches of
    ``KL``): the fewest (a power of two) with which the busiest walks at most
    :data:`SINGLE_MAX_KEYS` keys, within :data:`MAX_SUBGROUPS`, the block's threads
    (:data:`MAX_BLOCK_THREADS`, half where a lane holds many accumulators) and the
    workgroup memory (a computed q, the chunk's table entries and the subgroups' partial
    states).

    Few sequences give many short chunks (the split plan's aim), so 1 subgroup; many
    sequences at a long capacity give few long ones. Measured on an H100
    (``bench/gpu_run/attn_bench.py``, paged f16, 1B shape, us a layer): B = 64 at 2,048
    keys (two chunks of 1,024) 112 / 364 with 16 subgroups against 226 / 429 with one, at
    positions 511 / 2,047; B = 16 (five chunks of 416) 60 / 77 / 133 with 8 against
    93 / 122 / 152 at 512 / 1,024 / 2,047. The single-kernel plan's tighter
    :data:`SINGLE_MAX_KEY_ELEMS` is not applied: with it one Llama-3-8B sequence at 4,096
    keys took 2 subgroups, no faster overall (0.89-1.11x of 1 by position), and ptxas
    spilled that kernel.

    A q8_0 K pool keeps its blocks within :data:`WORD_MAX_THREADS`, where its kernel reads
    K as words (:meth:`~poot.backends.gpu.strategies.attention.emit.SplitKernel.k_words`):
    at B = 64 and 2,048 keys, 8 subgroups reading words measured 59 / 172 us a layer at
    positions 511 / 2,047, against 144 / 306 for one (words) and 118 / 377 for 16 (bytes);
    bf16 pools 113 / 361."""
    wmax = min(max(1, subgroup_budget(reg, caps, sg, R, C,
                                      words=reg.paged is not None
                                      and reg.paged.k_scale is not None)),
               _pow2_floor(max(1, C // KL)))
    W = 1
    while W < wmax and -(-(C // KL) // W) * KL > SINGLE_MAX_KEYS:   # the busiest's keys
        W *= 2
    return W


def scale_words(reg: AttentionRegion, caps) -> bool:
    """Whether a q8_0 region's f16 scales are read as 32-bit words on a target of ``caps``:
    where the target stores no f16 (wgpu: naga has no 16-bit storage; the planes keep their
    f16 bytes, :func:`poot.passes.legalize.kv_scale_planes`)."""
    pg = reg.paged
    return pg is not None and (pg.k_scale or pg.v_scale) is not None and \
        DType.F16 not in getattr(caps, "storage_dtypes", (DType.F16,))


def plan_attention(reg: AttentionRegion, caps) -> AttentionPlan | None:
    """:func:`plan_blocks`, reading the scales as words where :func:`scale_words` says
    (None: not plannable here, also for a scales plane of an odd number of f16s then)."""
    plan = plan_blocks(reg, caps)
    if plan is None or not scale_words(reg, caps):
        return plan
    if any(reg.arg_types[x.arg][1] % 2 for x in (reg.paged.k_scale, reg.paged.v_scale) if x):
        return None
    return replace(plan, scale_words=True)


def plan_blocks(reg: AttentionRegion, caps) -> AttentionPlan | None:
    """Block shapes for ``reg`` on a target of ``caps`` (None: not plannable here).

    Rows: all rows of a batch index per block up to the register budget
    (:data:`MAX_ROWS`, :data:`MAX_ACC_PER_LANE`; a computed q's staging buffer within the
    workgroup memory).

    *Split* plan (one subgroup per block): aim for :data:`BLOCKS_PER_CORE` split blocks per
    core, each as short a serial chain as that allows. Lanes per key ``DL``: the fewest (a
    power of two dividing ``D``, at most ``D / 8`` and the subgroup) with which one-batch
    chunks would give enough blocks, so few rows (decode) split each dot product over lanes
    and many rows (prefill) give each lane its own key. Chunk ``C``: whole batches of ``KL``
    keys, as many chunks as the block budget asks; a combine launch merges them. Where many
    row groups leave few, long chunks, ``W`` subgroups share a chunk
    (:func:`split_subgroups`).

    *Single-kernel* plan, taken where the split plan needs more than one chunk or its one
    chunk is more than one key batch (a subgroup alone walking it serially): ``NS = 1``,
    ``W`` subgroups per block (at most :data:`MAX_SUBGROUPS` and :data:`MAX_BLOCK_THREADS`
    threads, their partial states within the workgroup memory) walking the key batches
    interleaved, merged in the block; no combine launch, no scratch. Among the ``(W, DL)``
    that fit, the one whose busiest subgroup has the fewest dependent memory round trips
    (:func:`batch_rounds` times its batches), ties to fewer subgroups then more lanes per
    key. It is taken when that subgroup walks at most :data:`SINGLE_MAX_KEYS` keys at the
    capacity ``S``, for blocks of at most :data:`SINGLE_MAX_ROWS` rows.

    Why: a decode step is launch-latency bound (a CUDA-graph node costs ~2.5-3.6 us on an
    H200; a global round trip with its shuffles ~0.3-0.5 us), and the split plan's chain is
    already one or two key batches, so one launch wins while a subgroup's chain costs about
    what the extra launch and the combine's loads cost: 64 keys are 16 (D = 64) to 24
    (D = 128) round trips at full capacity, half that at an average position; measured,
    D = 128 needs the tighter :data:`SINGLE_MAX_KEY_ELEMS` (32 keys). Decode with
    S = 256-512 and 8 kv heads or fewer (32 keys a subgroup with W = 16) takes it. The plan
    is static (``S`` is the cache capacity), but with a causal mask the key batches past the
    position are skipped, so the chain follows the visible keys, and interleaving the
    batches over the subgroups keeps them evenly loaded then. Longer contexts (S = 4096: 256
    keys a subgroup) keep the split over the whole GPU, and so do regions whose row groups
    give one chunk of one batch and prefill-shaped blocks of more than
    :data:`SINGLE_MAX_ROWS` rows (the same kernels as before: their per-batch shuffles grow
    with the rows, which the round-trip count does not model). Many row groups (decode at
    B = 128 with 8 kv heads: 1,024 groups) fill the GPU with one chunk each, but then one
    subgroup would walk all ``S`` keys alone: measured on an H100 in the 1B's step, that
    took 1.11 ms at B = 128 against 0.28 ms at B = 64 (16 subgroups a block); the single
    plan took 0.56 ms. The bound is a model's, to be calibrated on the device
    (``bench/gpu_run/attn_bench.py``)."""
    sg = getattr(caps, "subgroup_size", None)
    if not sg or sg & (sg - 1) or sg > 128:
        return None                          # butterflies need a known power-of-two width
    ndv = -(-reg.Dv // sg)
    rmax = max(1, min(MAX_ROWS, MAX_ACC_PER_LANE // ndv))
    shared = getattr(caps, "max_shared_bytes", 0) or 16384   # Vulkan's guaranteed minimum
    # a paged region stages a chunk's block-table entries (at most TABLE_MAX_ENTRIES)
    tbytes = 4 * min(reg.paged.TW, TABLE_MAX_ENTRIES) if reg.paged else 0
    if reg.q is None:
        # a computed q is staged in workgroup memory: R rows x D f32
        rmax = min(rmax, (shared - tbytes) // (4 * reg.D))
        if rmax < 1:
            return None
    elif tbytes > shared:
        return None
    RG = -(-reg.M // rmax)
    R = -(-reg.M // RG)
    want = BLOCKS_PER_CORE * max(1, int(getattr(caps, "cores", 1) or 1))
    groups = reg.B * RG
    dl_max = _pow2_floor(max(1, min(sg, reg.D // 8)))
    while reg.D % dl_max:
        dl_max //= 2
    DL = 1
    while DL < dl_max and groups * -(-reg.S * DL // sg) < want:
        DL *= 2
    KL = sg // DL
    ns = max(1, -(-want // groups))
    C = -(-reg.S // ns)
    C = max(KL, -(-C // KL) * KL)
    while table_entries(reg, C) > TABLE_MAX_ENTRIES:
        C = max(KL, (C // 2) // KL * KL)        # a chunk spans at most that many KV blocks
    NS = -(-reg.S // C)
    CT = max(sg, min(256, 4 * sg))
    if RG > MAX_GRID or reg.B > MAX_GRID or NS > MAX_GRID or \
            -(-reg.B * reg.M * reg.Dv // CT) > MAX_GRID * MAX_GRID:
        return None
    if (NS > 1 or C > KL) and R <= SINGLE_MAX_ROWS:
        single = _single_plan(reg, caps, sg, R, RG, dl_max, CT)
        if single is not None:
            return single
    W = split_subgroups(reg, caps, sg, R, C, KL) if R <= SINGLE_MAX_ROWS else 1
    return AttentionPlan(sg, DL, R, RG, C, NS, CT, W)


__all__ = ["AttentionPlan", "batch_rounds", "plan_attention", "plan_blocks", "scale_words",
           "split_subgroups", "subgroup_budget", "table_entries", "unroll"]
