"""What :meth:`poot.api.ModelHandle.load` takes: :class:`LoadOptions` and the API's defaults.

    handle = ModelHandle.load(path, "cpu", LoadOptions(max_batch=4, kv_capacity=1024))
    handle = ModelHandle.load(path, "cpu", max_batch=4, kv_capacity=1024)     # the same

Every integer option is checked (:func:`positive`) and every KV option is checked against
the model and the memory available (:mod:`poot.api.memory`) before anything is allocated or
compiled; a bad value raises :class:`~poot.sampling_params.InvalidRequest` naming it.
"""

from __future__ import annotations

import numbers
import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from poot.backends.registry import BACKENDS as _REGISTERED
from poot.compiler import CompileOptions
from poot.engine import EngineConfig
from poot.dialects.kv_quant import KV_FORMATS
from poot.sampling_params import InvalidRequest

#: the backends this build knows (:mod:`poot.backends.registry`)
BACKENDS = tuple(_REGISTERED)
#: Context positions per sequence by default (prompt + generated), capped at the model's
#: trained context; --kv-capacity raises it.
DEFAULT_KV_CAPACITY = 512
#: Prompt tokens one prefill step takes by default while other sequences decode (the smallest
#: ragged entry; a step that decodes nothing takes up to
#: :data:`~poot.engine.scheduler.IDLE_PREFILL_CHUNKS` of them).
DEFAULT_PREFILL_CHUNK = 32
#: Sequences decoding at once by default (the largest decode bucket), per backend.
DEFAULT_MAX_BATCH = {b.name: b.default_max_batch for b in _REGISTERED.values()}
#: Options the API compiles with (the full pipeline: dispatch fusion, RoPE and
#: flash-attention rewrites).
DEFAULT_COMPILE_OPTIONS = CompileOptions()


@dataclass(frozen=True)
class LoadOptions:
    """How :meth:`~poot.api.ModelHandle.load` loads a model (every field has a default).

    The KV pool:
        kv_capacity: context positions per sequence (prompt + generated tokens), >= 1 and at
            most the model's trained context (``max_position_embeddings``); None:
            :data:`DEFAULT_KV_CAPACITY` capped at that context. A sequence's block table
            covers it in whole blocks of the target's block size
            (:func:`poot.compiler.planning.kv_block_size`).
        max_batch: sequences decoding at once (None: :data:`DEFAULT_MAX_BATCH` of the
            backend: 8 on the CPU, 64 on GPUs).
        kv_blocks: blocks in the pool (None: every sequence of a full batch at full context;
            fewer makes the engine preempt under load).
        kv_memory: instead of ``kv_blocks``, the pool's size in bytes (as many blocks as fit).
        kv_dtype: the KV cache's storage, ``"f32"``/``"f16"``/``"bf16"``/``"q8_0"`` (int8
            with an f16 scale per 32 values of a head: about half of f16's bytes; every
            backend's attention kernels read it) or ``"fp8"`` (refused by planning on
            targets without fp8: all of this version's); None: the model's default.
        kv_dtype_k, kv_dtype_v: the K or V pools' storage where it differs (llama.cpp's
            ``-ctk``/``-ctv``); None: ``kv_dtype``.
        prefix_caching: share the KV blocks of common prompt prefixes.
    Steps and compiling:
        prefill_chunk: prompt tokens per prefill step while others decode, the smallest ragged
            entry (None: :data:`DEFAULT_PREFILL_CHUNK`).
        compile_options: the compiler's options (None: :data:`DEFAULT_COMPILE_OPTIONS`).
        cache_dir, use_cache: the compile cache's folder (None: its default) and whether it
            is read and written (:mod:`poot.compiler.cache`).
        warm_up: compile (or read from the cache) the prefill, decode and greedy sampler
            steps during the load; False: on first use.
        warm_batches: the decode buckets loaded (those that exist; default batch 1).
        warm_samplers: sampler specs loaded besides the greedy one.
        warm_ragged: also give the compile workers of a cold load every other ragged step
            the engine may run (the larger prompt buckets), after the warm samplers, so
            that they are in the cache before they are needed (``poot serve`` does).
        compile_fn, device: replace the compile and the executor device (tests).
    Weights:
        random_weights: ``"bf16"``/``"f16"``/``"f32"``: the path is a HF ``config.json`` and
            the weights are random of its shapes in that dtype (no tokenizer); ``seed`` seeds
            them.
        max_loras, max_lora_rank: LoRA adapter slots bound beside the weights and the largest
            rank a slot holds; ``loras``: name -> PEFT folder, loaded into them.
        pipeline_parallel: N > 1 cuts every step into N stages on N devices.
    Hooks:
        progress: a :mod:`poot.progress` callback ``(stage, done, total)`` (a one-argument
            ``progress(msg)`` sees the phases only).
        before_compile: ``before_compile(handle)`` runs once the model, tokenizer and KV pool
            are known, before any step is traced or compiled.
        engine_config: the engine's settings (None: ``max_batch``, ``prefix_caching``,
            ``max_decode_stall`` and ``speculative``).
        max_decode_stall: :attr:`EngineConfig.max_decode_stall
            <poot.engine.scheduler.EngineConfig>` (None: off); when set, the warm-up ends by
            timing the ragged steps it loaded
            (:meth:`~poot.engine.runner.ModelRunner.measure_ragged_costs`).
    Speculative decoding:
        speculative: ``"ngram[:k]"``, ``"draft:PATH[:k]"`` or a
            :class:`~poot.engine.spec.SpeculativeConfig` (None: off; :mod:`poot.engine.spec`);
            a bad value raises :class:`~poot.engine.spec.SpeculativeConfigError` before
            anything is opened (a draft model that does not fit the target: once it is
            opened, before any step compiles).
    """

    kv_capacity: int | None = None
    prefill_chunk: int | None = None
    max_batch: int | None = None
    kv_blocks: int | None = None
    kv_memory: int | None = None
    kv_dtype: str | None = None
    kv_dtype_k: str | None = None
    kv_dtype_v: str | None = None
    prefix_caching: bool = True
    compile_options: CompileOptions | None = None
    cache_dir: str | None = None
    use_cache: bool = True
    progress: Callable[..., None] | None = None
    compile_fn: Callable[[Any], Any] | None = None
    device: Any = None
    warm_up: bool = True
    random_weights: str | None = None
    seed: int = 0
    engine_config: EngineConfig | None = None
    before_compile: Callable[[Any], None] | None = None
    warm_samplers: Sequence[Any] = ()
    warm_batches: Sequence[int] = (1,)
    warm_ragged: bool = False
    max_loras: int = 0
    max_lora_rank: int = 16
    loras: Mapping[str, str | os.PathLike] | None = None
    pipeline_parallel: int = 1
    max_decode_stall: float | None = None
    speculative: Any = None


