"""Request sampling parameters (poot.sampling_params): validation and packing."""

from __future__ import annotations

import numpy as np
import pytest

from poot.sampling_params import (InvalidRequest, SamplingParams, UniformStream, history_row)
from poot.errors import PootError
from poot.graph import sampling as S


@pytest.mark.parametrize("kw, field, value", [
    (dict(temperature=-0.1), "temperature", -0.1),
    (dict(temperature=float("nan")), "temperature", None),
    (dict(temperature="hot"), "temperature", "hot"),
    (dict(temperature=1e39), "temperature", 1e39),       # past f32: it would pack as inf
    (dict(repetition_penalty=-1e300), "repetition_penalty", -1e300),
    (dict(repetition_penalty=1e300), "repetition_penalty", 1e300),
    (dict(top_p=0.0), "top_p", 0.0),
    (dict(top_p=1.01), "top_p", 1.01),
    (dict(min_p=-0.5), "min_p", -0.5),
    (dict(min_p=2), "min_p", 2),
    (dict(top_k=1.5), "top_k", 1.5),
    (dict(top_k=True), "top_k", True),
    (dict(repetition_penalty=0), "repetition_penalty", 0),
    (dict(repetition_penalty=1e-40), "repetition_penalty", 1e-40),   # 0 as an f32
    (dict(repetition_penalty=1e-45), "repetition_penalty", 1e-45),
    (dict(repetition_penalty=1.2e-38), "repetition_penalty", 1.2e-38),  # x / r overflows
    (dict(repetition_penalty=2.0 ** 65), "repetition_penalty", 2.0 ** 65),
    (dict(top_p=1e-40), "top_p", 1e-40),
    (dict(presence_penalty=2.5), "presence_penalty", 2.5),
    (dict(frequency_penalty=-3), "frequency_penalty", -3),
    (dict(logit_bias={"x": 1.0}), "logit_bias", "x"),
    (dict(logit_bias={-1: 1.0}), "logit_bias", -1),
    (dict(logit_bias={5: 101.0}), "logit_bias[5]", 101.0),
    (dict(logit_bias=[1, 2]), "logit_bias", [1, 2]),
    (dict(seed=-1), "seed", -1),
    (dict(seed=2 ** 64), "seed", 2 ** 64),
    (dict(max_tokens=0), "max_tokens", 0),
    (dict(max_tokens=2.0), "max_tokens", 2.0),
    (dict(stop=["ok", ""]), "stop", ""),
    (dict(stop=["ok", 3]), "stop", 3),
    (dict(stop_token_ids=[1, -2]), "stop_token_ids", -2),
    (dict(logprobs=21), "logprobs", 21),
    (dict(logprobs=-1), "logprobs", -1),
])
def test_invalid_fields_are_named(kw, field, value):
    with pytest.raises(InvalidRequest) as ei:
        SamplingParams(**kw)
    e = ei.value
    assert isinstance(e, PootError)
    assert e.field == field
    if value is not None:
        assert e.value == value and type(e.value) is type(value)
    assert field in str(e) and "invalid request" in str(e)


def test_values_are_checked_as_the_device_f32():
    """A value in range as a double but not as the f32 the device uses (subnormals flush to
    0) is refused; the smallest normal f32 is served."""
    from poot.sampling_params import F32_TINY, device_f32

    with pytest.raises(InvalidRequest, match=r"top_p=1e-40: .*32-bit float on the device"):
        SamplingParams(top_p=1e-40)
    assert SamplingParams(top_p=F32_TINY).top_p == F32_TINY
    # a repetition penalty keeps a penalized logit finite in f32 for |x| < 2^28: x / r or
    # x * r, then divided by the smallest sampling temperature
    with pytest.raises(InvalidRequest, match=r"repetition_penalty=1e-40: .*32-bit float"):
        SamplingParams(repetition_penalty=1e-40)
    for r in (2.0 ** -64, 2.0 ** 64):
        assert SamplingParams(repetition_penalty=r).repetition_penalty == r
        x = np.float32([2.0 ** 28, -(2.0 ** 28)])
        t = np.float32(S.GREEDY_EPS)
        for z in (x / np.float32(r) / t, x * np.float32(r) / t):
            assert np.isfinite(z).all()
    assert device_f32(1e-40) == 0.0 and device_f32(-1e-39) == 0.0
    assert device_f32(F32_TINY) == F32_TINY and device_f32(0.1) == float(np.float32(0.1))
    # harmless where 0 is in range: a tiny bias is no bias
    assert SamplingParams(logit_bias={1: 1e-40}, min_p=1e-40).min_p == 1e-40


