"""``poot bench``: greedy decode speed and time to first token, as JSON.

    poot bench [--model MODEL | --config CONFIG.json --random-weights [--dtype bf16]]
               [--backend B] [--prompt-tokens N] [--max-tokens N] [--runs R]
               [--pipeline auto|on|off] [--prefix-cache] [--baseline gpt-fast] [--profile]
               [--out FILE]
    poot bench --batch 1,8,32 [--num-prompts 64] [--max-tokens 128] [--sequential] ...
    poot bench --shared-prefix 256 [--num-prompts 8] ...

``--batch``: throughput of the serving engine (:func:`run_batch`): for each batch size B,
``max(B, --num-prompts)`` prompts (``--prompt-tokens`` ids each, all different) of
``--max-tokens`` new tokens submitted at once to an engine running at most B sequences;
``decode_tokens_per_s`` is the steady-state rate of the decode steps that ran a full batch
with no prefill between them (B tokens a step; the host work included), ``e2e_tokens_per_s`` all generated tokens over the
whole wall time (prefill included, 8 prefill chunks an iteration); token ids only, no
detokenization (as the baseline); ``--sequential`` also runs every prompt alone, one after
another, and reports each B's ``ratio_vs_sequential`` (of ``e2e_tokens_per_s``). Each B also
reports ``micro_batches`` (a layer pipeline splits a decode step into as many micro-batches
as it has stages).
``--baseline gpt-fast`` adds the batched baseline at each B on GPUs.

``--shared-prefix N``: the prefix cache (:func:`run_prefix`): ``--num-prompts`` requests that
share an N-token system prompt, one at a time; reports the time to first token of the first
(uncached) request and of the later (cached) ones, their ratio, and the hit rate.

Runs R greedy requests of N new tokens (EOS ignored) on a synthetic prompt of
``--prompt-tokens`` ids (or ``--prompt`` text) after one warm-up request, through the same
driver as ``poot generate`` (prefill steps, then one decode step per token with the on-device
sampler; only the token id is read back). The runs repeat one prompt, so the engine's prefix
cache is off for them unless ``--prefix-cache``: every run prefills its whole prompt, and
``ttft_s`` / ``prefill_tokens_per_s`` measure prefill (with ``--prefix-cache`` every run after
the warm-up finds all the prompt's full KV blocks cached; each run's ``cached_tokens`` says
how many prompt tokens came from the cache). The decode loop is pipelined where the device
overlaps host and device work (CUDA: step n+1 is issued before token n is read, the token fed
back on the device; see :mod:`poot.api.generate`); ``--pipeline on|off`` forces it either
way (``POOT_PIPELINE`` is the same switch for every command). The KV pool and samplers are
``poot generate``'s (``--max-batch``, default 8 on the CPU): a bench after a generate
compiles nothing. Prints one JSON object: the best run's numbers at the top level
(``model``, ``backend``, ``prompt_tokens``, ``generated_tokens``, ``ttft_s`` (the best timed
run's: its steps compiled and loaded), ``prefill_tokens_per_s`` (the prompt tokens that run
computed, not cached, over its ``ttft_s``: prefill and the first token's sampling),
``prefix_cache`` (``--prefix-cache``), ``cold_ttft_s`` (from the start of loading to the
warm-up request's first token: loading, compiling the steps or loading them from the
compile cache, the first prefill: what a first ``poot generate`` waits for),
``decode_tokens_per_s``, ``pipelined`` (whether the timed decode loop was pipelined: step
n + 1 issued before token n is read), ``pipeline_parallel`` (the layer pipeline's stage
count, ``--pipeline-parallel``; 1: one device), ``kv_capacity``, ``load_s`` (loading and
compiling), ``compile_s`` (entry name -> seconds of its compile or cache load), ``runs``)
and, under ``poot``, the comparable measures:

* ``decode_tokens_per_s`` / ``us_per_token``: the driver's decode loop (host work included:
  what a caller sees per token; with ``pipelined`` the host work of token n overlaps step
  n+1, so it approaches the step time); ``pipelined`` as above;
  ``replay_us_per_step``: the decode step's recording replayed back to back (device time; the
  recording includes the on-device token feedback copy); ``host_us_per_token``:
  ``us_per_token - replay_us_per_step``, what the loop adds on top of the device;
* ``dispatches_per_token``: dispatch regions of the decode step; for CUDA the kernel nodes of
  its graph (``graph_kernel_nodes``, with ``graph_copy_nodes`` and ``graph_nodes_recorded``:
  every node of the recorded graph, copies of carried state included);
* ``bytes_per_token``: the weights one decode step reads (every weight; an embedding table
  that is not also the output head counts one row) + the K/V of the mean context of the
  timed tokens (``layers * 2 * ctx * kv_heads * head_dim * 4``: poot's caches are f32);
  ``roofline_fraction``: bytes_per_token * tokens/s / 4.26e12 (the H200's copy bandwidth).

``--baseline gpt-fast`` then runs ``bench/gpu_run/baseline_torch.py`` (a gpt-fast-style
torch model: static KV cache, ``torch.compile(mode="reduce-overhead")``, random-init weights
of the same shapes in ``--baseline-dtype``) in the same process with the same prompt and token
counts; its measures go under ``baseline`` and ``ratio`` holds poot / baseline. The baseline
of record for batched decode is ``../shared/bench/batched_baseline.py`` beside the checkout:
``bench/gpu_run/batched_vs_baseline.py`` runs it and ``poot bench --batch`` side by side
(``bench/results/gpu_baseline.md``: why the two baselines once measured 4.4x apart). ``--profile``
adds ``poot.profile``: GPU time per dispatch kind of one decode step (devices that
time dispatches: CUDA, Vulkan); with ``--batch``, ``profile`` per batch size B: the decode
step of B's bucket, each dispatch body's time, weight bytes and fraction of the bandwidth
(``bandwidth_fraction``), and the matmuls' total (``matmuls``).
"""

