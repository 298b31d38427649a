"""The executor contract: :class:`Session` over a per-backend :class:`Device`.

``load_weights`` once per model, ``add_entry(program)`` per step shape, ``step(entry,
inputs)``: the first step on an entry records, later steps replay (see
:mod:`poot.runtime.session`). Each backend's device lives in its folder
(``poot/backends/<name>/runtime.py``); :func:`open_device` opens it through the registry.
"""

from poot.backends.registry import BACKENDS, hook
from poot.runtime.device import Device, DeviceError, Kernel, KernelArg, Readback, Ready
from poot.runtime.session import Session, Entry, RowFeed, SessionError, Submitted


_OPEN: dict[str, Device] = {}


def open_device(backend: str) -> Device:
    """The process's device for ``backend`` (opened once, through its
    :mod:`poot.backends.registry` hook): the host CPU, the first Vulkan physical device or
    wgpu adapter (a discrete GPU first), or CUDA device 0.

    A missing runtime package (``cuda-python`` / ``vulkan`` / ``wgpu``), a missing driver or
    loader (``libcuda.so.1``, ``libvulkan.so.1``, no Vulkan ICD) or no device raises
    :class:`DeviceError`, one line saying what is missing and what to install; it is probed
    before anything is compiled."""
    if backend not in _OPEN:
        reg = BACKENDS.get(backend)
        if reg is None or reg.open_device is None:
            raise DeviceError(f"no executor device for backend '{backend}' in this build")
        _OPEN[backend] = hook(reg.open_device)()
    return _OPEN[backend]


def device_for(target) -> Device:
    """The executor device a program compiled for ``target`` runs on."""
    return open_device(target.backend)


__all__ = ["Device", "DeviceError", "Session", "Entry", "SessionError", "Kernel",
           "KernelArg", "Readback", "Ready", "Submitted", "device_for", "open_device"]
