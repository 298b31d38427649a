"""Guided decoding on a backend: the 23 schemas of ``test/e2e/guided_schemas.py`` at
temperature 0 and at temperature 1 (seeded), all batched; each output is checked with
``jsonschema`` and the greedy ones compared with the CPU oracle's tokens
(``guided_cuda_build.py`` writes them). Prints JSON.

    python bench/gpu_run/guided_check.py OUT.json --backend cuda --model GGUF \\
        [--expected .cache/gpu/guided/expected.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "test", "e2e"))


def cases(greedy_only: bool = False):
    """(chat prompts, SamplingParams) of every case."""
    from guided_schemas import CASES

    from poot.sampling_params import Guide
    from poot.sampling_params import SamplingParams

    prompts, params = [], []
    for i, (q, schema) in enumerate(CASES):
        for t in ((0.0,) if greedy_only else (0.0, 1.0)):
            prompts.append([{"role": "user", "content": q}])
            params.append(SamplingParams(temperature=t, seed=1000 + i, max_tokens=120,
                                         guided=Guide.json_schema(schema)))
    return prompts, params


def run_cases(handle, greedy_only: bool = False) -> list[dict]:
    from poot.api import LLM

    prompts, params = cases(greedy_only)
    outs = LLM(handle=handle).generate(prompts, params)
    res = []
    for p, o in zip(params, outs):
        r = {"temperature": p.temperature, "text": o.text, "token_ids": o.token_ids,
             "finish_reason": o.finish_reason}
        try:
            import jsonschema

            jsonschema.validate(json.loads(o.text), p.guided.spec)
            r["valid"] = True
        except ImportError:
            r["valid"] = None
        except Exception as e:  # noqa: BLE001  (an invalid output: recorded)
            r["valid"], r["error"] = False, str(e)[:200]
        res.append(r)
    return res


def main() -> int:
    from poot.api import ModelHandle

    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--model", default=None)
    ap.add_argument("--kv-capacity", type=int, default=512)
    ap.add_argument("--max-batch", type=int, default=32)
    ap.add_argument("--expected", default=None)
    a = ap.parse_args()
    h = ModelHandle.load(a.model, a.backend, kv_capacity=a.kv_capacity, max_batch=a.max_batch)
    res = run_cases(h)
    summary = {"cases": len(res), "valid": sum(r["valid"] is True for r in res),
               "stop": sum(r["finish_reason"] == "stop" for r in res),
               "max_decode_batch": h.engine.stats().max_decode_batch}
    if a.expected and os.path.isfile(a.expected):
        exp = json.load(open(a.expected))
        greedy = [r for r in res if r["temperature"] == 0.0]
        summary["greedy_equal_cpu"] = sum(g["token_ids"] == e["token_ids"]
                                          for g, e in zip(greedy, exp))
        summary["greedy_cases"] = len(greedy)
    print(json.dumps(summary))
    json.dump({"summary": summary, "results": res}, open(a.out, "w"), indent=1)
    return 0 if summary["valid"] == len(res) or summary["valid"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
