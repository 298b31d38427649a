"""poot's batched decode and prefill on the CPU against llama.cpp's ``llama-batched-bench`` and
``llama-bench`` on the same GGUF, same thread count, in one command.

    python bench/cpu_batched_vs_llamacpp.py                  # bundled SmolLM2-135M Q4_1, 2 threads
    python bench/cpu_batched_vs_llamacpp.py --batches 1,8,32 --reps 2 --out results.json
    python bench/cpu_batched_vs_llamacpp.py --llamacpp-dir /tmp/llamacpp --model some.gguf

What it measures (best of ``--reps`` runs of each side):

* batched decode, llama.cpp (the two sides alternate, run by run): ``llama-batched-bench -m GGUF -t N -fa on -c 5120 -npp 32
  -ntg 128 -npl 1,8,32 --output-format jsonl``: per parallel sequence count B, B prompts of 32
  tokens (not shared) prefilled, then 128 tokens generated for each; ``S_TG`` (``speed_tg``,
  B * 128 / the generation time) is its decode tok/s. ``-c`` is B_max * (32 + 128).
* batched decode, poot: ``poot bench --backend cpu --batch 1,8,32 --num-prompts 32
  --prompt-tokens 32 --max-tokens 128 --kv-capacity 512`` with ``POOT_CPU_THREADS=N``:
  ``decode_tokens_per_s`` per B (the steady rate of decode steps that ran B rows with no
  prefill between them: see ``poot bench``'s doc).
* prefill: ``llama-bench -m GGUF -t N -p 512 -n 0 -o json`` (pp512, ``-r`` repetitions, its
  other settings default) against ``poot bench --backend cpu --prompt-tokens 512
  --max-tokens 2 --kv-capacity 1024`` (prefix cache off: every timed run prefills all 512
  tokens): ``prefill_tokens_per_s``, 512 / the best run's time to first token (the prefill
  and the first token's sampling).
* ratios poot / llama.cpp (above 1: poot faster): ``decode`` per B, and ``prefill``.

Prints one JSON object (and writes it to ``--out FILE``): both sides, the ratios, the issue's
targets for this machine with whether they are met, and the machine's load before and after
(2 shared cores: the numbers are as noisy as the machine was busy).

The llama.cpp programs are built from the llama-cpp-python sdist exactly as
``bench/cpu_vs_llamacpp.py`` builds ``llama-bench`` (same sdist, flags and ``--llamacpp-dir``;
a build folder it configured is reused and only the missing target is built).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from cpu_vs_llamacpp import (ROOT, BenchError, busy_processes, default_model, llama_tool,
                             machine, positive_list, report)

PROMPT_TOKENS = 32
NEW_TOKENS = 128
BATCHED_KV = 512
PREFILL_TOKENS = 512
PREFILL_KV = 1024
#: issue 46's CPU targets (SmolLM2 Q4_1, 2 threads): tok/s and ratio to llama.cpp
TARGETS = {"decode": {"8": {"tokens_per_s": 600, "ratio": 3.0},
                      "32": {"tokens_per_s": 1000, "ratio": 3.0}},
           "prefill": {"tokens_per_s": 1000}}


def log(msg: str) -> None:
    print(f"cpu_batched_vs_llamacpp: {msg}", file=sys.stderr, flush=True)


def run_json_lines(what: str, cmd: list[str], env: dict | None = None) -> list[dict]:
    """``cmd``'s stdout as JSON: the rows of one JSON array (``llama-bench -o json``), else
    every line that is a JSON object (JSONL); a BenchError with its stderr's tail if it
    fails or prints no JSON."""
    log("running " + " ".join(cmd))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT,
                              timeout=1800)
    except subprocess.TimeoutExpired:
        raise BenchError(f"{what} took over 30 minutes (cores busy?)") from None
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.splitlines()[-15:])
        raise BenchError(f"{what} failed (exit {proc.returncode}):\n{tail}")
    try:
        whole = json.loads(proc.stdout)
        return whole if isinstance(whole, list) else [whole]
    except json.JSONDecodeError:
        pass
    rows = []
    for line in proc.stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    if not rows:
        raise BenchError(f"{what} printed no JSON: {proc.stdout[:300]!r}")
    return rows


def llama_batched(exe: Path, model: Path, threads: int, batches: list[int]) -> dict:
    """One ``llama-batched-bench`` run: its S_TG (decode tok/s) and S_PP per B."""
    cmd = llama_batched_command(exe, model, threads, batches)
    rows = {str(r["pl"]): r for r in run_json_lines("llama-batched-bench", cmd)
            if str(r.get("pl")) in map(str, batches)}
    missing = [str(b) for b in batches if str(b) not in rows]
    if missing:
        raise BenchError(f"llama-batched-bench printed no row for B = {', '.join(missing)}")
    return {b: {"decode_tokens_per_s": r["speed_tg"], "prefill_tokens_per_s": r["speed_pp"]}
            for b, r in rows.items()}


def llama_batched_command(exe: Path, model: Path, threads: int, batches: list[int]) -> list[str]:
    """``llama-batched-bench``'s command line (flash attention on, prompts not shared, a
    context of B_max * (prompt + new) positions)."""
    return [str(exe), "-m", str(model), "-t", str(threads), "-fa", "on",
            "-c", str(max(batches) * (PROMPT_TOKENS + NEW_TOKENS)),
            "-npp", str(PROMPT_TOKENS), "-ntg", str(NEW_TOKENS),
            "-npl", ",".join(map(str, batches)), "--output-format", "jsonl"]


def best_of(command: list[str], runs: list[dict]) -> dict:
    """Runs of per-B ``{"B": {"decode_tokens_per_s": x, ...}}`` as the best per B, with every
    run's decode tok/s (``decode_tokens_per_s_runs``)."""
    out = {}
    for b in runs[0]:
        rows = [r[b] for r in runs]
        best = max(rows, key=lambda r: r["decode_tokens_per_s"] or 0.0)
        out[b] = {**best, "decode_tokens_per_s_runs": [r["decode_tokens_per_s"] for r in rows]}
    return {"command": command, "runs": len(runs), "batches": out}


