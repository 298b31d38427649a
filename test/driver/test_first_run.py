"""What a new user hit on a first run (issue 24), each reproduced: README spellings, checks that
must come before any compile, device probes without tracebacks, truthful progress, the OpenMP
warning, ``--version``, natural tensor order, ``poot chat``.

CLI cases run in a fresh interpreter (:func:`test_cli_errors.poot`); a prelude may stand in
for the compiler (:data:`NO_COMPILE`: reaching a compile is the failure being tested).
"""

from __future__ import annotations

import io
import json
import os
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from chat_fixture import chat_gguf
from test_cli_errors import GGUF, LLAMA, poot, user_error

#: A prelude: any step compile (or cache lookup) ends the process with status 99.
NO_COMPILE = ("import poot.compiler.cache as _c, os as _os\n"
              "def _no(*a, **k):\n"
              "    print('poot-test: reached a compile', flush=True); _os._exit(99)\n"
              "_c.CompileCache.compile_step = _no\n_c.CompileCache.compile = _no\n")


# ends the process if a compile-cache lookup misses (a hit loads as usual)
NO_CACHE_MISS = ("import poot.compiler.cache as _c, os as _os\n"
                 "def _no(*a, **k):\n"
                 "    print('poot-test: reached a compile', flush=True); _os._exit(99)\n"
                 "_c.CompileCache.compile = _no\n")


@pytest.fixture
def cache_env(tmp_path):
    return {**os.environ, "POOT_CACHE_DIR": str(tmp_path / "cache")}


# --- item 1: poot bench --max-tokens, as the README spells it ----------------------------------

@pytest.mark.parametrize("spelling", ["--max-tokens", "--tokens"])
def test_bench_takes_max_tokens(spelling):
    from poot.cli import build_parser

    args = build_parser().parse_args(["bench", spelling, "5"])
    assert args.max_tokens == 5


# --- item 2: --stop "\n\n" means two newlines ----------------------------------------------------

def test_unescape():
    from poot.cli.generate_cmd import unescape

    assert unescape(r"\n\n") == "\n\n"
    assert unescape(r"a\tb\\n") == "a\tb\\n"            # \\ is one backslash, then n
    assert unescape(r"\x41\u00e9\U0001F600") == "A\u00e9\U0001F600"
    assert unescape(r"C:\path") == r"C:\path"            # unknown escapes stay as typed
    assert unescape("plain") == "plain"


def test_cli_stop_escapes_reach_the_request():
    """What ``--stop "\\n\\n"`` (a backslash and an n, twice, from the shell) becomes."""
    prelude = ("import poot.cli.generate_cmd as _g\n"
               "class _H:\n"
               "    def check_request(self, prompt, params):\n"
               "        print(repr(list(params.stop))); raise SystemExit(0)\n"
               "_g.load_handle = lambda args, before_compile=None, **kw: before_compile(_H())\n")
    rc, out, err = poot("generate", "--prompt", "hi", "--stop", r"\n\n", "--stop", "END",
                        prelude=prelude)
    assert rc == 0, err
    assert out.strip() == repr(["\n\n", "END"])


# --- item 4: a GPU backend whose driver is missing is one line, no traceback -------------------

FAKE_CUDA_PYTHON = (
    "import types as _t\n"
    "_cuda = _t.ModuleType('cuda'); _b = _t.ModuleType('cuda.bindings')\n"
    "_d = _t.ModuleType('cuda.bindings.driver')\n"
    "def _cuInit(flags):\n"
    "    raise RuntimeError('cuda-python reached the driver')\n"
    "_d.cuInit = _cuInit; _b.driver = _d; _cuda.bindings = _b\n"
    "sys.modules.update({'cuda': _cuda, 'cuda.bindings': _b, 'cuda.bindings.driver': _d})\n")


def _libcuda_here() -> bool:
    from poot.backends.cuda.runtime import nvidia_driver

    return nvidia_driver() is not None


