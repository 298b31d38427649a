"""Summarise a ``decode_gemm.sh`` run's raw files (``OUT/poot_<model>.json`` from ``poot bench
--batch ... --profile --out``, ``OUT/shared.jsonl`` from ``../shared/bench/batched_baseline.py``)
as one JSON object: decode tok/s per B for poot and the shared baseline, their ratio, and at
each profiled B the matmuls' GPU time, bytes and fraction of the bandwidth, with the ten
costliest matmul bodies.

    python3 bench/gpu_run/decode_gemm_summary.py OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

MODELS = {"llama1b": "llama-3.2-1b", "smollm2": "smollm2-135m"}


def summary(d: Path) -> dict:
    shared: dict = {}
    f = d / "shared.jsonl"
    for line in (f.read_text().splitlines() if f.exists() else []):
        try:
            r = json.loads(line)
        except ValueError:
            continue
        shared[(r.get("model"), str(r.get("B", r.get("batch"))))] = r.get("decode_tok_s")
    out: dict = {}
    for name, shape in MODELS.items():
        p = d / f"poot_{name}.json"
        if not p.exists():
            continue
        rep = json.loads(p.read_text())
        rows = {}
        for b, r in rep.get("throughput", {}).get("batches", {}).items():
            tps, base = r.get("decode_tokens_per_s"), shared.get((shape, b))
            rows[b] = {"poot": round(tps or 0), "shared": base,
                       "ratio": round(tps / base, 2) if tps and base else None}
        prof = {}
        for b, pr in rep.get("profile", {}).items():
            mm = pr.get("matmuls", {})
            ms = mm.get("ms") or 0
            prof[b] = {"step_gpu_ms": round(pr.get("total_ms", 0), 3), "matmul_ms": ms,
                       "matmul_bandwidth_fraction": round(mm.get("weight_bytes", 0) / (ms * 1e-3)
                                                          / 4.26e12, 3) if ms else None,
                       "top": [(r["callee"][:24], r["copies"], r["us"], r.get("GBps"),
                                r.get("bandwidth_fraction"), r.get("launches"))
                               for r in sorted(mm.get("rows", []),
                                               key=lambda r: -r["us"] * r["copies"])[:10]]}
        out[name] = {"decode_tok_s": rows, "profile": prof}
    return out


if __name__ == "__main__":
    print(json.dumps(summary(Path(sys.argv[1])), indent=1))
