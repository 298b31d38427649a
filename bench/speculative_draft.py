"""Draft-model speculative decoding on a random-weight pair of real shapes, its acceptance
set by the benchmarks' hook: measured speed-up beside the step-time model's. Prints one JSON.

    python bench/speculative_draft.py                                  # CPU: SmolLM2 shape,
        # its 4-layer draft (bench/shapes/smollm2-4-layers.json), bf16, batch 1
    python bench/speculative_draft.py --backend cuda --target bench/shapes/llama-3.2-1b.json \\
        --draft bench/shapes/smollm2-135m-llama3-vocab.json --batches 1,8
    python bench/speculative_draft.py --build --backend cuda ... --cache-dir DIR
        # compile only, into DIR, with a stand-in device (bench/gpu_run/spec_draft_build.py)

One handle: the target (``--target`` config, random ``--dtype`` weights) with the draft's
runner (``--draft`` config, random weights of the same vocabulary), ``max_batch`` the largest
of ``--batches``, prefix cache off. Per batch B: B synthetic prompts of ``--prompt-tokens``
run at once by a plain engine (``--reps`` times; the first run's tokens are the references),
then, per k of ``--k`` and p of ``--p``, by an engine speculating with the draft (fixed k,
``adaptive=False``) whose proposals are replaced by the target's own greedy token with
probability p per proposal (:mod:`poot.engine.spec.bench_acceptance`: the draft still runs,
so its cost is real; the draft's own tokens are almost never accepted, so alpha ~ p).
Every speculative run must give the plain tokens (``equal``).

Rates: decode tokens/s of the steady intervals with all B sequences decoding
(``poot bench``'s ``steady_rate``); per (k, p), ``--reps`` plain and speculative runs
alternate, the best of each counts. The step-time model: from the best speculative run, the
seconds of the verify step (the target's iteration less the draft's steps), the
draft's catch-up and decode steps (each shape's mean, outliers over 3x its median left out:
a prompt's catch-up), and the plain step from the plain runs, ``t_plain = B / rate``; a
verify iteration yields ``L`` tokens per sequence in ``t_iter = t_verify + t_catchup + (k -
1) t_draft_decode``, so ``predicted = L * t_plain / t_iter`` with L the measured mean
accepted length (``predicted_speedup``) or ``(1 - p**(k+1)) / (1 - p)`` from p alone
(``predicted_speedup_from_p``), beside ``speedup`` = measured spec rate / plain rate.

``--build``: nothing runs; the same handle, engines and entries as a run (every decode,
ragged and verify bucket a run of these settings can reach, and their greedy samplers) are
compiled into the compile cache (``--cache-dir``) for ``--backend`` with a stand-in device,
so a machine without MLIR runs the same command from that cache.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from poot.api import ModelHandle  # noqa: E402
from poot.cli.bench_cmd import steady_rate, synthetic_prompts  # noqa: E402
from poot.engine import EngineConfig, LLMEngine  # noqa: E402
from poot.engine.spec import SpeculativeConfig  # noqa: E402
from poot.engine.spec.adaptive import expected_tokens  # noqa: E402
from poot.engine.spec.bench_acceptance import set_acceptance  # noqa: E402
from poot.graph.sampling import GREEDY  # noqa: E402
from poot.sampling_params import SamplingParams  # noqa: E402


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def args_of(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="bench/shapes/smollm2-135m.json")
    ap.add_argument("--draft", default="bench/shapes/smollm2-4-layers.json")
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "f16", "f32"))
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--batches", type=_ints, default=[1])
    ap.add_argument("--k", type=_ints, default=[2, 4])
    ap.add_argument("--p", type=_floats, default=[0.5, 0.8, 0.95])
    ap.add_argument("--prompt-tokens", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--kv-capacity", type=int, default=256)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--build", action="store_true", help="compile only (stand-in device)")
    ap.add_argument("--out", default=None, help="also write the JSON here")
    return ap.parse_args(argv)


class StandInDevice:
    """The executor's device protocol as far as loading weights and programs goes (nothing
    runs): what ``--build`` compiles with, for a backend whose device is elsewhere."""

    overlaps = False

    def __init__(self, name: str):
        self.name = name

    def alloc(self, type_):
        return None

    def upload(self, buffer, array) -> None:
        pass

    def load(self, program):
        from types import SimpleNamespace

        from poot.backends.gpu.artifact import kernel_args
        art = program.executable
        return SimpleNamespace(args=kernel_args(art.plan) if hasattr(art, "plan") else [])


def draft_config(a, k: int) -> SpeculativeConfig:
    return SpeculativeConfig(method="draft", draft_model=str(a.draft), num_speculative_tokens=k,
                             adaptive=False, draft_random_weights=a.dtype, draft_seed=1)


def load(a) -> ModelHandle:
    """The target with the draft's runner (module doc)."""
    opts = dict(random_weights=a.dtype, max_batch=max(a.batches), kv_capacity=a.kv_capacity,
                prefill_chunk=a.prompt_tokens, prefix_caching=False,
                speculative=draft_config(a, max(a.k)), cache_dir=a.cache_dir)
    if a.build:                     # the stand-in device writes no weight: none is made
        return ModelHandle.load(a.target, a.backend, device=StandInDevice(a.backend),
                                warm_up=False, **opts)
    return ModelHandle.load(a.target, a.backend, **opts)


