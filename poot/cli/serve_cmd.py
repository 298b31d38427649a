"""``poot serve``: an OpenAI-compatible HTTP server on the batching engine.

    poot serve [--model M] [--backend B] [--host 127.0.0.1] [--port 8000] [--api-key KEY]
               [--served-model-name NAME] [--max-batch N] [--kv-blocks N | --kv-memory BYTES]
               [--max-queue N] [--max-model-len N] [limits...]
    poot serve --ray --replicas N [...]         # N engine replicas behind one Ray Serve ingress
    poot serve --lora NAME=PATH [--max-loras N] [--max-lora-rank R] [--allow-runtime-lora
               --lora-root DIR]
    poot serve --tool-call-parser NAME --reasoning-parser NAME   # else from the chat template

The server listens at once: ``GET /health`` answers 503 ``loading`` while the model loads and
its steps compile (progress on stderr), then 200 ``ready``, and a line says it is ready.
Every decode bucket and its greedy and full samplers are compiled before that, so no plain
request waits on a compile; the sampler with log-probs and the guided mask keeps compiling in
the compile workers after ready, and a request that needs it before they finish waits for it
(``--no-warm-up``: compile everything on first use instead). One log line per request goes to stderr. SIGTERM or Ctrl-C drains: no
new connections, running requests finish within ``--drain-timeout`` seconds or are aborted,
exit status 0.

An embedding model (a folder with sentence-transformers' ``modules.json``, a BERT checkpoint,
a bare ``...Model`` decoder) is served on ``POST /v1/embeddings`` and a cross-encoder
(``...ForSequenceClassification``) on ``POST /v1/rerank`` instead of the generation routes
(:func:`poot.api.pooling.pooled_task` decides; ``--max-model-len`` is then the tokens one input
may hold, ``--max-batch`` the inputs per step).

Needs the ``serve`` extra (``pip install -e ".[serve]"``); ``--ray`` the ``ray`` extra.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import sys
import time

from poot.cli.generate_cmd import (add_model_args, apply_threads, check_options,
                                   compile_options, speculative_of)
from poot.sampling_params import InvalidRequest
from poot.text.tool_calls import FORMATS, REASONING_PARSERS
from poot.errors import PootError
from poot import settings

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.I)


def parse_bytes(text: str, option: str = "--kv-memory") -> int:
    """A size as bytes: ``"2GiB"``, ``"512M"``, ``"1048576"`` (``k``/``m``/``g``/``t`` are
    powers of 1024, with or without ``iB``; a bare number is bytes). Raises
    :class:`InvalidRequest` naming ``option`` otherwise."""
    if (text or "").strip().startswith("-"):
        raise InvalidRequest(option, text, "a size cannot be negative (give one such as 2GiB, "
                             "512MiB or a number of bytes)")
    m = _SIZE.match(text or "")
    if not m:
        raise InvalidRequest(option, text, "must be a size such as 2GiB, 512MiB or "
                             "a number of bytes")
    scale = 1024 ** " kmgt".index((m.group(2) or " ").lower())
    return int(float(m.group(1)) * scale)


_IMPORTED = time.monotonic()


def process_age_s() -> float:
    """Seconds since this process started (Linux: its start time in ``/proc/self/stat``
    against ``/proc/uptime``, 10 ms ticks; elsewhere: since this module was imported, which
    misses the interpreter's start and the imports before it)."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.monotonic() - _IMPORTED


#: the server's limits: (option, type, default, metavar, help)
_LIMITS = (
    ("--max-queue", int, 256, "N", "sequences that may wait beyond the running batch; then "
     "429 (default: 256)"),
    ("--max-pooled-rows", int, 4096, "N", "embedding inputs / rerank documents that may wait "
     "for a pooled step; then 429 (default: 4096)"),
    ("--max-concurrent", int, 512, "N", "HTTP requests in progress at once; then 503 "
     "(default: 512)"),
    ("--max-body-bytes", int, 1 << 20, "N", "largest request body; then 413 (default: 1 MiB)"),
    ("--max-n", int, 16, "N", "most choices (n x prompts) per request (default: 16)"),
    ("--max-prompt-tokens", int, None, "N", "longest prompt (default: the context)"),
    ("--request-timeout", float, 600.0, "S", "a request's time limit, queueing included "
     "(default: 600)"),
    ("--drain-timeout", float, 30.0, "S", "on SIGTERM, how long running requests may finish "
     "(default: 30)"),
    ("--header-timeout", float, 10.0, "S", "a request's headers must arrive within S seconds; "
     "then 408 and the connection is closed (default: 10)"),
    ("--body-timeout", float, 30.0, "S", "a request's body must arrive within S seconds of "
     "its headers; then 408 (default: 30)"),
    ("--idle-timeout", float, 30.0, "S", "close a kept-alive connection without a request, or "
     "one whose client stopped reading, after S seconds (default: 30)"),
)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API",
                              description="An OpenAI-compatible server (chat completions, "
                              "completions, models, tokenize, health, metrics) on the "
                              "batching engine.")
    add_model_args(p)
    p.add_argument("--max-model-len", dest="kv_capacity", type=int, metavar="N",
                   help="the context per sequence (same as --kv-capacity)")
    p.add_argument("--kv-memory", metavar="BYTES",
                   help="the KV pool's size (2GiB, 512MiB, ...), instead of --kv-blocks")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on "
                   "(default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default: 8000; 0: any free)")
    p.add_argument("--api-key", default=settings.get_str("POOT_API_KEY"), metavar="KEY",
                   help="require 'Authorization: Bearer KEY' (default: $POOT_API_KEY, else "
                        "open)")
    p.add_argument("--served-model-name", default=None, metavar="NAME",
                   help="the model name clients send (default: the model file's name)")
    for flag, kind, default, metavar, text in _LIMITS:
        p.add_argument(flag, type=kind, default=default, metavar=metavar, help=text)
    p.add_argument("--random-weights", default=None, choices=("bf16", "f16", "f32"),
                   metavar="DTYPE", help="benchmarking (vLLM's --load-format dummy): --model "
                   "is a HF config.json, its weights random in DTYPE (bf16, f16, f32); no "
                   "tokenizer, so clients send token ids to /v1/completions")
    p.add_argument("--max-decode-stall", type=float, default=1.5, metavar="F",
                   help="a step that decodes running sequences takes only as many prompt "
                        "tokens as keep it within F times their decode step, from the "
                        "steps' times measured after the warm-up (inter-token latency "
                        "against a long prompt's time to first token); 0: off, the prompt "
                        "budget alone (default: 1.5)")
    p.add_argument("--no-warm-up", action="store_true",
                   help="compile decode buckets and samplers on first use, not at start")
    p.add_argument("--log-level", default="info",
                   choices=("debug", "info", "warning", "error"),
                   help="server log level (default: info: one line per request)")
    p.add_argument("--lora", action="append", default=[], metavar="NAME=PATH",
                   help="load the PEFT LoRA adapter at PATH as model NAME (repeatable)")
    p.add_argument("--max-loras", type=int, default=None, metavar="N",
                   help="adapter slots (default: the number of --lora, or 0: no LoRA)")
    p.add_argument("--max-lora-rank", type=int, default=16, metavar="R",
                   help="the largest adapter rank a slot holds (default: 16)")
    p.add_argument("--allow-runtime-lora", action="store_true",
                   help="enable POST /v1/load_lora_adapter and /v1/unload_lora_adapter "
                        "(needs --lora-root)")
    p.add_argument("--lora-root", default=None, metavar="DIR",
                   help="the folder runtime-loaded adapters must lie in (lora_path is "
                        "relative to it)")
    p.add_argument("--max-lora-bytes", default="1GiB", metavar="BYTES",
                   help="the largest adapter file runtime loading reads (default: 1GiB)")
    p.add_argument("--tool-call-parser", default="auto", choices=("auto", *FORMATS),
                   help="tool-call format of chat answers: auto (from the chat template), "
                        "hermes, llama3_json, mistral or generic (default: auto)")
    p.add_argument("--reasoning-parser", default="auto", choices=REASONING_PARSERS,
                   help="split <think> blocks into reasoning_content: auto (thinking "
                        "templates), none, or think / deepseek_r1 / qwen3 (default: auto)")
    p.add_argument("--ray", action="store_true",
                   help="deploy --replicas engine replicas with Ray Serve behind one ingress")
    p.add_argument("--replicas", type=int, default=1, metavar="N",
                   help="with --ray: engine replicas (default: 1)")
    p.set_defaults(func=run)


