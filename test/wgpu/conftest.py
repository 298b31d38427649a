"""wgpu tests run for real on whatever adapter wgpu-native opens (lavapipe through Vulkan in
CI: Mesa's CPU driver); without the ``wgpu`` package or an adapter they skip and say why.

Environment as for the Vulkan tests: ``MESA_SHADER_CACHE_DIR`` in a per-session temp dir,
``LP_NUM_THREADS`` 2; ``XDG_RUNTIME_DIR`` set (wgpu-native's GL probe warns without one)."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("MESA_SHADER_CACHE_DIR", tempfile.mkdtemp(prefix="poot-mesa-cache-"))
os.environ.setdefault("LP_NUM_THREADS", "2")
os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.mkdtemp(prefix="poot-xdg-"))

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "vulkan"))     # regions.py: dispatch regions vs oracle
sys.path.insert(0, str(HERE.parent / "models"))     # model_steps.py: fixtures and step feeds


def _open():
    import importlib.util

    if importlib.util.find_spec("wgpu") is None:
        return None, "wgpu package not installed; pip install 'poot[wgpu]'"
    try:
        import wgpu  # noqa: F401  (wgpu-native loads here)
    except (ImportError, OSError) as e:
        return None, f"wgpu package not installed ({e}); pip install 'poot[wgpu]'"
    from poot.backends.wgpu.runtime import WgpuDevice, WgpuError

    try:
        return WgpuDevice(), None
    except WgpuError as e:
        return None, f"no usable wgpu adapter: {e}"


@pytest.fixture(scope="session")
def wg_device():
    dev, why = _open()
    if dev is None:
        pytest.skip(why)
    yield dev
    dev.close()


@pytest.fixture(scope="session")
def wg_target(wg_device):
    from poot.backends.wgpu.target import wgpu_target

    return wgpu_target(wg_device.capabilities())
