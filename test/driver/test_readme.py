"""README.md's examples, run: every ``poot``/``poot-opt`` command of its ``sh`` blocks and its
``python`` blocks, against the tiny fixture, so the README cannot drift from the CLI again
(issue 24: ``poot bench --max-tokens`` was documented while the option was ``--tokens``).

What is substituted is stated in :data:`SUBSTITUTE` (placeholders and the two real-model
paths); a command that loads a model and names none gets ``--model`` of the tiny fixture (with
a chat template, and a 1024-position context so the README's ``--kv-capacity 512`` fits).
Setup commands (venv, pip, the test run itself) are recognized and not run; any other kind of
command fails the test until this file learns it.

A command that needs a GPU this machine lacks must end as one ``poot: error: ...`` line,
status 2, naming what is missing; every other command must succeed.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from chat_fixture import chat_gguf

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"

#: commands a fresh clone's set-up runs (not run here: this test runs inside that set-up)
SETUP = (re.compile(r"^python3? -m venv "), re.compile(r"^\. \.venv/bin/activate$"),
         re.compile(r"^pip install "), re.compile(r"^python3? -m pytest"),
         re.compile(r"^export '?POOT_CACHE_DIR="))

#: commands that load a model, and the options naming one
LOADS = ("generate", "chat", "bench", "compile", "inspect", "tokenize")
NAMES_MODEL = ("--model", "--config", "MODEL")


def blocks(lang: str) -> list[str]:
    """The bodies of README's fenced code blocks in ``lang``."""
    return re.findall(rf"^```{lang}\n(.*?)^```", README.read_text(), re.S | re.M)


def shell_commands() -> list[str]:
    """Each command of the ``sh`` blocks (``&&`` chains split, comments dropped)."""
    out = []
    for body in blocks("sh"):
        for line in body.splitlines():
            words = shlex.split(line, comments=True)
            if not words:
                continue
            cmd: list[str] = []
            for w in words + ["&&"]:
                if w == "&&":
                    if cmd:
                        out.append(shlex.join(cmd))
                    cmd = []
                else:
                    cmd.append(w)
    return out


def test_readme_has_the_commands_it_should():
    cmds = shell_commands()
    assert any(c.startswith("poot generate --chat") for c in cmds), cmds
    assert any(c.startswith("poot bench --max-tokens") for c in cmds), cmds
    assert any(c.startswith("poot chat") for c in cmds), cmds
    assert any(c.startswith("poot-opt ") for c in cmds), cmds
    assert len(blocks("python")) >= 2


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A folder with the model, a config of the tiny shapes with a 1024-position context,
    ``in.mlir``, ``bad.mlir``, ``prompts.jsonl``, ``person.json``, ``sum.lark`` and
    ``caps.json`` (README's names), and a compile cache."""
    d = tmp_path_factory.mktemp("readme")
    model = chat_gguf(d, context=1024)
    cfg = json.loads((ROOT / "test/fixtures/tiny/llama/config.json").read_text())
    cfg["max_position_embeddings"] = 1024
    (d / "tiny-config.json").write_text(json.dumps(cfg))
    (d / "in.mlir").write_text(
        'func.func @f(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {\n'
        '  %0 = "poot.binary"(%a, %b) {fn = "add"} : (tensor<4xf32>, tensor<4xf32>) -> '
        'tensor<4xf32>\n'
        '  %1 = "poot.binary"(%a, %b) {fn = "add"} : (tensor<4xf32>, tensor<4xf32>) -> '
        'tensor<4xf32>\n'
        '  %2 = "poot.binary"(%0, %1) {fn = "mul"} : (tensor<4xf32>, tensor<4xf32>) -> '
        'tensor<4xf32>\n'
        '  return %2 : tensor<4xf32>\n}\n')
    shutil.copy(ROOT / "test/ir/dialect-invalid.mlir", d / "bad.mlir")
    (d / "prompts.jsonl").write_text('Once upon a time\n'
                                     '{"prompt": "The sky is", "max_tokens": 4}\n'
                                     '{"messages": [{"role": "user", "content": "Hi"}], '
                                     '"temperature": 0.7, "seed": 1}\n')
    (d / "person.json").write_text(json.dumps(
        {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                          "age": {"type": "integer", "minimum": 0,
                                                  "maximum": 120}},
         "required": ["name", "age"], "additionalProperties": False}))
    (d / "sum.lark").write_text('start: num " + " num\nnum: /[0-9]{1,3}/\n')
    (d / "caps.json").write_text('{"rocm": {"arch": "gfx1100", "features": ["gfx1100"]}}')
    return d, model


