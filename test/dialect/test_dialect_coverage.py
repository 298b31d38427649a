"""Every registered op (and every quant format and enum value) has lit tests.

Parses test/ir/dialect-roundtrip.mlir and test/ir/dialect-invalid.mlir and compares them with
:data:`poot.dialects.opdef.REGISTRY`, so adding an op, a format or an enum value without tests
fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from poot.dialects.opdef import REGISTRY
from poot.dialects.quant import FORMATS

IR = Path(__file__).resolve().parents[1] / "ir"
ROUNDTRIP = IR / "dialect-roundtrip.mlir"
INVALID = IR / "dialect-invalid.mlir"

_OP = re.compile(r'"poot\.(\w+)"\(')
_EXPECT = re.compile(r"//\s*expected-error\s*(@[+-]\d+)?\s*\{\{(.*?)\}\}")


def _code_lines(path: Path) -> list[str]:
    """Lines of IR (comments and CHECK lines removed)."""
    return [ln.split("//", 1)[0] for ln in path.read_text().splitlines()]


def _run_lines(path: Path) -> list[str]:
    return [ln for ln in path.read_text().splitlines() if ln.startswith("// RUN:")]


def _chunks(path: Path) -> list[str]:
    return re.split(r"^// -----.*$", path.read_text(), flags=re.M)


def roundtrip_ops() -> set[str]:
    return {m.group(1) for ln in _code_lines(ROUNDTRIP) for m in _OP.finditer(ln)}


def invalid_cases() -> list[tuple[str, str]]:
    """(op mnemonic, expected message) for every expected-error in the invalid file: the op
    is the one on the line the expectation points at."""
    lines = INVALID.read_text().splitlines()
    out = []
    for i, ln in enumerate(lines):
        for m in _EXPECT.finditer(ln):
            target = i + int(m.group(1)[1:]) if m.group(1) else i
            op = _OP.search(lines[target])
            assert op, f"{INVALID.name}:{i + 1}: expectation does not point at a poot op"
            out.append((op.group(1), m.group(2)))
    return out


def test_registry_is_populated():
    assert len(REGISTRY) >= 20
    assert {"param", "packed_param", "constant", "iota", "unary", "binary", "ternary",
            "compare", "select", "cast", "reduce", "broadcast", "reshape", "transpose", "slice",
            "concat", "matmul", "gather", "scatter", "dequantize"} <= set(REGISTRY)


def test_lit_files_have_run_lines():
    assert any("--split-input-file" in r and "FileCheck" in r for r in _run_lines(ROUNDTRIP))
    assert any("--verify-diagnostics" in r for r in _run_lines(INVALID))


@pytest.mark.parametrize("op", sorted(REGISTRY))
def test_op_has_roundtrip_case(op):
    assert op in roundtrip_ops(), f"poot.{op} has no case in {ROUNDTRIP.name}"
    # ...and a CHECK line pinning its printed form.
    assert re.search(rf'^// CHECK.*"poot\.{op}"\(', ROUNDTRIP.read_text(), re.M), \
        f"poot.{op} has no CHECK line in {ROUNDTRIP.name}"


@pytest.mark.parametrize("op", sorted(REGISTRY))
def test_op_has_invalid_case(op):
    cases = [msg for o, msg in invalid_cases() if o == op]
    assert cases, f"poot.{op} has no expected-error case in {INVALID.name}"
    # At least one of them is a rule violation reported with the op's name.
    assert any(msg.startswith(f"'poot.{op}' op ") for msg in cases), \
        f"no diagnostic for poot.{op} in {INVALID.name} names the op"


def test_roundtrip_names_no_unknown_op():
    assert roundtrip_ops() <= set(REGISTRY)


def test_invalid_cases_one_error_per_chunk():
    # --verify-diagnostics rejects unexpected errors, so one expectation per chunk keeps each
    # case about one rule.
    for k, chunk in enumerate(_chunks(INVALID)):
        n = len(_EXPECT.findall(chunk))
        assert n <= 1, f"chunk {k} of {INVALID.name} has {n} expectations"
    assert len(invalid_cases()) == len(_chunks(INVALID))


@pytest.mark.parametrize("fmt", [f.name for f in FORMATS])
def test_every_quant_format_round_trips(fmt):
    text = "\n".join(_code_lines(ROUNDTRIP))
    assert re.search(rf'"poot\.packed_param"\(\).*!poot\.packed<#poot\.{fmt}, array<i64:', text)
    assert re.search(rf'"poot\.dequantize"\(%\w+\) : \(!poot\.packed<#poot\.{fmt},', text)


def _enum_values():
    for op, d in sorted(REGISTRY.items()):
        for key, spec in d.attrs.items():
            if spec.kind == "enum":
                for choice in spec.choices:
                    yield op, key, choice


@pytest.mark.parametrize("op,key,choice", list(_enum_values()))
def test_every_enum_value_round_trips(op, key, choice):
    text = "\n".join(_code_lines(ROUNDTRIP))
    pat = rf'"poot\.{op}"\([^)]*\) \{{[^}}]*\b{key} = "{choice}"'
    assert re.search(pat, text), f"poot.{op} {key}={choice!r} has no round-trip case"


@pytest.mark.parametrize("op,key", [(op, key) for op, d in sorted(REGISTRY.items())
                                    for key, spec in d.attrs.items() if spec.kind == "enum"])
def test_every_enum_attribute_has_bad_value_case(op, key):
    assert any(o == op and f"attribute '{key}' = " in msg and "is not one of" in msg
               for o, msg in invalid_cases()), f"poot.{op} has no bad-{key} case"


@pytest.mark.parametrize("op,key", [(op, key) for op, d in sorted(REGISTRY.items())
                                    for key in d.attrs])
def test_every_attribute_has_missing_case(op, key):
    want = f"'poot.{op}' op attribute \"{key}\" is expected but not provided"
    assert any(o == op and msg == want for o, msg in invalid_cases()), \
        f"poot.{op} has no case with attribute '{key}' missing"