def engine(h: ModelHandle, a, b: int, k: int) -> LLMEngine:
    """The engine of batch ``b`` (plain for k = 0), every entry it can reach loaded."""
    spec = draft_config(a, k) if k else None
    eng = LLMEngine(h.runner, None, EngineConfig(max_batch=b, prefix_caching=False,
                                                 max_prefill_tokens=b * a.prompt_tokens,
                                                 speculative=spec),
                    draft=h.engine.draft if k else None)
    warm(eng, b, k)
    return eng


def warm(eng: LLMEngine, b: int, k: int) -> None:
    """Load (compile, in ``--build``) every entry an engine of batch ``b`` and k proposals
    can run: decode buckets up to b, ragged buckets up to its prompt budget, verify buckets
    up to ``b * (1 + k)`` rows; the draft's decode and ragged (catch-up) buckets; each with
    its greedy sampler."""
    r = eng.runner
    runners = [(r, eng.config.max_prefill_tokens)]
    if k:
        d = eng.speculator.draft
        runners.append((d.runner, d.budget))
    for run, budget in runners:
        for x in [x for x in run.buckets if x <= run.bucket(b)]:
            run.sampler_entry(x, GREEDY)
        t = run.ragged_bucket(1)
        while t <= run.ragged_bucket(budget):
            run.sampler_entry(run.ragged_rows(t), GREEDY, source=("ragged", t))
            t *= 2
    if k:
        t = 2
        while t <= r.verify_bucket(b * (1 + k)):
            r.sampler_entry(r.verify_rows(t), GREEDY, source=("verify", t))
            t *= 2


def run(eng: LLMEngine, prompts, params, b: int) -> tuple[list[list[int]], float | None]:
    """One run of ``prompts`` at once: their tokens and the steady decode tokens/s."""
    n0 = len(eng.decode_log)
    ids = [eng.add_request(p, params) for p in prompts]
    outs = {o.request_id: o for o in eng.run_until_done() if o.finished}
    rate, _ = steady_rate(list(eng.decode_log)[n0:], b)
    return [list(outs[i].output_ids) for i in ids], rate


def robust_mean(xs: list[float]) -> float | None:
    """The mean of ``xs`` without those over 3x their median (None for none)."""
    if not xs:
        return None
    m = statistics.median(xs)
    return statistics.fmean([x for x in xs if x <= 3 * m])


def model(step_s: dict, t_plain: float, k: int, p: float, length: float) -> dict:
    """The step-time model's predicted speed-ups (module doc)."""
    t_iter = step_s["verify"] + step_s["draft_catchup"] + (k - 1) * (step_s["draft_decode"]
                                                                     or 0.0)
    return {"t_iter_s": t_iter, "predicted_speedup": length * t_plain / t_iter,
            "predicted_speedup_from_p": expected_tokens(p, k) * t_plain / t_iter}


