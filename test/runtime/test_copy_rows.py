"""Row copies on the device (``Device.copy_rows_async``, :func:`poot.runtime.device.row_regions`):
the byte regions a list of row runs becomes, the refusals, and the CPU device's copy. The
Vulkan and wgpu devices run the same copy between steps in flight
(``test_row_copies_between_steps_in_flight``); the engine's steps issued ahead use it
(``test/engine/test_ahead_steps.py``)."""

from __future__ import annotations

import numpy as np
import pytest

from poot.backends.cpu.runtime import CpuDevice
from poot.dialects.types import DType, TensorType
from poot.runtime.device import DeviceError, row_regions


def test_runs_become_byte_regions_and_consecutive_runs_merge():
    src, dst = np.zeros(8, np.int32), np.zeros((6, 1), np.int32)
    # rows 0, 1, 2 -> 0, 1, 2 are one region; 4 -> 3 starts another; 5 -> 5 a third
    got = row_regions(src, dst, [(0, 0, 1), (1, 1, 1), (2, 2, 1), (4, 3, 1), (5, 5, 1)])
    assert got == [(0, 0, 12), (16, 12, 4), (20, 20, 4)]
    assert row_regions(src, dst, [(3, 0, 0)]) == []             # an empty run copies nothing
    wide = np.zeros((4, 3), np.float16)                          # rows of 6 bytes
    assert row_regions(wide, np.zeros((2, 3), np.int16), [(3, 1, 1)]) == [(18, 6, 6)]


@pytest.mark.parametrize("runs,match", [
    ([(8, 0, 1)], "outside"), ([(0, 6, 1)], "outside"), ([(7, 0, 2)], "outside"),
    ([(-1, 0, 1)], "outside")])
def test_runs_outside_either_buffer_are_refused(runs, match):
    with pytest.raises(DeviceError, match=match):
        row_regions(np.zeros(8, np.int32), np.zeros((6, 1), np.int32), runs)


def test_rows_of_unequal_size_are_refused():
    with pytest.raises(DeviceError, match="cannot copy rows"):
        row_regions(np.zeros((4, 2), np.int32), np.zeros(4, np.int32), [(0, 0, 1)])


def test_cpu_device_copies_rows_in_place():
    dev = CpuDevice()
    src = dev.alloc(TensorType((5,), DType.I32))
    dst = dev.alloc(TensorType((4, 1), DType.I32))
    dev.upload(src, np.array([10, 11, 12, 13, 14], np.int32))
    dev.upload(dst, np.full((4, 1), -1, np.int32))
    buf = dst
    dev.copy_rows_async(src, dst, [(4, 0, 1), (0, 2, 2)])
    assert dst is buf                                            # the same buffer, rewritten
    np.testing.assert_array_equal(dev.download(dst)[:, 0], [14, -1, 10, 11])
