"""SmolLM2 on the CUDA device (run on the GPU machine, no MLIR): the device check of its
compiled decode step, and greedy generation against the HF reference tokens.

    python3 bench/gpu_run/smollm2_check.py devcheck BUNDLE GGUF OUT.json
    python3 bench/gpu_run/smollm2_check.py greedy GGUF REF_DIR OUT.json [--kv-capacity 256]

``devcheck``: ``BUNDLE`` is a device-check bundle written without weights (the weights are the
98 MB GGUF carried separately); the GGUF's weights are bound by role as the compiler named
them and :func:`poot.backends.cuda.devcheck.run_check` runs on a copy of the bundle with them.

``greedy``: ``poot.api.ModelHandle.load(GGUF, "cuda")`` (programs from the compile cache at
``$POOT_CACHE_DIR``: no tracing, no MLIR) and the driver's greedy generation (on-device
sampler; only token ids come back) for every ``REF_DIR/*.json`` prompt, 32 tokens each, EOS
ignored like the reference. Tokens are compared up to the first reference step whose top-1 /
top-2 logit margin is below ``NEAR_TIE`` (a near-tie may flip under Q4_1 rounding); a
mismatch before that is a failure.

Both write a JSON report and exit 1 on any failure (0 otherwise).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

NEAR_TIE = 0.01


def devcheck(bundle: str, gguf: str, out: str) -> int:
    import numpy as np

    from poot.backends.cuda.devcheck import run_check
    from poot.models import load_model

    _, weights = load_model(gguf)
    with tempfile.TemporaryDirectory(prefix="smol-devcheck-") as tmp:
        for f in os.listdir(bundle):
            if f != "weights.npz":
                os.symlink(os.path.abspath(os.path.join(bundle, f)), os.path.join(tmp, f))
        with open(os.path.join(bundle, "plan.json")) as f:
            names = [p["name"] for p in json.load(f)["params"]]
        missing = [n for n in names if n not in weights.arrays]
        if missing:
            raise SystemExit(f"smollm2_check: the GGUF binds no weight for {missing[:5]}")
        arrays = {}
        for n in names:
            a = np.asarray(weights.arrays[n])
            arrays[n] = a.view(np.uint16) if a.dtype.itemsize == 2 and a.dtype.kind == "V" \
                else a
        np.savez(os.path.join(tmp, "weights.npz"), **arrays)
        report = run_check(tmp)
    report["bundle"] = bundle
    with open(out, "w") as f:
        json.dump(report, f, indent=1, default=str)
    print(json.dumps({"devcheck_smollm2_ok": report["ok"], "failures": report["failures"][:10],
                      "missing": report["missing"][:10],
                      "dispatches_checked": report.get("dispatches_checked")}))
    return 0 if report["ok"] else 1


def greedy(gguf: str, ref_dir: str, out: str, kv_capacity: int) -> int:
    from poot.api import Driver, ModelHandle
    from poot.sampling_params import SamplingParams

    t0 = time.perf_counter()
    # max_batch=1: the steps (and KV pool) cuda_decode_build.py's compile_steps() compiled; the
    # CUDA default batch would ask for a larger pool, a step the carried cache lacks
    handle = ModelHandle.load(gguf, backend="cuda", kv_capacity=kv_capacity, max_batch=1)
    report = {"kv_capacity": kv_capacity, "load_s": round(time.perf_counter() - t0, 2),
              "compile_s": handle.runner.compile_s, "near_tie": NEAR_TIE, "prompts": {}}
    drv = Driver(handle)
    ok = True
    refs = [f for f in sorted(glob.glob(os.path.join(ref_dir, "*.json")))
            if "prompt_ids" in json.load(open(f))]
    if not refs:
        raise SystemExit(f"smollm2_check: no reference prompts (*.json with prompt_ids) in "
                         f"{ref_dir}")
    for f in refs:
        ref = json.load(open(f))
        want = [int(i) for i in ref["generated_ids"]]
        done = drv.complete([int(i) for i in ref["prompt_ids"]],
                            SamplingParams(temperature=0.0, max_tokens=len(want),
                                           ignore_eos=True))
        got = done.token_ids
        margins = [s.get("top1_minus_top2", 1.0) for s in ref.get("steps", [])]
        upto = next((i for i, m in enumerate(margins) if m < NEAR_TIE), len(want))
        first_diff = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b),
                          None if len(got) == len(want) else min(len(got), len(want)))
        agree = first_diff is None or first_diff >= upto
        ok &= agree
        report["prompts"][ref.get("name", os.path.basename(f))] = {
            "ok": agree, "equal_tokens": (first_diff if first_diff is not None else len(want)),
            "of": len(want), "compared_up_to": upto, "got": got, "want": want,
            "decode_tokens_per_s": done.stats.decode_tokens_per_s}
    report["ok"] = ok
    with open(out, "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps({"greedy_smollm2_ok": ok, **{k: f"{v['equal_tokens']}/{v['of']}"
                                                    for k, v in report["prompts"].items()}}))
    return 0 if ok else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("devcheck")
    d.add_argument("bundle")
    d.add_argument("gguf")
    d.add_argument("out")
    g = sub.add_parser("greedy")
    g.add_argument("gguf")
    g.add_argument("ref_dir")
    g.add_argument("out")
    g.add_argument("--kv-capacity", type=int, default=256)
    a = ap.parse_args()
    if a.cmd == "devcheck":
        return devcheck(a.bundle, a.gguf, a.out)
    return greedy(a.gguf, a.ref_dir, a.out, a.kv_capacity)


if __name__ == "__main__":
    sys.exit(main())
