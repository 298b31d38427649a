"""The pipeline partition (poot/compiler/pipeline_parallel.py): stages evaluated one after another on
the oracle, boundary values passed by name, give exactly the whole step's outputs; cuts fall
where only the residual stream crosses; weights are balanced; refusals are typed."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))

from model_steps import fixture_path  # noqa: E402
from poot.compiler.pipeline_parallel import BOUNDARY_PREFIX, PipelineRefusal, partition  # noqa: E402
from poot.dialects.types import DType, TensorType  # noqa: E402
from poot.graph.builder import Builder, TraceLimits  # noqa: E402
from poot.models import StepSpec, load_model  # noqa: E402
from poot.oracle import evaluate  # noqa: E402


def _step(name: str, kind: str):
    loaded = load_model(fixture_path(name))
    kw = dict(kv_capacity=32, block_size=16, num_blocks=5)
    spec = (StepSpec.decode(batch=2, **kw) if kind == "decode"
            else StepSpec.prefill(6, batch=1, **kw))
    return loaded.model.trace(spec, loaded.weights.types), loaded.weights


def _feed(graph, seed=0):
    """Inputs of a step: two sequences (decode) or one prompt (prefill) in blocks 1..4,
    random KV pools."""
    rng = np.random.default_rng(seed)
    shapes = dict(graph.inputs)
    b, t = shapes["tokens"].shape
    pos = np.arange(t, dtype=np.int32)[None] + np.array([[3], [9]][:b], np.int32)
    feed = {"tokens": rng.integers(0, 200, (b, t)).astype(np.int32), "positions": pos,
            "block_table": np.array([[1, 2], [3, 4]][:b], np.int32),
            "slot_mapping": (16 * np.array([1, 3][:b])[:, None] + pos).reshape(
                shapes["slot_mapping"].shape).astype(np.int32)}
    for n, ty in graph.inputs:
        if n not in feed:
            feed[n] = (rng.standard_normal(ty.shape).astype(ty.dtype.numpy)
                       if n.startswith("kv.") else np.zeros(ty.shape, ty.dtype.numpy))
    return feed


def _run_stages(part, feed, weights):
    vals = dict(feed)
    for st in part.stages:
        out = evaluate(st.graph, {n: vals[n] for n, _ in st.graph.inputs},
                       {n: np.asarray(weights.arrays[n]) for n in st.graph.params})
        vals.update(out)
    return vals


@pytest.mark.parametrize("name,kind", [("llama", "decode"), ("llama", "prefill"),
                                       ("qwen3", "decode"), ("mixtral", "decode"),
                                       ("deepseek_v3", "decode")])
@pytest.mark.parametrize("n", [2, 3])
def test_stages_in_order_equal_the_step(name, kind, n):
    """Every output of the step (logits or hidden states, every KV pool) is bit-identical
    when the stages run one after another; each boundary is one [B, T, D] tensor (the
    residual stream); each KV pool is read and written by one stage only."""
    graph, weights = _step(name, kind)
    feed = _feed(graph)
    want = evaluate(graph, feed, {k: np.asarray(weights.arrays[k]) for k in graph.params})
    part = partition(graph, n)
    assert len(part.stages) == n and len(part.cuts) == n - 1
    got = _run_stages(part, feed, weights)
    for out, _ in graph.outputs:
        np.testing.assert_array_equal(got[out], want[out], err_msg=out)
    tokens = feed["tokens"].shape
    for b in part.boundaries.values():
        assert b.type.shape[:2] == tokens and len(b.type.shape) == 3, b
    kv_owner = {}
    for st in part.stages:
        for inp, _ in st.graph.inputs:
            if inp.startswith("kv."):
                assert kv_owner.setdefault(inp, st.index) == st.index, inp
        assert {o for o, _ in st.graph.outputs if o.startswith("kv.")} == \
            {i for i, _ in st.graph.inputs if i.startswith("kv.")}
    assert set(kv_owner) == {n for n, _ in graph.inputs if n.startswith("kv.")}
    # every weight is bound by some stage; a stage's weights are only those its ops read
    assert set().union(*(s.weights for s in part.stages)) >= {
        w for w, t in graph.params.items() if len(getattr(t, "shape", (0, 0))) >= 2}


def test_weights_balanced_by_bytes():
    """Four stages of a two-layer decoder cut between attention and MLP halves: no stage
    holds more than the ideal share plus the largest single layer half's weights."""
    graph, _ = _step("llama", "decode")
    part = partition(graph, 4)
    total = sum(s.weight_bytes for s in part.stages)
    assert all(s.weight_bytes > 0 for s in part.stages)
    # the embedding table (first stage) and the LM head make the ends heavier; the middle
    # stages hold one half-layer each
    assert max(s.weight_bytes for s in part.stages) <= total / 2


def test_one_stage_is_the_step():
    graph, _ = _step("llama", "decode")
    part = partition(graph, 1)
    assert part.stages[0].graph is graph and not part.boundaries


