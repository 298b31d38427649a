"""``CudaDevice.copy_rows_async`` on a recording driver (runs without a GPU): one
``cuMemcpyDtoDAsync(dst, src, bytes, stream)`` a run of consecutive rows, at the rows' byte
offsets, on the device's stream; a run outside a buffer is refused before any call. The
copy itself runs on a GPU in ``bench/gpu_run/engine_check.py`` (steps issued ahead)."""

from __future__ import annotations

import numpy as np
import pytest

from poot.backends.cuda.runtime import CudaDevice, StreamCalls
from poot.backends.gpu.artifact import DeviceBuffer
from poot.runtime.device import DeviceError


class RecordingDriver:
    def __init__(self):
        self.calls = []

    def cuMemcpyDtoDAsync(self, dst, src, nbytes, stream):   # noqa: N802 (the driver's name)
        self.calls.append((dst, src, nbytes, stream))
        return (0,)


def _device(cu) -> CudaDevice:
    dev = CudaDevice.__new__(CudaDevice)     # no context: the driver is the recording one
    dev.stream = "stream"
    dev._driver = lambda: cu
    dev.calls = StreamCalls(cu)
    return dev


def test_one_async_copy_a_run_at_the_rows_offsets():
    cu = RecordingDriver()
    dev = _device(cu)
    src = DeviceBuffer(0x1000, 32, np.dtype(np.int32), (8,))
    dst = DeviceBuffer(0x9000, 24, np.dtype(np.int32), (6, 1))
    dev.copy_rows_async(src, dst, [(0, 0, 1), (1, 1, 1), (4, 3, 1), (7, 5, 1)])
    assert cu.calls == [(0x9000, 0x1000, 8, "stream"), (0x9000 + 12, 0x1000 + 16, 4, "stream"),
                        (0x9000 + 20, 0x1000 + 28, 4, "stream")]


def test_a_run_outside_the_buffer_makes_no_call():
    cu = RecordingDriver()
    dev = _device(cu)
    src = DeviceBuffer(0x1000, 32, np.dtype(np.int32), (8,))
    dst = DeviceBuffer(0x9000, 24, np.dtype(np.int32), (6, 1))
    with pytest.raises(DeviceError, match="outside"):
        dev.copy_rows_async(src, dst, [(0, 0, 1), (2, 6, 1)])
    assert cu.calls == []
