"""poot-opt as a process: exit statuses, diagnostics, mixed poot/upstream pipelines, and the
help/IRDL listings against the live registries."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from mlir import ir

from poot.dialects import make_context
from poot.dialects.opdef import REGISTRY
from poot.dialects.quant import ALL_FORMATS
from poot.dialects.verify import verify_module
from poot.passes.registry import load_all_passes

IR = Path(__file__).resolve().parents[1] / "ir"
INVALID_MATMUL = IR / "Inputs" / "invalid-matmul.mlir"


def _poot_opt() -> list[str]:
    scripts = sysconfig.get_path("scripts")
    exe = shutil.which("poot-opt", path=os.pathsep.join([scripts, os.environ.get("PATH", "")]))
    return [exe] if exe else [sys.executable, "-m", "poot.opt"]


def poot_opt(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*_poot_opt(), *map(str, args)], input=stdin, capture_output=True,
                          text=True, timeout=60)


GOOD = """\
func.func @f(%a: tensor<4x8xf32>, %w: tensor<8x2xf32>) -> tensor<4x2xf32> {
  %0 = "poot.matmul"(%a, %w) {acc = f32} : (tensor<4x8xf32>, tensor<8x2xf32>) -> tensor<4x2xf32>
  %1 = "poot.unary"(%0) {fn = "tanh"} : (tensor<4x2xf32>) -> tensor<4x2xf32>
  %2 = "poot.constant"() {value = dense<1.0> : tensor<4x2xf32>} : () -> tensor<4x2xf32>
  %3 = "poot.binary"(%1, %2) {fn = "add"} : (tensor<4x2xf32>, tensor<4x2xf32>) -> tensor<4x2xf32>
  return %3 : tensor<4x2xf32>
}
"""


def test_invalid_file_exits_1_with_diagnostic():
    r = poot_opt(INVALID_MATMUL)
    assert r.returncode == 1
    assert r.stdout == ""
    assert re.search(r"invalid-matmul\.mlir:4:8: error: 'poot\.matmul' op operand dtypes differ: "
                     r"f16 and f32", r.stderr), r.stderr
    assert "Traceback" not in r.stderr


def test_invalid_stdin_names_stdin():
    r = poot_opt("-", stdin=INVALID_MATMUL.read_text())
    assert r.returncode == 1 and "<stdin>:4:8: error: 'poot.matmul' op" in r.stderr


@pytest.mark.parametrize("via_file", [False, True])
def test_input_not_utf8_is_one_line_error(tmp_path, via_file):
    bad = b"\xff\xfe"
    if via_file:
        (tmp_path / "bad.mlir").write_bytes(bad)
        r = subprocess.run([*_poot_opt(), str(tmp_path / "bad.mlir")], capture_output=True,
                           timeout=60)
    else:
        r = subprocess.run(_poot_opt(), input=bad, capture_output=True, timeout=60)
    err = r.stderr.decode()
    assert r.returncode == 2 and "Traceback" not in err, err
    assert err.strip().count("\n") == 0 and "input is not valid UTF-8 at byte 0" in err, err


def test_verify_diagnostics_statuses(tmp_path):
    ok = tmp_path / "ok.mlir"
    ok.write_text(INVALID_MATMUL.read_text().replace(
        "  // The error is on the next line, column 8.",
        "  // expected-error @+1 {{'poot.matmul' op operand dtypes differ}}"))
    assert poot_opt(ok, "--verify-diagnostics").returncode == 0
    wrong = tmp_path / "wrong.mlir"
    wrong.write_text(ok.read_text().replace("operand dtypes differ", "rank mismatch"))
    r = poot_opt(wrong, "--verify-diagnostics")
    assert r.returncode == 1
    assert 'expected error "\'poot.matmul\' op rank mismatch" was not produced' in r.stderr
    assert "(unexpected error)" in r.stderr
    missing = tmp_path / "missing.mlir"
    missing.write_text("// expected-error @+1 {{anything}}\n" + GOOD)
    assert poot_opt(missing, "--verify-diagnostics").returncode == 1


@pytest.mark.parametrize("pipeline", [
    "builtin.module(poot-verify,canonicalize,cse)",
    "builtin.module(func.func(canonicalize),poot-verify,cse,poot-verify)",
])
def test_mixed_pipeline(tmp_path, pipeline):
    src = tmp_path / "good.mlir"
    src.write_text(GOOD)
    r = poot_opt(src, f"--pass-pipeline={pipeline}")
    assert r.returncode == 0, r.stderr
    with make_context():
        m = ir.Module.parse(r.stdout)
        assert verify_module(m) == []
        names = [op.operation.name for op in m.body.operations[0].regions[0].blocks[0].operations]
    assert names.count("poot.matmul") == 1 and names[-1] == "func.return"


def test_poot_verify_flag_and_output_file(tmp_path):
    src = tmp_path / "good.mlir"
    src.write_text(GOOD)
    out = tmp_path / "out.mlir"
    r = poot_opt(src, "--poot-verify", "-o", out)
    assert r.returncode == 0 and r.stdout == ""
    assert '"poot.matmul"' in out.read_text()


@pytest.mark.parametrize("args,message", [
    (["--pass-pipeline=builtin.module(poot-no-such-pass)"], "unknown poot pass 'poot-no-such-pass'"),
    (["--pass-pipeline=builtin.module(no-such-pass)"], "bad upstream pipeline 'no-such-pass'"),
    (["--pass-pipeline=builtin.module(poot-verify{x=1})"], "pass 'poot-verify' has no option 'x'"),
    (["--poot-no-such-pass"], "unrecognized arguments: --poot-no-such-pass"),
])
def test_pipeline_errors_are_clean(tmp_path, args, message):
    src = tmp_path / "good.mlir"
    src.write_text(GOOD)
    r = poot_opt(src, *args)
    assert r.returncode == 2
    assert message in r.stderr and "Traceback" not in r.stderr


def test_help_lists_every_registered_pass():
    r = poot_opt("--help")
    assert r.returncode == 0
    passes = load_all_passes()
    assert "poot-verify" in passes
    for name, info in passes.items():
        assert name.startswith("poot-")
        assert re.search(rf"--{re.escape(name)}\s+{re.escape(info.summary)}", r.stdout), name


def test_print_irdl_defines_every_op_and_format():
    r = poot_opt("--print-irdl")
    assert r.returncode == 0
    defined = set(re.findall(r"irdl\.operation @(\w+) \{", r.stdout))
    assert defined == set(REGISTRY)
    assert set(re.findall(r"irdl\.attribute @(\w+) \{", r.stdout)) == {f.name for f in ALL_FORMATS}
    assert "irdl.type @packed" in r.stdout


def test_roundtrip_file_is_a_fixed_point():
    """poot-opt output re-parses to the same text (the printed form is stable)."""
    once = poot_opt(IR / "dialect-roundtrip.mlir", "--split-input-file")
    assert once.returncode == 0, once.stderr
    twice = poot_opt("-", "--split-input-file", stdin=once.stdout)
    assert twice.returncode == 0 and twice.stdout == once.stdout


_DUP_IR = """\
func.func @f(%a: tensor<4xf32>) -> tensor<4xf32> {
  %0 = "poot.binary"(%a, %a) {fn = "add"} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %1 = "poot.binary"(%a, %a) {fn = "add"} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %2 = "poot.binary"(%0, %1) {fn = "mul"} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %3 = "poot.unary"(%a) {fn = "exp"} : (tensor<4xf32>) -> tensor<4xf32>
  %4 = "poot.binary"(%a, %a) {fn = "sub"} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %5 = "poot.unary"(%4) {fn = "exp"} : (tensor<4xf32>) -> tensor<4xf32>
  return %2 : tensor<4xf32>
}
"""


def test_poot_cse_dce_merge_identical_and_erase_dead_ops(tmp_path):
    src = tmp_path / "dup.mlir"
    src.write_text(_DUP_IR)
    r = poot_opt(src, "--pass-pipeline=builtin.module(poot-cse,poot-dce)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count('fn = "add"') == 1, "poot-cse kept both identical adds"
    assert '"poot.unary"' not in r.stdout, "dead unary survived poot-dce"
    assert 'fn = "sub"' not in r.stdout, "op whose only user was dead survived poot-dce"
    # the surviving mul uses the one add for both operands
    mul = next(ln for ln in r.stdout.splitlines() if 'fn = "mul"' in ln)
    add = next(ln for ln in r.stdout.splitlines() if 'fn = "add"' in ln)
    add_name = add.split("=")[0].strip()
    assert f"({add_name}, {add_name})" in mul
    again = poot_opt("-", stdin=r.stdout)
    assert again.returncode == 0, again.stderr


def test_upstream_cse_leaves_poot_ops_alone(tmp_path):
    # IRDL-defined ops carry no Pure trait / memory effects, so upstream cse and canonicalize
    # must treat every poot op as side-effecting: nothing merged, nothing erased. This is why
    # the pipeline uses poot-cse / poot-dce.
    src = tmp_path / "dup.mlir"
    src.write_text(_DUP_IR)
    r = poot_opt(src, "--pass-pipeline=builtin.module(canonicalize,cse)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count('fn = "add"') == 2
    assert r.stdout.count('"poot.unary"') == 2
    assert 'fn = "sub"' in r.stdout
