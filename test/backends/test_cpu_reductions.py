"""The CPU backend splits long exact row reductions into vector lanes
(:mod:`poot.backends.cpu.reductions`) and vectorizes the split: the greedy sampler's max,
argmax and non-finite checks are split and become vector code, every exact result is bitwise
what numpy computes (ties of the argmax take the lowest index, NaN and infinities as
before), and an f32 sum is split in its documented order: 16 lane sums, each in element
order, then the lanes in order (computed independently here with numpy's sequential
``cumsum``), the same bits for a row in any batch."""

from __future__ import annotations

import numpy as np
import pytest
from mlir import ir
from mlir.passmanager import PassManager

from poot.backends.cpu import codegen as cpu
from poot.backends.cpu.reductions import (VECTORIZE, split_row_reductions,
                                          vectorize_split_reductions)
from poot.backends.pass_pipelines import FUSE
from poot.dialects.types import DType, TensorType
from poot.graph.builder import Builder, TraceLimits
from poot.graph.sampling import GREEDY, SamplerStep, trace_sampler

LIMITS = TraceLimits(max_values=10_000, max_ops=10_000, max_literal_bytes=1 << 20,
                     max_owned_bytes=1 << 28)


def _fused(graph) -> ir.Module:
    module, _ = cpu.lower_graph(graph, cpu.strategy_for())
    with module.context:
        PassManager.parse(f"builtin.module({FUSE})").run(module.operation)
    return module


def test_the_greedy_samplers_three_vocabulary_reductions_are_split():
    module = _fused(trace_sampler(SamplerStep(4, 49152, 5, GREEDY)))
    assert split_row_reductions(module) == 3     # non-finite check, max, argmax
    module.operation.verify()
    assert split_row_reductions(module) == 0     # what is split stays split


def test_the_greedy_samplers_split_reductions_become_vector_code():
    """All three partial reductions (the non-finite check's i1 "or" on bytes too, as a byte
    max) are tiled and vectorized: 64 x 16-lane reads a tile, no scalar partial left."""
    module = _fused(trace_sampler(SamplerStep(4, 49152, 5, GREEDY)))
    split_row_reductions(module)
    assert vectorize_split_reductions(module) == 3
    module.operation.verify()
    text = str(module)
    assert VECTORIZE not in text and "transform." not in text
    assert text.count("vector<64x16xf32>") >= 2 and "arith.maxui" in text
    assert "vector<64x16xi8>" in text or "vector<64x16xi1>" in text


def test_a_batch_of_rows_is_reduced_over_the_threads_and_one_row_alone():
    """With 2 threads the greedy sampler's partial reductions at B = 4 are cut into an
    ``scf.forall`` of 2 row chunks before vectorizing (each row reduced as before: the bitwise
    tests below run with the host's threads); a single row stays one loop."""
    for rows, foralls in ((4, 3), (1, 0)):
        module = _fused(trace_sampler(SamplerStep(rows, 49152, 5, GREEDY)))
        split_row_reductions(module)
        assert vectorize_split_reductions(module, threads=2) == 3
        module.operation.verify()
        text = str(module)
        assert text.count("scf.forall (") == foralls, rows
        assert text.count("vector<64x16xf32>") >= 2