def _config(args):
    from pathlib import Path

    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.serve.config import ServeConfig

    name = args.served_model_name
    if name is None:
        name = Path(args.model).stem if args.model else "SmolLM2-135M-Instruct"
    return ServeConfig(served_model_name=name, api_key=args.api_key,
                       max_body_bytes=args.max_body_bytes,
                       max_prompt_tokens=args.max_prompt_tokens, max_n=args.max_n,
                       max_queue=args.max_queue, max_concurrent=args.max_concurrent,
                       max_pooled_rows=args.max_pooled_rows,
                       request_timeout_s=args.request_timeout,
                       drain_timeout_s=args.drain_timeout,
                       header_timeout_s=args.header_timeout,
                       body_timeout_s=args.body_timeout, idle_timeout_s=args.idle_timeout,
                       runtime_lora=args.allow_runtime_lora, lora_root=args.lora_root,
                       max_lora_bytes=parse_bytes(args.max_lora_bytes, "--max-lora-bytes"),
                       tool_call_parser=args.tool_call_parser,
                       reasoning_parser=args.reasoning_parser)


def load_options(args) -> dict:
    """``ModelHandle.load`` keyword arguments from the command line."""
    kv_memory = parse_bytes(args.kv_memory) if args.kv_memory is not None else None
    if kv_memory is not None and args.kv_blocks is not None:
        raise InvalidRequest("--kv-memory", args.kv_memory, "give --kv-blocks or "
                             "--kv-memory, not both")
    loras = {}
    for item in args.lora:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise InvalidRequest("--lora", item, "must be NAME=PATH (a PEFT adapter folder)")
        if name in loras:
            raise InvalidRequest("--lora", item, f"adapter name {name!r} given twice")
        loras[name] = path
    max_loras = args.max_loras if args.max_loras is not None else len(loras)
    if max_loras < len(loras):
        raise InvalidRequest("--max-loras", max_loras, f"fewer slots than the {len(loras)} "
                             f"--lora adapters")
    if args.allow_runtime_lora and max_loras < 1:
        raise InvalidRequest("--allow-runtime-lora", True, "needs --max-loras N (adapter "
                             "slots to load into)")
    if args.allow_runtime_lora and not args.lora_root:
        raise InvalidRequest("--allow-runtime-lora", True, "needs --lora-root DIR (the "
                             "folder runtime-loaded adapters must lie in)")
    if args.lora_root is not None and not os.path.isdir(args.lora_root):
        raise InvalidRequest("--lora-root", args.lora_root, "is not a folder")
    opts = dict(path=args.model, backend=args.backend, kv_capacity=args.kv_capacity,
                prefill_chunk=args.prefill_chunk, max_batch=args.max_batch,
                kv_blocks=args.kv_blocks, kv_memory=kv_memory, kv_dtype=args.kv_dtype,
                kv_dtype_k=args.kv_dtype_k, kv_dtype_v=args.kv_dtype_v, use_cache=not args.no_cache, random_weights=args.random_weights,
                compile_options=compile_options(args),
                pipeline_parallel=getattr(args, "pipeline_parallel", None) or 1,
                max_decode_stall=args.max_decode_stall or None,
                speculative=speculative_of(args))
    if max_loras:
        opts.update(max_loras=max_loras, max_lora_rank=args.max_lora_rank, loras=loras)
    return opts


