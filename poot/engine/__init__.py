"""The serving engine: continuous batching over a paged KV cache with prefix caching.

Split as vLLM's v1 engine is: :class:`LLMEngine` (:mod:`poot.engine.llm_engine`) is the one
loop every client uses (submission, ``step()``: schedule -> run -> process outputs);
:class:`~poot.engine.scheduler.Scheduler` (:mod:`poot.engine.scheduler`) decides what runs
(admission, prefill budget, preemption, prefix-cache hits); :class:`ModelRunner`
(:mod:`poot.engine.runner`) runs a model's compiled steps over its KV pool;
:class:`~poot.engine.output_processor.OutputProcessor` (:mod:`poot.engine.output_processor`)
turns sampled tokens into :class:`RequestOutput`; :class:`BlockManager`
(:mod:`poot.engine.blocks`) owns the pool's blocks and prefix cache.
"""

from poot.engine.blocks import BlockManager, OutOfBlocks, block_keys
from poot.engine.llm_engine import (ContextOverflow, EngineError, EngineStats,
                                    KVCapacityExceeded, LLMEngine)
from poot.engine.output_processor import RequestOutput, TokenLogprob
from poot.engine.request import RequestStats
from poot.engine.runner import KVConfig, ModelRunner, decode_buckets, sampler_spec_for
from poot.engine.scheduler import EngineConfig

__all__ = ["BlockManager", "ContextOverflow", "EngineConfig", "EngineError", "EngineStats",
           "KVCapacityExceeded", "KVConfig", "LLMEngine", "ModelRunner", "OutOfBlocks",
           "RequestOutput", "RequestStats", "TokenLogprob", "block_keys", "decode_buckets",
           "sampler_spec_for"]
