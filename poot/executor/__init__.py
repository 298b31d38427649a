"""The executor contract: :class:`Engine` over a per-backend :class:`Device`.

``load_weights`` once per model, ``add_entry(program)`` per step shape, ``step(entry,
inputs)``: the first step on an entry records, later steps replay (see
:mod:`poot.executor.engine`). :class:`CpuDevice` is the host's device.
"""

from poot.executor.cpu import CpuDevice, DeviceError
from poot.executor.device import Device, Kernel, KernelArg
from poot.executor.engine import Engine, Entry, ExecutorError


def device_for(target) -> Device:
    """The executor device for a compile target (the CPU today). A backend without a device
    here never gets this far: compile refuses it first (no code generator)."""
    if target.backend == "cpu":
        return CpuDevice()
    raise DeviceError(f"no executor device for backend '{target.backend}' in this build")


__all__ = ["CpuDevice", "Device", "DeviceError", "Engine", "Entry", "ExecutorError", "Kernel",
           "KernelArg", "device_for"]
