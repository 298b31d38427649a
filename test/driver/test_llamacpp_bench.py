"""``bench/cpu_vs_llamacpp.py``'s llama.cpp build, shared with
``bench/cpu_batched_vs_llamacpp.py``: a build folder configured with the same sdist and flags is
reused and only the missing program is built (configuring afresh rebuilds every library: many
minutes on 2 cores); other flags configure afresh. cmake is a stand-in script that records
its arguments and makes the target, so nothing is compiled or downloaded here."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def llamacpp(monkeypatch, tmp_path):
    """The module, with cmake a stand-in that appends its argv to ``calls.jsonl``."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location("cpu_vs_llamacpp",
                                                  ROOT / "bench" / "cpu_vs_llamacpp.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    cmake = tmp_path / "cmake"
    cmake.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        f"open({str(tmp_path / 'calls.jsonl')!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
        "a = sys.argv[1:]\n"
        "if '--target' in a:\n"
        "    exe = os.path.join(a[a.index('--build') + 1], 'bin', a[a.index('--target') + 1])\n"
        "    os.makedirs(os.path.dirname(exe), exist_ok=True)\n"
        "    open(exe, 'w').close()\n"
        "else:\n"
        "    b = a[a.index('-B') + 1]\n"
        "    os.makedirs(b, exist_ok=True)\n"
        "    open(os.path.join(b, 'CMakeCache.txt'), 'w').close()\n")
    cmake.chmod(0o755)
    monkeypatch.setattr(mod, "build_tools", lambda: {"cmake": str(cmake), "cc": "cc",
                                                     "c++": "c++", "make": "make"})
    monkeypatch.setattr(mod, "llama_sources", lambda dir_: dir_ / "src")
    return mod


def _configured(mod, dir_: Path, flags) -> None:
    """A build folder as ``llama_tool`` leaves it after building llama-bench with ``flags``."""
    (dir_ / "build" / "bin").mkdir(parents=True)
    (dir_ / "build" / "CMakeCache.txt").write_text("configured")
    (dir_ / "build" / "bin" / "llama-bench").write_text("")
    (dir_ / "build_info.json").write_text(json.dumps(
        {"llama_cpp_python": mod.LLAMA_CPP_PYTHON, "cmake_flags": flags}))


def _calls(tmp_path) -> list[list[str]]:
    log = tmp_path / "calls.jsonl"
    return [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []


def test_configured_folder_builds_only_the_missing_target(llamacpp, tmp_path):
    dir_ = tmp_path / "llamacpp"
    _configured(llamacpp, dir_, llamacpp.CMAKE_FLAGS)
    exe, info = llamacpp.llama_tool(dir_, "llama-batched-bench")
    assert exe == dir_ / "build" / "bin" / "llama-batched-bench" and exe.exists()
    assert info["built_now"] is True
    calls = _calls(tmp_path)
    assert calls == [["--build", str(dir_ / "build"), "--target", "llama-batched-bench", "-j2"]]
    assert (dir_ / "build" / "CMakeCache.txt").read_text() == "configured"   # not wiped
    assert (dir_ / "build" / "bin" / "llama-bench").exists()
    # built: the next call builds nothing, and llama-bench was never rebuilt
    assert llamacpp.llama_tool(dir_, "llama-batched-bench")[1]["built_now"] is False
    assert llamacpp.llama_bench(dir_)[1]["built_now"] is False
    assert len(_calls(tmp_path)) == 1


def test_other_flags_configure_afresh(llamacpp, tmp_path):
    dir_ = tmp_path / "llamacpp"
    _configured(llamacpp, dir_, ["-DGGML_NATIVE=OFF"])
    llamacpp.llama_tool(dir_, "llama-batched-bench")
    calls = _calls(tmp_path)
    assert [c[0] for c in calls] == ["-S", "--build"]
    assert not (dir_ / "build" / "bin" / "llama-bench").exists()      # the old folder went
    info = json.loads((dir_ / "build_info.json").read_text())
    assert info["cmake_flags"] == llamacpp.CMAKE_FLAGS
    assert list(info["targets"]) == ["llama-batched-bench"]


def test_batched_comparison_ratios_and_targets(monkeypatch):
    """poot / llama.cpp per B and for pp512; a target is met only at both its rate and its
    ratio."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location(
        "cpu_batched_vs_llamacpp", ROOT / "bench" / "cpu_batched_vs_llamacpp.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    runs = [{"8": {"decode_tokens_per_s": 500.0}, "32": {"decode_tokens_per_s": 1200.0}},
            {"8": {"decode_tokens_per_s": 700.0}, "32": {"decode_tokens_per_s": 1100.0}}]
    poot = mod.best_of(["poot"], runs)
    assert poot["batches"]["8"]["decode_tokens_per_s"] == 700.0
    assert poot["batches"]["32"]["decode_tokens_per_s_runs"] == [1200.0, 1100.0]
    llama = mod.best_of(["llama"], [{"8": {"decode_tokens_per_s": 200.0},
                                     "32": {"decode_tokens_per_s": 300.0}}])
    ratio = mod.ratios(poot, llama, {"prefill_tokens_per_s": 900.0},
                       {"prefill_tokens_per_s": 300.0})
    assert ratio == {"decode": {"8": 3.5, "32": 4.0}, "prefill": 3.0}
    t = mod.targets(poot, {"prefill_tokens_per_s": 900.0}, ratio)
    assert t["decode_b8"]["met"] is True          # 700 >= 600 and 3.5 >= 3
    assert t["decode_b32"]["met"] is True         # 1200 >= 1000 and 4 >= 3
    assert t["prefill"]["met"] is False           # 900 < 1000
