"""Steps through the compile cache's step index: a step compiled before (here, by a
:mod:`poot.api.compile_ahead` worker, or on another machine whose cache was carried) is read
without tracing or importing MLIR; a miss is traced and compiled (:mod:`poot.compiler.cache`).
What :meth:`~poot.api.ModelHandle.load`, :class:`~poot.api.pooling.PoolingModel`,
:func:`~poot.api.precompile.compile_steps` and the compile workers share."""

from __future__ import annotations

from typing import Callable

from poot.compiler.cache import step_describe, step_key
from poot.compiler.pipeline_parallel import partition, state_placement
from poot.engine.runner import step_spec
from poot.progress import Tracker


def compile_cached(cache, model, weight_types, spec, trace, target, options, progress=None,
                   wait: bool = True, pipeline: int = 1, placement=None):
    """The program of step ``spec`` through ``cache``'s step index (a hit neither traces nor
    imports MLIR; a miss calls ``trace()`` and compiles). ``progress``: a
    :mod:`poot.progress` callback, counting this step's units from zero. ``wait=False``:
    None when another process is compiling the step (see :meth:`CompileCache.compile_step`).
    ``pipeline`` N > 1: a step with weights is cut into N stages
    (:meth:`CompileCache.compile_pipeline_step`; ``placement()``: the KV pools' stages,
    :func:`placement_of`); one without (a sampler) is not."""
    describe = step_describe(model, weight_types, spec, target, options)
    if pipeline > 1 and weight_types:
        return cache.compile_pipeline_step(
            step_key(model, weight_types, spec, target, options), describe, trace, target,
            options, pipeline, progress=Tracker(progress), placement=placement)
    return cache.compile_step(step_key(model, weight_types, spec, target, options), describe,
                              trace, target, options, progress=Tracker(progress), wait=wait)


def cached_compiler(cache, target, options, progress=None, pipeline: int = 1,
                    placement=None) -> Callable:
    """``compile_step(key_model, weight_types, spec, trace)``: :func:`compile_cached` of
    that step through ``cache`` for ``target`` with ``options`` (what a runner compiles
    with)."""
    def compile_step(key_model, types, spec, trace):
        return compile_cached(cache, key_model, types, spec, trace, target, options,
                              progress=progress, pipeline=pipeline, placement=placement)

    return compile_step


def placement_of(model, weight_types, kv, stages: int) -> Callable[[], dict]:
    """``placement()``: the stage of every KV pool when the model's decode step of one row
    is cut into ``stages`` (traced and partitioned on the first call, then kept): every
    step of the model is cut to keep those
    (:func:`poot.compiler.pipeline_parallel.partition`)."""
    held: dict = {}

    def placement() -> dict:
        if "p" not in held:
            spec = step_spec(kv, "decode", 1)
            held["p"] = state_placement(partition(model.trace(spec, weight_types), stages))
        return held["p"]

    return placement


__all__ = ["cached_compiler", "compile_cached", "placement_of"]