def llama_pp(exe: Path, model: Path, threads: int, reps: int) -> dict:
    """``llama-bench``'s pp512 (tok/s; mean and best of its ``reps`` repetitions)."""
    cmd = [str(exe), "-m", str(model), "-t", str(threads), "-p", str(PREFILL_TOKENS),
           "-n", "0", "-r", str(reps), "-o", "json"]
    rows = run_json_lines("llama-bench", cmd)
    row = next((r for r in rows if r.get("n_prompt") == PREFILL_TOKENS), None)
    if row is None:
        raise BenchError(f"llama-bench's JSON has no pp{PREFILL_TOKENS} row")
    samples = row.get("samples_ts") or [row["avg_ts"]]
    return {"command": cmd, "prefill_tokens_per_s": max(samples), "avg_ts": row["avg_ts"],
            "samples_ts": samples, "flash_attn": row.get("flash_attn"),
            "build_commit": row.get("build_commit")}


def poot_env(threads: int) -> dict:
    """The environment of a ``poot`` subprocess: this checkout first on PYTHONPATH."""
    path = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    return {**os.environ, "POOT_CPU_THREADS": str(threads), "PYTHONPATH": path}


def poot_bench(argv: list[str], threads: int) -> dict:
    """The JSON object of ``poot bench --backend cpu ARGV -q``."""
    cmd = [sys.executable, "-m", "poot.cli", "bench", "--backend", "cpu", *argv, "-q"]
    return run_json_lines("poot bench", cmd, env=poot_env(threads))[-1]


def poot_batched_argv(model: Path, batches: list[int]) -> list[str]:
    """``poot bench --batch``'s options for the batched-decode comparison."""
    return ["--model", str(model), "--batch", ",".join(map(str, batches)),
            "--num-prompts", str(max(batches)), "--prompt-tokens", str(PROMPT_TOKENS),
            "--max-tokens", str(NEW_TOKENS), "--kv-capacity", str(BATCHED_KV)]


def poot_batched(model: Path, threads: int, batches: list[int]) -> dict:
    """One ``poot bench --batch`` run: steady decode tok/s (and end-to-end tok/s) per B."""
    out = poot_bench(poot_batched_argv(model, batches), threads)
    return {b: {"decode_tokens_per_s": row["decode_tokens_per_s"] or 0.0,
                "e2e_tokens_per_s": row["e2e_tokens_per_s"]}
            for b, row in out["throughput"]["batches"].items()}


def poot_pp(model: Path, threads: int, reps: int) -> dict:
    """``poot bench``'s prefill tok/s of a 512-token prompt, prefix cache off (best run)."""
    argv = ["--model", str(model), "--prompt-tokens", str(PREFILL_TOKENS), "--max-tokens", "2",
            "--kv-capacity", str(PREFILL_KV), "--runs", str(reps), "--replay", "0"]
    out = poot_bench(argv, threads)
    if out.get("prefix_cache") is not False:
        raise BenchError("poot bench's runs used the prefix cache (this checkout's poot bench "
                         "predates the --prefix-cache switch?)")
    return {"command": ["poot", "bench", "--backend", "cpu", *argv],
            "prefill_tokens_per_s": out["prefill_tokens_per_s"], "ttft_s": out["ttft_s"],
            "cached_tokens": [r["cached_tokens"] for r in out["runs"]],
            "ttft_s_runs": [r["ttft_s"] for r in out["runs"]]}


