"""The serving engine: continuous batching over a paged KV cache with prefix caching.

:class:`LLMEngine` (:mod:`poot.engine.llm_engine`) is the one loop every client uses;
:class:`ModelRunner` (:mod:`poot.engine.runner`) runs a model's compiled steps over its KV
pool; :class:`BlockManager` (:mod:`poot.engine.blocks`) owns the pool's blocks and prefix
cache.
"""

from poot.engine.blocks import BlockManager, OutOfBlocks, block_keys
from poot.engine.llm_engine import (ContextOverflow, EngineConfig, EngineError, EngineStats,
                                KVCapacityExceeded, LLMEngine, RequestOutput, RequestStats,
                                TokenLogprob)
from poot.engine.runner import KVConfig, ModelRunner, decode_buckets, sampler_spec_for

__all__ = ["BlockManager", "ContextOverflow", "EngineConfig", "EngineError", "EngineStats",
           "KVCapacityExceeded", "KVConfig", "LLMEngine", "ModelRunner", "OutOfBlocks",
           "RequestOutput", "RequestStats", "TokenLogprob", "block_keys", "decode_buckets",
           "sampler_spec_for"]
