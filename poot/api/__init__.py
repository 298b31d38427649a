"""The Python API: load a model for a backend, then generate (one request, or many batched).

    handle = ModelHandle.load()                     # the bundled SmolLM2 GGUF, CPU backend
    driver = Driver(handle)
    for ev in driver.generate("The capital of France is", SamplingParams(max_tokens=16)):
        ...                                          # TokenEvent(token_id, text) ..., Finished
    result = driver.complete(messages, params)       # the Finished event only

    llm = LLM(backend="cpu")                         # vLLM-style offline batching
    outs = llm.generate(["Hi!", "Count to 5"], SamplingParams(temperature=0, max_tokens=32))

``ModelHandle.load`` (its options a :class:`LoadOptions`) opens the checkpoint, sizes the
paged KV pool, and traces and compiles the prefill step, the batch-1 decode step and its greedy sampler up front (other decode buckets
and samplers compile when first needed), so an unsupported backend fails at load with the
compiler's typed :class:`~poot.compiler.Refusal` (no code generator / a missing capability),
never in the executor. Compiled programs are cached on disk (:mod:`poot.compiler.cache`).
Every client (``Driver``, ``LLM``, the CLI) runs through the handle's one
:class:`~poot.engine.LLMEngine`.

The modules: :mod:`~poot.api.options` (:class:`LoadOptions`, the defaults),
:mod:`~poot.api.model` (:class:`ModelHandle` and its load phases, :func:`target_for`),
:mod:`~poot.api.memory` (the KV pool against the memory available),
:mod:`~poot.api.step_cache` (steps through the compile cache), :mod:`~poot.api.precompile`
(:func:`compile_steps`), :mod:`~poot.api.compile_ahead` (compile workers),
:mod:`~poot.api.generate` (:class:`Driver`, :class:`LLM`, token events), :mod:`~poot.api.chat`
(chat with tools: the template's ``tools``, parsed ``tool_calls``) and
:mod:`~poot.api.pooling` (embeddings and cross-encoder scores).
"""

from __future__ import annotations

from poot.api.chat import ChatResult
from poot.api.generate import (LLM, CompletionOutput, ContextOverflow, Driver, Finished,
                               TokenEvent, generate)
from poot.api.memory import (available_memory, check_kv_capacity, check_kv_memory,
                             kv_cache_bytes)
from poot.api.model import (ModelHandle, ModelNotFound, bind_lora_slots, default_model_path,
                            target_for)
from poot.api.options import (BACKENDS, DEFAULT_COMPILE_OPTIONS, DEFAULT_KV_CAPACITY,
                              DEFAULT_MAX_BATCH, DEFAULT_PREFILL_CHUNK, LoadOptions)
from poot.api.precompile import compile_steps
from poot.api.step_cache import compile_cached
from poot.sampling_params import InvalidRequest, SamplingParams

__all__ = ["BACKENDS", "ChatResult", "CompletionOutput", "ContextOverflow",
           "DEFAULT_COMPILE_OPTIONS", "DEFAULT_KV_CAPACITY", "DEFAULT_MAX_BATCH",
           "DEFAULT_PREFILL_CHUNK", "Driver", "Finished", "InvalidRequest", "LLM",
           "LoadOptions", "ModelHandle", "ModelNotFound", "SamplingParams", "TokenEvent",
           "available_memory", "bind_lora_slots", "check_kv_capacity",
           "check_kv_memory", "compile_cached", "compile_steps", "default_model_path",
           "generate", "kv_cache_bytes", "target_for"]
