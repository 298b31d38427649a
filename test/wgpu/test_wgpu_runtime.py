"""The wgpu device's contract on a real adapter: bind groups built once and the step
re-encoded per replay, transfers of any size, the error word, the adapter's limits refused
by name (at planning where no compile is needed, at load otherwise), submission splitting,
and the target the adapter's features decide."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from test_vulkan_runtime import (_embed, _out, cache_step_bound,  # the Vulkan tests' cases
                                 embed_recorded, queued_fault_case, queued_steps_case,
                                 row_copy_case)

from poot import oracle
from poot.dialects.types import DType, TensorType
from poot.graph.builder import Builder


@pytest.mark.parametrize("per_submit", [None, 1])
def test_record_once_replay_follows_rewritten_inputs(wg_device, wg_target, per_submit):
    """One recording (bind groups made once) replayed with new inputs each time: results follow
    them, with the whole step in one command buffer or one dispatch per command buffer."""
    g, k, w, cache, bufs, rng = cache_step_bound(wg_device, wg_target, 0)
    records, submits = wg_device.records, wg_device.submits
    rec = wg_device.record(k, bufs)
    groups = [op[2] for op in rec.ops if op[0] == "dispatch"]
    old = wg_device.dispatches_per_submit
    wg_device.dispatches_per_submit = per_submit
    try:
        for i in range(4):
            x = rng.standard_normal((1, 4)).astype(np.float32)
            idx = np.array([[i]], np.int32)
            for a, b in zip(k.args, bufs):
                if a.name == "x":
                    wg_device.upload(b, x)
                elif a.name == "idx":
                    wg_device.upload(b, idx)
                elif a.role == "input" and a.name == "cache":
                    wg_device.upload(b, cache)
            wg_device.replay(rec)
            wg_device.synchronize()
            want = oracle.evaluate(g, {"x": x, "idx": idx, "cache": cache}, {"w": w})
            np.testing.assert_allclose(_out(wg_device, k, bufs, "y"), want["y"], atol=1e-5)
            cache = want["cache"]
    finally:
        wg_device.dispatches_per_submit = old
    assert wg_device.records == records + 1 and rec.submits == 4
    assert [op[2] for op in rec.ops if op[0] == "dispatch"] == groups   # the same objects
    n = len(groups)
    assert wg_device.submits - submits == 4 * (1 if per_submit is None else max(n, 1))


def test_queued_steps_in_flight_equal_sequential(wg_device, wg_target):
    """Steps issued before any is read (``queue.write_buffer`` uploads, mapped readbacks)
    equal the oracle's, in order (the Vulkan tests' case)."""
    from poot.backends.wgpu.runtime import WgpuReadback

    queued_steps_case(wg_device, wg_target, WgpuReadback)


def test_a_token_is_one_submission(wg_device, wg_target):
    """Write the inputs, replay, queue the read: the replay's command buffers and the read's
    copy go out in one ``queue.submit`` per step (each costs wgpu-native host time), and each
    read still sees its own step."""
    k, table, bufs, rec = embed_recorded(wg_device, wg_target, [1, 2])
    wg_device.replay(rec)
    wg_device.synchronize()
    reads, before = [], wg_device.submits
    for toks in ([3, 4], [5, 6], [7, 8]):
        wg_device.upload_async(bufs[0], np.array([toks], np.int32))
        wg_device.replay(rec)
        reads.append((toks, wg_device.download_async(bufs[2])))
    assert wg_device.submits - before == 3
    for toks, r in reads:
        np.testing.assert_array_equal(r.wait()[0], -table[toks])


def test_waiting_for_a_read_submits_the_next_step_first(wg_device, wg_target):
    """The pipelined decode loop: step n is read, step n+1 is already replayed (queued, not
    submitted). Waiting for step n's read first submits step n+1, so the GPU has it while the
    host waits, and then waits only for the read's own submission (its index): step n's read
    sees step n's result, not step n+1's."""
    k, table, bufs, rec = embed_recorded(wg_device, wg_target, [1, 2])
    wg_device.replay(rec)
    wg_device.synchronize()
    wg_device.upload_async(bufs[0], np.array([[3, 4]], np.int32))
    wg_device.replay(rec)
    first = wg_device.download_async(bufs[2])
    if first.index is None:
        pytest.skip("this wgpu build does not expose wgpuQueueSubmitForIndex")
    wg_device.upload_async(bufs[0], np.array([[5, 6]], np.int32))
    wg_device.replay(rec)                     # step n+1: queued behind the read
    assert wg_device._unsubmitted, "a replay is queued until the next read, write or wait"
    submits, full = wg_device.submits, wg_device._native().full_polls
    np.testing.assert_array_equal(first.wait()[0], -table[[3, 4]])
    assert not wg_device._unsubmitted and wg_device.submits == submits + 1
    assert wg_device._native().full_polls == full    # resolved by its own submission's poll
    np.testing.assert_array_equal(wg_device.download_async(bufs[2]).wait()[0], -table[[5, 6]])


def test_a_dropped_read_frees_its_buffer_for_the_next(wg_device, wg_target):
    """A read released unwaited (a finished request's last token) keeps its map request;
    once that has resolved, the next read reuses the buffer and reads its own step."""
    k, table, bufs, rec = embed_recorded(wg_device, wg_target, [1, 2])
    wg_device.replay(rec)
    dropped = wg_device.download_async(bufs[2])
    if dropped.mapping is None:
        pytest.skip("this wgpu build does not expose wgpu-native's map functions")
    buf = dropped.mappable
    dropped.release()
    wg_device.synchronize()                   # every submission has run: the map resolved
    wg_device._map_free = [b for b in wg_device._map_free if b is not buf]
    wg_device.upload_async(bufs[0], np.array([[7, 8]], np.int32))
    wg_device.replay(rec)
    again = wg_device.download_async(bufs[2])   # reaps the dropped read first
    assert not wg_device._released and (again.mappable is buf or buf in wg_device._map_free)
    np.testing.assert_array_equal(again.wait()[0], -table[[7, 8]])


def test_a_fault_in_a_queued_step_surfaces_at_its_readback(wg_device, wg_target):
    queued_fault_case(wg_device, wg_target)


def test_row_copies_between_steps_in_flight(wg_device, wg_target):
    row_copy_case(wg_device, wg_target)


@pytest.mark.parametrize("dtype,shape", [(np.int8, (3,)), (np.bool_, (5,)), (np.float32, (7,)),
                                         (np.int32, (2, 3))])
def test_transfers_round_trip_any_size(wg_device, dtype, shape):
    """Buffers whose byte size is not a multiple of 4 (WebGPU writes whole words) read back
    what was written; a row write changes only its rows."""
    t = TensorType(shape, {np.int8: DType.I8, np.bool_: DType.I1, np.float32: DType.F32,
                           np.int32: DType.I32}[dtype])
    buf = wg_device.alloc(t)
    assert not wg_device.download(buf).any()            # zero-filled
    rng = np.random.default_rng(3)
    a = (rng.integers(0, 2, shape) if dtype is np.bool_ else
         rng.integers(-100, 100, shape)).astype(dtype)
    wg_device.upload(buf, a)
    np.testing.assert_array_equal(wg_device.download(buf), a)
    if len(shape) == 2:
        row = np.full((1, shape[1]), 9, dtype)
        wg_device.upload_rows(buf, 1, row)
        a[1] = 9
        np.testing.assert_array_equal(wg_device.download(buf), a)


def test_gather_out_of_range_sets_error_word(wg_device, wg_target):
    """A token id outside the table: the gather's check sets the error word, synchronize
    raises KernelFault naming the dispatch; the word is cleared and the device stays usable."""
    from poot.backends.vulkan.runtime import KernelFault

    k, table, bufs, rec = embed_recorded(wg_device, wg_target, [3, 99])
    wg_device.replay(rec)
    with pytest.raises(KernelFault, match="gather index out of range") as ei:
        wg_device.synchronize()
    assert ei.value.dispatch and "dispatch" in ei.value.dispatch
    wg_device.upload(bufs[0], np.array([[3, 15]], np.int32))
    wg_device.replay(rec)
    wg_device.synchronize()
    np.testing.assert_array_equal(_out(wg_device, k, bufs, "h")[0], -table[[3, 15]])


def test_limits_are_refused_by_name(wg_device, wg_target):
    """Past the adapter's limits: a tensor larger than a binding may be is a planning refusal
    before anything compiles; a kernel binding more buffers than a stage allows and a buffer
    past the binding size are refused at load / alloc, naming the limit."""
    from poot.backends.vulkan.codegen import compile_vulkan
    from poot.backends.wgpu.runtime import WgpuLimitExceeded
    from poot.compiler.planning import Refusal

    from test_vulkan_runtime import LIMITS

    big = wg_target.caps.max_buffer_bytes // 4 + 1
    b = Builder(LIMITS, name="big")
    x = b.input("x", TensorType((big,), DType.F32))
    g = b.finish({"y": b.unary("neg", x)})
    with pytest.raises(Refusal, match="buffers of"):
        compile_vulkan(g, wg_target)
    with pytest.raises(WgpuLimitExceeded, match="max-storage-buffer-binding-size"):
        wg_device.alloc(TensorType((big,), DType.F32))
    art = copy.deepcopy(compile_vulkan(_embed(), wg_target).executable)
    art.kernels[0].bindings = wg_device.limits["max-storage-buffers-per-shader-stage"] + 1
    with pytest.raises(WgpuLimitExceeded, match="max-storage-buffers-per-shader-stage"):
        wg_device.load(art)


def test_target_follows_the_adapter(wg_device, wg_target):
    """What naga cannot take is never declared (8/16-bit storage and integers); subgroup
    operations only at the probed size; the kernel buffer limit leaves the error word's
    binding."""
    from poot.backends.wgpu.target import wgpu_target

    caps = wg_device.capabilities()
    f = wg_target.caps.features
    assert not f & {"storageBuffer8BitAccess", "storageBuffer16BitAccess", "shaderInt8",
                    "shaderInt16"}
    assert DType.F16 not in wg_target.caps.storage_dtypes
    assert wg_target.caps.max_kernel_buffers == \
        caps["limits"]["max-storage-buffers-per-shader-stage"] - 1
    if caps["subgroup_size"]:
        assert wg_target.caps.subgroup_size == caps["subgroup_size"]
        assert "subgroupShuffle" in f
    unknown = wgpu_target({**caps, "subgroup_size": None, "subgroup_min_size": 4,
                           "subgroup_max_size": 128})
    assert unknown.caps.subgroup_size is None and "subgroupShuffle" not in unknown.caps.features


def test_compiled_elsewhere_from_the_device_capabilities(wg_device, tmp_path):
    """``compile_steps(device_caps=...)`` (``poot compile --device-caps``, for a device read
    elsewhere by ``poot devices --json``) fills the cache with exactly the programs a handle
    on that device looks up: loading then compiles nothing. Without the capabilities the
    compile is refused, naming what to give."""
    from model_steps import fixture_path

    from poot.api import ModelHandle, compile_steps
    from poot.sampling_params import InvalidRequest

    with pytest.raises(InvalidRequest, match="poot devices --json"):
        compile_steps(fixture_path("llama"), "wgpu", kv_capacity=32, cache_dir=str(tmp_path))
    compile_steps(fixture_path("llama"), "wgpu", kv_capacity=32, max_batch=1,
                  cache_dir=str(tmp_path), device_caps=wg_device.capabilities())
    h = ModelHandle.load(fixture_path("llama"), backend="wgpu", kv_capacity=32, max_batch=1,
                         cache_dir=tmp_path)
    assert h.compile_cache.misses == 0 and h.compile_cache.hits >= 3