def positive(name: str, v) -> int:
    """``v`` as an int; :class:`InvalidRequest` naming ``name`` unless it is an integer >= 1
    (a bool is not)."""
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
        raise InvalidRequest(name, v, "must be an integer >= 1")
    return int(v)


def kv_dtype_of(name: str | None, option: str = "kv_dtype"):
    """The KV storage named ``name`` (:data:`poot.dialects.kv_quant.KV_FORMATS`: ``f32``,
    ``f16``, ``bf16``, ``q8_0``, ``fp8``), None for the model's default;
    :class:`InvalidRequest` naming ``option`` for another name. Whether the target and the
    model can hold it is planning's check (:func:`poot.api.memory.plan_kv`)."""
    if name is None:
        return None
    if name in KV_FORMATS:
        return KV_FORMATS[name]
    raise InvalidRequest(option, name, f"must be one of {', '.join(KV_FORMATS)}")


def kv_dtypes_of(opts: "LoadOptions") -> tuple[Any, Any]:
    """``(K's, V's)`` KV storage of ``opts`` (``kv_dtype_k``/``kv_dtype_v`` over
    ``kv_dtype``; None: the model's default, V: K's), each checked by :func:`kv_dtype_of`
    naming the option it came from."""
    def one(side: str):
        own = getattr(opts, f"kv_dtype_{side}")
        return kv_dtype_of(own, f"kv_dtype_{side}") if own is not None else \
            kv_dtype_of(opts.kv_dtype)
    return one("k"), one("v")


__all__ = ["BACKENDS", "DEFAULT_COMPILE_OPTIONS", "DEFAULT_KV_CAPACITY", "DEFAULT_MAX_BATCH",
           "DEFAULT_PREFILL_CHUNK", "LoadOptions", "kv_dtype_of", "kv_dtypes_of", "positive"]