@pytest.mark.parametrize("cmd", ["generate", "bench"])
def test_cuda_without_nvidia_driver(cmd, cache_env):
    """cuda-python installed (a stand-in here), no NVIDIA driver: used to be a 44-line
    ``DynamicLibNotFoundError`` traceback from inside cuInit."""
    if _libcuda_here():
        pytest.skip("an NVIDIA driver (libcuda.so.1) is installed here")
    extra = ["--prompt", "hi"] if cmd == "generate" else []
    rc, _, err = poot(cmd, "--model", LLAMA, "--backend", "cuda", *extra,
                      prelude=FAKE_CUDA_PYTHON + NO_COMPILE, env=cache_env)
    user_error(rc, err, "NVIDIA driver", "libcuda.so.1")


def test_cuda_device_errors_of_any_kind_are_device_errors(monkeypatch):
    import poot.backends.cuda.runtime as rt
    import poot.runtime as ex

    class Boom(Exception):
        pass

    def device(ordinal=0):
        raise Boom("the driver library could not be loaded\nsecond line")

    monkeypatch.setitem(sys.modules, "cuda", __import__("types").ModuleType("cuda"))
    fake = __import__("types").ModuleType("cuda.bindings")
    fake.driver = object()
    monkeypatch.setitem(sys.modules, "cuda.bindings", fake)
    monkeypatch.setattr(rt, "nvidia_driver", lambda: "libcuda.so.1")
    monkeypatch.setattr(rt, "CudaDevice", device)
    monkeypatch.delitem(ex._OPEN, "cuda", raising=False)
    with pytest.raises(ex.DeviceError) as e:
        ex.open_device("cuda")
    assert str(e.value) == "no CUDA device: Boom: the driver library could not be loaded"


NO_VULKAN_LOADER = (
    "import importlib.abc as _abc, importlib.machinery as _m\n"
    "class _Loader(_abc.Loader):\n"
    "    def create_module(self, spec): return None\n"
    "    def exec_module(self, module):\n"
    "        raise OSError(\"cannot load library 'libvulkan.so.1': no such file\")\n"
    "class _Finder(_abc.MetaPathFinder):\n"
    "    def find_spec(self, name, path, target=None):\n"
    "        return _m.ModuleSpec(name, _Loader()) if name == 'vulkan' else None\n"
    "sys.meta_path.insert(0, _Finder())\n")


def test_vulkan_without_loader(cache_env):
    rc, _, err = poot("generate", "--model", LLAMA, "--backend", "vulkan", "--prompt", "hi",
                      prelude=NO_VULKAN_LOADER + NO_COMPILE, env=cache_env)
    user_error(rc, err, "Vulkan loader (libvulkan.so.1) is not installed", "apt-get install")


def test_vulkan_without_driver(cache_env):
    import importlib.util

    if importlib.util.find_spec("vulkan") is None:
        pytest.skip("the vulkan package is not installed (pip install 'poot[vulkan]')")
    try:
        import vulkan  # noqa: F401
    except OSError:
        pytest.skip("no Vulkan loader here (test_vulkan_without_loader covers it)")
    env = {**cache_env, "VK_DRIVER_FILES": "/nonexistent/icd.json",
           "VK_ICD_FILENAMES": "/nonexistent/icd.json"}
    rc, _, err = poot("generate", "--model", LLAMA, "--backend", "vulkan", "--prompt", "hi",
                      prelude=NO_COMPILE, env=env)
    user_error(rc, err, "no driver (ICD)", "mesa-vulkan-drivers")


# --- items 5 and 6: every check that needs no compile comes first ------------------------------

