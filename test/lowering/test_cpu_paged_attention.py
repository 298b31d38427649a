"""The CPU's paged-attention kernel (poot/backends/cpu/attention.py) over q8_0, f16, bf16 and
f32 KV pools against the op's oracle: head dims 32, 64 and 128, GQA groups, several query tokens (the row
tiles), context lengths that end inside a block, block tables whose blocks are out of order
and shared, stale positions whose scales are inf, block sizes whose key chunks are 16, 4 and 2,
an i1 mask, an f32 bias and one mask value for every key; 1 and 2 threads (split items); and
its lane-sum shuffles on indices."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from poot import oracle
from poot.backends.cpu.attention import chunk_keys, hsum_masks, row_tile
from poot.backends.cpu.codegen import compile_cpu, lower_graph, strategy_for
from poot.dialects.kv_quant import Q8_0, quantize_q8_0
from poot.dialects.types import DType, TensorType
from poot.graph.builder import Builder, TraceLimits

F32 = DType.F32
LIMITS = TraceLimits(max_values=100_000, max_ops=100_000, max_literal_bytes=1 << 22,
                     max_owned_bytes=1 << 30)


def _pool(rng, shape, storage):
    """A random pool in ``storage``: the op's arrays (values, and q8_0 scales)."""
    x = rng.standard_normal(shape).astype(np.float32)
    return list(quantize_q8_0(x)) if storage is Q8_0 else [x.astype(storage.numpy)]


def _graph(q, k_arrs, v_arrs, table, mask, scale):
    b = Builder(LIMITS)

    def inp(name, a):
        return b.input(name, TensorType(a.shape, DType.from_numpy(a.dtype)))

    scales = [inp(f"s{i}", a) for i, a in enumerate(k_arrs[1:] + v_arrs[1:])]
    mt = TensorType(mask.shape, DType.I1 if mask.dtype == bool else F32)
    out = b.op("paged_attention", [inp("q", q), inp("kp", k_arrs[0]), inp("vp", v_arrs[0]),
                                   inp("bt", table), b.input("m", mt), *scales],
               {"scale": scale, "softcap": 0.0})
    return b.finish(out)


