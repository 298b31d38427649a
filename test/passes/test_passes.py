"""poot-cse / poot-dce / poot-canonicalize / poot-fuse-dispatch on graphs built with the Builder:
random graphs keep their oracle results through every pass, and the fusion rules give the
dispatch counts the design asks for (RMSNorm, softmax, an elementwise chain: one each)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mlir import ir

from passgraphs import F32, builder, linear, rmsnorm, silu, softmax, transformer_block
from poot import oracle
from poot.dialects.types import DType, TensorType
from poot.dialects.verify import verify_module
from poot.graph.builder import BuilderError
from poot.passes.analysis import (dispatch_count, dispatch_report, functions,
                                  is_dispatch_function)
from poot.passes.registry import build_pass_manager, take_failures

ALL = "poot-canonicalize,poot-cse,poot-dce,poot-fuse-dispatch"


def run_pipeline(graph, pipeline: str) -> None:
    pm = build_pass_manager(f"builtin.module({pipeline})", graph.context)
    try:
        pm.run(graph.module.operation)
    except ir.MLIRError as e:  # pragma: no cover - shows the pass's own message
        raise AssertionError(f"{pipeline}: {take_failures()} {e}") from None
    graph.module.operation.verify()
    assert verify_module(graph.module) == []


def dispatch_ops(module) -> list[int]:
    out = []
    for fn in functions(module):
        if is_dispatch_function(fn):
            # region members (cloned constants and constant-only ops are not counted)
            out.append(ir.IntegerAttr(ir.DictAttr(fn.attributes["poot.dispatch"])["ops"]).value)
    return out


# ---------------------------------------------------------------------------------------------
# random graphs
# ---------------------------------------------------------------------------------------------
SHAPES = [(4, 8), (8,), (4, 1), ()]


def build_random(data):
    """A random graph over a pool of [4, 8]-compatible values; returns (graph, inputs, params)."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31 - 1), label="seed"))
    b = builder()
    inputs, params = {}, {}
    pool = []
    for i in range(data.draw(st.integers(1, 3), label="n_inputs")):
        shape = data.draw(st.sampled_from(SHAPES[:2]), label="in_shape")
        inputs[f"x{i}"] = rng.standard_normal(shape).astype(np.float32)
        pool.append(b.input(f"x{i}", TensorType(shape, F32)))
    params["w"] = rng.standard_normal((8, 8)).astype(np.float32)
    params["v"] = rng.standard_normal((8,)).astype(np.float32)

    def pick():
        return pool[data.draw(st.integers(0, len(pool) - 1), label="operand")]

    n_ops = data.draw(st.integers(1, 18), label="n_ops")
    for _ in range(n_ops):
        try:
            y = _random_op(b, data, rng, pick)
        except BuilderError:  # operands that do not broadcast: draw again
            continue
        if y is not None:
            pool.append(y)
    n_out = data.draw(st.integers(1, min(3, len(pool))), label="n_out")
    outs = {f"y{i}": pool[-1 - i] for i in range(n_out)}
    return b.finish(outs), inputs, params


