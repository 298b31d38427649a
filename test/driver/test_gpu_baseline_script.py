"""``bench/gpu_run/batched_vs_baseline.py``: ``poot bench --batch`` and the shared baseline
script side by side in one command, the ratios per batch size, and a clear skip when the
shared script is absent (poot runs on the CPU with the tiny fixture; the baseline is a stand-in
script printing the shared script's JSON lines, as torch with CUDA is not here)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

from test_cli_errors import GGUF, ROOT

SCRIPT = ROOT / "bench" / "gpu_run" / "batched_vs_baseline.py"
POOT = ["--backend", "cpu", "--model", str(GGUF), "--batch", "1,2", "--num-prompts", "2",
        "--prompt-tokens", "4", "--max-tokens", "8", "--kv-capacity", "64",
        "--prefill-chunk", "4", "-q"]
#: decode tok/s the stand-in baseline reports per B
FAKE = {1: 100.0, 2: 400.0}


def _module():
    spec = importlib.util.spec_from_file_location("batched_vs_baseline", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _fake_shared(folder: Path) -> Path:
    """A stand-in for the shared script: ``NAME B,B`` -> one JSON line per B."""
    path = folder / "shared" / "bench" / "batched_baseline.py"
    path.parent.mkdir(parents=True)
    path.write_text("import json, sys\n"
                    f"fake = {FAKE!r}\n"
                    "for b in map(int, sys.argv[2].split(',')):\n"
                    "    print(json.dumps(dict(model=sys.argv[1], batch=b, "
                    "decode_tok_s=fake[b])))\n")
    return path


def _run(tmp_path, *ours):
    out = tmp_path / "report.json"
    p = subprocess.run([sys.executable, str(SCRIPT), str(out), "--shape", "smollm2-135m",
                        *ours, "--", *POOT], capture_output=True, text=True, cwd=ROOT,
                       timeout=600)
    return p, (json.loads(out.read_text()) if out.exists() else None)


def test_poot_and_shared_baseline_side_by_side(tmp_path):
    script = _fake_shared(tmp_path)
    p, report = _run(tmp_path, "--shared-script", str(script))
    assert p.returncode == 0, p.stderr
    rows = report["poot"]["throughput"]["batches"]
    for b, base in FAKE.items():
        tps = rows[str(b)]["decode_tokens_per_s"]
        assert report["shared"]["batches"][str(b)]["decode_tok_s"] == base
        assert report["ratio"]["poot_vs_shared"][str(b)] == tps / base
    # 4-token prompts, KV 64: not the shared script's protocol, and the report says so
    assert report["mismatch"]["--prompt-tokens"] == ["4", "32"]
    assert report["mismatch"]["--kv-capacity"] == ["64", "512"]


def test_absent_shared_script_is_skipped_with_its_path(tmp_path):
    missing = tmp_path / "nowhere" / "batched_baseline.py"
    p, report = _run(tmp_path, "--shared-script", str(missing))
    assert p.returncode == 0, p.stderr
    assert str(missing) in report["shared"]["skipped"]
    assert "shared baseline skipped" in p.stderr
    assert report["poot"]["throughput"]["batches"]["2"]["generated_tokens"] == 16
    assert report["ratio"]["poot_vs_shared"] == {"1": None, "2": None}


def test_shared_script_found_beside_the_repository_then_inside(tmp_path):
    mod = _module()
    repo = tmp_path / "repo"
    repo.mkdir()
    assert mod.shared_script(repo) is None
    inside = _fake_shared(repo)
    assert mod.shared_script(repo) == inside
    beside = _fake_shared(tmp_path)
    assert mod.shared_script(repo) == beside