def run(args: argparse.Namespace) -> int:
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.serve.loading import require_serve_extra

    check_options(args, "kv_capacity", "prefill_chunk", "max_batch", "kv_blocks",
                  "max_concurrent", "max_body_bytes", "max_n", "max_pooled_rows",
                  "max_prompt_tokens", "replicas", "max_lora_rank", "threads",
                  "pipeline_parallel")
    apply_threads(args)
    if args.max_loras is not None and args.max_loras < 0:
        raise InvalidRequest("--max-loras", args.max_loras, "must be >= 0")
    if args.max_queue < 0:
        raise InvalidRequest("--max-queue", args.max_queue, "must be >= 0")
    if args.max_decode_stall != 0 and not args.max_decode_stall > 1.0:
        raise InvalidRequest("--max-decode-stall", args.max_decode_stall,
                             "must be 0 (off) or a number > 1")
    if not 0 <= args.port <= 65535:
        raise InvalidRequest("--port", args.port, "must be in [0, 65535]")
    if args.random_weights and args.model is None:
        raise InvalidRequest("--random-weights", args.random_weights, "needs --model "
                             "CONFIG.json (the HF config whose shapes get random weights)")
    require_serve_extra()
    options = load_options(args)
    config = _config(args)
    if args.model is None:
        # lazy: CLI start-up (every command module is imported for --help) loads no engine
        from poot.api import default_model_path

        options["path"] = default_model_path()      # ModelNotFound before listening
    if not args.random_weights:          # a missing or broken checkpoint too (headers only)
        # lazy: CLI start-up (every command module is imported for --help) loads no engine
        from poot.load.checkpoint import open_weights

        open_weights(options["path"])
    if not args.ray:                     # the code generator, runtime package and device too
        _check_backend(options["backend"], options["pipeline_parallel"])
    logging.basicConfig(level=getattr(logging, args.log_level.upper()),
                        format="%(asctime)s poot serve: %(message)s", stream=sys.stderr)
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.api.pooling import pooled_task

    options["pooled"] = pooled_task(options["path"]) if not args.random_weights else None
    if options["pooled"] and options.get("max_loras"):
        raise InvalidRequest("--lora", args.lora, "an embedding model or cross-encoder takes "
                             "no LoRA adapters")
    if options["pooled"] and options["pipeline_parallel"] > 1:
        raise InvalidRequest("--pipeline-parallel", args.pipeline_parallel, "an embedding "
                             "model or cross-encoder runs on one device")
    if args.ray:
        # lazy: CLI start-up (every command module is imported for --help) loads no engine
        from poot.serve.ray import serve_with_ray

        return serve_with_ray(options, config, args.host, args.port, args.replicas,
                              warm_up=not args.no_warm_up)
    return _serve(args, config, options)