@pytest.mark.parametrize("argv,needles", [
    (["generate", "--model", GGUF, "--kv-capacity", "1", "--prompt", "hi", "--max-tokens", "8"],
     ["prompt alone is", "capacity of 1 token"]),
    (["generate", "--model", GGUF, "--kv-capacity", "16", "--prompt", "hi",
      "--max-tokens", "15"], ["+ max_tokens 15 =", "exceeds the context capacity of 16"]),
    (["bench", "--model", GGUF, "--kv-capacity", "16", "--max-tokens", "64"],
     ["the prompt alone is 32 tokens", "capacity of 16 tokens"]),
    (["bench", "--model", GGUF, "--kv-capacity", "64", "--prompt-tokens", "8",
      "--max-tokens", "60"], ["8 tokens + max_tokens 60 = 68"]),
    (["generate", "--model", GGUF, "--prompt", "hi", "--chat"], ["no chat template"]),
    (["chat", "--model", GGUF], ["no chat template"]),
    (["generate", "--model", LLAMA, "--prompt", "hi"], ["no tokenizer"]),
    (["generate", "--model", GGUF, "--prompt", "hi", "--top-p", "0"], ["--top-p"]),
    # no AMD GPU here: the HSA runtime library is missing, said before anything compiles
    (["generate", "--model", GGUF, "--backend", "rocm", "--prompt", "hi"],
     ["no ROCm runtime", "libhsa-runtime64.so.1"]),
    (["compile", "--model", GGUF, "--backend", "rocm"], ["rocm target comes from the device",
                                                         "poot devices --json"]),
    (["bench", "--model", GGUF, "--backend", "rocm"], ["no ROCm runtime"]),
])
def test_refused_before_compiling(argv, needles, cache_env):
    """Each used to compile first (111 s for ``--kv-capacity 1`` on SmolLM2, 25 s for a
    backend without a code generator) and only then refuse; now a compile here ends the
    test's process."""
    rc, out, err = poot(*argv, prelude=NO_COMPILE, env=cache_env)
    assert "reached a compile" not in out, (out, err)
    user_error(rc, err, *needles)


def test_api_before_compile_hook_runs_before_any_compile():
    from poot.api import ModelHandle
    from poot.api.generate import ContextOverflow
    from poot.sampling_params import SamplingParams

    def no_compile(graph):
        raise AssertionError("compiled before the request was checked")

    with pytest.raises(ContextOverflow):
        ModelHandle.load(GGUF, kv_capacity=8, compile_fn=no_compile, device=object(),
                         before_compile=lambda h: h.check_request(
                             "hello world", SamplingParams(max_tokens=8)))


def test_no_code_generator_needs_no_model(monkeypatch):
    """A registered backend without a code generator (every one in this build has one: a
    registration made here) is refused by planning before anything is opened or traced."""
    from poot.api import target_for
    from poot.backends.registry import BACKENDS, Backend
    from poot.compiler import Refusal
    from poot.compiler.compile import NoCodeGenerator

    import poot.api.model

    monkeypatch.setitem(BACKENDS, "metal", Backend("metal", None, None))
    monkeypatch.setattr(poot.api.model, "BACKENDS", (*poot.api.model.BACKENDS, "metal"))
    with pytest.raises(NoCodeGenerator) as e:
        target_for("metal")
    assert isinstance(e.value, Refusal) and e.value.backend == "metal"
    assert "cpu, cuda, rocm, vulkan, wgpu" in str(e.value)


# --- item 7: progress that tells the truth ------------------------------------------------------

def test_compile_reports_every_stage(tmp_path):
    """The compile entry's progress: passes, planning, the code generator's stages (LLVM
    codegen for the CPU, or the LLVM JIT without LLVM's tools), with counts that never exceed
    the total."""
    from poot.compiler import CompileOptions, compile, host_cpu
    from poot.dialects.types import DType, TensorType
    from poot.graph import Builder, TraceLimits, ops

    b = Builder(TraceLimits(max_values=1024, max_ops=1024, max_literal_bytes=4096,
                            max_owned_bytes=1 << 20))
    x = b.input("x", TensorType((1, 8), DType.F32))
    w = b.param("w", TensorType((8,), DType.F32))
    g = b.finish({"y": ops.rmsnorm(b, x, w, eps=1e-6)})
    events = []
    compile(g, host_cpu(), CompileOptions(), progress=lambda *e: events.append(e))
    names = [s for s, _, _ in events]
    for want in ("pass poot-canonicalize", "planning", "pass poot-fuse-dispatch",
                 "lower to linalg", "bufferize", "lower to LLVM"):
        assert want in names, names
    assert "LLVM codegen" in names or "LLVM JIT" in names, names
    dones = [d for _, d, _ in events]
    assert dones == sorted(dones) and dones == list(range(len(events)))
    assert all(0 <= d < t for _, d, t in events)
    assert events[-1][2] == len(events)          # the last unit is the last one announced


