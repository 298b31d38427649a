"""``poot compile``: fill the compile cache for a model, backend and KV capacity.

    poot compile [--model MODEL | --config CONFIG.json --random-weights [--dtype bf16]]
                 [--backend cuda] [--kv-capacity N] [--prefill-chunk N]
                 [--max-batch N] [--batch B ...] [--temperature T --top-p P --top-k K]
                 [--cache-dir DIR] [--device-caps CAPS.json] [--serve]

Compiles the steps that ``poot generate`` / ``poot bench`` with the same model, backend,
``--kv-capacity``, ``--max-batch`` and ``--kv-blocks`` run (the prefill chunk, the decode step
of every batch bucket up to ``--max-batch`` (or of the ``--batch`` sizes given) and its greedy
sampler; with sampling options also the sampler of such requests; with ``--serve`` the samplers
``poot serve`` warms) into the compile cache (``--cache-dir``, else
``$POOT_CACHE_DIR``, else ``~/.cache/poot``), with an index that finds each program without
tracing. A machine without MLIR (the GPU machine) runs them from a copy of that directory:
``POOT_CACHE_DIR=<copy> poot bench --backend cuda ...``. Opens no device: a Vulkan or wgpu
target comes from the device's capabilities, read there by ``poot devices --json`` and given
here as ``--device-caps``. Prints one JSON
object (step keys, program keys, seconds, cache size in bytes).
"""

from __future__ import annotations

import argparse
import json
import os

from poot.cli import plain


def add_source_args(p: argparse.ArgumentParser) -> None:
    """``--config``/``--random-weights``/``--dtype``/``--seed``: random-init weights of a HF
    config's shapes instead of a checkpoint (shared by compile and bench)."""
    p.add_argument("--config", default=None, metavar="CONFIG",
                   help="a HF config.json (file or folder): with --random-weights, the model "
                        "shapes to use instead of --model")
    p.add_argument("--random-weights", action="store_true",
                   help="random-init weights of --config's shapes (no checkpoint, no "
                        "tokenizer)")
    p.add_argument("--dtype", default="bf16",
                   choices=("bf16", "f16", "f32", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0"),
                   help="dtype of the random weights (default: bf16; a GGUF block format packs "
                        "the matrices)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights")


def model_source(args) -> tuple[str | None, str | None]:
    """(path, random_weights dtype or None) from --model / --config --random-weights."""
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.sampling_params import InvalidRequest

    if args.random_weights:
        if not args.config:
            raise InvalidRequest("--random-weights", True, "needs --config CONFIG.json")
        if args.model:
            raise InvalidRequest("--model", args.model, "give --model or --config "
                                 "--random-weights, not both")
        return args.config, args.dtype
    if args.config:
        raise InvalidRequest("--config", args.config, "is used with --random-weights")
    return args.model, None


def register(subparsers: argparse._SubParsersAction) -> None:
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.cli.generate_cmd import add_model_args

    p = subparsers.add_parser("compile", help="fill the compile cache (to carry to a machine "
                              "without MLIR)", description=plain(__doc__),
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p)
    add_source_args(p)
    p.add_argument("--cache-dir", default=None, metavar="DIR",
                   help="the compile cache to fill (default: $POOT_CACHE_DIR or "
                        "~/.cache/poot)")
    p.add_argument("--temperature", type=float, default=0.0, metavar="T",
                   help="also compile the decode step of a request with these sampling "
                        "options (default: greedy only)")
    p.add_argument("--top-p", type=float, default=1.0, metavar="P")
    p.add_argument("--top-k", type=int, default=0, metavar="K")
    p.add_argument("--device-caps", default=None, metavar="FILE",
                   help="for --backend vulkan/wgpu: the JSON capabilities of the device the "
                        "programs will run on ('poot devices --json' there)")
    p.add_argument("--batch", type=int, action="append", default=None, metavar="B",
                   help="compile the decode step of batch B only (repeatable; default: every "
                        "bucket up to --max-batch)")
    p.add_argument("--serve", action="store_true",
                   help="also compile the samplers 'poot serve' warms for every bucket (the "
                        "full sampler, and with log-probs and guided decoding), so that "
                        "'poot serve' with the same options starts from the cache")
    p.set_defaults(func=run)


def read_device_caps(path: str | None, backend: str) -> dict | None:
    """The capabilities in ``path`` (``poot devices --json`` output: either one device's
    capabilities or ``{backend: capabilities}``), or None; a file that is missing, not JSON
    or lacks the backend is an :class:`InvalidRequest` naming it."""
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.sampling_params import InvalidRequest

    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.backends.registry import BACKENDS

    if path is None:
        return None
    if not BACKENDS[backend].target_from_device:
        devs = ", ".join(b.name for b in BACKENDS.values() if b.target_from_device)
        raise InvalidRequest("--device-caps", path, f"is for the backends whose target comes "
                             f"from their device ({devs}); {backend}'s does not")
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise InvalidRequest("--device-caps", path, f"cannot be read as JSON ({e})") from None
    if isinstance(data, dict) and isinstance(data.get(backend), dict):
        data = data[backend]
    if not isinstance(data, dict) or "features" not in data:
        raise InvalidRequest("--device-caps", path, f"holds no {backend} device capabilities "
                             f"(a 'features' list)")
    return data


def cache_bytes(folder: str) -> int:
    total = 0
    for root, _, files in os.walk(folder):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return total


def run(args: argparse.Namespace) -> int:
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.api import DEFAULT_MAX_BATCH, compile_steps
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.cli.generate_cmd import check_options
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.cli.progress_display import Reporter, history_file
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.sampling_params import SamplingParams
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.engine import sampler_spec_for
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.graph.sampling import GREEDY

    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.cli.generate_cmd import apply_threads, compile_options

    check_options(args, "kv_capacity", "prefill_chunk", "max_batch", "kv_blocks", "threads",
                  "pipeline_parallel")
    apply_threads(args)
    path, random_dtype = model_source(args)
    device_caps = read_device_caps(args.device_caps, args.backend)
    samplers = [GREEDY]
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k)
    if sampler_spec_for([params]) != GREEDY:
        samplers.append(sampler_spec_for([params]))
    if args.serve:
        # lazy: CLI start-up (every command module is imported for --help) loads no engine
        from poot.serve.loading import serve_samplers

        samplers += list(serve_samplers())
    max_batch = args.max_batch or max(args.batch or [
        DEFAULT_MAX_BATCH[args.backend]])
    with Reporter(quiet=args.quiet, history=history_file(args.cache_dir)) as report:
        out = compile_steps(path, args.backend, kv_capacity=args.kv_capacity,
                            prefill_chunk=args.prefill_chunk, max_batch=max_batch,
                            batches=args.batch, kv_blocks=args.kv_blocks,
                            kv_dtype=args.kv_dtype, kv_dtype_k=args.kv_dtype_k,
                            kv_dtype_v=args.kv_dtype_v, samplers=samplers,
                            cache_dir=args.cache_dir, random_weights=random_dtype,
                            seed=args.seed, compile_options=compile_options(args),
                            device_caps=device_caps, progress=report,
                            pipeline_parallel=args.pipeline_parallel or 1,
                            stall_bounded=args.serve)
    out["cache_bytes"] = cache_bytes(out["cache_dir"])
    print(json.dumps(out))
    return 0
