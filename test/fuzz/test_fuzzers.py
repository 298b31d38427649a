"""Run each fuzzer (``fuzz_<target>.py``, atheris/libFuzzer) for a bounded time from its
committed seeds, and fail on a crash (an exception outside the target's documented errors, a
broken property), a hang past the per-input limit or memory past the RSS limit, printing the
input that did it.

``POOT_FUZZ_SECONDS`` (default 6) is each target's time; ``POOT_FUZZ_TIMEOUT`` (default 10)
the seconds one input may take; ``POOT_FUZZ_RSS_MB`` (default 2048) the memory limit;
``POOT_FUZZ_SEED`` (default 1) libFuzzer's seed. The suite's short run starts from a fixed
seed so that a test run replays the same mutations from the committed corpus (how far it
gets still depends on the machine's speed); a campaign that looks for new inputs takes a
random one (``0``) and runs longer:
``POOT_FUZZ_SEED=0 POOT_FUZZ_SECONDS=300 python -m pytest -q test/fuzz/test_fuzzers.py -n 0``.
What a campaign finds becomes a case in ``test_fuzz_regressions.py``.

libFuzzer reads RSS as the process's peak (``getrusage``), and Linux carries the peak of the
process that forked across ``exec``: a fuzzer started by a test worker that has loaded models
starts "using" that worker's gigabytes. The RSS limit is therefore the worker's own peak plus
``POOT_FUZZ_RSS_MB``, and ``-malloc_limit_mb`` bounds every single allocation by
``POOT_FUZZ_RSS_MB`` alone (what a size read from a header would ask for).
"""

from __future__ import annotations

import base64
import os
import re
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("atheris", reason="the fuzzers need atheris (pip install -e \".[test]\")")

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
TARGETS = ["gguf", "safetensors", "chat", "stops", "serve", "guided"]
SECONDS = int(os.environ.get("POOT_FUZZ_SECONDS", "6"))
TIMEOUT = int(os.environ.get("POOT_FUZZ_TIMEOUT", "10"))
RSS_MB = int(os.environ.get("POOT_FUZZ_RSS_MB", "2048"))
SEED = int(os.environ.get("POOT_FUZZ_SEED", "1"))


def _inherited_rss_mb() -> int:
    """This process's peak RSS in MiB: what a child it starts begins with (module doc)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024


def _show(path: Path) -> str:
    data = path.read_bytes()
    return (f"{path.name} ({len(data)} bytes)\n  repr:   {data[:2000]!r}\n"
            f"  base64: {base64.b64encode(data[:4000]).decode()}")


@pytest.mark.parametrize("target", TARGETS)
def test_fuzzer_finds_no_crash(target, tmp_path):
    seeds = HERE / "corpus" / target
    assert any(seeds.iterdir()), f"no seed corpus in {seeds}"
    work = tmp_path / "corpus"
    work.mkdir()
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    cmd = [sys.executable, str(HERE / f"fuzz_{target}.py"), str(work), str(seeds),
           f"-max_total_time={SECONDS}", f"-timeout={TIMEOUT}", f"-seed={SEED}",
           f"-rss_limit_mb={RSS_MB + _inherited_rss_mb()}",
           f"-malloc_limit_mb={RSS_MB}",
           f"-artifact_prefix={artifacts}/", "-print_final_stats=1"]
    if (HERE / f"{target}.dict").is_file():              # libFuzzer dictionary of the format
        cmd.append(f"-dict={HERE / f'{target}.dict'}")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                              errors="replace", timeout=SECONDS + 4 * TIMEOUT + 120)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"fuzz_{target} ran past its time and was killed:\n"
                    f"{(e.stderr or '')[-3000:] if isinstance(e.stderr, str) else ''}")
    log = proc.stdout + proc.stderr
    found = sorted(p for p in artifacts.iterdir() if not p.name.startswith("slow-unit"))
    if proc.returncode or found:
        shown = "\n".join(_show(p) for p in found) or "(no input was written)"
        keep = os.environ.get("POOT_FUZZ_KEEP")
        if keep:
            for p in found:
                shutil.copy(p, Path(keep) / f"{target}-{p.name}")
        pytest.fail(f"fuzz_{target} failed (exit {proc.returncode}); input:\n{shown}\n"
                    f"--- log tail ---\n{log[-4000:]}")
    runs = re.search(r"stat::number_of_executed_units:\s*(\d+)", log)
    assert runs and int(runs.group(1)) > 0, f"fuzz_{target} ran no input:\n{log[-2000:]}"