def test_generate_progress_lines_when_not_a_terminal(cache_env):
    """stderr is a pipe: one line per stage with its time, then per phase; the second run
    says each step came from the compile cache. (No compile worker: which steps a worker
    takes depends on timing, and this process reports only the steps it compiles.)"""
    argv = ["generate", "--model", GGUF, "--prompt", "hi", "--max-tokens", "2",
            "--kv-capacity", "16", "--prefill-chunk", "4"]
    cache_env = dict(cache_env, POOT_COMPILE_WORKERS="0")
    rc, _, err = poot(*argv, env=cache_env)
    assert rc == 0, err
    lines = err.splitlines()
    stage = re.compile(r"^poot: (prefill\[4\]|decode\[B=1\]|sampler\[B=1[^\]]*\]) step: "
                       r"(.+) \d+\.\d s$")
    stages = [m.group(2) for m in map(stage.match, lines) if m]
    for want in ("tracing", "pass poot-cse", "planning", "writing the compile cache"):
        assert want in stages, err
    assert "LLVM codegen" in stages or "LLVM JIT" in stages, err
    assert any(re.match(r"^poot: decode\[B=1\] step: \d+ stages in \d+\.\d s$", ln)
               for ln in lines)
    assert any(re.match(r"^poot: loading model\.gguf: \d+\.\d s$", ln) for ln in lines)
    rc, _, err = poot(*argv, env=cache_env)
    assert rc == 0, err
    hits = [ln for ln in err.splitlines() if "loaded from the compile cache" in ln]
    # the ragged step of one chunk and the batch-1 decode step, each with its greedy sampler
    # and the one serving any sampling options (warmed up by the CLI)
    assert len(hits) == 6 and "tracing" not in err, err


def test_quiet_prints_nothing_on_stderr(cache_env):
    rc, out, err = poot("generate", "--model", GGUF, "--prompt", "hi", "--max-tokens", "2",
                        "--kv-capacity", "16", "--prefill-chunk", "4", "--quiet",
                        env=cache_env)
    assert rc == 0 and err == "", err
    assert out.endswith("\n")


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_terminal_bar_counts_units_with_elapsed_and_eta():
    from poot.cli.progress_display import Reporter

    term = _Terminal()
    rep = Reporter(term, refresh_s=60)
    rep("decode step", 0, 0)
    for i, stage in enumerate(["tracing", "pass poot-cse", "LLVM JIT"]):
        rep(stage, i, 10)
    screen = term.getvalue()
    assert "poot: decode step: 2/10" in screen and "LLVM JIT" in screen
    assert re.search(r"\[\d\d:\d\d<~?\d\d:\d\d\]", screen), screen    # elapsed < ETA
    rep.close()
    assert re.search(r"poot: decode step: 3 stages in \d+\.\d s", term.getvalue())


def test_terminal_clock_ticks_during_a_long_unit():
    """The bar is redrawn while one unit (the LLVM JIT) runs, so its elapsed time moves:
    the clock thread refreshes until it is stopped (driven here without waiting)."""
    from poot.cli.progress_display import Reporter

    rep = Reporter(_Terminal(), refresh_s=60)
    rep("decode step", 0, 0)
    rep("LLVM JIT", 0, 4)
    rep._stop.set()
    rep._ticker.join(timeout=5)
    refreshes = []
    rep.bar.refresh = lambda *a, **k: refreshes.append(1)

    class ThreeTicks:
        n = 0

        def wait(self, timeout):
            self.n += 1
            return self.n > 3

    rep._stop, rep._ticker = ThreeTicks(), None
    rep._tick()
    assert len(refreshes) == 3
    rep._stop = __import__("threading").Event()
    rep.close()


