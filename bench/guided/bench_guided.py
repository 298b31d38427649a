"""What guided decoding costs per token: decode tokens/s of B requests with a JSON-schema
constraint vs the same B requests unconstrained, and the host time of the masks.

    python bench/guided/bench_guided.py [--backend cpu] [--batch 1,32] [--max-tokens 128]
                                        [--model GGUF] [--kv-capacity 512] [--runs 3]
                                        [--out FILE]

Both runs are greedy over the same B chat prompts and produce exactly ``--max-tokens``
tokens per request (the unconstrained ones ignore EOS; the constraint, an array of at least
100 objects, cannot complete sooner), in one engine with every request added at once. The
rate is B over the median interval between decode steps with B rows and no prefill between
them (the mean-based rate of :func:`poot.cli.bench_cmd.steady_rate` is reported too), the
median over ``--runs`` alternated runs. Printed as JSON: per B, ``unconstrained`` and
``guided`` tokens/s, their ratio, the mean host microseconds per mask and per step, the mean
step time, and ``mask_overlaps_forward``: whether the masks are computed while the device
runs the step's forward pass (true where the device runs asynchronously to the host: the
engine issues a guided batch's forward pass, computes the masks, then issues the sampler).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

SCHEMA = {"type": "array", "minItems": 100, "items": {
    "type": "object", "properties": {"name": {"type": "string", "maxLength": 24},
                                     "age": {"type": "integer", "minimum": 0,
                                             "maximum": 120},
                                     "city": {"type": "string", "maxLength": 24}},
    "required": ["name", "age", "city"], "additionalProperties": False}}
QUESTION = "List {n} people with their name, age and city as a JSON array."


def median_rate(log, batch: int) -> float | None:
    """``batch`` / the median interval between consecutive decode steps of ``batch`` rows
    with no prefill between them (robust to a noisy host's stalls, unlike the mean)."""
    items = list(log)
    dts = sorted(t1 - t0 for (t0, r0, p0), (t1, r1, p1) in zip(items, items[1:])
                 if r0 == r1 == batch and p0 == p1 and t1 > t0)
    return batch / dts[len(dts) // 2] if dts else None


def run(handle, batch: int, max_tokens: int, guided: bool) -> dict:
    from poot.cli.bench_cmd import steady_rate
    from poot.sampling_params import Guide
    from poot.sampling_params import SamplingParams
    from poot.engine import EngineConfig, LLMEngine

    eng = LLMEngine(handle.runner, handle.tokenizer,
                    EngineConfig(max_batch=batch, prefix_caching=False),
                    model_context=handle.model_context)
    if guided:
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, detokenize=False,
                                guided=Guide.json_schema(SCHEMA))
    else:
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, detokenize=False,
                                ignore_eos=True)
    for i in range(batch):
        msgs = [{"role": "user", "content": QUESTION.format(n=100 + i)}]
        eng.add_request(handle.encode(msgs), params)
    t0 = time.perf_counter()
    outs = [o for o in eng.run_until_done() if o.finished]
    wall = time.perf_counter() - t0
    mean_rate, intervals = steady_rate(eng.decode_log, batch)
    rate = median_rate(eng.decode_log, batch)
    st = eng.stats()
    res = {"decode_tokens_per_s": rate, "mean_decode_tokens_per_s": mean_rate,
           "steady_intervals": intervals,
           "generated_tokens": sum(o.stats.generated_tokens for o in outs),
           "finish_reasons": sorted({o.finish_reason for o in outs}), "wall_s": wall,
           "pipelined": eng.pipelined, "decode_steps": st.decode_steps}
    if guided:
        res["masks"] = st.guided_masks
        res["mask_us_per_token"] = 1e6 * st.guided_mask_s / max(st.guided_masks, 1)
        res["mask_us_per_step"] = 1e6 * st.guided_mask_s / max(len(eng.decode_log), 1)
    if rate:
        res["step_ms"] = 1e3 * batch / rate
    return res


def main() -> int:
    from poot.api import ModelHandle

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--model", default=None, help="a GGUF (default: the bundled SmolLM2)")
    ap.add_argument("--batch", default="1")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--kv-capacity", type=int, default=512)
    ap.add_argument("--max-batch", type=int, default=None)
    ap.add_argument("--runs", type=int, default=3, help="alternated runs of each (median)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    batches = [int(x) for x in a.batch.split(",")]
    h = ModelHandle.load(a.model, a.backend, kv_capacity=a.kv_capacity,
                         max_batch=a.max_batch or max(batches))
    out = {"backend": a.backend, "model": str(h.path), "max_tokens": a.max_tokens,
           "mask_overlaps_forward": bool(getattr(h.runner.session, "overlaps", False)),
           "schema": SCHEMA, "batches": {}}
    for b in batches:
        run(h, b, 4, True)                      # compile / load every program first
        run(h, b, 4, False)
        plains, guideds = [], []
        for _ in range(a.runs):                 # alternated: drift hits both alike
            plains.append(run(h, b, a.max_tokens, False))
            guideds.append(run(h, b, a.max_tokens, True))
        med = lambda rs: sorted(rs, key=lambda r: r["decode_tokens_per_s"] or 0)[len(rs) // 2]  # noqa: E731
        plain, guided = med(plains), med(guideds)
        ratio = (guided["decode_tokens_per_s"] / plain["decode_tokens_per_s"]
                 if guided["decode_tokens_per_s"] and plain["decode_tokens_per_s"] else None)
        out["batches"][str(b)] = {
            "unconstrained": plain, "guided": guided, "guided_over_unconstrained": ratio,
            "runs_tokens_per_s": {"unconstrained": [r["decode_tokens_per_s"] for r in plains],
                                  "guided": [r["decode_tokens_per_s"] for r in guideds]}}
        print(f"B={b}: unconstrained {plain['decode_tokens_per_s']:.1f} tok/s, guided "
              f"{guided['decode_tokens_per_s']:.1f} tok/s ({ratio:.3f}x), mask "
              f"{guided['mask_us_per_token']:.1f} us/token", file=sys.stderr)
    text = json.dumps(out, indent=1)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