def test_stop_strings_total_length_is_capped():
    from poot.sampling_params import MAX_STOP_CHARS

    ok = SamplingParams(stop=["a" * (MAX_STOP_CHARS - 1), "b"])
    assert sum(map(len, ok.stop)) == MAX_STOP_CHARS
    with pytest.raises(InvalidRequest, match=f"at most {MAX_STOP_CHARS} characters") as ei:
        SamplingParams(stop=["a" * MAX_STOP_CHARS, "b"])
    assert ei.value.field == "stop" and len(str(ei.value)) < 200


def test_vocab_checks():
    p = SamplingParams(logit_bias={"100": 1.0}, stop_token_ids=[7])
    assert p.logit_bias == {100: 1.0} and p.check(101) is p
    with pytest.raises(InvalidRequest, match=r"logit_bias=100: token id out of the vocab"):
        p.check(100)
    with pytest.raises(InvalidRequest) as ei:
        SamplingParams(stop_token_ids=[49152]).check(49152)
    assert ei.value.field == "stop_token_ids" and ei.value.value == 49152


def test_normalization_and_from_dict():
    p = SamplingParams(temperature=0, stop="END", top_k=-1, seed=np.int64(3))
    assert p.stop == ("END",) and p.greedy and p.seed == 3 and isinstance(p.seed, int)
    q = SamplingParams.from_dict({"temperature": 0.5, "stop": None, "logprobs": 2,
                                  "logit_bias": {"1": -100}})
    assert q.stop == () and q.logprobs == 2 and q.logit_bias == {1: -100.0} and not q.greedy
    with pytest.raises(InvalidRequest) as ei:
        SamplingParams.from_dict({"n": 2})
    assert ei.value.field == "n"


def test_pack_batch():
    V = 32
    a = SamplingParams(temperature=0.7, top_k=5, top_p=0.9, min_p=0.05, repetition_penalty=1.1,
                       presence_penalty=0.5, frequency_penalty=-0.25, logit_bias={3: 2.0, 31: -1},
                       seed=9)
    b = SamplingParams()
    batch = [a, None, b]
    streams = [a.uniforms(), None, UniformStream(1)]
    arrs = SamplingParams.pack(batch, V, streams)
    N = S.INPUTS
    assert set(arrs) == {N[r] for r in N if r not in ("token_counts", "allowed_tokens")}
    guided = SamplingParams.pack(batch, V, spec=S.SamplerSpec(guided=True))
    np.testing.assert_array_equal(guided[N["allowed_tokens"]], np.full((3, 2), 0xFFFF))
    for role in N:
        if role in ("token_counts", "allowed_tokens"):
            continue
        t = S.input_type(role, 3, V)
        assert arrs[N[role]].shape == t.shape and arrs[N[role]].dtype == t.dtype.numpy
    np.testing.assert_array_equal(arrs[N["temperature"]], np.float32([0.7, 0.0, 1.0]))
    np.testing.assert_array_equal(arrs[N["top_k"]], [5, 0, 0])
    np.testing.assert_array_equal(arrs[N["presence_penalty"]], np.float32([0.5, 0, 0]))
    bias = arrs[N["logit_bias"]]
    assert bias[0, 3] == 2.0 and bias[0, 31] == -1.0 and np.count_nonzero(bias) == 2
    u = arrs[N["uniform"]]
    assert u[1] == 0 and ((0 <= u) & (u < 1)).all()
    # seeded streams are reproducible and independent of the batch around them
    again = SamplingParams.pack([b, a], V, [UniformStream(1), a.uniforms()])
    assert again[N["uniform"]][1] == u[0] and again[N["uniform"]][0] == u[2]
    s1, s2 = UniformStream(5), UniformStream(5)
    assert [s1.next() for _ in range(5)] == [s2.next() for _ in range(5)]
    # an out-of-vocabulary bias is refused at packing
    with pytest.raises(InvalidRequest):
        SamplingParams.pack([SamplingParams(logit_bias={V: 1.0})], V)
    # only the inputs a spec declares
    spec = S.SamplerSpec(penalties=False, logit_bias=False)
    assert N["logit_bias"] not in SamplingParams.pack(batch, V, spec=spec)


