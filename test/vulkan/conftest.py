"""Vulkan tests run for real on whatever Vulkan device is present (lavapipe in CI: Mesa's
CPU driver); without a loader or a device with robustBufferAccess they skip and say why.

Environment: ``MESA_SHADER_CACHE_DIR`` points at a per-session temp dir (no writes to $HOME;
a CI job may set its own to reuse compiled shaders), ``LP_NUM_THREADS`` defaults to 2
(lavapipe's rasterizer threads; small dispatches cost less with few threads)."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("MESA_SHADER_CACHE_DIR", tempfile.mkdtemp(prefix="poot-mesa-cache-"))
os.environ.setdefault("LP_NUM_THREADS", "2")

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "models"))


def _open():
    try:
        from poot.backends.vulkan.runtime import VulkanDevice, VulkanError
    except ImportError as e:          # the PyPI `vulkan` package itself
        return None, f"vulkan package not installed ({e}); pip install vulkan==1.3.275.1"
    try:
        return VulkanDevice(), None
    except VulkanError as e:
        return None, f"no usable Vulkan device: {e}"


@pytest.fixture(scope="session")
def vk_device():
    dev, why = _open()
    if dev is None:
        pytest.skip(why)
    yield dev
    dev.close()


@pytest.fixture(scope="session")
def vk_target(vk_device):
    from poot.backends.vulkan.codegen import vulkan_target

    return vulkan_target(vk_device.capabilities())
