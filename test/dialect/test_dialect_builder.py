"""Builder limits and handle errors: a refused call names the resource, the limit and the
attempted total, appends nothing and allocates nothing."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from poot import oracle
from poot.dialects import DType, TensorType
from poot.dialects.verify import verify_module
from poot.errors import LimitExceeded, PootError
from poot.graph import Builder, BuilderError, BuilderLimitExceeded, Tensor, TraceLimits

from _graphs import ROOMY, tt


def limits(**kw) -> TraceLimits:
    base = dict(max_values=1000, max_ops=1000, max_literal_bytes=1 << 16,
                max_owned_bytes=1 << 20)
    base.update(kw)
    return TraceLimits(**base)


def n_ops(b: Builder) -> int:
    return sum(1 for _ in b._block.operations)


def n_args(b: Builder) -> int:
    return len(b._block.arguments)


def check_refusal(exc: BuilderLimitExceeded, resource: str, limit: int, attempted: int):
    assert isinstance(exc, BuilderError) and isinstance(exc, LimitExceeded)
    assert isinstance(exc, PootError)
    assert (exc.resource, exc.limit, exc.attempted) == (resource, limit, attempted)
    msg = str(exc)
    assert resource in msg and f"limit {limit}" in msg and f"attempted {attempted}" in msg
    assert "graph builder" in msg


def test_max_values():
    b = Builder(limits(max_values=3))
    x = b.input("x", tt((4,)))
    y = b.unary("neg", x)
    b.unary("abs", y)                          # 3 values: x, y, z
    ops, args = n_ops(b), n_args(b)
    with pytest.raises(BuilderLimitExceeded) as e:
        b.unary("exp", y)
    check_refusal(e.value, "values", 3, 4)
    with pytest.raises(BuilderLimitExceeded) as e:
        b.input("w", tt((4,)))
    check_refusal(e.value, "values", 3, 4)
    assert (n_ops(b), n_args(b)) == (ops, args)
    # The builder stays usable and its graph valid.
    g = b.finish({"y": y})
    assert verify_module(g.module) == [] and g.inputs == [("x", tt((4,)))]
    g.module.operation.verify()


def test_max_ops():
    b = Builder(limits(max_ops=2))
    x = b.input("x", tt((2, 2)))
    y = b.unary("neg", b.unary("neg", x))
    before = n_ops(b)
    with pytest.raises(BuilderLimitExceeded) as e:
        b.transpose(y, (1, 0))
    check_refusal(e.value, "ops", 2, 3)
    assert n_ops(b) == before == 2
    g = b.finish({"y": y})
    assert g.op_count() == 2


def test_max_literal_bytes():
    b = Builder(limits(max_literal_bytes=64))
    b.constant(np.arange(8, dtype=np.float32))      # 32 bytes
    before = n_ops(b)
    with pytest.raises(BuilderLimitExceeded) as e:
        b.constant(np.arange(9, dtype=np.float32))  # 32 + 36
    check_refusal(e.value, "literal_bytes", 64, 68)
    assert n_ops(b) == before
    b.constant(np.arange(8, dtype=np.int32))        # exactly at the limit is fine
    assert n_ops(b) == before + 1


def test_max_owned_bytes():
    b = Builder(limits(max_owned_bytes=100))
    x = b.input("x", tt((5,)))                       # 20 bytes
    y = b.unary("neg", x)                           # 40
    before = n_ops(b)
    with pytest.raises(BuilderLimitExceeded) as e:
        b.broadcast_to(y, (4, 5))                   # 40 + 80
    check_refusal(e.value, "owned_bytes", 100, 120)
    with pytest.raises(BuilderLimitExceeded) as e:
        b.input("big", tt((16,)))                   # 40 + 64
    check_refusal(e.value, "owned_bytes", 100, 104)
    assert n_ops(b) == before and n_args(b) == 1


@pytest.mark.parametrize("make", [
    lambda b: b.iota((1 << 20, 1 << 18), axis=0, dtype=DType.F32),
    lambda b: b.input("huge", TensorType((1 << 20, 1 << 18), DType.F32)),
    lambda b: b.param("huge", TensorType((1 << 19, 1 << 19), DType.F32)),
    lambda b: b.broadcast_to(b.input("s", tt(())), (1 << 20, 1 << 18)),
    lambda b: b.matmul(b.input("a", tt((1 << 20, 1))), b.input("c", tt((1, 1 << 18)))),
], ids=["iota", "input", "param", "broadcast", "matmul"])
def test_huge_request_is_refused_without_allocating(make):
    b = Builder(limits(max_owned_bytes=1 << 30))
    tracemalloc.start()
    try:
        with pytest.raises(BuilderLimitExceeded) as e:
            make(b)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert e.value.resource == "owned_bytes" and e.value.limit == 1 << 30
    assert e.value.attempted >= 1 << 40
    assert f"attempted {e.value.attempted}" in str(e.value)
    assert peak < 8 << 20, f"refusal allocated {peak} bytes"
    assert n_ops(b) == 0


def test_refused_calls_create_nothing():
    # A call that is both invalid and over the limit creates nothing either way.
    b = Builder(limits(max_ops=1))
    x = b.input("x", tt((4,)))
    b.unary("neg", x)
    with pytest.raises(BuilderError):
        b.unary("not", x)                           # f32 'not': type rule refuses
    with pytest.raises(BuilderLimitExceeded):
        b.unary("exp", x)
    assert n_ops(b) == 1


@pytest.mark.parametrize("field", ["max_values", "max_ops", "max_literal_bytes",
                                   "max_owned_bytes", "max_tokens"])
@pytest.mark.parametrize("bad", [0, -1, 1.5, None])
def test_trace_limits_must_be_positive_ints(field, bad):
    with pytest.raises(ValueError, match=field):
        limits(**{field: bad})


def test_builder_needs_explicit_limits():
    with pytest.raises(BuilderError, match="explicit TraceLimits"):
        Builder(None)


def test_foreign_handle_is_refused():
    a, c = Builder(ROOMY), Builder(ROOMY)
    xa = a.input("x", tt((4,)))
    xc = c.input("x", tt((4,)))
    before = n_ops(c)
    with pytest.raises(BuilderError, match="another builder"):
        c.unary("neg", xa)
    with pytest.raises(BuilderError, match="another builder"):
        c.binary("add", xc, xa)
    with pytest.raises(BuilderError, match="another builder"):
        c.finish({"y": xa})
    with pytest.raises(BuilderError, match="expected a Tensor handle"):
        c.unary("neg", np.zeros(4, np.float32))
    assert n_ops(c) == before


def test_type_rule_errors_are_builder_errors_naming_the_op():
    b = Builder(ROOMY)
    x = b.input("x", tt((4, 8), DType.F16))
    w = b.input("w", tt((8, 2)))
    with pytest.raises(BuilderError, match=r"'poot.matmul' op operand dtypes differ: f16 and f32"):
        b.matmul(x, w)
    with pytest.raises(BuilderError, match="do not broadcast"):
        b.binary("add", x, b.input("z", tt((3,), DType.F16)))
    with pytest.raises(BuilderError, match="declared twice"):
        b.input("x", tt((1,)))
    with pytest.raises(BuilderError, match="redeclared"):
        b.param("p", tt((2,)))
        b.param("p", tt((3,)))


def test_finished_builder_refuses_ops():
    b = Builder(ROOMY)
    x = b.input("x", tt((4,)))
    g = b.finish({"y": b.unary("neg", x)})
    text = g.text()
    for call in (lambda: b.unary("exp", x), lambda: b.param("w", tt((4,))),
                 lambda: b.constant(np.zeros(2, np.float32)), lambda: b.finish({"y": x})):
        with pytest.raises(BuilderError, match="builder is finished"):
            call()
    assert g.text() == text
    np.testing.assert_array_equal(oracle.evaluate(g, {"x": np.ones(4, np.float32)})["y"],
                                  -np.ones(4, np.float32))


def test_finished_builder_refuses_inputs():
    b = Builder(ROOMY)
    x = b.input("x", tt((4,)))
    g = b.finish({"y": b.unary("neg", x)})
    try:
        with pytest.raises(BuilderError, match="builder is finished"):
            b.input("late", tt((4,)))
    finally:
        g.module.operation.verify()


def test_tensor_operators_and_scalars():
    b = Builder(ROOMY)
    x = b.input("x", tt((3,)))
    y = 2.0 * x - 1.0 / (x + 3.0)
    g = b.finish({"y": -y})
    v = np.array([0.0, 1.0, -2.0], np.float32)
    want = -(np.float32(2) * v - np.float32(1) / (v + np.float32(3)))
    np.testing.assert_array_equal(oracle.evaluate(g, {"x": v})["y"], want)
    assert isinstance(x, Tensor) and x.shape == (3,) and x.rank == 1 and x.dtype is DType.F32


@pytest.mark.parametrize("call", [
    lambda b, m, s: b.concat([m, m], axis=5),
    lambda b, m, s: b.concat([m, m], axis=-3),
    lambda b, m, s: b.slice_axis(m, 2, 0, 1),
    lambda b, m, s: b.concat([s, s], axis=0),
    lambda b, m, s: b.slice_axis(s, 0, 0, 1),
], ids=["concat-5", "concat--3", "slice_axis-2", "concat-rank0", "slice_axis-rank0"])
def test_axis_out_of_range_is_a_builder_error(call):
    b = Builder(ROOMY)
    m, s = b.input("m", tt((2, 3))), b.input("s", tt(()))
    with pytest.raises(BuilderError, match="out of range"):
        call(b, m, s)
    assert n_ops(b) == 0
