"""Decode tokens/s with one LoRA adapter active vs none, through the serving engine.
Prints one JSON object.

    python bench/lora_bench.py --model test/fixtures/tiny/llama --kv-capacity 64 --batches 1,4
    python bench/lora_bench.py --config bench/shapes/llama-3.2-1b.json --random-weights bf16 \\
        --backend cuda --batches 1,32 --rank 16                       # the GPU machine

Two handles of the same model: one without LoRA slots (the baseline), one with one slot of
rank ``--rank`` holding a random adapter on q/k/v/o and gate/up/down. For each batch size B,
B requests of a 16-token prompt each generate ``--tokens`` tokens (greedy, EOS ignored) all
at once; tok/s is the generated tokens over the wall time of the whole run (prefill
included), the best of ``--repeats`` runs after one warm-up. ``ratio`` = with / without.
On a GPU, ``replay`` gives each handle's decode step (the batch's bucket) and prefill chunk
as the device runs them: a recorded step replayed back to back, in ms (the rest of a run's
time is the engine's host work and the prefill chunks of each request).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def random_adapter(weights_types, n_layers: int, rank: int, seed: int = 0):
    """A LoraAdapter on every separate projection the base has, N(0, 0.02) A and B."""
    from poot.models.lora import PEFT_TARGETS, LoraAdapter

    rng = np.random.default_rng(seed)
    ad = LoraAdapter("bench", rank, float(rank), False, 1.0)
    for i in range(n_layers):
        for t in PEFT_TARGETS.values():
            base = weights_types.get(f"blk.{i}.{t}")
            if base is None:
                continue
            out_f, in_f = base.shape
            ad.weights[f"blk.{i}.{t}"] = (
                (rng.standard_normal((rank, in_f)) * 0.02).astype(np.float32),
                (rng.standard_normal((out_f, rank)) * 0.02).astype(np.float32))
    return ad


def tok_per_s(handle, batch: int, tokens: int, repeats: int, lora: str | None) -> float:
    from poot.sampling_params import SamplingParams

    eng = handle.engine
    rng = np.random.default_rng(1)
    vocab = handle.runner.vocab
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    best = 0.0
    for r in range(repeats + 1):
        prompts = [list(map(int, rng.integers(3, vocab, 16))) for _ in range(batch)]
        t0 = time.perf_counter()
        for p in prompts:
            eng.add_request(p, params, lora=lora)
        outs = [o for o in eng.run_until_done() if o.finished]
        dt = time.perf_counter() - t0
        if r:                                  # the first run warms up
            best = max(best, sum(len(o.output_ids) for o in outs) / dt)
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model")
    src.add_argument("--config")
    ap.add_argument("--random-weights", default="bf16", choices=("bf16", "f16", "f32"))
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--kv-capacity", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--context-profile", metavar="FILE",
                    help="CUDA: write each handle's decode step of each batch and its prefill "
                         "chunk profiled in context (poot.backends.cuda.runtime."
                         "profile_in_context) to FILE")
    args = ap.parse_args(argv)

    from poot.api import ModelHandle

    batches = [int(b) for b in args.batches.split(",")]
    common = dict(backend=args.backend, kv_capacity=args.kv_capacity, max_batch=max(batches),
                  random_weights=args.random_weights if args.config else None)
    path = args.config or args.model
    out = {"model": Path(path).stem, "backend": args.backend, "rank": args.rank,
           "tokens": args.tokens, "batches": {}}
    plain = ModelHandle.load(path, **common)
    with_lora = ModelHandle.load(path, max_loras=1, max_lora_rank=args.rank, **common)
    base_types = {k: v for k, v in with_lora.weights.types.items()
                  if not k.startswith("lora.")}
    adapter = random_adapter(base_types, with_lora.model.dims().n_layers, args.rank)
    with_lora.engine.run_in_loop(lambda: with_lora.runner.lora.load("bench", adapter))
    profiles: dict = {}
    for b in batches:
        none = tok_per_s(plain, b, args.tokens, args.repeats, None)
        one = tok_per_s(with_lora, b, args.tokens, args.repeats, "bench")
        out["batches"][str(b)] = {"tok_per_s_no_lora": round(none, 1),
                                  "tok_per_s_one_adapter": round(one, 1),
                                  "ratio": round(one / none, 3)}
        if args.backend != "cpu":        # recorded steps: device time per step, host apart
            from poot.cli.bench_cmd import replay_entry_us

            def ms(h, entry):
                us = replay_entry_us(h, entry, 50)
                return None if us is None else round(us / 1e3, 4)
            r = {}
            for name, h in (("no_lora", plain), ("one_adapter", with_lora)):
                r[f"decode_ms_{name}"] = ms(h, h.runner.decode_entry(h.runner.bucket(b)))
                r[f"prefill_ms_{name}"] = ms(h, h.runner.prefill_entry())
            out["batches"][str(b)]["replay"] = r
            if args.context_profile:
                from poot.backends.cuda.runtime import profile_in_context

                for name, h in (("no_lora", plain), ("one_adapter", with_lora)):
                    steps = [(str(b), h.runner.decode_entry(h.runner.bucket(b)))]
                    if b == batches[0]:
                        steps.append(("prefill", h.runner.prefill_entry()))
                    for step, entry in steps:
                        p = profiles[f"{step}/{name}"] = profile_in_context(
                            h.runner.session.device, entry.kernel,
                            h.runner.session._bindings(entry))
                        print(f"context profile {step} {name}: {p['total_us']} us",
                              file=sys.stderr)
    if args.context_profile:
        Path(args.context_profile).write_text(json.dumps(profiles))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