def substitute(cmd: str, d: Path, model: Path) -> list[str]:
    """The command as run here: placeholders filled, optional ``[...]`` parts included, the
    real-model paths replaced by the tiny ones, ``--model`` added where none is named."""
    words = shlex.split(cmd)
    table = {"MODEL": str(model), "TEXT": "hello world",
             "bench/shapes/llama-3-8b.json": str(d / "tiny-config.json")}
    out = []
    for w in words:
        opt = re.fullmatch(r"\[(.*)\]", w) or re.fullmatch(r"\[(.*)", w) or \
            re.fullmatch(r"(.*)\]", w)
        if opt:
            w = opt.group(1)
        out.append(table.get(w, w))
    if len(out) > 1 and out[0] == "poot" and out[1] in LOADS and \
            not any(w in NAMES_MODEL for w in words):
        out += ["--model", str(model)]
    return out


def _cuda_missing() -> str | None:
    try:
        from cuda.bindings import driver  # noqa: F401
    except ImportError:
        return "cuda-python"
    from poot.backends.cuda.runtime import nvidia_driver

    return None if nvidia_driver() else "NVIDIA driver"


def _rocm_tools_missing() -> str | None:
    """"ld.lld" when ROCm code objects cannot be linked here (a system package, not a pip
    one: a fresh machine lacks it, and the README's command must then refuse in one line)."""
    from poot.backends.rocm.codegen import tools_missing

    why = tools_missing()
    return None if why is None else ("ld.lld" if "ld.lld" in why else "llvmlite")


#: what ``poot chat`` reads in this test: one turn, then the command that ends it
CHAT_INPUT = "hello\n/exit\n"


def _run(argv: list[str], d: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "POOT_CACHE_DIR": str(d / "cache"), "PYTHONPATH": str(ROOT)}
    chat = len(argv) > 1 and argv[1] == "chat"
    return subprocess.run(argv, capture_output=True, text=True, cwd=d, env=env, timeout=900,
                          input=CHAT_INPUT if chat else "")


def _commands():
    out = []
    for cmd in shell_commands():
        if any(p.search(cmd) for p in SETUP):
            continue
        out.append(cmd)
    return out


@pytest.mark.parametrize("cmd", _commands())
def test_readme_command_runs(cmd, workdir):
    d, model = workdir
    argv = substitute(cmd, d, model)
    assert argv[0] in ("poot", "poot-opt"), f"README command this test does not know: {cmd}"
    exe = shutil.which(argv[0])
    assert exe, f"{argv[0]} is not on PATH (pip install -e .)"
    r = _run([exe] + argv[1:], d)
    assert "Traceback" not in r.stderr, r.stderr
    backend = argv[argv.index("--backend") + 1] if "--backend" in argv else "cpu"
    missing = _cuda_missing() if backend == "cuda" and argv[1] != "compile" else \
        _rocm_tools_missing() if backend == "rocm" else None
    if missing:
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.returncode == 2 and lines[-1].startswith("poot: error: "), r.stderr
        assert missing in lines[-1], lines[-1]
        return
    assert r.returncode == 0, f"{shlex.join(argv)}\n{r.stderr[-3000:]}"
    if argv[:2] == ["poot", "generate"] and "--json" in argv:
        json.loads(r.stdout)
    if argv[:2] == ["poot", "bench"]:
        b = json.loads(r.stdout)
        if "--batch" in argv:
            assert all(x["generated_tokens"] > 0
                       for x in b["throughput"]["batches"].values()), b
        elif "--shared-prefix" in argv:
            assert b["prefix_cache"]["hit_rate"] > 0, b
        else:
            assert b["generated_tokens"] > 0, b
    if "--prompts-file" in argv:
        assert [json.loads(x)["index"] for x in r.stdout.splitlines()], r.stdout
    if argv[:2] == ["poot", "chat"]:
        assert "generated tokens" in r.stderr and r.stdout.strip(), r.stderr


@pytest.mark.parametrize("index", range(len(blocks("python"))))
def test_readme_python_block_runs(index, workdir):
    d, model = workdir
    code = blocks("python")[index].replace("ModelHandle.load()",
                                           f"ModelHandle.load({str(model)!r})")
    code = code.replace("poot.LLM(", f"poot.LLM({str(model)!r}, ")
    r = _run([sys.executable, "-c", code], d)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip()