from __future__ import annotations

import argparse
import json
import os
import time

from poot.cli.compile_cmd import add_source_args, model_source
from poot.cli.generate_cmd import add_model_args, check_options, speculative_of
from poot.errors import PootError

ROOFLINE_BPS = 4.26e12
BASELINES = ("gpt-fast",)


class BenchError(PootError):
    """A benchmark part that cannot run here (say what and why, never a silent skip)."""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("bench", help="print decode tokens/s and time to first token",
                              description="Print greedy decode speed and time to first "
                              "token as one JSON object.")
    add_model_args(p)
    add_source_args(p)
    p.add_argument("--prompt", default=None, help="prompt text (default: synthetic ids)")
    p.add_argument("--prompt-tokens", type=int, default=32, metavar="N",
                   help="length of the synthetic prompt when no --prompt (default: 32)")
    p.add_argument("--max-tokens", "--tokens", dest="max_tokens", type=int, default=64,
                   metavar="N", help="new tokens per run, EOS ignored (default: 64; --tokens "
                                     "is the same option)")
    p.add_argument("--runs", type=int, default=3, metavar="R",
                   help="timed runs after one warm-up; the best is reported (default: 3)")
    p.add_argument("--replay", type=int, default=100, metavar="N",
                   help="decode-step replays timed back to back for replay_us_per_step; 0 = "
                        "skip (default: 100)")
    p.add_argument("--pipeline", choices=("auto", "on", "off"), default="auto",
                   help="pipeline the decode loop: auto = POOT_PIPELINE if set, else where "
                        "the device overlaps host and device work (default: auto)")
    p.add_argument("--prefix-cache", action="store_true",
                   help="let the timed runs (one prompt, repeated) reuse the prefix cache; "
                        "default: off, every run prefills its whole prompt (--shared-prefix "
                        "measures the cache either way)")
    p.add_argument("--baseline", choices=BASELINES, default=None,
                   help="also run this baseline on the same shapes in the same process "
                        "(default: none)")
    p.add_argument("--baseline-dtype", choices=("bf16", "f16", "f32"), default=None,
                   help="dtype of the baseline's random weights (default: --dtype with "
                        "--random-weights, else bf16)")
    p.add_argument("--profile", action="store_true",
                   help="add GPU time per dispatch of one decode step (with --batch: of each "
                        "B's step, with each matmul's bytes and %% of bandwidth)")
    p.add_argument("--out", default=None, metavar="FILE",
                   help="also write the JSON object to FILE (default: stdout only)")
    p.add_argument("--batch", default=None, metavar="B,B,...",
                   help="throughput of the batching engine at these batch sizes (see above)")
    p.add_argument("--num-prompts", type=int, default=64, metavar="N",
                   help="prompts of a --batch or --shared-prefix run (default: 64)")
    p.add_argument("--sequential", action="store_true",
                   help="with --batch: also run the prompts one after another (the ratio)")
    p.add_argument("--shared-prefix", type=int, default=None, metavar="N",
                   help="time to first token with and without the prefix cache, N shared "
                        "prompt tokens")
    p.set_defaults(func=run)


