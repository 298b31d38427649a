"""Every ``POOT_*`` environment setting is declared once (:mod:`poot.settings`) and listed in
the README, and the readers refuse a bad value by the variable's name.

The names are read from the repository's source (``poot/``, ``bench/``, ``scripts/``,
``test/``: Python and shell files; the top-level ``*.py`` and ``.ci/``), not from the table:
a variable someone reads without declaring it, or declares after nobody reads it, fails here.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

from poot import settings
from poot.settings import SETTINGS, InvalidSetting

ROOT = Path(__file__).resolve().parents[1]
NAME = re.compile(r"\bPOOT_[A-Z0-9_]*[A-Z0-9]\b")
#: a direct read of a POOT_* variable (``os.environ.get("POOT_...")``, ``os.getenv``,
#: ``os.environ["POOT_..."]`` not followed by ``=``), which must go through poot.settings
DIRECT_READ = re.compile(r"""(environ\.get|getenv)\(\s*["']POOT_"""
                         r"""|environ\[\s*["']POOT_[A-Z0-9_]+["']\s*\](?!\s*=[^=])""")
#: this file names made-up variables; settings.py is the table itself
SKIP = {Path(__file__).resolve(), (ROOT / "poot" / "settings.py").resolve()}


def _sources():
    """Python and shell files of the code folders, the top level (``lit.cfg.py``) and CI."""
    files = [p for folder in ("poot", "bench", "scripts", "test")
             for p in sorted((ROOT / folder).rglob("*")) if p.suffix in (".py", ".sh")]
    files += sorted(ROOT.glob("*.py")) + sorted((ROOT / ".ci").glob("*"))
    return [p for p in files if p.is_file() and p.resolve() not in SKIP]


def used_names() -> dict[str, str]:
    """Every POOT_* name in the source, with one file that names it."""
    out: dict[str, str] = {}
    for p in _sources():
        for name in NAME.findall(p.read_text(errors="replace")):
            out.setdefault(name, str(p.relative_to(ROOT)))
    return out


def readme_table() -> str:
    text = (ROOT / "README.md").read_text()
    m = re.search(r"<!-- settings table.*?-->\n(.*?)\n<!-- end settings table -->", text, re.S)
    assert m, "README.md has no settings table (between the '<!-- settings table' markers)"
    return m.group(1)


def test_every_name_in_the_source_is_declared():
    undeclared = {n: f for n, f in used_names().items() if n not in SETTINGS}
    assert not undeclared, f"POOT_* names read but not in poot.settings.SETTINGS: {undeclared}"


def test_every_declared_name_is_used():
    unused = sorted(set(SETTINGS) - set(used_names()))
    assert not unused, f"declared in poot.settings but named nowhere in the source: {unused}"


def test_readme_lists_exactly_the_declared_settings():
    table = readme_table()
    listed = set(re.findall(r"^\| `(POOT_[A-Z0-9_]+)`", table, re.M))
    assert listed == set(SETTINGS), (f"missing from README: {sorted(set(SETTINGS) - listed)}; "
                                     f"not declared: {sorted(listed - set(SETTINGS))}")
    assert table == settings.markdown_table(), \
        "README's settings table is stale: paste `python -m poot.settings` between the markers"


def _standalone(path: Path) -> bool:
    """A module whose top level imports nothing of poot, so that it loads as a plain file
    where poot is not installed (the CUDA device side, carried to a GPU machine): it reads
    the environment itself (its names are still declared: the test above)."""
    tree = ast.parse(path.read_text())
    return not any(
        (isinstance(n, ast.ImportFrom) and (n.level or (n.module or "").startswith("poot")))
        or (isinstance(n, ast.Import) and any(a.name.startswith("poot") for a in n.names))
        for n in tree.body)


def test_poot_reads_settings_only_through_poot_settings():
    direct = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
              for p in sorted((ROOT / "poot").rglob("*.py"))
              if p.resolve() not in SKIP and not _standalone(p)
              for i, line in enumerate(p.read_text().splitlines(), 1) if DIRECT_READ.search(line)]
    assert not direct, "read these through poot.settings:\n" + "\n".join(direct)


