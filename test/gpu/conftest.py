"""Shared by the gpu tests: the fixture and bench folders on sys.path, and one Vulkan device
(lavapipe in CI) for the region tests; without a loader or a usable device they skip and say
why. ``MESA_SHADER_CACHE_DIR`` defaults to a per-session temp dir (no writes to $HOME)."""

import os
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

os.environ.setdefault("MESA_SHADER_CACHE_DIR", tempfile.mkdtemp(prefix="poot-mesa-cache-"))
os.environ.setdefault("LP_NUM_THREADS", "2")


@pytest.fixture(scope="session")
def vk_device():
    try:
        from poot.backends.vulkan.runtime import VulkanDevice, VulkanError
    except ImportError as e:          # the PyPI `vulkan` package itself
        pytest.skip(f"vulkan package not installed ({e}); pip install vulkan==1.3.275.1")
    try:
        dev = VulkanDevice()
    except VulkanError as e:
        pytest.skip(f"no usable Vulkan device: {e}")
    yield dev
    dev.close()


@pytest.fixture(scope="session")
def vk_target(vk_device):
    from poot.backends.vulkan.codegen import vulkan_target

    return vulkan_target(vk_device.capabilities())


@pytest.fixture(scope="session")
def vk(vk_device, vk_target):
    """(device, its compile target)."""
    return vk_device, vk_target