def synthetic_prompt(n: int, vocab: int) -> list[int]:
    """``n`` prompt ids spread over the vocabulary (the same for every backend and run)."""
    return [(17 + 31 * i) % vocab for i in range(n)]


def _load(args, max_batch=None, prefix_caching=True):
    """The handle (progress on stderr), its request checked against the context before
    anything is compiled. ``max_batch`` (default: ``--max-batch``, else ``poot generate``'s
    default) sizes the KV pool and the samplers, which are inputs of every step: with
    ``poot generate``'s, a bench finds the steps a generate compiled in the compile cache.
    ``prefix_caching``: the handle's engine reuses cached prompt prefixes (an engine
    setting, not an input of any step: the compiled steps are the same either way).
    The compile workers of a cold load may still be compiling (warm samplers)."""
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.cli.generate_cmd import load_handle
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.sampling_params import SamplingParams

    path, random_dtype = model_source(args)

    def check(h):
        if args.profile:
            require_profiler(h)
        if getattr(args, "baseline", None):
            baseline_path()              # after the device opened: its absence is told first
        prompt = args.prompt if args.prompt is not None else \
            synthetic_prompt(args.prompt_tokens, h.model.dims().vocab)
        h.check_request(prompt, SamplingParams(temperature=0.0, max_tokens=args.max_tokens,
                                               ignore_eos=True))

    return load_handle(args, before_compile=check, path=path, random_weights=random_dtype,
                       seed=args.seed, max_batch=max_batch or args.max_batch,
                       prefix_caching=prefix_caching)


def _stages(handle) -> int:
    """Pipeline stages the handle's device runs (1: one device)."""
    return int(getattr(handle.runner.session.device, "stages", 1))


def decode_entry(handle, batch: int = 1):
    """The decode entry of ``batch`` rows (compiled by the runs)."""
    return handle.runner.decode_entry(batch)


def weight_bytes_read(handle, program) -> int:
    """Bytes of the weights one decode step reads: every param of the step; an embedding
    table that is not also the head (an ``lm_head`` param is bound) counts one row."""
    types = handle.weights.types
    total = 0
    for b in getattr(program, "storage", ()):
        if b.role != "param":
            continue
        n = int(b.nbytes)
        if b.name == "tok_embed" and "lm_head" in types:
            n //= max(1, int(types[b.name].shape[0]))
        total += n
    return total


def kv_bytes_read(handle, ctx: float, itemsize: int | None = None) -> int:
    """Bytes of K/V one sequence's attention reads at context ``ctx`` (the pool's storage,
    q8_0 scales included; ``itemsize``: bytes a value instead)."""
    d = handle.model.dims()
    if itemsize:
        return int(d.n_layers * ctx * d.kv_token_elems * itemsize)
    return int(ctx * kv_token_bytes(handle))


def kv_token_bytes(handle) -> int:
    """Bytes one position's K/V take over every layer in the handle's pool."""
    d = handle.model.dims()
    return d.n_layers * handle.runner.kv.token_bytes(d)


