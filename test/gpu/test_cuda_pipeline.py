"""The CUDA runtime's pieces for a pipelined decode loop: a feedback copy recorded into the
step's graph, queued uploads staged in page-locked memory (a reused host array never read
late), queued page-locked readbacks that keep their step's value, and a synchronous upload
ordered after queued work.

Each runtime test runs twice: on ``fake_cuda`` (a lazy host-memory stand-in for the driver
API: here, always) and on a real CUDA device (skips without one, saying why). The end-to-end
test (pipelined == sequential generation on the tiny Llama) needs a device."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "driver"))

from fake_cuda import CopyArtifact, FakeDriver  # noqa: E402

from poot.runtime import Session  # noqa: E402

FEEDBACK = {"sampling.token": "tokens"}


@pytest.fixture(params=["fake", "device"])
def cuda(request, monkeypatch):
    """A CudaDevice over the fake driver, or over the real one (skipped without a device)."""
    from poot.backends.cuda import runtime

    if request.param == "fake":
        monkeypatch.setattr(runtime, "_cu", FakeDriver())
    else:
        ok, why = runtime.device_available()
        if not ok:
            pytest.skip(f"no CUDA device: {why}")
    return runtime.CudaDevice()


def _engine(dev):
    eng = Session(dev)
    return eng, eng.add_entry(CopyArtifact(), feedback=FEEDBACK)


def test_feedback_copy_is_recorded_in_the_graph(cuda):
    eng, e = _engine(cuda)
    eng.write_inputs(e, {"tokens": np.array([[-1]], np.int32)})
    seen = []
    for p in range(5):
        out = eng.step(e, {"positions": np.array([[p]], np.int32)})
        seen.append((int(out["sampling.token"][0]), int(out["echo"][0])))
    assert seen == [(0, -1), (1, 0), (2, 1), (3, 2), (4, 3)]
    rec = next(iter(e.recordings.values()))
    assert rec.nodes == 3                          # two plan copies + the feedback copy
    assert int(cuda.download(e.slots["tokens"])[0, 0]) == 4


def test_a_device_made_on_one_thread_runs_steps_on_another(cuda):
    """The server loads the model on a loader thread and steps it on the engine thread: the
    device's context must be current there too (it was not: CUDA_ERROR_INVALID_CONTEXT at the
    first page-locked upload of the engine thread)."""
    import threading

    eng, e = _engine(cuda)
    eng.write_inputs(e, {"tokens": np.array([[-1]], np.int32)})
    seen, errors = [], []

    def run():
        try:
            for p in range(3):
                out = eng.step(e, {"positions": np.array([[p]], np.int32)})
                seen.append(int(out["sampling.token"][0]))
        except Exception as exc:  # noqa: BLE001  (reported below)
            errors.append(exc)

    t = threading.Thread(target=run)
    t.start()
    t.join(60)
    assert not errors, errors
    assert seen == [0, 1, 2]


def test_pipelined_submits_reuse_one_host_array(cuda):
    """Twenty steps issued before any is collected, every position written from the same host
    array (the device stages each write: 8 page-locked slots reused in turn); each readback
    keeps its own step's values although later steps rewrite the output buffers."""
    eng, e = _engine(cuda)
    eng.write_inputs(e, {"tokens": np.array([[-1]], np.int32)})
    pos = np.zeros((1, 1), np.int32)
    subs = []
    for p in range(20):
        pos[0, 0] = 100 + p
        subs.append(eng.submit(e, {"positions": pos}))
    got = [eng.collect(s) for s in subs]
    assert [int(g["sampling.token"][0]) for g in got] == [100 + p for p in range(20)]
    assert [int(g["echo"][0]) for g in got] == [-1] + [100 + p for p in range(19)]
    # a discarded step still ran, in order; its readback slot is reused
    d = eng.submit(e, {"positions": np.array([[7]], np.int32)}, read=["sampling.token"])
    eng.discard(d)
    out = eng.collect(eng.submit(e, {"positions": np.array([[8]], np.int32)}))
    assert (int(out["sampling.token"][0]), int(out["echo"][0])) == (8, 7)


def test_sync_upload_waits_for_queued_steps(cuda):
    """A synchronous write (a new request's first token) lands after the queued steps' feedback
    copies, not under them."""
    eng, e = _engine(cuda)
    subs = [eng.submit(e, {"positions": np.array([[p]], np.int32)}) for p in range(3)]
    eng.write_inputs(e, {"tokens": np.array([[42]], np.int32)})
    for s in subs:
        eng.discard(s)
    out = eng.step(e, {"positions": np.array([[9]], np.int32)})
    assert int(out["echo"][0]) == 42


def test_unstaged_async_upload_would_be_caught():
    """The fake stream is lazy: a copy queued from host memory that is rewritten before the
    stream runs reads the new value (what staging in page-locked slots prevents)."""
    drv = FakeDriver()
    drv.cuCtxSetCurrent(object())
    (_, s), (_, dst) = drv.cuStreamCreate(0), drv.cuMemAlloc(4)
    host = np.array([1], np.int32)
    drv.cuMemcpyHtoDAsync(dst, host.ctypes.data, 4, s)
    host[0] = 2
    drv.cuStreamSynchronize(s)
    out = np.zeros(1, np.int32)
    drv.cuMemcpyDtoH(out.ctypes.data, dst, 4)
    assert out[0] == 2


def test_pipelined_generation_equals_sequential_on_device(tmp_path):
    from poot.backends.cuda.runtime import device_available

    ok, why = device_available()
    if not ok:
        pytest.skip(f"no CUDA device: {why}")
    try:
        import mlir.ir  # noqa: F401
    except ImportError:
        pytest.skip("compiling the fixture needs the MLIR wheels, which this GPU machine "
                    "lacks (the carried-cache greedy check in bench/gpu_run/cuda_decode.sh runs "
                    "the pipelined driver there)")
    import pipeline_cases as pc
    from model_steps import fixture_path, reference

    from poot.api import ModelHandle

    load = lambda: ModelHandle.load(fixture_path("llama"), backend="cuda",  # noqa: E731
                                    kv_capacity=32, prefill_chunk=5, cache_dir=tmp_path)
    h = load()
    assert h.runner.session.overlaps
    prompt = [int(i) for i in reference("llama")["prompt_ids"]]
    other = [2, 40, 9, 77, 5]
    pc.case_greedy_and_logprobs(h, prompt)
    pc.case_max_tokens_one(h, prompt)
    pc.case_seeded_sampling(h, prompt)
    pc.case_stop_token_then_next_request(h, load, prompt, other)
    pc.case_penalties(h, load, prompt, other)
    pc.case_back_to_back(h, load, prompt, other)
    pc.case_abandoned_stream(h, load, prompt, other)
    pc.case_feedback_lands_in_token_input(h, prompt)
