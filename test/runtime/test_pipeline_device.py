"""PipelineDevice's ordering over queued devices: CPU devices that log the queue operations
a GPU device provides (``signal``/``wait_for``/``copy_from``) show that every copy between
devices waits for its source's work, that a device waits for the copies that read from it
before it writes again, and that replay issues no more than the copies a step needs; plus
the typed refusals (stage count vs devices, weights past a device's free memory)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))

from engine_cases import alone, staggered  # noqa: E402
from model_steps import fixture_path  # noqa: E402
from poot.api import ModelHandle  # noqa: E402
from poot.sampling_params import SamplingParams  # noqa: E402
from poot.backends.cpu.runtime import CpuDevice  # noqa: E402
from poot.runtime.pipeline_parallel import PipelineDevice, PipelineError  # noqa: E402

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


class QueuedCpu(CpuDevice):
    """A CPU device that logs the cross-device queue operations into a shared list."""

    def __init__(self, index: int, log: list, free: int | None = None):
        super().__init__()
        self.index, self.log, self.free = index, log, free
        self.signals = 0

    def signal(self):
        self.signals += 1
        self.log.append(("signal", self.index, self.signals))
        return (self.index, self.signals)

    def wait_for(self, marker):
        self.log.append(("wait", self.index, marker))

    def copy_from(self, src_device, src, dst):
        self.log.append(("copy", self.index, src_device.index))
        np.copyto(dst, src)

    def replay(self, recording):
        self.log.append(("replay", self.index))
        super().replay(recording)

    def memory_info(self):
        return (self.free, 2 * self.free) if self.free is not None else (1 << 40, 1 << 41)


def _load(devices, **kw):
    opts = dict(kv_capacity=64, max_batch=2, prefill_chunk=8)
    opts.update(kw)
    return ModelHandle.load(fixture_path("llama"), pipeline_parallel=len(devices),
                            device=PipelineDevice(devices), **opts)


def test_copies_wait_for_their_source_and_writers_for_their_readers():
    log: list = []
    h = _load([QueuedCpu(0, log), QueuedCpu(1, log)])
    want = alone(ModelHandle.load(fixture_path("llama"), kv_capacity=64, max_batch=2,
                                  prefill_chunk=8).engine, [9, 8, 7, 6], GREEDY)
    log.clear()
    assert alone(h.engine, [9, 8, 7, 6], GREEDY) == want
    copies = [i for i, e in enumerate(log) if e[0] == "copy"]
    assert copies
    last_signal: dict[int, tuple] = {}
    for i, e in enumerate(log):
        if e[0] == "signal":
            last_signal[e[1]] = (e[1], e[2])
        if e[0] == "copy":
            dst, src = e[1], e[2]
            # the copy is queued right after its device waited for the source's latest mark
            assert log[i - 1] == ("wait", dst, last_signal[src]), log[i - 2:i + 1]
    # device 0 replays again only after waiting for device 1's copy from it, and only for
    # that copy: the marker it waits for is the one device 1 recorded right after the copy
    # (not after device 1's own stage, which may still run: micro-batches overlap)
    at = {(e[1], e[2]): i for i, e in enumerate(log) if e[0] == "signal"}
    replays0 = [i for i, e in enumerate(log) if e == ("replay", 0)]
    waited = 0
    for a, b in zip(replays0, replays0[1:]):
        between = log[a:b]
        if ("copy", 1, 0) in between:
            waits = [e for e in between if e[0] == "wait" and e[1] == 0 and e[2][0] == 1]
            assert waits, between
            for w in waits:
                assert log[at[w[2]] - 1] == ("copy", 1, 0), log[at[w[2]] - 2:at[w[2]] + 1]
                waited += 1
    assert waited > 0


def test_replay_copies_only_what_the_step_needs():
    """A decode step of one sequence moves the boundary activation (and nothing else that
    is already current) per stage boundary."""
    log: list = []
    h = _load([QueuedCpu(0, log), QueuedCpu(1, log), QueuedCpu(2, log)])
    alone(h.engine, [4, 5, 6], GREEDY)
    dev = h.runner.session.device
    before = dev.peer_copies
    decode = h.runner.decode_entry(1)
    h.runner.session.step(decode, read=["logits"])
    # two boundaries; the token input may have to come back from the last device
    assert 2 <= dev.peer_copies - before <= 3


def test_micro_batches_overlap_the_stages():
    """Four sequences as two micro-batches on two queued devices: stage 0 of micro-batch 1
    is issued before stage 1 of micro-batch 0 and does not wait for it (only for the copy
    out of its boundary buffer)."""
    log: list = []
    h = _load([QueuedCpu(0, log), QueuedCpu(1, log)], max_batch=4)
    eng = h.engine
    rids = [eng.add_request(p, GREEDY) for p in ([3, 4, 5], [6, 7], [8, 9, 10, 11], [12])]
    while eng.micro_batched_steps == 0:
        eng.step()
    log.clear()
    eng.step()                                  # one micro-batched decode step
    assert eng.micro_batched_steps >= 2
    replays = [e for e in log if e[0] == "replay"]
    # lane 0: stage 0, stage 1 (+ its sampler), lane 1: stage 0 ... in issue order
    first1 = log.index(("replay", 1))
    second0 = [i for i, e in enumerate(log) if e == ("replay", 0)][1]
    assert len(replays) >= 6
    at = {(e[1], e[2]): i for i, e in enumerate(log) if e[0] == "signal"}
    for e in log[first1:second0]:
        if e[0] == "wait" and e[1] == 0:
            assert log[at[e[2]] - 1] == ("copy", 1, 0)      # the copy, not stage 1's work
    eng.run_until_done()
    assert all(not eng.has_unfinished() for _ in rids)


def test_stage_count_must_match_devices():
    from poot.compiler.pipeline_parallel import PipelineProgram

    dev = PipelineDevice([CpuDevice(), CpuDevice(), CpuDevice()])
    prog = PipelineProgram([object(), object()], [], {})
    with pytest.raises(PipelineError, match="2 pipeline stages cannot run on 3 devices"):
        dev.load(prog)


def test_weights_past_free_memory_refused():
    log: list = []
    with pytest.raises(PipelineError, match=r"stage 0 needs .* GiB of weights but device 0"):
        _load([QueuedCpu(0, log, free=1000), QueuedCpu(1, log, free=1000)])


class OverlappingCpu(QueuedCpu):
    """Says it overlaps, so the engine issues step n + 1 before reading step n and feeds the
    sampled token back on the device (the CUDA path)."""

    overlaps = True


def test_sampled_token_fed_back_to_the_first_stage():
    """With the engine pipelining, the last device's sampler writes the next token input;
    the first stage gets it by a copy from the last device, and the tokens are the
    one-device run's."""
    want = alone(ModelHandle.load(fixture_path("llama"), kv_capacity=64, max_batch=2,
                                  prefill_chunk=8).engine, [3, 1, 4, 1, 5], GREEDY)
    log: list = []
    h = _load([OverlappingCpu(0, log), OverlappingCpu(1, log)])
    assert h.runner.session.overlaps
    log.clear()
    assert alone(h.engine, [3, 1, 4, 1, 5], GREEDY) == want
    assert ("copy", 0, 1) in log


