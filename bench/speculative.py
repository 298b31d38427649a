"""N-gram speculative decoding against plain decoding, batch 1, greedy: tokens/s ratio on
input-grounded prompts (the output copies from the prompt) and on free-form ones. Prints
one JSON object.

    python bench/speculative.py [--model GGUF] [--k 4] [--max-tokens 128] [--reps 3]

One model, two engines over the same runner (``max_batch=1``, prefix cache off): plain,
and ``speculative="ngram:K"``. Every prompt of ``bench/speculative_prompts.json`` (chat
formatted) runs once on each as a warm-up (compiles every verify bucket and lets the
speculating engine time its steps), then ``--reps`` times on each, alternating. A run's
rate is its decode tokens/s (the tokens after the first over the time after the first);
per prompt the best rep counts; a kind's rate is its prompts' tokens over their summed
best times. The outputs of the two engines must be the same tokens (``equal``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from poot.api import ModelHandle  # noqa: E402
from poot.engine import EngineConfig, LLMEngine  # noqa: E402
from poot.load.bundled import smollm2_gguf  # noqa: E402
from poot.sampling_params import SamplingParams  # noqa: E402

PROMPTS = Path(__file__).with_name("speculative_prompts.json")


def run_once(engine, ids, params) -> tuple[list[int], float, int, dict]:
    """(tokens, decode seconds after the first token, decode tokens, request stats)."""
    done = [o for o in engine.generate(ids, params) if o.finished][-1]
    st = done.stats
    secs = st.total_s - st.ttft_s
    return list(done.output_ids), secs, st.generated_tokens - 1, st.to_dict()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    path = args.model or smollm2_gguf()
    handle = ModelHandle.load(path, "cpu", max_batch=1, kv_capacity=1024,
                              prefix_caching=False)
    plain = LLMEngine(handle.runner, handle.tokenizer,
                      EngineConfig(max_batch=1, prefix_caching=False))
    spec = LLMEngine(handle.runner, handle.tokenizer,
                     EngineConfig(max_batch=1, prefix_caching=False,
                                  speculative=f"ngram:{args.k}"))
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    items = json.loads(PROMPTS.read_text())
    for it in items:
        it["ids"] = handle.encode([{"role": "user", "content": it["prompt"]}])
        for eng in (plain, spec):                     # warm-up: compiles, step timings
            run_once(eng, it["ids"], params)
    rows = []
    for it in items:
        best = {"plain": None, "spec": None}
        toks = {}
        for _ in range(args.reps):
            for name, eng in (("plain", plain), ("spec", spec)):
                out, secs, n, st = run_once(eng, it["ids"], params)
                toks[name] = out
                if best[name] is None or secs < best[name][0]:
                    best[name] = (secs, n, st)
        rows.append({"name": it["name"], "kind": it["kind"],
                     "tokens": best["plain"][1], "equal": toks["plain"] == toks["spec"],
                     "plain_s": best["plain"][0], "spec_s": best["spec"][0],
                     "ratio": (best["plain"][0] / best["spec"][0]) if best["spec"][0] else None,
                     "acceptance_rate": best["spec"][2]["acceptance_rate"],
                     "mean_accepted_length": best["spec"][2]["mean_accepted_length"],
                     "verify_steps": best["spec"][2]["verify_steps"]})
    out = {"model": str(path), "backend": "cpu", "k": args.k, "max_tokens": args.max_tokens,
           "reps": args.reps, "load_avg_1min": os.getloadavg()[0], "prompts": rows}
    for kind in ("grounded", "free"):
        sel = [r for r in rows if r["kind"] == kind]
        plain_s = sum(r["plain_s"] for r in sel)
        spec_s = sum(r["spec_s"] for r in sel)
        n = sum(r["tokens"] for r in sel)
        out[kind] = {"plain_tokens_per_s": n / plain_s, "spec_tokens_per_s": n / spec_s,
                     "ratio": plain_s / spec_s, "all_equal": all(r["equal"] for r in sel)}
    out["step_seconds"] = {f"{k[0]}[{k[1]}]": v for k, v in spec.speculator.costs.seconds.items()}
    out["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
