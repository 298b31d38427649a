"""The pooled-request queue (:class:`poot.engine.pooling.PoolQueue`): rows of several
requests share a step and each request gets exactly what it gets alone (and the fixture's
sentence-transformers reference); a cancelled request's rows never run; the bound refuses
a request past it. Determinism: the queue is paused while requests are submitted."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))

from model_steps import fixture_path, reference  # noqa: E402
from poot.api.pooling import PoolingModel  # noqa: E402
from poot.engine.pooling import PoolQueue, PoolQueueFull  # noqa: E402

TOL = 1e-4


@pytest.fixture(scope="module")
def pm(tmp_path_factory):
    cache = os.environ.get("POOT_CACHE_DIR") or str(tmp_path_factory.mktemp("poot-cache"))
    return PoolingModel.load(fixture_path("qwen3_embed"), max_batch=8, max_tokens=32,
                             cache_dir=cache)


@pytest.fixture
def queue(pm):
    q = PoolQueue(pm.runner)
    yield q
    q.close()


def _rows(ref):
    return [[int(x) for x in r[:n]] for r, n in zip(ref["input_ids"], ref["lengths"])]


def test_requests_share_steps_and_get_what_they_get_alone(pm, queue):
    ref = reference("qwen3_embed")
    rows = _rows(ref)
    alone = [pm.runner.run([r]) for r in rows]
    queue.pause()
    futs = [queue.submit([r]) for r in rows] + [queue.submit(rows)]
    queue.pause(False)
    for i, f in enumerate(futs[:-1]):
        got = f.result(60)
        assert got.shape == (1, ref["embeddings"].shape[1])
        assert np.abs(got[0] - alone[i][0]).max() < TOL
        assert np.abs(got[0] - ref["embeddings"][i]).max() < TOL
    assert np.abs(futs[-1].result(60) - ref["embeddings"]).max() < TOL
    assert queue.steps < len(futs) and queue.rows == 2 * len(rows)


def test_four_requests_of_two_rows_run_in_one_step(queue):
    queue.pause()
    futs = [queue.submit([[1 + i, 2, 3], [4, 5 + i]]) for i in range(4)]
    assert queue.pending_rows == 8
    queue.pause(False)
    assert all(f.result(60).shape[0] == 2 for f in futs)
    assert queue.steps == 1 and queue.fill[8] == 1 and queue.pending_rows == 0


def test_rows_of_one_request_span_steps(queue):
    queue.pause()
    big = queue.submit([[7, 8, i + 1] for i in range(12)])
    small = queue.submit([[9, 10]])
    queue.pause(False)
    assert big.result(60).shape[0] == 12 and small.result(60).shape[0] == 1
    assert queue.steps == 2 and queue.fill[8] == 1 and queue.fill[5] == 1


def test_a_cancelled_requests_rows_are_dropped(queue):
    queue.pause()
    gone = queue.submit([[1, 2], [3, 4]])
    kept = queue.submit([[5, 6], [7, 8]])
    assert gone.cancel()
    queue.pause(False)
    assert kept.result(60).shape[0] == 2
    assert gone.cancelled() and queue.dropped == 2 and queue.rows == 2 and queue.steps == 1


def test_a_failed_step_fails_its_requests_and_the_queue_goes_on(pm, queue, monkeypatch):
    """A step that raises fails every request with rows in it, also one whose other rows
    still wait (they are dropped with it); later requests run."""
    real, calls = pm.runner.step, []

    def step(rows, types=None):
        calls.append(len(rows))
        if len(calls) == 1:
            raise RuntimeError("device fault")
        return real(rows, types)

    monkeypatch.setattr(pm.runner, "step", step)
    queue.pause()
    big = queue.submit([[7, 8, i + 1] for i in range(12)])          # 8 rows now, 4 later
    queue.pause(False)
    with pytest.raises(RuntimeError, match="device fault"):
        big.result(60)
    assert queue.submit([[1, 2]]).result(60).shape[0] == 1
    assert calls == [8, 1] and queue.pending_rows == 0


def test_the_bound_refuses_past_it(pm):
    q = PoolQueue(pm.runner, max_pending_rows=4)
    try:
        q.pause()
        big = q.submit([[1]] * 6)                    # an empty queue admits any request
        with pytest.raises(PoolQueueFull):
            q.submit([[2]])
        more = q.submit([[2]], bounded=False)        # the Python API's path waits instead
        q.pause(False)
        assert big.result(60).shape[0] == 6 and more.result(60).shape[0] == 1
        q.submit([[3]] * 4).result(60)
        with pytest.raises(ValueError):
            q.submit([[]])
    finally:
        q.close()


def test_python_api_goes_through_the_models_queue(pm):
    ref = reference("qwen3_embed")
    before = pm.queue().steps
    assert np.abs(pm.embed_ids(_rows(ref)) - ref["embeddings"]).max() < TOL
    assert pm.queue().steps > before