@pytest.mark.parametrize("chain", [True, False])
def test_micro_batches_roll_without_draining_the_pipeline(chain):
    """With the engine pipelining on two stages, each micro-batch's next step is issued
    before the micro-batch behind it is read (so stage 0 starts it while stage 1 still runs
    the other): chained (before its own step is read, tokens fed on the device) or right
    after reading it; rows that finish leave their micro-batch, and every request -- greedy,
    seeded sampling, penalties -- gets its tokens alone."""
    one = ModelHandle.load(fixture_path("llama"), kv_capacity=64, max_batch=4,
                           prefill_chunk=8).engine
    items = [([3, 4, 5], 9), ([6, 7], 4), ([8, 9, 10, 11], 9), ([12, 2], 6)]
    params = [SamplingParams(temperature=0.0, max_tokens=items[0][1], ignore_eos=True),
              SamplingParams(temperature=0.9, top_k=20, seed=3, max_tokens=items[1][1],
                             ignore_eos=True),
              SamplingParams(temperature=0.7, top_p=0.8, repetition_penalty=1.3, seed=5,
                             max_tokens=items[2][1], ignore_eos=True),
              SamplingParams(temperature=0.0, max_tokens=items[3][1], ignore_eos=True)]
    want = [alone(one, p, sp) for (p, _), sp in zip(items, params)]
    log: list = []
    h = _load([OverlappingCpu(0, log), OverlappingCpu(1, log)], max_batch=4)
    eng, runner = h.engine, h.runner
    eng.chain_lanes = chain
    submit, collect = runner.submit_decode, runner.collect

    def submit_logged(batch, spec, lane=0):
        log.append(("issue", lane))
        return submit(batch, spec, lane=lane)

    def collect_logged(handle):
        log.append(("read", handle))
        return collect(handle)

    runner.submit_decode, runner.collect = submit_logged, collect_logged
    rids = [eng.add_request(p, sp) for (p, _), sp in zip(items, params)]
    done = {o.request_id: o for o in eng.run_until_done() if o.finished}
    assert [list(done[r].output_ids) for r in rids] == want
    events = [e for e in log if e[0] in ("issue", "read")]
    rolled = sum(1 for a, b, c in zip(events, events[1:], events[2:])
                 if a[0] == "read" and b == ("issue", 0) and c[0] == "read"
                 and c[1] is not a[1])
    assert rolled >= 3, events          # lane 0 re-issued between two lanes' reads
    assert (eng.chained_lane_steps > 0) == chain
    if chain:
        # a chained micro-batch's token comes back to stage 0 after its own sampler on the
        # last device, not after the other micro-batch's stage queued there behind it
        latest: dict = {}
        earlier = 0
        for i, e in enumerate(log):
            if e[0] == "signal":
                latest[e[1]] = (e[1], e[2])
            if e[0] == "copy" and e[1:] == (0, 1):
                wait = log[i - 1]
                assert wait[:2] == ("wait", 0) and wait[2][0] == 1, log[i - 2:i + 1]
                earlier += wait[2] != latest[1]
        assert earlier > 0


