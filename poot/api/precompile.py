"""``compile_steps``: fill the compile cache with a model's steps without opening a device
(what ``poot compile`` runs, before the cache is carried to a machine without MLIR)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from poot.api.compile_ahead import compile_ahead
from poot.api.memory import check_kv_capacity, plan_kv
from poot.api.model import bind_lora_slots, default_model_path, open_model, target_for
from poot.api.options import (BACKENDS, DEFAULT_COMPILE_OPTIONS, DEFAULT_PREFILL_CHUNK,
                              LoadOptions, kv_dtypes_of, positive)
from poot.api.step_cache import compile_cached, placement_of
from poot.backends.registry import BACKENDS as _REGISTERED
from poot.compiler import CompileOptions
from poot.compiler.cache import CompileCache, step_key
from poot.engine.runner import (SamplerProgram, decode_buckets, ragged_token_buckets, spec_tag,
                               step_spec, step_trace)
from poot.graph.sampling import FULL, GREEDY, SamplerStep, history_pool_rows
from poot.progress import as_callback
from poot.sampling_params import InvalidRequest


def compile_steps(path: str | os.PathLike | None = None, backend: str = "cpu", *,
                  kv_capacity: int | None = None, prefill_chunk: int | None = None,
                  max_batch: int = 1, batches: Sequence[int] | None = None,
                  max_prefill_tokens: int | None = None,
                  kv_blocks: int | None = None, kv_dtype: str | None = None,
                  kv_dtype_k: str | None = None, kv_dtype_v: str | None = None,
                  samplers: Sequence[Any] | None = None, cache_dir: str | None = None,
                  compile_options: CompileOptions | None = None,
                  random_weights: str | None = None, seed: int = 0,
                  max_loras: int = 0, max_lora_rank: int = 16,
                  device_caps: Mapping[str, Any] | None = None,
                  progress: Callable[[str], None] | None = None,
                  pipeline_parallel: int = 1, stall_bounded: bool = False
                  ) -> dict[str, Any]:
    """Fill the compile cache with the steps ``ModelHandle.load(path, backend, ...)`` and
    generation use, without opening a device: the ragged steps an engine with the default
    prompt budget, or ``max_prefill_tokens`` a step while sequences decode, runs
    (:func:`~poot.engine.runner.ragged_token_buckets`), the decode step of each
    batch of ``batches`` (default: every bucket up to ``max_batch``) and its samplers (default:
    the greedy one; batch 1 also :data:`~poot.graph.sampling.FULL`, what the CLI warms up);
    ``max_loras``/``max_lora_rank``: the LoRA slots the handle binds (the steps differ).
    ``device_caps``: for a backend whose target comes from its device (Vulkan, wgpu), that
    device's ``capabilities()`` as read where it runs (``poot devices --json``); without it
    such a backend is refused here. What ``poot compile`` runs before the cache is carried to
    a machine without MLIR. ``pipeline_parallel`` N > 1: the model steps as N pipeline
    stages (what ``ModelHandle.load(..., pipeline_parallel=N)`` loads). ``stall_bounded``:
    also the ragged step an engine with a decode-stall bound adds
    (:func:`~poot.engine.runner.mixed_ragged_buckets`; ``poot serve`` has one). Returns ``{"cache_dir", "backend", "kv_capacity", "steps": {name:
    {"step_key", "program", "seconds", "hit"}}}`` (``hit``: found in the cache, compiled
    before or by a :mod:`~poot.api.compile_ahead` worker meanwhile)."""
    report = as_callback(progress)
    path = Path(path) if path is not None else default_model_path()
    prefill_chunk = DEFAULT_PREFILL_CHUNK if prefill_chunk is None else \
        positive("prefill_chunk", prefill_chunk)
    if kv_capacity is not None:
        positive("kv_capacity", kv_capacity)
    if max_prefill_tokens is not None:
        positive("max_prefill_tokens", max_prefill_tokens)
    positive("max_batch", max_batch)
    pipeline_parallel = positive("pipeline_parallel", pipeline_parallel)
    if backend in BACKENDS and _REGISTERED[backend].target_from_device:
        if device_caps is None:
            raise InvalidRequest("backend", backend, f"the {backend} target comes from the "
                                 "device: give its capabilities (poot devices --json, run "
                                 "where it is) or compile where it runs")
        target = target_for(backend, device_caps)
    else:
        target = target_for(backend)
    model, weights, ctx, _ = open_model(path, random_weights, seed, check_memory=False)
    weights, _ = bind_lora_slots(model, weights, max_loras, max_lora_rank)
    kv_capacity = check_kv_capacity(model, kv_capacity, ctx)
    k_dtype, v_dtype = kv_dtypes_of(LoadOptions(kv_dtype=kv_dtype, kv_dtype_k=kv_dtype_k,
                                                kv_dtype_v=kv_dtype_v))
    kv = plan_kv(model, weights.types, target, kv_capacity, max_batch, kv_blocks, k_dtype,
                 kv_dtype_v=v_dtype)
    cache = CompileCache(cache_dir)
    if not cache.enabled:
        raise InvalidRequest("cache_dir", str(cache.dir), "the compile cache is not writable")
    options = compile_options or DEFAULT_COMPILE_OPTIONS
    vocab = model.dims().vocab
    slots = history_pool_rows(max_batch)
    jobs = []
    chunk = max(1, min(prefill_chunk, kv.max_model_len))
    for t in ragged_token_buckets(chunk, max_batch, max_prefill_tokens,
                                  max_model_len=kv.max_model_len,
                                  stall_bounded=stall_bounded):
        jobs.append((f"ragged[T={t}]", model, weights.types,
                     step_spec(kv, "ragged", t, logit_rows=max_batch)))
        rows = min(t, max_batch)
        for sp in dict.fromkeys(list(samplers or [GREEDY]) + ([FULL] if t == chunk else [])):
            st = SamplerStep(rows, vocab, slots, sp)
            jobs.append((f"sampler[B={rows}{spec_tag(sp)}]", SamplerProgram(st), {}, st))
    for b in (batches or decode_buckets(max_batch)):
        jobs.append((f"decode[B={b}]", model, weights.types, step_spec(kv, "decode", b)))
        for sp in list(dict.fromkeys(list(samplers or [GREEDY]) + ([FULL] if b == 1 else []))):
            st = SamplerStep(b, vocab, slots, sp)
            jobs.append((f"sampler[B={b}{spec_tag(sp)}]", SamplerProgram(st), {}, st))
    out: dict[str, Any] = {"cache_dir": str(cache.dir), "backend": backend,
                           "pipeline_parallel": pipeline_parallel,
                           "kv_capacity": kv_capacity, "block_size": kv.block_size,
                           "kv_blocks": kv.num_blocks - 1,
                           "steps": {}}
    if pipeline_parallel > 1:         # the workers compile whole steps: not used
        _compile_jobs(cache, jobs, target, options, report, out, pipeline_parallel,
                      placement_of(model, weights.types, kv, pipeline_parallel))
        return out
    with compile_ahead(cache, [j[1:] for j in jobs], target, options):
        _compile_jobs(cache, jobs, target, options, report, out)
    return out


def _compile_jobs(cache, jobs, target, options, report, out, pipeline: int = 1,
                  placement=None) -> None:
    """``compile_steps``' loop: each job ``(name, key model, types, spec)`` compiled through
    ``cache``, its key, program, seconds and whether it was a hit recorded in ``out``."""
    for name, key_model, types, spec in jobs:
        report(f"{name} step", 0, 0)
        t0 = time.perf_counter()
        hits = cache.hits
        prog = compile_cached(cache, key_model, types, spec,
                              step_trace(key_model, types, spec), target, options,
                              progress=report, pipeline=pipeline, placement=placement)
        out["steps"][name] = {"step_key": step_key(key_model, types, spec, target, options),
                              "program": getattr(prog, "cache_key", None),
                              "seconds": round(time.perf_counter() - t0, 2),
                              "hit": cache.hits > hits}
        if out["steps"][name]["program"] is None:
            raise InvalidRequest("backend", out["backend"], f"{name}: the compiled program "
                                 f"was not written to the cache (this backend's programs "
                                 f"are not cached)")


__all__ = ["compile_steps"]