def measure(h: ModelHandle, a, b: int) -> list[dict]:
    """Every (k, p) row of batch ``b`` (module doc)."""
    prompts = synthetic_prompts(h.runner.vocab, b, a.prompt_tokens, seed=b)
    params = SamplingParams(temperature=0.0, max_tokens=a.max_tokens, ignore_eos=True,
                            detokenize=False)
    plain = engine(h, a, b, 0)
    refs = None
    if not a.build:
        out, _ = run(plain, prompts, params, b)
        refs = {tuple(p): o for p, o in zip(prompts, out)}
    rows = []
    for k in a.k:
        for p in a.p:
            eng = engine(h, a, b, k)
            if not a.build:
                rows.append(measure_spec(plain, eng, a, (b, k, p), prompts, params, refs))
    return rows


def measure_spec(plain, eng, a, bkp, prompts, params, refs) -> dict:
    """One (B, k, p) row: ``--reps`` runs of the plain engine and the speculating one,
    alternating; the rep of the best speculative rate gives that rate and the step times."""
    b, k, p = bkp
    hook = set_acceptance(eng, refs, p, seed=a.seed)
    seen: dict[str, list[float]] = {}
    observe = eng.speculator.costs.observe

    def record(shape, seconds):
        seen.setdefault(shape[0], []).append(seconds)
        observe(shape, seconds)

    eng.speculator.costs.observe = record
    plain_rates, best, equal = [], None, True
    for _ in range(a.reps):
        plain_rates.append(run(plain, prompts, params, b)[1] or 0.0)
        seen.clear()
        out, rate = run(eng, prompts, params, b)
        equal &= out == [refs[tuple(q)] for q in prompts]
        if best is None or (rate or 0.0) > best[0]:
            best = (rate or 0.0, {s: list(v) for s, v in seen.items()})
    plain_rate, (rate, times) = max(plain_rates), best
    st = eng.stats()
    step_s = {s: robust_mean(times.get(s, [])) for s in ("verify", "draft_catchup",
                                                           "draft_decode")}
    step_s["plain"] = b / plain_rate if plain_rate else None
    row = {"batch": b, "k": k, "p": p, "equal": equal,
           "plain_tokens_per_s": plain_rate, "spec_tokens_per_s": rate,
           "speedup": rate / plain_rate if plain_rate else None,
           "acceptance_rate": st.spec_acceptance_rate,
           "mean_accepted_length": st.spec_mean_accepted_length,
           "replaced": hook.replaced / hook.proposed if hook.proposed else None,
           "step_s": step_s, "step_counts": {s: len(v) for s, v in times.items()}}
    if None not in (step_s["plain"], step_s["verify"], step_s["draft_catchup"]):
        row.update(model(step_s, step_s["plain"], k, p, st.spec_mean_accepted_length))
    return row


def main(argv=None) -> int:
    a = args_of(argv)
    t0 = time.perf_counter()
    h = load(a)
    rows = [r for b in a.batches for r in measure(h, a, b)]
    out = {"target": str(a.target), "draft": str(a.draft), "backend": a.backend,
           "dtype": a.dtype, "batches": a.batches, "k": a.k, "p": a.p,
           "prompt_tokens": a.prompt_tokens, "max_tokens": a.max_tokens, "reps": a.reps,
           "build": a.build, "compiled": sorted(set(h.runner.compile_s)
                                                | {f"draft {n}" for n in h.engine.draft.compile_s}),
           "seconds": round(time.perf_counter() - t0, 1),
           "load_avg_1min": os.getloadavg()[0], "rows": rows,
           "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if not a.build:
        out["all_equal"] = all(r["equal"] for r in rows)
        for r in rows:
            print(f"B={r['batch']} k={r['k']} p={r['p']}: speed-up {r['speedup']:.2f}x "
                  f"measured, {r.get('predicted_speedup', float('nan')):.2f}x predicted "
                  f"(acceptance {r['acceptance_rate']:.2f}, L {r['mean_accepted_length']:.2f}"
                  f", equal {r['equal']})", file=sys.stderr)
    text = json.dumps(out)
    if a.out:
        Path(a.out).write_text(text + "\n")
    print(text)
    return 0 if a.build or out["all_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
