"""The executor contract: :class:`Engine` over a per-backend :class:`Device`.

``load_weights`` once per model, ``add_entry(program)`` per step shape, ``step(entry,
inputs)``: the first step on an entry records, later steps replay (see
:mod:`poot.executor.engine`). :class:`CpuDevice` is the host's device.
"""

from poot.executor.cpu import CpuDevice, DeviceError
from poot.executor.device import Device, Kernel, KernelArg
from poot.executor.engine import Engine, Entry, ExecutorError


_OPEN: dict[str, Device] = {}


def open_device(backend: str) -> Device:
    """The process's device for ``backend`` (opened once): the host CPU, the first Vulkan
    physical device (a discrete GPU first), or CUDA device 0. Opening a missing runtime or
    device raises the runtime's typed error."""
    if backend not in _OPEN:
        if backend == "cpu":
            _OPEN[backend] = CpuDevice()
        elif backend == "vulkan":
            from poot.backends.vulkan.runtime import VulkanDevice

            _OPEN[backend] = VulkanDevice()
        elif backend == "cuda":
            from poot.backends.cuda.runtime import CudaDevice

            _OPEN[backend] = CudaDevice()
        else:
            raise DeviceError(f"no executor device for backend '{backend}' in this build")
    return _OPEN[backend]


def device_for(target) -> Device:
    """The executor device a program compiled for ``target`` runs on."""
    return open_device(target.backend)


__all__ = ["CpuDevice", "Device", "DeviceError", "Engine", "Entry", "ExecutorError", "Kernel",
           "KernelArg", "device_for", "open_device"]
