"""The executor contract: :class:`Engine` over a per-backend :class:`Device`.

``load_weights`` once per model, ``add_entry(program)`` per step shape, ``step(entry,
inputs)``: the first step on an entry records, later steps replay (see
:mod:`poot.executor.engine`). :class:`CpuDevice` is the host's device.
"""

from poot.executor.cpu import CpuDevice, DeviceError
from poot.executor.device import Device, Kernel, KernelArg, Readback, Ready
from poot.executor.engine import Engine, Entry, ExecutorError, Submitted


_OPEN: dict[str, Device] = {}


def open_device(backend: str) -> Device:
    """The process's device for ``backend`` (opened once): the host CPU, the first Vulkan
    physical device (a discrete GPU first), or CUDA device 0.

    A missing runtime package (``cuda-python`` / ``vulkan``), a missing driver or loader
    (``libcuda.so.1``, ``libvulkan.so.1``, no Vulkan ICD) or no device raises
    :class:`DeviceError`, one line saying what is missing and what to install; it is probed
    before anything is compiled."""
    if backend not in _OPEN:
        if backend == "cpu":
            _OPEN[backend] = CpuDevice()
        elif backend == "vulkan":
            _OPEN[backend] = _open_vulkan()
        elif backend == "cuda":
            _OPEN[backend] = _open_cuda()
        else:
            raise DeviceError(f"no executor device for backend '{backend}' in this build")
    return _OPEN[backend]


def _open_vulkan() -> Device:
    import importlib.util

    if importlib.util.find_spec("vulkan") is None:
        raise DeviceError("the vulkan backend needs the 'vulkan' package: "
                          "pip install 'poot[vulkan]'")
    from poot.backends.vulkan.runtime import VulkanDevice, VulkanError

    try:
        return VulkanDevice()
    except VulkanError as e:
        raise DeviceError(f"no usable Vulkan device: {e}") from None


def _open_cuda() -> Device:
    try:
        from cuda.bindings import driver  # noqa: F401
    except ImportError:
        raise DeviceError("the cuda backend needs cuda-python: pip install 'poot[cuda]'") \
            from None
    from poot.backends.cuda.runtime import NO_DRIVER, CudaDevice, CudaError, nvidia_driver

    if nvidia_driver() is None:        # cuda-python would raise deep inside cuInit
        raise DeviceError(NO_DRIVER)
    try:
        return CudaDevice()
    except CudaError as e:
        raise DeviceError(f"no CUDA device: {e}") from None
    except Exception as e:  # noqa: BLE001  (cuda-python's own loader errors, ...)
        why = (str(e).strip().splitlines() or [""])[0]
        raise DeviceError(f"no CUDA device: {type(e).__name__}: {why}") from None


def device_for(target) -> Device:
    """The executor device a program compiled for ``target`` runs on."""
    return open_device(target.backend)


__all__ = ["CpuDevice", "Device", "DeviceError", "Engine", "Entry", "ExecutorError", "Kernel",
           "KernelArg", "Readback", "Ready", "Submitted", "device_for", "open_device"]
