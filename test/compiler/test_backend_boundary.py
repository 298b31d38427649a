"""The compiler and the backends meet only at the registry (:mod:`poot.backends.registry`).

Read from the source (every ``import`` and ``from ... import``, function-local ones too, so a
lazy import cannot hide a dependency):

* ``poot.compiler`` imports no backend module by name: the one module of ``poot.backends`` it
  may import is the registry, the table it looks code generators up in.
* No backend module imports the compile entry's internals: a backend that compiles (Vulkan's
  ``compile_vulkan`` convenience) uses the public package ``poot.compiler``, never the module
  ``poot.compiler.compile`` or a ``_private`` name of ``poot.compiler``'s modules.
* Nothing in ``poot.compiler`` compares a target's backend with a backend's name (the code
  generator is found by the registry, not by an ``if``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

POOT = Path(__file__).resolve().parents[2] / "poot"
BACKEND_NAMES = ("cpu", "cuda", "vulkan", "wgpu", "rocm")


def _imports(path: Path) -> list[tuple[str, tuple[str, ...], int]]:
    """``(module, imported names, line)`` for every import statement of ``path``; a relative
    import is resolved against the file's package."""
    tree = ast.parse(path.read_text(), str(path))
    package = ".".join(path.relative_to(POOT.parent).with_suffix("").parts[:-1])
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, (), node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([mod] if mod else []))
            out.append((mod, tuple(a.name for a in node.names), node.lineno))
    return out


def _files(sub: str) -> list[Path]:
    return sorted((POOT / sub).rglob("*.py"))


def test_the_scan_sees_the_known_imports():
    """The scanner is not blind: the compile entry's lazy registry import is found."""
    found = [m for m, _, _ in _imports(POOT / "compiler" / "compile.py")]
    assert "poot.backends.registry" in found
    assert "poot.compiler.options" in found


@pytest.mark.parametrize("path", _files("compiler"), ids=lambda p: p.name)
def test_compiler_imports_no_backend(path):
    bad = [(m, line) for m, _, line in _imports(path)
           if m.startswith("poot.backends") and m != "poot.backends.registry"]
    assert not bad, f"{path.name} imports backend modules {bad}: go through the registry"


@pytest.mark.parametrize("path", _files("backends"), ids=lambda p: str(p.relative_to(POOT)))
def test_backends_use_only_the_public_compiler(path):
    bad = []
    for mod, names, line in _imports(path):
        if mod == "poot.compiler.compile":
            bad.append((mod, line))
        elif mod.startswith("poot.compiler"):
            bad += [(f"{mod}.{n}", line) for n in names if n.startswith("_")]
    assert not bad, f"{path.relative_to(POOT)} reaches into the compiler's internals: {bad}"


@pytest.mark.parametrize("path", _files("compiler"), ids=lambda p: p.name)
def test_compiler_does_not_branch_on_a_backend(path):
    tree = ast.parse(path.read_text(), str(path))
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            parts = [node.left, *node.comparators]
            if any(isinstance(p, ast.Constant) and p.value in BACKEND_NAMES for p in parts):
                bad.append(node.lineno)
    assert not bad, f"{path.name} compares with a backend's name at lines {bad}"