def test_history_row():
    h = history_row(10, [1, 1, 9])
    assert h.dtype == np.int32 and h.tolist() == [0, 2] + [0] * 7 + [1]
    assert history_row(4).tolist() == [0, 0, 0, 0]


def test_packed_batch_drives_the_sampling_graph():
    """End to end on the oracle: packed arrays bind the sampling graph's inputs by name."""
    from poot.dialects.types import DType, TensorType
    from poot.graph.builder import Builder, TraceLimits
    from poot.oracle import evaluate

    V = 16
    b = Builder(TraceLimits(max_values=1 << 14, max_ops=1 << 14, max_literal_bytes=1 << 14,
                            max_owned_bytes=1 << 28))
    lg = b.input("logits", TensorType((2, V), DType.F32))
    si = S.declare_inputs(b, 2, V)
    g = b.finish(S.sample(b, lg, si).outputs())
    batch = [SamplingParams(temperature=0, logit_bias={4: 50.0}),
             SamplingParams(temperature=1.0, top_k=1, seed=0)]
    arrs = SamplingParams.pack(batch, V, [p.uniforms() for p in batch])
    arrs[S.INPUTS["token_counts"]] = np.stack([history_row(V), history_row(V, [2])])
    logits = np.zeros((2, V), np.float32)
    logits[1, 11] = 3.0
    out = evaluate(g, {"logits": logits, **arrs})
    assert out[S.OUTPUTS["token"]].tolist() == [4, 11]
    assert out[S.OUTPUTS["history"]][1, 2] == 1 and out[S.OUTPUTS["history"]][1, 11] == 1


def test_a_top_k_past_the_vocabulary_keeps_every_token():
    """Any integer top_k is served: k >= V is packed as V (the i32 input holds it) and samples
    exactly what top_k off does (a 2^55 k once stopped the server with an OverflowError)."""
    from poot.dialects.types import DType, TensorType
    from poot.graph.builder import Builder, TraceLimits
    from poot.oracle import evaluate

    V = 16
    huge = SamplingParams(temperature=1.0, top_k=48430703812763952, seed=3)
    off = SamplingParams(temperature=1.0, top_k=0, seed=3)
    assert SamplingParams.pack([huge], V)[S.INPUTS["top_k"]].tolist() == [V]
    b = Builder(TraceLimits(max_values=1 << 14, max_ops=1 << 14, max_literal_bytes=1 << 14,
                            max_owned_bytes=1 << 28))
    lg = b.input("logits", TensorType((1, V), DType.F32))
    g = b.finish(S.sample(b, lg, S.declare_inputs(b, 1, V)).outputs())
    logits = np.linspace(-1.0, 1.0, V, dtype=np.float32)[None]
    tokens = {}
    for name, p in (("huge", huge), ("off", off)):
        stream, got = p.uniforms(), []
        for _ in range(8):
            arrs = SamplingParams.pack([p], V, [stream])
            arrs[S.INPUTS["token_counts"]] = history_row(V)[None]
            got.append(int(evaluate(g, {"logits": logits, **arrs})[S.OUTPUTS["token"]][0]))
        tokens[name] = got
    assert tokens["huge"] == tokens["off"] and len(set(tokens["off"])) > 1
