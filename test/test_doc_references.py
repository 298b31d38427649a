"""Every file path the docs and poot's docstrings and comments name exists in the repository.

Scanned: every ``poot/**/*.py`` (docstrings, comments and strings alike), ``README.md`` and
``docs/*.md``. A path is a token starting with one of :data:`ROOTS` and a ``/``
(``poot/engine/llm_engine.py``, ``docs/serving.md``, ``bench/gpu_run/``), read from the
repository root; a token that is part of a longer path or a URL (``ggml/docs/gguf.md``,
``https://.../docs/x.md``) is not one. Markdown links (``[text](target)``) in the ``.md`` files
are read relative to the file. Patterns (``*``, ``{a,b}``, ``<name>``, ``...``) are skipped.
Old top-level folders (``seeds/``, ``raw/``, ``executor/``, ``dialects/``, ...) are roots too,
so a reference to a layout that is gone fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: first components of repository-relative paths (today's folders, and folders of earlier
#: layouts or of other checkouts, which must not be named as if they were here)
ROOTS = ("poot", "docs", "test", "bench", "scripts", "seeds", "raw", "dialects", "passes",
         "executor", "driver")
#: references to files outside this repository that look like repository paths (none today)
EXTERNAL: set[str] = set()

PATH = re.compile(r"(?<![\w./:-])((?:%s)/[\w./-]*[\w/])" % "|".join(ROOTS))
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")


def _pattern(token: str) -> bool:
    return any(c in token for c in "*{}<>") or "..." in token


def scanned_files() -> list[Path]:
    return (sorted((ROOT / "poot").rglob("*.py")) + [ROOT / "README.md"]
            + sorted((ROOT / "docs").glob("*.md")))


def missing_references(files: list[Path]) -> list[str]:
    """``file:line: path`` for every path named in ``files`` that does not exist."""
    out = []
    for f in files:
        name = f.relative_to(ROOT) if f.is_relative_to(ROOT) else f.name
        for i, line in enumerate(f.read_text().splitlines(), 1):
            for token in PATH.findall(line):
                token = token.rstrip(".")
                if not (_pattern(token) or token in EXTERNAL or (ROOT / token).exists()):
                    out.append(f"{name}:{i}: {token}")
            if f.suffix != ".md":
                continue
            for target in LINK.findall(line):
                if re.match(r"[a-z]+:", target) or _pattern(target):
                    continue
                if not (f.parent / target).exists():
                    out.append(f"{name}:{i}: link {target}")
    return out


def test_every_named_file_exists():
    missing = missing_references(scanned_files())
    assert not missing, "paths named but not in the repository:\n" + "\n".join(missing)


def test_the_scan_sees_a_missing_file(tmp_path):
    """The scan itself: a docstring naming a file that is not here is reported, one that is
    here, a longer path, a URL and a pattern are not."""
    probe = tmp_path / "probe.md"
    probe.write_text("see `docs/no_such_file.md`, `poot/__init__.py`, ggml/docs/gguf.md,\n"
                     "https://example.org/docs/x.md, `test/*/x.py` and [a](../nowhere.md)\n")
    missing = missing_references([probe])
    assert any(m.endswith("docs/no_such_file.md") for m in missing), missing
    assert any(m.endswith("link ../nowhere.md") for m in missing), missing
    assert len(missing) == 2, missing