def test_rolling_micro_batches_take_arrivals_and_aborts():
    """Requests arriving while micro-batches roll (the pipeline drains to admit and prefill
    them, then rolls again) and one aborted while its micro-batch is in flight: every other
    request gets its tokens alone, the aborted one ends "abort", and every KV block is free
    at the end."""
    one = ModelHandle.load(fixture_path("llama"), kv_capacity=64, max_batch=4,
                           prefill_chunk=8).engine
    ps = [[3, 4, 5], [6, 7], [8, 9, 10, 11], [12, 2], [5, 5, 6]]
    sp = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    want = [alone(one, p, sp) for p in ps]
    log: list = []
    h = _load([OverlappingCpu(0, log), OverlappingCpu(1, log)], max_batch=4)
    eng = h.engine
    free = eng.blocks.num_free()
    got = staggered(eng, [(p, sp) for p in ps[:4]], every=3)
    for rid, w in zip(got["ids"], want):
        assert got["final"][rid].output_ids == w
    rolls = eng.micro_batched_steps
    assert rolls > 0 and eng.blocks.num_free() == free
    keep = [eng.add_request(p, sp) for p in ps[:2]]
    gone = eng.add_request(ps[4], sp)
    done: dict = {}
    while eng.micro_batched_steps < rolls + 3:
        done.update({o.request_id: o for o in eng.step() if o.finished})
    assert eng._lanes, "micro-batches in flight"
    eng.abort(gone)
    done.update({o.request_id: o for o in eng.run_until_done() if o.finished})
    assert done[gone].finish_reason == "abort" and len(done[gone].output_ids) < 10
    assert [done[r].output_ids for r in keep] == want[:2]
    assert eng.blocks.num_free() == free and not eng._lanes


def test_rows_written_before_any_stage_binds_the_buffer():
    """A carried row written before any stage bound its buffer (a request's token history
    at admission) is kept on the host and lands on the device that binds it; buffer types may
    be a device's own (numpy dtype name + shape, CUDA's BufType) or poot types."""
    from types import SimpleNamespace

    from poot.dialects.types import DType, TensorType

    dev = PipelineDevice([CpuDevice(), CpuDevice()])
    for t in (SimpleNamespace(dtype="int32", shape=(3, 4), nbytes=48),
              TensorType((3, 4), DType.I32)):
        buf = dev.alloc(t)
        dev.upload_rows(buf, 1, np.arange(4, dtype=np.int32)[None])
        got = dev.download(buf)
        assert got.dtype == np.int32 and got.shape == (3, 4)
        np.testing.assert_array_equal(got[1], np.arange(4))
        assert not got[0].any() and not got[2].any()
    copy = dev._on(buf, 1)                      # bound on device 1: the held value lands
    np.testing.assert_array_equal(copy[1], np.arange(4))


def test_fewer_devices_than_stages_is_a_typed_error(monkeypatch):
    """A backend with one device asked for two stages: a PipelineError naming the device
    that cannot be opened and why, not the driver's error from deep inside."""
    from poot.runtime import pipeline_parallel
    from poot.runtime.device import DeviceError
    from poot.runtime.pipeline_parallel import open_pipeline_devices

    def one_device(ordinal: int = 0):
        if ordinal:
            raise DeviceError(f"no CUDA device {ordinal}: cuDeviceGet: "
                              "CUDA_ERROR_INVALID_DEVICE")
        return CpuDevice()

    monkeypatch.setattr(pipeline_parallel, "hook", lambda name: one_device)
    with pytest.raises(PipelineError, match=r"2 stages needs 2 cuda devices; device 1 cannot "
                                            r"be opened \(no CUDA device 1"):
        open_pipeline_devices("cuda", 2)
    assert len(open_pipeline_devices("cuda", 1)) == 1