def test_boundary_names_are_the_sender_outputs():
    graph, _ = _step("llama", "decode")
    part = partition(graph, 2)
    (name, b), = part.boundaries.items()
    assert name.startswith(BOUNDARY_PREFIX) and (b.src, b.dst) == (0, (1,))
    assert part.stages[0].sends == (name,) and part.stages[1].receives == (name,)
    assert name in dict(part.stages[0].graph.outputs)
    assert name in dict(part.stages[1].graph.inputs)
    assert "logits" in dict(part.stages[1].graph.outputs)
    assert "logits" not in dict(part.stages[0].graph.outputs)


@pytest.mark.parametrize("stages", [0, -1, 2.0, True])
def test_stage_count_must_be_a_positive_int(stages):
    graph, _ = _step("llama", "decode")
    with pytest.raises(PipelineRefusal, match="positive integer"):
        partition(graph, stages)


def test_more_stages_than_cut_points_is_refused():
    """The refusal names the step and the most stages it can be cut into, and that many
    works while one more is refused."""
    import re

    graph, _ = _step("llama", "decode")
    with pytest.raises(PipelineRefusal, match=r"into 40 pipeline stages: the llama_decode step "
                                              r"can be cut into at most \d+ stages") as e:
        partition(graph, 40)
    most = int(re.search(r"at most (\d+) stages", str(e.value)).group(1))
    assert 2 < most < 40
    assert len(partition(graph, most).stages) == most
    with pytest.raises(PipelineRefusal, match=f"at most {most} stages"):
        partition(graph, most + 1)


def _two_readers_of_state():
    """x [2, 4] through three matmuls; carried ``s`` is added after the first and after
    the second, and written back."""
    b = Builder(TraceLimits(max_values=64, max_ops=64, max_literal_bytes=1024,
                            max_owned_bytes=1 << 20), name="two_readers")
    x = b.input("x", TensorType((2, 4), DType.F32))
    s = b.input("s", TensorType((2, 4), DType.F32))
    ws = [b.param(f"w{i}", TensorType((4, 4), DType.F32)) for i in range(3)]
    a = b.matmul(x, ws[0]) + s
    c = b.matmul(a, ws[1]) + s
    return b.finish({"y": b.matmul(c, ws[2]), "s": c})


def test_state_read_by_two_stages_is_refused():
    """A carried value read on both sides of a cut would need its writer's update on two
    devices: refused by name, not split."""
    graph = _two_readers_of_state()
    with pytest.raises(PipelineRefusal, match=r"carried state 's' would be read by stages"):
        partition(graph, 3)


def test_state_in_one_stage_splits():
    graph = _two_readers_of_state()
    part = partition(graph, 2)
    rng = np.random.default_rng(1)
    feed = {"x": rng.standard_normal((2, 4)).astype(np.float32),
            "s": rng.standard_normal((2, 4)).astype(np.float32)}
    w = {f"w{i}": rng.standard_normal((4, 4)).astype(np.float32) for i in range(3)}
    want = evaluate(graph, feed, w)

    class W:
        arrays = w
    got = _run_stages(part, feed, W)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])


@pytest.mark.parametrize("n", [2, 3, 4])
def test_bf16_shape_cut_in_the_residual_stream_and_balanced(n):
    """SmolLM2's shape with bf16 weights (30 blocks, tied embedding): the bf16 embedding
    before the first block is not the only cut point (the f32 residual stream between blocks
    is one too), and the stages read about equal weight bytes a step (a gather reads rows:
    the tied table counts where the LM head reads it)."""
    from poot.models.random_init import load_random_model

    root = Path(__file__).resolve().parents[2]
    model, weights = load_random_model(root / "bench" / "shapes" / "smollm2-135m.json", "bf16")
    graph = model.trace(StepSpec.decode(batch=1, kv_capacity=64, block_size=16, num_blocks=5),
                        weights.types)
    part = partition(graph, n)
    for b in part.boundaries.values():
        assert b.type.shape == (1, 1, 576) and b.type.dtype == DType.F32
    table = weights.types["tok_embed"].nbytes if "tok_embed" in weights.types else 0
    read = [s.weight_bytes - (table if i < n - 1 and "tok_embed" in s.weights else 0)
            for i, s in enumerate(part.stages)]
    assert max(read) <= 1.35 * (sum(read) / n), read
    kv = [sum(1 for i, _ in s.graph.inputs if i.startswith("kv.")) for s in part.stages]
    assert sum(kv) == 60 and min(kv) >= 2     # every stage holds a block (the last: + head)


def test_placement_keeps_every_pool_where_the_decode_step_has_it():
    """The prefill step (no LM head) cut with the decode step's pool placement puts every
    KV pool on the same stage; cut alone it may balance differently. A placement no cut can
    honour is refused."""
    from poot.compiler.pipeline_parallel import state_placement

    dec, _ = _step("llama", "decode")
    pre, weights = _step("llama", "prefill")
    for n in (2, 3):
        place = state_placement(partition(dec, n))
        part = partition(pre, n, placement=place)
        assert state_placement(part) == place
        feed = _feed(pre)
        want = evaluate(pre, feed, {k: np.asarray(weights.arrays[k]) for k in pre.params})
        got = _run_stages(part, feed, weights)
        for out, _ in pre.outputs:
            np.testing.assert_array_equal(got[out], want[out])
    with pytest.raises(PipelineRefusal, match="keeps every carried state"):
        partition(pre, 2, placement={"kv.0.k": 1, "kv.1.k": 0})