def test_estimate_comes_from_a_remembered_phase(tmp_path, monkeypatch):
    """Counting units predicts badly (the LLVM JIT is most of a CPU step's compile); the
    estimate scales a remembered phase with the same stages by how long the finished ones
    took here, and the stage times outlive the process (history file)."""
    import poot.cli.progress_display as P

    clock = [0.0]
    monkeypatch.setattr(P.time, "perf_counter", lambda: clock[0])
    history = tmp_path / "progress.json"
    rep = P.Reporter(io.StringIO(), tty=False, history=history)
    rep("prefill step", 0, 0)
    for i, (stage, secs) in enumerate([("pass a", 1.0), ("pass b", 1.0), ("LLVM JIT", 8.0)]):
        rep(stage, i, 3)
        clock[0] += secs
    assert rep.estimate_left(clock[0]) is None           # nothing remembered yet
    rep("decode step", 0, 0)                              # prefill's times are remembered
    rep("pass a", 0, 3)
    clock[0] += 2.0                                       # twice as slow as the prefill's
    rep("pass b", 1, 3)
    assert rep.estimate_left(clock[0]) == pytest.approx(20.0 - 2.0)
    clock[0] += 2.0
    rep("LLVM JIT", 2, 3)
    clock[0] += 10.0
    assert rep.estimate_left(clock[0]) == pytest.approx(20.0 - 14.0)
    rep.close()
    later = P.Reporter(io.StringIO(), tty=False, history=history)
    assert later.history[0] == pytest.approx({"pass a": 2.0, "pass b": 2.0, "LLVM JIT": 10.0})
    later("compiling", 0, 0)
    later("other stage", 0, 2)                            # no remembered phase has it
    assert later.estimate_left(clock[0]) is None


def test_first_cpu_compile_is_estimated_from_the_prior(monkeypatch):
    """No compile remembered: a CPU step is estimated from the measured prior, where LLVM
    codegen is the longest stage (counting units would say it is nearly done)."""
    import poot.cli.progress_display as P

    clock = [0.0]
    monkeypatch.setattr(P.time, "perf_counter", lambda: clock[0])
    rep = P.Reporter(io.StringIO(), tty=False)
    rep("prefill step", 0, 0)
    names = list(P.PRIOR[0])
    cut = names.index("LLVM codegen")
    for i, stage in enumerate(names[:cut + 1]):
        rep(stage, i, len(names))
        clock[0] += 0.0 if stage == "LLVM codegen" else P.PRIOR[0][stage]
    left = sum(P.PRIOR[0][s] for s in names[cut:])      # the prior's own proportions
    assert P.PRIOR[0]["LLVM codegen"] == max(P.PRIOR[0].values())
    assert rep.estimate_left(clock[0]) == pytest.approx(left, abs=0.01)


def test_one_argument_progress_callbacks_see_phases_only():
    from poot.progress import Tracker, as_callback

    seen = []
    cb = as_callback(seen.append)
    cb("loading x", 0, 0)
    cb("pass poot-cse", 1, 5)
    assert seen == ["loading x"]
    t = Tracker(lambda s, d, n: seen.append((s, d, n)))
    t.add(2)
    t("a")
    t("b")
    t("c")                                         # more units than announced: total grows
    assert seen[1:] == [("a", 0, 2), ("b", 1, 2), ("c", 2, 3)]


# --- item 11: without the OpenMP runtime, say so once -------------------------------------------

def test_missing_openmp_warns_once(monkeypatch, capsys):
    """Said when a program is loaded to run (after every check of the input), once."""
    import poot.compiler.target as target_mod
    import poot.backends.cpu.runtime as cpu_mod
    from poot.runtime import DeviceError
    from poot.backends.cpu.runtime import CpuDevice

    monkeypatch.setattr(target_mod, "openmp_runtime", lambda: None)
    monkeypatch.setattr(cpu_mod, "_WARNED_OPENMP", [])
    monkeypatch.setenv("POOT_CPU_THREADS", "4")
    dev = CpuDevice()
    assert capsys.readouterr().err == ""               # opening the device says nothing
    for _ in range(2):
        with pytest.raises(DeviceError):
            dev.load(object())
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1, err
    assert "run on 1 of 4 cores" in err[0] and "pip install cmeel-libomp" in err[0]
    monkeypatch.setenv("POOT_CPU_OPENMP", "0")        # one thread asked for: no warning
    monkeypatch.setattr(cpu_mod, "_WARNED_OPENMP", [])
    cpu_mod.warn_no_openmp()
    assert capsys.readouterr().err == ""


