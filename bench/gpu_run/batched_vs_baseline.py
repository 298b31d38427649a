"""Batched decode on a GPU: ``poot bench --batch`` and the baseline of record,
``../shared/bench/batched_baseline.py`` (found relative to the repository root), side by side
in one command, with the ratios poot / baseline per batch size.

    python3 bench/gpu_run/batched_vs_baseline.py OUT.json --shape llama-3.2-1b -- \\
        --backend cuda --config bench/shapes/llama-3.2-1b.json --random-weights --dtype bf16 \\
        --kv-capacity 512 --batch 1,8,32,64,128 --num-prompts 64 --prompt-tokens 32 \\
        --max-tokens 128 --runs 1 [--baseline gpt-fast]
    python3 bench/gpu_run/batched_vs_baseline.py OUT.json --shape smollm2-135m -- \\
        --backend cuda --model /tmp/gguf/smollm2.gguf --kv-capacity 512 --batch 1,8,32,64,128 ...

Everything after ``--`` goes to ``poot bench`` (run first, in its own process, JSON to
``OUT.json``'s ``poot`` key); then the shared script runs in another process on ``--shape``
(its names: ``smollm2-135m``, ``llama-3.2-1b``, ``llama-3-8b``) at the same batch sizes, and
prints one JSON line per B (``decode_tok_s``: B * 128 / the time of 128 greedy steps, bf16
weights and KV cache, 512 positions, 32-token prompts). With ``--baseline gpt-fast`` among
poot's arguments the in-repo ``baseline_torch.py`` runs too, so the JSON also compares the two
baselines (``in_repo_vs_shared``: they measure the same program and should agree; see
``bench/results/gpu_baseline.md``).

The shared script's protocol is fixed (32-token prompt, 128 new tokens, KV capacity 512):
poot arguments that differ are listed under ``mismatch`` (the ratios then compare different
points). The shared script is looked for at ``<repo>/../shared/bench/batched_baseline.py``,
then ``<repo>/shared/bench/batched_baseline.py`` (``--shared-script`` overrides); when absent,
or without torch, the baseline half is skipped with the reason in ``shared.skipped`` and on
stderr, and poot's half is still written. Exit status: poot's (2 for a usage error here).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHARED_NAME = Path("shared") / "bench" / "batched_baseline.py"
#: the shared script's fixed protocol, as ``poot bench`` options
PROTOCOL = {"--prompt-tokens": "32", "--max-tokens": "128", "--kv-capacity": "512"}
SHAPES = ("smollm2-135m", "llama-3.2-1b", "llama-3-8b")


def log(msg: str) -> None:
    print(f"batched_vs_baseline: {msg}", file=sys.stderr, flush=True)


def shared_script(root: Path = ROOT) -> Path | None:
    """The shared baseline script beside the repository (``../shared``) or inside it
    (``shared/``), or None when neither exists."""
    for path in (root.parent / SHARED_NAME, root / SHARED_NAME):
        if path.is_file():
            return path
    return None


def option(argv: list[str], name: str) -> str | None:
    """The value of ``name`` in ``argv`` (``--name V`` or ``--name=V``), or None."""
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def mismatches(poot_argv: list[str]) -> dict:
    """The poot options that differ from the shared script's protocol: name -> (poot's,
    the baseline's); a missing ``--kv-capacity`` counts (poot's default differs)."""
    out = {}
    for name, want in PROTOCOL.items():
        got = option(poot_argv, name)
        if name == "--prompt-tokens" and got is None:
            got = "32"                         # poot bench's default is the same
        if got != want:
            out[name] = [got, want]
    return out


def run_poot(poot_argv: list[str]) -> tuple[int, dict | None, str]:
    """``poot bench`` with ``poot_argv`` in a fresh process: (exit status, its JSON, stderr's tail)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    cmd = [sys.executable, "-m", "poot.cli", "bench", *poot_argv]
    log("running " + " ".join(cmd))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    tail = "\n".join(proc.stderr.splitlines()[-15:])
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    try:
        return proc.returncode, (json.loads(lines[-1]) if lines else None), tail
    except json.JSONDecodeError:
        return proc.returncode, None, tail


def run_shared(script: Path, shape: str, batches: list[int]) -> dict:
    """The shared script's rows per B (``{"B": row}``) in a fresh process, or ``skipped``."""
    cmd = [sys.executable, str(script), shape, ",".join(map(str, batches))]
    log("running " + " ".join(cmd))
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=script.parent)
    rows = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            rows[str(row.get("batch"))] = row
    out = {"script": str(script), "command": cmd, "batches": rows}
    if proc.returncode != 0 and "No module named 'torch'" in proc.stderr:
        out["skipped"] = "torch is not installed: the shared baseline needs torch with CUDA"
    elif proc.returncode != 0 or not rows:
        out["error"] = f"exit {proc.returncode}: " + "\n".join(proc.stderr.splitlines()[-10:])
    return out


def ratios(poot: dict, shared: dict) -> dict:
    """poot decode tok/s / the shared baseline's per B (None where either is missing); with
    the in-repo baseline (``poot bench --baseline``) also in-repo / shared per B."""
    rows = (poot or {}).get("throughput", {}).get("batches", {})
    base = shared.get("batches", {})
    inrepo = (poot or {}).get("baseline", {}).get("batches", {})
    out: dict = {"poot_vs_shared": {}, "in_repo_vs_shared": {}}
    for b, row in rows.items():
        ref = base.get(b, {}).get("decode_tok_s")
        tps = row.get("decode_tokens_per_s")
        out["poot_vs_shared"][b] = tps / ref if tps and ref else None
        mine = inrepo.get(b, {}).get("decode_tokens_per_s")
        if inrepo:
            out["in_repo_vs_shared"][b] = mine / ref if mine and ref else None
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ours, poot_argv = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) \
        if "--" in argv else (argv, [])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, help="the JSON report")
    ap.add_argument("--shape", required=True, choices=SHAPES,
                    help="the shared script's model name for poot's model")
    ap.add_argument("--shared-script", type=Path, default=None,
                    help="the baseline script (default: ../shared/bench/batched_baseline.py "
                         "from the repository root, then shared/bench/...)")
    args = ap.parse_args(ours)
    batches = option(poot_argv, "--batch")
    if batches is None:
        ap.error("give poot bench's options after --, --batch B,B,... among them")
    try:
        sizes = [int(b) for b in batches.split(",") if b]
    except ValueError:
        ap.error(f"--batch {batches!r}: not comma-separated integers")
    report: dict = {"shape": args.shape, "poot_argv": poot_argv,
                    "mismatch": mismatches(poot_argv)}
    if report["mismatch"]:
        log(f"not the shared baseline's protocol: {report['mismatch']}")
    rc, report["poot"], tail = run_poot(poot_argv)
    if rc != 0:
        report["poot_error"] = tail
        log(f"poot bench failed (exit {rc}):\n{tail}")
    script = args.shared_script or shared_script()
    if script is None or not script.is_file():
        where = args.shared_script or f"{ROOT.parent / SHARED_NAME} or {ROOT / SHARED_NAME}"
        report["shared"] = {"skipped": f"no shared baseline script at {where}"}
    else:
        report["shared"] = run_shared(script, args.shape, sizes)
    if "skipped" in report["shared"]:
        log("shared baseline skipped: " + report["shared"]["skipped"])
    report["ratio"] = ratios(report["poot"], report["shared"])
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({"ratio": report["ratio"], "shared_skipped":
                      report["shared"].get("skipped")}))
    return rc


if __name__ == "__main__":
    sys.exit(main())