def _check_backend(backend: str, pipeline_parallel: int) -> None:
    """Refuse, before the server listens, a backend this build cannot compile for, or whose
    runtime package, driver or device is missing (one line each: NoCodeGenerator,
    DeviceError). The device opened here is the process's (:func:`poot.runtime.open_device`
    opens it once), so the load that follows uses it."""
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.api import target_for
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.backends.registry import BACKENDS
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.runtime import open_device

    target_for(backend)
    if BACKENDS[backend].open_device is not None and pipeline_parallel == 1:
        open_device(backend)


def _serve(args, config, options) -> int:
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.cli.progress_display import Reporter, history_file
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.engine.scheduler import stall_prompt_budget
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.serve import build_app
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.serve.loading import load_and_warm
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.serve.server import bind, make_server, shorten_switch_interval

    shorten_switch_interval()       # the engine thread and the event loop share the GIL
    try:
        sock = bind(args.host, args.port)
    except OSError as e:
        raise InvalidRequest("--port", args.port, f"cannot listen on {args.host}:{args.port} "
                             f"({e.strerror})") from None
    host, port = sock.getsockname()[:2]
    url = f"http://{'[' + host + ']' if ':' in host else host}:{port}"
    reporter = Reporter(quiet=args.quiet, history=history_file())
    failed: list[BaseException] = []
    log = logging.getLogger("poot.serve")

    pooled = options.get("pooled")

    def loader():
        try:
            return load_and_warm(options, warm_up=not args.no_warm_up, progress=reporter)
        finally:
            reporter.close()

    def on_loaded(state):
        # the time from process start to serving: imports, loading and every warm-up
        # compile (those finished after ModelHandle.load returned included)
        h, ready_s = state.handle, process_age_s()
        if pooled:
            log.info("ready: serving %s (%s) as '%s' on %s (backend %s, up to %d inputs a "
                     "step of up to %d tokens; ready %.1f s after start)", h.path.name,
                     "embeddings" if h.task == "embed" else "rerank",
                     config.served_model_name, url, h.backend, h.runner.max_batch,
                     h.max_tokens, ready_s)
            return
        st = h.engine.stats()
        log.info("ready: serving %s as '%s' on %s (backend %s, max batch %d, context %d, "
                 "%d KV blocks of %d; ready %.1f s after start)", h.path.name,
                 config.served_model_name, url, h.backend, h.runner.max_batch, h.kv_capacity,
                 st.kv_blocks_total, h.engine.blocks.block_size, ready_s)
        stall, costs = h.engine.config.max_decode_stall, h.runner.ragged_costs
        if stall is not None and costs:
            mb = h.runner.max_batch
            budget = stall_prompt_budget(costs, mb, stall)
            log.info("ragged steps measured: %s; beside %d decoding sequences a step takes "
                     "%s prompt tokens (--max-decode-stall %g)",
                     ", ".join(f"{t} rows {c * 1e3:.1f} ms" for t, c in sorted(costs.items())),
                     mb, "its whole budget of" if budget is None else budget, stall)

    def on_load_error(e):
        failed.append(e)
        server.should_exit = True

    app = build_app(config, loader=loader, on_loaded=on_loaded, on_load_error=on_load_error)
    server = make_server(app, drain_timeout_s=config.drain_timeout_s,
                         log_level="warning" if args.log_level in ("info", "debug")
                         else args.log_level)
    log.info("listening on %s; loading the model (GET /health says 'loading' until ready)",
             url)
    # uvicorn re-raises the signal that stopped it once it has drained, with the handler
    # that was installed before it started: make that a no-op so a drained SIGTERM exits 0
    previous = signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        server.run(sockets=[sock])
    finally:
        signal.signal(signal.SIGTERM, previous)
        sock.close()
    if failed:
        e = failed[0]
        if isinstance(e, PootError):
            raise e
        raise PootError(f"loading the model failed: {type(e).__name__}: {e}")
    log.info("stopped")
    return 0