def _lane_order_sum(x: np.ndarray, lanes: int = 16) -> np.ndarray:
    """Row sums of f32 ``x`` [R, K] in the split's order (module doc of
    poot.backends.cpu.reductions): lane j adds ``x[:, j], x[:, j + 16], ...`` from -0.0 in
    order, then 0.0 + lane 0 + lane 1 + ... (``cumsum`` in float32 is sequential)."""
    r, k = x.shape
    parts = np.concatenate([np.full((r, 1, lanes), -0.0, np.float32),
                            x.reshape(r, k // lanes, lanes)], axis=1)
    lane_sums = np.cumsum(parts, axis=1, dtype=np.float32)[:, -1, :]
    return np.cumsum(np.concatenate([np.zeros((r, 1), np.float32), lane_sums], axis=1),
                     axis=1, dtype=np.float32)[:, -1]


def test_an_f32_sum_is_split_in_lane_order_and_batch_invariant():
    """A vocabulary-long f32 sum is split (and vectorized): every row is bitwise the lanes'
    order sum, which is not the sequential sum's bits on this data (the order really
    changed), and a row's sum is the same in a batch of 1 and of 5."""
    def program(rows):
        b = Builder(LIMITS)
        x = b.input("x", TensorType((rows, 4096), DType.F32))
        return b.finish({"s": b.reduce("sum", x, 1)})

    module = _fused(program(4))
    assert split_row_reductions(module) == 1
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((5, 4096)) * np.exp(rng.uniform(-8, 8, (5, 4096)))
         ).astype(np.float32)
    got = cpu.compile_cpu(program(5)).run({"x": x})["s"]
    np.testing.assert_array_equal(got, _lane_order_sum(x))
    sequential = np.cumsum(x, axis=1, dtype=np.float32)[:, -1]
    assert (got != sequential).any()
    alone = cpu.compile_cpu(program(1)).run({"x": x[2:3]})["s"]
    np.testing.assert_array_equal(alone, got[2:3])


def _reductions(rows: int, vocab: int):
    b = Builder(LIMITS)
    x = b.input("x", TensorType((rows, vocab), DType.F32))
    i = b.input("i", TensorType((rows, vocab), DType.I32))
    return b.finish({
        "max": b.reduce("max", x, 1), "min": b.reduce("min", x, 1),
        "imax": b.reduce("max", i, 1), "imin": b.reduce("min", i, 1),
        "isum": b.reduce("sum", i, 1),
        "any_nan": b.reduce("max", b.compare("ne", x, x), 1),
        "argmax": trace_argmax(b, x, vocab)})


def trace_argmax(b, x, vocab):
    """The lowest index of each row's maximum (the greedy sampler's form)."""
    m = b.reduce("max", x, 1, keepdims=True)
    idx = b.iota(x.shape, 1)
    hit = b.select(b.compare("eq", x, m), idx, b.full(x.shape, vocab, DType.I32))
    return b.reduce("min", hit, 1)


@pytest.mark.parametrize("rows,vocab", [(6, 4096), (6, 49152), (40, 49152)])
def test_split_reductions_match_numpy_bitwise(rows, vocab):
    """(40 rows of 49,152: more tiles than a stack buffer a tile would survive.)"""
    rng = np.random.default_rng(vocab)
    x = rng.standard_normal((rows, vocab)).astype(np.float32)
    x[1, [7, 4000, vocab - 1]] = 9.0                 # ties: the lowest index wins
    x[2, 1234] = np.nan                              # NaN: max NaN, no index matches
    x[3, :] = -np.inf
    x[4, 3000] = np.inf
    x[5, :] = 0.5                                    # all equal
    i = rng.integers(-2**31, 2**31 - 1, (rows, vocab), dtype=np.int64).astype(np.int32)
    i[0, 5] = np.iinfo(np.int32).min
    i[1, vocab - 3] = np.iinfo(np.int32).max
    prog = cpu.compile_cpu(_reductions(rows, vocab))
    out = prog.run({"x": x, "i": i})
    np.testing.assert_array_equal(out["max"], x.max(1))
    np.testing.assert_array_equal(out["min"], x.min(1))
    np.testing.assert_array_equal(out["imax"], i.max(1))
    np.testing.assert_array_equal(out["imin"], i.min(1))
    np.testing.assert_array_equal(out["isum"], i.sum(1, dtype=np.int32))
    np.testing.assert_array_equal(out["any_nan"].astype(bool), np.isnan(x).any(1))
    m = x.max(1, keepdims=True)
    want = np.where(x == m, np.arange(vocab), vocab).min(1)
    np.testing.assert_array_equal(out["argmax"], want)
    assert want[1] == 7 and want[2] == vocab and want[5] == 0