def kv_fields(handle) -> dict:
    """The KV pool's fields of a bench report: storage (K's, and V's where it differs),
    bytes per token."""
    kv = handle.runner.kv
    out = {"kv_dtype": kv.kv_dtype.value, "kv_bytes_per_token": kv_token_bytes(handle)}
    if kv.kv_dtype_v is not None:
        out["kv_dtype_v"] = kv.kv_dtype_v.value
    return out


def replay_us(handle, n: int) -> float | None:
    """Mean microseconds of one decode step replayed ``n`` times back to back (no host
    work between launches), or None when the device has no recording yet."""
    return replay_entry_us(handle, decode_entry(handle), n)


def replay_entry_us(handle, entry, n: int) -> float | None:
    """Mean microseconds of one replay of ``entry``'s (first) recorded step, ``n`` back to
    back with no host work between them: the device's time per step, apart from the engine's
    host work; None when the entry has no recording yet."""
    recs = list(entry.recordings.values())
    if not recs or n <= 0:
        return None
    dev = handle.runner.session.device
    dev.replay(recs[0])
    dev.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        dev.replay(recs[0])
    dev.synchronize()
    return 1e6 * (time.perf_counter() - t0) / n


def require_profiler(handle) -> None:
    """Raise :class:`BenchError` unless ``handle``'s device times its dispatches (what
    ``--profile`` needs): checked once the device is open, before any step compiles."""
    if getattr(handle.runner.session.device, "profile_kernel", None) is None:
        raise BenchError(f"--profile needs a device that times its dispatches (CUDA events, "
                         f"Vulkan timestamps); the {handle.backend} device does not")


def profile(handle, batch: int = 1) -> dict:
    """GPU time of one decode step of ``batch`` rows per dispatch body (the device's
    ``profile_kernel``: ``total_ms``, ``by_kind``, ``top``), each body's row with
    ``bandwidth_fraction`` (its weight bytes per second over :data:`ROOFLINE_BPS`; None for
    a body without weights) and ``matmuls``: the matmul bodies alone, by total time. Raises
    :class:`BenchError` on a device that does not time its dispatches."""
    require_profiler(handle)
    eng = handle.runner.session
    prof = eng.device.profile_kernel
    entry = decode_entry(handle, batch)
    out = prof(entry.kernel, eng._bindings(entry), top=256)
    for r in out["top"]:
        gbps = r.get("GBps")
        r["bandwidth_fraction"] = round(gbps * 1e9 / ROOFLINE_BPS, 3) if gbps else None
    mm = [r for r in out["top"] if r.get("kind") == "matmul"]
    out["matmuls"] = {"ms": round(sum(r["us"] * r["copies"] for r in mm) / 1e3, 3),
                      "weight_bytes": sum(r["weight_bytes"] * r["copies"] for r in mm),
                      "rows": mm}
    out["batch"] = batch
    return out


def replay_us_without_pdl(handle, n: int) -> float | None:
    """:func:`replay_us` of the decode step recorded again with programmatic dependent launch
    off (a device that has the switch, a plan that uses it), to show what PDL saves; None
    otherwise."""
    eng = handle.runner.session
    entry = decode_entry(handle)
    dev = eng.device
    if not getattr(dev, "pdl", False) or not entry.kernel.artifact.plan.get("pdl") or n <= 0:
        return None
    # the same graph as the entry's own recording, PDL off
    copies = [(entry.outputs[o], entry.feedback_buffers[o]) for o in entry.feedback]
    dev.pdl = False
    try:
        rec = dev.record(entry.kernel, eng._bindings(entry), copies=copies)
    finally:
        dev.pdl = True
    try:
        dev.replay(rec)
        dev.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            dev.replay(rec)
        dev.synchronize()
        return 1e6 * (time.perf_counter() - t0) / n
    finally:
        dev.release(rec)