def ratios(poot: dict, llama: dict, pp_poot: dict, pp_llama: dict) -> dict:
    """poot / llama.cpp: decode tok/s per B and prefill tok/s (above 1: poot faster)."""
    dec = {b: poot["batches"][b]["decode_tokens_per_s"] / r["decode_tokens_per_s"]
           for b, r in llama["batches"].items()}
    return {"decode": dec,
            "prefill": pp_poot["prefill_tokens_per_s"] / pp_llama["prefill_tokens_per_s"]}


def targets(poot: dict, pp_poot: dict, ratio: dict) -> dict:
    """The issue's CPU targets (``TARGETS``) with the measured values and whether each is met."""
    out = {}
    for b, t in TARGETS["decode"].items():
        if b in poot["batches"]:
            tps, r = poot["batches"][b]["decode_tokens_per_s"], ratio["decode"][b]
            out[f"decode_b{b}"] = {**t, "measured_tokens_per_s": tps, "measured_ratio": r,
                                   "met": tps >= t["tokens_per_s"] and r >= t["ratio"]}
    tps = pp_poot["prefill_tokens_per_s"]
    out["prefill"] = {**TARGETS["prefill"], "measured_tokens_per_s": tps,
                      "met": tps >= TARGETS["prefill"]["tokens_per_s"]}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path,
                    help="a GGUF (default: the bundled SmolLM2-135M-Instruct Q4_1)")
    ap.add_argument("--threads", type=int, default=2, help="threads for both (default: 2)")
    ap.add_argument("--batches", type=positive_list, default=[1, 8, 32],
                    help="batch sizes (parallel sequences), comma-separated (default: 1,8,32)")
    ap.add_argument("--reps", type=int, default=2,
                    help="runs of each side; the best counts (default: 2)")
    ap.add_argument("--llamacpp-dir", type=Path, default=ROOT / ".cache" / "llamacpp",
                    help="where llama.cpp is built and kept (default: .cache/llamacpp/ here; "
                         "shared with bench/cpu_vs_llamacpp.py)")
    ap.add_argument("--rebuild", action="store_true", help="configure and build llama.cpp again")
    ap.add_argument("--out", type=Path, help="also write the JSON object to this file")
    args = ap.parse_args(argv)

    def measure() -> dict:
        if args.threads < 1 or args.reps < 1:
            raise BenchError("--threads and --reps must be at least 1")
        t0 = time.perf_counter()
        dir_ = args.llamacpp_dir.resolve()
        batched_exe, build = llama_tool(dir_, "llama-batched-bench", args.rebuild)
        bench_exe, _ = llama_tool(dir_, "llama-bench")
        model = (args.model or default_model()).resolve()
        if not model.is_file():
            raise BenchError(f"no such GGUF: {model}")
        result = {"what": (f"batched decode ({PROMPT_TOKENS}-token prompts, {NEW_TOKENS} new "
                           f"tokens) and pp{PREFILL_TOKENS}: poot bench --backend cpu vs "
                           f"llama.cpp llama-batched-bench / llama-bench, {args.threads} "
                           f"threads"),
                  "model": str(model), "threads": args.threads, "batches": args.batches,
                  "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": machine(),
                  "llama_cpp_build": build}
        # the two sides alternate run by run: both meet the machine's load alike
        llama_runs, poot_runs, loads = [], [], []
        for _ in range(args.reps):
            loads.append(os.getloadavg()[0])
            llama_runs.append(llama_batched(batched_exe, model, args.threads, args.batches))
            poot_runs.append(poot_batched(model, args.threads, args.batches))
        result["load_average_1min_per_rep"] = loads
        llama = best_of(llama_batched_command(batched_exe, model, args.threads, args.batches),
                        llama_runs)
        poot = best_of(["poot", "bench", "--backend", "cpu",
                        *poot_batched_argv(model, args.batches)], poot_runs)
        pp_llama = llama_pp(bench_exe, model, args.threads, max(args.reps, 3))
        pp_poot = poot_pp(model, args.threads, max(args.reps, 3))
        ratio = ratios(poot, llama, pp_poot, pp_llama)
        result.update({"llama_cpp": {"batched": llama, "pp": pp_llama},
                       "poot": {"batched": poot, "pp": pp_poot}, "ratio": ratio,
                       "targets": targets(poot, pp_poot, ratio),
                       "elapsed_s": round(time.perf_counter() - t0, 1),
                       "machine_after": {"load_average": os.getloadavg(),
                                         "busy_processes": busy_processes()}})
        return result

    return report("cpu_batched_vs_llamacpp", measure, args.out)


if __name__ == "__main__":
    sys.exit(main())