def test_settings_is_layer_zero():
    tree = ast.parse((ROOT / "poot" / "settings.py").read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    outside = {m for m in imported if m.split(".")[0] not in sys.stdlib_module_names
               and m != "poot.errors"}
    assert not outside, f"poot.settings may import the stdlib and poot.errors only: {outside}"


def test_every_setting_is_described():
    for s in SETTINGS.values():
        assert s.type in ("int", "float", "flag", "choice", "path", "str"), s
        assert s.meaning and s.reader, s
        assert (s.type == "choice") == bool(s.choices), s
        assert s.default is None or s.type != "choice" or s.default in s.choices, s


@pytest.mark.parametrize("reader,name,bad", [
    (settings.get_int, "POOT_COMPILE_WORKERS", "two"),
    (settings.get_float, "POOT_CACHE_LOCK_TIMEOUT", "soon"),
    (settings.get_float, "POOT_CACHE_LOCK_TIMEOUT", "nan"),
    (settings.get_flag, "POOT_CUDA_PDL", "maybe"),
    (settings.get_choice, "POOT_MOE", "sometimes"),
])
def test_a_bad_value_is_a_typed_error_naming_the_variable(monkeypatch, reader, name, bad):
    monkeypatch.setenv(name, bad)
    with pytest.raises(InvalidSetting, match=name) as e:
        reader(name)
    assert e.value.name == name and e.value.value == bad


def test_minimum_and_positive_are_checked(monkeypatch):
    monkeypatch.setenv("POOT_COMPILE_WORKERS", "-1")
    with pytest.raises(InvalidSetting, match=">= 0"):
        settings.get_int("POOT_COMPILE_WORKERS", minimum=0)
    monkeypatch.setenv("POOT_ROCM_TIMEOUT_S", "0")
    with pytest.raises(InvalidSetting, match="positive"):
        settings.get_float("POOT_ROCM_TIMEOUT_S", positive=True)


def test_values_and_defaults(monkeypatch):
    for name in ("POOT_COMPILE_WORKERS", "POOT_CUDA_PDL", "POOT_PIPELINE", "POOT_MOE",
                 "POOT_CACHE_LOCK_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)
    assert settings.get_int("POOT_COMPILE_WORKERS") is None       # computed by its reader
    assert settings.get_flag("POOT_CUDA_PDL") is True
    assert settings.get_flag("POOT_PIPELINE") is None             # decided by the device
    assert settings.get_choice("POOT_MOE") == "auto"
    assert settings.get_float("POOT_CACHE_LOCK_TIMEOUT") == 900.0
    monkeypatch.setenv("POOT_COMPILE_WORKERS", " 3 ")
    assert settings.get_int("POOT_COMPILE_WORKERS", minimum=0) == 3
    monkeypatch.setenv("POOT_CUDA_PDL", "off")
    assert settings.get_flag("POOT_CUDA_PDL") is False
    monkeypatch.setenv("POOT_PIPELINE", "1")
    assert settings.get_flag("POOT_PIPELINE") is True
    monkeypatch.setenv("POOT_MOE", "  ")                         # blank reads as unset
    assert settings.get_choice("POOT_MOE") == "auto"


def test_an_undeclared_name_is_a_bug_not_a_silent_default():
    with pytest.raises(KeyError, match="POOT_NOT_A_SETTING"):
        settings.get_str("POOT_NOT_A_SETTING")


def test_defaults_agree_with_their_readers(monkeypatch):
    """A default the reading module also names is the same number in both places."""
    from poot.compiler import cache_lock

    monkeypatch.delenv("POOT_CACHE_LOCK_TIMEOUT", raising=False)
    assert settings.get_float("POOT_CACHE_LOCK_TIMEOUT") == cache_lock.DEFAULT_TIMEOUT_S
    assert cache_lock.lock_timeout_s() == cache_lock.DEFAULT_TIMEOUT_S