def _random_op(b, data, rng, pick):
    if True:
        kind = data.draw(st.sampled_from(
            ["unary", "binary", "binary", "ident", "const", "reduce", "matmul", "view",
             "select", "cast", "dup", "param", "iota", "slice", "concat"]), label="kind")
        x = pick()
        if kind == "unary":
            y = b.unary(data.draw(st.sampled_from(["neg", "exp", "tanh", "abs", "sin"])), x)
        elif kind == "binary":
            fn = data.draw(st.sampled_from(["add", "sub", "mul", "div", "max", "min"]))
            y = b.binary(fn, x, pick())
        elif kind == "ident":  # identities with splat constants (canonicalize targets)
            fn, c = data.draw(st.sampled_from([("mul", 1.0), ("div", 1.0), ("sub", 0.0),
                                               ("add", -0.0), ("add", 0.0), ("mul", 0.0)]))
            y = b.binary(fn, x, b.full(x.shape, c)) if data.draw(st.booleans()) else \
                b.binary(fn, b.full(x.shape, c), x)
        elif kind == "const":
            shape = data.draw(st.sampled_from(SHAPES))
            c = b.constant(rng.standard_normal(shape).astype(np.float32))
            y = b.unary("exp", c) if data.draw(st.booleans()) else b.binary("add", c, c)
        elif kind == "reduce":
            if x.rank == 0:
                return None
            fn = data.draw(st.sampled_from(["sum", "max", "min"]))
            r = b.reduce(fn, x, -1, keepdims=data.draw(st.booleans()))
            y = b.binary("sub", x, r) if r.rank == x.rank else r
        elif kind == "matmul":
            if x.shape != (4, 8):
                return None
            w = b.param("w", TensorType((8, 8), F32))
            if data.draw(st.booleans()):
                w = b.transpose(w, [1, 0])
            y = b.matmul(x, w)
        elif kind == "view":
            if x.shape == (4, 8):
                y = data.draw(st.sampled_from([
                    lambda: b.transpose(b.transpose(x, [1, 0]), [1, 0]),
                    lambda: b.reshape(b.reshape(x, [2, 16]), [4, 8]),
                    lambda: b.reshape(b.transpose(x, [1, 0]), [4, 8]),
                    lambda: b.slice(x, [0, 0], [4, 8]),
                ]))()
            else:
                y = b.reshape(x, [-1])
        elif kind == "select":
            y = b.select(b.compare("gt", x, pick()), x, b.full(x.shape, 0.5))
        elif kind == "cast":
            y = b.cast(b.cast(x, DType.F16), F32)
        elif kind == "dup":  # the same op twice (CSE target)
            fn = data.draw(st.sampled_from(["exp", "neg"]))
            y = b.binary("add", b.unary(fn, x), b.unary(fn, x))
        elif kind == "param":
            y = b.binary("mul", x, b.param("v", TensorType((8,), F32)))
        elif kind == "iota":
            y = b.binary("add", x, b.cast(b.iota(x.shape or (1,), 0), F32)
                         if x.rank else b.scalar(1.0))
        elif kind == "slice":
            if x.shape != (4, 8):
                return None
            y = b.concat([b.slice_axis(x, 1, 4, 8), b.slice_axis(x, 1, 0, 4)], 1)
        else:  # concat
            if x.rank == 0:
                return None
            y = b.slice_axis(b.concat([x, x], 0), 0, 0, x.shape[0])
        return y


PIPELINES = ["poot-cse", "poot-dce", "poot-canonicalize", "poot-fuse-dispatch",
             "poot-fuse-dispatch{max-region-ops=3}", ALL]


@pytest.mark.parametrize("pipeline", PIPELINES)
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_random_graph_keeps_its_values(pipeline, data):
    graph, inputs, params = build_random(data)
    before = oracle.evaluate(graph, inputs, params)
    n_before = dispatch_count(graph.module)
    run_pipeline(graph, pipeline)
    after = oracle.evaluate(graph.module, inputs, params)
    assert after.keys() == before.keys()
    for k in before:
        assert after[k].dtype == before[k].dtype and after[k].shape == before[k].shape
        if "canonicalize" in pipeline:  # folded constants: same evaluate, allow 1 ulp-ish
            np.testing.assert_allclose(after[k], before[k], rtol=1e-6, atol=0, equal_nan=True)
        else:
            np.testing.assert_array_equal(after[k], before[k])
    assert dispatch_count(graph.module) <= n_before
    if "max-region-ops=3" in pipeline:
        assert all(n <= 3 for n in dispatch_ops(graph.module))


# ---------------------------------------------------------------------------------------------
# fusion shapes
# ---------------------------------------------------------------------------------------------
def fused(outputs_fn, shapes, pipeline="poot-fuse-dispatch", params=None):
    b = builder()
    xs = [b.input(f"x{i}", TensorType(s, F32)) for i, s in enumerate(shapes)]
    ps = {n: b.param(n, TensorType(a.shape, F32)) for n, a in (params or {}).items()}
    graph = b.finish(outputs_fn(b, *xs, **ps))
    rng = np.random.default_rng(1)
    inputs = {f"x{i}": rng.standard_normal(s).astype(np.float32) for i, s in enumerate(shapes)}
    before = oracle.evaluate(graph, inputs, params or {})
    n_before = dispatch_count(graph.module)
    run_pipeline(graph, pipeline)
    after = oracle.evaluate(graph.module, inputs, params or {})
    for k in before:
        np.testing.assert_array_equal(after[k], before[k])
    return graph, n_before


@pytest.mark.parametrize("shape", [(4, 8), (2, 3, 16), (1, 64)])
def test_rmsnorm_is_one_dispatch(shape):
    w = {"w": np.linspace(0.5, 1.5, shape[-1], dtype=np.float32)}
    graph, n_before = fused(lambda b, x, w: {"y": rmsnorm(b, x, w)}, [shape], params=w)
    assert n_before >= 6
    assert dispatch_count(graph.module) == 1
    assert dispatch_report(graph.module) == {"reduction": 1}


@pytest.mark.parametrize("shape", [(4, 8), (2, 4, 4, 4)])
def test_softmax_is_one_dispatch(shape):
    graph, n_before = fused(lambda b, x: {"y": softmax(b, x)}, [shape])
    assert n_before >= 6
    assert dispatch_report(graph.module) == {"reduction": 1}


