"""The wheel built from the source tree holds the whole of ``poot``: every package (each folder
of ``poot/`` with an ``__init__.py``), every data file beside the modules (anything under
``poot/`` that is not Python source), and the console scripts ``poot`` and ``poot-opt``.

The wheel is built the way CI's wheel smoke step builds it (``.ci/wheel_smoke.sh``):
``pip wheel --no-deps --no-build-isolation`` (no package index needed), from a copy of the
checkout's files so the build leaves nothing in the tree. A second build from a copy whose
``pyproject.toml`` leaves one package out shows the check notices a missing package.
"""

from __future__ import annotations

import configparser
import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: console script -> entry point, as the README's commands call them
CONSOLE_SCRIPTS = {"poot": "poot.cli:main", "poot-opt": "poot.opt:main"}

#: what setuptools needs beside the package: the project table and the README it reads
BUILD_FILES = ("pyproject.toml", "README.md")


def source_files() -> list[str]:
    """The files under ``poot/`` a clone of this checkout has (tracked, and untracked but not
    ignored), as paths relative to the repository root; compiled caches excluded."""
    r = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z", "poot"],
                       cwd=ROOT, capture_output=True)
    if r.returncode == 0:
        names = [n for n in r.stdout.decode().split("\0") if n]
    else:   # not a git checkout (an unpacked sdist): every file but bytecode
        names = [str(p.relative_to(ROOT)) for p in (ROOT / "poot").rglob("*") if p.is_file()]
    return sorted(n for n in names
                  if "__pycache__" not in n.split("/") and not n.endswith(".pyc")
                  and (ROOT / n).is_file())


def build_wheel(tree: Path, out: Path) -> Path:
    """Build ``tree``'s wheel into ``out`` with pip (no dependencies, no build isolation) and
    return its path; fails the test with pip's output when the build fails."""
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                        "--no-build-isolation", "-w", str(out), str(tree)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"pip wheel failed:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    wheels = list(out.glob("poot-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def copy_tree(dest: Path, files: list[str]) -> None:
    """The build's inputs (``BUILD_FILES`` and ``files``) copied under ``dest``."""
    for name in (*BUILD_FILES, *files):
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, dest / name)


def missing_from_wheel(wheel: Path, files: list[str]) -> list[str]:
    """The entries of ``files`` (paths under ``poot/``) that ``wheel`` does not hold: the
    ``__init__.py`` of every package and every other file (modules and data alike)."""
    with zipfile.ZipFile(wheel) as z:
        held = set(z.namelist())
    return [n for n in files if n not in held]


def entry_points(wheel: Path) -> dict[str, str]:
    """The wheel's ``console_scripts``: script name -> ``module:function``."""
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/entry_points.txt"))
        text = z.read(name).decode()
    cp = configparser.ConfigParser()
    cp.read_string(text)
    return dict(cp["console_scripts"]) if cp.has_section("console_scripts") else {}


@pytest.fixture(scope="module")
def files() -> list[str]:
    return source_files()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory, files) -> Path:
    if importlib.util.find_spec("setuptools") is None or (
            importlib.util.find_spec("wheel") is None and not _setuptools_has_bdist_wheel()):
        pytest.skip("no setuptools with bdist_wheel here (the test extra brings `wheel`): "
                    "cannot build without a package index")
    tmp = tmp_path_factory.mktemp("wheel")
    copy_tree(tmp / "src", files)
    return build_wheel(tmp / "src", tmp / "out")


def _setuptools_has_bdist_wheel() -> bool:
    return importlib.util.find_spec("setuptools.command.bdist_wheel") is not None


def test_source_tree_has_the_packages(files):
    packages = [n for n in files if n.endswith("/__init__.py")]
    assert "poot/__init__.py" in packages
    assert "poot/backends/rocm/__init__.py" in packages, "the check would not see ROCm"
    # every folder holding a module is a package (a folder without __init__.py would be
    # left out of the wheel by find_packages silently, and this test could not see it)
    dirs = {os.path.dirname(n) for n in files if n.endswith(".py")}
    assert dirs <= {os.path.dirname(p) for p in packages}, sorted(
        dirs - {os.path.dirname(p) for p in packages})


def test_wheel_holds_every_package_and_data_file(wheel, files):
    assert missing_from_wheel(wheel, files) == []


def test_wheel_declares_the_console_scripts(wheel):
    assert entry_points(wheel) == CONSOLE_SCRIPTS
    for target in CONSOLE_SCRIPTS.values():
        module, func = target.split(":")
        path = ROOT / (module.replace(".", "/") + ".py")
        if not path.exists():
            path = ROOT / module.replace(".", "/") / "__init__.py"
        assert f"def {func}(" in path.read_text(), f"{target}: no function {func} in {path}"


def test_check_sees_a_package_left_out(tmp_path, files):
    """A pyproject that excludes ``poot.backends.rocm`` (as the hand-written list once did)
    builds a wheel the check rejects, naming the package's files."""
    if importlib.util.find_spec("wheel") is None and not _setuptools_has_bdist_wheel():
        pytest.skip("no setuptools with bdist_wheel here: cannot build")
    copy_tree(tmp_path / "src", files)
    pyproject = tmp_path / "src" / "pyproject.toml"
    text = pyproject.read_text()
    find = "[tool.setuptools.packages.find]\n"
    assert find in text, "pyproject.toml no longer finds packages: update this test"
    pyproject.write_text(text.replace(find, find + 'exclude = ["poot.backends.rocm*"]\n'))
    missing = missing_from_wheel(build_wheel(tmp_path / "src", tmp_path / "out"), files)
    assert "poot/backends/rocm/__init__.py" in missing
    assert all(n.startswith("poot/backends/rocm/") for n in missing), missing