def test_openmp_is_part_of_the_cpu_target_key(monkeypatch):
    """Kernels compiled without OpenMP run on one core: installing libomp must not keep
    loading them from the compile cache."""
    import poot.compiler.target as target_mod

    if target_mod.openmp_runtime() is None:
        pytest.skip("no OpenMP runtime here (pip install cmeel-libomp)")
    with_omp = target_mod.host_cpu()
    monkeypatch.setenv("POOT_CPU_OPENMP", "0")
    without = target_mod.host_cpu()
    assert "openmp" in with_omp.caps.features and "openmp" not in without.caps.features
    assert with_omp.key() != without.key()


# --- item 12: --version, natural tensor order -----------------------------------------------------

def test_version():
    from poot import __version__

    rc, out, err = poot("--version")
    assert rc == 0 and out.strip() == f"poot {__version__}", err


def test_inspect_lists_tensors_in_natural_order(tmp_path):
    from safetensors.numpy import save_file

    from poot.cli.inspect_cmd import inspect_model, natural_key

    names = [f"model.layers.{i}.mlp.weight" for i in (10, 2, 1, 0, 11)] + ["lm_head.weight"]
    save_file({n: np.zeros((2, 2), np.float32) for n in names},
              str(tmp_path / "model.safetensors"))
    got = [t["name"] for t in inspect_model(str(tmp_path / "model.safetensors"))["tensors"]]
    assert got == ["lm_head.weight"] + [f"model.layers.{i}.mlp.weight"
                                        for i in (0, 1, 2, 10, 11)]
    assert sorted(["blk.10.a", "blk.2.a", "blk.2.b", "blk.1"], key=natural_key) == \
        ["blk.1", "blk.2.a", "blk.2.b", "blk.10.a"]


# --- poot chat ------------------------------------------------------------------------------------

def test_chat_is_multi_turn_with_reset_and_exit(tmp_path, cache_env):
    model = chat_gguf(tmp_path)
    rc, out, err = poot("chat", "--model", model, "--max-tokens", "4", "--kv-capacity", "64",
                        stdin=b"hello\nhow are you\n/reset\nhello\n/exit\nnot read\n",
                        env=cache_env)
    assert rc == 0, err
    turns = [tuple(map(int, m.groups())) for m in
             re.finditer(r"\[(\d+) prompt \+ (\d+) generated tokens", err)]
    assert len(turns) == 3, err
    (p1, g1), (p2, _), (p3, _) = turns
    assert p2 > p1 + g1            # the second turn's prompt holds the first exchange
    assert p3 == p1                # /reset: the same first message, the same prompt
    assert "(new conversation)" in err


def test_chat_ends_cleanly_at_end_of_input_and_survives_a_full_context(tmp_path, cache_env):
    model = chat_gguf(tmp_path)
    long = ("tell me more " * 12).encode()
    rc, out, err = poot("chat", "--model", model, "--max-tokens", "4", "--kv-capacity", "32",
                        stdin=b"hi\n" + long + b"\nhi\n", env=cache_env)
    assert rc == 0, err
    assert "Traceback" not in err
    assert "no longer fits the context of 32 tokens" in err and "/reset" in err
    assert len(re.findall(r"generated tokens", err)) == 2     # the turns before and after


def test_other_sampling_options_compile_nothing(cache_env):
    """Item 8: a second run with other sampling options (temperature, top-p, top-k, min-p,
    penalties, seed) finds every program in the compile cache: nothing is traced or compiled
    (it used to compile a whole new decode step, 55-76 s on SmolLM2)."""
    base = ["generate", "--model", GGUF, "--prompt", "hi", "--max-tokens", "3",
            "--kv-capacity", "16", "--prefill-chunk", "4"]
    rc, _, err = poot(*base, env=cache_env)
    assert rc == 0, err
    for opts in (["--temperature", "0.8", "--top-p", "0.9", "--seed", "1"],
                 ["--temperature", "0.7", "--top-k", "5"]):
        rc, out, err = poot(*base, *opts, prelude=NO_CACHE_MISS, env=cache_env)
        assert rc == 0 and "reached a compile" not in out, (out, err)
        assert "tracing" not in err, err