def test_masked_softmax_after_matmul_is_matmul_plus_softmax():
    def g(b, q, k):
        s = b.matmul(q, b.transpose(k, [0, 2, 1])) * 0.25
        causal = b.compare("le", b.iota((4, 4), 1), b.iota((4, 4), 0))
        mask = b.select(causal, b.full((4, 4), 0.0), b.full((4, 4), -1e30))
        return {"p": softmax(b, s + mask)}

    graph, _ = fused(g, [(2, 4, 8), (2, 4, 8)])
    assert dispatch_report(graph.module) == {"matmul": 1, "reduction": 1}


def test_elementwise_chain_of_ten_is_one_dispatch():
    def chain(b, x, y):
        v = x
        for i, fn in enumerate(["exp", "neg", "tanh", "abs", "sin", "exp", "neg", "cos",
                                "tanh", "abs"]):
            v = b.unary(fn, v) if i % 3 else b.binary("add", b.unary(fn, v), y)
        return {"z": v}

    graph, n_before = fused(chain, [(4, 8), (4, 8)])
    assert n_before == 14
    assert dispatch_count(graph.module) == 1
    assert dispatch_report(graph.module) == {"elementwise": 1}
    assert dispatch_ops(graph.module) == [14]


def test_max_region_ops_splits_the_chain():
    def chain(b, x):
        for fn in ["exp", "neg", "tanh", "abs", "sin", "exp", "neg", "cos", "tanh", "abs"]:
            x = b.unary(fn, x)
        return {"z": x}

    graph, _ = fused(chain, [(4, 8)], "poot-fuse-dispatch{max-region-ops=4}")
    assert dispatch_ops(graph.module) == [4, 4, 2]


def test_two_matmuls_never_share_a_region():
    def g(b, x, w1, w2):
        return {"y": b.matmul(b.unary("tanh", b.matmul(x, w1)), w2)}

    rng = np.random.default_rng(3)
    params = {"w1": rng.standard_normal((8, 8)).astype(np.float32),
              "w2": rng.standard_normal((8, 8)).astype(np.float32)}
    graph, _ = fused(g, [(4, 8)], params=params)
    assert dispatch_report(graph.module) == {"matmul": 2}


def test_swiglu_mlp_regions():
    def g(b, x, wg, wu, wd):
        return {"y": x + linear(b, silu(b, linear(b, x, wg)) * linear(b, x, wu), wd)}

    rng = np.random.default_rng(4)
    params = {"wg": rng.standard_normal((16, 8)).astype(np.float32),
              "wu": rng.standard_normal((16, 8)).astype(np.float32),
              "wd": rng.standard_normal((8, 16)).astype(np.float32)}
    graph, n_before = fused(g, [(4, 8)], params=params)
    # gate (+ silu * up epilogue), up, down (+ residual): three matmul kernels
    assert dispatch_report(graph.module) == {"matmul": 3}
    assert n_before > 3


def test_fusion_is_idempotent():
    graph, inputs, params = transformer_block()
    run_pipeline(graph, "poot-fuse-dispatch")
    text = str(graph.module)
    run_pipeline(graph, "poot-fuse-dispatch")
    assert str(graph.module) == text


# ---------------------------------------------------------------------------------------------
# a transformer block: dispatch counts before / after
# ---------------------------------------------------------------------------------------------
def test_transformer_block_dispatch_counts():
    graph, inputs, params = transformer_block()
    before = oracle.evaluate(graph, inputs, params)
    assert dispatch_count(graph.module) == 84
    assert dispatch_report(graph.module) == {
        "gather": 1, "elementwise": 51, "reduction": 5, "dequantize": 2, "copy": 12,
        "matmul": 10, "scatter": 1, "iota": 2}
    run_pipeline(graph, ALL)
    after = oracle.evaluate(graph.module, inputs, params)
    for k in before:
        np.testing.assert_allclose(after[k], before[k], rtol=1e-6, atol=0)
    # 10 matmuls (7 projections + 2 attention + lm head), 3 RMSNorms + 1 softmax,
    # the embedding gather and the KV-cache scatter
    assert dispatch_report(graph.module) == {"gather": 1, "reduction": 4, "matmul": 10,
                                             "scatter": 1}
    assert dispatch_count(graph.module) == 16


def test_transformer_block_fusion_alone_is_exact():
    graph, inputs, params = transformer_block()
    before = oracle.evaluate(graph, inputs, params)
    run_pipeline(graph, "poot-fuse-dispatch")
    after = oracle.evaluate(graph.module, inputs, params)
    for k in before:
        np.testing.assert_array_equal(after[k], before[k])
    assert dispatch_count(graph.module) == 16


