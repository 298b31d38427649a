"""User mistakes on the ``poot`` command line: one line ``poot: error: ...`` on stderr, exit
status 2, never a traceback (each case runs the CLI in a fresh interpreter)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "test" / "fixtures" / "tiny"
LLAMA = TINY / "llama"
GGUF = TINY / "llama_gguf_q4_1" / "model.gguf"


def poot(*argv, stdin: bytes = b"", prelude: str = "", env=None, timeout=300):
    """Run ``poot ARGV`` (after ``prelude`` Python) in a subprocess; (rc, stdout, stderr)."""
    code = (f"import sys\n{prelude}\nfrom poot.cli import main\n"
            f"sys.exit(main(sys.argv[1:]))\n")
    argv = [a if isinstance(a, bytes) else str(a) for a in argv]
    p = subprocess.run([sys.executable, "-c", code, *argv], input=stdin, capture_output=True,
                       cwd=ROOT, env=env, timeout=timeout)
    return p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")


def user_error(rc, err, *needles):
    """Assert one ``poot: error:`` line naming every needle, status 2, no traceback."""
    assert rc == 2, err
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("poot: error: "), err
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


# --- 1. a GPU backend without its runtime package -----------------------------------------

@pytest.mark.parametrize("cmd", ["generate", "bench"])
def test_cuda_without_cuda_python(cmd):
    extra = ["--prompt", "hi"] if cmd == "generate" else []
    rc, _, err = poot(cmd, "--model", LLAMA, "--backend", "cuda", *extra,
                      prelude="sys.modules['cuda'] = None  # cuda-python not installed")
    user_error(rc, err, "cuda-python", "pip install 'poot[cuda]'")


def test_vulkan_without_vulkan_package():
    rc, _, err = poot("generate", "--model", LLAMA, "--backend", "vulkan", "--prompt", "hi",
                      prelude="sys.modules['vulkan'] = None  # vulkan not installed\n"
                              "import importlib.util\n"
                              "importlib.util.find_spec = lambda name, *a: None")
    user_error(rc, err, "vulkan", "pip install 'poot[vulkan]'")


def test_open_device_missing_runtime_is_device_error(monkeypatch):
    import poot.executor as ex

    monkeypatch.setitem(sys.modules, "cuda", None)
    monkeypatch.delitem(ex._OPEN, "cuda", raising=False)
    with pytest.raises(ex.DeviceError, match="cuda-python"):
        ex.open_device("cuda")