def _case(rng, *, d, kv_heads, group, tokens, bs, lengths, k_st=Q8_0, v_st=Q8_0,
          bias=False):
    """Sequences of ``lengths`` keys over a shuffled, partly shared block table; query token t
    of a sequence sees its first ``length - tokens + 1 + t`` keys (causal); every position no
    sequence sees holds an inf scale (a q8_0 pool) or inf values (a float one)."""
    bsz, w = len(lengths), -(-max(lengths) // bs) + 1
    nb = bsz * w + 2
    table = rng.permutation(nb)[:bsz * w].reshape(bsz, w).astype(np.int32)
    table[-1, -1] = table[0, -1]                        # a block in two rows of the table
    k_arrs = _pool(rng, (nb, bs, kv_heads, d), k_st)
    v_arrs = _pool(rng, (nb, bs, kv_heads, d), v_st)
    seen = np.zeros((nb, bs), bool)
    for s, n in enumerate(lengths):
        for j in range(n):
            seen[table[s, j // bs], j % bs] = True
    for arrs in (k_arrs, v_arrs):
        arrs[-1][~seen] = np.inf
    keys = np.arange(w * bs)
    vis = np.stack([keys[None, :] < (n - tokens + 1 + np.arange(tokens))[:, None]
                    for n in lengths])                  # [B, T, S]
    mask = vis[:, None, None, :, :]                      # [B, 1, 1, T, S]
    if bias:
        mask = np.where(mask, rng.standard_normal(mask.shape), -np.inf).astype(np.float32)
    q = rng.standard_normal((bsz, kv_heads, group, tokens, d)).astype(np.float32)
    g = _graph(q, k_arrs, v_arrs, table, mask, 1.0 / np.sqrt(d))
    ins = {"q": q, "kp": k_arrs[0], "vp": v_arrs[0], "bt": table, "m": mask}
    ins.update({f"s{i}": a for i, a in enumerate(k_arrs[1:] + v_arrs[1:])})
    return g, ins


CASES = {
    "d32-gqa4-decode": dict(d=32, kv_heads=2, group=4, tokens=1, bs=32, lengths=[37, 70]),
    "d64-gqa3-decode": dict(d=64, kv_heads=3, group=3, tokens=1, bs=32, lengths=[100, 5]),
    "d128-gqa2-decode": dict(d=128, kv_heads=2, group=2, tokens=1, bs=32, lengths=[33, 95]),
    "d128-gqa4-3-tokens": dict(d=128, kv_heads=1, group=4, tokens=3, bs=16, lengths=[50, 19]),
    "d64-mha-bs12": dict(d=64, kv_heads=2, group=1, tokens=2, bs=12, lengths=[29, 13]),
    "d64-bs6-f16-k": dict(d=64, kv_heads=2, group=2, tokens=1, bs=6, lengths=[17, 9],
                          k_st=DType.F16),
    "d32-q8-k-f16-v-bias": dict(d=32, kv_heads=2, group=3, tokens=2, bs=8, lengths=[21, 40],
                                v_st=DType.F16, bias=True),
    "d64-bias": dict(d=64, kv_heads=3, group=3, tokens=1, bs=32, lengths=[45, 64], bias=True),
    # more than MAX_ROWS rows a work item (prefill chunks): the full row tiles as a loop
    "d64-gqa3-8-tokens": dict(d=64, kv_heads=3, group=3, tokens=8, bs=32, lengths=[40, 71]),
    "d64-gqa3-7-tokens-rest": dict(d=64, kv_heads=1, group=3, tokens=7, bs=16, lengths=[30]),
    "d128-gqa2-9-tokens-bias": dict(d=128, kv_heads=2, group=2, tokens=9, bs=32,
                                    lengths=[64, 20], bias=True),
    # one sequence, an odd number of KV heads: with 2 threads each item's blocks are split
    "d64-gqa3-one-seq": dict(d=64, kv_heads=3, group=3, tokens=1, bs=32, lengths=[200]),
    "d32-one-block": dict(d=32, kv_heads=1, group=2, tokens=1, bs=32, lengths=[7]),
    "d128-one-seq-bias": dict(d=128, kv_heads=1, group=2, tokens=2, bs=16, lengths=[77],
                              bias=True),
    # float pools (f16: the default KV storage; bf16, f32), decode, verify and prefill rows
    "f16-d64-gqa3-decode": dict(d=64, kv_heads=3, group=3, tokens=1, bs=32, lengths=[100, 5],
                                k_st=DType.F16, v_st=DType.F16),
    "f16-d64-gqa3-one-seq": dict(d=64, kv_heads=3, group=3, tokens=1, bs=32, lengths=[200],
                                 k_st=DType.F16, v_st=DType.F16),
    "f16-d128-9-tokens-bias": dict(d=128, kv_heads=2, group=2, tokens=9, bs=32,
                                   lengths=[64, 20], bias=True, k_st=DType.F16,
                                   v_st=DType.F16),
    "bf16-d64-3-tokens-bs12": dict(d=64, kv_heads=2, group=2, tokens=3, bs=12, lengths=[29, 13],
                                   k_st=DType.BF16, v_st=DType.BF16),
    "f32-d32-gqa4-8-tokens": dict(d=32, kv_heads=2, group=4, tokens=8, bs=16, lengths=[40, 71],
                                  k_st=F32, v_st=F32),
}


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("name", list(CASES))
def test_cpu_kernel_matches_oracle(name, threads):
    """The kernel's result equals the oracle's (f32 summation order: 1e-5), stale
    positions and shared blocks included; on one thread, and on two (where the items do
    not spread evenly, each item's blocks split in parts merged after)."""
    g, ins = _case(np.random.default_rng(len(name)), **CASES[name])
    want = next(iter(oracle.evaluate(g, ins).values()))
    got = next(iter(compile_cpu(g, strategy=strategy_for(threads=threads)).run(ins, {})
                    .values()))
    assert np.isfinite(want).all()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_cpu_takes_every_pool_storage_with_its_kernel_and_a_soft_cap_to_the_generic_lowering():
    """q8_0 and f16 pools are lowered by the CPU kernel (their values widened in registers:
    vector<16xi8> / vector<16xf16> to f32, no dequantized or f32 tile of a block, no linalg
    over the block: only the two reductions that find a sequence's visible keys); an f16
    attention with a soft cap keeps the generic lowering (a dozen linalg ops a block)."""
    case = dict(d=64, kv_heads=2, group=3, tokens=1, bs=32, lengths=[40, 9])
    rng = np.random.default_rng(0)
    texts = {}
    for st in (Q8_0, DType.F16):
        g, _ = _case(rng, k_st=st, v_st=st, **case)
        module, _ = lower_graph(g, strategy_for(threads=2))
        texts[st] = str(module)
    assert "arith.sitofp" in texts[Q8_0] and "vector<16xi8> to vector<16xf32>" in texts[Q8_0]
    assert "vector<16xf16> to vector<16xf32>" in texts[DType.F16]
    for text in texts.values():
        assert "tensor<32x1x2x32xf32>" not in text and "tensor<32x1x64xf32>" not in text
        assert text.count("linalg.generic") == 2
    g, ins = _case(rng, k_st=DType.F16, v_st=DType.F16, **case)
    b = Builder(LIMITS)
    args = [b.input(n, TensorType(a.shape, DType.from_numpy(a.dtype))) for n, a in ins.items()
            if n != "m"]
    mask = b.input("m", TensorType(ins["m"].shape, DType.I1))
    out = b.op("paged_attention", [*args[:4], mask], {"scale": 0.125, "softcap": 30.0})
    module, _ = lower_graph(b.finish(out), strategy_for(threads=2))
    assert str(module).count("linalg.generic") > 6 and "vector<16xf16>" not in str(module)


@pytest.mark.parametrize("n", [1, 2, 4, 8, 16])
def test_lane_sums_sum_each_vector_into_its_lane(n):
    """Run :func:`hsum_masks`' shuffles on lane labels: lane j of the result holds exactly
    the 16 lanes of vector j."""
    vecs = [[{(v, lane)} for lane in range(16)] for v in range(n)]
    for lo, hi in hsum_masks(n):
        pairs = list(zip(vecs[::2], vecs[1::2])) if len(vecs) > 1 else [(vecs[0], vecs[0])]
        vecs = [[(a + b)[i] | (a + b)[j] for i, j in zip(lo, hi)] for a, b in pairs]
    (out,) = vecs
    assert out == [{(v, lane) for lane in range(16)} for v in range(n)]


def test_splits_spread_the_items_over_the_cores():
    """Items split into parts only where one sequence's KV heads do not spread evenly over
    the cores, whatever the batch size."""
    from poot.backends.cpu.attention import splits

    def parts(b, h, cores):
        op = SimpleNamespace(strategy=strategy_for(threads=cores),
                             types=[None, TensorType((9, 32, h, 64), DType.I8), None,
                                    TensorType((b, 4), DType.I32)])
        return splits(op)

    assert [parts(1, 3, 2), parts(1, 1, 2), parts(2, 2, 2), parts(1, 3, 1), parts(1, 9, 2),
            parts(1, 3, 4), parts(2, 3, 2), parts(8, 3, 2)] == [2, 2, 1, 1, 1, 4, 2, 2]


def test_tiles_and_chunks():
    """Row tiles keep 16 accumulator registers; key chunks are the largest power of two
    dividing the block size, at most 16."""
    assert [row_tile(d) for d in (32, 64, 128, 256)] == [8, 4, 2, 1]
    assert [chunk_keys(bs) for bs in (32, 16, 12, 8, 6, 5)] == [16, 16, 4, 8, 2, 1]


@pytest.mark.parametrize("threads", [1, 2])
def test_cpu_kernel_with_one_mask_value_for_every_key(threads):
    """A mask of one value for every key (``[1, 1, 1, 1, 1]``: the flash-attention rewrite's
    zero bias when the composition has no mask; and an i1 all-visible one): every key of
    every table entry attends, as the oracle says."""
    rng = np.random.default_rng(3)
    bs, w, h, d = 32, 3, 3, 64
    table = np.array([[5, 0, 2]], np.int32)
    k_arrs = _pool(rng, (6, bs, h, d), Q8_0)
    v_arrs = _pool(rng, (6, bs, h, d), Q8_0)
    q = rng.standard_normal((1, h, 3, 1, d)).astype(np.float32)
    for mask in (np.zeros((1, 1, 1, 1, 1), np.float32), np.ones((1, 1, 1, 1, 1), bool)):
        g = _graph(q, k_arrs, v_arrs, table, mask, 0.125)
        ins = {"q": q, "kp": k_arrs[0], "vp": v_arrs[0], "bt": table, "m": mask,
               "s0": k_arrs[1], "s1": v_arrs[1]}
        want = next(iter(oracle.evaluate(g, ins).values()))
        got = next(iter(compile_cpu(g, strategy=strategy_for(threads=threads)).run(ins, {})
                        .values()))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_sequence_gets_the_same_bits_whatever_its_batch():
    """Batch invariance on two threads: a decoding sequence (SmolLM2's 3 KV heads, GQA 3)
    alone and as row 0 of a batch of 2 gets bit-identical attention, so a request's tokens
    do not depend on what it is batched with (with q8_0 pools a last-bit difference moves a
    later key across a rounding edge, and greedy tokens change)."""
    case = dict(d=64, kv_heads=3, group=3, tokens=1, bs=32)
    g2, ins2 = _case(np.random.default_rng(7), lengths=[150, 90], **case)
    ins1 = dict(ins2, q=ins2["q"][:1], bt=ins2["bt"][:1], m=ins2["m"][:1])
    g1 = _graph(ins1["q"], [ins1["kp"], ins1["s0"]], [ins1["vp"], ins1["s1"]], ins1["bt"],
                ins1["m"], 1.0 / np.sqrt(case["d"]))
    strategy = strategy_for(threads=2)
    alone = next(iter(compile_cpu(g1, strategy=strategy).run(ins1, {}).values()))
    batched = next(iter(compile_cpu(g2, strategy=strategy).run(ins2, {}).values()))
    np.testing.assert_array_equal(alone[0], batched[0])