# ---------------------------------------------------------------------------------------------
# cse / dce / canonicalize on builder graphs
# ---------------------------------------------------------------------------------------------
def _count(graph, name):
    return sum(1 for o in graph.func.regions[0].blocks[0].operations
               if o.operation.name == name)


def test_cse_merges_rmsnorm_recomputed_twice():
    b = builder()
    x = b.input("x", TensorType((4, 8), F32))
    w = b.param("w", TensorType((8,), F32))
    graph = b.finish({"a": rmsnorm(b, x, w), "b": rmsnorm(b, x, w)})
    n = graph.op_count()
    run_pipeline(graph, "poot-cse,poot-dce")
    assert graph.op_count() == n // 2 + 1  # one param left; every other op once
    assert _count(graph, "poot.reduce") == 1


def test_dce_erases_a_dead_chain_to_a_fixed_point():
    b = builder()
    x = b.input("x", TensorType((4, 8), F32))
    dead = b.unary("exp", x)
    for _ in range(5):
        dead = b.binary("mul", dead, b.unary("neg", dead))
    graph = b.finish({"y": b.unary("tanh", x)})
    run_pipeline(graph, "poot-dce")
    assert graph.op_count() == 1


def test_canonicalize_removes_identities_and_folds():
    b = builder()
    x = b.input("x", TensorType((4, 8), F32))
    y = ((x * 1.0) / 1.0 - 0.0)
    y = b.reshape(b.reshape(b.transpose(b.transpose(y, [1, 0]), [1, 0]), [32]), [4, 8])
    c = b.unary("exp", b.constant(np.arange(4, dtype=np.float32)))
    graph = b.finish({"y": y, "c": c})
    run_pipeline(graph, "poot-canonicalize")
    assert graph.op_count() == 1  # only the folded constant is left
    out = oracle.evaluate(graph.module, {"x": np.ones((4, 8), np.float32)})
    np.testing.assert_allclose(out["c"], np.exp(np.arange(4, dtype=np.float32)), rtol=1e-6)


def test_canonicalize_fold_limit():
    b = builder()
    c = b.constant(np.arange(2048, dtype=np.float32))
    graph = b.finish({"c": b.unary("exp", c)})
    run_pipeline(graph, "poot-canonicalize{max-fold-bytes=4096}")
    assert _count(graph, "poot.unary") == 1
    run_pipeline(graph, "poot-canonicalize{max-fold-bytes=8192}")
    assert _count(graph, "poot.unary") == 0


def test_thirty_layers_fuse_to_thirteen_dispatches_per_layer():
    graph, inputs, params = transformer_block(layers=30)
    before = oracle.evaluate(graph, inputs, params)
    assert dispatch_count(graph.module) == 2114
    run_pipeline(graph, ALL)
    after = oracle.evaluate(graph.module, inputs, params)
    for k in before:
        np.testing.assert_allclose(after[k], before[k], rtol=1e-6, atol=0)
    # per layer: 9 matmuls, 2 RMSNorms + 1 softmax, 1 scatter; plus gather, norm, lm head
    assert dispatch_report(graph.module) == {"gather": 1, "reduction": 91, "matmul": 271,
                                             "scatter": 30}


def test_cycle_check_sees_paths_through_other_regions():
    """Regions {u1, u2} and {a1, a2} with u1 -> a1 and a2 -> u2 form a cycle of regions
    although no op-level path leaves {a1, a2} and comes back: the check must see it."""
    from poot.passes.fuse_dispatch import _Partition

    text = """
func.func @f(%x: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>) {
  %u1 = "poot.unary"(%x) {fn = "exp"} : (tensor<4xf32>) -> tensor<4xf32>
  %a2 = "poot.unary"(%x) {fn = "neg"} : (tensor<4xf32>) -> tensor<4xf32>
  %u2 = "poot.unary"(%a2) {fn = "tanh"} : (tensor<4xf32>) -> tensor<4xf32>
  %a1 = "poot.unary"(%u1) {fn = "sin"} : (tensor<4xf32>) -> tensor<4xf32>
  return %a1, %u2 : tensor<4xf32>, tensor<4xf32>
}"""
    from poot.dialects import make_context

    with make_context():
        module = ir.Module.parse(text)
        fn = module.body.operations[0].operation
        block = fn.regions[0].blocks[0]
        part = _Partition(block, 16)
        u1, a2, u2, a1 = [o.operation for o in list(block.operations)[:4]]
        assert part.try_merge(u1, u2)  # independent ops: a legal (multi-output) region
        assert part.creates_cycle([a2, a1])
        assert not part.try_merge(a1, a2)
        assert not part.creates_cycle([a2])
