"""Small pieces of the serving engine: batch buckets, the sampler-spec union, block sizes by
target, and the benchmark's steady-rate rule."""

from __future__ import annotations

import pytest

from poot.compiler import Capabilities, Target
from poot.compiler.planning import kv_block_size
from poot.sampling_params import SamplingParams
from poot.engine import decode_buckets, sampler_spec_for
from poot.graph.sampling import GREEDY


def test_decode_buckets():
    assert decode_buckets(1) == (1,)
    assert decode_buckets(8) == (1, 2, 4, 8)
    assert decode_buckets(12) == (1, 2, 4, 8, 12)
    with pytest.raises(ValueError):
        decode_buckets(0)


def test_sampler_spec_is_the_union_of_the_batch():
    g = SamplingParams(temperature=0)
    assert sampler_spec_for([g, g]) == GREEDY
    s = sampler_spec_for([g, SamplingParams(temperature=0.5, top_k=5),
                          SamplingParams(temperature=0, presence_penalty=0.5, logprobs=3)])
    assert s.stochastic and s.top_k and not s.top_p and not s.min_p and s.penalties
    assert s.logprobs == 5 and not s.logit_bias            # widths 0, 5, 20: 3 -> 5
    # a greedy request's filters are never traced (they do not apply to argmax)
    assert not sampler_spec_for([SamplingParams(temperature=0, top_p=0.5)]).top_p
    assert sampler_spec_for([SamplingParams(logit_bias={3: 1.0}, temperature=0)]).logit_bias


def test_block_size_follows_the_target():
    cpu = Target("cpu", Capabilities())
    nv = Target("cuda", Capabilities(subgroup_size=32))
    lvp = Target("vulkan", Capabilities(subgroup_size=8))
    amd = Target("rocm", Capabilities(subgroup_size=64))
    assert (kv_block_size(cpu), kv_block_size(nv), kv_block_size(lvp),
            kv_block_size(amd)) == (32, 32, 16, 64)


def test_steady_rate_skips_prefill_and_partial_batches():
    from poot.cli.bench_cmd import steady_rate

    log = [(0.0, 4, 0), (1.0, 4, 0), (2.0, 4, 0),       # 2 intervals of 1 s at B = 4
           (5.0, 4, 1),                                 # a prefill in between: not counted
           (6.0, 4, 1),                                 # 1 more interval
           (7.0, 3, 1), (7.5, 3, 1)]                    # partial batch: not counted at B = 4
    rate, n = steady_rate(log, 4)
    assert n == 3 and rate == pytest.approx(4.0)
    assert steady_rate(log, 3) == (pytest.approx(6.0), 1)
    assert steady_rate([], 4) == (None, 0)