def poot_measures(handle, best: dict, replay_n: int) -> dict:
    """The poot half of the comparison (see the module docstring)."""
    entry = decode_entry(handle)
    prog = entry.program
    tps = best["decode_tokens_per_s"] or 0.0
    ctx = best["prompt_tokens"] + best["generated_tokens"] / 2
    w, kv = weight_bytes_read(handle, prog), kv_bytes_read(handle, ctx)
    out = {"decode_tokens_per_s": tps, "us_per_token": 1e6 / tps if tps else None,
           "pipelined": bool(best.get("pipelined")),
           "replay_us_per_step": replay_us(handle, replay_n),
           "replay_us_per_step_no_pdl": replay_us_without_pdl(handle, replay_n),
           "dispatches_per_token": sum(getattr(prog, "dispatches", {}).values()) or None,
           "dispatch_kinds": dict(getattr(prog, "dispatches", {})),
           "weight_bytes": w, "kv_bytes_read": kv, "bytes_per_token": w + kv,
           "roofline_fraction": (w + kv) * tps / ROOFLINE_BPS,
           "from_cache": bool(getattr(prog, "from_cache", False))}
    art = getattr(prog, "executable", None)
    plan = getattr(art, "plan", None)
    steps = getattr(art, "steps", None)
    if isinstance(steps, list):       # a SPIR-V plan (Vulkan, wgpu): its kernel launches
        out["dispatches_per_token"] = sum(1 for s in steps if s.op == "dispatch")
    if isinstance(plan, dict) and "launches" in plan:
        # lazy: CLI start-up (every command module is imported for --help) loads no engine
        from poot.backends.cuda.artifact import kernel_nodes

        nodes = kernel_nodes(plan)
        out["graph_kernel_nodes"], out["graph_copy_nodes"] = nodes["kernels"], nodes["copies"]
        out["dispatches_per_token"] = nodes["kernels"]
        recs = list(entry.recordings.values())
        if recs and hasattr(recs[0], "nodes"):   # + copies of ping-ponged carried state
            out["graph_nodes_recorded"] = recs[0].nodes
    if out["replay_us_per_step"] and out["us_per_token"]:
        out["host_us_per_token"] = out["us_per_token"] - out["replay_us_per_step"]
    if out["replay_us_per_step"]:
        out["replay_roofline_fraction"] = (w + kv) / (out["replay_us_per_step"] * 1e-6) \
            / ROOFLINE_BPS
    return out


def baseline_path() -> str:
    """``bench/gpu_run/baseline_torch.py`` of this source checkout; :class:`BenchError` when
    it or torch is missing (checked before anything compiles; nothing is imported)."""
    import importlib.util

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.path.join(root, "bench", "gpu_run", "baseline_torch.py")
    if not os.path.isfile(path):
        raise BenchError(f"--baseline gpt-fast runs {path}, which is not here (it ships with "
                         f"the source checkout, not the wheel)")
    if importlib.util.find_spec("torch") is None:
        raise BenchError("--baseline gpt-fast needs torch (with CUDA)")
    return path


