"""The layers of ``poot/``, enforced from the source.

Every ``import`` and ``from ... import`` of every module is read (function-local ones too, so a
lazy import cannot hide a dependency) and checked against :data:`LAYERS`, lowest first:

* a module may import modules of its own layer or of a lower one, never of a higher one;
* no cycle between modules, in any layer (a package ``__init__`` counts as a module: a
  submodule that imports its own package's ``__init__`` which imports it back is a cycle);
* a function-local import of a poot module says why it is local: a ``# lazy: <reason>``
  comment on its line or the line above (it defers a heavy dependency such as MLIR or a GPU
  runtime package). Any other import belongs at the top of the module.

A module's layer is that of the longest prefix in :data:`LAYERS` naming it. ``docs/
architecture.md`` describes the layers; this test is their definition.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
POOT = ROOT / "poot"

#: Lowest first. Within a layer, packages may import each other (acyclically).
LAYERS: list[tuple[str, ...]] = [
    # foundations: typed errors, settings, progress events, lazy-module helper, the version
    ("poot.errors", "poot.settings", "poot.progress", "poot.lazy", "poot.version"),
    # the dialect (types, ops and their one semantic definition), file formats, text
    ("poot.dialects", "poot.load", "poot.text"),
    # graph building, the compiler's passes, the numpy oracle
    ("poot.graph", "poot.passes", "poot.oracle"),
    # model families (trace a step into a graph)
    ("poot.models",),
    # request parameters (validated; packed into the sampling step's inputs)
    ("poot.sampling_params",),
    # the compiler: compile(), planning, targets, the compile cache, pipeline partition; the
    # backend registry is the table it looks code generators up in (hooks are strings)
    ("poot.compiler", "poot.backends.registry", "poot.backends.pass_pipelines"),
    # the runtime contract: the Device protocol (a HAL), sessions (record/replay of steps)
    ("poot.runtime",),
    # the backends: code generators and device runtimes, one folder each
    ("poot.backends",),
    # the serving engine: scheduler, runner, output processing, KV block manager
    ("poot.engine",),
    # the Python API: load a model (compile or read the cache), generate, pool
    ("poot.api", "poot.matrix"),
    # the HTTP server
    ("poot.serve",),
    # the command line, poot-opt, and the package's lazy top-level names
    ("poot.cli", "poot.opt", "poot"),
]


def layer_of(module: str) -> int:
    """Index in :data:`LAYERS` of the longest prefix naming ``module``."""
    best, best_len = None, -1
    for i, prefixes in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best_len:
                best, best_len = i, len(p)
    if best is None:
        raise AssertionError(f"module {module} is in no layer: add it to LAYERS")
    return best


def module_name(path: Path, root: Path = POOT) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(root: Path = POOT) -> dict[str, Path]:
    return {module_name(p, root): p for p in sorted(root.rglob("*.py"))
            if "__pycache__" not in p.parts}


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The module ``name`` lives in (an attribute ``poot.a.b.X`` resolves to ``poot.a.b``)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def imports(path: Path, known: dict[str, Path]) -> list[tuple[str, int, bool, str]]:
    """``(imported poot module, line, function-local?, comment)`` for every import of a poot
    module in ``path``; relative imports are resolved against the file's package."""
    source = path.read_text()
    lines = source.splitlines()
    tree = ast.parse(source, str(path))
    i = len(path.parts) - 1 - path.parts[::-1].index("poot")
    me = module_name(path, Path(*path.parts[:i + 1]))
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    local_lines: set[int] = set()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    local_lines.add(node.lineno)
    out = []
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[:len(parts) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            targets = [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        comment = " ".join(lines[i] for i in (node.lineno - 2, node.lineno - 1) if i >= 0)
        for t in targets:
            if not (t == "poot" or t.startswith("poot.")):
                continue
            m = _resolve(t, known)
            if m and m != me:
                out.append((m, node.lineno, node.lineno in local_lines, comment))
    return out


def _rel(p: Path) -> str:
    """``p`` relative to the repository root (or to the fake tree's root in the self-test)."""
    i = len(p.parts) - 1 - p.parts[::-1].index("poot")
    return str(Path(*p.parts[i:]))


def graph(known: dict[str, Path]) -> dict[str, set[str]]:
    return {m: {d for d, *_ in imports(p, known)} for m, p in known.items()}


def upward_imports(known: dict[str, Path]) -> list[str]:
    bad = []
    for m, p in known.items():
        for d, line, _, _ in imports(p, known):
            if layer_of(d) > layer_of(m):
                bad.append(f"{_rel(p)}:{line}: {m} (layer {layer_of(m)}) imports "
                           f"{d} (layer {layer_of(d)})")
    return bad


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in sorted(g):
        if root in index:
            continue
        work = [(root, iter(sorted(g[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in g:
                    continue
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(g[w]))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def unexplained_lazy_imports(known: dict[str, Path]) -> list[str]:
    return [f"{_rel(p)}:{line}: function-local import of {d} without a "
            f"'# lazy: <reason>' comment"
            for m, p in known.items()
            for d, line, local, comment in imports(p, known)
            if local and "# lazy:" not in comment]


KNOWN = modules()


def test_every_module_has_a_layer():
    for m in KNOWN:
        layer_of(m)


def test_no_import_runs_up_the_layers():
    bad = upward_imports(KNOWN)
    assert not bad, "imports up the layers (move the code down, or invert the dependency):\n" \
        + "\n".join(bad)


def test_no_import_cycles():
    found = cycles(graph(KNOWN))
    assert not found, "import cycles between modules:\n" + "\n".join(" <-> ".join(c)
                                                                        for c in found)


def test_lazy_imports_say_why():
    bad = unexplained_lazy_imports(KNOWN)
    assert not bad, "\n".join(bad)


def _fake_tree(tmp_path: Path, files: dict[str, str]) -> dict[str, Path]:
    for rel, text in files.items():
        f = tmp_path / "poot" / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    return {module_name(p, tmp_path / "poot"): p for p in (tmp_path / "poot").rglob("*.py")}


def test_the_check_catches_an_upward_import(tmp_path):
    """The checker is not blind: a loader importing the engine, a lazy import with no reason,
    and a two-module cycle are each reported."""
    known = _fake_tree(tmp_path, {
        "__init__.py": "",
        "load/__init__.py": "",
        "load/gguf.py": "def f():\n    from poot.engine.llm_engine import LLMEngine\n",
        "engine/__init__.py": "",
        "engine/llm_engine.py": "from poot.engine import stops\n",
        "engine/stops.py": "import poot.engine.llm_engine\n",
    })
    up = upward_imports(known)
    assert len(up) == 1 and "poot.load.gguf (layer 1) imports poot.engine.llm_engine" in up[0]
    assert cycles(graph(known)) == [["poot.engine.llm_engine", "poot.engine.stops"]]
    lazy = unexplained_lazy_imports(known)
    assert len(lazy) == 1 and "load/gguf.py:2" in lazy[0]


@pytest.mark.parametrize("module", ["poot.compiler.cache", "poot.backends.cpu.codegen",
                                    "poot.engine.llm_engine", "poot.api"])
def test_the_scan_sees_the_known_modules(module):
    assert module in KNOWN
