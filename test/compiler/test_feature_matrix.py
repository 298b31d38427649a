"""``poot matrix`` (:mod:`poot.matrix`): the README's feature matrix is what compiling gives
now, and the pieces it is made of behave.

The README check compiles every cell (13 families x 8 formats x every registered backend,
compile-only, about 0.5 s a cell on 2 cores, in a process of its own) and fails when the
committed table differs (exit status 1 when a cell is an ERROR, not a refusal): a
change that makes a cell compile or refuse must update the README (``poot matrix --readme
README.md``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from poot.dialects.quant import Quant
from poot.dialects.types import DType, PackedType, TensorType

ROOT = Path(__file__).resolve().parents[2]


def test_readme_table_is_current(tmp_path):
    """Run as ``poot matrix`` in its own process (520 compiles hold about 2 GB of MLIR
    contexts until the process ends), then compared with the README's block."""
    import subprocess
    import sys

    from poot.backends.rocm.codegen import tools_missing
    from poot.cli.matrix_cmd import BEGIN, END
    from poot.matrix import from_json, markdown

    why = tools_missing()
    if why:
        pytest.skip(f"the README's table has ROCm cells, which compile to code objects only "
                    f"where ld.lld is installed (a system package): {why}")

    text = (ROOT / "README.md").read_text()
    assert BEGIN in text and END in text, "README.md has no feature-matrix block"
    committed = text[text.index(BEGIN) + len(BEGIN):text.index(END)].strip()
    out = tmp_path / "cells.json"
    r = subprocess.run([sys.executable, "-m", "poot.cli", "matrix", "--quiet", "--json",
                        str(out)], capture_output=True, text=True, cwd=ROOT, timeout=3000)
    cells = from_json(out.read_text()) if out.exists() else []
    assert r.returncode == 0 and cells, (r.returncode, r.stderr[-3000:])
    assert markdown(cells).strip() == committed, \
        "README.md's feature matrix is stale: run `poot matrix --readme README.md`"


def test_weight_types_store_every_matrix_in_the_format():
    from poot.matrix import weight_types

    base = {"w": TensorType((8, 64), DType.F32), "norm": TensorType((64,), DType.F32),
            "pk": PackedType(Quant.Q8_0.value, (4, 32))}
    half = weight_types(base, "bf16")
    assert half["w"] == TensorType((8, 64), DType.BF16)
    assert half["norm"] == base["norm"] and half["pk"] == base["pk"]
    packed = weight_types(base, "q4_1")
    assert packed["w"] == PackedType(Quant.Q4_1.value, (8, 64))
    assert packed["norm"] == base["norm"]


def test_a_cell_reports_a_typed_refusal_with_its_reason():
    """k-quants pack rows in 256-element super-blocks: the tiny llama's 64-wide rows are
    refused by name, not compiled and not crashed."""
    from poot.matrix import family_fixtures, feature_matrix, fixtures_root

    assert "llama" in family_fixtures(fixtures_root())
    (cell,) = feature_matrix(fixtures_root(), ["llama"], ["q4_k"], ["cpu"])
    assert cell.status == "refused"
    assert "q4_k" in cell.detail and "256" in cell.detail


def test_unknown_names_are_refused_by_name():
    from poot.matrix import MatrixError, feature_matrix, fixtures_root

    with pytest.raises(MatrixError, match="unknown family nope"):
        feature_matrix(fixtures_root(), ["nope"])
    with pytest.raises(MatrixError, match="unknown backend metal"):
        feature_matrix(fixtures_root(), ["llama"], ["f32"], ["metal"])


def test_markdown_summarises_each_row_and_lists_reasons_once():
    from poot.matrix import Cell, markdown

    cells = [Cell("fam", "fx", "f32", b, "ok") for b in ("cpu", "cuda", "vulkan")]
    cells += [Cell("fam", "fx", "q4_k", "cpu", "refused", "rows of 64"),
              Cell("fam", "fx", "q4_k", "cuda", "refused", "rows of 64"),
              Cell("fam", "fx", "q4_k", "vulkan", "ok"),
              Cell("fam", "fx", "q8_0", "cpu", "ok"), Cell("fam", "fx", "q8_0", "cuda", "ok"),
              Cell("fam", "fx", "q8_0", "vulkan", "error", "KeyError: x")]
    md = markdown(cells)
    assert "| fam (fx) | all | vulkan | all but vulkan (ERROR: vulkan) |" in md
    assert md.count("refused: rows of 64") == 1
    assert "fam/q4_k/cpu, fam/q4_k/cuda" in md


def test_cli_rewrites_only_the_marked_block(tmp_path):
    from poot.cli.matrix_cmd import BEGIN, END, replace_block
    from poot.matrix import MatrixError

    text = f"intro\n{BEGIN}\nold table\n{END}\noutro\n"
    out = replace_block(text, "new table\n", "R.md")
    assert out == f"intro\n{BEGIN}\nnew table\n{END}\noutro\n"
    with pytest.raises(MatrixError, match="R.md has no"):
        replace_block("no markers", "t\n", "R.md")


def test_cli_exits_1_when_a_cell_is_an_error(monkeypatch, capsys):
    """An exception that is not a poot error is a bug: it shows as ERROR and fails the
    command (the typed refusals do not)."""
    import poot.matrix as m
    from poot.cli import main

    monkeypatch.setattr(m, "compile_cell", lambda *a: ("error", "ZeroDivisionError: boom"))
    assert main(["matrix", "--family", "llama", "--format", "f32", "--backend", "cpu",
                 "--quiet"]) == 1
    assert "ERROR: cpu" in capsys.readouterr().out