def load_baseline():
    """``run_baseline`` of ``bench/gpu_run/baseline_torch.py`` in this source checkout."""
    import importlib.util

    path = baseline_path()
    spec = importlib.util.spec_from_file_location("poot_baseline_torch", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.run_baseline


def baseline_shape(handle) -> dict:
    """The baseline's shape dict from the loaded model (dims, RoPE base, tied head)."""
    d = handle.model.dims()
    o = handle.model.options() if hasattr(handle.model, "options") else handle.model.config
    return {"hidden": d.hidden, "layers": d.n_layers, "heads": d.n_heads,
            "kv_heads": d.n_kv_heads, "head_dim": d.head_dim, "ffn": d.intermediate,
            "vocab": d.vocab, "rope_theta": float(getattr(handle.model.config, "rope_theta",
                                                          10000.0)),
            "tied": bool(o.tie_word_embeddings)}


RATIO_KEYS = ("decode_tokens_per_s", "us_per_token", "dispatches_per_token", "bytes_per_token",
              "roofline_fraction")


def _pipeline(handle, args) -> None:
    if args.pipeline != "auto":
        handle.engine.pipelined = args.pipeline == "on"


def synthetic_prompts(vocab: int, n: int, length: int, seed: int = 0) -> list[list[int]]:
    """``n`` different prompts of ``length`` ids (a fixed pattern per prompt index)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return [rng.integers(3, vocab, length).tolist() for _ in range(n)]


def steady_rate(log, batch: int) -> tuple[float | None, int]:
    """Tokens/s of the decode steps that ran ``batch`` rows with no prefill between them:
    ``log`` holds (time read, rows, prefill steps so far[, tokens]) per decode step; every
    interval between two consecutive such steps counts the later step's tokens (a verify
    step of speculative decoding logs them; else ``batch``). Returns (rate, intervals)."""
    tokens, secs, n = 0, 0.0, 0
    items = list(log)
    for (t0, r0, p0, *_), (t1, r1, p1, *tok) in zip(items, items[1:]):
        if r0 == r1 == batch and p0 == p1 and t1 > t0:
            tokens += tok[0] if tok else batch
            secs += t1 - t0
            n += 1
    return (tokens / secs if secs > 0 else None), n


def run_batch(handle, args, batches: list[int]) -> dict:
    """The ``--batch`` measurements (module doc)."""
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.sampling_params import SamplingParams
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.engine import EngineConfig, LLMEngine

    vocab = handle.runner.vocab
    # token ids only (no detokenization), as the gpt-fast baseline
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True,
                            detokenize=False)
    budget = 8 * handle.runner.prefill_chunk
    out: dict = {"num_prompts": args.num_prompts, "prompt_tokens": args.prompt_tokens,
                 "new_tokens": args.max_tokens, "max_prefill_tokens": budget, "batches": {}}
    pipe = None if args.pipeline == "auto" else args.pipeline == "on"
    # compile every bucket up to the largest B before timing, and run each once
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.graph.sampling import GREEDY

    buckets = [x for x in handle.runner.buckets if x <= handle.runner.bucket(max(batches))]
    handle.runner.warm_up(batches=buckets, specs=[GREEDY])
    warm = LLMEngine(handle.runner, handle.tokenizer, EngineConfig(max_batch=max(batches),
                                                                   prefix_caching=False))
    for p in synthetic_prompts(vocab, max(batches), args.prompt_tokens, seed=99):
        warm.add_request(p, SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    warm.run_until_done()
    for b in batches:
        n = max(b, args.num_prompts)
        prompts = synthetic_prompts(vocab, n, args.prompt_tokens, seed=b)
        eng = LLMEngine(handle.runner, handle.tokenizer,
                        EngineConfig(max_batch=b, prefix_caching=False, pipeline=pipe,
                                     max_prefill_tokens=budget,
                                     speculative=speculative_of(args)),
                        draft=handle.engine.draft)
        t0 = time.perf_counter()
        for p in prompts:
            eng.add_request(p, params)
        outs = [o for o in eng.run_until_done() if o.finished]
        wall = time.perf_counter() - t0
        total = sum(o.stats.generated_tokens for o in outs)
        rate, steps = steady_rate(eng.decode_log, b)
        ttft = sorted(o.stats.ttft_s for o in outs)
        out["batches"][str(b)] = {
            "requests": n, "generated_tokens": total, "wall_s": wall,
            "e2e_tokens_per_s": total / wall, "decode_tokens_per_s": rate,
            "steady_intervals": steps, "pipelined": eng.pipelined,
            "micro_batches": eng.micro_batches,
            "micro_batched_steps": eng.micro_batched_steps,
            "chained_lane_steps": eng.chained_lane_steps,
            "ttft_p50_s": ttft[len(ttft) // 2], "ttft_max_s": ttft[-1],
            "decode_steps": len(eng.decode_log), **_spec_stats(eng)}
    if args.sequential:
        prompts = synthetic_prompts(vocab, args.num_prompts, args.prompt_tokens, seed=7)
        eng = LLMEngine(handle.runner, handle.tokenizer,
                        EngineConfig(max_batch=1, prefix_caching=False, pipeline=pipe))
        t0 = time.perf_counter()
        total = 0
        for p in prompts:
            done = [o for o in eng.generate(p, params) if o.finished][-1]
            total += done.stats.generated_tokens
        wall = time.perf_counter() - t0
        seq = {"requests": len(prompts), "generated_tokens": total, "wall_s": wall,
               "e2e_tokens_per_s": total / wall}
        out["sequential"] = seq
        for r in out["batches"].values():
            r["ratio_vs_sequential"] = r["e2e_tokens_per_s"] / seq["e2e_tokens_per_s"]
    return out


def run_prefix(handle, args) -> dict:
    """The ``--shared-prefix`` measurement (module doc)."""
    import statistics

    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.sampling_params import SamplingParams

    vocab = handle.runner.vocab
    system = synthetic_prompts(vocab, 1, args.shared_prefix, seed=5)[0]
    users = synthetic_prompts(vocab, max(2, args.num_prompts), 8, seed=6)
    params = SamplingParams(temperature=0.0, max_tokens=min(args.max_tokens, 8),
                            ignore_eos=True)
    eng = handle.engine
    ttft = []
    for u in users:
        done = [o for o in eng.generate(system + u, params) if o.finished][-1]
        ttft.append((done.stats.ttft_s, done.stats.cached_tokens))
    st = eng.stats()
    cached = [t for t, c in ttft[1:]]
    return {"shared_prefix_tokens": args.shared_prefix, "requests": len(users),
            "ttft_uncached_s": ttft[0][0], "ttft_cached_median_s": statistics.median(cached),
            "ttft_ratio": ttft[0][0] / statistics.median(cached),
            "cached_tokens": [c for _, c in ttft], "hit_rate": st.prefix_cache_hit_rate}


def prefill_rate(runs: list[dict]) -> float | None:
    """Prompt tokens computed (not taken from the prefix cache) per second of time to first
    token, of the run with the shortest ``ttft_s`` (``runs``: request stats as dicts); None
    when that run computed none."""
    fastest = min(runs, key=lambda r: r["ttft_s"])
    computed = fastest["prompt_tokens"] - fastest["cached_tokens"]
    return computed / fastest["ttft_s"] if computed > 0 and fastest["ttft_s"] > 0 else None


def run(args: argparse.Namespace) -> int:
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.api import Driver
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.sampling_params import SamplingParams

    check_options(args, "max_tokens", "runs", "prompt_tokens", "kv_capacity", "prefill_chunk",
                  "num_prompts", "max_batch", "kv_blocks")
    if args.batch is not None or args.shared_prefix is not None:
        return run_serving(args)
    t0 = time.perf_counter()
    handle = _load(args, prefix_caching=args.prefix_cache)
    _pipeline(handle, args)
    if args.prompt is not None:
        prompt = handle.encode(args.prompt)
    else:
        prompt = synthetic_prompt(args.prompt_tokens, handle.runner.vocab)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    drv = Driver(handle)
    asked = time.perf_counter() - t0
    cold = drv.complete(prompt, SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True))
    handle.finish_compiling()        # nothing compiles in the background while timing
    runs = [drv.complete(prompt, params).stats.to_dict() for _ in range(args.runs)]
    best = max(runs, key=lambda r: r["decode_tokens_per_s"] or 0.0)
    out = {"model": str(handle.path), "backend": handle.backend,
           "prompt_tokens": best["prompt_tokens"], "generated_tokens": best["generated_tokens"],
           "ttft_s": min(r["ttft_s"] for r in runs),
           "prefill_tokens_per_s": prefill_rate(runs), "prefix_cache": args.prefix_cache,
           "cold_ttft_s": asked + cold.stats.ttft_s,
           "decode_tokens_per_s": best["decode_tokens_per_s"],
           "pipelined": bool(best.get("pipelined")),
           "pipeline_parallel": _stages(handle),
           "kv_capacity": handle.kv_capacity, **kv_fields(handle),
           "load_s": handle.load_s, "compile_s": handle.runner.compile_s, "runs": runs,
           **_spec_stats(handle.engine, best)}
    if args.random_weights:
        out["random_weights"] = args.dtype
    out["poot"] = poot_measures(handle, best, args.replay)
    if args.profile:
        out["poot"]["profile"] = profile(handle)
    if args.baseline:
        run_baseline = load_baseline()
        dtype = args.baseline_dtype or (args.dtype if args.random_weights else "bf16")
        base = run_baseline(baseline_shape(handle), dtype, prompt_tokens=len(prompt),
                            new_tokens=args.max_tokens, kv_capacity=handle.kv_capacity,
                            runs=args.runs)
        out["baseline"] = {"name": args.baseline, **base}
        out["ratio"] = {k: (out["poot"][k] / base[k]
                            if out["poot"].get(k) and base.get(k) else None)
                        for k in RATIO_KEYS}
    return _emit(out, args)


def _spec_stats(engine, best: dict | None = None) -> dict:
    """Speculative decoding's numbers for the JSON (none when it is off): the engine's
    totals, and ``best``'s (a run's request stats) acceptance rate and mean accepted
    length."""
    if engine.speculator is None:
        return {}
    st = engine.stats()
    out = {"speculative": f"{engine.speculator.config.method}:"
                          f"{engine.speculator.config.num_speculative_tokens}",
           "spec_acceptance_rate": st.spec_acceptance_rate,
           "spec_mean_accepted_length": st.spec_mean_accepted_length,
           "spec_verify_steps": st.spec_verify_steps,
           "spec_step_model": engine.speculator.step_model()}
    if engine.speculator.config.method == "draft":
        out["speculative"] = f"draft:{engine.speculator.config.draft_model}:" \
                             f"{engine.speculator.config.num_speculative_tokens}"
    if best is not None:
        out["acceptance_rate"] = best.get("acceptance_rate")
        out["mean_accepted_length"] = best.get("mean_accepted_length")
    return out


def _emit(out: dict, args: argparse.Namespace) -> int:
    """Print ``out`` as one JSON line (also written to ``--out`` when given); exit status 0."""
    text = json.dumps(out)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0


def _parse_batches(text: str) -> list[int]:
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.sampling_params import InvalidRequest

    try:
        out = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise InvalidRequest("--batch", text, "must be comma-separated integers") from None
    if not out or any(b < 1 for b in out):
        raise InvalidRequest("--batch", text, "batch sizes must be >= 1")
    return out


def run_serving(args: argparse.Namespace) -> int:
    """``--batch`` and ``--shared-prefix``: the serving engine's measurements as JSON."""
    batches = _parse_batches(args.batch) if args.batch is not None else []
    if args.baseline and batches:
        baseline_path()                  # before anything compiles
    handle = _load(args, max_batch=max(batches + [args.max_batch or 1]))
    handle.finish_compiling()        # nothing compiles in the background while timing
    _pipeline(handle, args)
    out = {"model": str(handle.path), "backend": handle.backend,
           "pipeline_parallel": _stages(handle),
           "kv_capacity": handle.kv_capacity, **kv_fields(handle),
           "block_size": handle.runner.kv.block_size, "load_s": handle.load_s}
    if batches:
        out["throughput"] = run_batch(handle, args, batches)
        if args.baseline:
            run_baseline = load_baseline()
            dtype = args.baseline_dtype or (args.dtype if args.random_weights else "bf16")
            base = {}
            for b in batches:
                base[str(b)] = run_baseline(baseline_shape(handle), dtype,
                                            prompt_tokens=args.prompt_tokens,
                                            new_tokens=args.max_tokens,
                                            kv_capacity=handle.kv_capacity, runs=args.runs,
                                            batch=b)
            out["baseline"] = {"name": args.baseline, "batches": base}
            out["ratio"] = {b: (out["throughput"]["batches"][b]["decode_tokens_per_s"] or 0)
                            / base[b]["decode_tokens_per_s"] for b in base}
    if args.profile and batches:        # every GPU backend that times its dispatches
        out["profile"] = {str(b): profile(handle, handle.runner.bucket(b)) for b in batches}
    if args.shared_prefix is not None:
        out["prefix_cache"] = run_prefix(handle, args)
    out["compile_s"] = handle.runner.compile_s
    return _emit(out, args)
